"""Where a job's wall time went: the computation behind `tpuwatch report`, from the journal alone.

Rules of this module: no I/O and no clock (`now` comes in); it reads only the journal's rows
(JournalEvent, AttemptRow) and knows nothing of the cloud, SSH or the plotting library
(tpuwatch.ui.report_html draws the picture from what `compute` returns).

The categories follow Google's ML goodput measurement (productive time over wall time; program
start-up, checkpoint restore, progress wasted by a disruption and infrastructure recovery are the
losses), split further by what tpuwatch knows of each stretch of time:

- productive: an attempt's training that reached a checkpoint (or the end, for the attempt that
  finished or still runs);
- startup: an attempt's start-up and restore, from its launch to training at full pace, and the
  time before the job's first launch;
- lost: after the newest checkpoint of an attempt a disruption ended (redone by the next one);
- heal: after a disruption, waiting for the node to be usable again;
- recreate: deleting and creating the node, queued for capacity, and the new node's boot;
- hung: a hung attempt's time after its newest checkpoint, until tpuwatch stopped it;
- charged: a charged failure's time after its newest checkpoint, and the backoff after it;
- person: the node stopped by a person, or the job waiting for one.

Start-up is estimated, since the journal holds no step times: the job's pace (seconds per step) is
the median over pairs of checkpoints saved by one attempt, and an attempt's start-up is the time
to its first checkpoint less the steps it made meanwhile at that pace. An attempt that saved no
checkpoint is given the median start-up of those that did, unless it was charged (a failed
start is the failure's time, all of it). A checkpoint the journal saw only at
an attempt's end is taken as saved at the end (the least work lost it can have been).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from statistics import median
from typing import Any

from tpuwatch.durations import human
from tpuwatch.journal import AttemptRow, JournalEvent
from tpuwatch.policy.classify import describe_exit
from tpuwatch.policy.hang import HUNG, HUNG_SAID

# id -> label, in the order reports show them
CATEGORIES: dict[str, str] = {
    "productive": "productive training",
    "startup": "start-up and restore",
    "lost": "work lost since the last checkpoint",
    "heal": "waiting for the node to heal",
    "recreate": "recreating / queued",
    "hung": "hung",
    "charged": "charged failures",
    "person": "stopped by a person",
}
# category -> the buckets of Google's `ml-goodput-measurement` (0.2.3: its GoodputType and
# BadputType enums) that hold the same time, so the two reports compare line by line. That library
# counts any gap between a job's runs as infrastructure recovery and any restart as a disruption,
# and splits start-up by what the job logs; tpuwatch splits by what it saw the node do instead.
ML_GOODPUT_BUCKETS: dict[str, tuple[str, ...]] = {
    "productive": ("GoodputType.TOTAL",),
    "startup": ("BadputType.TPU_INITIALIZATION", "BadputType.TRAINING_PREP", "BadputType.PROGRAM_STARTUP",
                "BadputType.DATA_LOADING_SYNC", "BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"),
    "lost": ("BadputType.WASTED_PROGRESS_FROM_DISRUPTION",),
    "heal": ("BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",),
    "recreate": ("BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",),
    "hung": ("BadputType.WASTED_PROGRESS_FROM_DISRUPTION",),
    "charged": ("BadputType.WASTED_PROGRESS_FROM_DISRUPTION", "BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"),
    "person": ("BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",),
}
# A phase between attempts -> its category; None: decided by what came before (see _gap_category).
PHASE_CATEGORY: dict[str, str | None] = {
    "deleting": "recreate", "creating": "recreate", "queued": "recreate",
    "paused": "person", "halted": "person", "backoff": "charged",
    "waiting_node": None, "idle": None, "running": "startup",
}
TERMINAL_PHASES = {"done": "done", "failed": "failed"}
_DISRUPTION_SIGN = re.compile(r"ended by a disruption \((.+) at \d{4}-\d\d-\d\d")


@dataclass(frozen=True)
class Span:
    """A stretch of wall time in one category."""

    category: str
    start: datetime
    end: datetime
    attempt: int | None = None
    why: str = ""

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Mark:
    """A moment on the timeline: kind is checkpoint, disruption, failure, hung, recreate, person or end."""

    kind: str
    time: datetime
    text: str


@dataclass(frozen=True)
class Cause:
    """One incident: an attempt's end (or the wait before the first launch) and what it cost,
    from its newest checkpoint until the next attempt trains again."""

    what: str
    at: datetime
    parts: dict[str, float]  # category -> seconds

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class Run:
    """An attempt as the timeline shows it (clipped to the report's window)."""

    number: int
    start: datetime
    end: datetime
    outcome: str  # success, disruption, failure, failed_start, fail_fast, hung, or running
    reason: str


@dataclass(frozen=True)
class Limp:
    """A stretch a multislice job ran on fewer slices (job.min_slices), from its `slices` events."""

    start: datetime
    end: datetime
    in_use: int
    of: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def training(self) -> float:
        """The full-size training it stood for: a step on k of n slices counts k/n of one. The job
        waiting for its lost slice instead (without limping) would have trained none of it."""
        return self.seconds * self.in_use / self.of if self.of else 0.0


@dataclass(frozen=True)
class Spares:
    """A multislice job's hot spares over the report's window: how many, the chips of each (0:
    unknown), the swaps onto them, and the waits the swaps spared the job (`spare_back`: from a
    lost node's swap until it could stand in again)."""

    count: int
    chips: int
    swaps: int
    spared: tuple[float, ...]


@dataclass(frozen=True)
class Report:
    job: str
    start: datetime | None  # None: nothing journaled in the window
    end: datetime | None
    state: str  # done, failed, or the phase the job is in
    spans: tuple[Span, ...]
    marks: tuple[Mark, ...]
    causes: tuple[Cause, ...]  # costliest first
    runs: tuple[Run, ...]  # the attempts that ran in the window
    step_seconds: float | None  # the job's pace, when measured
    notes: tuple[str, ...] = field(default=())
    limps: tuple[Limp, ...] = ()  # the stretches it ran on fewer slices
    spares: Spares | None = None  # a job with spares (tpu.spares)

    @property
    def wall(self) -> float:
        return 0.0 if self.start is None or self.end is None else (self.end - self.start).total_seconds()

    @property
    def attempts(self) -> int:
        return len(self.runs)

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        for s in self.spans:
            out[s.category] += s.seconds
        return out

    @property
    def goodput(self) -> float | None:
        return self.seconds()["productive"] / self.wall if self.wall > 0 else None

    def as_dict(self) -> dict[str, Any]:
        wall, secs = self.wall, self.seconds()
        return {
            "job": self.job,
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "state": self.state,
            "wall_seconds": round(wall, 3),
            "goodput": None if self.goodput is None else round(self.goodput, 6),
            "categories": [{"id": k, "label": CATEGORIES[k], "seconds": round(v, 3),
                            "share": round(v / wall, 6) if wall > 0 else None,
                            "ml_goodput_buckets": list(ML_GOODPUT_BUCKETS[k])} for k, v in secs.items()],
            "top_causes": [{"what": c.what, "at": c.at.isoformat(), "seconds": round(c.seconds, 3),
                            "parts": {k: round(v, 3) for k, v in c.parts.items() if v > 0}}
                           for c in self.causes],
            "attempts": [{"attempt": r.number, "start": r.start.isoformat(), "end": r.end.isoformat(),
                          "outcome": r.outcome, "reason": r.reason} for r in self.runs],
            "step_seconds": self.step_seconds,
            "timeline": [{"category": s.category, "start": s.start.isoformat(), "end": s.end.isoformat(),
                          "attempt": s.attempt, "why": s.why} for s in self.spans],
            "marks": [{"kind": m.kind, "time": m.time.isoformat(), "text": m.text} for m in self.marks],
            "notes": list(self.notes),
            # a multislice job that limped: the time on fewer slices, and the full-size training it
            # stood for (its k/n share: what waiting for the lost slice would have lost)
            "limping": {"seconds": round(sum(lp.seconds for lp in self.limps), 3),
                        "training_seconds": round(sum(lp.training for lp in self.limps), 3),
                        "stretches": [{"start": lp.start.isoformat(), "end": lp.end.isoformat(),
                                       "slices": lp.in_use, "of": lp.of} for lp in self.limps]},
            # a job with spares: the idle time they cost (every spare is idle all along: the job's
            # slices hold as many nodes as they are), the swaps, and the waits they spared
            "spares": None if self.spares is None else {
                "count": self.spares.count, "idle_node_seconds": round(self.spares.count * wall, 3),
                "idle_chip_hours": round(self.spares.count * self.spares.chips * wall / 3600, 3)
                if self.spares.chips else None,
                "swaps": self.spares.swaps, "waits_spared_seconds": round(sum(self.spares.spared), 3)},
        }


@dataclass(frozen=True)
class _Ckpt:
    time: datetime
    step: int


def compute(job: str, events: Sequence[JournalEvent], attempts: Sequence[AttemptRow], now: datetime,
            since: datetime | None = None, spares: int = 0, spare_chips: int = 0) -> Report:
    """The report of one job from its whole journal; `since` keeps only wall time after it. A job
    with `spares` (tpu.spares) of `spare_chips` chips each (0: unknown) gets their account."""
    events = sorted(events, key=lambda e: e.id)
    attempts = sorted(attempts, key=lambda a: a.number)
    times = [e.time for e in events] + [a.start for a in attempts]
    if not times:
        return Report(job, None, None, "new", (), (), (), (), None, ("the journal holds nothing yet",))
    t0 = min(times)
    end, state = _end(events, now)
    ckpts = _checkpoints(events, attempts)
    pace = _pace(attempts, ckpts)
    notes: list[str] = []
    if pace is None:
        notes.append("start-up not measured: no attempt saved two checkpoints; it counts as productive")
    spans: list[Span] = []
    measured: dict[int, float] = {}
    per_attempt = {a.number: _attempt_ckpts(a, ckpts.get(a.number, []), end) for a in attempts}
    if pace is not None:
        for a in attempts:
            first = per_attempt[a.number][:1]
            if first:
                ran = (first[0].time - a.start).total_seconds()
                steps = first[0].step - (a.start_step or 0)
                measured[a.number] = min(ran, max(0.0, ran - steps * pace))
    typical = median(measured.values()) if measured else 0.0
    for a in attempts:
        spans += _attempt_spans(a, per_attempt[a.number], measured.get(a.number, typical), end)
    spans += _gap_spans(events, attempts, t0, end)
    spans = _merged(sorted((s for s in spans if s.end > s.start), key=lambda s: s.start))
    start = t0 if since is None else max(t0, min(since, end))
    kept = tuple(c for c in (_clip(s, start, end) for s in spans) if c is not None)
    marks = tuple(m for m in _marks(events, attempts, ckpts) if start <= m.time <= end)
    causes = _causes(attempts, kept, t0)
    runs = tuple(Run(a.number, max(a.start, start), min(a.end or end, end),
                     "hung" if hung(a) else (a.outcome or "running"), a.reason or "running")
                 for a in attempts if a.start < end and (a.end is None or a.end > start))
    limps = tuple(c for c in (_clip_limp(lp, start, end) for lp in _limps(events, end)) if c is not None)
    spared = None
    if spares:
        swaps = sum(1 for e in events if e.kind == "slices" and e.data.get("row") == "swap" and start <= e.time <= end)
        back = tuple(float(e.data.get("seconds") or 0.0) for e in events
                     if e.kind == "spare_back" and start <= e.time <= end)
        spared = Spares(spares, spare_chips, swaps, back)
    return Report(job, start, end, state, kept, marks, causes, runs, pace, tuple(notes), limps, spared)


# How an accelerator type counts: v2, v3, v4 and v5p by TensorCores (two a chip), v5e
# (v5litepod) and v6e by chips.
_CORES_A_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}


def chips(accelerator_type: str) -> int:
    """The chips of a node of `accelerator_type` ("v5p-16": 8); 0 when this tpuwatch does not know."""
    family, _, size = accelerator_type.rpartition("-")
    per = _CORES_A_CHIP.get(family)
    return int(size) // per if per and size.isdigit() else 0


def _limps(events: Sequence[JournalEvent], end: datetime) -> list[Limp]:
    """The stretches between a `slices` event with fewer slices in use and the next one."""
    out: list[Limp] = []
    since: tuple[datetime, int, int] | None = None
    for e in events:
        if e.kind != "slices":
            continue
        if since is not None:
            out.append(Limp(since[0], e.time, since[1], since[2]))
        in_use, of = int(e.data.get("in_use") or 0), int(e.data.get("of") or 0)
        since = (e.time, in_use, of) if 0 < in_use < of else None
    if since is not None:
        out.append(Limp(since[0], end, since[1], since[2]))
    return out


def _clip_limp(lp: Limp, start: datetime, end: datetime) -> Limp | None:
    a, b = max(lp.start, start), min(lp.end, end)
    return Limp(a, b, lp.in_use, lp.of) if b > a else None


def _end(events: Sequence[JournalEvent], now: datetime) -> tuple[datetime, str]:
    """When the job ended (done or failed), else `now`; and its state."""
    phase = "idle"
    for e in events:
        to = e.data.get("to") if e.kind == "phase" else None
        if isinstance(to, str):
            phase = to
            if to in TERMINAL_PHASES:
                return e.time, TERMINAL_PHASES[to]
        elif e.kind in ("done", "fail"):  # a journal written before phases were recorded
            return e.time, "done" if e.kind == "done" else "failed"
    return now, phase


def _checkpoints(events: Iterable[JournalEvent], attempts: Sequence[AttemptRow]) -> dict[int, list[_Ckpt]]:
    """attempt -> the checkpoints the journal saw it save, oldest first, at their save times.

    Two records tell: a `checkpoint` event (seen while the attempt ran), and a launch's
    checkpoint (the one the next attempt resumed from, often saved after the last tick looked),
    which belongs to the attempt that was running when it was saved."""
    out: dict[int, dict[int, datetime]] = {}

    def add(attempt: int, step: object, when: object, fallback: datetime) -> None:
        if not isinstance(step, int):
            return
        try:
            t = datetime.fromisoformat(str(when))
        except ValueError:
            t = fallback
        if t.tzinfo is None:
            t = fallback
        seen = out.setdefault(attempt, {})
        seen[step] = min(seen.get(step, t), t)

    for e in events:
        if e.kind == "checkpoint" and isinstance(e.data.get("attempt"), int):
            add(e.data["attempt"], e.data.get("step"), e.data.get("time"), e.time)
        elif e.kind == "launch" and isinstance(e.data.get("checkpoint"), dict):
            ck = e.data["checkpoint"]
            if not isinstance(ck.get("time"), str):
                continue
            t = datetime.fromisoformat(ck["time"])
            owner = next((a for a in attempts if t.tzinfo is not None and a.start <= t
                          and (a.end is None or t <= a.end)), None)
            if owner is not None:
                add(owner.number, ck.get("step"), ck["time"], e.time)
    return {n: [_Ckpt(t, s) for s, t in sorted(steps.items())] for n, steps in out.items()}


def _attempt_ckpts(a: AttemptRow, seen: list[_Ckpt], end: datetime) -> list[_Ckpt]:
    stop = min(a.end or end, end)
    kept = [c for c in seen if a.start <= c.time <= stop and (a.start_step is None or c.step > a.start_step)]
    if a.end is not None and a.end_step is not None and a.end_step > max(
            [c.step for c in kept] or [a.start_step if a.start_step is not None else -1]):
        kept.append(_Ckpt(min(a.end, end), a.end_step))  # saved after the last tick that looked
    return kept


def _pace(attempts: Sequence[AttemptRow], ckpts: dict[int, list[_Ckpt]]) -> float | None:
    """Seconds per step: the median over consecutive checkpoints of one attempt."""
    rates = []
    for a in attempts:
        seen = ckpts.get(a.number, [])
        for x, y in zip(seen, seen[1:], strict=False):
            dt = (y.time - x.time).total_seconds()
            if y.step > x.step and dt > 0:
                rates.append(dt / (y.step - x.step))
    return median(rates) if rates else None


def hung(a: AttemptRow) -> bool:
    """tpuwatch stopped the attempt because it made no progress (the policy's `hung` and
    `log_silent` rows) or its runtime said it hung (`log_hang`)."""
    return a.reason.split(": ", 1)[-1].startswith((HUNG, HUNG_SAID))


def cause(a: AttemptRow) -> str:
    """What ended an attempt, in a few words that group alike ends together."""
    if hung(a):
        return HUNG_SAID if a.reason.split(": ", 1)[-1].startswith(HUNG_SAID) else HUNG
    if a.outcome == "disruption":
        sign = _DISRUPTION_SIGN.search(a.reason)
        return f"disruption: {sign.group(1)}" if sign else "disruption"
    what = "failed start" if a.outcome == "failed_start" else "failure"
    return f"{what}: {describe_exit(a.exit_code) if a.exit_code is not None else 'no exit code'}"


def _tail(a: AttemptRow) -> str:
    if a.end is None or a.outcome == "success":
        return "productive"
    if hung(a):
        return "hung"
    if a.charged:
        return "charged"
    return "lost"


def _attempt_spans(a: AttemptRow, saved: list[_Ckpt], startup: float, end: datetime) -> list[Span]:
    stop = min(a.end or end, end)
    if stop <= a.start:
        return []
    tail = _tail(a)
    if not saved and tail in ("charged", "hung"):
        startup = 0.0  # a failed start: all of it is the failure's
    up = min(stop, a.start + timedelta(seconds=max(0.0, startup)))
    if saved:
        up = min(up, saved[0].time)
    kept_until = stop if tail == "productive" else max(up, saved[-1].time if saved else up)
    n = a.number
    ended = a.reason or "running"
    return [
        Span("startup", a.start, up, n, f"attempt {n}: launch to training"
             + (f" from step {a.start_step}" if a.start_step is not None else " from scratch")),
        Span("productive", up, kept_until, n, f"attempt {n}: training"
             + (f", saved up to step {saved[-1].step}" if saved else "")),
        Span(tail, kept_until, stop, n, ended),
    ]


def _gap_spans(events: Sequence[JournalEvent], attempts: Sequence[AttemptRow], t0: datetime,
               end: datetime) -> list[Span]:
    """The time outside every attempt, split at phase changes, each piece in its category."""
    busy = sorted((a.start, min(a.end or end, end)) for a in attempts)
    gaps, cursor = [], t0
    for s, e in busy:
        if s > cursor:
            gaps.append((cursor, min(s, end)))
        cursor = max(cursor, e)
    if cursor < end:
        gaps.append((cursor, end))
    phases = sorted(((e.time, str(e.data.get("to"))) for e in events if e.kind == "phase"), key=lambda p: p[0])
    phase_times = [t for t, _ in phases]
    recreating = sorted(e.time for e in events if e.kind in ("delete", "create")
                        or (e.kind == "phase" and PHASE_CATEGORY.get(str(e.data.get("to"))) == "recreate"))
    ended = sorted(((a.end, a) for a in attempts if a.end is not None), key=lambda p: (p[0], p[1].number))
    end_times = [t for t, _ in ended]
    out = []
    for g0, g1 in gaps:
        cuts = [g0, *phase_times[bisect_right(phase_times, g0):bisect_left(phase_times, g1)], g1]
        for p0, p1 in zip(cuts, cuts[1:], strict=False):
            if p1 <= p0:
                continue
            i = bisect_right(phase_times, p0)
            phase = phases[i - 1][1] if i else "idle"
            k = bisect_right(end_times, p0)
            prev = ended[k - 1][1] if k else None
            since = prev.end if prev is not None and prev.end is not None else t0
            recreated = bisect_right(recreating, p0) > bisect_left(recreating, since)
            category, why = _gap_category(phase, prev, recreated)
            out.append(Span(category, p0, p1, None, why))
    return out


def _gap_category(phase: str, prev: AttemptRow | None, recreated: bool) -> tuple[str, str]:
    fixed = PHASE_CATEGORY.get(phase)
    after = f" after attempt {prev.number} ({cause(prev)})" if prev is not None else ""
    if fixed is not None:
        return fixed, f"{phase}{after}"
    if recreated:
        return "recreate", f"new node booting{after}"
    if prev is None:
        return "startup", "before the first launch"
    if prev.charged:
        return "charged", f"backoff{after}"
    return "heal", f"node not usable yet{after}"


def _merged(spans: list[Span]) -> list[Span]:
    """Neighbours of one category and attempt as one span (a queue's many retries are one stretch)."""
    out: list[Span] = []
    for s in spans:
        last = out[-1] if out else None
        if last is not None and (last.category, last.attempt, last.end) == (s.category, s.attempt, s.start):
            out[-1] = Span(last.category, last.start, s.end, last.attempt, last.why)
        else:
            out.append(s)
    return out


def _clip(s: Span, start: datetime, end: datetime) -> Span | None:
    a, b = max(s.start, start), min(s.end, end)
    return Span(s.category, a, b, s.attempt, s.why) if b > a else None


def _marks(events: Sequence[JournalEvent], attempts: Sequence[AttemptRow],
           ckpts: dict[int, list[_Ckpt]]) -> list[Mark]:
    out = [Mark("checkpoint", c.time, f"checkpoint step {c.step} (attempt {n})")
           for n, seen in ckpts.items() for c in seen]
    for a in attempts:
        if a.end is None or a.outcome in (None, "success"):
            continue
        kind = "hung" if hung(a) else ("failure" if a.charged else "disruption")
        out.append(Mark(kind, a.end, a.reason))
    for e in events:
        if e.kind == "delete":
            out.append(Mark("recreate", e.time, e.reason))
        elif e.kind == "phase" and e.data.get("to") in ("paused", "halted"):
            out.append(Mark("person", e.time, e.reason))
        elif e.kind == "phase" and e.data.get("to") in TERMINAL_PHASES:
            out.append(Mark("end", e.time, f"job {TERMINAL_PHASES[str(e.data['to'])]}"))
    return sorted(out, key=lambda m: m.time)


def _causes(attempts: Sequence[AttemptRow], spans: Sequence[Span], t0: datetime) -> tuple[Cause, ...]:
    """Each incident's cost: an attempt's time after its newest checkpoint, the wait until the
    next launch and that attempt's start-up; and the wait before the first launch."""
    ordered = sorted(attempts, key=lambda a: a.start)
    # (what, when, the attempt that ended, the gap's start and end, the next attempt)
    incidents: list[tuple[str, datetime, int | None, datetime, datetime | None, int | None]] = []
    first = ordered[0] if ordered else None
    incidents.append(("before the first launch", t0, None, t0, first.start if first else None,
                      first.number if first else None))
    for i, a in enumerate(ordered):
        if a.end is None or a.outcome == "success":
            continue
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        incidents.append((cause(a), a.end, a.number, a.end, nxt.start if nxt else None,
                          nxt.number if nxt else None))
    between = sorted((s for s in spans if s.attempt is None), key=lambda s: s.start)
    starts = [s.start for s in between]
    by_attempt: dict[int, list[Span]] = {}
    for s in spans:
        if s.attempt is not None:
            by_attempt.setdefault(s.attempt, []).append(s)
    out = []
    for what, at, ended, g0, g1, nxt_n in incidents:
        parts = dict.fromkeys(CATEGORIES, 0.0)
        hi = len(between) if g1 is None else bisect_left(starts, g1)
        mine = [s for s in between[bisect_left(starts, g0):hi] if g1 is None or s.end <= g1]
        if ended is not None:
            mine += [s for s in by_attempt.get(ended, []) if s.category in ("lost", "hung", "charged")]
        if nxt_n is not None:
            mine += [s for s in by_attempt.get(nxt_n, []) if s.category == "startup"]
        for s in mine:
            parts[s.category] += s.seconds
        if parts["recreate"] > 0 and ended is not None:
            what += ", node recreated"
        if sum(parts.values()) > 0:
            out.append(Cause(what, at, parts))
    return tuple(sorted(out, key=lambda c: -c.seconds))


def text(report: Report, top: int = 5) -> str:
    """The report for people: the split of wall time, goodput, the costliest incidents."""
    if report.start is None or report.end is None:
        return f"job {report.job}: nothing journaled yet"
    wall, secs = report.wall, report.seconds()
    when = f"{_utc(report.start)} to {_utc(report.end)}"
    gp = "-" if report.goodput is None else f"{report.goodput:.1%}"
    lines = [f"job {report.job}: {when} ({report.state}), {report.attempts} attempts, wall time {human(wall)}",
             f"goodput {gp} (productive training / wall time)", "",
             f"{'where the time went':<38} {'time':>8} {'share':>6}"]
    for k, v in secs.items():
        lines.append(f"{CATEGORIES[k]:<38} {human(v):>8} {(v / wall if wall else 0):>6.1%}")
    if report.causes:
        lines += ["", "top causes (from an attempt's end until the next one trains again)"]
        for c in report.causes[:top]:
            parts = ", ".join(f"{CATEGORIES[k]} {human(v)}" for k, v in c.parts.items() if v > 0)
            lines.append(f"  {human(c.seconds):>8}  {c.what} at {_utc(c.at)}: {parts}")
    if report.limps:
        limped = sum(lp.seconds for lp in report.limps)
        fewest = min(lp.in_use for lp in report.limps)
        of = report.limps[0].of
        lines += ["", f"limping: {human(limped)} on fewer slices (down to {fewest} of {of}), "
                      f"{len(report.limps)} time(s); it trained the equal of {human(sum(lp.training for lp in report.limps))} "
                      "at full size, which waiting for the lost slices would have lost"]
    sp = report.spares
    if sp is not None:
        chips = f" ({sp.count * sp.chips * wall / 3600:.1f} chip-hours)" if sp.chips else ""
        lines += ["", f"spares: {sp.count} idle all along, {human(sp.count * wall)} of spare time{chips}; "
                      f"{sp.swaps} swap(s) onto them, which spared the job {human(sum(sp.spared))} of waiting for "
                      f"the lost slice(s) to come back ({len(sp.spared)} back so far)"]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _utc(t: datetime) -> str:
    return f"{t.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
