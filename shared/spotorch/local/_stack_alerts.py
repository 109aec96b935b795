"""The local stack's alert receivers: a webhook and an SMTP server, every delivery in a file.

`spotorch dev alerts` reads that file (RUN_DIR/alerts.jsonl): the receivers live in the
supervisor process, the command in another.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spotorch.local._stack_pipelines import RouteInfo, env_targets
from spotorch.local.receivers import ReceivedMail, ReceivedRequest, SmtpReceiver, WebhookReceiver
from spotorch_trainer.contract import rfc3339

ALERTS_FILE = "alerts.jsonl"
SMTP_FROM = "spotorch@localhost"
EMAIL_TO = "ml-team@localhost"

# The default channel of each kind, as the notifier reads it from the environment.
_WEBHOOK_ENV = {"chat": "SPOTORCH_CHAT_WEBHOOK_URL", "slack": "SPOTORCH_SLACK_WEBHOOK_URL"}


def _event_type(text: str) -> str:
    for token in text.replace('"', " ").split():
        if token.startswith("dev.spotorch."):
            return token.strip(",.:;")
    return ""


class AlertReceivers:
    """Both receivers, started and stopped together; deliveries appended to a JSONL file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._lock = threading.Lock()
        self.webhook = WebhookReceiver(on_receive=self._webhook_received)
        self.smtp = SmtpReceiver(on_receive=self._mail_received)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self.webhook.start()
        self.smtp.start()

    def stop(self) -> None:
        self.webhook.stop()
        self.smtp.stop()

    def _write(self, record: Mapping[str, Any]) -> None:
        with self._lock, self.log_path.open("a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")

    def _webhook_received(self, request: ReceivedRequest) -> None:
        text = request.body.decode("utf-8", "replace")
        self._write({"at": rfc3339(time.time()), "channel": request.path.strip("/").split("/")[0],
                     "path": request.path, "status": request.status,
                     "event_type": _event_type(text), "body": text[:4000]})

    def _mail_received(self, mail: ReceivedMail) -> None:
        message = mail.message
        body = message.get_body(("plain",))
        self._write({"at": rfc3339(time.time()), "channel": "email", "to": list(mail.rcpt_tos),
                     "subject": str(message.get("Subject", "")),
                     "event_type": str(message.get("X-Spotorch-Event-Type", "")),
                     "body": body.get_content()[:4000] if body is not None else ""})

    def urls(self) -> dict[str, str]:
        host, port = self.smtp.address
        return {"webhook": self.webhook.url, "smtp": f"smtp://{host}:{port}"}

    def env(self, routes: Iterable[RouteInfo]) -> dict[str, str]:
        """Environment that routes every channel the pipelines use to these receivers.

        The default chat/slack/email channels, and each route target that names an
        environment variable (a sm:// secret cannot be routed: Secret Manager is not emulated).
        """
        host, port = self.smtp.address
        env = {_WEBHOOK_ENV[k]: f"{self.webhook.url}/{k}" for k in _WEBHOOK_ENV}
        env.update({"SPOTORCH_SMTP_HOST": host, "SPOTORCH_SMTP_PORT": str(port),
                    "SPOTORCH_SMTP_FROM": SMTP_FROM, "SPOTORCH_EMAIL_TO": EMAIL_TO})
        for name, kind in env_targets(routes).items():
            env[name] = (f"{name.lower().replace('_', '-')}@localhost" if kind == "email"
                         else f"{self.webhook.url}/{kind}/{name}")
        return env


def read_alerts(path: Path) -> list[dict[str, Any]]:
    """Every delivery recorded so far (an unreadable line is skipped)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
