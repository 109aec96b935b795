"""The web view's alerts page (issue 41): alert deliveries from the notification ledger and the
messages the functions failed to handle, read from Firestore (here its emulator)."""

from __future__ import annotations

import time

import pytest

from operator_runs import deps_for
from spotorch.local.emulators import EmulatorSet
from spotorch.operate.ui.server import UIServer
from test_ui import backend_of


def test_the_in_memory_store_says_it_cannot_list_alerts() -> None:
    server = UIServer(backend_of(deps_for()), port=0, refresh_s=3)
    try:
        status, _, body = server.respond("/alerts", {})
    finally:
        server.close()
    html = body.decode()
    assert status == 200 and "cannot list alerts (only Firestore can)" in html
    assert '<a href="/alerts" class=here>alerts</a>' in html


@pytest.mark.emulator
def test_alerts_and_failed_messages_from_firestore(firestore_emulator: EmulatorSet) -> None:
    from google.cloud import firestore

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import FirestoreArrivalReader
    from spotorch.adapters.gcp.notification_ledger import FirestoreNotificationLedger
    from spotorch.core.alert_ledger import Outcome

    project = firestore_emulator.project
    ledger = FirestoreNotificationLedger(project=project)
    now = time.time()
    assert ledger.claim("ev-1", "chat", "ops-run-1", now)
    ledger.finish("ev-1", "chat", Outcome.SENT, now + 1, detail="200 OK", attempts=1)
    assert ledger.claim("ev-2", "email", "ops-run-1", now + 2)
    ledger.finish("ev-2", "email", Outcome.FAILED, now + 3, detail="SMTP 550", attempts=3)
    FirestoreDocumentStore(project=project).put("delivery_failures", "k1", {
        "event_id": "m-9", "event_type": "google.cloud.pubsub.topic.v1.messagePublished",
        "reason": "Firestore unavailable", "at": now}, None)
    backend = backend_of(deps_for())
    backend.arrivals = FirestoreArrivalReader(firestore.Client(project=project))
    server = UIServer(backend, port=0, refresh_s=3)
    try:
        status, _, body = server.respond("/alerts", {})
    finally:
        server.close()
    html = body.decode()
    assert status == 200
    assert html.index("ev-2") < html.index("ev-1")  # newest first
    assert 'data-state="failed"' in html and "SMTP 550" in html and "200 OK" in html
    assert '<a href="/runs/ops-run-1">ops-run-1</a>' in html
    assert "Firestore unavailable" in html and "m-9" in html
    # what `spotorch ui` reads through: Firestore's REST API
    import os

    from spotorch.adapters.gcp.firestore_reads import RestSource

    rest = FirestoreArrivalReader(RestSource(project, "(default)",
                                             emulator=os.environ["FIRESTORE_EMULATOR_HOST"]))
    sent, failed = rest.signals(10)
    assert [d["event_id"] for d in sent] == ["ev-2", "ev-1"]
    assert [d["reason"] for d in failed] == ["Firestore unavailable"]
