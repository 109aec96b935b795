"""Command lines of the three emulators, for starting them all at once without blocking.

spotorch.local.emulators starts one emulator at a time and asks `gcloud info` for the SDK on each
start (about a second apiece); the stack resolves the SDK once and starts the three in parallel.
The flags are the same as spotorch.local.emulators uses.
"""

from __future__ import annotations

import functools
import json
import shutil
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from spotorch.local import emulators

HEALTH_PATHS = {"firestore": "/", "pubsub": "/", "gcs": "/storage/v1/b"}


def _says_ok(status: int, body: bytes) -> bool:
    return status == 200 and body.strip() == b"Ok"


def _lists_buckets(status: int, body: bytes) -> bool:
    try:
        return status == 200 and json.loads(body).get("kind") == "storage#buckets"
    except ValueError:
        return False


# How each emulator's health path answers when it is that emulator (checked on this machine).
HEALTH_ANSWERS: Mapping[str, Callable[[int, bytes], bool]] = {
    "firestore": _says_ok, "pubsub": _says_ok, "gcs": _lists_buckets}

EXPORT_SUFFIX = ".overall_export_metadata"

# C1 only: the emulators start with about a third less CPU, which is what a shared 2-core
# machine runs short of; the little traffic of a local stack never needs C2's peak speed.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@functools.cache
def sdk_root() -> Path:
    """The gcloud SDK, looked up once per process."""
    return emulators.gcloud_sdk_root()


def firestore_argv(port: int, import_from: Path | None = None) -> list[str]:
    """import_from: an export's *.overall_export_metadata file to start with (the emulator
    wants the file, not its directory: checked)."""
    jar = sdk_root() / "platform/cloud-firestore-emulator/cloud-firestore-emulator.jar"
    if not jar.exists():
        raise emulators.EmulatorError(f"Firestore emulator not found at {jar}")
    main = "com.google.cloud.datastore.emulator.firestore.CloudFirestore"
    argv = ["java", *JVM_OPTIONS, "-cp", str(jar), main, "start", "--host=127.0.0.1",
            f"--port={port}"]
    return argv + ([f"--import-data={import_from}"] if import_from else [])


def latest_export(directory: Path) -> Path | None:
    """The metadata file of the newest Firestore export in directory, if any."""
    found = sorted(directory.glob(f"*/*{EXPORT_SUFFIX}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def export_firestore(address: str, project: str, directory: Path, timeout: float = 30) -> Path:
    """Export every document (POST /emulator/v1/projects/P:export; --export-on-exit does
    nothing on SIGTERM here: checked); keep only the newest export. Returns its metadata file."""
    directory.mkdir(parents=True, exist_ok=True)
    request = urllib.request.Request(
        f"http://{address}/emulator/v1/projects/{project}:export",
        data=json.dumps({"database": f"projects/{project}/databases/(default)",
                         "export_directory": str(directory.resolve())}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=timeout).close()
    newest = latest_export(directory)
    if newest is None:
        raise emulators.EmulatorError(f"the Firestore export left nothing in {directory}")
    for old in directory.iterdir():
        if old.is_dir() and old != newest.parent:
            shutil.rmtree(old, ignore_errors=True)
    return newest


def pubsub_argv(port: int, data_dir: Path) -> list[str]:
    """The emulator's launcher script; it takes JVM options from $JAVA_OPTS (pubsub_env)."""
    script = sdk_root() / "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    if not script.exists():
        raise emulators.EmulatorError(f"Pub/Sub emulator not found at {script}")
    return [str(script), "--host=127.0.0.1", f"--port={port}", f"--dir={data_dir}"]


def pubsub_env(env: dict[str, str]) -> dict[str, str]:
    """env plus the JVM options for the Pub/Sub emulator's launcher script."""
    return {**env, "JAVA_OPTS": " ".join((env.get("JAVA_OPTS", ""), *JVM_OPTIONS)).strip()}


def gcs_argv(port: int, project: str, topic: str, root: Path | None = None) -> list[str]:
    """fake-gcs-server publishing object notifications to topic (the topic may come later);
    root: keep buckets and objects in that directory (else in memory)."""
    backend = ["-backend", "filesystem", "-filesystem-root", str(root)] if root \
        else ["-backend", "memory"]
    return [str(emulators.fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(port), *backend, "-external-url", f"http://127.0.0.1:{port}",
            "-log-level", "warn", "-event.pubsub-project-id", project, "-event.pubsub-topic", topic,
            "-event.list", "finalize,delete,metadataUpdate"]
