"""An announced maintenance started early (maintenance.start_early): wait for the job's next
checkpoint, then stop it and start the maintenance, or relaunch when the service refuses.

Rows `early_wait`, `early_start`, `early_swap` (a spare takes the node's place first),
`early_refused`, and `spare_maintenance` (an idle spare's started while nothing runs there);
what tpuwatch will do about a maintenance, said for people, is policy/maintenance.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.model import UpcomingMaintenance, WorkerProbe
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.ending import NOTICE_HOLD, finish
from tpuwatch.policy.limp import stop_waited
from tpuwatch.policy.maintenance import can_start_early
from tpuwatch.policy.spares import bind, free
from tpuwatch.policy.state import Evidence, Memory, merge_evidence
from tpuwatch.policy.values import Decision, StartMaintenance, Wait

# maintenance.start_early: when no new checkpoint lands first, start it this long before its window.
EARLY_MARGIN = 10 * 60.0
# While an early start waits for the job's next checkpoint: from EARLY_LEAD of the checkpoint
# interval before it is due, look every EARLY_CHECK of the interval (never more often than every
# EARLY_CHECK_MIN seconds: a tick probes every worker over SSH; never less often than a poll), so
# the job is stopped within ~0.1 % of a 30 min interval of its save instead of within a poll (a
# 30 s poll is 1.6 % of it). These ticks are spent only in one stretch per announced maintenance.
EARLY_LEAD = 0.1
EARLY_CHECK = 0.001
EARLY_CHECK_MIN = 1.0


def early_maintenance(draft: Draft, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision | None:
    """While every worker runs on an owned node whose announced maintenance may start early:
    wait for the next complete checkpoint, then end the attempt (uncharged), stop the job and
    start the maintenance. With a spare free (tpu.spares), any announced maintenance of a node
    the job runs on: at that checkpoint the node is swapped for the spare (row `early_swap`),
    its maintenance started while it is idle when it may start early, and the job relaunched at
    once on the spare. None when there is nothing to do about maintenance."""
    node, cfg, now, ck = draft.obs.node, draft.cfg, draft.now, draft.obs.checkpoint
    assert node is not None
    um = node.upcoming_maintenance
    if um is None:
        return None
    startable = (cfg.start_early and can_start_early(um) and (draft.obs.adopt or node.owned_by(cfg.job))
                 and not (mem.maintenance.early_refused is not None and mem.maintenance.early_refused == um.window_start))
    swap = _spare_for(draft, mem) if um.status != "ONGOING" else None
    if not startable and swap is None:
        return None
    if mem.maintenance.early_window != um.window_start or mem.maintenance.early_window is None:
        mem = replace(mem,
                      maintenance=replace(mem.maintenance, early_window=um.window_start,
                                          early_step=ck.step if ck is not None else None))
    saved = ck is not None and (mem.maintenance.early_step is None or ck.step > mem.maintenance.early_step)
    latest = um.window_start - timedelta(seconds=EARLY_MARGIN) if um.window_start is not None else now
    window = um.window_start.isoformat() if um.window_start is not None else "not given"
    if not saved and now < latest:
        after = f"newer than step {mem.maintenance.early_step}" if mem.maintenance.early_step is not None else "its first"
        plan = (f"moving the job off {swap[1]} onto spare {swap[2]}" + (" and starting it" if startable else "")
                if swap is not None else "starting it")
        return draft.out(mem, "early_wait", f"attempt {mem.attempt.number} running; {um.type.lower()} maintenance "
                                            f"(window {window}) {'may start early' if startable else 'announced'}: "
                                            f"{plan} after the next checkpoint ({after}), at the latest at "
                                            f"{latest.isoformat()}",
                         Wait(min(latest, early_check(draft, mem)), "maintenance to start after the next checkpoint"))
    why = (f"checkpoint step {ck.step} saved after the maintenance notice" if saved and ck is not None
           else f"no new checkpoint {human(EARLY_MARGIN)} before the window ({window})")
    sign = Evidence(now, f"maintenance started early by tpuwatch ({why})" if swap is None
                    else f"moved by tpuwatch onto a spare ahead of a maintenance ({why})")
    mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, [sign])))
    mem, line, final = finish(draft, mem, {p.worker: None for p in probes}, reachable=True)
    if final is not None:
        return final
    if swap is not None:
        slot, old, spare = swap
        mem = replace(mem, limp=replace(mem.limp, swapped=bind(cfg.slices, mem.limp, [(slot, spare)])))
        start = (StartMaintenance(old, f"{why}: starting the {um.type.lower()} maintenance (window {window}) of {old} "
                                       "now, while it is idle"),) if startable else ()
        return stop_waited(draft.out(mem, "early_swap", f"{line}; {um.type.lower()} maintenance of {old} (window "
                                                        f"{window}) announced: slice {cfg.slices.index(slot)} ({slot}) "
                                                        f"moves onto spare {spare} ({why}); the job relaunches there "
                                                        "from that checkpoint" + ("; the maintenance starts now on "
                                                                                  f"{old}, idle" if startable else ""),
                                     *start))
    # The node is about to go down: no launch there until it has gone down and come back.
    mem = replace(mem, maintenance=replace(mem.maintenance, notice_hold=now + timedelta(seconds=NOTICE_HOLD)))
    return draft.out(mem, "early_start", f"{line}; starting the maintenance of node {node.name} now ({why})",
                     StartMaintenance(node.name, f"{why}: starting the {um.type.lower()} maintenance "
                                                 f"(window {window}) now"))


def _spare_for(draft: Draft, mem: Memory) -> tuple[str, str, str] | None:
    """The slot whose node's announced maintenance comes first, that node, and the first spare
    free to take its place; None without one (or with no maintenance on a node of the job's)."""
    node = draft.obs.node
    spares = free(draft, mem)
    if node is None or not node.slices or not spares:
        return None
    pending = [(up.window_start.timestamp() if up.window_start is not None else float("inf"), i)
               for i, part in enumerate(node.slices)
               if (up := part.upcoming_maintenance) is not None and up.status != "ONGOING"]
    if not pending:
        return None
    i = min(pending)[1]
    return mem.limp.slots(draft.cfg.slices)[i], node.slices[i].name, spares[0]


def early_check(draft: Draft, mem: Memory) -> datetime:
    """When to look for the awaited checkpoint next: shortly, once it is nearly due by the
    interval this attempt has shown (`hang.ckpt_gap`, from its newest checkpoint); at the start of
    that stretch before it; a poll from now when the interval is not known yet."""
    gap, last, now = mem.hang.ckpt_gap, mem.hang.progress_time, draft.now
    if gap <= 0 or last is None or draft.obs.checkpoint is None or mem.hang.progress_step != draft.obs.checkpoint.step:
        return now + timedelta(seconds=draft.cfg.poll_interval)
    close = last + timedelta(seconds=gap * (1 - EARLY_LEAD))
    if now < close:
        return close
    return now + timedelta(seconds=min(draft.cfg.poll_interval, max(EARLY_CHECK_MIN, gap * EARLY_CHECK)))


def early_refused(draft: Draft, mem: Memory) -> Decision:
    node = draft.obs.node
    um = node.upcoming_maintenance if node is not None else None
    refused = um.window_start if um is not None else mem.maintenance.early_window
    mem = replace(mem, maintenance=replace(mem.maintenance, early_refused=refused, notice_hold=None))
    return draft.out(mem, "early_refused", f"the maintenance could not be started early "
                                           f"({draft.obs.maintenance_refused}); relaunching, and the job "
                                           "gets the last-minute notice instead",
                     Wait(None, "relaunch after the refused early maintenance"))


def start_idle(draft: Draft, decision: Decision) -> Decision:
    """A decision that does nothing (the job runs on, or waits), of a job with an idle spare of its
    own whose announced maintenance may start early ([maintenance] start_early): with that
    maintenance started now, while nothing runs there (row `spare_maintenance`), rather than at
    its window, when the spare may be the one the job runs on. So is the maintenance of a node
    the job moved off ahead of it (`early_swap`) whose start a watcher killed in between never
    sent. Each maintenance once (`Maintenance.idle_started`, journaled before the call): one the
    service refused comes at its window. Not through a queued resource (a spare is not in it)."""
    cfg, mem = draft.cfg, decision.memory
    if not cfg.start_early or cfg.queued_resource or decision.ended \
            or any(not isinstance(a, Wait) for a in decision.actions):
        return decision
    pending: dict[str, tuple[str, UpcomingMaintenance]] = {}
    for name, part in draft.obs.spares:
        if part is None or (um := part.upcoming_maintenance) is None:
            continue
        if can_start_early(um) and part.owned_by(cfg.job) and part.state == "READY" and not part.multislice_request:
            pending[_key(name, um)] = (name, um)
    started = tuple(k for k in mem.maintenance.idle_started if k in pending)  # the others are done with
    due = [k for k in pending if k not in started]
    mem = replace(mem, maintenance=replace(mem.maintenance, idle_started=(*started, *due[:1])))
    if not due:
        return decision if mem == decision.memory else replace(decision, memory=mem)
    name, um = pending[due[0]]
    window = um.window_start.isoformat() if um.window_start is not None else "not given"
    action = StartMaintenance(name, f"{name}, an idle spare of job {cfg.job}, has a {um.type.lower()} maintenance "
                                    f"announced (window {window}) that may start early: starting it now, while "
                                    "nothing runs there", idle=True)
    return replace(decision, memory=mem, row="spare_maintenance", actions=(*decision.actions, action),
                   summary=f"{decision.summary}; {action.reason}")


def idle_refused(draft: Draft, mem: Memory) -> Decision:
    """The service refused to start an idle spare's maintenance early: said; it comes at its
    window (asked once: `Maintenance.idle_started`)."""
    return draft.out(mem, "spare_maintenance", f"the maintenance of idle spare {draft.obs.maintenance_refused_idle} "
                                               f"could not be started early ({draft.obs.maintenance_refused}): it "
                                               "comes at its window", Wait(None, "the job runs on"))


def _key(name: str, um: UpcomingMaintenance) -> str:
    return f"{name}@{um.window_start.isoformat() if um.window_start is not None else ''}"
