"""The job's log cadence: how long it may stay silent, learned from its own output.

hang_timeout = "auto" (row `log_silent`): each probe reports how long ago the attempt's log was
last written (`WorkerProbe.log_age`, by the worker's own clock, so no skew). A silence that
ends (the log is written again) teaches the job's cadence (`Memory.hang.log_gap`, the longest seen),
but only once the attempt has saved its first checkpoint: the start of an attempt (restoring,
the first compile, the first save) is never judged by the logs, nor learned from, so a long
first compile is never taken for a hang. A checkpoint save is silent too, and the first one ends
after that checkpoint is seen, so the job's saves are learned before they are judged. Nothing is
judged before the job has shown a whole checkpoint interval (`Memory.hang.ckpt_gap`), so that every
kind of silence it has between two checkpoints has been seen once (a job that logs in bursts
every 15 minutes is not stopped at its first 15-minute silence).

A silence of max(LOG_FLOOR, LOG_FACTOR x the longest silence learned), with no new checkpoint
in that time either, is a hang. A job that logs every minute is stopped after ten minutes of
silence; one that has been silent 15 minutes while saving is stopped only after 45.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.model import WorkerProbe
from tpuwatch.policy.state import Memory

# Never judge a silence shorter than this (an unusual pause the job has not shown yet: a slow
# data shard, an evaluation), nor shorter than LOG_FACTOR times the longest it has shown.
LOG_FLOOR = 10 * 60.0
LOG_FACTOR = 3.0
# A silence shorter than this never moves the limit off its floor: it is learned as this long, so
# the memory of a job that logs often stops changing once it has shown its cadence.
SHORT = LOG_FLOOR / LOG_FACTOR
# Output newer than the write known by less than this is the same write (the workers give whole
# seconds).
SAME_WRITE = 1.5


def log_age(probes: Sequence[WorkerProbe], attempt: int) -> float | None:
    """Seconds since any worker of `attempt` last wrote to its log; None when one does not say."""
    ages = [p.log_age for p in probes if p.attempt == attempt and p.state == "running"]
    if not ages or any(a is None for a in ages):
        return None
    return min(float(a) for a in ages if a is not None)


def learn(mem: Memory, age: float | None, now: datetime, start: datetime, warm: bool, poll: float) -> Memory:
    """Memory after a tick that saw the attempt (launched at `start`) last write `age` seconds ago.

    `warm`: the attempt has saved a checkpoint of its own (its start is over); only then is a
    silence that ended learned. It is learned as at most the longest a tick saw it plus one poll
    (a watcher stopped for an hour does not take that hour for the job's cadence), and at most
    the time between the two writes the ticks saw, and at least SHORT.
    """
    if age is None:
        return mem
    wrote = now - timedelta(seconds=age)
    last = mem.hang.log_last
    if last is None or last < start or wrote < last - timedelta(seconds=SAME_WRITE):
        # this attempt's first sight (or a new log)
        return replace(mem, hang=replace(mem.hang, log_last=wrote, log_peak=age))
    if wrote <= last + timedelta(seconds=SAME_WRITE):
        return replace(mem, hang=replace(mem.hang, log_peak=age)) if age > mem.hang.log_peak else mem
    gap = min((wrote - last).total_seconds(), mem.hang.log_peak + poll)
    learned = max(mem.hang.log_gap, gap, SHORT) if warm else mem.hang.log_gap
    return replace(mem, hang=replace(mem.hang, log_last=wrote, log_peak=age, log_gap=learned))


def silent_limit(mem: Memory) -> float:
    """How long a silence makes a warm attempt hung; 0 = not judged: no cadence learned yet, or
    the job has not yet shown a whole checkpoint interval (`hang.ckpt_gap`), so not yet every kind of
    silence it has between two checkpoints."""
    if mem.hang.log_gap <= 0 or mem.hang.ckpt_gap <= 0:
        return 0.0
    return max(LOG_FLOOR, LOG_FACTOR * mem.hang.log_gap)
