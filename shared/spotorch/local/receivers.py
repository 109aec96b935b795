"""Local alert endpoints for tests and the demo: a real webhook receiver and a real SMTP server."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from spotorch.local.emulators import free_port


class ReceiverError(RuntimeError):
    """A receiver could not start or was used before starting."""


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


# --- webhooks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedRequest:
    """One POST the webhook receiver got, and what it answered."""

    path: str  # without the query
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> Any:
        """The request's body parsed as JSON."""
        return json.loads(self.body)


class WebhookReceiver:
    """An HTTP server in a thread that records every POST; can fail the next N with an error code.

    Give each channel its own path (e.g. {url}/chat and {url}/slack) to tell them apart.
    """

    def __init__(self, host: str = "127.0.0.1",
                 on_receive: Callable[[ReceivedRequest], None] | None = None) -> None:
        """on_receive: called with every POST once recorded (e.g. to write it to a file)."""
        self.host = host
        self.on_receive = on_receive
        self._received: list[ReceivedRequest] = []
        self._fail: list[int] = []  # statuses to answer with, next first
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver._record(self.path, dict(self.headers.items()), body)
                reply = json.dumps({"name": f"messages/{len(receiver.received)}"}
                                   if status == 200 else {"error": {"code": status}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests read .received instead

        return Handler

    def _record(self, raw_path: str, headers: dict[str, str], body: bytes) -> int:
        parts = urlsplit(raw_path)
        with self._lock:
            status = self._fail.pop(0) if self._fail else 200
            request = ReceivedRequest(parts.path, parse_qs(parts.query), headers, body, status)
            self._received.append(request)
        if self.on_receive is not None:
            self.on_receive(request)
        return status

    def start(self) -> str:
        """Start serving; returns the base URL (http://127.0.0.1:PORT)."""
        if self._server is None:
            self._server = ThreadingHTTPServer((self.host, 0), self._handler())
            self._server.daemon_threads = True
            # A short poll interval: stop() waits for the loop to notice the shutdown.
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                            name="webhook-receiver", daemon=True)
            self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        """The receiver's base URL; ReceiverError before it is started."""
        if self._server is None:
            raise ReceiverError("webhook receiver not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def received(self) -> list[ReceivedRequest]:
        """Every POST so far, in arrival order (failed ones included, with their status)."""
        with self._lock:
            return list(self._received)

    def ok(self, path: str | None = None) -> list[ReceivedRequest]:
        """POSTs answered with 200, optionally only those to one path."""
        return [r for r in self.received if r.status == 200 and (path is None or r.path == path)]

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next n POSTs with `status` instead of 200."""
        with self._lock:
            self._fail = [status] * n

    def wait_for(self, count: int, timeout: float = 5.0, path: str | None = None) -> bool:
        """Wait until `count` successful POSTs (to `path`) have arrived."""
        return _wait(lambda: len(self.ok(path)) >= count, timeout)

    def clear(self) -> None:
        """Forget what was received and the failures queued for the next requests."""
        with self._lock:
            self._received.clear()
            self._fail.clear()

    def stop(self) -> None:
        """Stop the server and its thread; safe to call twice."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- SMTP --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMail:
    """One message the SMTP server accepted."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    tls: bool  # whether the session had switched to TLS (STARTTLS)
    login: str | None  # the user that authenticated, if any


def self_signed_cert(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A throwaway certificate (and key) valid for `host` and localhost; returns (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = dt.datetime.now(dt.UTC)
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass
class _SmtpState:
    messages: list[ReceivedMail] = field(default_factory=list)
    fail: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_receive: Callable[[ReceivedMail], None] | None = None


class _Handler:
    """aiosmtpd handler: records each message, or answers a temporary/permanent failure."""

    def __init__(self, state: _SmtpState) -> None:
        self.state = state

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.state.lock:
            if self.state.fail:
                code = self.state.fail.pop(0)
                return f"{code} {'try again later' if code < 500 else 'rejected'} (simulated)"
            message = email.message_from_bytes(envelope.original_content or envelope.content,
                                               policy=email.policy.default)
            login = session.auth_data.decode() if isinstance(session.auth_data, bytes) \
                else session.auth_data
            mail = ReceivedMail(str(envelope.mail_from), tuple(envelope.rcpt_tos), message,
                                session.ssl is not None, login)
            self.state.messages.append(mail)
        if self.state.on_receive is not None:
            self.state.on_receive(mail)
        return "250 Message accepted for delivery"


class SmtpReceiver:
    """A local SMTP server (aiosmtpd) in a thread that records messages.

    starttls=True offers STARTTLS with a throwaway certificate (its file is `ca_file`, for the
    client to trust); auth=(user, password) requires that login (over TLS only, as aiosmtpd does).
    """

    def __init__(self, *, starttls: bool = False, require_starttls: bool = False,
                 auth: tuple[str, str] | None = None, host: str = "127.0.0.1",
                 on_receive: Callable[[ReceivedMail], None] | None = None) -> None:
        self.host = host
        self.starttls = starttls or require_starttls or auth is not None
        self.require_starttls = require_starttls
        self.auth = auth
        self.ca_file: str | None = None
        self._state = _SmtpState(on_receive=on_receive)
        self._controller: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _authenticator(self) -> Callable[..., Any]:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        expected = self.auth

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                         data: Any) -> AuthResult:
            ok = (isinstance(data, LoginPassword) and expected is not None
                  and (data.login.decode(), data.password.decode()) == expected)
            return AuthResult(success=ok, handled=False, auth_data=data.login if ok else None)

        return authenticate

    def start(self) -> tuple[str, int]:
        """Start the server; returns (host, port)."""
        if self._controller is not None:
            return self.address
        import ssl

        from aiosmtpd.controller import Controller

        mail_log = logging.getLogger("mail.log")
        if mail_log.level == logging.NOTSET:
            mail_log.setLevel(logging.WARNING)  # aiosmtpd logs every SMTP command at INFO

        kwargs: dict[str, Any] = {}
        if self.starttls:
            self._tmp = tempfile.TemporaryDirectory(prefix="spotorch-smtp-")
            cert, key = self_signed_cert(Path(self._tmp.name), self.host)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
            kwargs.update(tls_context=context, require_starttls=self.require_starttls)
            self.ca_file = str(cert)
        if self.auth is not None:
            kwargs.update(authenticator=self._authenticator(), auth_required=True,
                          auth_require_tls=True)
        # aiosmtpd needs the port before it binds (it connects to it to check): another process
        # may take a free port meanwhile, so a bind failure is retried on a new one.
        for attempt in range(3):
            controller = Controller(_Handler(self._state), hostname=self.host,
                                    port=free_port(), **kwargs)
            try:
                controller.start()
                break
            except OSError as exc:
                if attempt == 2:
                    raise ReceiverError(f"SMTP receiver did not start: {exc}") from exc
            except Exception as exc:
                raise ReceiverError(f"SMTP receiver did not start: {exc}") from exc
        self._controller = controller
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the SMTP server listens on; ReceiverError before it is started."""
        if self._controller is None:
            raise ReceiverError("SMTP receiver not started")
        return self.host, int(self._controller.port)

    @property
    def port(self) -> int:
        """The port the SMTP server listens on."""
        return self.address[1]

    @property
    def received(self) -> list[ReceivedMail]:
        """Every accepted message with its envelope and session details, in arrival order."""
        with self._state.lock:
            return list(self._state.messages)

    @property
    def messages(self) -> list[EmailMessage]:
        """Every accepted message, parsed (headers by subscript, get_body() for the parts)."""
        return [mail.message for mail in self.received]

    def fail_next(self, n: int, code: int = 451) -> None:
        """Refuse the next n messages with this SMTP code (4xx temporary, 5xx permanent)."""
        with self._state.lock:
            self._state.fail = [code] * n

    def wait_for(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until at least `count` messages arrived; False on timeout."""
        return _wait(lambda: len(self.received) >= count, timeout)

    def clear(self) -> None:
        """Forget the messages received and the failures queued for the next ones."""
        with self._state.lock:
            self._state.messages.clear()
            self._state.fail.clear()

    def stop(self) -> None:
        """Stop the SMTP server and remove its temporary folder; safe to call twice."""
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
