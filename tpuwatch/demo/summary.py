"""The demo's summary: for each disruption, time to detect, time to resume, steps lost, restarts
charged and whether it was recovered; and the job's goodput. Computed after the run from records
alone — the journal (events, attempts), the fault times the director took from the simulator's
audit entries and the crash marker, and the checkpoints' commit times — never from what the
loop printed. Definitions (as in the goodput benchmark, lab/goodput.py in a clone):

- detect: from the fault to the end of the tick that first reacted to it (its first journal
  event after the fault, or the end of the attempt the fault interrupted).
- resume: from the fault to the next launch of the job (the first attempt started after it), as
  of the end of the tick that launched it.
- steps lost: steps the job had made at the fault minus the step the next attempt resumed from.
  The step at the fault is exact for the crash (the trainer's own fault step) and otherwise
  reckoned from the newest checkpoint committed before the fault and the trainer's step time.
- charged: attempts, from the one the fault interrupted up to the resume, that count against
  max_restarts.
- goodput: productive step time (final step x step time) / wall time from the first launch to
  the job's end.

For a slice coming back (an act that stops no training), steps lost count from when tpuwatch
stopped the job to grow back, not from the act. A job that limped (the journal's `slices`
events, as `tpuwatch report` reads them) also gets: the time on fewer slices, the full-size
training it stood for (report.py's `Limp`), and the grow's cost: from the checkpoint it grew back
at to the launch on all its slices (the training after that checkpoint is redone).

A job with a hot spare (the swap's story) also gets what the swap did: the lost slice, the
spare that took its place (the journal's last memory, `limp.swapped`), when tpuwatch journaled
the swap (its `slices` event), when it deleted and created the lost slice again as the spare
(its `spare_remade` events) and when that could stand in again (`spare_back`, with the wait the
swap spared the job), and any delete or create of the job's own slices (there should be none).

Rendering: a rich Table that fits 80 columns, and one result line a script can match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpuwatch.demo.story import JOB, Pace, Played
from tpuwatch.durations import human
from tpuwatch.journal import AttemptRow, JournalEvent
from tpuwatch.ui.node import BAD, OK


@dataclass(frozen=True)
class Outcome:
    title: str
    fault_at: datetime | None  # None: the disruption never happened
    detect: float | None  # seconds
    resume: float | None  # seconds
    steps_lost: int | None
    charged: int
    recovered: bool
    why: str = ""  # what went wrong, when not recovered


@dataclass(frozen=True)
class LimpCost:
    """What limping cost and gave, from the journal's `slices` events and attempts."""

    seconds: float  # on fewer slices
    training: float  # the full-size training those seconds stood for
    in_use: int  # the fewest slices it ran on
    of: int
    grow_step: int | None  # the checkpoint the job grew back at (None: it never did)
    grow_cost: float | None  # seconds from that checkpoint's commit to the launch on all slices
    why: str = ""  # what went wrong: it never limped, or never grew back


@dataclass(frozen=True)
class SwapCost:
    """What the swap for a hot spare did; seconds count from the loss (the fault)."""

    lost: str  # the slice lost ("" when nothing was swapped)
    spare: str  # the spare that took its place
    slice_id: int | None  # the lost slice's place, the spare's slice id from then on
    swapped: float | None  # to the end of the tick that journaled the swap
    deleted: float | None  # to the delete of the lost slice, to make it again
    created: float | None  # to its create from [tpu.spec]
    ready: float | None  # to when it could stand in for a slice again, the job's spare
    spared: float | None = None  # seconds of waiting for it the swap spared the job (from the swap)
    job_path: tuple[str, ...] = ()  # deletes and creates of the job's own slices (none should be)
    why: str = ""  # what went wrong


@dataclass(frozen=True)
class Summary:
    outcomes: tuple[Outcome, ...]
    final_step: int | None
    total_steps: int
    done: bool
    goodput: float | None
    wall: float | None  # seconds from the first launch to the end
    attempts: int
    charged: int
    how_it_ended: str  # the loop's last word, e.g. "job done", "deadline passed"
    limp: LimpCost | None = None  # the limping story's
    swap: SwapCost | None = None  # the spare's story's

    @property
    def ok(self) -> bool:
        return (self.done and self.final_step == self.total_steps and all(o.recovered for o in self.outcomes)
                and (self.limp is None or not self.limp.why) and (self.swap is None or not self.swap.why))

    def result_line(self) -> str:
        recovered = sum(o.recovered for o in self.outcomes)
        head = (f"result: {'ok' if self.ok else 'FAILED'}: {recovered}/{len(self.outcomes)} "
                f"disruptions recovered, final step {self.final_step if self.final_step is not None else '-'}"
                f"/{self.total_steps}")
        if self.goodput is not None:
            head += f", goodput {self.goodput:.0%}"
        return head


def step_at(fault: datetime, ckpts: dict[int, datetime], pace: Pace) -> int | None:
    """The step the job had reached at `fault`: the newest checkpoint before it plus the steps
    its step time allows since (never a whole checkpoint interval: that would have saved)."""
    before = [(s, t) for s, t in ckpts.items() if t <= fault]
    if not before:
        return None
    step, t = max(before)
    since = max(0.0, (fault - t).total_seconds())
    return step + min(pace.ckpt_every - 1, int(since / pace.step_time))


def summarize(played: Sequence[Played], acts_titles: Sequence[str], events: Sequence[JournalEvent],
              attempts: Sequence[AttemptRow], ckpts: dict[int, datetime], pace: Pace,
              done: bool, how_it_ended: str, tick_end: Mapping[datetime, datetime] | None = None,
              steps: int | None = None, limp: bool = False,
              swapped: Sequence[tuple[str, str]] | None = None, slots: Sequence[str] = ()) -> Summary:
    """`tick_end` maps a tick's time (its events' stamp) to when that tick had finished acting;
    `steps` the trainer's total (else the pace's); `limp`: the job should limp and grow back;
    `swapped`: the job has a hot spare, and these are its slots (`slots`, tpu.names) bound to
    spares at the end (the journal's memory)."""
    outcomes = []
    by_title = {p.act.title: p for p in played}
    for title in acts_titles:
        p = by_title.get(title)
        outcomes.append(_outcome(title, p, events, attempts, ckpts, pace, done, tick_end or {}))
    final = max(ckpts) if ckpts else None
    started = [a.start for a in attempts]
    goodput = wall = None
    if started:
        ends = [a.end for a in attempts if a.end is not None]
        end = max(ends) if done and ends else (events[-1].time if events else None)
        if end is not None:
            wall = max((end - min(started)).total_seconds(), 1e-9)
            goodput = min(1.0, (final or 0) * pace.step_time / wall)
    return Summary(tuple(outcomes), final, pace.steps if steps is None else steps, done, goodput, wall,
                   len(attempts), sum(1 for a in attempts if a.charged), how_it_ended,
                   _limp_cost(events, attempts, ckpts, tick_end or {}) if limp else None,
                   None if swapped is None else _swap_cost(played, events, swapped, slots, tick_end or {}))


def _swap_cost(played: Sequence[Played], events: Sequence[JournalEvent], swapped: Sequence[tuple[str, str]],
               slots: Sequence[str], tick_end: Mapping[datetime, datetime]) -> SwapCost:
    # the job's own slices deleted or created (DeleteNode, CreateNode): a swap needs neither
    job_path = tuple(e.reason for e in events if e.kind in ("delete", "create"))
    loss = next((p.fault_at for p in played if p.act.stops), None)
    if loss is None:
        return SwapCost("", "", None, None, None, None, None, job_path=job_path, why="no slice was lost: the run ended first")
    if not swapped:
        return SwapCost("", "", None, None, None, None, None, job_path=job_path, why="no spare was swapped in")
    lost, spare = swapped[0]

    def since(t: datetime | None) -> float | None:
        return None if t is None else max(0.0, (tick_end.get(t, t) - loss).total_seconds())

    # the `slices` event of the swap: its idle spares name the slice swapped out (a tick is
    # stamped when it began, which can be just before the fault it then saw)
    swap = next((e for e in events if e.kind == "slices" and lost in (e.data.get("spares") or ())), None)
    remade = [e for e in events if e.kind == "spare_remade" and e.data.get("node") == lost]
    deleted = next((e.time for e in remade if not e.data.get("create")), None)
    created = next((e.time for e in remade if e.data.get("create")), None)
    back = next((e for e in events if e.kind == "spare_back" and e.data.get("node") == lost), None)
    spared = back.data.get("seconds") if back is not None else None
    slot_id = list(slots).index(lost) if lost in slots else None
    why = ("tpuwatch deleted or created a slice the job ran on" if job_path else
           f"{lost} was never created again" if created is None else
           f"{lost} never could stand in for a slice again" if back is None else "")
    return SwapCost(lost, spare, slot_id, since(swap.time if swap else None), since(deleted), since(created),
                    since(back.time if back else None), float(spared) if isinstance(spared, (int, float)) else None,
                    job_path, why)


def _limp_cost(events: Sequence[JournalEvent], attempts: Sequence[AttemptRow], ckpts: dict[int, datetime],
               tick_end: Mapping[datetime, datetime]) -> LimpCost:
    from tpuwatch.report import compute

    end = events[-1].time if events else datetime.now(timezone.utc)
    limps = compute(JOB, events, attempts, end).limps
    if not limps:
        return LimpCost(0.0, 0.0, 0, 0, None, None, "the job never ran on fewer slices")
    seconds, training = sum(lp.seconds for lp in limps), sum(lp.training for lp in limps)
    in_use, of = min(lp.in_use for lp in limps), limps[0].of
    # The grow: the last `slices` event back to all of them, and the first launch it led to.
    grown = [e for e in events if e.kind == "slices" and int(e.data.get("in_use") or 0) == of]
    if not grown or grown[-1].time < limps[-1].start:
        return LimpCost(seconds, training, in_use, of, None, None, "the job never grew back onto all its slices")
    grow = next((a for a in sorted(attempts, key=lambda a: a.number) if a.start >= grown[-1].time), None)
    if grow is None:
        return LimpCost(seconds, training, in_use, of, None, None, f"the job was never relaunched on all {of} slices")
    saved = ckpts.get(grow.start_step) if grow.start_step is not None else None
    launched = tick_end.get(grow.start, grow.start)
    cost = None if saved is None else max(0.0, (launched - saved).total_seconds())
    return LimpCost(seconds, training, in_use, of, grow.start_step, cost)


def _outcome(title: str, p: Played | None, events: Sequence[JournalEvent], attempts: Sequence[AttemptRow],
             ckpts: dict[int, datetime], pace: Pace, done: bool,
             tick_end: Mapping[datetime, datetime]) -> Outcome:
    if p is None:
        return Outcome(title, None, None, None, None, 0, False, "never happened: the run ended first")
    fault = p.fault_at

    def launched(a: AttemptRow) -> datetime:
        # An attempt is stamped with its tick's start and launched by the tick's end: a limp
        # relaunches in the tick that saw the slice lost, and a crash nobody injected can fall
        # inside the tick that saw it and relaunched the job.
        return tick_end.get(a.start, a.start)

    ordered = sorted(attempts, key=lambda a: a.number)
    hit = [a for a in ordered if launched(a) <= fault]
    interrupted = hit[-1] if hit else None
    nxt = next((a for a in ordered if launched(a) > fault), None)
    # A tick stamps its events with the time it began; one that began just before a fault it
    # then saw (a crash nobody injected) has events older than the fault. So the reaction is the
    # first event after the mark, or the interrupted attempt's end, whichever comes first, and
    # its time is when that tick had finished acting.
    reaction = next((e for e in events if e.id > p.mark), None)
    if interrupted is not None:
        end_ev = next((e for e in events if e.kind == "attempt_end"
                       and e.data.get("attempt") == interrupted.number and e.id <= p.mark), None)
        if end_ev is not None and (reaction is None or end_ev.id < reaction.id):
            reaction = end_ev
    detect = None
    if reaction is not None:
        seen = tick_end.get(reaction.time, reaction.time)
        detect = max(0.0, (seen - p.fault_at).total_seconds())
    resume = None if nxt is None else (launched(nxt) - fault).total_seconds()
    lo = interrupted.number if interrupted is not None else 0
    hi = nxt.number if nxt is not None else None
    charged = sum(1 for a in ordered if a.charged and a.number >= lo and (hi is None or a.number < hi))
    lost = None
    if not p.act.stops:  # training went on past the act, until tpuwatch stopped the attempt
        stopped = interrupted.end if interrupted is not None else None
        at = step_at(stopped, ckpts, pace) if stopped is not None else None
    else:
        at = p.step if p.step is not None else step_at(p.fault_at, ckpts, pace)
    if nxt is not None and at is not None:
        lost = max(0, at - (nxt.start_step or 0))
    if nxt is None:
        return Outcome(title, p.fault_at, detect, None, lost, charged, False,
                       "never detected" if reaction is None else "the job was never relaunched")
    # Recovered: relaunched, and the relaunched job made progress (or finished).
    progressed = done or any(s > (nxt.start_step or 0) and t > nxt.start for s, t in ckpts.items())
    return Outcome(title, p.fault_at, detect, resume, lost, charged, progressed,
                   "" if progressed else "relaunched, but made no progress")


def render(summary: Summary) -> RenderableType:
    table = Table(title="what happened", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("disruption", no_wrap=True)
    table.add_column("detected", justify="right", no_wrap=True)
    table.add_column("resumed", justify="right", no_wrap=True)
    table.add_column("steps lost", justify="right", no_wrap=True)
    table.add_column("charged", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    for o in summary.outcomes:
        table.add_row(o.title, _secs(o.detect), _secs(o.resume),
                      "-" if o.steps_lost is None else str(o.steps_lost), str(o.charged),
                      Text("recovered", style=OK) if o.recovered else Text("NOT recovered", style=BAD))
    lines: list[RenderableType] = [table, Text("")]
    for o in summary.outcomes:
        if not o.recovered:
            lines.append(Text(f"not recovered: {o.title}: {o.why}", style=BAD))
    wall = f" in {human(summary.wall)}" if summary.wall is not None else ""
    lp = summary.limp
    if lp is not None and lp.why:
        lines.append(Text(f"not recovered: the limp: {lp.why}", style=BAD))
    sw = summary.swap
    if sw is not None and sw.why:
        lines.append(Text(f"not recovered: the swap: {sw.why}", style=BAD))
    lines.append(Text(f"{summary.attempts} attempts{wall}, {summary.charged} charged to max_restarts; "
                      f"the run ended: {summary.how_it_ended}."))
    if lp is not None and lp.in_use:
        grew = ("" if lp.grow_step is None else
                f"; growing back onto all {lp.of} at checkpoint step {lp.grow_step} cost {_secs(lp.grow_cost)} "
                "(from that checkpoint to the launch on all of them)")
        lines.append(Text(f"limped {_secs(lp.seconds)} on {lp.in_use} of {lp.of} slices: the equal of "
                          f"{_secs(lp.training)} of training at full size, which waiting for the lost slice "
                          f"would have lost{grew}."))
    if sw is not None and sw.lost:
        lines.extend(_swap_lines(sw, summary.outcomes[0] if summary.outcomes else None))
    if summary.goodput is not None:
        packed = ("a slice's loss and return into seconds; on a real run they are hours apart" if lp is not None
                  else "a slice's loss and its remake into seconds; on a real run a create takes minutes"
                  if sw is not None else "four disruptions into a minute; on a real run they are days apart")
        lines.append(Text(f"goodput {summary.goodput:.0%}: productive step time / wall time. The demo "
                          f"packs {packed}.", style="dim"))
    lines.append(Text(summary.result_line(), style=OK if summary.ok else BAD))
    return Group(*lines)


def _swap_lines(sw: SwapCost, loss: Outcome | None) -> list[Text]:
    """What the swap did, and why it cost what it did."""
    place = f" (slice {sw.slice_id})" if sw.slice_id is not None else ""
    lines = [f"{sw.lost} was lost: {_secs(sw.swapped)} after the loss tpuwatch had swapped spare {sw.spare} into "
             f"its place{place}"]
    if loss is not None and loss.resume is not None:
        lost = "" if loss.steps_lost is None else f": {loss.steps_lost} steps lost (those since that checkpoint)"
        lines[0] += (f" and the job trained again there from its newest complete checkpoint, {_secs(loss.resume)} "
                     f"after the loss{lost}")
    if loss is not None:
        lines[0] += (", nothing charged to max_restarts" if loss.charged == 0
                     else f", {loss.charged} charged to max_restarts")
    lines[0] += f". It did not wait for {sw.lost} to come back or be made again."
    if sw.created is not None:
        ready = "" if sw.ready is None else (
            f"; it could stand in again {_secs(sw.ready)} after the loss, the job's spare from then on"
            + ("" if sw.spared is None else f" (the swap spared the job {_secs(sw.spared)} of waiting for it)"))
        lines.append(f"{sw.lost}, a spot node preempted for good (it does not come back by itself), was deleted "
                     f"{_secs(sw.deleted)} after the loss and created again from [tpu.spec] {_secs(sw.created)} after "
                     f"it, in the background while the job trained{ready}.")
    if not sw.job_path:
        lines.append(f"The job waited for no delete or create: tpuwatch deleted and created no slice it ran on, only "
                     f"{sw.lost} once idle, to make it again.")
    return [Text(line) for line in lines]


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{int(s * 1000)}ms"
    return f"{s:.1f}s" if s < 60 else human(s)
