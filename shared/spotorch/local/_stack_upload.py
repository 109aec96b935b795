"""`spotorch dev upload LOCAL gs://BUCKET/PREFIX/`: put data into the local stack's fake Cloud
Storage the way a producer does (issue 41; `gcloud storage cp` wants an account).

A file goes to PREFIX/<its name> (or to the exact object when the destination does not end in
'/'); a folder's files go below PREFIX keeping their relative paths, in name order, with the
marker last: the snapshot's marker file when the folder has one, else, for a pipeline watching
the destination with `batch: marker` (not a manifest), an empty marker object written last, as
a producer would (`--no-marker` leaves it out). Hidden files and folders are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotorch.core.pipeline import BatchMode, Pipeline


class UploadError(Exception):
    """The upload cannot be done as asked: the message says why."""


@dataclass(frozen=True)
class Planned:
    """One object to write: from a local file, or empty (the marker a producer writes)."""

    name: str  # object name in the bucket
    path: Path | None


def split_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of gs://BUCKET/PREFIX; UploadError naming what is wrong."""
    if not uri.startswith("gs://"):
        raise UploadError(f"{uri!r}: the destination must be gs://BUCKET/PREFIX/")
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    if not bucket:
        raise UploadError(f"{uri!r}: no bucket name")
    return bucket, prefix


def watching(pipelines: Sequence[Pipeline], bucket: str, name: str) -> list[Pipeline]:
    """The pipelines whose trigger watches this object name's bucket and prefix."""
    return [p for p in pipelines if p.trigger.bucket == bucket
            and name.startswith(p.trigger.prefix)]


def plan(source: Path, uri: str, pipelines: Sequence[Pipeline] = (), *,
         marker: bool = True) -> tuple[str, list[Planned], list[str]]:
    """(bucket, objects in upload order, notes) for source to uri."""
    bucket, prefix = split_uri(uri)
    if not source.exists():
        raise UploadError(f"{source}: no such file or directory")
    notes: list[str] = []
    if source.is_file():
        name = prefix + source.name if (not prefix or prefix.endswith("/")) else prefix
        return bucket, [Planned(name, source)], notes
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    files = sorted(p for p in source.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(source).parts))
    if not files:
        raise UploadError(f"{source}: no files to upload")
    objects = [Planned(prefix + p.relative_to(source).as_posix(), p) for p in files]
    markers = {p.trigger.marker for p in watching(pipelines, bucket, prefix)
               if p.trigger.batch is BatchMode.MARKER} or {"_SUCCESS"}
    last = [o for o in objects if o.name.rsplit("/", 1)[-1] in markers]
    objects = [o for o in objects if o not in last] + last
    if not last and marker:
        wanting = [p for p in watching(pipelines, bucket, prefix)
                   if p.trigger.batch is BatchMode.MARKER]
        if len(wanting) == 1 and wanting[0].trigger.manifest:
            notes.append(f"pipeline {wanting[0].name} waits for a manifest marker "
                         f"({wanting[0].trigger.marker}) listing the objects; {source} has none, "
                         "so none was written")
        elif wanting:
            names = sorted({p.trigger.marker for p in wanting})
            objects += [Planned(prefix + n, None) for n in names]
            notes.append(f"wrote the marker {', '.join(names)} last (pipeline "
                         f"{', '.join(p.name for p in wanting)} waits for it; --no-marker: "
                         "leave it out)")
    if not watching(pipelines, bucket, prefix) and pipelines:
        notes.append(f"no served pipeline watches gs://{bucket}/{prefix}: nothing will start")
    return bucket, objects, notes


def upload(bucket: str, objects: Sequence[Planned], client: Any,
           said: Callable[[str], None] = lambda line: None) -> list[str]:
    """Write the objects in order (each a new generation); their gs:// URIs."""
    from google.api_core import exceptions

    target = client.bucket(bucket)
    done = []
    for o in objects:
        blob = target.blob(o.name)
        try:
            if o.path is None:
                blob.upload_from_string(b"")
            else:
                blob.upload_from_filename(str(o.path))
        except exceptions.NotFound:
            raise UploadError(f"gs://{bucket}: no such bucket on the local stack (the stack "
                              "creates the buckets its pipelines name)") from None
        done.append(f"gs://{bucket}/{o.name}")
        said(done[-1])
    return done
