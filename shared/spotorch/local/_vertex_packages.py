"""A python_package_spec replica in the Vertex emulator: install the packages, run the module.

What Vertex's prebuilt training container does at start, on this machine: download every
`package_uris` archive from Cloud Storage (the stack's fake GCS, as the job's environment says),
`pip install` them with their declared dependencies, then `python -m python_module args`.

Locally, in two layers, each cached and built once under a file lock:

1. the archives themselves: `pip install --no-deps --no-index --no-build-isolation --target`
   into an environment per content hash of the archives (under the emulator's workdir);
2. the requirements they declare that this Python does not already meet (the stack's numpy,
   spotorch's clients... are reused, as the image's own packages are on Vertex), installed from
   PyPI into one environment per (executor image, requirement set), kept in a cache shared by
   every stack on this machine ($SPOTORCH_PACKAGE_CACHE, default ~/.cache/spotorch/vertex-envs)
   so a second job, a second stack or a test run installs nothing. The framework the executor
   image carries (scikit-learn 1.0 on sklearn-cpu.1-0, ...) is installed at the image's version
   when the package requires it and a wheel for this Python can be had; else the newest the
   requirement allows, saying so.

The install time and pip's own output go to the replica's log (stdout, INFO), a failed install to
its stderr (ERROR, the failed job's error tail) with pip's "ERROR: Could not find a version that
satisfies the requirement ..." and exit 1, as the container's install step does on Vertex. The
executor image is not run (no Docker): the module runs on this machine's Python.

    python -m spotorch.local._vertex_packages --cache DIR --module M --package gs://... \
        [--image URI] -- ARGS
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

COMPLETE = ".complete"  # written last: an environment without it is rebuilt
ENV_CACHE = "SPOTORCH_PACKAGE_CACHE"  # where the requirement environments are kept
INSTALL_TIMEOUT_S = 1800.0
# The framework a prebuilt training image carries, from its name: sklearn-cpu.1-0 is
# scikit-learn 1.0 (Vertex's prebuilt containers page; the patch level is not in the name).
_FRAMEWORKS = {"sklearn": "scikit-learn", "xgboost": "xgboost", "tf": "tensorflow",
               "pytorch": "torch"}
_IMAGE = re.compile(r"/training/(sklearn|xgboost|tf|pytorch)-[a-z0-9]+\.(\d+)-(\d+)")


class InstallFailed(Exception):
    """pip could not install the package's requirements: its output says why."""


def argv(cache: Path, module: str, package_uris: Sequence[str], args: Sequence[str],
         image: str = "") -> list[str]:
    """The replica's command line (the emulator's interpreter runs this module first)."""
    out = [sys.executable, "-m", "spotorch.local._vertex_packages", "--cache", str(cache),
           "--module", module]
    for uri in package_uris:
        out += ["--package", uri]
    if image:
        out += ["--image", image]
    return [*out, "--", *args]


def image_framework(image: str) -> tuple[str, str] | None:
    """(distribution, version series) the executor image carries, e.g. ("scikit-learn",
    "1.0.*"); None for an image whose name says none."""
    found = _IMAGE.search(image or "")
    if found is None:
        return None
    return _FRAMEWORKS[found.group(1)], f"{found.group(2)}.{found.group(3)}.*"


def env_cache() -> Path:
    """Where requirement environments are kept: shared by every stack and test run here."""
    given = os.environ.get(ENV_CACHE)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spotorch" / "vertex-envs"


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


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(*sites: Path) -> dict[str, importlib.metadata.Distribution]:
    found: dict[str, importlib.metadata.Distribution] = {}
    for site in reversed(sites):  # the first site wins, as on PYTHONPATH
        found |= {_key(d.metadata["Name"]): d
                  for d in importlib.metadata.distributions(path=[str(site)])}
    return found


def unmet(site: Path, *more: Path, image: str = "") -> list[str]:
    """Requirements of the packages installed in site that neither site, the `more` sites nor
    this Python meets, as "REQUIREMENT (from PACKAGE)". With the executor image: a requirement
    of the image's framework this Python meets at another version than the image's is unmet
    (the image's version is what Vertex would run)."""
    from packaging.requirements import Requirement

    own = _installed(site)
    installed = _installed(site, *more)
    framework = image_framework(image)
    missing = []
    for dist in own.values():
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            found = installed.get(_key(req.name))
            version = found.version if found else _version(req.name)
            unmet_here = version is None or bool(req.specifier and not req.specifier.contains(
                version, True))
            other_framework = bool(framework and _key(req.name) == _key(framework[0])
                                   and found is None and version is not None
                                   and not _in_series(version, framework[1]))
            if unmet_here or other_framework:
                missing.append(f"{line} (from {dist.metadata['Name']})")
    return missing


def _in_series(version: str, series: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(f"=={series}").contains(version, True)


def _pip(target: Path, requirements: Sequence[str], only_binary: Sequence[str] = ()
         ) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
               "--no-input", "--prefer-binary", "--target", str(target)]
    if only_binary:
        command += ["--only-binary", ",".join(only_binary)]
    return subprocess.run([*command, *requirements], capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S)


def requirement_env(cache: Path, image: str, requirements: Sequence[str],
                    say: Callable[[str], None] = print) -> Path:
    """The site directory holding these requirements installed from PyPI, with the image's
    framework at its version where it can be had (built once per (image, requirement set),
    under a file lock); InstallFailed with pip's output when they cannot be installed."""
    from packaging.requirements import Requirement

    wanted = sorted(dict.fromkeys(requirements))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256("\n".join([python, image, *wanted]).encode()).hexdigest()[:24]
    env_dir = cache / digest
    site = env_dir / "site"
    with _locked(cache / f"{digest}.lock"):
        if (env_dir / COMPLETE).exists():
            say(f"requirements {', '.join(wanted)} for {image or 'this Python'}: cached "
                f"({(env_dir / COMPLETE).read_text().strip()})")
            return site
        shutil.rmtree(env_dir, ignore_errors=True)
        env_dir.mkdir(parents=True)
        began = time.monotonic()
        framework = image_framework(image)
        pinned = list(wanted)
        if framework is not None:
            name, series = framework
            for i, line in enumerate(wanted):
                req = Requirement(line)
                if _key(req.name) == _key(name):
                    req.specifier &= f"=={series}"
                    pinned[i] = str(req)
        say(f"installing {', '.join(pinned)} for {image or 'this Python'} from PyPI")
        done = _pip(site, pinned, [framework[0]] if framework and pinned != wanted else ())
        if done.returncode != 0 and pinned != wanted:
            assert framework is not None
            say(f"{framework[0]} {framework[1]} (what {image} carries) cannot be had for Python "
                f"{python} here: installing the newest the requirement allows instead")
            shutil.rmtree(site, ignore_errors=True)
            done = _pip(site, wanted)
        if done.returncode != 0:
            raise InstallFailed((done.stdout + done.stderr).strip())
        for line in done.stdout.splitlines():
            if line.startswith("Successfully installed"):
                say(line)
        took = f"installed in {time.monotonic() - began:.1f} s"
        say(took)
        (env_dir / COMPLETE).write_text(took)
    return site


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv_: list[str] | None = None) -> int:
    """Install the packages and their requirements (cached), then replace this process with
    `python -m MODULE ARGS`."""
    raw = sys.argv[1:] if argv_ is None else argv_
    cut = raw.index("--") if "--" in raw else len(raw)
    parser = argparse.ArgumentParser(prog="vertex-emulator python_package_spec")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--package", action="append", default=[])
    parser.add_argument("--image", default="")
    opts = parser.parse_args(raw[:cut])
    args = raw[cut + 1:]
    began = time.monotonic()
    sites: list[Path] = []
    try:
        archives = [(uri.rsplit("/", 1)[1], download(uri)) for uri in opts.package]
        sites.append(install(opts.cache, archives))
        missing = unmet(sites[0], image=opts.image)
        if missing:
            requirements = [line.rsplit(" (from ", 1)[0] for line in missing]
            sites.append(requirement_env(env_cache(), opts.image, requirements,
                                         lambda line: print(line, flush=True)))
            missing = unmet(sites[0], sites[1])
    except InstallFailed as exc:  # pip's own account, as the container's install step prints
        print(str(exc), file=sys.stderr)
        print("ERROR: installing the training package's requirements failed", file=sys.stderr,
              flush=True)
        return 1
    except Exception as exc:  # what the container's install step prints before it exits
        print(f"ERROR: installing the training package failed: {exc}", file=sys.stderr,
              flush=True)
        return 1
    if missing:
        for line in missing:
            print(f"ERROR: Could not find a version that satisfies the requirement {line}",
                  file=sys.stderr)
        print("ERROR: No matching distribution found", file=sys.stderr, flush=True)
        return 1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*map(str, sites), env.get("PYTHONPATH", ""))
                                        if p)
    # stdout: an INFO entry, not a line of a failed job's error tail (stderr is ERROR)
    print(f"installed {', '.join(n for n, _ in archives)} in {time.monotonic() - began:.1f} s; "
          f"running python -m {opts.module}", flush=True)
    os.execve(sys.executable, [sys.executable, "-m", opts.module, *args], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
