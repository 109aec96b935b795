"""Tiny blob storage over local paths and gs:// URIs; google-cloud-storage is imported only for gs://."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from spotorch_trainer import contract

GCS_SCHEME = "gs://"
FILE_SCHEME = "file://"

Payload = bytes | os.PathLike[str]  # the bytes of a file, or a local file to copy


class StorageError(OSError):
    """A storage operation failed or a URI is malformed."""


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS_SCHEME)


def join(base: str, *names: str) -> str:
    """Append path segments to a URI or local path with single slashes."""
    parts = [base.rstrip("/"), *(n.strip("/") for n in names if n.strip("/"))]
    return "/".join(parts)


def split_gcs(uri: str) -> tuple[str, str]:
    """Bucket and object name (or prefix, without leading slash) of a gs:// URI."""
    if not is_gcs(uri):
        raise StorageError(f"not a gs:// URI: {uri!r}")
    bucket, _, name = uri[len(GCS_SCHEME):].partition("/")
    if not bucket:
        raise StorageError(f"no bucket in {uri!r}")
    return bucket, name


class Storage(Protocol):
    """What checkpoints and the example need from a blob store."""

    def read(self, uri: str) -> bytes:
        """The object's bytes; raises FileNotFoundError when absent."""
        ...

    def write(self, uri: str, data: Payload) -> None:
        """Create or replace one object atomically (readers see the old or the new, never half)."""
        ...

    def exists(self, uri: str) -> bool:
        ...

    def list_dirs(self, uri: str) -> list[str]:
        """Names of the immediate sub-directories (prefixes) under uri."""
        ...

    def list_files(self, uri: str) -> list[str]:
        """Relative names of every object under uri, recursively, sorted."""
        ...

    def download(self, uri: str, path: Path) -> None:
        """Copy one object to a local file."""
        ...

    def delete(self, uri: str) -> None:
        """Delete one object; absent is fine."""
        ...


class LocalStorage:
    """Plain files; writes go to a temporary file, are fsynced and renamed into place."""

    @staticmethod
    def _path(uri: str) -> Path:
        return Path(uri[len(FILE_SCHEME):] if uri.startswith(FILE_SCHEME) else uri)

    def read(self, uri: str) -> bytes:
        return self._path(uri).read_bytes()

    def write(self, uri: str, data: Payload) -> None:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                if isinstance(data, bytes):
                    out.write(data)
                else:
                    with open(data, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)  # make the rename itself durable before anything written after it

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def list_dirs(self, uri: str) -> list[str]:
        path = self._path(uri)
        if not path.is_dir():
            return []
        return sorted(p.name for p in path.iterdir() if p.is_dir())

    def list_files(self, uri: str) -> list[str]:
        root = self._path(uri)
        if not root.is_dir():
            return []
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    def sizes(self, uri: str) -> dict[str, int]:
        """Relative name -> size in bytes of every file under uri, recursively."""
        root = self._path(uri)
        if not root.is_dir():
            return {}
        return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*")
                if p.is_file()}

    def download(self, uri: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(uri), path)

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        path.unlink(missing_ok=True)
        # Tidy up directories left empty, up to the first non-empty one.
        for parent in path.parents:
            try:
                parent.rmdir()
            except OSError:
                break


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. some network filesystems); the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class GcsStorage:
    """Google Cloud Storage through google-cloud-storage (honours STORAGE_EMULATOR_HOST)."""

    def __init__(self, client: Any | None = None) -> None:
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import google.cloud.storage as storage  # lazy: only gs:// users pay for it

                self._client = storage.Client()
            return self._client

    def _blob(self, uri: str) -> Any:
        bucket, name = split_gcs(uri)
        if not name:
            raise StorageError(f"no object name in {uri!r}")
        return self.client.bucket(bucket).blob(name)

    @staticmethod
    def _retry() -> Any:
        # Uploads are retried only with a generation precondition by default; ours are idempotent.
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY

    def read(self, uri: str, generation: int | None = None) -> bytes:
        """The object's bytes; with a generation, that generation's (a noncurrent one too, on a
        bucket with object versioning), never whatever overwrote it."""
        from google.api_core import exceptions

        try:
            if generation is None:
                blob = self._blob(uri)
            else:
                bucket, name = split_gcs(uri)
                blob = self.client.bucket(bucket).blob(name, generation=generation)
            return bytes(blob.download_as_bytes())
        except exceptions.NotFound as exc:
            where = uri if generation is None else f"{uri}#{generation}"
            raise FileNotFoundError(where) from exc

    def write(self, uri: str, data: Payload) -> None:
        blob = self._blob(uri)
        if isinstance(data, bytes):
            blob.upload_from_string(data, content_type="application/octet-stream",
                                    retry=self._retry())
        else:
            blob.upload_from_filename(os.fspath(data), retry=self._retry())

    def exists(self, uri: str) -> bool:
        return bool(self._blob(uri).exists())

    def _prefix(self, uri: str) -> tuple[str, str]:
        bucket, name = split_gcs(uri)
        return bucket, (name.rstrip("/") + "/") if name.strip("/") else ""

    def list_dirs(self, uri: str) -> list[str]:
        bucket, prefix = self._prefix(uri)
        it = self.client.list_blobs(bucket, prefix=prefix, delimiter="/")
        for _ in it:  # the prefixes are collected while the pages are read
            pass
        return sorted(p[len(prefix):].rstrip("/") for p in it.prefixes)

    def list_files(self, uri: str) -> list[str]:
        bucket, prefix = self._prefix(uri)
        names: Iterable[str] = (b.name for b in self.client.list_blobs(bucket, prefix=prefix))
        return sorted(n[len(prefix):] for n in names if not n.endswith("/"))

    def sizes(self, uri: str) -> dict[str, int]:
        """Relative name -> size in bytes of every object under uri (one listing)."""
        bucket, prefix = self._prefix(uri)
        return {b.name[len(prefix):]: int(b.size or 0)
                for b in self.client.list_blobs(bucket, prefix=prefix) if not b.name.endswith("/")}

    def download(self, uri: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._blob(uri).download_to_filename(os.fspath(path))

    def delete(self, uri: str) -> None:
        from google.api_core import exceptions

        with contextlib.suppress(exceptions.NotFound):
            self._blob(uri).delete()


_local = LocalStorage()
_gcs: GcsStorage | None = None
_gcs_lock = threading.Lock()


def storage_for(uri: str) -> Storage:
    """The storage that serves a URI: one shared GCS client for gs://, the filesystem otherwise."""
    global _gcs
    if not is_gcs(uri):
        return _local
    with _gcs_lock:
        if _gcs is None:
            _gcs = GcsStorage()
        return _gcs


def read_bytes(uri: str) -> bytes:
    """Read a whole object or file."""
    return storage_for(uri).read(uri)


@dataclass(frozen=True)
class SnapshotObject:
    """One object of a run's data snapshot, at the generation the run was created with."""

    uri: str  # gs://bucket/name
    name: str  # the object name in its bucket
    generation: int

    def read(self) -> bytes:
        """This generation's bytes (a later overwrite does not change them)."""
        return read_at(self.uri, self.generation)


MAX_INPUTS_BYTES = 64 << 20


def snapshot_objects(inputs_uri: str | None = None) -> list[SnapshotObject]:
    """The run's snapshot objects at their recorded generations, sorted by name, from the
    inputs manifest spotorch wrote ($SPOTORCH_INPUTS, or inputs_uri); [] when there is none (a
    local run, a submit by hand of a folder, a BigQuery export)."""
    uri = inputs_uri if inputs_uri is not None else os.environ.get(contract.ENV_INPUTS, "")
    if not uri:
        return []
    raw = read_bytes(uri)
    if len(raw) > MAX_INPUTS_BYTES:
        raise StorageError(f"inputs manifest {uri} is larger than {MAX_INPUTS_BYTES} bytes")
    try:
        doc = json.loads(raw)
        bucket = str(doc["bucket"])
        return sorted((SnapshotObject(f"gs://{bucket}/{o['name']}", str(o["name"]),
                                      int(o["generation"])) for o in doc["objects"]),
                      key=lambda o: o.name)
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"inputs manifest {uri} is not one spotorch writes: {exc}") from exc


def read_at(uri: str, generation: int | None) -> bytes:
    """Read an object at one generation (gs://; a local file has none: read as it is)."""
    store = storage_for(uri)
    if generation is not None and isinstance(store, GcsStorage):
        return store.read(uri, generation)
    return store.read(uri)


def write_bytes(uri: str, data: Payload) -> None:
    """Write a whole object or file atomically."""
    storage_for(uri).write(uri, data)


def list_files(uri: str) -> list[str]:
    """Relative names of every object under a prefix or directory, sorted."""
    return storage_for(uri).list_files(uri)
