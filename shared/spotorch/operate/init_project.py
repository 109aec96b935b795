"""`spotorch init DIR`: a starting project to deploy from, with placeholders to fill in.

Writes DIR/pipelines/<name>.yaml (one pipeline that spotorch's loader accepts as it is; its
buckets are placeholders), DIR/trainer/ (a small Python package on spotorch_trainer that Vertex
AI installs on one of its prebuilt training containers: no image to build, no Docker; spotorch
builds it and ships spotorch-trainer beside it), DIR/terraform.tfvars (every variable of
deploy/variables.tf, explained) and DIR/README.md. The pipeline runs on the local stack as
written (`spotorch dev up --pipelines DIR/pipelines`). Every placeholder holds PLACEHOLDER;
packaging (deploy/package.py) refuses files that still do.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from spotorch.commandline import CONTEXT, run

PLACEHOLDER = "replace-me"  # lowercase: a valid bucket and project name, so the loader reads it
_PLACEHOLDER_WORD = re.compile(rf"[\w.@/:-]*{PLACEHOLDER}[\w.@/:-]*")
DEFAULT_DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
NAME = re.compile(r"^[a-z][a-z0-9-]{0,40}[a-z0-9]$")
# Variables a first deploy needs set, with the placeholder they start as.
TO_FILL: Mapping[str, Any] = {"project_id": f"{PLACEHOLDER}-project",
                              "operators": [f"user:{PLACEHOLDER}@example.com"]}


def placeholders(path: Path) -> list[str]:
    """`file:line: value` for each placeholder still in a file."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        found += [f"{path}:{number}: {word}" for word in _PLACEHOLDER_WORD.findall(line)]
    return found


def pipeline_yaml(name: str) -> str:
    """The starting pipeline: the loader reads it; every `replace-me` is yours to fill in."""
    module = name.replace("-", "_")
    return f"""\
# A pipeline: when a folder of data lands under the trigger prefix and its _SUCCESS marker is
# written last, spotorch starts one run that trains on that folder, on Spot VMs, resuming from
# its checkpoints when a VM is taken back. Fill in every {PLACEHOLDER}; docs/pipelines.md has
# every field (schemas/pipeline.schema.json in spotorch), `spotorch validate pipelines/` checks it.
version: 1
name: {name}
description: Trains {module} on every new data snapshot.

trigger:
  bucket: {PLACEHOLDER}-landing       # an existing bucket where your data lands (no gs://)
  prefix: datasets/{name}/
  snapshot_depth: 1                 # one folder per snapshot: datasets/{name}/<snapshot>/
  batch: marker
  marker: _SUCCESS                  # written last by whatever uploads the snapshot
  on_active_run: queue

job:
  regions: [us-central1]            # where Vertex AI runs it; more regions: more Spot capacity
  # service_account: trainer@{PLACEHOLDER}.iam.gserviceaccount.com  # default: spotorch-training
  staging_uri: gs://{PLACEHOLDER}-staging/{name}   # an existing bucket: the built packages
  worker_pools:
    - machine_type: n1-standard-4
      # Your code without an image: spotorch builds ../trainer into a package (and
      # spotorch-trainer beside it); Vertex AI pip-installs them on this prebuilt container
      # with their dependencies and runs `python -m {module}` (docs/pipelines.md).
      python_package:
        source: ../trainer
        executor_image_uri: us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-6:latest
        python_module: {module}
  timeout: 6h                       # per attempt

checkpoint_uri: gs://{PLACEHOLDER}-checkpoints/{name}   # an existing bucket
output_uri: gs://{PLACEHOLDER}-models/{name}            # an existing bucket

recovery:
  expected_compute: 1h              # how long the run takes uninterrupted
  restart_overhead: 5m              # scheduling, package install, restoring a checkpoint
"""


TRAINER_MAIN = '''\
"""{name}: a training loop that survives Spot preemptions (spotorch_trainer does spotorch's side).

Reads the snapshot under SPOTORCH_DATA_URI, checkpoints every CHECKPOINT_EVERY steps (and on
SIGTERM, then exits 143), resumes from the latest complete checkpoint, and writes model.json to
SPOTORCH_MODEL_URI. Replace train_step() and the state with your own model.

    python -m {module}            # locally: data from --data or SPOTORCH_DATA_URI
"""

from __future__ import annotations

import argparse
import json
import os

from spotorch_trainer import Run, join, list_files, read_bytes, write_bytes

TOTAL_STEPS = int(os.environ.get("TOTAL_STEPS", "1000"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))


def load(data_uri: str) -> list[bytes]:
    """Every file of the snapshot (your reader goes here)."""
    return [read_bytes(join(data_uri, name)) for name in list_files(data_uri)
            if not name.endswith("_SUCCESS")]


def train_step(state: dict[str, float], data: list[bytes], step: int) -> float:
    """One step of a stand-in model: a running mean of the data's bytes (yours goes here)."""
    sample = data[step % len(data)] if data else b"\\0"
    value = sum(sample) / max(len(sample), 1)
    state["mean"] += (value - state["mean"]) / (step + 1)
    return abs(value - state["mean"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="the snapshot (default: $SPOTORCH_DATA_URI)")
    args = parser.parse_args(argv)
    with Run(total_steps=TOTAL_STEPS, checkpoint_every=CHECKPOINT_EVERY) as run:
        data = load(args.data or run.env.data_uri or ".")
        state = {{"mean": 0.0}}
        if (ckpt := run.restore()) is not None:
            state = ckpt.state
        for step in run.steps():
            loss = train_step(state, data, step)
            run.log_metrics(loss=loss)
            if run.checkpoint_due():
                run.checkpoint(state)
        write_bytes(join(run.env.model_uri, "model.json"), json.dumps(state).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

TRAINER_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.10"
# spotorch-trainer: spotorch builds it from its own copy and stages it beside this package, so
# Vertex AI's pip finds it. Add what your code imports (numpy, pandas, torch...): Vertex installs
# it on the prebuilt container, and so does the local stack's Vertex emulator (from PyPI).
# google-cloud-storage and -pubsub: gs:// data and checkpoints, reports to spotorch.
dependencies = ["spotorch-trainer", "google-cloud-storage>=2.18", "google-cloud-pubsub>=2.23"]

[tool.setuptools]
packages = ["{module}"]
'''

TRAINER_README = '''\
# {name}: the training code

`{module}/__main__.py` is a loop on `spotorch_trainer` (spotorch's helper): it resumes from the
latest complete checkpoint, checkpoints on SIGTERM and exits 143 so spotorch relaunches it, and
reports progress. Replace `train_step()` and the state. This folder is a Python package: the
pipeline names it (`python_package.source`), spotorch builds it, and Vertex AI installs it with
its `dependencies` on a prebuilt training container. No image, no Docker.

Try it alone, with spotorch's environment (checkpoints and the model go to .spotorch/local/):

    mkdir -p /tmp/snapshot && echo "1,2,3" > /tmp/snapshot/part-0.csv
    PYTHONPATH=. TOTAL_STEPS=50 python -m {module} --data /tmp/snapshot

Then as a run on the local stack, from the project folder:

    eval "$(spotorch dev up --pipelines pipelines)"
    spotorch dev upload /tmp/snapshot gs://replace-me-landing/datasets/{name}/s1/   # marker last
    spotorch runs
'''


def _hcl(value: Any) -> str:
    """A value as HCL (tfvars)."""
    if isinstance(value, Mapping):
        inner = ", ".join(f"{json.dumps(str(k))} = {_hcl(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_hcl(v) for v in value) + "]"
    if value is None:
        return "null"
    return json.dumps(value)


def _type(raw: Any) -> str:
    return str(raw).removeprefix("${").removesuffix("}")


def tfvars_text(deploy: Path) -> str:
    """terraform.tfvars: every variable of deploy/variables.tf with its description and default."""
    from spotorch.operate.terraform import load_tf

    tf = load_tf(deploy)
    lines = ["# spotorch's Terraform variables (deploy/variables.tf), every one, with what it does.",
             f"# Fill in each {PLACEHOLDER}; a variable left commented out keeps its default.",
             "# Use: make deploy PIPELINES=pipelines TFVARS=terraform.tfvars (from the spotorch",
             "# checkout, with these paths made absolute or relative to it).", ""]
    for name, spec in tf.variables.items():
        description = str(spec.get("description", "")).strip()
        lines += [f"# {line}" for line in _wrap(description)]
        lines.append(f"# type: {_type(spec.get('type', 'any'))}")
        if description.startswith("Generated"):
            lines += ["#   written by deploy/package.py from your pipelines: leave it out",
                      f"# {name} = {_hcl(spec.get('default'))}", ""]
        elif name in TO_FILL or "default" not in spec:
            lines += [f"{name} = {_hcl(TO_FILL.get(name, PLACEHOLDER))}", ""]
        elif spec.get("sensitive"):
            lines += ["#   sensitive: prefer TF_VAR_" + name + " in the environment to a file",
                      f"# {name} = {_hcl(spec['default'])}", ""]
        else:
            lines += [f"# {name} = {_hcl(spec['default'])}", ""]
    return "\n".join(lines)


def _wrap(text: str, width: int = 96) -> Iterator[str]:
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            yield line
            line = word
        else:
            line = f"{line} {word}".strip()
    if line:
        yield line


def project_files(name: str, deploy: Path) -> dict[str, str]:
    """Relative path -> contents of everything `spotorch init` writes (the helper copied apart)."""
    module = name.replace("-", "_")
    readme = f"""\
# {name}: a spotorch project

- `pipelines/{name}.yaml`: when data lands, what trains on it, where. Fill in each
  `{PLACEHOLDER}` (buckets that exist, your project), then `spotorch validate pipelines/`.
- `trainer/`: the training code, a Python package Vertex AI installs on a prebuilt container
  (no Docker; trainer/README.md).
- `terraform.tfvars`: the deployment's settings, every one explained; set `project_id` and
  `operators` at least.

It runs on the local stack as written (trainer/README.md):
`eval "$(spotorch dev up --pipelines pipelines)"`, then `spotorch dev upload` a folder of data.

Deploy from the spotorch checkout (docs/deploy.md has the first-apply steps):

    make deploy PIPELINES=$PWD/pipelines TFVARS=$PWD/terraform.tfvars

Packaging refuses a pipeline or tfvars file that still holds `{PLACEHOLDER}`.
"""
    return {
        f"pipelines/{name}.yaml": pipeline_yaml(name),
        f"trainer/{module}/__init__.py": f'"""{name}: the training package."""\n',
        f"trainer/{module}/__main__.py": TRAINER_MAIN.format(name=name, module=module),
        "trainer/pyproject.toml": TRAINER_PYPROJECT.format(name=name, module=module),
        "trainer/README.md": TRAINER_README.format(name=name, module=module),
        "terraform.tfvars": tfvars_text(deploy),
        "README.md": readme,
    }


def write_project(directory: Path, name: str, deploy: Path, *, force: bool = False) -> list[Path]:
    """Write the starting project; the files written. ClickException on a clash."""
    if not NAME.match(name):
        raise click.ClickException(f"pipeline name {name!r}: lowercase letters, digits and '-'")
    if not (deploy / "variables.tf").is_file():
        raise click.ClickException(f"{deploy}/variables.tf not found: run from a spotorch checkout "
                                   "or give --deploy DIR")
    files = project_files(name, deploy)
    if directory.exists() and any(directory.iterdir()) and not force:
        raise click.ClickException(f"{directory} is not empty (--force writes over what clashes)")
    written = []
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


@click.command(name="init", context_settings=CONTEXT)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", default="my-pipeline", help="The pipeline's name (and the trainer's).")
@click.option("--deploy", "deploy", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_DEPLOY, help="spotorch's deploy/ (its variables.tf).")
@click.option("--force", is_flag=True, help="Write into a folder that is not empty.")
def init(directory: Path, name: str, deploy: Path, force: bool) -> None:
    """Write a starting project into DIRECTORY: a pipeline, a trainer, terraform.tfvars."""
    from spotorch.core.errors import ConfigError
    from spotorch.spec.loader import load_pipelines

    written = write_project(directory, name, deploy, force=force)
    for path in written:
        click.echo(f"wrote {path}")
    try:
        load_pipelines(str(directory / "pipelines"))
    except ConfigError as exc:  # the template itself is wrong: a bug, say it plainly
        raise click.ClickException(f"the written pipeline does not load: {exc}") from None
    left = [p for path in (directory / "pipelines", directory / "terraform.tfvars")
            for f in ([*sorted(path.glob("*.yaml"))] if path.is_dir() else [path])
            for p in placeholders(f)]
    click.echo(f"\nThe pipeline loads. Fill in these {len(left)} placeholder(s) ({PLACEHOLDER}):")
    for line in left:
        click.echo(f"  {line}")
    click.echo(f"then: make deploy PIPELINES={directory.resolve()}/pipelines "
               f"TFVARS={directory.resolve()}/terraform.tfvars")


def main(argv: list[str] | None = None) -> int:
    """`spotorch init ...` as a delegated command: the exit code (spotorch.commandline.run)."""
    return run(init, argv, prog_name="spotorch init")


if __name__ == "__main__":
    sys.exit(main())
