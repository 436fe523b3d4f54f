"""The alert table (tpuwatch.policy.alerts): every row, the disruption kinds, and the keys."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpuwatch.config import ALERT_KINDS
from tpuwatch.policy import alerts

T = datetime(2026, 11, 24, 1, 0, tzinfo=timezone.utc)
WHERE = alerts.Where("llm", "llm-pod", "us-central2-b")

# (journal event kind, reason, data) -> alert kind (None: no alert), as Journal.record writes them
CASES = [
    ("fail", "no progress in 3 attempts (exit code 1)", {"kind": "fail"}, "failed"),
    ("needs_person", "node llm-pod was deleted by someone else", {}, "needs_person"),
    ("attempt_end", "attempt 2: ended by a disruption (node state PREEMPTED at t)",
     {"attempt": 2, "outcome": "disruption"}, "disruption"),
    ("attempt_end", "attempt 2: worker 0 exit code 139", {"attempt": 2, "outcome": "failure"}, None),
    ("attempt_end", "attempt 5: worker 0 exited 0", {"attempt": 5, "outcome": "success"}, None),
    ("wait", "node llm-pod exists in us-central2-b (id 9, READY)", {"reason": "node created"}, "recreated"),
    ("wait", "node REPAIRING", {"reason": "node REPAIRING"}, None),
    ("launch", "launching attempt 3", {"attempt": 3, "checkpoint": {"step": 60}}, "resumed"),
    ("launch", "launching attempt 1", {"attempt": 1, "checkpoint": None}, None),
    ("done", "attempt 5: worker 0 exited 0", {}, "done"),
    ("status", "attempt 1 running", {"row": "running"}, None),
    ("delete", "node PREEMPTED", {}, None),
]


@pytest.mark.parametrize(("kind", "reason", "data", "expected"), CASES)
def test_each_journal_event_makes_its_alert(kind: str, reason: str, data: dict[str, object],
                                            expected: str | None) -> None:
    alert = alerts.from_event(WHERE, 7, kind, T, reason, data)
    assert (alert.kind if alert else None) == expected
    if alert is not None:
        assert alert.text.startswith("tpuwatch llm (node llm-pod, us-central2-b): ")
        assert "\n" not in alert.text
        assert alert.key == alerts.from_event(WHERE, 7, kind, T, reason, data).key  # type: ignore[union-attr]


def test_every_rule_makes_a_configurable_kind_and_every_kind_has_a_source() -> None:
    made = {r.alert for r in alerts.RULES} | {"maintenance"}  # maintenance: from the node's notice
    assert made == set(ALERT_KINDS)
    assert {c[3] for c in CASES if c[3]} == {r.alert for r in alerts.RULES}


@pytest.mark.parametrize(("reason", "kind"), [
    ("attempt 1: the attempt ended, ended by a disruption (node state PREEMPTED at x)", "preemption"),
    ("attempt 1: the attempt ended, ended by a disruption (node state REPAIRING at x)", "maintenance"),
    ("attempt 1: ended by a disruption (scheduled maintenance ONGOING)", "maintenance"),
    ("attempt 1: ended by a disruption (audit tpu.nodes.terminate on worker 0 (x))", "terminated"),
    ("attempt 1: ended by a disruption (audit tpu.nodes.restart)", "restart"),
    ("attempt 1: ended by a disruption (node missing)", "node_missing"),
    ("attempt 1: ended by a disruption (node id changed from 1 to 2)", "node_replaced"),
    ("attempt 1: ended by a disruption (symptom EXECUTE_TIMED_OUT on worker 1)", "symptom"),
    ("attempt 1: ended by a disruption (environment check disk failed on worker 0)", "environment"),
    ("attempt 1: ended by a disruption (node health TIMEOUT)", "unhealthy"),
    ("attempt 1: ended by a disruption (something new)", "other"),
])
def test_disruption_kinds(reason: str, kind: str) -> None:
    assert alerts.disruption_kind(reason) == kind


def test_keys_differ_by_event_kind_and_journal() -> None:
    a = alerts.key_for("llm", 7, "done", T)
    assert a != alerts.key_for("llm", 8, "done", T)
    assert a != alerts.key_for("llm", 7, "failed", T)
    # a journal started again reuses event ids; its events are newer
    assert a != alerts.key_for("llm", 7, "done", T.replace(hour=2))
