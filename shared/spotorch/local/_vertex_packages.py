"""A python_package_spec replica in the Vertex emulator: install the packages, run the module.

What Vertex's prebuilt training container does at start, on this machine: download every
`package_uris` archive from Cloud Storage (the stack's fake GCS, as the job's environment says),
`pip install` them, then `python -m python_module args`. Locally the install is offline and
honest about it: `pip install --no-deps --no-index --no-build-isolation --target` into an
environment per content hash of the archives (cached under the emulator's workdir, built once
under a file lock), and every requirement the installed packages declare must then be met by
that environment or by this Python's own site-packages (the stack's: numpy, spotorch's
clients...); one that is not fails the replica as pip would on Vertex ("Could not find a
version that satisfies the requirement ..."). The executor image is not run (no Docker).

    python -m spotorch.local._vertex_packages --cache DIR --module M --package gs://... -- ARGS
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

COMPLETE = ".complete"  # written last: an environment without it is rebuilt


def argv(cache: Path, module: str, package_uris: Sequence[str], args: Sequence[str]) -> list[str]:
    """The replica's command line (the emulator's interpreter runs this module first)."""
    out = [sys.executable, "-m", "spotorch.local._vertex_packages", "--cache", str(cache),
           "--module", module]
    for uri in package_uris:
        out += ["--package", uri]
    return [*out, "--", *args]


def download(uri: str) -> bytes:
    """One archive from Cloud Storage (STORAGE_EMULATOR_HOST: the fake one)."""
    from google.cloud import storage

    if not uri.startswith("gs://") or "/" not in uri[5:]:
        raise ValueError(f"package_uris: {uri!r} is not a gs://bucket/object URI")
    bucket, name = uri[5:].split("/", 1)
    client = storage.Client.create_anonymous_client() if os.environ.get(
        "STORAGE_EMULATOR_HOST") else storage.Client()
    data: bytes = client.bucket(bucket).blob(name).download_as_bytes()
    return data


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def install(cache: Path, archives: Sequence[tuple[str, bytes]]) -> Path:
    """The site directory holding these archives installed (built once per content hash)."""
    digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() for _, d in archives)).hexdigest()
    env_dir = cache / digest[:24]
    site = env_dir / "site"
    with _locked(cache / f"{digest[:24]}.lock"):
        if (env_dir / COMPLETE).exists():
            return site
        shutil.rmtree(env_dir, ignore_errors=True)
        (env_dir / "archives").mkdir(parents=True)
        files = []
        for name, data in archives:
            target = env_dir / "archives" / name
            target.write_bytes(data)
            files.append(str(target))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                               "--no-build-isolation", "--disable-pip-version-check", "--quiet",
                               "--target", str(site), *files], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip install of {[n for n, _ in archives]} failed:\n"
                               f"{done.stdout}{done.stderr}")
        (env_dir / COMPLETE).write_text(digest)
    return site


def unmet(site: Path) -> list[str]:
    """Requirements of the installed packages that neither site nor this Python meets."""
    from packaging.requirements import Requirement

    installed = {d.metadata["Name"].lower().replace("_", "-"): d
                 for d in importlib.metadata.distributions(path=[str(site)])}
    missing = []
    for dist in installed.values():
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            key = req.name.lower().replace("_", "-")
            found = installed.get(key)
            version = found.version if found else _version(req.name)
            if version is None or (req.specifier and not req.specifier.contains(version, True)):
                missing.append(f"{line} (from {dist.metadata['Name']})")
    return missing


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv_: list[str] | None = None) -> int:
    """Install the packages (cached), then replace this process with `python -m MODULE ARGS`."""
    raw = sys.argv[1:] if argv_ is None else argv_
    cut = raw.index("--") if "--" in raw else len(raw)
    parser = argparse.ArgumentParser(prog="vertex-emulator python_package_spec")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--package", action="append", default=[])
    opts = parser.parse_args(raw[:cut])
    args = raw[cut + 1:]
    try:
        archives = [(uri.rsplit("/", 1)[1], download(uri)) for uri in opts.package]
        site = install(opts.cache, archives)
        missing = unmet(site)
    except Exception as exc:  # what the container's install step prints before it exits
        print(f"ERROR: installing the training package failed: {exc}", file=sys.stderr,
              flush=True)
        return 1
    if missing:
        for line in missing:
            print(f"ERROR: Could not find a version that satisfies the requirement {line}",
                  file=sys.stderr)
        print("ERROR: No matching distribution found (the local stack installs with --no-deps: "
              "a requirement must be installed in its environment)", file=sys.stderr, flush=True)
        return 1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    # stdout: an INFO entry, not a line of a failed job's error tail (stderr is ERROR)
    print(f"installed {', '.join(n for n, _ in archives)}; running python -m {opts.module}",
          flush=True)
    os.execve(sys.executable, [sys.executable, "-m", opts.module, *args], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
