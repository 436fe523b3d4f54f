"""The seeded fault trace of the goodput benchmark: what goes wrong, when, for how long.

A trace is plain data — fault times and durations, stockout windows — drawn once from a seed and
then replayed identically under every tool, so the tools differ only in how they react. Counts
are given per 30 days and scaled to the run's length; times are uniform over the run (the first
and last hour excepted); repair and stockout durations are log-normal.

The distributions are assumptions, not measurements: Google publishes no repair-time or
stockout-length figures. They are parameters so that a reader can try their own.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

# Fault kinds in report order; "bug" is the code push after which every launch exits 1.
KINDS = ("maintenance", "stuck", "preemption", "crash", "hang")
# Announced maintenance (all heal): "scheduled" and "unscheduled" may be started early
# (canReschedule; a window days or hours ahead), "notice" gives only the ~60 s termination notice.
ANNOUNCED = ("scheduled", "unscheduled", "notice")
STUCK_MODES = ("REPAIRING", "UNKNOWN")


@dataclass(frozen=True)
class Fault:
    time: float
    kind: str  # one of KINDS, or "bug"
    heal_after: float | None = None  # maintenance: repair time
    stuck: str = "REPAIRING"  # stuck: the state the node stays in
    worker: int = 0  # crash: the worker that exits 139
    lead: float = 0.0  # announced maintenance: announced this long before `time` (its window start)
    slice: int = 0  # the slice it strikes (Multislice)


@dataclass(frozen=True)
class TraceConfig:
    """How many faults of each kind per 30 days, and the duration distributions (seconds)."""

    maintenance: float = 8.0  # maintenance events that heal
    stuck: float = 2.0  # maintenance events that never heal
    preemptions: float = 4.0  # spot preemptions
    stockout_after_preemption: float = 0.75  # chance the zone has no capacity after one
    stockouts: float = 2.0  # other stockout windows (creates fail inside them)
    crashes: float = 4.0  # one worker exits 139 once
    hangs: float = 2.0  # every worker stops progressing, processes alive
    bug_at: float | None = 0.9  # the buggy code is pushed at this fraction of the run; None: never
    heal_median: float = 600.0
    heal_sigma: float = 0.6
    stockout_median: float = 2400.0
    stockout_sigma: float = 0.8
    # announced maintenance per 30 days (0: none, and the trace is drawn as without them)
    scheduled: float = 0.0
    unscheduled: float = 0.0
    notice_only: float = 0.0
    scheduled_lead: float = 7 * 86400.0  # SCHEDULED: about 7 days' notice
    unscheduled_lead: float = 86400.0  # UNSCHEDULED: less


@dataclass(frozen=True)
class Trace:
    seed: int
    horizon: float
    faults: tuple[Fault, ...]
    stockouts: tuple[tuple[float, float], ...]
    # Idle same-shape slices drawn beside the job's (their faults' `slice` is `slices` and up):
    # a tool without spares never sees them (lab.goodput skips their faults).
    spares: int = 0

    def count(self, kind: str) -> int:
        return sum(1 for f in self.faults if f.kind == kind)


def _count(rng: random.Random, per_30_days: float, days: float) -> int:
    """per_30_days scaled to `days`; the fraction left over is a coin toss."""
    x = per_30_days * days / 30.0
    n = int(math.floor(x))
    return n + (1 if rng.random() < x - n else 0)


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def make_trace(seed: int, days: float, workers: int, tc: TraceConfig | None = None, slices: int = 1,
               spares: int = 0) -> Trace:
    """The fault trace for `seed`: the same arguments always give the same trace.

    With `slices` > 1 every slice has faults of its own at the same rates, so the job sees
    `slices` times as many: slice 0's are the single-slice trace of `seed`, slice i's are drawn
    from a source of its own, without the zone's own stockout windows and the code push, which
    the single-slice trace already holds once for the whole job (a preemption's stockout is
    drawn with it, on every slice).

    `spares` idle slices of the same shape get faults of their own too, drawn as slices
    `slices`..`slices + spares - 1` would be (so the job's slices' faults are the same with or
    without spares), at the same rates: a spare is preempted, maintained or stuck like any slice.
    Their preemptions bring no stockout window: the zone's capacity is the job's trace's, so a way
    with spares is compared with the fixed slices in the same zone.
    """
    tc = tc or TraceConfig()
    base = _slice_trace(random.Random(seed), days, workers, tc)
    faults = list(base.faults)
    stockouts = list(base.stockouts)
    for i in range(1, slices + spares):
        more = _slice_trace(random.Random(f"{seed}/slice/{i}"), days, workers,
                            replace(tc, stockouts=0.0, bug_at=None))
        faults += [replace(f, slice=i) for f in more.faults]
        if i < slices:
            stockouts += more.stockouts
    faults.sort(key=lambda f: (f.time, f.kind, f.slice))
    return Trace(seed, base.horizon, tuple(faults), tuple(sorted(stockouts)), spares)


def _slice_trace(rng: random.Random, days: float, workers: int, tc: TraceConfig) -> Trace:
    """One slice's faults (and the stockout windows they bring) drawn from `rng`."""
    horizon = days * 86400.0
    lo, hi = min(3600.0, horizon / 10), max(horizon - 3600.0, horizon * 0.9)

    def when() -> float:
        return rng.uniform(lo, hi)

    faults: list[Fault] = []
    stockouts: list[tuple[float, float]] = []
    for _ in range(_count(rng, tc.maintenance, days)):
        faults.append(Fault(when(), "maintenance", heal_after=_lognormal(rng, tc.heal_median, tc.heal_sigma)))
    for _ in range(_count(rng, tc.stuck, days)):
        faults.append(Fault(when(), "stuck", stuck=rng.choice(STUCK_MODES)))
    for _ in range(_count(rng, tc.preemptions, days)):
        t = when()
        faults.append(Fault(t, "preemption"))
        if rng.random() < tc.stockout_after_preemption:
            stockouts.append((t, t + _lognormal(rng, tc.stockout_median, tc.stockout_sigma)))
    for _ in range(_count(rng, tc.stockouts, days)):
        t = when()
        stockouts.append((t, t + _lognormal(rng, tc.stockout_median, tc.stockout_sigma)))
    for _ in range(_count(rng, tc.crashes, days)):
        faults.append(Fault(when(), "crash", worker=rng.randrange(max(1, workers))))
    for _ in range(_count(rng, tc.hangs, days)):
        faults.append(Fault(when(), "hang"))
    if tc.bug_at is not None:
        faults.append(Fault(tc.bug_at * horizon, "bug"))
    # Drawn last, and only when asked for, so a trace without them is the same as before.
    for kind, rate, lead in (("scheduled", tc.scheduled, tc.scheduled_lead),
                             ("unscheduled", tc.unscheduled, tc.unscheduled_lead),
                             ("notice", tc.notice_only, 0.0)):
        if rate > 0:
            for _ in range(_count(rng, rate, days)):
                faults.append(Fault(when(), kind, heal_after=_lognormal(rng, tc.heal_median, tc.heal_sigma),
                                    lead=lead))
    faults.sort(key=lambda f: (f.time, f.kind))
    return Trace(0, horizon, tuple(faults), tuple(sorted(stockouts)))


def make_bug_trace(days: float, push_at: float = 0.5, heal_after: float = 600.0, spares: int = 0) -> Trace:
    """The permanent bug alone: the buggy code is pushed at `push_at` of the run, and a
    maintenance that heals an hour later makes every tool relaunch the job (and meet the bug);
    `spares` idle slices beside the job's, with no fault of their own."""
    horizon = days * 86400.0
    t = push_at * horizon
    faults = (Fault(t, "bug"), Fault(t + 3600.0, "maintenance", heal_after=heal_after))
    return Trace(-1, horizon, faults, (), spares)
