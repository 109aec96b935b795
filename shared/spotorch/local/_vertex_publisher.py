"""Publishes the Vertex emulator's log entries to a topic of the Pub/Sub emulator, dropping some."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Mapping
from typing import Any

from spotorch.local import _vertex_logs as logs

log = logging.getLogger("spotorch.local.vertex_emulator")


class LogPublisher:
    """What a log sink to Pub/Sub does: one message per entry, unordered; `drop` loses some."""

    def __init__(self, project: str, topic: str | None, drop: float, rng: random.Random) -> None:
        self.project = project
        self.topic = topic
        self.drop = drop
        self.rng = rng
        self.published = 0
        self.dropped = 0
        self._client: Any = None
        self._path = ""

    def start(self) -> None:
        if not self.topic:
            return
        if not os.environ.get("PUBSUB_EMULATOR_HOST"):
            # A dev tool must never publish to a real project by accident.
            log.warning("PUBSUB_EMULATOR_HOST is not set: job-state messages are not published")
            self.topic = None
            return
        from google.api_core import exceptions
        from google.api_core.retry import Retry
        from google.cloud.pubsub_v1 import PublisherClient

        client = PublisherClient()
        self._path = (self.topic if self.topic.startswith("projects/")
                      else client.topic_path(self.project, self.topic))
        try:
            with contextlib.suppress(exceptions.AlreadyExists):
                client.create_topic(name=self._path, retry=Retry(timeout=10), timeout=5)
        except exceptions.GoogleAPIError as exc:
            # Polling still works without these messages: say so loudly, keep serving.
            log.error("cannot create %s (%s): job-state messages are not published",
                      self._path, exc)
            return
        self._client = client

    def publish(self, entry: Mapping[str, Any]) -> bool:
        """Publish one entry; False when it was dropped on purpose (or nothing is connected)."""
        if self.drop and self.rng.random() < self.drop:
            self.dropped += 1
            return False
        if self._client is None:
            return False
        future = self._client.publish(self._path, logs.encode(entry), **logs.attributes(entry))
        future.add_done_callback(self._done)
        self.published += 1
        return True

    @staticmethod
    def _done(future: Any) -> None:
        if future.exception() is not None:
            log.error("publishing a job-state message failed: %s", future.exception())

    def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.stop()
            self._client = None
