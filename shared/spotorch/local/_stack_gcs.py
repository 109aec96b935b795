"""The local stack's GCS admin: buckets and uploads in fake-gcs-server."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterable
from typing import Any


class GcsAdmin:
    """A storage client on the stack's fake-gcs-server (never os.environ's)."""

    def __init__(self, project: str, address: Callable[[], str]) -> None:
        self.project = project
        self._address = address
        self._client: Any = None
        self._lock = threading.Lock()
        self.buckets: set[str] = set()

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

    def create_buckets(self, names: Iterable[str]) -> None:
        """Create buckets (existing ones are fine)."""
        from google.api_core.exceptions import Conflict

        client = self.client()
        for name in names:
            if name in self.buckets:
                continue
            with contextlib.suppress(Conflict):
                client.create_bucket(name)
            self.buckets.add(name)

    def upload(self, bucket: str, name: str, data: bytes, content_type: str) -> str:
        """Upload an object (creating the bucket if needed); returns its gs:// URI."""
        self.create_buckets([bucket])
        self.client().bucket(bucket).blob(name).upload_from_string(data,
                                                                   content_type=content_type)
        return f"gs://{bucket}/{name}"
