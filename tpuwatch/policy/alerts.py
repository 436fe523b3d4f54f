"""Which journal events are worth telling people ([[notify]]), and the one line each says.

Rules of this module:
- Alerts are derived from what the tick already journals (its events) and from the upcoming
  maintenance notice the tick saw; nothing here adds a rule to recovery. `RULES` is the table:
  event kind and a test of its data -> alert kind and its text. One warning is decided here too,
  since nothing is done about it but telling people: `checkpoint_stale` (a running attempt that
  saves no new checkpoint), which `decide` puts in the Decision and the journal records once per
  stretch, as a `checkpoint_stale` event.
- Pure: no I/O, no clock. The same event always gives the same alert and the same key, so
  deriving it again (a restarted watcher, the next cron run) adds nothing.
- A line names the job, node and zone, what happened, and what tpuwatch did or needs. It never
  holds a URL or token: it is made from the journal, which holds none.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpuwatch.durations import human
from tpuwatch.model import Checkpoint, UpcomingMaintenance
from tpuwatch.policy.maintenance import maintenance_plan
from tpuwatch.policy.nodes import STOPPING_LONG_WAIT
from tpuwatch.policy.owed import STOP_FAILED_WAIT
from tpuwatch.policy.rows import Row
from tpuwatch.policy.state import Memory, Phase


@dataclass(frozen=True)
class Where:
    """What every line names."""

    job: str
    node: str
    zone: str

    def prefix(self) -> str:
        return f"tpuwatch {self.job} (node {self.node}, {self.zone})"


@dataclass(frozen=True)
class Alert:
    key: str  # idempotency key: one per journal event (or maintenance notice) and alert kind
    kind: str  # one of tpuwatch.config.ALERT_KINDS
    time: datetime
    text: str  # the one line people read
    data: dict[str, Any] = field(default_factory=dict)  # for format = "json"


# What ended an attempt, from the sign the policy named (first match wins); a metric label too.
DISRUPTION_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"to grow back onto"), "grow"),  # policy/limp.py's planned stop, first: it names no fault
    (re.compile(r"PREEMPTED|preempt", re.I), "preemption"),
    (re.compile(r"maintenance|REPAIRING", re.I), "maintenance"),
    (re.compile(r"terminate|TERMINATED", re.I), "terminated"),
    (re.compile(r"restart|RESTARTING", re.I), "restart"),
    (re.compile(r"node missing"), "node_missing"),
    (re.compile(r"node id changed"), "node_replaced"),
    (re.compile(r"symptom"), "symptom"),
    (re.compile(r"environment check"), "environment"),
    (re.compile(r"node health|node state"), "unhealthy"),
)


def disruption_kind(reason: str) -> str:
    """The kind of disruption an attempt_end's reason names ("other" when none matches)."""
    sign = reason.rsplit("ended by a disruption", 1)[-1] if "ended by a disruption" in reason else reason
    for rx, kind in DISRUPTION_KINDS:
        if rx.search(sign):
            return kind
    return "other"


def _sign(reason: str) -> str:
    """The sign named in "attempt n: ..., ended by a disruption (<sign>)", else the whole reason."""
    head, found, tail = reason.partition("ended by a disruption (")
    return tail[:-1] if found and tail.endswith(")") else reason


def _step(data: Mapping[str, Any]) -> str:
    ck = data.get("checkpoint")
    return f"checkpoint step {ck.get('step')}" if isinstance(ck, dict) else "scratch (no checkpoint yet)"


Text = Callable[[str, Mapping[str, Any]], str]
Test = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Rule:
    event: str  # the journal event kind
    test: Test  # on the event's data
    alert: str  # the alert kind
    text: Text  # (event reason, event data) -> what happened and what tpuwatch does or needs


def _always(data: Mapping[str, Any]) -> bool:
    return True


RULES: tuple[Rule, ...] = (
    Rule("fail", _always, "failed",
         lambda r, d: f"job FAILED: {r}. tpuwatch has stopped; a person must look (`tpuwatch history`)"),
    Rule("needs_person", _always, "needs_person",
         lambda r, d: f"needs a person: {r}. Fix it; the next `tpuwatch watch` or `check` resumes from the journal"),
    Rule("attempt_end", lambda d: d.get("outcome") == "disruption", "disruption",
         lambda r, d: f"grow: attempt {d.get('attempt')} {_sign(r)}, not charged; relaunching on every slice "
                      "from that checkpoint" if disruption_kind(r) == "grow" else
                      f"{disruption_kind(r)}: attempt {d.get('attempt')} ended by a disruption ({_sign(r)}), not "
                      "charged. tpuwatch gets the node back (waits for it to heal, or recreates it) and relaunches "
                      "from the newest checkpoint"),
    Rule("wait", lambda d: d.get("reason") == "node created", "recreated",
         lambda r, d: f"node recreated: {r}"),
    Rule("wait", lambda d: d.get("reason") == STOPPING_LONG_WAIT, "stopping_long",
         lambda r, d: f"a VM stuck stopping: {r}"),
    Rule("wait", lambda d: d.get("reason") == STOP_FAILED_WAIT, "stop_failed",
         lambda r, d: f"no launch while the job may still run where it was: {r}. Check that node's SSH, or stop "
                      "the job there yourself"),
    Rule("launch", lambda d: int(d.get("attempt") or 0) > 1, "resumed",
         lambda r, d: f"resuming: launching attempt {d.get('attempt')} from {_step(d)}"),
    Rule("done", _always, "done", lambda r, d: f"job done: {r}"),
    Rule("slices", _always, "slices",
         lambda r, d: (f"limping on {d.get('in_use')} of {d.get('of')} slices ({', '.join(d.get('out') or ())} left "
                       f"out): {r}" if d.get("out") else f"back on all {d.get('of')} slices: {r}")),
    Rule("checkpoint_stale", _always, "checkpoint_stale",
         lambda r, d: f"no new checkpoint: {r}. tpuwatch keeps following the job; look at whether it still saves "
                      "(a job that saves none loses all its work at the next disruption)"),
)


# The warnings the policy decides: told to people, never acted on (docs/policy.md shows them).
WARNING_ROWS: tuple[Row, ...] = (
    Row("checkpoint_stale", "the attempt runs (RUNNING), and its newest complete checkpoint is older than "
        "job.checkpoint_warn_age, or it has run that long without one newer than it started from",
        "nothing is done about it: every tick says so; the journal records it once per stretch (a checkpoint_stale "
        "event, and its alert), since when in the memory (marks.checkpoint_warned)"),
)


def checkpoint_stale(mem: Memory, checkpoint: Checkpoint | None, warn_age: float, now: datetime) -> str | None:
    """The warning (row `checkpoint_stale`, docs/policy.md) while the attempt runs, when the newest
    complete checkpoint is older than `job.checkpoint_warn_age`, or the attempt has run that long
    without saving a newer one; None when there is nothing to say.

    Only while RUNNING: a job waiting for its node naturally has an ageing checkpoint.
    """
    if mem.phase is not Phase.RUNNING or mem.attempt.start is None:
        return None
    limit = f"job.checkpoint_warn_age ({human(warn_age)})"
    if checkpoint is not None and checkpoint.time is not None:
        age = (now - checkpoint.time).total_seconds()
        if age > warn_age:
            return (f"the newest complete checkpoint (step {checkpoint.step}) is {human(age)} old, older than "
                    f"{limit}: is the job still saving?")
    ran = (now - mem.attempt.start).total_seconds()
    start = mem.attempt.start_step
    stuck = checkpoint is None or (start is not None and checkpoint.step <= start)
    if ran > warn_age and stuck:
        since = f"still step {start}" if start is not None else "none yet"
        return (f"attempt {mem.attempt.number} has run {human(ran)} without a new complete checkpoint ({since}), "
                f"longer than {limit}")
    return None


def key_for(job: str, event_id: int, kind: str, time: datetime) -> str:
    """Unique per job, event and kind; the time keeps a new journal's event 1 from reusing a key."""
    return f"tpuwatch-{job}-{event_id}-{kind}-{int(time.timestamp())}"


def from_event(where: Where, event_id: int, kind: str, time: datetime, reason: str,
               data: Mapping[str, Any]) -> Alert | None:
    """The alert a journal event makes, or None (first matching rule of RULES)."""
    for rule in RULES:
        if rule.event == kind and rule.test(data):
            text = f"{where.prefix()}: {rule.text(reason, data)}"
            return Alert(key_for(where.job, event_id, rule.alert, time), rule.alert, time, text,
                         {"event": kind, "reason": reason, **{k: v for k, v in data.items() if k != "kind"}})
    return None


def from_maintenance(where: Where, node_id: str, notice: UpcomingMaintenance | None,
                     now: datetime, start_early: bool = True) -> Alert | None:
    """One alert per maintenance notice and status (PENDING, then ONGOING) of the node."""
    if notice is None:
        return None
    start = notice.window_start.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%MZ") if notice.window_start else "?"
    end = notice.window_end.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%MZ") if notice.window_end else "?"
    stamp = int(notice.window_start.timestamp()) if notice.window_start else 0
    key = f"tpuwatch-{where.job}-maintenance-{node_id}-{stamp}-{notice.status.lower()}"
    what = "under way" if notice.status == "ONGOING" else "planned"
    early = " It can be started early (can_reschedule)." if notice.can_reschedule else ""
    plan = maintenance_plan(notice, watched=True, start_early=start_early)
    text = (f"{where.prefix()}: {notice.type.lower()} maintenance {what}, window {start} to {end}. tpuwatch "
            f"{plan}; nothing to do.{early}")
    return Alert(key, "maintenance", now, text, {
        "type": notice.type, "status": notice.status, "can_reschedule": notice.can_reschedule,
        "window_start": notice.window_start.isoformat() if notice.window_start else None,
        "window_end": notice.window_end.isoformat() if notice.window_end else None, "node_id": node_id})
