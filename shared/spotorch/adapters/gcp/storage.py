"""ObjectStore on google-cloud-storage (honours STORAGE_EMULATOR_HOST); the client on first use."""

from __future__ import annotations

from typing import Any

from spotorch.adapters.gcp._storage_client import storage_client
from spotorch.ports.storage import ObjectInfo, ObjectNotFound, ObjectPage


class GcsObjectStore:
    """ObjectStore on Cloud Storage: generations read exactly, uploads only if absent."""
    def __init__(self, client: Any = None, *, project: str | None = None) -> None:
        self._clients = storage_client(client, project)  # a StorageClient may be shared

    def _storage(self) -> Any:
        return self._clients.get()

    def read(self, bucket: str, name: str, generation: int, max_bytes: int) -> bytes:
        """ObjectStore.read: a ranged download of the generation; ObjectNotFound if absent."""
        from google.api_core import exceptions

        blob = self._storage().bucket(bucket).blob(name, generation=generation)
        try:
            data: bytes = blob.download_as_bytes(start=0, end=max_bytes - 1)
        except exceptions.NotFound:
            raise ObjectNotFound(f"gs://{bucket}/{name}#{generation}") from None
        return data

    def ensure_file(self, uri: str, path: str) -> bool:
        """ObjectStore.ensure_file: an upload preconditioned on no object existing."""
        from google.api_core import exceptions

        bucket, _, name = uri.removeprefix("gs://").partition("/")
        blob = self._storage().bucket(bucket).blob(name)
        try:  # only if absent: two instances uploading the same package at once is harmless
            blob.upload_from_filename(path, if_generation_match=0)
        except exceptions.PreconditionFailed:
            return False
        return True

    def exists(self, bucket: str, name: str, generation: int) -> bool:
        """ObjectStore.exists: a metadata read of the generation."""
        blob = self._storage().bucket(bucket).blob(name, generation=generation)
        return bool(blob.exists())

    def list_page(self, bucket: str, prefix: str, page_token: str | None,
                  page_size: int) -> ObjectPage:
        """ObjectStore.list_page: one page of ListObjects, with the next page's token."""
        iterator = self._storage().list_blobs(bucket, prefix=prefix or None,
                                              page_token=page_token, max_results=page_size)
        page = next(iterator.pages, None)
        blobs = list(page) if page is not None else []
        objects = tuple(ObjectInfo(bucket, b.name, int(b.generation or 0), b.size,
                                   b.updated.timestamp() if b.updated else None) for b in blobs)
        return ObjectPage(objects, iterator.next_page_token)
