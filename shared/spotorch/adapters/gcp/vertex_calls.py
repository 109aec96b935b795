"""What every Vertex AI adapter does around a call: retries, error classes, label keys."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spotorch.core.errors import ServiceCallFailed
from spotorch.ports.jobs import label_value

T = TypeVar("T")

TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter for transient API errors."""

    attempts: int = 5  # calls in all, the first included
    base_s: float = 0.5
    cap_s: float = 20.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    jitter: Callable[[], float] = field(default=random.random, compare=False)  # in [0, 1)

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0 for the first retry)."""
        return self.jitter() * min(self.cap_s, self.base_s * 2.0 ** retry)


def code_of(exc: BaseException) -> str:
    """The gRPC status name of an error (e.g. NOT_FOUND), else its class name."""
    status = getattr(exc, "grpc_status_code", None)
    return str(getattr(status, "name", "")) or type(exc).__name__


def classify_failure(exc: BaseException) -> tuple[str, bool]:
    """(code, transient) of an exception raised by a client call."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(exc, api.GoogleAPICallError):
        code = code_of(exc)
        return code, code in TRANSIENT_CODES
    if isinstance(exc, auth.TransportError):
        return "UNAVAILABLE", True
    if isinstance(exc, auth.GoogleAuthError):
        return "UNAUTHENTICATED", False
    raise exc  # not an API failure: a bug to see, not to retry


def call_with_retries(what: str, fn: Callable[[], T], retry: RetryPolicy,
                      error: type[ServiceCallFailed], *, attempts: int | None = None,
                      timeouts: tuple[type[BaseException], ...] = (),
                      futile: Callable[[str, str], bool] | None = None) -> T:
    """fn(), again after transient API errors (retry's backoff, `attempts` calls in all); every
    failure becomes `error` (permanent, or transient after the last attempt); an `error` fn
    raised itself passes through. timeouts: exceptions that count as DEADLINE_EXCEEDED (a
    future's wait). futile(code, message): a transient failure no retry can help (a quota)."""
    code, last = "", None  # type: tuple[str, BaseException | None]
    tries = max(1, retry.attempts if attempts is None else attempts)
    for n in range(tries):
        if n:
            retry.sleep(retry.delay(n - 1))
        try:
            return fn()
        except error:
            raise
        except timeouts as exc:
            code, last = "DEADLINE_EXCEEDED", exc
            continue
        except Exception as exc:
            code, transient = classify_failure(exc)
            if transient and futile is not None and futile(code, str(exc)):
                transient = False
            if not transient:
                raise error(f"{what}: {code}: {exc}", permanent=True, code=code) from exc
            last = exc
    raise error(f"{what}: {code} after {tries} attempts: {last}", permanent=False,
                code=code) from last


def label_key(key: str) -> str:
    """A Vertex-valid label key: as label_value, and starting with a lowercase letter."""
    clean = label_value(key)
    if not clean[:1].isalpha() or not clean[:1].islower():
        clean = label_value(f"k{key}")
    return clean


def emulator_channel(endpoint: str, token: str | None = None) -> Any:
    """An insecure gRPC channel to a local emulator at host:port. With a token, every call
    carries it as `authorization: Bearer TOKEN`, as google-auth's credentials do on a real
    channel: the local stack's Vertex emulator knows the caller by it (docs/local-stack.md)."""
    import grpc

    channel = grpc.insecure_channel(endpoint)
    if not token:
        return channel
    header = ("authorization", f"Bearer {token}")

    class _Bearer(grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
                  grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
        def _with_token(self, details: Any) -> Any:
            # grpc hands interceptors its call details as a namedtuple
            return details._replace(metadata=[*(details.metadata or ()), header])

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._with_token(details), request)

        def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._with_token(details), request)

    return grpc.intercept_channel(channel, _Bearer())

