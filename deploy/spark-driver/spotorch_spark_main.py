"""spotorch's PySpark driver: the main file of a Spark preprocess step's Dataproc batch (issue 42).

Dataproc Serverless runs this file (PySparkBatch.main_python_file_uri, SPOTORCH_SPARK_DRIVER)
with the arguments spotorch's adapter gives it (adapters.gcp.dataproc):

    --module MODULE            the step's python_module (in the user's code package)
    --packages URI,URI         the code package and spotorch-trainer, content-addressed; also the
                               batch's file_uris, so Dataproc puts each in the working directory
    --input gs://... --output gs://...   the snapshot folder and the cache key's output folder
    --inputs gs://....json     the run's inputs manifest, when the run pinned its objects
    --options JSON             the step's options, each passed on as --NAME=VALUE

It installs the packages into a folder of its own (pip --target, no dependencies: the runtime
has Spark and what the user's requirements bring through Dataproc's own means), puts that folder
on the driver's path and, zipped, on the executors' (SparkContext.addPyFile), then runs the module
as `__main__` with `--input --output [--inputs] --OPTION=V`. The module's exception is the
driver's: Dataproc fails the batch with it (its state_message), which spotorch shows as the
user's error. The local Dataproc (spotorch.local.dataproc_emulator) runs this same file.
Standard library only, besides pyspark and google-cloud-storage (for gs:// packages).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The driver's arguments."""
    parser = argparse.ArgumentParser(description="spotorch's PySpark driver", allow_abbrev=False)
    parser.add_argument("--module", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--packages", default="")
    parser.add_argument("--inputs", default="")
    parser.add_argument("--options", default="")
    return parser.parse_args(list(argv))


def option_args(options: str) -> list[str]:
    """The step's options (a JSON object of strings) as the module's --NAME=VALUE arguments."""
    if not options:
        return []
    doc = json.loads(options)
    if not isinstance(doc, dict):
        raise SystemExit(f"--options must be a JSON object, not {options[:80]!r}")
    return [f"--{name}={value}" for name, value in sorted(doc.items())]


def local_copy(uri: str, into: Path) -> Path:
    """The package file: the batch's working directory has it (file_uris), else it is fetched."""
    name = uri.rsplit("/", 1)[-1]
    if Path(name).is_file():
        return Path(name).resolve()
    if not uri.startswith("gs://"):
        return Path(uri)
    from google.cloud import storage

    bucket, _, blob = uri.removeprefix("gs://").partition("/")
    target = into / name
    storage.Client().bucket(bucket).blob(blob).download_to_filename(str(target))
    return target


def install(archives: Sequence[Path], site: Path) -> None:
    """pip install the archives into site, without their dependencies."""
    if archives:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                        "--target", str(site), *(str(a) for a in archives)], check=True)


def module_argv(args: argparse.Namespace) -> list[str]:
    """The module's sys.argv: its name, then input, output, inputs and the options."""
    argv = [args.module, "--input", args.input, "--output", args.output]
    if args.inputs:
        argv += ["--inputs", args.inputs]
    return argv + option_args(args.options)


def main(argv: Sequence[str] | None = None) -> int:
    """Install the code, share it with the executors, run the module as __main__."""
    args = parse(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="spotorch-spark-"))
    site = work / "site"
    site.mkdir()
    install([local_copy(u, work) for u in args.packages.split(",") if u], site)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site),
                                                           os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(args.module).getOrCreate()  # the module's getOrCreate
    if any(site.iterdir()):
        bundle = shutil.make_archive(str(work / "packages"), "zip", root_dir=site)
        spark.sparkContext.addPyFile(bundle)  # the executors import the same code
    sys.argv = module_argv(args)
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
