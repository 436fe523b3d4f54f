"""Signs that the infrastructure, not the job, ended an attempt: gathered while it runs, and
late ones that refund a charged end.

`signs` adds this tick's signs to the running attempt's evidence (audit log entries, the node's
state, health, symptoms and maintenance, a worker's notice or a SIGTERM tpuwatch did not send,
failing environment checks), which
policy/classify.py weighs when the attempt ends. `refund` re-classifies a charged end as a
disruption when its sign arrives after it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.model import UNHEALTHY, AuditEvent
from tpuwatch.policy.classify import (
    Outcome,
    in_window,
    notice_evidence,
    stop_notice_evidence,
    term_evidence,
)
from tpuwatch.policy.draft import Draft, secs
from tpuwatch.policy.state import AttemptEnd, Evidence, Memory, Phase, move

DISRUPTING_EVENTS = frozenset({"terminate", "restart"})  # AuditEvent.kind values that are evidence


def _event_text(ev: AuditEvent) -> str:
    where = f" on worker {ev.worker}" if ev.worker else ""
    why = f" ({ev.reason})" if ev.reason else ""
    return f"audit {ev.method or ev.kind}{where}{why}"


def _disrupting(draft: Draft) -> list[AuditEvent]:
    out = draft.obs.node.slices_out if draft.obs.node is not None else ()
    names = [s for s in draft.cfg.slices if s not in out] or (draft.cfg.tpu_name,)  # the slices it runs on
    return [e for e in draft.obs.events if e.kind in DISRUPTING_EVENTS and e.node in names]


def explains(draft: Draft, ev: AuditEvent, start: datetime) -> bool:
    """Can audit event `ev` explain the end of an attempt launched at `start`?

    A restart entry is written when the node comes back, which is when tpuwatch launches
    (within one poll): one stamped before `start` + poll_interval describes the return the
    attempt was launched on, not a disruption of it.
    """
    if ev.kind == "restart":
        return ev.time > start + timedelta(seconds=draft.cfg.poll_interval)
    return ev.time >= start


def signs(draft: Draft, mem: Memory) -> list[Evidence]:
    """This tick's signs that the infrastructure disturbed the running attempt."""
    start, now, node = mem.attempt.start, draft.now, draft.obs.node
    assert start is not None  # checked in _check
    out = [Evidence(min(e.time, now), _event_text(e)) for e in _disrupting(draft) if explains(draft, e, start)]
    if node is None:
        return [*out, Evidence(now, "node missing")]
    # a multislice job: which slice (node "ms" is the job's name for all of them)
    for part in node.slices or (node,):
        what = f"slice {part.name or '(missing)'}" if node.slices else "node"
        if part.state != "READY":
            out.append(Evidence(now, f"{what} state {part.state}"))
        if part.health in UNHEALTHY:
            out.append(Evidence(now, f"{what} health {part.health}"))
    if mem.attempt.node_id and node.id != mem.attempt.node_id:
        out.append(Evidence(now, f"node id changed from {mem.attempt.node_id} to {node.id}"))
    for s in node.symptoms:
        if s.time is not None and start <= s.time:
            out.append(Evidence(min(s.time, now), f"symptom {s.type} on worker {s.worker_id or '?'}"))
    if node.maintenance_time is not None and start <= node.maintenance_time:
        # "The TPU had a maintenance event at ...": what a healed node still says afterwards
        out.append(Evidence(min(node.maintenance_time, now), "node health description: a maintenance event"))
    if node.pending_stop:
        out.append(stop_notice_evidence(now, "node"))
    um = node.upcoming_maintenance
    if um is not None and um.status == "ONGOING":
        out.append(Evidence(now, f"{um.type.lower()} maintenance ONGOING"))
    for p in draft.obs.probes or ():
        if p.notice and p.attempt == mem.attempt.number:
            out.append(notice_evidence(now, p.notice, p.worker))
        if p.foreign_term and p.attempt == mem.attempt.number:
            out.append(term_evidence(now, p.worker))
    pre = draft.obs.precheck
    if pre is not None and pre.context == "running" and pre.node_id in ("", node.id):
        # The same text for the same item every time: one evidence entry per failing item.
        out.extend(Evidence(now, f"environment check {i.check} failed on worker {i.worker}")
                   for i in pre.failing)
    return out


def late_signs(draft: Draft, last: AttemptEnd) -> list[tuple[datetime, str]]:
    """Signs that can still explain an attempt after its end: the audit log's terminate and
    restart entries, and the maintenance time a healed node's health description gives."""
    out = [(ev.time, _event_text(ev)) for ev in _disrupting(draft) if explains(draft, ev, last.start)]
    node = draft.obs.node
    if node is not None and node.id == last.node_id and node.maintenance_time is not None:
        out.append((node.maintenance_time, f"node had a maintenance event at {node.maintenance_time.isoformat()}"))
    return out


def host_gone_signs(draft: Draft, last: AttemptEnd) -> list[tuple[datetime, str]]:
    """What this tick's node read says of a host going away after the end `last`: the node
    (or a slice) not READY or not healthy, missing, or another node id. Dated at the end,
    which they explain."""
    node, after = draft.obs.node, f"seen {human(secs(draft.now - last.end))} after the end"
    if node is None:
        return [(last.end, f"node missing, {after}")]
    out = [(last.end, f"node id changed from {last.node_id} to {node.id}, {after}")] \
        if last.node_id and node.id != last.node_id else []
    for part in node.slices or (node,):
        what = f"slice {part.name or '(missing)'}" if node.slices else "node"
        if part.state != "READY":
            out.append((last.end, f"{what} state {part.state}, {after}"))
        if part.health in UNHEALTHY:
            out.append((last.end, f"{what} health {part.health}, {after}"))
    return out


def refund(draft: Draft, mem: Memory) -> Memory:
    """A sign that arrives after the charged end it explains refunds it: the audit log's and
    the health description's whenever they come, and within END_CONFIRM_WINDOW of an end
    charged on first sight, the node itself showing a host going away."""
    last = mem.budgets.last_end
    if last is None or not last.charged:
        return replace(mem,
                       budgets=replace(mem.budgets,
                                       confirm_by=None)) if mem.budgets.confirm_by is not None else mem
    signs, until = late_signs(draft, last), last.end
    if mem.budgets.confirm_by is not None:
        # Open: the first node read after the end counts however late it is (a watcher
        # stopped between two ticks), and every one until confirm_by. The sighting came
        # after its tick's `now`, so a maintenance dated up to this read may explain it.
        signs, until = signs + host_gone_signs(draft, last), draft.now
        if draft.now > mem.budgets.confirm_by:
            mem = replace(mem, budgets=replace(mem.budgets, confirm_by=None))
    for t, text in signs:
        if not in_window(min(t, draft.now), last.start, until, draft.cfg.evidence_window):
            continue
        fixed = replace(last, outcome=Outcome.DISRUPTION.value, charged=False, streak_added=False,
                        reason=f"{last.reason}; re-classified as a disruption: {text} arrived late")
        draft.ended.append(fixed)
        draft.notes.append(f"attempt {last.attempt} was ended by a disruption ({text}, reported late): "
                           "its restart is refunded")
        mem = replace(mem,
                      budgets=replace(mem.budgets, last_end=fixed, confirm_by=None,
                                      restarts=max(0, mem.budgets.restarts - 1),
                                      disruptions=mem.budgets.disruptions + 1,
                                      no_progress=max(0, mem.budgets.no_progress - int(last.streak_added)),
                                      backoff_level=max(0, mem.budgets.backoff_level - 1), backoff_until=None))
        return move(mem, Phase.IDLE) if mem.phase is Phase.BACKOFF else mem
    return mem
