"""The alert table (tpuwatch.policy.alerts): every row, the disruption kinds, and the keys."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from policy_support import CFG, at, ckpt, kinds, node, obs, run_mem, running, tick

from tpuwatch.config import ALERT_KINDS
from tpuwatch.model import Checkpoint
from tpuwatch.policy import Attempt, Memory, Phase, alerts

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
    ("wait", "node vm is a Spot VM stopping ...; vm has been stopping for 5m00s, longer than Google's stop takes",
     {"reason": "a Spot VM stopping for long"}, "stopping_long"),
    ("wait", "node vm is a Spot VM stopping ...", {"reason": "a Spot VM stopping"}, None),
    ("wait", "the job moved off old, and the stop there failed ...",
     {"reason": "the stop owed on a node the job moved off"}, "stop_failed"),
    ("launch", "launching attempt 3", {"attempt": 3, "checkpoint": {"step": 60}}, "resumed"),
    ("launch", "launching attempt 1", {"attempt": 1, "checkpoint": None}, None),
    ("done", "attempt 5: worker 0 exited 0", {}, "done"),
    ("status", "attempt 1 running", {"row": "running"}, None),
    ("delete", "node PREEMPTED", {}, None),
    ("checkpoint_stale", "attempt 3 has run 3h00m without a new complete checkpoint (still step 100)",
     {"attempt": 3}, "checkpoint_stale"),
    ("slices", "slice(s) lost (np-1 REPAIRING): limping on 3 of 4 slices", {"out": ["np-1"], "in_use": 3, "of": 4},
     "slices"),
    ("slices", "np-1 READY+HEALTHY again: growing back onto all 4 slices", {"out": [], "in_use": 4, "of": 4},
     "slices"),
]


def test_a_grow_back_is_said_as_what_it_is_not_as_a_fault() -> None:
    reason = ("attempt 2: worker 0 no exit code, ended by a disruption (stopped by tpuwatch to grow back onto np-1 "
              "(checkpoint step 70) at 2026-11-29T06:32:21+00:00)")
    assert alerts.disruption_kind(reason) == "grow"
    alert = alerts.from_event(WHERE, 9, "attempt_end", T, reason, {"attempt": 2, "outcome": "disruption"})
    assert alert is not None and alert.text.endswith(
        "grow: attempt 2 stopped by tpuwatch to grow back onto np-1 (checkpoint step 70) at 2026-11-29T06:32:21+00:00, "
        "not charged; relaunching on every slice from that checkpoint"), alert.text
    limp = ("attempt 1: worker 0 no exit code, ended by a disruption (slice np-1 lost (REPAIRING) at "
            "2026-11-29T06:32:21+00:00)")
    assert alerts.disruption_kind(limp) == "maintenance"


def test_a_slices_event_says_how_many_slices_the_job_runs_on() -> None:
    limp = alerts.from_event(WHERE, 8, "slices", T, "np-1 lost", {"out": ["np-1"], "in_use": 3, "of": 4})
    back = alerts.from_event(WHERE, 9, "slices", T, "np-1 back", {"out": [], "in_use": 4, "of": 4})
    assert limp is not None and "limping on 3 of 4 slices (np-1 left out): np-1 lost" in limp.text
    assert back is not None and "back on all 4 slices: np-1 back" in back.text


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


# ---- row checkpoint_stale: the warning that no checkpoint is being saved ---------------------


def test_checkpoint_stale_warns_while_running_of_an_old_or_missing_checkpoint() -> None:
    now = datetime(2025, 1, 1, 12, tzinfo=timezone.utc)
    running_mem = Memory(phase=Phase.RUNNING,
                         attempt=Attempt(number=3, start=now - timedelta(hours=3), start_step=100))
    fresh = Checkpoint("/c/200", 200, "orbax", now - timedelta(minutes=10))
    old = Checkpoint("/c/200", 200, "orbax", now - timedelta(minutes=80))
    assert alerts.checkpoint_stale(running_mem, fresh, 75 * 60, now) is None
    text = alerts.checkpoint_stale(running_mem, old, 75 * 60, now)
    assert text is not None and "step 200" in text and "1h20m old" in text and "job.checkpoint_warn_age" in text
    # no time known (e.g. a layout without one): the attempt saved nothing newer in 3 hours
    stuck = Checkpoint("/c/100", 100, "orbax", None)
    text = alerts.checkpoint_stale(running_mem, stuck, 75 * 60, now)
    assert text is not None and "attempt 3 has run 3h00m without a new complete checkpoint (still step 100)" in text
    assert alerts.checkpoint_stale(running_mem, Checkpoint("/c/150", 150, "orbax", None), 75 * 60, now) is None
    # only while the job runs: waiting for a node ages every checkpoint
    assert alerts.checkpoint_stale(Memory(phase=Phase.WAITING_NODE), old, 75 * 60, now) is None


def test_decide_raises_the_checkpoint_warning_and_remembers_since_when_it_stands() -> None:
    cfg = replace(CFG, checkpoint_warn_age=600.0)
    o = obs(node(), probes=running(1), checkpoint=ckpt(100))  # the step the attempt started from
    mem = run_mem(1, start=0.0, step=100)
    d = tick(o, mem, 500.0, cfg)
    assert d.row == "running" and d.checkpoint_warning == "" and d.memory.marks.checkpoint_warned is None
    d = tick(o, d.memory, 700.0, cfg)  # 700 s without a newer one: longer than 600 s
    assert d.row == "running" and not d.actions
    assert d.checkpoint_warning.startswith("attempt 1 has run 11m40s without a new complete checkpoint")
    assert d.memory.marks.checkpoint_warned == at(700.0)
    later = tick(o, d.memory, 900.0, cfg)  # still standing: since when is kept (one alert per stretch)
    assert later.checkpoint_warning and later.memory.marks.checkpoint_warned == at(700.0)
    saved = tick(replace(o, checkpoint=ckpt(200)), later.memory, 960.0, cfg)
    assert saved.checkpoint_warning == "" and saved.memory.marks.checkpoint_warned is None
    # the warning never changes what is done, and a person's --dry-run keeps the memory
    assert kinds(later) == kinds(tick(o, mem, 900.0, replace(cfg, checkpoint_warn_age=1e9)))
    assert tick(replace(o, dry_run=True), mem, 900.0, cfg).memory == mem
