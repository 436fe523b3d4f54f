"""The `watch` dashboard: one job's node, workers, attempt, progress, budgets and next step,
and the two views `watch` (and `demo`) draw with: LiveView on a terminal, LineView otherwise.

Pure rendering from a TickReport (plus the journal's last events, the progress seen so far and
the next tick time); the caller passes `now`. Fits 80 columns: long values fold inside their
cell, never past the frame. Colours carry one meaning each, as in the node panel: green ok,
yellow waiting or recovering (tpuwatch or the cloud is working on it), red broken or needs a
person. Every coloured fact is also said in words, so nothing is lost without colour.
Durations are human (`3m12s`).

`Progress` turns the checkpoints seen tick after tick into steps per second; it keeps no
state beyond the current attempt and reads no clock or file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from tpuwatch.durations import human
from tpuwatch.journal import JournalEvent
from tpuwatch.model import Checkpoint, PrecheckReport, WorkerProbe
from tpuwatch.policy import Phase, PolicyConfig
from tpuwatch.policy.spares import unfit
from tpuwatch.tick import TickReport
from tpuwatch.ui.node import BAD, OK, WAIT, health_style, state_style, window_lines
from tpuwatch.ui.tickview import node_text, summary, tick_dict

if TYPE_CHECKING:  # rich is imported where it draws: LineView (a watcher whose output is not a
    # terminal: systemd's, cron's) never draws, and skips its ~40 ms of every start
    from rich.console import RenderableType
    from rich.text import Text

WIDTH = 80
TEXT_WIDTH = WIDTH - 4 - 11  # inside the frame and padding, right of the label column
PHASE_STYLE = {
    Phase.RUNNING: OK, Phase.DONE: OK, Phase.IDLE: WAIT, Phase.BACKOFF: WAIT,
    Phase.WAITING_NODE: WAIT, Phase.DELETING: WAIT, Phase.CREATING: WAIT, Phase.QUEUED: WAIT,
    Phase.PAUSED: BAD, Phase.HALTED: BAD, Phase.FAILED: BAD,
}
PHASE_WORDS = {
    Phase.IDLE: "starting", Phase.RUNNING: "running", Phase.BACKOFF: "backing off",
    Phase.WAITING_NODE: "waiting for the node", Phase.DELETING: "deleting the node",
    Phase.CREATING: "creating the node", Phase.QUEUED: "queued for capacity",
    Phase.PAUSED: "paused by a person", Phase.HALTED: "needs a person", Phase.DONE: "done",
    Phase.FAILED: "failed",
}
# Journal event kinds -> colour: what went wrong is red, what tpuwatch is doing about it yellow.
EVENT_STYLE = {
    "done": OK, "launch": OK, "fail": BAD, "needs_person": BAD, "stop": WAIT, "wait": WAIT,
    "delete": WAIT, "create": WAIT, "follow": WAIT,
}
RECENT_EVENTS = 5


def worker_style(state: str, exit_code: int | None) -> str:
    if state == "running" or (state == "exited" and exit_code == 0):
        return OK
    if state == "exited" or state == "unreachable":
        return BAD
    return ""


def event_style(ev: JournalEvent) -> str:
    if ev.kind == "attempt_end":
        return OK if ev.data.get("outcome") == "success" else BAD if ev.data.get("charged") else WAIT
    return EVENT_STYLE.get(ev.kind, "")


class Progress:
    """Steps per second of the running attempt, from the distinct checkpoints seen in it."""

    KEEP = 12  # checkpoints: a rate over the last few, so a slowdown shows soon

    def __init__(self) -> None:
        self.attempt: int | None = None
        self.seen: list[tuple[int, datetime]] = []

    def update(self, attempt: int, attempt_start: datetime | None, ck: Checkpoint | None,
               now: datetime) -> None:
        if attempt != self.attempt:
            self.attempt, self.seen = attempt, []
        if ck is None:
            return
        t = ck.time or now
        # The checkpoint an attempt resumed from was written before it started: not its progress.
        if attempt_start is not None and t < attempt_start:
            return
        if self.seen and ck.step < self.seen[-1][0]:
            self.seen = []  # the job went back to an older checkpoint
        if not self.seen or ck.step != self.seen[-1][0]:
            self.seen = [*self.seen, (ck.step, t)][-self.KEEP:]

    def rate(self) -> float | None:
        """Steps per second, or None until two checkpoints of this attempt have been seen."""
        if len(self.seen) < 2:
            return None
        (s0, t0), (s1, t1) = self.seen[0], self.seen[-1]
        dt = (t1 - t0).total_seconds()
        return (s1 - s0) / dt if dt > 0 else None


def rate_text(rate: float | None) -> str:
    if rate is None:
        return ""
    return f"{rate:.1f} steps/s" if rate < 100 else f"{rate:.0f} steps/s"


def worker_ranges(ids: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def workers_line(probes: Sequence[WorkerProbe]) -> Text:
    """Workers grouped by what they are doing, so a 64-worker slice still takes one line:
    "0-2,4-7 running (attempt 3) · 3 exited 139 (attempt 3)"."""
    from rich.text import Text

    groups: dict[tuple[str, int | None, int | None, str], list[int]] = {}
    for p in probes:
        detail = p.detail.splitlines()[0][:40] if p.state == "unreachable" and p.detail else ""
        groups.setdefault((p.state, p.attempt, p.exit_code, detail), []).append(p.worker)
    line = Text()
    for n, ((state, attempt, code, detail), ids) in enumerate(sorted(groups.items(), key=lambda g: min(g[1]))):
        if n:
            line.append(" · ", style="dim")
        words = state + (f" {code}" if state == "exited" and code is not None else "")
        line.append(f"{worker_ranges(ids)} ")
        line.append(words, style=worker_style(state, code))
        if attempt is not None:
            line.append(f" (attempt {attempt})", style="dim")
        if detail:
            line.append(f": {detail}", style="dim")
    return line


def short_path(path: str, keep: int = 2) -> str:
    """The last `keep` parts of a long path: "…/ckpt/60"."""
    parts = path.rstrip("/").split("/")
    return path if len(parts) <= keep + 1 or len(path) <= 32 else "…/" + "/".join(parts[-keep:])


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def dashboard(report: TickReport, job: str, pcfg: PolicyConfig, events: Sequence[JournalEvent],
              next_tick: datetime | None, now: datetime, *, rate: float | None = None,
              title: str = "tpuwatch", width: int = WIDTH) -> RenderableType:
    """The whole view for one tick: `width` (at most WIDTH) columns, at most 18 rows."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    width = max(40, min(width, WIDTH))
    text_width = width - 4 - 11
    mem = report.memory
    phase_style = PHASE_STYLE.get(mem.phase, "")
    head = Table.grid(padding=(0, 1))
    head.add_column(style="bold", no_wrap=True, min_width=10)
    head.add_column(overflow="fold")
    node = report.node
    shown_events = RECENT_EVENTS
    if node is None:
        head.add_row("node", Text(f"{pcfg.tpu_name}: not found", style=BAD))
    else:
        line = Text(f"{node.name} ({node.zone}) ")
        line.append(node.state, style=state_style(node.state))
        line.append(" / ")
        line.append(node.health or "-", style=health_style(node.health))
        head.add_row("node", line)
        if node.slices:  # a multislice job: each slice's own state, and its workers
            states = Text()
            for i, part in enumerate(node.slices):
                if i:
                    states.append(" · ")
                count = sum(1 for w in node.workers if w.slice == i)
                states.append(f"{part.name or f'slice {i} missing'} ")
                states.append(part.state, style=state_style(part.state))
                states.append(f"/{part.health or '-'} ({count} workers)")
            head.add_row("slices", states)
        if report.spares:  # a job with spares: each idle node of its pool, and why it cannot stand in now
            idle = Text()
            for i, (name, spare) in enumerate(report.spares):
                if i:
                    idle.append(" · ")
                why = unfit(pcfg.job, node, spare, report.memory.limp.bad)
                idle.append(f"{name} ")
                idle.append(why or "ready", style=WAIT if why else OK)
            head.add_row("spares", idle)
        if report.pool:  # a job of a spare pool: its nodes, idle or held by which job
            held = Text()
            for i, (name, job, why) in enumerate(report.pool):
                if i:
                    held.append(" · ")
                held.append(f"{name} ")
                held.append(f"held by {job}" if job else f"idle, {why}" if why else "idle",
                            style=WAIT if job or why else OK)
            head.add_row(f"pool {pcfg.spare_pool}" if pcfg is not None else "pool", held)
        if node.health_description:
            head.add_row("", Text(_clip(node.health_description, text_width), style="dim"))
        if node.upcoming_maintenance is not None:
            # The announced window (local time), whether it may start early, what tpuwatch will do.
            gap, ck_now = report.memory.hang.ckpt_gap, report.checkpoint
            soon = (max(0.0, (ck_now.time - now).total_seconds() + gap)
                    if gap > 0 and ck_now is not None and ck_now.time is not None else None)
            window, early, plan = window_lines(node.upcoming_maintenance, now, watched=True,
                                               start_early=pcfg.start_early, next_checkpoint_in=soon)
            head.add_row("maint.", Text(_clip(window, text_width), style=WAIT))
            head.add_row("", Text(_clip(f"{early}; {plan}", 2 * text_width), style="dim"))
            shown_events -= 3  # the rows these take, so the view still fits a 24-row terminal
    if report.probes:
        head.add_row("workers", workers_line(report.probes))
    job_line = Text(PHASE_WORDS.get(mem.phase, mem.phase.value), style=phase_style)
    job_line.append(f", attempt {mem.attempt.number}")
    if mem.attempt.start and mem.phase is Phase.RUNNING:
        job_line.append(f", up {human(max(0.0, (now - mem.attempt.start).total_seconds()))}")
    head.add_row("job", job_line)
    ck = report.checkpoint
    if ck is None:
        head.add_row("checkpoint", Text("none yet", style="dim"))
    else:
        progress = Text(f"step {ck.step}")
        if ck.time:
            progress.append(f", saved {human(max(0.0, (now - ck.time).total_seconds()))} ago")
        if rate is not None:
            progress.append(f", {rate_text(rate)}")
        progress.append(f"  {short_path(ck.path)}", style="dim")
        head.add_row("checkpoint", progress)
    head.add_row("budgets", f"restarts {mem.budgets.restarts}/{pcfg.max_restarts}  "
                            f"recreates {mem.budgets.recreates}/{pcfg.max_recreates}  "
                            f"no-progress {mem.budgets.no_progress}/{pcfg.no_progress_limit}  "
                            f"disruptions {mem.budgets.disruptions}")
    if report.precheck is not None:
        for n, line in enumerate(checks_lines(report.precheck, now, text_width)):
            head.add_row("checks" if n == 0 else "", line)
    nxt = Text(_clip(report.decision.summary, 2 * text_width - 24), style=phase_style)
    if next_tick is not None and not report.decision.terminal:
        nxt.append(f"  (next look in {human(max(0.0, (next_tick - now).total_seconds()))})", style="dim")
    head.add_row("now", nxt)
    parts: list[RenderableType] = [head]
    if events:
        parts.append(Rule("last events (UTC)", align="left", style="dim"))
        log = Table.grid(padding=(0, 1))
        recent = events[-shown_events:]
        kind_width = max(len(e.kind) for e in recent)
        room = width - 4 - 9 - kind_width - 1  # frame and padding, time, kind, gaps
        log.add_column(style="dim", no_wrap=True)
        log.add_column(no_wrap=True)
        log.add_column(no_wrap=True)
        for ev in recent:
            log.add_row(ev.time.strftime("%H:%M:%S"), Text(ev.kind, style=event_style(ev)),
                        _clip(ev.reason.replace("\n", " "), room))
        parts.append(log)
    for w in report.warnings:
        parts.append(Text(_clip(f"warning: {w}", 2 * text_width), style=WAIT))
    return Panel(Group(*parts), title=f"{title} · {job}", title_align="left", width=width)


MAX_CHECK_LINES = 4


def checks_lines(pre: PrecheckReport, now: datetime, text_width: int = TEXT_WIDTH) -> list[Text]:
    """The environment checks: one red line per failing item with worker and value,
    or one green line when everything passed."""
    from rich.text import Text

    age = human(max(0.0, (now - pre.time).total_seconds()))
    failing = [i.line() for i in pre.failing] + [f"w{w} not checked: {d}" for w, d in pre.unreachable]
    if not failing:
        warn = f", {len(pre.warnings)} warning(s)" if pre.warnings else ""
        workers = len({i.worker for i in pre.items})
        return [Text(f"passed on {workers} worker(s){warn}, {age} ago", style=OK if not warn else WAIT)]
    lines = [Text(_clip(f"FAIL {line}", text_width), style=BAD) for line in failing[:MAX_CHECK_LINES]]
    more = len(failing) - MAX_CHECK_LINES
    lines.append(Text((f"and {more} more; " if more > 0 else "") + f"checked {age} ago (tpuwatch precheck)",
                      style="dim"))
    return lines


def state_line(report: TickReport, rate: float | None = None) -> str:
    """One line for people and parsers: node, phase, attempt, progress, and what happens next."""
    mem = report.memory
    parts = [f"node {node_text(report.node)}", mem.phase.value, f"attempt {mem.attempt.number}"]
    ck = report.checkpoint
    if ck is not None:
        extra = []
        if ck.time is not None:
            extra.append(f"{human(max(0.0, (report.time - ck.time).total_seconds()))} old")
        if rate is not None:
            extra.append(rate_text(rate))
        parts.append(f"step {ck.step}" + (f" ({', '.join(extra)})" if extra else ""))
    return f"{' | '.join(parts)}: {summary(report)}"


def stamp(t: datetime) -> str:
    """ISO 8601 UTC to the second, the first field of every plain line."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class LineView:
    """Non-TTY output: one line per change, never one per quiet tick.

    Every line is `<UTC timestamp> <job> <kind>: <text>`, kind one of state, audit, did,
    warning, note; with `as_json`, one JSON object per change instead.
    """

    def __init__(self, job: str, as_json: bool = False, out: Callable[[str], None] | None = None,
                 err: Callable[[str], None] | None = None) -> None:
        self.job = job
        self.as_json = as_json
        self.out = out or (lambda s: click.echo(s))
        self.err = err or (lambda s: click.echo(s, err=True))
        self.last: tuple[Any, ...] | None = None
        self.ticks = 0
        self.progress = Progress()

    def __enter__(self) -> LineView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _line(self, t: datetime, kind: str, text: str) -> str:
        return f"{stamp(t)} {self.job} {kind}: {text}"

    def warn(self, text: str) -> None:
        self.err(self._line(datetime.now(timezone.utc), "warning", text))

    def note(self, text: str) -> None:
        """A line from the caller (the demo's story), in the same format."""
        self.out(self._line(datetime.now(timezone.utc), "note", text))

    def show(self, report: TickReport, next_tick: datetime) -> None:
        self.ticks += 1
        mem = report.memory
        self.progress.update(mem.attempt.number, mem.attempt.start, report.checkpoint, report.time)
        node = report.node
        key = (report.decision.row, mem.phase, mem.attempt.number,
               None if node is None else (node.state, node.health, node.id),
               None if report.checkpoint is None else report.checkpoint.step)
        if key == self.last and not report.done and not report.events and not report.warnings:
            return
        self.last = key
        if self.as_json:
            self.out(json.dumps({"job": self.job, **tick_dict(report)}, sort_keys=True))
            return
        t = report.time
        for ev in report.events:
            self.out(self._line(t, "audit", f"{ev.kind} {ev.node}"
                                f"{'' if ev.worker is None else ' worker ' + ev.worker} at {stamp(ev.time)}"
                                f"{' reason=' + ev.reason if ev.reason else ''}"))
        self.out(self._line(t, "state", state_line(report, self.progress.rate())))
        for line in report.done:
            self.out(self._line(t, "did", line))
        for line in report.warnings:
            self.out(self._line(t, "warning", line))


class LiveView:
    """TTY output: a rich Live dashboard redrawn in place (no flicker, no scrolling).

    The screen is rendered on each refresh from the last report, so ages and the countdown to
    the next look stay current between ticks; notes print above it and scroll.
    """

    def __init__(self, job: str, pcfg: PolicyConfig, journal: Any, *, title: str = "tpuwatch",
                 console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.job = job
        self.pcfg = pcfg
        self.journal = journal
        self.title = title
        self.console = console or Console()
        self.live = Live(self, console=self.console, auto_refresh=True, refresh_per_second=2,
                         transient=False, redirect_stdout=False, redirect_stderr=False)
        self.ticks = 0
        self.progress = Progress()
        self._state: tuple[TickReport, Sequence[JournalEvent], datetime] | None = None

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def __rich__(self) -> RenderableType:
        from rich.text import Text

        state = self._state
        if state is None:
            return Text(f"{self.title} · {self.job}: first look…", style="dim")
        report, events, next_tick = state
        return dashboard(report, self.job, self.pcfg, events, next_tick, datetime.now(timezone.utc),
                         rate=self.progress.rate(), title=self.title, width=self.console.width)

    def warn(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"warning: {text}", style=WAIT))

    def note(self, text: str, style: str = "") -> None:
        from rich.text import Text

        self.console.print(Text(f"{datetime.now(timezone.utc).strftime('%H:%M:%S')} {text}", style=style))

    def show(self, report: TickReport, next_tick: datetime) -> None:
        self.ticks += 1
        mem = report.memory
        self.progress.update(mem.attempt.number, mem.attempt.start, report.checkpoint, report.time)
        # phase changes are for `tpuwatch report`; the state line already shows the phase
        recent = [e for e in self.journal.events(limit=3 * RECENT_EVENTS) if e.kind != "phase"]
        self._state = (report, recent[-RECENT_EVENTS:], next_tick)
        self.live.refresh()
