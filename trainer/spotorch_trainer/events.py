"""Trainer events: the JSON messages the helper publishes to spotorch's trainer-events topic.

Building a message is pure; publishing goes through a Reporter. google-cloud-pubsub is imported
only when a PubSubReporter publishes for the first time. Reporting never raises into training.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import wait
from typing import Any, Protocol

from spotorch_trainer import contract
from spotorch_trainer.contract import rfc3339
from spotorch_trainer.env import TrainerEnv

log = logging.getLogger("spotorch_trainer")

Metrics = Mapping[str, float]


def _finite(value: Any) -> float | None:
    """A metric as a JSON-safe float (NaN and infinities have no JSON spelling: null)."""
    number = float(value)
    return number if math.isfinite(number) else None


def event_message(env: TrainerEnv, kind: str, *, now: float, step: int | None = None,
                  total_steps: int | None = None, metrics: Metrics | None = None,
                  checkpoint_uri: str | None = None,
                  exit_code: int | None = None, report_interval_s: float | None = None,
                  checkpoint_s: float | None = None,
                  replica_step_s: Sequence[float] | None = None) -> tuple[bytes, dict[str, str]]:
    """The Pub/Sub data (JSON bytes) and attributes of one trainer event, signed with the
    attempt's key when spotorch gave one (contract.sign_report).

    A NaN or infinite metric is null in "metrics" and named in "nonfinite" (a diverging loss is
    news, not a malformed message). The health fields appear only when they have a value.
    """
    if kind not in contract.EVENT_KINDS:
        raise ValueError(f"unknown trainer event kind {kind!r}")
    data = {
        "event_id": contract.trainer_event_id(env.run_id, env.attempt, kind, step),
        "kind": kind,
        "run_id": env.run_id,
        "attempt": env.attempt,
        "pipeline": env.pipeline,
        "step": step,
        "total_steps": total_steps,
        "metrics": {k: _finite(v) for k, v in (metrics or {}).items()},
        "checkpoint_uri": checkpoint_uri,
        "exit_code": exit_code,
        "time": rfc3339(now),
    }
    nonfinite = sorted(k for k, v in (metrics or {}).items() if _finite(v) is None)
    health = {"nonfinite": nonfinite or None, "report_interval_s": report_interval_s,
              "checkpoint_s": None if checkpoint_s is None else round(checkpoint_s, 6),
              # each training replica's own mean step time, by rank (Run.agree_step_times)
              "replica_step_s": None if not replica_step_s
              else [round(float(t), 6) for t in replica_step_s]}
    data.update({k: v for k, v in health.items() if v is not None})
    attributes = {contract.ATTR_SOURCE: contract.SOURCE_TRAINER, contract.ATTR_RUN_ID: env.run_id,
                  contract.ATTR_ATTEMPT: str(env.attempt), contract.ATTR_KIND: kind}
    body = json.dumps(data, sort_keys=True).encode()
    if env.report_key:  # signed over these exact bytes: nothing may re-encode them on the way
        attributes[contract.ATTR_SIGNATURE] = contract.sign_report(env.report_key, body)
    return body, attributes


class Reporter(Protocol):
    """Sends trainer events somewhere; must never raise."""

    def send(self, data: bytes, attributes: Mapping[str, str], *, wait: bool) -> None:
        """Send one message; with wait, block until it is out (or the reporter's timeout passes)."""
        ...

    def flush(self) -> None:
        """Wait (bounded) for messages still in flight."""
        ...


class LogReporter:
    """No events topic (a plain local run): events only go to the log."""

    def send(self, data: bytes, attributes: Mapping[str, str], *, wait: bool) -> None:
        log.debug("event %s", data.decode())

    def flush(self) -> None:
        pass


class ListReporter:
    """Keeps the messages in memory (tests, and code that wants to look at what was reported)."""

    def __init__(self) -> None:
        self.messages: list[tuple[dict[str, Any], dict[str, str]]] = []

    def send(self, data: bytes, attributes: Mapping[str, str], *, wait: bool) -> None:
        self.messages.append((json.loads(data), dict(attributes)))

    def flush(self) -> None:
        pass

    @property
    def kinds(self) -> list[str]:
        return [str(data["kind"]) for data, _ in self.messages]


class PubSubReporter:
    """Publishes to a Pub/Sub topic (honours PUBSUB_EMULATOR_HOST); each publish has a timeout."""

    def __init__(self, topic: str, *, timeout_s: float = 5.0, client: Any | None = None) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._client = client
        self._broken = False  # the client could not be built: stop trying, training goes on
        self._pending: set[Any] = set()
        self._lock = threading.Lock()

    def _publisher(self) -> Any | None:
        if self._client is None and not self._broken:
            try:
                from google.cloud import pubsub_v1  # lazy: import costs ~0.3 s

                self._client = pubsub_v1.PublisherClient()
            except Exception as exc:  # no library, no credentials: report nothing, train anyway
                self._broken = True
                log.warning("trainer events disabled: cannot create a Pub/Sub publisher: %s", exc)
        return self._client

    def _retry(self) -> Any:
        from google.api_core import retry

        return retry.Retry(initial=0.1, maximum=1.0, multiplier=2.0, timeout=self.timeout_s)

    def send(self, data: bytes, attributes: Mapping[str, str], *, wait: bool) -> None:
        try:
            client = self._publisher()
            if client is None:
                return
            future = client.publish(self.topic, data, retry=self._retry(), timeout=self.timeout_s,
                                    **attributes)
        except Exception as exc:
            log.warning("could not publish trainer event %s: %s", attributes.get("kind"), exc)
            return
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        if wait:
            self._wait([future])

    def _done(self, future: Any) -> None:
        with self._lock:
            self._pending.discard(future)
        try:
            exc = future.exception(timeout=0)
        except Exception as err:  # cancelled or still running: nothing more to learn
            exc = err
        if exc is not None:
            log.warning("trainer event not published: %s", exc)

    def _wait(self, futures: list[Any]) -> None:
        _, not_done = wait(futures, timeout=self.timeout_s)
        if not_done:
            log.warning("trainer event publish still pending after %.1fs; going on",
                        self.timeout_s)

    def flush(self) -> None:
        with self._lock:
            pending = list(self._pending)
        if pending:
            self._wait(pending)


def reporter_for(env: TrainerEnv, *, timeout_s: float = 5.0) -> Reporter:
    """Pub/Sub when spotorch gave an events topic, the log otherwise."""
    if env.events_topic:
        return PubSubReporter(env.events_topic, timeout_s=timeout_s)
    return LogReporter()


class Throttle:
    """Lets an action through at most once per interval (progress events)."""

    def __init__(self, interval_s: float, clock: Any = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
