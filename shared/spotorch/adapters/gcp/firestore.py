"""DocumentStore on Firestore: one read and one conditional write per change (update-time precondition)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotorch.ports.store import AddTo, ConflictError, InvalidDocument, batch_problem

# Composite indexes the store's queries need (deploy/ provisions them; tests/test_deploy.py checks).
# Every query here filters on a single field, which Firestore indexes automatically.
REQUIRED_INDEXES: tuple[tuple[str, tuple[str, ...]], ...] = ()

# Single-field equality queries the code makes: (collection, field).
QUERIED_FIELDS: tuple[tuple[str, str], ...] = (("runs", "active"), ("snapshots", "open"),
                                               ("snapshots", "pending_dispatch"),
                                               ("unmatched_uploads", "alerted"))


class FirestoreDocumentStore:
    """Documents in Firestore collections; versions are update times, writes are preconditioned."""

    def __init__(self, client: Any = None, *, project: str | None = None,
                 database: str = "(default)") -> None:
        self._client = client
        self._project = project
        self._database = database
        self.round_trips = 0

    @property
    def client(self) -> Any:
        """The Firestore client, built on first use (no client at import time)."""
        if self._client is None:
            from google.cloud import firestore

            self._client = firestore.Client(project=self._project, database=self._database)
        return self._client

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        """DocumentStore.get: the document and its update time as the version."""
        self.round_trips += 1
        snap = self.client.collection(collection).document(key).get()
        if not snap.exists:
            return None, None
        return snap.to_dict(), snap.update_time

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        """DocumentStore.put: one commit preconditioned on the update time, the adds in the same batch."""
        from google.api_core import exceptions

        too_many = batch_problem(collection, key, adds)
        if too_many:
            raise InvalidDocument(too_many)
        ref = self.client.collection(collection).document(key)
        self.round_trips += 1
        # One batch: the conditional write and the adds commit atomically, in one round trip.
        batch = self.client.batch()
        if version is None:
            batch.create(ref, dict(data))
        else:
            # update() is the write that takes a precondition; given every top-level field, it
            # replaces the document as set() would.
            option = self.client.write_option(last_update_time=version)
            batch.update(ref, _replace_all(data), option=option)
        for add in adds:
            batch.set(self.client.collection(add.collection).document(add.key),
                      _increments(add), merge=True)
        try:
            result = batch.commit()[0]
        except (exceptions.AlreadyExists, exceptions.FailedPrecondition, exceptions.Conflict,
                exceptions.Aborted) as exc:
            raise ConflictError(f"{collection}/{key}: {exc.message}") from exc
        except exceptions.InvalidArgument as exc:  # too large, or a value Firestore cannot hold
            raise InvalidDocument(f"{collection}/{key}: {exc.message}") from exc
        return result.update_time

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        """DocumentStore.query: the documents whose field equals the value."""
        from google.cloud.firestore_v1.base_query import FieldFilter

        self.round_trips += 1
        query = self.client.collection(collection).where(filter=FieldFilter(field_name, "==", value))
        return [snap.to_dict() for snap in query.stream()]

    def delete(self, collection: str, key: str) -> None:
        """Delete a document (no precondition: absent is fine)."""
        self.client.collection(collection).document(key).delete()


def _increments(add: AddTo) -> dict[str, Any]:
    """An AddTo as a set(merge=True): the nested maps' other keys stay, and the transforms add
    server-side."""
    from google.cloud.firestore_v1 import Increment

    counters = {m: {n: Increment(v) for n, v in values.items()} for m, values in add.counters.items()}
    return {**counters, **add.fields}


def _replace_all(data: Mapping[str, Any]) -> dict[str, Any]:
    """An update that rewrites every top-level field (update() with a precondition, like set())."""
    return {_quote(k): v for k, v in data.items()}


def _quote(key: str) -> str:
    return key if key.isidentifier() else f"`{key}`"
