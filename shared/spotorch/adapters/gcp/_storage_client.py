"""One google-cloud-storage client per process, built on first use, for the adapters that read
and write Cloud Storage (objects, preprocess outputs): one auth session and connection pool,
and cold starts never pay for the import."""

from __future__ import annotations

import threading
from typing import Any


class StorageClient:
    """A Storage client made once, on first use (honours STORAGE_EMULATOR_HOST), or a given one."""

    def __init__(self, project: str | None = None, client: Any = None) -> None:
        self._project = project
        self._client = client
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The client (made now if it is the first call)."""
        with self._lock:
            if self._client is None:
                import google.cloud.storage as storage

                self._client = storage.Client(project=self._project)
            return self._client


def storage_client(client: Any, project: str | None) -> StorageClient:
    """An adapter's client argument as a StorageClient: one shared with other adapters, a
    built client (tests), or None (made on first use for this project)."""
    return client if isinstance(client, StorageClient) else StorageClient(project, client)
