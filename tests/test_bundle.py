"""The function bundle holds production code only and is self-contained: built by deploy/package.py,
unzipped, and imported in a fresh interpreter that cannot see the repository's sources and cannot
import numpy (a dependency of the simulator, not of the functions)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SPOTORCH = ROOT / "shared" / "spotorch"

PIPELINE_YAML = """\
name: bundle-probe
trigger:
  bucket: gs://landing-probe
checkpoint_uri: gs://ckpt-probe/bundle
job:
  image_uri: us-docker.pkg.dev/p/r/trainer:1
"""

# Run in the subprocess: sys.argv[1] is the unzipped bundle, sys.argv[2] the repository root. It
# removes every way back to the repository's sources (path entries, an editable install's finder),
# blocks numpy, then imports main and every spotorch module the bundle holds, and reports JSON.
PROBE = r"""
import importlib, importlib.abc, json, pathlib, sys

bundle, repo = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
forbidden = {repo, repo / "shared", repo / "trainer", repo / "functions"}

def _resolved(entry):
    try:
        return pathlib.Path(entry or ".").resolve()
    except OSError:
        return None

sys.path[:] = [str(bundle)] + [p for p in sys.path if _resolved(p) not in forbidden]
# setuptools' editable install appends its finder class, which maps spotorch to shared/spotorch.
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()


class BlockNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"numpy is blocked in this probe: {name}", name=name)
        return None


sys.meta_path.insert(0, BlockNumpy())
try:
    import numpy  # noqa: F401
    numpy_blocked = False
except ImportError:
    numpy_blocked = True

import main
import spotorch

modules = sorted(
    "spotorch." + ".".join(p.relative_to(bundle / "spotorch").with_suffix("").parts)
    for p in (bundle / "spotorch").rglob("*.py") if p.name != "__init__.py")
for name in modules:
    importlib.import_module(name)
outside = sorted(name for name, module in sys.modules.items()
                 if name.split(".")[0] in ("spotorch", "spotorch_trainer", "main")
                 and getattr(module, "__file__", None)
                 and not pathlib.Path(module.__file__).resolve().is_relative_to(bundle))
print(json.dumps({"numpy_blocked": numpy_blocked, "numpy_loaded": "numpy" in sys.modules,
                  "entry_points": sorted(n for n in dir(main) if n.startswith("on_") or n == "api"),
                  "imported": modules, "outside": outside}))
"""


def _load_packager() -> Any:
    spec = importlib.util.spec_from_file_location("spotorch_deploy_package_b",
                                                  DEPLOY / "package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


package = _load_packager()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle built from this repository, unzipped."""
    work = tmp_path_factory.mktemp("bundle")
    pipelines = work / "pipelines"
    pipelines.mkdir()
    (pipelines / "probe.yaml").write_text(PIPELINE_YAML)
    built = package.build(ROOT, pipelines, work / "b.zip", validate=False)
    site = work / "site"
    zipfile.ZipFile(built.path).extractall(site)
    return site


def probe(site: Path) -> subprocess.CompletedProcess[str]:
    # -I: no PYTHON* variables, no user site, no script directory on sys.path; site-packages stay
    # (functions-framework and the Google clients are the bundle's requirements, not its contents).
    return subprocess.run([sys.executable, "-I", "-c", PROBE, str(site), str(ROOT)], cwd=site,
                          capture_output=True, text=True, timeout=180, check=False)


def _names(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}


def test_bundle_has_no_local_stack_or_simulator(bundle: Path) -> None:
    names = _names(bundle)
    assert not [n for n in names if n.startswith(("spotorch/local/", "spotorch/sim/"))]
    # what exists in the repository and is left out on purpose
    assert (SPOTORCH / "local" / "stack.py").is_file() and (SPOTORCH / "sim" / "simulate.py").is_file()
    assert "spotorch/operate/cli.py" not in names  # the operator CLI: no function imports it
    for needed in ("main.py", "spotorch/entrypoints/functions.py", "spotorch/entrypoints/api.py",
                   "spotorch/entrypoints/wiring.py",
                   "spotorch/adapters/gcp/vertex.py", "spotorch/py.typed", "spotorch_trainer/contract.py",
                   "requirements.txt", "pipelines/probe.yaml"):
        assert needed in names, needed


def test_bundle_imports_without_repository_or_numpy(bundle: Path) -> None:
    assert importlib.util.find_spec("numpy") is not None, "numpy must be installed here, or " \
        "blocking it proves nothing"
    result = probe(bundle)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["numpy_blocked"] is True
    assert report["numpy_loaded"] is False
    assert report["entry_points"] == ["api", "on_job_event", "on_object_finalized",
                                      "on_run_event", "on_table_changed", "on_tick"]
    assert "spotorch.entrypoints.wiring" in report["imported"]
    assert "spotorch.adapters.gcp.vertex" in report["imported"]
    assert report["outside"] == []


def test_probe_fails_without_a_bundled_module(bundle: Path, tmp_path: Path) -> None:
    """The repository's own copy is out of reach: a module missing from the bundle is missing."""
    site = tmp_path / "site"
    shutil.copytree(bundle, site)
    (site / "spotorch" / "core" / "decide.py").unlink()
    result = probe(site)
    assert result.returncode != 0
    assert "No module named 'spotorch.core.decide'" in result.stderr


def test_probe_fails_on_a_module_that_needs_numpy(bundle: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(bundle, site)
    (site / "spotorch" / "uses_numpy.py").write_text("import numpy\n")
    result = probe(site)
    assert result.returncode != 0
    assert "numpy is blocked in this probe" in result.stderr


def _root_with_main(tmp_path: Path, main_text: str) -> Path:
    """A copy of the repository's layout (sources linked, not copied) with its own main.py."""
    root = tmp_path / "repo"
    (root / "functions").mkdir(parents=True)
    (root / "functions" / "main.py").write_text(main_text)
    for name in ("shared", "trainer", "schemas", "pyproject.toml"):
        (root / name).symlink_to(ROOT / name)
    return root


def test_production_modules_are_what_main_imports(tmp_path: Path) -> None:
    modules = package.production_modules(ROOT)
    assert {"spotorch.entrypoints.functions", "spotorch.entrypoints.api",
            "spotorch.entrypoints.wiring", "spotorch_trainer.contract"} \
        <= set(modules)
    # imports inside functions count: wiring imports the Firestore store only when called
    assert "spotorch.adapters.gcp.firestore" in modules
    assert not [m for m in modules if m.startswith(("spotorch.local", "spotorch.sim"))]
    assert "spotorch.operate.cli" not in modules
    # errors.py imports only the standard library: nothing else comes along
    small = package.production_modules(_root_with_main(tmp_path,
                                                       "from spotorch.core import errors\n"))
    assert set(small) == {"spotorch", "spotorch.core", "spotorch.core.errors"}


def test_production_code_importing_the_simulator_stops_the_build(tmp_path: Path) -> None:
    main = ("from spotorch.entrypoints import functions\n\n"
            "def on_tick(event):\n    from spotorch.sim import simulate\n    simulate.main()\n")
    root = _root_with_main(tmp_path, main)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "probe.yaml").write_text(PIPELINE_YAML)
    with pytest.raises(package.PackageError, match=r"non-production modules spotorch\.sim.*"
                                                   r"from __main__"):
        package.build(root, pipelines, tmp_path / "b.zip", validate=False)
    assert not (tmp_path / "b.zip").exists()
