"""What a submit by hand (CLI/API) must name before it may start anything (issue 39).

An object event reaches spotorch only for a bucket and prefix the pipeline watches and only once
data is there; a submit names its data URI itself. So submit and submit-sweep check it first: a
gs:// URI in a landing bucket the pipeline watches, with no '.', '..' or empty segments (a path
that escapes its folder), and something there. An invalid URI answers 400 (InvalidSubmit), one
that names nothing 404 (NothingThere): no run is started and no job launched for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotorch.app.snapshots import IntakeError, InvalidSubmit

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.pipeline import Pipeline


class NothingThere(IntakeError, LookupError):
    """A submitted data URI whose bucket does not exist or under which there is nothing."""


def _segments_problem(path: str) -> str | None:
    """What is wrong with the path's segments: '.', '..', or an empty one; None: nothing."""
    segments = path.split("/")
    if segments and segments[-1] == "":
        segments = segments[:-1]  # a trailing '/' names a folder
    for seg in segments:
        if seg in (".", ".."):
            return f"has a {seg!r} segment (a data URI may not leave its folder)"
        if seg == "":
            return "has an empty segment ('//')"
    return None


def check_data_uri(deps: Deps, pipeline: Pipeline, data_uri: str) -> None:
    """Raise InvalidSubmit (400) or NothingThere (404) unless data_uri may start a run."""
    if data_uri.startswith("/"):  # a local path (the local stack's own tools)
        problem = _segments_problem(data_uri[1:])
        if problem:
            raise InvalidSubmit(f"data_uri {data_uri[:200]!r} {problem}")
        return
    if not data_uri.startswith("gs://"):
        raise InvalidSubmit(f"data_uri must be gs://bucket/path: {data_uri[:200]!r}")
    bucket, _, path = data_uri[len("gs://"):].partition("/")
    if not bucket:
        raise InvalidSubmit(f"data_uri {data_uri[:200]!r} names no bucket")
    problem = _segments_problem(path) if path else None
    if problem:
        raise InvalidSubmit(f"data_uri {data_uri[:200]!r} {problem}")
    watched = pipeline.trigger.bucket
    if watched and bucket != watched:
        raise InvalidSubmit(f"data_uri {data_uri[:200]!r} is not in the bucket pipeline "
                            f"{pipeline.name!r} watches (gs://{watched}/)")
    if not _anything_at(deps, bucket, path):
        raise NothingThere(f"nothing at {data_uri[:200]!r}: no object and no folder with "
                           "objects there")


def _anything_at(deps: Deps, bucket: str, path: str) -> bool:
    """Whether an object is at the path, or any object under it as a folder."""
    try:
        if path.endswith("/") or not path:
            return bool(deps.objects.list_page(bucket, path, None, 1).objects)
        first = deps.objects.list_page(bucket, path, None, 1).objects
        if first and first[0].name == path:
            return True  # the object itself (it sorts first among names it prefixes)
        return bool(deps.objects.list_page(bucket, path + "/", None, 1).objects)
    except Exception as exc:
        if getattr(exc, "code", None) == 404:  # google.api_core NotFound: no such bucket
            raise NothingThere(f"bucket gs://{bucket}/ does not exist ({str(exc)[:200]})") \
                from None
        raise
