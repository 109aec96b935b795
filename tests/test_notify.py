"""The notifier against real local endpoints: a webhook receiver and an SMTP server."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from spotorch.adapters.gcp.notification_ledger import FirestoreNotificationLedger
from spotorch.adapters.memory.notification_ledger import InMemoryNotificationLedger
from spotorch.adapters.notify import channels as _notify_channels
from spotorch.adapters.notify.channels import SECRET_ENV, BrokenChannel, EnvChannels, channels_from_env
from spotorch.app.notify import (
    Delivery,
    DeliveryStatus,
    NotifyPolicy,
    handle_run_event,
    route_matches,
    selected_channels,
)
from spotorch.core.alert_ledger import Admission, Outcome
from spotorch.core.alerts import Alert, render_alert
from spotorch.core.errors import InvalidEvent
from spotorch.core.events import build_event, to_pubsub
from spotorch.core.pipeline import Route
from spotorch.entrypoints.alerts import handle_pubsub_cloudevent, reset_runtime
from spotorch.local.emulators import EmulatorSet
from spotorch.local.receivers import SmtpReceiver, WebhookReceiver
from spotorch.logs import mark_sensitive
from spotorch.logs import redact_secrets as redact
from spotorch.ports.alerts import Channel, NotificationLedger

T0 = 1_764_424_992.0
RUN = "r-20251129-1"
CHAT_SECRET = "key=AIzaSyFAKE&token=chat-token-0123456789"
SLACK_SECRET = "T0000/B0000/slack-secret-abcdef"
SMTP_USER, SMTP_PASSWORD = "spotorch", "smtp-password-42"
FAST = NotifyPolicy(max_attempts=3, backoff_s=0.0)

DATA: dict[str, dict[str, Any]] = {
    "run.created": {"status": "pending", "data_uri": "gs://b/d/", "snapshot_id": "d",
                    "deadline": None, "reason": "snapshot complete"},
    "attempt.preempted": {"attempt": 1, "capacity": "spot", "job_name": "jobs/1",
                          "progress_step": 120, "preemptions": 1},
    "run.failed": {"status": "failed", "reason": "user error budget exhausted",
                   "failure_class": "user_error", "attempts": 2, "preemptions": 1},
    "run.succeeded": {"status": "succeeded", "attempts": 3, "preemptions": 2,
                      "cost_estimate": 4.2, "model_uri": "gs://m/r"},
}


def event(kind: str, sequence: int = 1, run_id: str = RUN, **data: Any) -> dict[str, Any]:
    return build_event(run_id=run_id, pipeline="churn", sequence=sequence, kind=kind,
                       data={**DATA[kind], **data}, time=T0 + sequence)


def routes(*routes_: Route) -> Callable[[str], Sequence[Route]]:
    return lambda pipeline: routes_ if pipeline == "churn" else ()


ALL = routes(Route("chat", ("*",)), Route("slack", ("*",)), Route("email", ("*",)))


def by_channel(deliveries: list[Delivery]) -> dict[str, Delivery]:
    return {d.channel: d for d in deliveries}


@pytest.fixture
def web() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    with SmtpReceiver(starttls=True, auth=(SMTP_USER, SMTP_PASSWORD)) as receiver:
        yield receiver


@pytest.fixture
def env(web: WebhookReceiver, smtp: SmtpReceiver) -> dict[str, str]:
    host, port = smtp.address
    assert smtp.ca_file
    return {
        "SPOTORCH_CHAT_WEBHOOK_URL": f"{web.url}/chat?{CHAT_SECRET}",
        "SPOTORCH_SLACK_WEBHOOK_URL": f"{web.url}/slack/{SLACK_SECRET}",
        "SPOTORCH_SMTP_HOST": host, "SPOTORCH_SMTP_PORT": str(port),
        "SPOTORCH_SMTP_USER": SMTP_USER, "SPOTORCH_SMTP_PASSWORD": SMTP_PASSWORD,
        "SPOTORCH_SMTP_FROM": "spotorch <alerts@example.com>",
        "SPOTORCH_EMAIL_TO": "ml-team@example.com, oncall@example.com",
        "SPOTORCH_SMTP_CA_FILE": smtp.ca_file,
    }


@pytest.fixture
def channels(env: dict[str, str]) -> dict[str, Channel]:
    return channels_from_env(env)


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def ledger(request: pytest.FixtureRequest) -> NotificationLedger:
    if request.param == "memory":
        return InMemoryNotificationLedger()
    stack: EmulatorSet = request.getfixturevalue("firestore_emulator")
    return FirestoreNotificationLedger(project=stack.project)


def send(ev: dict[str, Any], *, ledger: NotificationLedger, channels: Any,
         routes_for: Callable[[str], Sequence[Route]] = ALL, now: float = T0,
         policy: NotifyPolicy = FAST) -> dict[str, Delivery]:
    return by_channel(handle_run_event(ev, routes_for=routes_for, ledger=ledger,
                                       channels=channels, now=now, policy=policy,
                                       sleep=lambda s: None))


def log_lines(out: str) -> list[dict[str, Any]]:
    """The notifier's structured log lines among captured stdout."""
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "spotorch.app.notify"]


# --- payloads on the wire ----------------------------------------------------------------------


def test_chat_gets_text_card_and_run_thread(web: WebhookReceiver,
                                            channels: dict[str, Channel]) -> None:
    out = send(event("run.failed", 3), ledger=InMemoryNotificationLedger(), channels=channels,
               routes_for=routes(Route("chat", ("run.failed",))))
    assert out["chat"].status is DeliveryStatus.SENT
    [post] = web.ok("/chat")
    assert post.headers["Content-Type"].startswith("application/json")
    # The webhook's own key/token stay; the run's thread goes in threadKey + reply option.
    assert post.query["key"] == ["AIzaSyFAKE"] and post.query["threadKey"] == [RUN]
    assert post.query["messageReplyOption"] == ["REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"]
    body = post.json()
    assert body["thread"] == {"threadKey": RUN}
    assert "Run failed: user error budget exhausted" in body["text"] and RUN in body["text"]
    card = body["cardsV2"][0]
    assert card["cardId"] == f"spotorch-{RUN}:3"
    assert card["card"]["header"]["title"] == "Run failed: user error budget exhausted"
    widgets = card["card"]["sections"][0]["widgets"]
    facts = {w["decoratedText"]["topLabel"]: w["decoratedText"]["text"]
             for w in widgets if "decoratedText" in w}
    assert facts["failure_class"] == "user_error" and facts["attempts"] == "2"


def test_slack_gets_blocks_grouped_by_run(web: WebhookReceiver,
                                          channels: dict[str, Channel]) -> None:
    send(event("attempt.preempted", 2), ledger=InMemoryNotificationLedger(), channels=channels,
         routes_for=routes(Route("slack", ("attempt.*",))))
    [post] = web.ok(f"/slack/{SLACK_SECRET}")
    body = post.json()
    assert body["text"].startswith(f"[churn/{RUN}] ")
    assert "Attempt 1 preempted at step 120" in body["text"]
    types_ = [b["type"] for b in body["blocks"]]
    assert types_ == ["section", "section", "context"]
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert "*capacity*\nspot" in fields


def test_email_is_multipart_threaded_per_run_over_starttls(
        smtp: SmtpReceiver, channels: dict[str, Channel]) -> None:
    ledger = InMemoryNotificationLedger()
    email_only = routes(Route("email", ("*",)))
    send(event("run.created", 1), ledger=ledger, channels=channels, routes_for=email_only)
    send(event("run.failed", 2), ledger=ledger, channels=channels, routes_for=email_only)
    send(event("run.created", 1, run_id="r-other"), ledger=ledger, channels=channels,
         routes_for=email_only)
    assert smtp.wait_for(3)
    first, second, other = smtp.received
    assert first.tls and first.login == SMTP_USER
    assert first.rcpt_tos == ("ml-team@example.com", "oncall@example.com")
    assert second.message["X-Spotorch-Event-Type"] == "dev.spotorch.run.failed.v1"
    assert smtp.messages[1]["X-Spotorch-Event-Id"] == f"{RUN}:2"
    root = "<spotorch.run.r-20251129-1@example.com>"
    assert first.message["Message-ID"] == root and first.message["In-Reply-To"] is None
    assert second.message["In-Reply-To"] == root and second.message["References"] == root
    assert second.message["Message-ID"] != root
    assert first.message["Subject"] == second.message["Subject"] == f"[spotorch] churn: run {RUN}"
    assert other.message["Message-ID"] == "<spotorch.run.r-other@example.com>"
    msg = second.message
    assert msg.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in msg.iter_parts()] == ["text/plain", "text/html"]
    plain = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "Run failed: user error budget exhausted" in plain and "user_error" in plain
    assert "<table" in html and "user_error" in html
    assert msg["Auto-Submitted"] == "auto-generated"


def test_email_without_starttls_offered(web: WebhookReceiver) -> None:
    with SmtpReceiver() as plain:
        host, port = plain.address
        env = {"SPOTORCH_SMTP_HOST": host, "SPOTORCH_SMTP_PORT": str(port),
               "SPOTORCH_SMTP_FROM": "a@example.com", "SPOTORCH_EMAIL_TO": "b@example.com"}
        email_only = routes(Route("email", ("*",)))
        out = send(event("run.failed"), ledger=InMemoryNotificationLedger(),
                   channels=channels_from_env(env), routes_for=email_only)
        assert out["email"].status is DeliveryStatus.SENT and not plain.received[0].tls
        # Demanding TLS (or a login, which needs TLS) from a server without STARTTLS fails for good.
        for extra in ({"SPOTORCH_SMTP_STARTTLS": "require"},
                      {"SPOTORCH_SMTP_USER": "u", "SPOTORCH_SMTP_PASSWORD": "pw-123456"}):
            out = send(event("run.failed", 2), ledger=InMemoryNotificationLedger(),
                       channels=channels_from_env({**env, **extra}), routes_for=email_only)
            assert out["email"].status is DeliveryStatus.FAILED and out["email"].attempts == 1
        assert len(plain.messages) == 1


def test_smtp_temporary_refusal_is_retried_permanent_is_not(
        smtp: SmtpReceiver, channels: dict[str, Channel]) -> None:
    email_only = routes(Route("email", ("*",)))
    smtp.fail_next(1, 451)
    out = send(event("run.failed", 1), ledger=InMemoryNotificationLedger(), channels=channels,
               routes_for=email_only)
    assert (out["email"].status, out["email"].attempts) == (DeliveryStatus.SENT, 2)
    smtp.fail_next(1, 550)
    out = send(event("run.failed", 2), ledger=InMemoryNotificationLedger(), channels=channels,
               routes_for=email_only)
    assert (out["email"].status, out["email"].attempts) == (DeliveryStatus.FAILED, 1)
    assert "550" in out["email"].detail and len(smtp.messages) == 1


# --- failures ----------------------------------------------------------------------------------


def test_failing_webhook_blocks_nothing_is_retried_bounded_and_logged_without_secrets(
        web: WebhookReceiver, smtp: SmtpReceiver, channels: dict[str, Channel],
        capsys: pytest.CaptureFixture[str]) -> None:
    ledger = InMemoryNotificationLedger()
    chat_and_email = routes(Route("chat", ("*",)), Route("email", ("*",)))
    web.fail_next(100)
    out = send(event("run.failed", 5), ledger=ledger, channels=channels,
               routes_for=chat_and_email)
    assert out["email"].status is DeliveryStatus.SENT and smtp.wait_for(1)
    chat = out["chat"]
    assert (chat.status, chat.attempts) == (DeliveryStatus.FAILED, FAST.max_attempts)
    assert "HTTP 500" in chat.detail
    posts = web.received
    assert len(posts) == FAST.max_attempts and {p.status for p in posts} == {500}
    printed = capsys.readouterr().out
    errors = [line for line in log_lines(printed) if line["severity"] == "ERROR"]
    assert errors and errors[0]["channel"] == "chat" and errors[0]["attempts"] == 3
    assert errors[0]["run_id"] == RUN and "HTTP 500" in errors[0]["message"]
    assert "chat-token" not in printed and "AIzaSyFAKE" not in printed
    assert SMTP_PASSWORD not in printed and SLACK_SECRET not in printed
    record = ledger.record(f"{RUN}:5", "chat")
    assert record and record["state"] == Outcome.FAILED and "chat-token" not in record["detail"]
    # A redelivery retries only the failed channel, once it works again.
    web.fail_next(0)
    again = send(event("run.failed", 5), ledger=ledger, channels=channels,
                 routes_for=chat_and_email)
    assert again["chat"].status is DeliveryStatus.SENT
    assert again["email"].status is DeliveryStatus.DUPLICATE
    assert len(web.ok("/chat")) == 1 and len(smtp.messages) == 1


def test_client_errors_are_not_retried(web: WebhookReceiver,
                                       channels: dict[str, Channel]) -> None:
    web.fail_next(1, 404)
    out = send(event("run.failed"), ledger=InMemoryNotificationLedger(), channels=channels,
               routes_for=routes(Route("chat", ("*",))))
    assert (out["chat"].status, out["chat"].attempts) == (DeliveryStatus.FAILED, 1)
    web.fail_next(1, 429)  # rate limited by Google: worth another try
    out = send(event("run.failed", 2), ledger=InMemoryNotificationLedger(), channels=channels,
               routes_for=routes(Route("chat", ("*",))))
    assert (out["chat"].status, out["chat"].attempts) == (DeliveryStatus.SENT, 2)


def test_unreachable_webhook_and_a_buggy_channel_fail_alone(
        smtp: SmtpReceiver, channels: dict[str, Channel]) -> None:
    from spotorch.local.emulators import free_port

    class Buggy:
        def send(self, alert: Alert) -> None:
            raise KeyError("oops")

    broken = {**channels, "chat": channels_from_env(
        {"SPOTORCH_CHAT_WEBHOOK_URL": f"http://127.0.0.1:{free_port()}/x"})["chat"],
        "slack": Buggy()}
    out = send(event("run.failed"), ledger=InMemoryNotificationLedger(), channels=broken)
    assert out["chat"].status is DeliveryStatus.FAILED and "cannot reach" in out["chat"].detail
    assert out["slack"].status is DeliveryStatus.FAILED and "KeyError" in out["slack"].detail
    assert out["email"].status is DeliveryStatus.SENT and len(smtp.messages) == 1


def test_redact_hides_webhook_paths_and_known_secrets() -> None:
    mark_sensitive("pw-redact-test")
    text = redact("POST https://chat.googleapis.com/v1/spaces/AAA/messages?key=K&token=T failed;"
                  " password pw-redact-test")
    assert text == "POST https://chat.googleapis.com/*** failed; password ***"


# --- dedupe and rate limit (both ledgers) ------------------------------------------------------


def test_redelivered_event_sends_each_alert_once(ledger: NotificationLedger, web: WebhookReceiver,
                                                 smtp: SmtpReceiver,
                                                 channels: dict[str, Channel]) -> None:
    first = send(event("run.succeeded", 9), ledger=ledger, channels=channels)
    assert {d.status for d in first.values()} == {DeliveryStatus.SENT}
    second = send(event("run.succeeded", 9), ledger=ledger, channels=channels, now=T0 + 30)
    assert {d.status for d in second.values()} == {DeliveryStatus.DUPLICATE}
    assert len(web.ok()) == 2 and smtp.wait_for(1) and len(smtp.messages) == 1


def test_concurrent_deliveries_of_one_event_send_once(ledger: NotificationLedger,
                                                      web: WebhookReceiver) -> None:
    chat = channels_from_env({"SPOTORCH_CHAT_WEBHOOK_URL": f"{web.url}/chat"})
    barrier = threading.Barrier(2)
    results: list[Delivery] = []

    def deliver() -> None:
        barrier.wait()
        results.extend(handle_run_event(event("run.failed", 4), routes_for=routes(
            Route("chat", ("*",))), ledger=ledger, channels=chat, now=T0, policy=FAST))

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(d.status.value for d in results) == ["duplicate", "sent"]
    assert len(web.ok("/chat")) == 1


def test_rate_limit_holds_back_and_summarizes(ledger: NotificationLedger,
                                              web: WebhookReceiver) -> None:
    slack = channels_from_env({"SPOTORCH_SLACK_WEBHOOK_URL": f"{web.url}/slack"})
    policy = NotifyPolicy(max_alerts_per_window=2, window_s=600, max_attempts=1)
    only_slack = routes(Route("slack", ("*",)))
    statuses = [send(event("attempt.preempted", seq, preemptions=seq), ledger=ledger,
                     channels=slack, routes_for=only_slack, now=T0 + seq, policy=policy)
                ["slack"].status for seq in range(1, 6)]
    assert statuses == [DeliveryStatus.SENT] * 2 + [DeliveryStatus.HELD] * 3
    # Terminal events always go out, and carry the summary of what was held back.
    done = send(event("run.failed", 6), ledger=ledger, channels=slack, routes_for=only_slack,
                now=T0 + 6, policy=policy)["slack"]
    assert (done.status, done.held_summarized) == (DeliveryStatus.SENT, 3)
    last = web.ok("/slack")[-1].json()
    assert "3 earlier alert(s) held back by the rate limit: 3 x attempt.preempted" in \
        json.dumps(last)
    # A held event redelivered is still a duplicate (not counted twice)...
    again = send(event("attempt.preempted", 4), ledger=ledger, channels=slack,
                 routes_for=only_slack, now=T0 + 7, policy=policy)["slack"]
    assert again.status is DeliveryStatus.DUPLICATE
    # ...and a new window lets ordinary alerts through again, with no stale summary.
    later = send(event("attempt.preempted", 7), ledger=ledger, channels=slack,
                 routes_for=only_slack, now=T0 + 700, policy=policy)["slack"]
    assert (later.status, later.held_summarized) == (DeliveryStatus.SENT, 0)
    assert len(web.ok("/slack")) == 4


def test_ledger_contract(ledger: NotificationLedger) -> None:
    assert ledger.claim("r:1", "chat", "r", T0)
    assert not ledger.claim("r:1", "chat", "r", T0 + 1)  # in flight
    assert ledger.claim("r:1", "email", "r", T0)  # other channel, own record
    ledger.finish("r:1", "chat", Outcome.SENT, T0 + 1, "", 1)
    assert not ledger.claim("r:1", "chat", "r", T0 + 10_000)  # sent stays sent
    ledger.finish("r:1", "email", Outcome.FAILED, T0 + 1, "HTTP 500", 3)
    assert ledger.claim("r:1", "email", "r", T0 + 2)  # failed may be retried...
    assert not ledger.claim("r:1", "email", "r", T0 + 3)  # ...by one taker
    # A claim whose sender died (older than the lease) can be taken over.
    assert ledger.claim("r:2", "chat", "r", T0)
    assert not ledger.claim("r:2", "chat", "r", T0 + 60)
    assert ledger.claim("r:2", "chat", "r", T0 + 901)
    # Ids with characters Firestore forbids in document ids.
    assert ledger.claim("runs/a b:1", "slack:sm://projects/p/secrets/s", "runs/a b", T0)
    assert not ledger.claim("runs/a b:1", "slack:sm://projects/p/secrets/s", "runs/a b", T0)

    def admit(kind: str, now: float, always: bool = False) -> Admission:
        return ledger.admit("r", "chat", kind, now, limit=2, window_s=100, always=always)

    a1, a2 = admit("run.created", T0), admit("attempt.launched", T0 + 1)
    assert (a1.allowed, a1.first, a2.allowed, a2.first) == (True, True, True, False)
    assert not admit("attempt.preempted", T0 + 2).allowed
    assert not admit("attempt.preempted", T0 + 3).allowed
    assert not admit("attempt.launched", T0 + 4).allowed
    done = admit("run.failed", T0 + 5, always=True)
    assert done.allowed and dict(done.held) == {"attempt.preempted": 2, "attempt.launched": 1}
    assert not admit("attempt.launched", T0 + 6).allowed  # the window is still full
    fresh = admit("attempt.launched", T0 + 101)
    assert fresh.allowed and dict(fresh.held) == {"attempt.launched": 1}
    assert ledger.admit("r", "email", "run.created", T0, limit=2, window_s=100).first


# --- routes and configuration ------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "kind", "matches"), [
    ("*", "attempt.launched", True),
    ("run.failed", "run.failed", True),
    ("failed", "run.failed", True),
    ("run.*", "run.deadline_at_risk", True),
    ("*.preempted", "attempt.preempted", True),
    ("dev.spotorch.run.failed.v1", "run.failed", True),
    ("run.failed", "run.cancelled", False),
    ("ailed", "run.failed", False),
    ("run.*", "attempt.ended", False),
])
def test_route_patterns(pattern: str, kind: str, matches: bool) -> None:
    assert route_matches(pattern, kind) is matches


def test_selected_channels_once_each_in_route_order() -> None:
    rs = (Route("slack", ("run.*",)), Route("chat", ("*",)), Route("slack", ("failed",)),
          Route("slack", ("*",), target="SPOTORCH_SLACK_WEBHOOK_ML"),
          Route("email", ("succeeded",)))
    assert selected_channels(rs, "run.failed") == ["slack", "chat",
                                                   "slack:SPOTORCH_SLACK_WEBHOOK_ML"]
    assert selected_channels((), "run.failed") == []


def test_unrouted_and_unconfigured_channels(web: WebhookReceiver) -> None:
    ledger = InMemoryNotificationLedger()
    out = handle_run_event(event("run.failed"), routes_for=routes(), ledger=ledger,
                           channels={}, now=T0)
    assert out == []
    out = handle_run_event(event("run.failed"), routes_for=routes(Route("teams", ("*",)),
                           Route("email", ("*",))), ledger=ledger, channels={}, now=T0)
    assert {d.status for d in out} == {DeliveryStatus.UNCONFIGURED}


def test_route_target_names_the_env_var_with_the_destination(web: WebhookReceiver) -> None:
    env = {"SPOTORCH_SLACK_WEBHOOK_URL": f"{web.url}/slack-default",
           "SPOTORCH_SLACK_WEBHOOK_ML": f"{web.url}/slack-ml"}
    rs = routes(Route("slack", ("*",), target="SPOTORCH_SLACK_WEBHOOK_ML"),
                Route("slack", ("*",), target=f"{web.url}/literal"),
                Route("chat", ("*",), target="SPOTORCH_UNSET_VAR"))
    out = send(event("run.failed"), ledger=InMemoryNotificationLedger(),
               channels=EnvChannels(env), routes_for=rs)
    assert out["slack:SPOTORCH_SLACK_WEBHOOK_ML"].status is DeliveryStatus.SENT
    assert [p.path for p in web.ok()] == ["/slack-ml"]
    literal = out[f"slack:{web.url}/literal"]
    assert literal.status is DeliveryStatus.FAILED and "environment variable" in literal.detail
    unset = out["chat:SPOTORCH_UNSET_VAR"]
    assert unset.status is DeliveryStatus.FAILED and "not set" in unset.detail


def test_secret_manager_route_targets(web: WebhookReceiver,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_notify_channels, "secret_reader", lambda name: f"{web.url}/{name}")
    rs = routes(Route("chat", ("*",), target="projects/p/secrets/team-chat"),
                Route("slack", ("*",), target="sm://projects/p/secrets/team-slack/versions/3"))
    out = send(event("run.failed"), ledger=InMemoryNotificationLedger(), channels=EnvChannels({}),
               routes_for=rs)
    assert {d.status for d in out.values()} == {DeliveryStatus.SENT}
    assert sorted(p.path for p in web.ok()) == ["/projects/p/secrets/team-chat/versions/latest",
                                                "/projects/p/secrets/team-slack/versions/3"]


def test_every_kind_renders_a_readable_headline() -> None:
    from test_events import SAMPLES, sample

    for kind in SAMPLES:
        alert = render_alert(sample(kind))
        assert alert.kind == kind and alert.headline and "?" not in alert.headline, alert
        assert alert.type == f"dev.spotorch.{kind}.v1"
    assert render_alert({"type": "dev.spotorch.run.failed.v1", "data": {}}).headline \
        == "Run failed"
    assert render_alert({"type": 3, "data": "junk"}).headline == "Event 3"


def test_email_route_target_picks_recipients(smtp: SmtpReceiver, env: dict[str, str]) -> None:
    out = send(event("run.failed"), ledger=InMemoryNotificationLedger(),
               channels=EnvChannels({**env, "SPOTORCH_EMAIL_TO_ML": "ml@example.com"}),
               routes_for=routes(Route("email", ("*",), target="SPOTORCH_EMAIL_TO_ML")))
    assert out["email:SPOTORCH_EMAIL_TO_ML"].status is DeliveryStatus.SENT
    assert smtp.received[0].rcpt_tos == ("ml@example.com",)


def test_policy_from_env() -> None:
    assert NotifyPolicy.from_env({"SPOTORCH_ALERT_MAX_PER_WINDOW": "9",
                                  "SPOTORCH_ALERT_WINDOW_S": "60"}).max_alerts_per_window == 9
    assert NotifyPolicy.from_env({"SPOTORCH_ALERT_MAX_PER_WINDOW": "lots"}) == NotifyPolicy()


def test_channels_from_env_and_secret_env_names() -> None:
    assert SECRET_ENV == ("SPOTORCH_CHAT_WEBHOOK_URL", "SPOTORCH_SLACK_WEBHOOK_URL",
                          "SPOTORCH_SMTP_HOST", "SPOTORCH_SMTP_PORT", "SPOTORCH_SMTP_USER",
                          "SPOTORCH_SMTP_PASSWORD", "SPOTORCH_SMTP_FROM", "SPOTORCH_EMAIL_TO")
    assert channels_from_env({}) == {}
    broken = channels_from_env({"SPOTORCH_SMTP_HOST": "smtp.example.com",
                                "SPOTORCH_SMTP_PORT": "submission"})["email"]
    assert isinstance(broken, BrokenChannel)
    for needle in ("SPOTORCH_SMTP_FROM", "SPOTORCH_EMAIL_TO", "SPOTORCH_SMTP_PORT"):
        assert needle in broken.problem
    # repr never shows a secret value
    chat = channels_from_env({"SPOTORCH_CHAT_WEBHOOK_URL": "https://x/y?token=supersecret"})
    assert "supersecret" not in repr(chat)


def test_secret_manager_references(web: WebhookReceiver, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    ref = "sm://projects/p/secrets/chat-webhook"
    env = {"SPOTORCH_CHAT_WEBHOOK_URL": ref}
    chat_only = routes(Route("chat", ("*",)))
    # Without google-cloud-secret-manager the failure is clear and recorded, never raised.
    out = send(event("run.failed", 1), ledger=InMemoryNotificationLedger(),
               channels=channels_from_env(env), routes_for=chat_only)
    assert out["chat"].status is DeliveryStatus.FAILED
    assert "google-cloud-secret-manager" in out["chat"].detail and out["chat"].attempts == 1
    asked: list[str] = []
    secret_url = f"{web.url}/chat-from-sm?token=sm-token-987654"
    def reader(name: str) -> str:
        asked.append(name)
        return secret_url

    monkeypatch.setattr(_notify_channels, "secret_reader", reader)
    out = send(event("run.failed", 2), ledger=InMemoryNotificationLedger(),
               channels=channels_from_env(env), routes_for=chat_only)
    assert out["chat"].status is DeliveryStatus.SENT
    assert asked == ["projects/p/secrets/chat-webhook/versions/latest"]
    assert [p.path for p in web.ok()] == ["/chat-from-sm"]
    assert redact(f"oops {secret_url}") == "oops ***"  # resolved secrets are known values
    assert "sm-token" not in capsys.readouterr().out


# --- the Pub/Sub entry -------------------------------------------------------------------------


def pubsub_cloudevent(payload: bytes | str, message_id: str = "m-1") -> CloudEvent:
    data = payload if isinstance(payload, str) else base64.b64encode(payload).decode()
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                       "source": "//pubsub.googleapis.com/projects/p/topics/spotorch-events",
                       "id": message_id},
                      {"message": {"data": data, "messageId": message_id,
                                   "attributes": {"type": "x"}},
                       "subscription": "projects/p/subscriptions/notifier"})


def test_handle_pubsub_cloudevent_sends(web: WebhookReceiver,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    chat = channels_from_env({"SPOTORCH_CHAT_WEBHOOK_URL": f"{web.url}/chat"})
    ledger = InMemoryNotificationLedger()
    data, _, _ = to_pubsub(event("run.failed", 8))
    out = handle_pubsub_cloudevent(pubsub_cloudevent(data), routes_for=routes(
        Route("chat", ("*",))), ledger=ledger, channels=chat, now=T0)
    assert [(d.event_id, d.status) for d in out] == [(f"{RUN}:8", DeliveryStatus.SENT)]
    # Data that does not match its schema still alerts (and says so in the log).
    odd, _, _ = to_pubsub(event("run.failed", 9, attempts="two"))
    out = handle_pubsub_cloudevent(pubsub_cloudevent(odd), routes_for=routes(
        Route("chat", ("*",))), ledger=ledger, channels=chat, now=T0)
    assert out[0].status is DeliveryStatus.SENT
    assert any("does not match its schema" in line["message"]
               for line in log_lines(capsys.readouterr().out))


@pytest.mark.parametrize("payload", [
    "not base64!!",
    base64.b64encode(b"not json").decode(),
    base64.b64encode(b'{"id": "x", "type": "com.example.other.v1", "data": {}}').decode(),
    base64.b64encode(json.dumps({**event("run.failed"), "data": {"pipeline": "churn"}}).encode())
    .decode(),
    base64.b64encode(json.dumps({**event("run.failed"), "specversion": "0.3"}).encode()).decode(),
])
def test_malformed_messages_raise_invalid_event(payload: str) -> None:
    with pytest.raises(InvalidEvent):
        handle_pubsub_cloudevent(pubsub_cloudevent(payload), routes_for=routes(),
                                 ledger=InMemoryNotificationLedger(), channels={}, now=T0)
    with pytest.raises(InvalidEvent):
        handle_pubsub_cloudevent(CloudEvent({"type": "t", "source": "s"}, {"nothing": 1}),
                                 routes_for=routes(), ledger=InMemoryNotificationLedger(),
                                 channels={}, now=T0)


def test_handle_pubsub_cloudevent_builds_everything_from_env(
        web: WebhookReceiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Routes come from the pipeline files at $SPOTORCH_PIPELINES, channels from env."""
    from spotorch.spec.compiled import clear_cache as clear_pipeline_cache

    demo = (Path(__file__).resolve().parent.parent / "examples/pipelines/demo.yaml").read_text()
    (tmp_path / "churn.yaml").write_text(
        demo.replace("name: demo", "name: churn").split("routes:")[0]
        + 'routes:\n  - channel: chat\n    events: ["run.*"]\n')
    clear_pipeline_cache()
    monkeypatch.setenv("SPOTORCH_PIPELINES", str(tmp_path))
    monkeypatch.setenv("SPOTORCH_CHAT_WEBHOOK_URL", f"{web.url}/chat")
    monkeypatch.setenv("SPOTORCH_NOTIFY_LEDGER", "memory")
    reset_runtime()
    try:
        data, _, _ = to_pubsub(event("run.failed", 3))
        first = handle_pubsub_cloudevent(pubsub_cloudevent(data))
        second = handle_pubsub_cloudevent(pubsub_cloudevent(data, "m-2"))  # redelivered
        other, _, _ = to_pubsub(build_event(run_id="x1", pipeline="unknown", sequence=1,
                                            kind="run.cancelled",
                                            data={"status": "cancelled", "reason": "op"},
                                            time=T0))
        assert handle_pubsub_cloudevent(pubsub_cloudevent(other)) == []
    finally:
        reset_runtime()
    assert [d.status for d in first] == [DeliveryStatus.SENT]
    assert [d.status for d in second] == [DeliveryStatus.DUPLICATE]
    assert len(web.ok("/chat")) == 1


def test_loading_the_notifier_does_not_import_the_pipeline_format() -> None:
    """A cold notifier instance loads functions/main.py and spotorch.app.notify without pydantic (the
    pipeline format); the pipeline files are parsed at the first event's route lookup."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = ("import sys, importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('main', {str(root / 'functions/main.py')!r})\n"
            "main = importlib.util.module_from_spec(spec); spec.loader.exec_module(main)\n"
            "import spotorch.app.notify\n"
            "print(sorted(m for m in ('pydantic', 'yaml', 'spotorch.core.pipeline', 'spotorch.spec.loader')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
