"""Alert channels (Google Chat and Slack webhooks, SMTP email), their secrets and their config."""

from __future__ import annotations

import json
import re
import smtplib
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from spotorch.core.alerts import Alert, chat_payload, chat_thread_params, email_message, slack_payload
from spotorch.logs import mark_sensitive
from spotorch.ports.alerts import CHANNEL_KINDS, Channel, ChannelConfigError, ChannelError

# Environment variables the notifier reads for its channels (deploy/ provides them).
ENV_CHAT_WEBHOOK_URL = "SPOTORCH_CHAT_WEBHOOK_URL"
ENV_SLACK_WEBHOOK_URL = "SPOTORCH_SLACK_WEBHOOK_URL"
ENV_SMTP_HOST = "SPOTORCH_SMTP_HOST"
ENV_SMTP_PORT = "SPOTORCH_SMTP_PORT"
ENV_SMTP_USER = "SPOTORCH_SMTP_USER"
ENV_SMTP_PASSWORD = "SPOTORCH_SMTP_PASSWORD"
ENV_SMTP_FROM = "SPOTORCH_SMTP_FROM"
ENV_EMAIL_TO = "SPOTORCH_EMAIL_TO"
SECRET_ENV = (
    ENV_CHAT_WEBHOOK_URL, ENV_SLACK_WEBHOOK_URL, ENV_SMTP_HOST, ENV_SMTP_PORT, ENV_SMTP_USER,
    ENV_SMTP_PASSWORD, ENV_SMTP_FROM, ENV_EMAIL_TO,
)
# Optional, not secret: TLS knobs for SMTP.
ENV_SMTP_STARTTLS = "SPOTORCH_SMTP_STARTTLS"  # auto (default) | require | off
ENV_SMTP_CA_FILE = "SPOTORCH_SMTP_CA_FILE"  # extra CA bundle, e.g. a local test server's cert

SECRET_SCHEME = "sm://"
DEFAULT_SMTP_PORT = 587
_SECRET_NAME = re.compile(r"^projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_RETRYABLE_HTTP = frozenset({408, 425, 429})


# --- secrets ------------------------------------------------------------------------------------

_resolved: dict[str, str] = {}
_secret_lock = threading.Lock()


def _secret_manager_value(name: str) -> str:
    """Read one secret version with google-cloud-secret-manager (imported only when needed)."""
    try:
        from google.cloud import secretmanager  # type: ignore[attr-defined]
    except ImportError as exc:
        raise ChannelConfigError(
            f"{SECRET_SCHEME}{name} needs google-cloud-secret-manager, which is not installed: "
            "pip install google-cloud-secret-manager, or give the value itself (e.g. with "
            "`gcloud functions deploy --set-secrets`)") from exc
    from google.api_core import exceptions as gexc

    try:
        response = secretmanager.SecretManagerServiceClient().access_secret_version(name=name)
    except gexc.ClientError as exc:
        raise ChannelConfigError(f"cannot read secret {name}: {type(exc).__name__}") from None
    except gexc.GoogleAPIError as exc:
        raise ChannelError(f"cannot read secret {name}: {type(exc).__name__}",
                           permanent=False) from None
    return str(response.payload.data.decode("utf-8")).strip()


# Tests replace this to stand in for Secret Manager.
secret_reader: Callable[[str], str] = _secret_manager_value


def resolve_secret(raw: str) -> str:
    """The value of a setting: itself, or for sm://projects/P/secrets/S[/versions/V] the secret."""
    if not raw.startswith(SECRET_SCHEME):
        return raw
    name = raw[len(SECRET_SCHEME):]
    if not _SECRET_NAME.match(name):
        raise ChannelConfigError(
            f"bad secret reference {raw!r}: want sm://projects/P/secrets/S[/versions/V]")
    if "/versions/" not in name:
        name += "/versions/latest"
    with _secret_lock:
        cached = _resolved.get(name)
    if cached is not None:
        return cached
    value = secret_reader(name)
    mark_sensitive(value)
    with _secret_lock:
        _resolved[name] = value
    return value


@dataclass(frozen=True)
class SecretRef:
    """A setting that may be a secret: where it came from (safe to log) and its raw value."""

    source: str  # env variable name or "route target ..."; never the value
    raw: str = field(repr=False)  # the value, or an sm:// reference resolved on first use
    sensitive: bool = True

    def __post_init__(self) -> None:
        if self.sensitive and not self.raw.startswith(SECRET_SCHEME):
            mark_sensitive(self.raw)

    def resolve(self) -> str:
        """The setting's value, a secret reference fetched; ChannelConfigError if empty."""
        value = resolve_secret(self.raw)
        if not value:
            raise ChannelConfigError(f"{self.source} is empty")
        return value


# --- channels ----------------------------------------------------------------------------------


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def with_query(url: str, params: Mapping[str, str]) -> str:
    """The URL with these query parameters set (existing ones, like a webhook's key, kept)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    return urlunsplit(parts._replace(query=urlencode([*query, *params.items()])))


def post_json(url: str, payload: Mapping[str, Any], timeout_s: float) -> None:
    """POST a JSON body; errors name the host only, never the (secret) path or query."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST",
        headers={"Content-Type": "application/json; charset=UTF-8"})
    host = _host(url)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        retryable = exc.code >= 500 or exc.code in _RETRYABLE_HTTP
        # `from None`: the HTTPError carries the full URL, which must not reach a logged traceback.
        raise ChannelError(f"HTTP {exc.code} {exc.reason} from {host}",
                           permanent=not retryable) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ChannelError(f"cannot reach {host}: {reason}", permanent=False) from None


@dataclass(frozen=True)
class ChatWebhook:
    """Google Chat incoming webhook; every alert of a run goes to one thread keyed by the run id."""

    url: SecretRef
    timeout_s: float = 10.0

    def send(self, alert: Alert) -> None:
        """Channel.send: a Chat card, threaded per run."""
        post_json(with_query(self.url.resolve(), chat_thread_params(alert)), chat_payload(alert),
                  self.timeout_s)


@dataclass(frozen=True)
class SlackWebhook:
    """Slack incoming webhook (it cannot thread: the text starts with pipeline/run instead)."""

    url: SecretRef
    timeout_s: float = 10.0

    def send(self, alert: Alert) -> None:
        """Channel.send: a Slack message to the webhook."""
        post_json(self.url.resolve(), slack_payload(alert), self.timeout_s)


class StartTls(StrEnum):
    """Whether email goes over STARTTLS."""

    AUTO = "auto"  # when the server offers it (port 465: implicit TLS instead)
    REQUIRE = "require"  # fail when the server does not offer it
    OFF = "off"  # never; only for local test servers


def parse_recipients(value: str) -> tuple[str, ...]:
    """The addresses in a list separated by commas, semicolons or spaces."""
    return tuple(r for r in re.split(r"[,;\s]+", value) if r)


def _smtp_error(exc: BaseException, where: str) -> ChannelError:
    """Classify an SMTP failure: 5xx replies, auth and TLS verification are permanent."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return ChannelError(f"{where}: all recipients refused", permanent=True)
    if isinstance(exc, smtplib.SMTPResponseException):
        text = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)
        return ChannelError(f"{where}: SMTP {exc.smtp_code} {text[:200]}",
                            permanent=exc.smtp_code >= 500)
    if isinstance(exc, ssl.SSLCertVerificationError | smtplib.SMTPNotSupportedError):
        return ChannelError(f"{where}: {exc}", permanent=True)
    return ChannelError(f"{where}: {type(exc).__name__}: {exc}", permanent=False)


@dataclass(frozen=True)
class SmtpEmail:
    """Email over SMTP: STARTTLS when offered (or implicit TLS on 465), login only over TLS."""

    host: str
    port: int
    sender: SecretRef
    recipients: SecretRef
    user: SecretRef | None = None
    password: SecretRef | None = None
    starttls: StartTls = StartTls.AUTO
    ca_file: str | None = None
    timeout_s: float = 20.0

    def send(self, alert: Alert) -> None:
        """Channel.send: one email over SMTP, with STARTTLS and a login when configured."""
        sender = self.sender.resolve()
        recipients = parse_recipients(self.recipients.resolve())
        if not recipients:
            raise ChannelConfigError(f"{self.recipients.source} names no recipient")
        message = email_message(alert, sender=sender, recipients=recipients)
        where = f"{self.host}:{self.port}"
        try:
            self._deliver(message, sender, recipients)
        except ChannelError:
            raise
        except (smtplib.SMTPException, OSError) as exc:
            raise _smtp_error(exc, where) from None

    def _deliver(self, message: Any, sender: str, recipients: tuple[str, ...]) -> None:
        context = ssl.create_default_context(cafile=self.ca_file)
        implicit_tls = self.port == 465
        smtp: smtplib.SMTP = (
            smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout_s, context=context)
            if implicit_tls else smtplib.SMTP(self.host, self.port, timeout=self.timeout_s))
        with smtp:
            smtp.ehlo()
            encrypted = implicit_tls
            if not encrypted and self.starttls is not StartTls.OFF and smtp.has_extn("starttls"):
                smtp.starttls(context=context)
                smtp.ehlo()
                encrypted = True
            if not encrypted and self.starttls is StartTls.REQUIRE:
                raise ChannelConfigError(f"{self.host}:{self.port} does not offer STARTTLS")
            if self.user is not None:
                if not encrypted:
                    raise ChannelConfigError("refusing to send the SMTP password without TLS")
                password = self.password.resolve() if self.password else ""
                smtp.login(self.user.resolve(), password)
            smtp.send_message(message, from_addr=sender, to_addrs=list(recipients))


@dataclass(frozen=True)
class BrokenChannel:
    """A channel whose configuration is wrong: every send fails with the reason, never retried."""

    problem: str

    def send(self, alert: Alert) -> None:
        """Channel.send: always fails with the configuration problem."""
        raise ChannelConfigError(self.problem)


# --- configuration -----------------------------------------------------------------------------


def _email_from_env(env: Mapping[str, str]) -> Channel:
    problems = [f"{name} is not set" for name in (ENV_SMTP_HOST, ENV_SMTP_FROM, ENV_EMAIL_TO)
                if not env.get(name)]
    port_text = env.get(ENV_SMTP_PORT) or str(DEFAULT_SMTP_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        problems.append(f"{ENV_SMTP_PORT} is not a port number")
    starttls = env.get(ENV_SMTP_STARTTLS, StartTls.AUTO.value).lower()
    if starttls not in {s.value for s in StartTls}:
        problems.append(f"{ENV_SMTP_STARTTLS} must be one of auto, require, off")
    if env.get(ENV_SMTP_PASSWORD) and not env.get(ENV_SMTP_USER):
        problems.append(f"{ENV_SMTP_PASSWORD} is set without {ENV_SMTP_USER}")
    if problems:
        return BrokenChannel("email: " + "; ".join(problems))
    user, password = env.get(ENV_SMTP_USER), env.get(ENV_SMTP_PASSWORD)
    return SmtpEmail(
        host=env[ENV_SMTP_HOST], port=int(port_text),
        sender=SecretRef(ENV_SMTP_FROM, env[ENV_SMTP_FROM], sensitive=False),
        recipients=SecretRef(ENV_EMAIL_TO, env[ENV_EMAIL_TO], sensitive=False),
        user=SecretRef(ENV_SMTP_USER, user, sensitive=False) if user else None,
        password=SecretRef(ENV_SMTP_PASSWORD, password) if password else None,
        starttls=StartTls(starttls), ca_file=env.get(ENV_SMTP_CA_FILE) or None,
    )


def channels_from_env(env: Mapping[str, str]) -> dict[str, Channel]:
    """The default channels ("chat", "slack", "email") this environment configures.

    Values may be sm:// Secret Manager references, resolved on first send. A channel with a
    broken configuration is still returned (as BrokenChannel) so its failure is logged per alert.
    """
    channels: dict[str, Channel] = {}
    if env.get(ENV_CHAT_WEBHOOK_URL):
        channels["chat"] = ChatWebhook(SecretRef(ENV_CHAT_WEBHOOK_URL, env[ENV_CHAT_WEBHOOK_URL]))
    if env.get(ENV_SLACK_WEBHOOK_URL):
        channels["slack"] = SlackWebhook(
            SecretRef(ENV_SLACK_WEBHOOK_URL, env[ENV_SLACK_WEBHOOK_URL]))
    if any(env.get(name) for name in (ENV_SMTP_HOST, ENV_EMAIL_TO)):
        channels["email"] = _email_from_env(env)
    return channels


def _target_ref(kind: str, target: str, env: Mapping[str, str]) -> SecretRef | str:
    """The destination a route target names, or a problem."""
    sensitive = kind != "email"
    if target.startswith(SECRET_SCHEME) or _SECRET_NAME.match(target):
        raw = target if target.startswith(SECRET_SCHEME) else SECRET_SCHEME + target
        return SecretRef(f"route target {target}", raw, sensitive=sensitive)
    if _ENV_NAME.match(target):
        value = env.get(target)
        return (SecretRef(target, value, sensitive=sensitive) if value
                else f"{kind} route target {target} is not set in the environment")
    if kind == "email" and "@" in target:
        return SecretRef("route target", target, sensitive=False)
    return (f"{kind} route target must be an environment variable name or an sm:// reference "
            "(webhook URLs are secrets and do not belong in pipeline files)")


_WEBHOOKS: Mapping[str, Callable[[SecretRef], Channel]] = {
    "chat": lambda ref: ChatWebhook(ref),
    "slack": lambda ref: SlackWebhook(ref),
}


def channel_for_target(kind: str, target: str, env: Mapping[str, str],
                       defaults: Mapping[str, Channel]) -> Channel | None:
    """The channel of a route with a target (None for an unknown kind).

    chat/slack: the target names the env variable, or the Secret Manager secret (sm://projects/..
    or projects/...), holding the webhook URL.
    email: the target names the env variable holding recipients (or lists addresses); the SMTP
    server is the default email channel's.
    """
    if kind not in CHANNEL_KINDS:
        return None
    ref = _target_ref(kind, target, env)
    if isinstance(ref, str):
        return BrokenChannel(ref)
    if kind in _WEBHOOKS:
        return _WEBHOOKS[kind](ref)
    base = defaults.get("email")
    if not isinstance(base, SmtpEmail):
        return base if isinstance(base, BrokenChannel) else BrokenChannel(
            f"email route target {target} needs {ENV_SMTP_HOST} and {ENV_SMTP_FROM}")
    return replace(base, recipients=ref)


class EnvChannels(Mapping[str, Channel]):
    """Channels from the environment; kind:target channels of routes are built on first lookup."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._channels = channels_from_env(self._env)
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> Channel:
        with self._lock:
            if key in self._channels:
                return self._channels[key]
            kind, _, target = key.partition(":")
            channel = channel_for_target(kind, target, self._env, self._channels) \
                if target else None
            if channel is None:
                raise KeyError(key)
            self._channels[key] = channel
            return channel

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._channels))

    def __len__(self) -> int:
        with self._lock:
            return len(self._channels)
