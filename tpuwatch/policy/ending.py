"""Ending an attempt: classify it, charge or refund it, and say what follows (done, failed, a
relaunch at once or after a backoff).

`finish` is where every end goes: it updates the budgets and streaks and stops the workers. An
end seen on a node that looks usable may wait one tick for the node's next read when charging
it would end the job (`confirm_end`, row `end_confirm`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.policy.backoff import next_level, restart_delay
from tpuwatch.policy.budgets import CHARGED_END, NO_PROGRESS, RESTARTS
from tpuwatch.policy.classify import (
    OUTCOMES,
    STOP_CODES,
    AttemptFacts,
    Outcome,
    Verdict,
    classify,
    describe_exit,
    is_notice,
)
from tpuwatch.policy.draft import Draft, secs, worker_exits
from tpuwatch.policy.state import AttemptEnd, Memory, Phase, move
from tpuwatch.policy.values import Decision, MarkDone, StopWorkers, Wait

# After a notice ended an attempt, the node is about to stop (Compute Engine gives about 60 s
# before maintenance, 30 s before a preemption): launch there again only once it went down and
# came back, or after this long if it never went down.
NOTICE_HOLD = 5 * 60.0
# An end that would be charged, seen with no exit code of the job's own (its process vanished, or
# SIGKILL/SIGTERM ended it), is charged at once and the job relaunched at once; a node read this
# long after it that shows a host going away (the API may report it after the processes died)
# refunds it. The relaunch comes in the tick that saw the end; the tick after it (a sixth of a
# poll later at most) reads the node after the sighting, and at the defaults one more follows
# within the window.
END_CONFIRM_WINDOW = 60.0
# An end after a SIGTERM tpuwatch did not send (the guest shutting down) waits this long from its
# first sighting, with the node and the audit log read again at its end, before it is judged
# with nothing to explain it: the API shows the VM stopping a moment after the guest's TERM.
TERM_CONFIRM = 10.0


def finish(
    draft: Draft, mem: Memory, codes: dict[int, int | None], reachable: bool, detail: str = "", hung: str = "",
    unsure: bool = False,
) -> tuple[Memory, str, Decision | None]:
    """End the running attempt: classify it, update the counters.

    Returns the memory (IDLE after a disruption, BACKOFF after a charged failure), a line
    for people, and a Decision when the job is over (done, failed). `hung`: tpuwatch ends a
    live attempt that stopped making progress; a charged failure whatever the evidence, since
    evidence within evidence_window of the stop postdates a hang older than hang_timeout.
    `unsure`: no worker exited with a code of its own; a charge stays open to a refund for
    END_CONFIRM_WINDOW (`refund`).
    """
    cfg, now, n = draft.cfg, draft.now, mem.attempt.number
    start = mem.attempt.start
    assert start is not None  # checked in _check
    verdict = Verdict(Outcome.FAILURE, None, hung, ()) if hung else classify(
        AttemptFacts(start, now, codes, cfg.primary_worker, mem.attempt.evidence, seen=mem.attempt.end_seen),
        min_uptime=cfg.min_uptime, fail_fast=cfg.fail_fast_exit_codes, window=cfg.evidence_window,
    )
    cost = OUTCOMES[verdict.outcome]
    mem_evidence = mem.attempt.evidence
    ckpt = draft.obs.checkpoint
    end_step = ckpt.step if ckpt is not None else None
    progressed = made_progress(draft, mem)
    streak_added = cost.charged and not progressed
    confirm_by = now + timedelta(seconds=END_CONFIRM_WINDOW) if unsure and cost.charged else None
    reason = f"attempt {n}: {verdict.reason}" + (f" ({detail})" if detail else "")
    end = AttemptEnd(n, start, now, mem.attempt.node_id, mem.attempt.start_step, end_step,
                     verdict.outcome.value, cost.charged, verdict.exit_code, reason, streak_added)
    draft.ended.append(end)
    mem = replace(mem,
                  budgets=replace(mem.budgets, last_end=end, confirm_by=confirm_by,
                                  no_progress=0 if progressed else mem.budgets.no_progress + int(streak_added),
                                  disruptions=mem.budgets.disruptions + int(verdict.outcome is Outcome.DISRUPTION)),
                  attempt=replace(mem.attempt, evidence=(), unreachable_since=None, end_seen=None))
    if secs(now - start) >= cfg.stable_run:
        # A run this long shows the job and the node are sound: the budgets count trouble
        # since then, so a month-long spot job is not failed by its fourth preemption.
        mem = replace(mem, budgets=replace(mem.budgets, restarts=0, recreates=0))
    if reachable:
        stop_why = "job done: stopping the other workers" if verdict.outcome is Outcome.SUCCESS \
            else f"attempt {n} ended: stopping every worker"
        draft.actions.append(StopWorkers(stop_why, wait=False))
    if verdict.outcome is Outcome.SUCCESS:
        done = move(mem, Phase.DONE, reason=reason)
        return done, reason, draft.out(done, "success", f"job done: {reason}", MarkDone(reason))
    if verdict.outcome is Outcome.FAIL_FAST:
        return mem, reason, draft.fail(mem, "fail_fast", reason, verdict.evidence)
    if verdict.outcome is Outcome.DISRUPTION:
        noticed = any(is_notice(e) for e in mem_evidence)
        hold = now + timedelta(seconds=NOTICE_HOLD) if noticed else None
        return move(mem, Phase.IDLE,
                    maintenance=replace(mem.maintenance, notice_hold=hold)), f"{reason}; not charged", None
    # charged: failed start or failure
    since = f"step {mem.attempt.start_step}" if mem.attempt.start_step is not None else "no checkpoint"
    if (spent := CHARGED_END.spent(mem.budgets, cfg)) is not None:
        why = spent.why if spent.row != NO_PROGRESS.row else (
            f"{spent.used} attempts in a row ended with no checkpoint newer than {since} "
            f"(last: {hung or describe_exit(verdict.exit_code)}); a deterministic bug is not retried forever")
        return mem, why, draft.fail(mem, spent.row, why, (reason,))
    ran = secs(now - start)
    level = next_level(mem.budgets.backoff_level, ran, cfg.stable_run)
    delay = restart_delay(level, cfg.backoff_base, cfg.backoff_max, draft.obs.jitter)
    mem = move(mem, Phase.BACKOFF,
               budgets=replace(RESTARTS.charge(mem.budgets), backoff_level=level,
                               backoff_until=now + timedelta(seconds=delay)))
    when = f"relaunching in {human(delay)}" if delay else "relaunching now (the first charged restart since a stable run)"
    if confirm_by is not None:
        when += (f"; refunded if the node shows a host going away by {confirm_by.isoformat()} "
                 "(no worker exited with a code of its own)")
    return mem, f"{reason}; charged (restart {mem.budgets.restarts} of {cfg.max_restarts}), {when}", None


def confirm_term(draft: Draft, mem: Memory, codes: dict[int, int | None]) -> Decision | None:
    """An end after a SIGTERM tpuwatch did not send (row `term_confirm`): the guest's shutdown
    may reach the job before the metadata server's notice and before the API shows the VM
    stopping, and a job that saves on SIGTERM exits 0 then. Whatever the codes, while nothing
    explains it the end waits TERM_CONFIRM from its first sighting, so the node and the audit log
    are read again after it; None when it need not wait (no such SIGTERM, waited, or explained)."""
    termed = [p for p in draft.obs.probes or () if p.foreign_term and p.attempt == mem.attempt.number]
    seen = mem.attempt.end_seen
    if not termed or (seen is not None and secs(draft.now - seen) >= TERM_CONFIRM) or disrupted(draft, mem, codes):
        return None
    seen = seen or draft.now
    until = seen + timedelta(seconds=TERM_CONFIRM)
    return draft.out(replace(mem, attempt=replace(mem.attempt, end_seen=seen)), "term_confirm",
                     f"attempt {mem.attempt.number} ended after a SIGTERM tpuwatch did not send (worker "
                     f"{', '.join(str(p.worker) for p in termed)}): neither done nor charged yet; the node and "
                     f"the audit log are read again by {until.isoformat()} first (the guest's shutdown can come "
                     "before the API says the VM stops)",
                     Wait(until, "confirming how the attempt ended"))


def confirm_end(draft: Draft, mem: Memory, codes: dict[int, int | None]) -> Decision:
    """An end seen on a node that looks usable: end it now, and relaunch as its class says.

    This tick read the node before it probed the workers: a maintenance that began in
    between killed the job on a node this tick saw as healthy (and the API may report a
    host going away after its processes died). So when no worker exited with a code of its
    own, a charge is open to the node reads that follow (`refund`, END_CONFIRM_WINDOW): the
    next tick's read comes after this sighting, however soon, and a host going away then
    refunds it; the relaunch does not wait for them. Only a charge that would end the job
    (its restart budget or no-progress limit) waits one tick for that read first (row
    `end_confirm`): a job is never failed on an end its node may yet explain.
    """
    cfg = draft.cfg
    start = mem.attempt.start
    assert start is not None  # checked in _check
    termed = confirm_term(draft, mem, codes)
    if termed is not None:
        return termed
    own = codes.get(cfg.primary_worker) == 0 or any(
        c is not None and c != 0 and c not in STOP_CODES for c in codes.values())
    if own or mem.attempt.end_seen is not None:
        # after term_confirm's wait, an end with no code of its own stays open to a refund
        return end_usable(draft, mem, codes, unsure=not own)
    verdict = classify(AttemptFacts(start, draft.now, codes, cfg.primary_worker, mem.attempt.evidence),
                       min_uptime=cfg.min_uptime, fail_fast=cfg.fail_fast_exit_codes, window=cfg.evidence_window)
    if not OUTCOMES[verdict.outcome].charged:
        return end_usable(draft, mem, codes)
    if not ends_job(draft, mem, start):
        return end_usable(draft, mem, codes, unsure=True)
    return draft.out(replace(mem, attempt=replace(mem.attempt, end_seen=draft.now)), "end_confirm",
                     f"attempt {mem.attempt.number}: {verdict.reason}; nothing charged yet: charging it would end the "
                     "job, and a host taken down looks the same before the node says so, so the next tick "
                     "looks at the node again first",
                     Wait(None, "confirming how the attempt ended"))


def made_progress(draft: Draft, mem: Memory) -> bool:
    """The newest checkpoint is newer than the one the running attempt started from."""
    ckpt = draft.obs.checkpoint
    return ckpt is not None and (mem.attempt.start_step is None or ckpt.step > mem.attempt.start_step)


def ends_job(draft: Draft, mem: Memory, start: datetime) -> bool:
    """Charging the running attempt's end now would fail the job (as `finish` counts)."""
    streak = 0 if made_progress(draft, mem) else mem.budgets.no_progress + 1
    restarts = 0 if secs(draft.now - start) >= draft.cfg.stable_run else mem.budgets.restarts
    return CHARGED_END.spent(replace(mem.budgets, no_progress=streak, restarts=restarts), draft.cfg) is not None


def end_usable(draft: Draft, mem: Memory, codes: dict[int, int | None], detail: str = "", unsure: bool = False) -> Decision:
    mem, line, final = finish(draft, mem, codes, reachable=True, detail=detail, unsure=unsure)
    if final is not None:
        return final
    last = mem.budgets.last_end
    assert last is not None
    row = {Outcome.DISRUPTION.value: "notice_end" if mem.maintenance.notice_hold else "disruption",
           Outcome.FAILED_START.value: "failed_start"}.get(last.outcome, "failure")
    wait = (Wait(mem.budgets.backoff_until, "backoff before the next attempt")
            if mem.phase is Phase.BACKOFF else None)
    return draft.out(mem, row, line, *([wait] if wait else []))


def end_unusable(draft: Draft, mem: Memory) -> tuple[Memory, Decision | None]:
    """The node can no longer carry the attempt: end it (a disruption, or a success)."""
    if mem.phase is not Phase.RUNNING:
        return mem, None
    probes = draft.obs.probes or ()
    codes = worker_exits(probes, mem.attempt.number)
    node = draft.obs.node
    # a multislice job's slices that are still READY: the attempt is stopped there too
    reachable = node is not None and node.reachable and bool(probes)
    mem, line, final = finish(draft, mem, codes, reachable=reachable)
    if final is None:
        draft.notes.append(line)
    return mem, final


def disrupted(draft: Draft, mem: Memory, codes: dict[int, int | None]) -> bool:
    """The attempt's evidence explains its end now: a disruption, never charged."""
    start = mem.attempt.start
    assert start is not None  # checked in _check
    verdict = classify(AttemptFacts(start, draft.now, codes, draft.cfg.primary_worker, mem.attempt.evidence),
                       min_uptime=draft.cfg.min_uptime, fail_fast=draft.cfg.fail_fast_exit_codes,
                       window=draft.cfg.evidence_window)
    return verdict.outcome is Outcome.DISRUPTION


def ended_now(draft: Draft, mem: Memory, row: str, codes: dict[int, int | None], detail: str = "",
              hung: str = "") -> Decision:
    """End the running attempt now, stopping every worker, under `row` (the job's end when it is one)."""
    mem, line, final = finish(draft, mem, codes, reachable=True, detail=detail, hung=hung)
    if final is not None:
        return final
    wait = (Wait(mem.budgets.backoff_until, "backoff before the next attempt")
            if mem.phase is Phase.BACKOFF else None)
    return draft.out(mem, row, line, *([wait] if wait else []))
