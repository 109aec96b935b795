"""Command lines of the three emulators, for starting them all at once without blocking.

spotorch.local.emulators starts one emulator at a time and asks `gcloud info` for the SDK on each
start (about a second apiece); the stack resolves the SDK once and starts the three in parallel.
The flags are the same as spotorch.local.emulators uses.
"""

from __future__ import annotations

import functools
from pathlib import Path

from spotorch.local import emulators

HEALTH_PATHS = {"firestore": "/", "pubsub": "/", "gcs": "/storage/v1/b"}

# C1 only: the emulators start with about a third less CPU, which is what a shared 2-core
# machine runs short of; the little traffic of a local stack never needs C2's peak speed.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@functools.cache
def sdk_root() -> Path:
    """The gcloud SDK, looked up once per process."""
    return emulators.gcloud_sdk_root()


def firestore_argv(port: int) -> list[str]:
    jar = sdk_root() / "platform/cloud-firestore-emulator/cloud-firestore-emulator.jar"
    if not jar.exists():
        raise emulators.EmulatorError(f"Firestore emulator not found at {jar}")
    main = "com.google.cloud.datastore.emulator.firestore.CloudFirestore"
    return ["java", *JVM_OPTIONS, "-cp", str(jar), main, "start", "--host=127.0.0.1",
            f"--port={port}"]


def pubsub_argv(port: int, data_dir: Path) -> list[str]:
    """The emulator's launcher script; it takes JVM options from $JAVA_OPTS (pubsub_env)."""
    script = sdk_root() / "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    if not script.exists():
        raise emulators.EmulatorError(f"Pub/Sub emulator not found at {script}")
    return [str(script), "--host=127.0.0.1", f"--port={port}", f"--dir={data_dir}"]


def pubsub_env(env: dict[str, str]) -> dict[str, str]:
    """env plus the JVM options for the Pub/Sub emulator's launcher script."""
    return {**env, "JAVA_OPTS": " ".join((env.get("JAVA_OPTS", ""), *JVM_OPTIONS)).strip()}


def gcs_argv(port: int, project: str, topic: str) -> list[str]:
    """fake-gcs-server publishing object notifications to topic (the topic may come later)."""
    return [str(emulators.fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(port), "-backend", "memory", "-external-url", f"http://127.0.0.1:{port}",
            "-log-level", "warn", "-event.pubsub-project-id", project, "-event.pubsub-topic", topic,
            "-event.list", "finalize,delete,metadataUpdate"]
