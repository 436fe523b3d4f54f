"""A usable node: follow the running attempt, end it when it ends or hangs, launch the next.

`usable` is the handler for a READY+HEALTHY node. The launch-time environment checks
(`prechecked`) and the login before a launch (`login_refused`) are judged here, before anything
runs on the workers.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.model import OWNER_LABEL, Checkpoint, PrecheckReport, WorkerProbe
from tpuwatch.policy import spares
from tpuwatch.policy.cadence import learn, log_age, silent_limit
from tpuwatch.policy.classify import Outcome
from tpuwatch.policy.draft import Draft, secs, worker_exits, worker_list
from tpuwatch.policy.early import early_maintenance
from tpuwatch.policy.ending import confirm_end, end_usable
from tpuwatch.policy.faulty import checks_bad_host, count_checks, report_hold
from tpuwatch.policy.hang import (
    effective_hang_limit,
    hung,
    log_silence,
    log_silent,
    progress_quiet,
    signature,
)
from tpuwatch.policy.nodes import boot_time, maintained_since
from tpuwatch.policy.owed import held
from tpuwatch.policy.recovery import recreate
from tpuwatch.policy.state import Evidence, Memory, Phase, merge_evidence, move
from tpuwatch.policy.values import Decision, ImpossibleObservation, Launch, StopWorkers, Wait


def _ckpt_text(ckpt: Checkpoint | None, now: datetime) -> str:
    if ckpt is None:
        return "no checkpoint yet"
    # a save that lands while the tick runs is stamped after `now`: call it 0s old
    age = f", {human(max(0.0, secs(now - ckpt.time)))} old" if ckpt.time is not None else ""
    return f"checkpoint step {ckpt.step} ({ckpt.path}{age})"


def usable(draft: Draft, mem: Memory) -> Decision:
    node = draft.obs.node
    assert node is not None
    if mem.repair.unhealthy_since is not None or mem.repair.unknown_since is not None:
        mem = replace(mem, repair=mem.repair.over())
    if mem.phase in (Phase.WAITING_NODE, Phase.PAUSED, Phase.HALTED):
        draft.notes.append(f"{draft.subject} is READY+HEALTHY")
        # A notice's hold ends too: the node went down and came back.
        mem = move(mem, Phase.IDLE, reason="", maintenance=replace(mem.maintenance, notice_hold=None))
    if not draft.obs.probes:
        return draft.out(mem, "probe_failed", "could not probe the workers; looking again next tick",
                         Wait(None, "workers not probed"))
    if mem.phase is Phase.RUNNING:
        return running(draft, mem)
    return idle(draft, mem)


def running(draft: Draft, mem: Memory) -> Decision:
    cfg, n = draft.cfg, mem.attempt.number
    probes = tuple(sorted(draft.obs.probes or (), key=lambda p: p.worker))
    for p in probes:
        if p.attempt is not None and p.attempt > n and p.state in ("running", "exited"):
            raise ImpossibleObservation(
                mem.phase, f"the journal's latest attempt is {n}, but worker {p.worker} shows attempt "
                           f"{p.attempt} ({p.state}); is another tpuwatch launching this job?")
    # "absent" with this attempt's number: it was launched there and died with no exit code
    # (killed, or the host rebooted before any tick saw it run). That is a trace: end it and
    # classify the end; relaunching the same number would only be refused as "ran".
    mine = [p for p in probes if p.attempt == n and p.state in ("running", "exited", "absent")]
    if not mem.attempt.seen and not mine:
        return unseen(draft, mem, probes)
    # Workers that never had attempt n (their attempt file is monotonic): a launch cut short
    # (the watcher killed between workers, a launch refused or lost on one), not an end.
    missing = [p for p in probes if p.state != "unreachable" and (p.attempt or 0) < n]
    if not mem.attempt.seen and missing and all(p.state == "running" for p in mine):
        return launch_rest(draft, mem, missing, [p for p in probes if p.state == "unreachable"])
    mem = replace(mem, attempt=replace(mem.attempt, seen=True, launch_tries=0))
    signed = signature(draft, mem, probes)
    if signed is not None:
        return signed
    codes = worker_exits(probes, n)
    unreachable = [p for p in probes if p.state == "unreachable"]
    if codes.get(cfg.primary_worker) == 0 or any(
        c != 0 for w, c in codes.items() if w not in {p.worker for p in unreachable}
    ):
        return confirm_end(draft, mem, codes)
    alive = [p for p in probes if p.state == "running" and p.attempt == n]
    if unreachable and not alive:
        return draft.out(mem, "workers_unreachable",
                         f"cannot reach workers {worker_list(unreachable)}; attempt {n} unknown, looking again",
                         Wait(None, "workers unreachable"))
    if unreachable:
        since = mem.attempt.unreachable_since or draft.now
        if secs(draft.now - since) >= cfg.unreachable_grace:
            return end_usable(draft, mem, codes, detail=f"worker {worker_list(unreachable)} unreachable "
                                                        f"for {human(secs(draft.now - since))}")
        until = since + timedelta(seconds=cfg.unreachable_grace)
        return draft.out(replace(mem,
                                 attempt=replace(mem.attempt, unreachable_since=since)), "unreachable_grace",
                         f"worker {worker_list(unreachable)} unreachable while the others run attempt {n}; "
                         f"ending it at {until.isoformat()} if it stays so", Wait(until, "unreachable worker"))
    mem = replace(mem, attempt=replace(mem.attempt, unreachable_since=None, end_seen=None))
    start = mem.attempt.start
    assert start is not None
    if len(alive) == len(probes):
        mem, quiet, from_start = progress_quiet(draft, mem, start)
        mem, silent = log_silence(draft, mem, start)
        age = log_age(probes, n)
        mem = learn(mem, age, draft.now, start, warm=not from_start, poll=cfg.poll_interval)
        cut = silent_limit(mem) if cfg.hang_auto and not from_start and age is not None else 0.0
        if cut > 0 and age is not None and age >= cut and quiet >= cut:
            return log_silent(draft, mem, quiet, age)
        limit = effective_hang_limit(cfg, mem, from_start)
        # "auto" also wants the logs silent: a long evaluation that prints is not a hang.
        if limit > 0 and quiet >= limit and (not cfg.hang_auto or silent >= limit):
            return hung(draft, mem, quiet, silent if cfg.hang_auto else None)
        early = early_maintenance(draft, mem, probes)
        if early is not None:
            return early
    return draft.out(mem, "running", f"attempt {n} running on {len(alive)} worker(s) for "
                                     f"{human(secs(draft.now - start))}; {_ckpt_text(draft.obs.checkpoint, draft.now)}")


def unseen(draft: Draft, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision:
    """The journal says attempt n was launched, but no worker shows it."""
    n, node = mem.attempt.number, draft.obs.node
    assert node is not None
    older = [p for p in probes if p.state == "running"]
    if older:
        return draft.out(mem, "stale_workers", f"workers {worker_list(older)} still run an older attempt; "
                                               f"stopping them before attempt {n}", StopWorkers("older attempt still running"))
    refused = [p for p in probes if p.login_refused]
    if refused:
        return login_refused(draft, mem, refused)
    unreachable = [p for p in probes if p.state == "unreachable"]
    if unreachable:
        return draft.out(mem, "workers_unreachable", f"cannot reach workers {worker_list(unreachable)}; "
                                                     f"attempt {n} not confirmed", Wait(None, "workers unreachable"))
    pre = draft.obs.precheck
    if pre is not None and pre.context == "launch" and pre.failing:
        if pre.fixable and not draft.obs.precheck_fixed:
            return fix_environment(draft, mem, pre)
        # The environment, not the job, is why the attempt left no trace: end it uncharged,
        # and the next launch waits for the node (precheck_wait).
        mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, [
            Evidence(draft.now, f"environment check {i.check} failed on worker {i.worker}") for i in pre.failing])))
        return end_usable(draft, mem, {p.worker: None for p in probes},
                          detail="the environment checks failed: " + "; ".join(i.line() for i in pre.failing[:3]))
    if mem.attempt.launch_tries < draft.cfg.launch_tries:
        if hold := held(draft, mem):
            return hold
        mem = replace(mem,
                      attempt=replace(mem.attempt, launch_tries=mem.attempt.launch_tries + 1,
                                      start=draft.now, node_id=node.id))
        why = (f"attempt {n} left no trace on the workers; launching it again "
               f"(try {mem.attempt.launch_tries} of {draft.cfg.launch_tries})")
        return draft.out(mem, "launch_unseen", why, Launch(n, draft.obs.checkpoint, why))
    return end_usable(draft, mem, {p.worker: None for p in probes},
                      detail=f"it never started on any worker after {mem.attempt.launch_tries} launches")


def idle(draft: Draft, mem: Memory) -> Decision:
    node, probes, now = draft.obs.node, draft.obs.probes or (), draft.now
    assert node is not None
    running = [p for p in probes if p.state == "running"]
    if running:
        top = max(p.attempt or 0 for p in running)
        if top > mem.attempt.number:
            mem = _follow(draft, mem, top, now, _step(draft))
            return draft.out(mem, "adopt_running", f"workers {worker_list(running)} run attempt {top}, which the "
                                                   "journal did not record; following it (no second launch)")
        last = mem.budgets.last_end
        # Followed again only on the node it was launched on: a multislice attempt whose slices
        # changed (one left out while the job limps, or taken back) cannot go on without them
        if (last is not None and last.attempt == top == mem.attempt.number and last.outcome == Outcome.DISRUPTION.value
                and last.node_id == node.id and all(p.state == "running" and p.attempt == top for p in probes)):
            mem = _follow(draft, mem, top, last.start, last.start_step)
            return draft.out(mem, "survived", f"every worker still runs attempt {top} after the disruption; "
                                              "following it again")
        return draft.out(mem, "stale_workers", f"workers {worker_list(running)} still run attempt {top}; stopping "
                                               "them before the next launch", StopWorkers("old attempt still running"))
    if node.pending_stop:
        return draft.out(mem, "pending_stop_hold", f"node {node.name} is gracefully shutting down (a Compute Engine "
                                                   "stop's notice, shutdownDetails PENDING_STOP): not launching "
                                                   "there; it is waited for until it stops", Wait(None, "node about to stop"))
    last = mem.budgets.last_end
    if (mem.maintenance.notice_hold is not None and now < mem.maintenance.notice_hold and last is not None
            and last.node_id == node.id and not maintained_since(node, last.start)):
        return draft.out(mem, "notice_hold", f"attempt {last.attempt} ended on a maintenance or preemption notice: "
                                             f"node {node.name} is about to stop; not launching there until it "
                                             f"has gone down and come back, or {human(secs(mem.maintenance.notice_hold - now))}",
                         Wait(mem.maintenance.notice_hold, "node about to stop"))
    hold = report_hold(draft, mem)
    if hold is not None:
        return hold
    if mem.budgets.backoff_until is not None and now < mem.budgets.backoff_until:
        return draft.out(mem, "backoff", f"backoff: attempt {mem.attempt.number + 1} starts in "
                                         f"{human(secs(mem.budgets.backoff_until - now))} ({mem.budgets.restarts} charged restarts)",
                         Wait(mem.budgets.backoff_until, "backoff between charged restarts"))
    refused = [p for p in probes if p.login_refused]
    if refused:
        return login_refused(draft, mem, refused)
    unreachable = [p for p in probes if p.state == "unreachable"]
    if unreachable:
        return draft.out(mem, "workers_unreachable", f"cannot reach workers {worker_list(unreachable)}; launching "
                                                     "only when every worker answers", Wait(None, "workers unreachable"))
    if hold := held(draft, mem):
        return hold
    checked = prechecked(draft, mem)
    if checked is not None:
        return checked
    n = max([mem.attempt.number, *(p.attempt or 0 for p in probes)]) + 1
    ckpt = draft.obs.checkpoint
    mem = move(mem, Phase.RUNNING,
               attempt=replace(mem.attempt, number=n, start=now, node_id=node.id, start_step=_step(draft),
                               seen=False, launch_tries=0, evidence=(), unreachable_since=None, end_seen=None),
               budgets=replace(mem.budgets, backoff_until=None),
               repair=replace(mem.repair, env_failing_since=None),
               maintenance=replace(mem.maintenance, notice_hold=None))
    why = f"launching attempt {n} from {_ckpt_text(ckpt, now)}"
    return draft.out(mem, "launch", f"{why} on node {node.id}", Launch(n, ckpt, why))


def launch_rest(draft: Draft, mem: Memory, missing: list[WorkerProbe], unreachable: list[WorkerProbe]) -> Decision:
    """Attempt n runs on some workers and never reached the others (row `launch_partial`).

    Launch it again (the workers that run it answer "running"; the others start it) from the
    checkpoint it started from, launch_tries times; never charged to the job. Only when every
    worker answers and none of the others still runs an older attempt: a launch there would
    start n beside it. An unreachable worker is waited for up to unreachable_grace; an older
    attempt still running, a newest checkpoint that is no longer the one n started from (the
    workers would resume from different steps), or tries spent: end n uncharged instead (its
    end stops every worker), and the next attempt starts everywhere from the newest."""
    n, ckpt, cfg, now = mem.attempt.number, draft.obs.checkpoint, draft.cfg, draft.now
    where = f"attempt {n} never reached workers {worker_list(missing)} (a launch cut short)"
    if unreachable:
        since = mem.attempt.unreachable_since or now
        if secs(now - since) < cfg.unreachable_grace:
            until = since + timedelta(seconds=cfg.unreachable_grace)
            return draft.out(replace(mem,
                                     attempt=replace(mem.attempt, unreachable_since=since)), "unreachable_grace",
                             f"{where}; cannot reach workers {worker_list(unreachable)}: launching there only "
                             f"when every worker answers, ending it at {until.isoformat()} if it stays so",
                             Wait(until, "unreachable worker"))
        where = f"{where}; workers {worker_list(unreachable)} unreachable for {human(secs(now - since))}"
    older = [p for p in missing if p.state == "running"]
    if older:
        where = f"{where}; workers {worker_list(older)} still run an older attempt"
    same = (ckpt.step if ckpt is not None else None) == mem.attempt.start_step
    if same and not unreachable and not older and mem.attempt.launch_tries < cfg.launch_tries:
        if hold := held(draft, mem):
            return hold
        mem = replace(mem,
                      attempt=replace(mem.attempt, launch_tries=mem.attempt.launch_tries + 1,
                                      unreachable_since=None))
        why = f"{where}; launching it there (try {mem.attempt.launch_tries} of {cfg.launch_tries})"
        return draft.out(mem, "launch_partial", why, Launch(n, ckpt, why))
    sign = Evidence(now, where)
    mem = replace(mem,
                  attempt=replace(mem.attempt, seen=True, evidence=merge_evidence(mem.attempt.evidence, [sign])))
    return end_usable(draft, mem, {p.worker: None for p in missing}, detail=where)


def login_refused(draft: Draft, mem: Memory, refused: list[WorkerProbe]) -> Decision:
    """Workers refuse the login before anything runs there. Soon after a boot that is the
    keys not installed yet (the guest agent adds them after sshd listens); later, the user or
    the key is wrong and no wait will fix it."""
    node, cfg, now = draft.obs.node, draft.cfg, draft.now
    assert node is not None
    boot = boot_time(node, mem)
    since = secs(now - boot) if boot is not None else None
    if since is not None and since < cfg.login_grace:
        until = boot + timedelta(seconds=cfg.login_grace) if boot is not None else now
        return draft.out(mem, "keys_not_there_yet",
                         f"workers {worker_list(refused)} refuse the login {human(max(0.0, since))} after the node "
                         f"booted: keys not there yet (they reach a new VM after sshd listens); launching "
                         f"nothing, looking again until {until.isoformat()} (ssh.login_grace)",
                         Wait(None, "keys not there yet"))
    when = f"{human(since)} after the node booted" if since is not None else "and the node's boot time is unknown"
    detail = refused[0].detail
    reason = (f"workers {worker_list(refused)} still refuse the login {when} (ssh.login_grace "
              f"{human(cfg.login_grace)}): {detail}")
    return draft.halt(mem, "login_refused", reason, tuple(p.detail for p in refused[:4]))


def _step(draft: Draft) -> int | None:
    return draft.obs.checkpoint.step if draft.obs.checkpoint is not None else None


def _follow(draft: Draft, mem: Memory, attempt: int, start: datetime, step: int | None) -> Memory:
    node = draft.obs.node
    assert node is not None
    return move(mem, Phase.RUNNING,
                attempt=replace(mem.attempt, number=attempt, start=start, node_id=node.id, start_step=step,
                                seen=True, launch_tries=0, evidence=(), unreachable_since=None, end_seen=None),
                budgets=replace(mem.budgets, backoff_until=None))


def prechecked(draft: Draft, mem: Memory) -> Decision | None:
    """Before a launch: None when the environment checks pass (or were not run), else the
    decision for a failing environment. Never charged: the node is at fault, not the job."""
    pre, now, cfg = draft.obs.precheck, draft.now, draft.cfg
    if pre is None or pre.context != "launch":
        return None
    if pre.unreachable:
        workers = ", ".join(str(w) for w, _ in pre.unreachable)
        return draft.out(mem, "workers_unreachable", f"cannot reach workers {workers} to check them; launching "
                                                     "only when every worker answers", Wait(None, "workers unreachable"))
    mem = count_checks(draft, mem, pre)
    failing = pre.failing
    if not failing:
        if mem.repair.env_failing_since is not None:
            draft.notes.append("the environment checks pass again")
            mem = replace(mem, repair=replace(mem.repair, env_failing_since=None))
        return None
    if pre.fixable and not draft.obs.precheck_fixed:
        return fix_environment(draft, mem, pre)
    if (moved := spares.bad_spare(draft, mem, failing)) is not None:
        return moved
    lines = tuple(i.line() for i in failing)
    shown = "; ".join(lines[:4]) + (f"; and {len(lines) - 4} more" if len(lines) > 4 else "")
    since = mem.repair.env_failing_since or now
    waited = secs(now - since)
    if waited < cfg.repair_timeout:
        until = since + timedelta(seconds=cfg.repair_timeout)
        why = f"environment checks fail: {shown}"
        mem = move(mem, Phase.WAITING_NODE, reason=why, repair=replace(mem.repair, env_failing_since=since))
        line = (f"{why}; not launching, not charged; waiting for the node to be fixed until {until.isoformat()} "
                f"(recovery.repair_timeout {human(cfg.repair_timeout)})")
        wait = Wait(until, "environment checks fail")
        # Checks that keep finding one worker's TPU devices missing point at its host: reported
        # (or told) once, inside this wait; the wait still counts from the first failing check, so
        # a repair that does not bring the devices back is recreated at repair_timeout as before.
        bad = checks_bad_host(draft, mem, pre)
        if bad is None:
            return draft.out(mem, "precheck_wait", line, wait)
        mem, row, acts, said = bad
        return draft.out(mem, row, f"{line}; {said}", *acts, wait)
    why = (f"environment checks failing for {human(waited)}, longer than recovery.repair_timeout "
           f"({human(cfg.repair_timeout)}): {shown}")
    mem = replace(mem, repair=replace(mem.repair, env_failing_since=since))
    node = draft.obs.node
    assert node is not None
    if not (node.owned_by(cfg.job) or draft.obs.adopt):
        return draft.halt(mem, "precheck_needs_person",
                          f"{why}; not owned: will not delete {node.name} (label {OWNER_LABEL}={cfg.job} "
                          "missing; pass --adopt to let tpuwatch recreate it); fix the workers and the job "
                          "resumes", lines)
    return recreate(draft, mem, "precheck_recreate", why)


def fix_environment(draft: Draft, mem: Memory, pre: PrecheckReport) -> Decision:
    """Orphan device holders and a stale libtpu lockfile: the worker cleanup fixes them; the
    tick then checks again in the same tick (Observation.precheck_fixed) before launching."""
    shown = "; ".join(i.line() for i in pre.failing[:4])
    why = f"environment checks found what tpuwatch can fix: {shown}"
    return draft.out(mem, "precheck_fix", f"{why}; cleaning up the workers, then checking again (not charged)",
                     StopWorkers(f"fix before the launch: {shown}"))
