"""spotorch's Dataflow launcher: the flex template that runs a preprocess step's Beam module.

Dataflow starts a flex template's launcher container and runs this file
(FLEX_TEMPLATE_PYTHON_PY_FILE) with the launch's parameters as `--name=value` arguments and the
pipeline options Dataflow adds (--runner=DataflowRunner, --project, --region, --temp_location,
--staging_location, --job_name, ...). spotorch launches it with (adapters.gcp.dataflow):

    --module=MODULE                the step's python_module (in the user's code package)
    --packages=URI,URI             the code package and spotorch-trainer, content-addressed
    --input=gs://...  --output=gs://...   the snapshot folder and the cache key's output folder
    --inputs=gs://....json         the run's inputs manifest (its objects at their recorded
                                   generations), when the run pinned them: passed on unchanged
    --options=JSON                 the step's options, each passed on as --NAME=VALUE (one
                                   parameter: the template's metadata declares every parameter)

It downloads the packages, installs them, and runs `python -m MODULE --input --output OPTIONS`
with every other argument, plus one --extra_package per archive so that Beam stages the code for
the workers. The module's exit status is the launcher's (a non-zero one fails the job, its stderr
in the job's error messages). The local Dataflow runs this same file with Beam's DirectRunner
(--site DIR --no-deps: the archives go to a folder of their own, their requirements are checked by
the caller, nothing is downloaded from PyPI). Standard library only, besides google-cloud-storage
(part of apache-beam[gcp]) for gs:// archives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

OWN = ("module", "packages", "options", "site", "no_deps")  # this launcher's; the rest goes on


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own arguments, and the rest (the module's input, output and options)."""
    # No abbreviations: a module option such as --option=1 must not be taken for --options.
    parser = argparse.ArgumentParser(description="spotorch's Dataflow launcher",
                                     allow_abbrev=False)
    parser.add_argument("--module", required=True, help="the Beam module to run (python -m)")
    parser.add_argument("--packages", default="", help="comma-separated archives (gs:// or paths)")
    parser.add_argument("--options", default="", help="JSON object: each passed on as --NAME=VALUE")
    parser.add_argument("--site", help="install into this folder (PYTHONPATH) instead of the "
                                       "launcher's environment")
    parser.add_argument("--no-deps", dest="no_deps", action="store_true",
                        help="install the archives without their dependencies (no PyPI)")
    return parser.parse_known_args(list(argv))


def option_args(options: str) -> list[str]:
    """The step's options (a JSON object of strings) as the module's --NAME=VALUE arguments."""
    if not options:
        return []
    doc = json.loads(options)
    if not isinstance(doc, dict):
        raise SystemExit(f"--options must be a JSON object, not {options[:80]!r}")
    return [f"--{name}={value}" for name, value in sorted(doc.items())]


def fetch(uri: str, into: Path) -> Path:
    """A local copy of an archive: gs:// downloaded (Cloud Storage client), a path as is."""
    if not uri.startswith("gs://"):
        return Path(uri)
    from google.cloud import storage

    bucket, _, name = uri.removeprefix("gs://").partition("/")
    target = into / name.rsplit("/", 1)[-1]
    storage.Client().bucket(bucket).blob(name).download_to_filename(str(target))
    return target


def install_command(archives: Sequence[Path], site: str | None, no_deps: bool) -> list[str]:
    """pip's command for the archives (into site when given)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if site:
        command += ["--target", site]
    if no_deps:
        command.append("--no-deps")
    return [*command, *(str(a) for a in archives)]


def module_command(module: str, archives: Sequence[Path], rest: Sequence[str]) -> list[str]:
    """The Beam module's command: every argument not the launcher's, and the archives for the
    workers (Beam's --extra_package: each worker pip-installs them before it runs a bundle)."""
    return [sys.executable, "-m", module, *rest,
            *(f"--extra_package={a}" for a in archives)]


def main(argv: Sequence[str] | None = None) -> int:
    """Install the code, run the module; its exit status."""
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    rest = [*rest, *option_args(args.options)]
    uris = [u for u in args.packages.split(",") if u]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="spotorch-launcher-") as tmp:
        archives = [fetch(uri, Path(tmp)) for uri in uris]
        if archives:
            subprocess.run(install_command(archives, args.site, args.no_deps), check=True)
        if args.site:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (args.site, env.get("PYTHONPATH"))
                                                if p)
        return subprocess.run(module_command(args.module, archives, rest), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
