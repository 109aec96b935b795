"""Session fixtures: the local emulator stack, started once for the tests that need it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "shared", ROOT / "trainer", ROOT / "functions", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from spotorch.local.emulators import EmulatorSet, reset_firestore, running  # noqa: E402
from spotorch.logs import setup_logging  # noqa: E402
from spotorch.settings import TOPIC_GCS_NOTIFICATIONS  # noqa: E402

setup_logging()  # as every function process does: spotorch's records as JSON lines on stdout

PROJECT = "spotorch-test"


@pytest.fixture(scope="session")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorSet]:
    """Firestore, Pub/Sub and fake-gcs-server emulators for the whole session, env vars set."""
    log_dir = tmp_path_factory.mktemp("emulators")
    with running(PROJECT, log_dir, gcs_topic=TOPIC_GCS_NOTIFICATIONS) as stack:
        saved = {k: os.environ.get(k) for k in stack.env()}
        os.environ.update(stack.env())
        try:
            yield stack
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def firestore_emulator(emulators: EmulatorSet) -> EmulatorSet:
    """The emulators, with Firestore emptied before the test."""
    reset_firestore(emulators.emulators["firestore"].address, emulators.project)
    return emulators
