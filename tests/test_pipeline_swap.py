"""Pipelines change atomically (issue 41): the local stack builds the served folder aside and
renames a link onto it, so a function loading pipelines while reloads follow each other never
reads a folder half deleted or half built (the first run of a new pipeline once ended
FAILED_LAUNCH with "python_package has no package_uris")."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotorch.local._stack_pipelines import activate, check_pipelines
from spotorch.spec import compiled

ROOT = Path(__file__).resolve().parents[1]


def _source(tmp: Path) -> Path:
    source = tmp / "pipelines"
    source.mkdir()
    doc = yaml.safe_load((ROOT / "examples" / "pipelines" / "demo.yaml").read_text())
    doc["job"]["worker_pools"][0]["python_package"]["source"] = str(ROOT / "examples" /
                                                                   "trainer")
    (source / "demo.yaml").write_text(yaml.safe_dump(doc))
    return source


@pytest.mark.slow  # each reload builds the package again: about 15 s
def test_a_function_loading_pipelines_during_reloads_sees_each_version_whole(
        tmp_path: Path) -> None:
    source = _source(tmp_path)
    active = tmp_path / "run" / "pipelines-active"
    (active).mkdir(parents=True)  # a folder left by an older stack: replaced by the link
    checked = check_pipelines(source)
    activate(checked, active)
    assert active.is_symlink() and (active / compiled.COMPILED_FILE).is_file()
    stop = threading.Event()
    reloads = 0

    def reload_in_a_loop() -> None:
        nonlocal reloads
        while not stop.is_set():
            activate(check_pipelines(source), active)  # what `dev reload` and the watcher do
            reloads += 1

    seen: list[str] = []
    reloader = threading.Thread(target=reload_in_a_loop)
    reloader.start()
    try:
        reads = 0
        while reloads < 4 and reads < 10_000:
            # what a function does at its first event: resolve SPOTORCH_PIPELINES, read it
            compiled.clear_cache()
            try:
                (pipeline,) = compiled.function_pipelines(active)
            except Exception as exc:  # a folder missing or half there
                seen.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                reads += 1
            package = pipeline.job.worker_pools[0].python_package
            assert package is not None
            if not package.package_uris or not all(Path(f).is_file()
                                                   for f in package.staged_files):
                seen.append(f"half-built: {package}")
    finally:
        stop.set()
        reloader.join()
        compiled.clear_cache()
    assert reloads >= 4 and reads > reloads, (reloads, reads)
    assert seen == []
    versions = sorted(p.name for p in active.parent.iterdir() if p.name.startswith("."))
    assert len(versions) <= 3, versions  # old builds are removed, the last few kept
    shutil.rmtree(tmp_path / "run")


def test_the_bundle_carries_the_pipeline_files_it_validated_or_is_not_written(
        tmp_path: Path) -> None:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("spotorch_deploy_package_swap",
                                                  ROOT / "deploy" / "package.py")
    assert spec is not None and spec.loader is not None
    package: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    first = pipelines / "a.yaml"
    first.write_text("name: a\n")

    def edited_meanwhile(root: Path, where: Path) -> dict[str, bytes]:
        first.write_text("name: b\n")  # an edit lands while the bundle is validated
        return {}

    package.compiled_pipelines = edited_meanwhile
    package.check_placeholders = lambda root, files: None
    out = tmp_path / "bundle.zip"
    with pytest.raises(package.PackageError, match="changed while the bundle was built"):
        package.build(ROOT, pipelines, out)
    assert not out.exists()  # nothing half-consistent is left to deploy
