"""Cloud Functions entry points: each decodes its event and delegates to spotorch's service layer."""

import flask
import functions_framework

from spotorch.entrypoints import functions
from spotorch.entrypoints.api import handle_request
from spotorch.entrypoints.depth import install

# functions-framework loads this module inside the app it builds: JSON nested too deep is
# refused before the framework parses it (a RecursionError there would answer 500).
if flask.has_app_context():
    install(flask.current_app, flask.current_app.name, lambda: functions.deps().docs)


@functions_framework.cloud_event
def on_object_finalized(event):  # type: ignore[no-untyped-def]
    """New data: a GCS object finalized (Eventarc) or its Pub/Sub notification."""
    functions.on_object_finalized(event)


@functions_framework.cloud_event
def on_table_changed(event):  # type: ignore[no-untyped-def]
    """New data in BigQuery: a load or DML job's audit-log entry (Eventarc)."""
    functions.on_table_changed(event)


@functions_framework.cloud_event
def on_job_event(event):  # type: ignore[no-untyped-def]
    """A training job changed state, or its trainer reported progress."""
    functions.on_job_event(event)


@functions_framework.cloud_event
def on_tick(event):  # type: ignore[no-untyped-def]
    """The periodic reconcile tick."""
    functions.on_tick(event)


@functions_framework.cloud_event
def on_run_event(event):  # type: ignore[no-untyped-def]
    """spotorch's own events, turned into alerts."""
    functions.on_run_event(event)


@functions_framework.http
def api(request):  # type: ignore[no-untyped-def]
    """Operator API: submit, cancel, retry, status (authenticated by Cloud Functions IAM)."""
    return handle_request(request)
