"""Alerts ([[notify]]): journaled before they are sent, sent once, in the background, never
holding a tick up; retried through failures, hangs and 429s; never showing the URL.

The real Journal (SQLite in tmp) and real HTTP: a local webhook (tests/webhook_server.py,
stdlib http.server on 127.0.0.1). The events are the ones a tick journals (`Journal.add_event`
with the kinds and data `Journal.record` writes), so no tick is needed here; the end-to-end
tests in test_notify_e2e.py run the real CLI against the simulator.
"""

from __future__ import annotations

import json
import urllib.parse
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from webhook_server import Hook

from tpuwatch import notify
from tpuwatch.journal import Journal
from tpuwatch.model import NodeSnapshot, UpcomingMaintenance
from tpuwatch.webhooks import Secret

KINDS = frozenset({"failed", "needs_person", "recreated", "disruption", "resumed", "done", "maintenance"})


def journal(tmp_path: Path) -> Journal:
    return Journal.open(tmp_path / "state", "pod", "pod")


def event(j: Journal, kind: str, reason: str, data: dict[str, Any] | None = None,
          time: datetime | None = None) -> None:
    with j.transaction():
        j.add_event(time or datetime.now(timezone.utc), kind, reason, data or {})


def target(hook: Hook, fmt: str = "json", on: frozenset[str] = KINDS, index: int = 0) -> notify.Target:
    return notify.Target(index, fmt, on, Secret(hook.url))


def notifier(j: Journal, *targets: notify.Target, timeout: float = 0.5) -> notify.Notifier:
    return notify.Notifier(j, targets, "pod", "pod", "us-central2-b", timeout=timeout, backoff=0.01)


def test_an_alert_is_journaled_before_it_is_sent_and_sent_once(tmp_path: Path) -> None:
    with Hook(plan=["hang"]) as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook))
        event(j, "fail", "attempt 3: exit code 1 three times in a row")
        assert n.after_tick(None) == 1
        n.start()
        assert hook.held.wait(30), "the sender never tried"
        # While the first request hangs, the delivery is already in the journal, unsent.
        rows = j.deliveries()
        assert len(rows) == 1 and rows[0].sent is None and rows[0].kind == "failed"
        hook.release.set()
        assert n.flush(60)
        row = j.deliveries()[0]
        assert row.sent is not None and row.tries == 2, row  # the hung try timed out, the next was accepted
        # The same key on both tries: a receiver that saw the first can drop the second.
        assert [r["headers"]["Idempotency-Key"] for r in hook.requests] == [row.key, row.key]
        # Deriving again (the next tick, the next cron run) adds nothing and sends nothing.
        assert n.after_tick(None) == 0
        assert n.flush(60)
        n.close(5)
        assert len(hook.answered) == 1


def test_a_hanging_webhook_never_holds_up_a_tick(tmp_path: Path) -> None:
    with Hook(then="hang") as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook), timeout=30).start()
        event(j, "needs_person", "node pod was deleted by someone else")
        n.after_tick(None)
        assert hook.held.wait(30)
        # The sender is stuck inside the request (the hook has not let go); the ticks go on.
        event(j, "done", "attempt 4: worker 0 exited 0")
        assert n.after_tick(None) == 1
        assert not hook.release.is_set() and len(hook.requests) == 1
        assert [r.kind for r in j.deliveries(pending_only=True)] == ["needs_person", "done"]
        n.close(0.5)  # as check does after its tick, for a bounded time: the hook still holds the request
        assert any("still being sent after 0.5s" in w for w in n.take_warnings())
        assert len(j.deliveries(pending_only=True)) == 2  # left for the next run
        hook.release.set()


def test_429_retry_after_is_honoured_then_the_alert_is_sent(tmp_path: Path) -> None:
    with Hook(plan=[("429", 1)]) as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook)).start()
        event(j, "done", "attempt 1: worker 0 exited 0")
        n.after_tick(None)
        assert n.flush(60)
        assert len(hook.requests) == 2 and len(hook.answered) == 1
        # waited at least what the server asked for (a lower bound: load can only add to it)
        assert hook.requests[1]["time"] - hook.requests[0]["time"] >= 1.0
        assert j.deliveries()[0].sent is not None
        n.close(5)


def test_a_failing_webhook_is_retried_then_left_for_a_later_round(tmp_path: Path) -> None:
    with Hook(then=500) as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook)).start()
        event(j, "fail", "budget spent")
        n.after_tick(None)
        assert n.flush(60)
        n.close(5)
        assert len(hook.requests) == notify.TRIES_PER_ROUND
        row = j.deliveries()[0]
        assert row.sent is None and row.gave_up is None and row.next_try is not None and row.last_error == "HTTP 500"
        warnings = n.take_warnings()
        assert any("notify[0] (json)" in w and "HTTP 500" in w for w in warnings), warnings
        assert hook.token not in " ".join(warnings)


def test_a_refused_webhook_is_given_up_at_once(tmp_path: Path) -> None:
    with Hook(then=404) as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook)).start()
        event(j, "fail", "budget spent")
        n.after_tick(None)
        assert n.flush(60)
        n.close(5)
        assert len(hook.requests) == 1
        assert j.deliveries()[0].gave_up is not None
        assert any("given up" in w and "HTTP 404" in w for w in n.take_warnings())


def test_a_crash_before_sending_loses_nothing_and_the_next_start_sends_it_once(tmp_path: Path) -> None:
    with Hook() as hook:
        with journal(tmp_path) as j:
            n = notifier(j, target(hook))
            event(j, "attempt_end", "attempt 2: the attempt ended, ended by a disruption (node state PREEMPTED at x)",
                  {"attempt": 2, "outcome": "disruption", "charged": False})
            n.after_tick(None)  # journaled; the process dies before its sender runs
        assert hook.requests == []
        with journal(tmp_path) as j:  # the next watch or check
            n = notifier(j, target(hook)).start()
            assert n.after_tick(None) == 0  # nothing derived twice
            assert n.flush(60)
            n.close(5)
        assert len(hook.answered) == 1
        assert "preemption: attempt 2 ended by a disruption (node state PREEMPTED at x), not charged" in \
            hook.answered[0]["body"]["text"]


def test_a_new_notify_table_does_not_send_the_journal_s_history(tmp_path: Path) -> None:
    with Hook() as hook, journal(tmp_path) as j:
        event(j, "fail", "long ago")
        n = notifier(j, target(hook))
        assert n.after_tick(None) == 0
        event(j, "done", "now")
        assert n.after_tick(None) == 1


def test_only_the_kinds_a_target_asks_for_reach_it(tmp_path: Path) -> None:
    with Hook() as a, Hook() as b, journal(tmp_path) as j:
        n = notifier(j, target(a, on=frozenset({"done"}), index=0), target(b, on=frozenset({"resumed"}), index=1))
        event(j, "launch", "launching attempt 2", {"attempt": 2, "checkpoint": {"step": 40, "path": "/c/40"}})
        event(j, "launch", "launching attempt 1", {"attempt": 1, "checkpoint": None})  # a first launch: no alert
        event(j, "done", "attempt 2: worker 0 exited 0")
        assert n.after_tick(None) == 2
        n.start()
        assert n.flush(60)
        n.close(5)
        assert [r["body"]["kind"] for r in a.answered] == ["done"]
        assert [r["body"]["kind"] for r in b.answered] == ["resumed"]
        assert "resuming: launching attempt 2 from checkpoint step 40" in b.answered[0]["body"]["text"]


@pytest.mark.parametrize("fmt", ["slack", "chat", "json"])
def test_each_format_sends_one_line_naming_job_node_and_zone(tmp_path: Path, fmt: str) -> None:
    with Hook() as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook, fmt)).start()
        event(j, "needs_person", "node pod is not tpuwatch's to delete (no tpuwatch-job label)")
        n.after_tick(None)
        assert n.flush(60)
        n.close(5)
        (req,) = hook.answered
        body = req["body"]
        text = body["text"]
        assert "\n" not in text and "pod" in text and "us-central2-b" in text and "needs a person" in text
        key = j.deliveries()[0].key
        if fmt in ("slack", "chat"):
            assert set(body) == {"text"}  # what Slack and Google Chat incoming webhooks take
        else:
            assert body["id"] == key and body["kind"] == "needs_person" and body["job"] == "pod"
            assert body["zone"] == "us-central2-b" and body["node"] == "pod"
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(req["path"]).query))
        # Google Chat creates one message per requestId, whatever the retries
        assert query == ({"requestId": key} if fmt == "chat" else {})


def test_maintenance_notices_alert_once_per_status(tmp_path: Path) -> None:
    start = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)

    def report(status: str) -> Any:
        um = UpcomingMaintenance("SCHEDULED", status, True, start, start + timedelta(hours=2), None)
        node = NodeSnapshot("pod", "p", "us-central2-b", "123", None, "READY", "HEALTHY", "", None,
                            upcoming_maintenance=um)
        return SimpleNamespace(node=node, memory=SimpleNamespace(zone="us-central2-b"))

    with Hook() as hook, journal(tmp_path) as j:
        n = notifier(j, target(hook, on=frozenset({"maintenance"})))
        assert n.after_tick(report("PENDING")) == 1
        assert n.after_tick(report("PENDING")) == 0  # tick after tick: the same notice
        assert n.after_tick(report("ONGOING")) == 1
        texts = [r.text for r in j.deliveries()]
        assert "scheduled maintenance planned, window 2026-12-01T03:00Z to 2026-12-01T05:00Z" in texts[0]
        assert "under way" in texts[1]
        # what tpuwatch will do: start it early (PENDING, may be rescheduled), then wait for the node
        assert "tpuwatch starts it after the job's next checkpoint" in texts[0], texts[0]
        assert "tpuwatch waits for the node" in texts[1], texts[1]


def test_the_url_and_token_are_never_journaled_or_shown(tmp_path: Path) -> None:
    # a webhook that fails, one that refuses, and one whose port is closed (a connection error)
    with Hook(then=500) as failing, Hook(then=403) as refusing, journal(tmp_path) as j:
        closed = notify.Target(2, "slack", KINDS, Secret(f"http://127.0.0.1:9/x/{failing.token}closed"))
        n = notifier(j, target(failing), target(refusing, "chat", index=1), closed).start()
        event(j, "fail", "budget spent")
        n.after_tick(None)
        assert n.flush(60)
        n.close(5)
        warnings = " ".join(n.take_warnings())
        assert "notify[2] (slack)" in warnings, warnings
        rows = [json.dumps(r.__dict__, default=str) for r in j.deliveries()]
    blob = (tmp_path / "state" / "pod.db").read_bytes()
    for token in (failing.token, refusing.token):
        assert token.encode() not in blob and token not in warnings and token not in "".join(rows)
    assert b"127.0.0.1:%d" % failing.port not in blob
    assert repr(closed.url) == "Secret(<hidden>)"
