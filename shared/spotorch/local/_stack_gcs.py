"""The local stack's GCS admin: buckets and uploads in fake-gcs-server."""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("spotorch.local.gcs")


class GcsAdmin:
    """A storage client on the stack's fake-gcs-server (never os.environ's)."""

    def __init__(self, project: str, address: Callable[[], str]) -> None:
        self.project = project
        self._address = address
        self._client: Any = None
        self._lock = threading.Lock()
        self.buckets: set[str] = set()
        self.unversioned: set[str] = set()  # asked for versioning, which the backend refused

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                storage = importlib.import_module("google.cloud.storage")
                credentials = importlib.import_module("google.auth.credentials")
                self._client = storage.Client(
                    project=self.project, credentials=credentials.AnonymousCredentials(),
                    client_options={"api_endpoint": f"http://{self._address()}"})
            return self._client

    def forget(self) -> None:
        """After fake-gcs-server restarted: buckets must be checked again."""
        with self._lock:
            self._client = None
            self.buckets.clear()

    def create_buckets(self, names: Iterable[str], versioned: Iterable[str] = ()) -> None:
        """Create buckets (existing ones are fine); those in `versioned` with object versioning,
        so an overwritten object's older generations stay readable by generation, as on a
        production landing bucket. fake-gcs-server keeps old generations only in its memory
        backend; its filesystem backend (a durable stack) refuses versioning ("not
        implemented"): there the bucket is made without it, and said so."""
        from google.api_core.exceptions import Conflict, InternalServerError
        from google.api_core.retry import Retry

        client = self.client()
        wanted = set(versioned)
        for name in names:
            if name in self.buckets:
                continue
            with contextlib.suppress(Conflict):
                if name in wanted:
                    bucket = client.bucket(name)
                    bucket.versioning_enabled = True
                    try:  # no retries: the refusal is fake-gcs-server's final answer
                        client.create_bucket(bucket, retry=Retry(predicate=lambda _: False))
                    except InternalServerError as exc:
                        if "versioning" not in str(exc):
                            raise
                        self.unversioned.add(name)
                        log.warning("bucket %s made without object versioning (%s): an "
                                    "overwritten object's old generation is gone on this stack",
                                    name, str(exc)[-120:])
                        client.create_bucket(name)
                else:
                    client.create_bucket(name)
            self.buckets.add(name)

    def upload(self, bucket: str, name: str, data: bytes, content_type: str) -> str:
        """Upload an object (creating the bucket if needed); returns its gs:// URI."""
        self.create_buckets([bucket])
        self.client().bucket(bucket).blob(name).upload_from_string(data,
                                                                   content_type=content_type)
        return f"gs://{bucket}/{name}"
