"""A hung attempt: every worker runs, but no checkpoint comes (recovery.hang_timeout), the logs
stay silent far longer than the job has shown (policy/cadence.py), or the runtime says so in a
worker's log (policy/signatures.py).

Rows `hung`, `log_silent`, `log_hang`, `log_crash`, `log_dirty_host` (and, when the same worker's
attempts keep ending dirty, policy/faulty.py's); docs/policy.md says how
"auto" learns the job's checkpoint interval and log cadence.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from tpuwatch.durations import human
from tpuwatch.model import WorkerProbe
from tpuwatch.policy.cadence import LOG_FACTOR, LOG_FLOOR
from tpuwatch.policy.draft import Draft, secs, worker_exits
from tpuwatch.policy.ending import disrupted, ended_now, finish
from tpuwatch.policy.faulty import bad_host, count_dirty
from tpuwatch.policy.signatures import find
from tpuwatch.policy.state import Evidence, Memory, Phase, merge_evidence
from tpuwatch.policy.values import Decision, PolicyConfig, Wait

# hang_timeout = "auto": never judge a hang sooner than this, whatever the checkpoint interval
# (a job that saves every 5 minutes may still pause for an evaluation); and the workers' log
# growth is recorded at most this often.
HANG_AUTO_FLOOR = 30 * 60.0
LOG_GRAIN = 10 * 60.0
HUNG = "hung: no new checkpoint"  # how a hung attempt's reason begins (after "attempt <n>: ")
HUNG_SAID = "hung: the runtime says so"  # how the reason of an attempt a runtime signature called hung begins
DIRTY = "dirty host"  # how the end of an attempt whose worker could not open its TPU is told


def effective_hang_limit(cfg: PolicyConfig, mem: Memory, from_start: bool = False) -> float:
    """How long without a checkpoint makes an attempt hung (from its start when `from_start`,
    else from its newest checkpoint); 0 = not judged (off, or "auto" before it has seen the
    job's checkpoint interval). With "auto" the logs must also have been silent that long."""
    if not cfg.hang_auto:
        return cfg.hang_timeout
    gap = mem.hang.ckpt_gap
    if gap <= 0:
        return 0.0
    base = (max(mem.hang.ckpt_first, gap) + 2 * gap) if from_start else 3 * gap
    return max(HANG_AUTO_FLOOR, base)


def progress_quiet(draft: Draft, mem: Memory, start: datetime) -> tuple[Memory, float, bool]:
    """Seconds since the attempt last showed progress, and whether that is since its start.

    Progress is its newest checkpoint when newer than the one it resumed from (the
    checkpoint's own time when the store gives one, else when a tick first saw it). Each
    new one also teaches the memory the job's checkpoint interval (for "auto")."""
    ckpt, now, since = draft.obs.checkpoint, draft.now, start
    if ckpt is not None and (mem.attempt.start_step is None or ckpt.step > mem.attempt.start_step):
        this_attempt = mem.hang.progress_at is not None and mem.hang.progress_at >= start
        if mem.hang.progress_step != ckpt.step or not this_attempt:
            seen = ckpt.time if ckpt.time is not None else now
            hang = mem.hang
            if this_attempt and hang.progress_time is not None and (hang.progress_step or 0) < ckpt.step:
                hang = replace(hang, ckpt_gap=max(hang.ckpt_gap, secs(seen - hang.progress_time)))
            elif not this_attempt:
                hang = replace(hang, ckpt_first=max(hang.ckpt_first, secs(seen - start)))
            mem = replace(mem, hang=replace(hang, progress_step=ckpt.step, progress_at=now, progress_time=seen))
        seen = mem.hang.progress_time or mem.hang.progress_at or since
        since = max(since, seen)
    return mem, max(0.0, secs(now - since)), since == start


def log_silence(draft: Draft, mem: Memory, start: datetime) -> tuple[Memory, float]:
    """Seconds the attempt's workers have written no output (0 when a size is unknown).

    The growth is recorded at most every LOG_GRAIN: the silence can be underestimated by
    that much, never overestimated, and the memory does not change on every tick."""
    sizes = [p.log_bytes for p in draft.obs.probes or ()]
    if not sizes or any(b is None for b in sizes):
        return mem, 0.0
    total, now = sum(b for b in sizes if b is not None), draft.now
    first = mem.hang.log_at is None or mem.hang.log_at < start or mem.hang.log_bytes is None or total < mem.hang.log_bytes
    if first or (total != mem.hang.log_bytes and secs(now - mem.hang.log_at) >= LOG_GRAIN):  # type: ignore[operator]
        mem = replace(mem, hang=replace(mem.hang, log_bytes=total, log_at=now))
    assert mem.hang.log_at is not None
    return mem, max(0.0, secs(now - mem.hang.log_at))


def hung(draft: Draft, mem: Memory, quiet: float, silent: float | None) -> Decision:
    """Every worker runs, yet no checkpoint for hang_timeout: stop it, charged (row `hung`)."""
    why = f"{HUNG} for {human(quiet)}"
    if silent is None:
        setting = f"recovery.hang_timeout {human(draft.cfg.hang_timeout)}"
    else:
        why += f" and no output for {human(silent)}"
        setting = (f"recovery.hang_timeout auto: 3x the {human(mem.hang.ckpt_gap)} checkpoint interval seen, "
                   f"at least {human(HANG_AUTO_FLOOR)}")
    mem, line, final = finish(
        draft, mem, {}, reachable=True, hung=f"{why} while every worker ran ({setting})")
    if final is not None:
        return final
    wait = (Wait(mem.budgets.backoff_until, "backoff before the next attempt")
            if mem.phase is Phase.BACKOFF else None)
    return draft.out(mem, "hung", line, *([wait] if wait else []))


def log_silent(draft: Draft, mem: Memory, quiet: float, age: float) -> Decision:
    """Past its first checkpoint, the attempt's logs have been silent far longer than the job
    has ever been (policy/cadence.py), and no checkpoint came either: stop it, charged."""
    why = (f"{HUNG} for {human(quiet)} and no output for {human(age)} while every worker ran "
           f"(recovery.hang_timeout auto: {LOG_FACTOR:g}x the longest silence the job has shown, "
           f"{human(mem.hang.log_gap)}, at least {human(LOG_FLOOR)})")
    return ended_now(draft, mem, "log_silent", {}, hung=why)


def signature(draft: Draft, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision | None:
    """A worker's log of this attempt shows a known runtime signature (policy/signatures.py):
    end the attempt at once as its kind says (rows `log_hang`, `log_crash`,
    `log_dirty_host`); None when none does, or worker 0 exited 0 (done is done)."""
    n, cfg = mem.attempt.number, draft.cfg
    codes = worker_exits(probes, n)
    if codes.get(cfg.primary_worker) == 0:
        return None
    for p in probes:
        sig = find(p.log_match, cfg.log_signatures) if p.attempt == n and p.log_match else None
        if sig is None:
            continue
        what = f"{sig.name} in worker {p.worker}'s log: {p.log_match[:200]}"
        if sig.kind == "hang" and not disrupted(draft, mem, codes):
            return ended_now(draft, mem, "log_hang", codes, hung=f"{HUNG_SAID} ({what})")
        if sig.kind in ("hang", "crash"):
            # a multislice job's other slices hang (and say so) when one slice goes away:
            # with disruption evidence the end is classified as the disruption it is
            return ended_now(draft, mem, f"log_{sig.kind}", codes, detail=what)
        # dirty_host: uncharged unless the attempt before ended the same way (then the
        # cleanup did not help: charged, so a host that stays dirty cannot loop for ever)
        last = mem.budgets.last_end
        again = last is not None and last.attempt == n - 1 and DIRTY in last.reason
        mem = count_dirty(mem, p.worker, n)
        if again:
            return dirty_again(draft, mem, codes, p.worker, what)
        sign = Evidence(draft.now, f"{DIRTY}: {what}")
        signed = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, [sign])))
        return ended_now(draft, signed, "log_dirty_host", codes)
    return None


def dirty_again(draft: Draft, mem: Memory, codes: dict[int, int | None], worker: int, what: str) -> Decision:
    """A dirty-host end right after another: charged (the cleanup did not help); when the same
    worker's attempts keep ending so, its host is reported or a person is told (policy/faulty.py)."""
    mem, line, final = finish(draft, mem, codes, reachable=True, detail=f"{DIRTY} again: {what}")
    if final is not None:
        return final
    wait = (Wait(mem.budgets.backoff_until, "backoff before the next attempt"),) if mem.phase is Phase.BACKOFF else ()
    bad = bad_host(draft, mem, worker, what)
    if bad is None:
        return draft.out(mem, "log_dirty_host", line, *wait)
    mem, row, acts, said = bad
    return draft.out(mem, row, f"{line}; {said}", *acts, *wait)
