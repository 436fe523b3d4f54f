"""`decide`: the recovery table (policy/rows.py; docs/policy.md shows it) walked for one tick.

How a decision is found, in order:
1. a terminal phase (DONE, FAILED) stays as it is;
2. late disruption evidence for the last charged attempt refunds its charge;
3. while RUNNING, this tick's disruption signs are added to the attempt's evidence;
4. a person's recreate (`Observation.recreate_asked`) with no operation in flight: row
   `recreate_asked`, then the operation rows below;
4b. a phase with a cloud operation in flight (DELETING, CREATING, QUEUED) follows it:
   OP_HANDLERS (policy/operations.py); a delete the tick never started is decided afresh from
   the node (row `delete_resume`);
5. otherwise a job with spares swaps a lost slice for one (policy/spares.py); a multislice
   job that may limp leaves lost slices out, or takes back slices that are back
   (policy/limp.py); a job with spares and none free waits for one on its way; else the node's
   condition picks the handler: NODE_HANDLERS (policy/usable.py, policy/recovery.py). Each
   handler ends a running attempt first when the node can no longer carry it, then decides for
   the node. A decision that does nothing else makes a dead spare again (`spares.remake`). A job
   with a priority lends, takes, asks for and hands back nodes (policy/priority.py). A node the
   job moves off is owed a stop until one is done there (policy/owed.py).
Every Decision names the row that made it (`Decision.row`, one of ROWS); the handlers gather it
in a `Draft` (policy/draft.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from tpuwatch.policy import google, limp, owed, pool, priority, spares
from tpuwatch.policy.alerts import checkpoint_stale
from tpuwatch.policy.draft import Draft, worker_list
from tpuwatch.policy.early import early_refused, idle_refused, start_idle
from tpuwatch.policy.evidence import refund, signs
from tpuwatch.policy.faulty import report_refused
from tpuwatch.policy.nodes import Cond, boots_seen, node_condition
from tpuwatch.policy.observe import launch_likely, stamped
from tpuwatch.policy.operations import creating, delete_unstarted, deleting, queued
from tpuwatch.policy.recovery import asked, dead, missing, person, repairing, someone_deleting
from tpuwatch.policy.state import TERMINAL, Memory, Phase, merge_evidence
from tpuwatch.policy.usable import usable
from tpuwatch.policy.values import (
    Decision,
    DeleteNode,
    ImpossibleObservation,
    Launch,
    Observation,
    PolicyConfig,
    StopWorkers,
    WorkerProbe,
)

# A handler decides for one node condition or operation phase, from the memory so far.
Handler = Callable[[Draft, Memory], Decision]
NODE_HANDLERS: dict[Cond, Handler] = {
    Cond.USABLE: usable,
    Cond.REPAIR: repairing,
    Cond.UNRECOGNIZED: repairing,
    Cond.DEAD: dead,
    Cond.PERSON: person,
    Cond.MISSING: missing,
    Cond.DELETING: someone_deleting,
}
# phases with a cloud operation in flight -> the handler following it
OP_HANDLERS: dict[Phase, Handler] = {Phase.DELETING: deleting, Phase.CREATING: creating, Phase.QUEUED: queued}


def decide(obs: Observation, mem: Memory, cfg: PolicyConfig, now: datetime) -> Decision:
    """The decision for one tick. Pure: the same arguments always give the same Decision."""
    _check(obs, mem, cfg, now)
    draft = Draft(obs, cfg, now)
    if mem.phase in TERMINAL:
        word = "done" if mem.phase is Phase.DONE else "failed"
        # The stop that went with the end may not have happened (the tick was killed): repeat it.
        left = [p for p in obs.probes or () if p.state == "running"]
        stop = (StopWorkers(f"job {word}: stopping leftover workers {worker_list(left)}"),) if left else ()
        decision = draft.out(mem, "terminal", f"job {word}: {mem.reason}", *stop)
    elif obs.maintenance_refused:
        decision = idle_refused(draft, mem) if obs.maintenance_refused_idle else early_refused(draft, mem)
    elif obs.host_report_refused:
        decision = report_refused(draft, mem)
    else:
        new = refund(draft, google.seen(draft, boots_seen(obs.node, mem, now)))
        if new.phase is Phase.RUNNING:
            new = replace(new,
                          attempt=replace(new.attempt,
                                          evidence=merge_evidence(new.attempt.evidence, signs(draft, new))))
        fresh = delete_unstarted(draft, new) if new.phase is Phase.DELETING else None
        if obs.recreate_asked and (fresh is not None or new.phase not in OP_HANDLERS):
            decision = asked(draft, fresh or new)  # a person's recreate: the same path as the rows' own
        elif fresh is not None:
            d = NODE_HANDLERS[node_condition(obs.node)](draft, fresh)
            decision = replace(d, row="delete_resume") if any(isinstance(a, DeleteNode) for a in d.actions) else d
        elif new.phase in OP_HANDLERS:
            decision = OP_HANDLERS[new.phase](draft, new)
        else:
            new = spares.track(draft, limp.track(draft, new))
            # a lost slice swapped for a spare (policy/spares.py); a job that limps, or grows back
            # (policy/limp.py); a spare on its way waited for (policy/spares.py)
            # a job with a priority: a node it holds lent to a higher one, a node lent to it (or handed
            # back) taken, a node of a lower one asked for, a lent slot waited for (policy/priority.py)
            shifted = (priority.give(draft, new) or priority.take(draft, new) or spares.swap(draft, new)
                       or pool.claim(draft, new) or limp.shift(draft, new) or priority.want(draft, new) or spares.wait(draft, new)
                       or priority.lent_wait(draft, new))
            decision = priority.relabel(draft, new, pool.keep(draft, new, pool.give_back(draft, new, spares.remake(
                draft, new, shifted or limp.grow_wait(draft, new, NODE_HANDLERS[node_condition(obs.node)](draft, new))))))
            decision = start_idle(draft, decision)  # an idle spare's announced maintenance (policy/early.py)
    # a job with a priority that ends holding nodes it took hands them back (policy/priority.py)
    decision = priority.ended(draft, decision)
    if obs.checks and obs.node is not None:
        # What more to observe in this tick (policy/settle.py bounds the re-decisions).
        launches = any(isinstance(a, Launch) for a in decision.actions)
        unchecked = obs.precheck is None or obs.precheck.context != "launch"
        decision = replace(decision, check_first=launches and unchecked,
                           check_after=decision.row == "precheck_fix" and not obs.precheck_fixed)
    if obs.node is not None and decision.memory.maintenance.notice_hold is None and launch_likely(decision.memory, obs.node, now):
        # An end whose relaunch is due now: after the stop, look at the workers again and launch
        # in this same tick, rather than on the next one.
        probe_after = bool(decision.ended) and any(isinstance(a, StopWorkers) and not a.blocked
                                                   for a in decision.actions)
        if probe_after and nothing_left(obs.probes):
            # No process of the attempt is left anywhere (a host that rebooted, every command
            # ended): the stop and the look after it would find what this probe found, and the
            # launch cleans up device holders and the libtpu lockfile itself. Launch at once.
            decision = replace(decision, decide_again=True,
                               actions=tuple(a for a in decision.actions if not isinstance(a, StopWorkers)))
        else:
            # The probe after the stop must find the old attempt gone: that stop is waited for.
            actions = tuple(replace(a, wait=True) if probe_after and isinstance(a, StopWorkers) else a
                            for a in decision.actions)
            decision = replace(decision, probe_after=probe_after, actions=actions)
    # a node the job moves off is stopped before the job runs elsewhere, even across a kill
    decision = owed.carry(draft, mem, decision)
    # What the tick did on a schedule, and the warning it tells people, journaled with the decision
    # (an ended job's memory stays as it ended: nothing is scheduled for it any more).
    if mem.phase not in TERMINAL:
        warning = checkpoint_stale(mem, obs.checkpoint, cfg.checkpoint_warn_age, now)
        decision = replace(decision, memory=stamped(decision.memory, obs, now, warning is not None),
                           checkpoint_warning=warning or "")
    if obs.dry_run:
        return replace(decision, memory=mem, summary=f"dry run: {decision.summary}", ended=(), operation_done=None)
    return decision


def nothing_left(probes: Sequence[WorkerProbe] | None) -> bool:
    """Every worker answered, and none has a process of the attempt left: each one's command
    ended (or its host rebooted) and nothing of it lives on."""
    return bool(probes) and all(p.state in ("exited", "absent") and not p.lingering for p in probes or ())


def operation_started(mem: Memory, name: str, now: datetime) -> Memory:
    """Memory after the tick started the DeleteNode/CreateNode operation called `name` at `now`.

    "" (a create answered ALREADY_EXISTS for tpuwatch's own earlier create) records nothing:
    the next tick sees the node.
    """
    if mem.phase not in (Phase.DELETING, Phase.CREATING):
        raise ValueError(f"operation_started: no operation is started in phase {mem.phase.value}")
    return replace(mem, recreate=replace(mem.recreate, pending_op=name, op_started=now)) if name else mem


# ---------------------------------------------------------------------------------------------


def _check(obs: Observation, mem: Memory, cfg: PolicyConfig, now: datetime) -> None:
    """Raise ImpossibleObservation, naming phase and evidence, when inputs contradict each other."""
    if now.tzinfo is None:
        raise ValueError("decide: `now` must carry a time zone")
    phase = mem.phase
    if not 0.0 <= obs.jitter < 1.0:
        raise ImpossibleObservation(phase, f"jitter {obs.jitter!r} is outside [0, 1)")
    if obs.node is not None and obs.node.name != cfg.tpu_name:
        raise ImpossibleObservation(phase, f"observed node {obs.node.name!r}, but the job watches {cfg.tpu_name!r}")
    if len(obs.left_out) != len(mem.limp.out):
        raise ImpossibleObservation(phase, f"{len(obs.left_out)} slices observed left out, but the memory leaves "
                                           f"out {', '.join(mem.limp.out) or 'none'}")
    kept = mem.limp.kept(cfg.slices)
    if obs.node is not None and obs.node.slices and len(obs.node.slices) != len(kept):
        raise ImpossibleObservation(phase, f"observed {len(obs.node.slices)} slices, but the job runs on "
                                           f"{', '.join(kept)}")
    if obs.probes is not None:
        workers = [p.worker for p in obs.probes]
        if len(set(workers)) != len(workers):
            raise ImpossibleObservation(phase, f"two probes for one worker: {sorted(workers)}")
    op = obs.operation
    if op is not None:
        if phase not in (Phase.DELETING, Phase.CREATING):
            raise ImpossibleObservation(phase, f"status of operation {op.name!r} observed, but none is pending")
        if op.name and op.name != mem.recreate.pending_op:
            raise ImpossibleObservation(
                phase, f"status of operation {op.name!r} observed, but the pending one is {mem.recreate.pending_op!r}"
            )
        if not op.name and not op.done:
            raise ImpossibleObservation(phase, "a refused call (operation name \"\") must be done")
    if phase is Phase.RUNNING and (mem.attempt.number < 1 or mem.attempt.start is None):
        raise ImpossibleObservation(phase, f"memory records no attempt start (attempt {mem.attempt.number})")
    if mem.recreate.pending_op is not None and not mem.pending_kind:
        raise ImpossibleObservation(phase, f"memory records operation {mem.recreate.pending_op!r} in flight")
    if phase is Phase.QUEUED and (mem.recreate.retry_at is None or mem.recreate.queued_since is None):
        raise ImpossibleObservation(phase, "memory records no retry time")
