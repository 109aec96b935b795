"""spotorch's Dataflow launcher (deploy/dataflow-launcher/launcher.py): what a flex template
launch runs. The local Dataflow runs it for every preprocess job (tests/test_e2e_preprocess.py);
here its own parts: the arguments, the install of the code archives, the module's exit status."""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "deploy" / "dataflow-launcher" / "launcher.py"


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spotorch_dataflow_launcher", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A Beam module stand-in: records its arguments, exits with the status its input names.
RECORDER = """
import json, sys
args = sys.argv[1:]
open(args[args.index("--output") + 1], "w").write(json.dumps(args))
sys.exit(int(args[args.index("--input") + 1]))
"""


def wheel(tmp_path: Path) -> Path:
    """A minimal wheel of a package `recorder` (made by hand: pip installs it offline)."""
    path = tmp_path / "recorder-0.1-py3-none-any.whl"
    files = {"recorder/__init__.py": "", "recorder/run.py": RECORDER,
             "recorder-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: recorder\n"
                                                "Version: 0.1\n",
             "recorder-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                             "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files["recorder-0.1.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + \
        "recorder-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_its_own_arguments_are_taken_and_every_other_goes_to_the_module(
        launcher: ModuleType) -> None:
    args, rest = launcher.parse(["--module=m.pre", "--packages=gs://b/a.tar.gz,gs://b/t.tar.gz",
                                 "--input=gs://in/", "--output", "gs://out/k/", "--num_shards=2",
                                 "--runner=DataflowRunner", "--project=p"])
    assert (args.module, args.packages, args.site, args.no_deps) == \
        ("m.pre", "gs://b/a.tar.gz,gs://b/t.tar.gz", None, False)
    assert rest == ["--input=gs://in/", "--output", "gs://out/k/", "--num_shards=2",
                    "--runner=DataflowRunner", "--project=p"]
    command = launcher.module_command("m.pre", [Path("/t/a.tar.gz")], rest)
    assert command[1:3] == ["-m", "m.pre"] and command[-1] == "--extra_package=/t/a.tar.gz"
    assert launcher.install_command([Path("/t/a.tar.gz")], None, False)[-1] == "/t/a.tar.gz"
    assert "--target" in launcher.install_command([], "/site", True)
    with pytest.raises(SystemExit):
        launcher.parse(["--input=x"])  # no module: refused, named


@pytest.mark.parametrize("status", [0, 3])
def test_the_code_is_installed_and_the_modules_exit_status_is_the_launchers(
        launcher: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        status: int) -> None:
    record, site = tmp_path / "args.json", tmp_path / "site"
    monkeypatch.setattr(sys, "argv", ["launcher.py"])
    code = launcher.main(["--module=recorder.run", f"--packages={wheel(tmp_path)}",
                          f"--site={site}", "--no-deps", "--input", str(status),
                          "--output", str(record), "--option=1"])
    assert code == status
    assert (site / "recorder" / "run.py").exists()  # pip installed the archive there
    args = json.loads(record.read_text())
    assert args[:5] == ["--input", str(status), "--output", str(record), "--option=1"]
    assert args[-1].startswith("--extra_package=") and args[-1].endswith(".whl")
