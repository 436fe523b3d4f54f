"""The views of a watcher of several jobs: a row per job, and the details of the one that needs
attention (FleetLiveView, on a terminal); timestamped lines or one JSON object per job per tick
(FleetLineView, otherwise).

A row: job, what it is doing (its phase, or why it is not watched: a config error, another
process watching it, an error that ended it), node, step, checkpoint age, last event. The job
that needs attention most (an error or a person's decision first, then a recovery under way)
gets the single-job dashboard (dashboard.py) under the table, or its error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tpuwatch.durations import human
from tpuwatch.journal import JournalEvent
from tpuwatch.policy import Phase
from tpuwatch.tick import TickReport
from tpuwatch.ui.dashboard import PHASE_STYLE, PHASE_WORDS, LineView, dashboard, stamp
from tpuwatch.ui.node import BAD, OK, WAIT
from tpuwatch.ui.tickview import tick_dict

STATUS_STYLE = {"starting": WAIT, "watching": OK, "busy": WAIT, "config_error": BAD, "failed": BAD,
                "finished": OK, "stopped": WAIT}
STATUS_WORDS = {"starting": "starting", "busy": "watched elsewhere", "config_error": "config error",
                "failed": "failed", "stopped": "not watched"}


@dataclass(frozen=True)
class JobState:
    """One job of the watcher as the views show it."""

    path: Path  # its config file
    name: str  # the job's name (the file's stem until the config is read)
    status: str  # starting, watching, busy, config_error, failed, finished, stopped
    error: str = ""
    exit_code: int = 0
    report: TickReport | None = None  # the last tick's
    last_event: str = ""
    events: tuple[JournalEvent, ...] = ()
    next_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.name, "config": str(self.path), "status": self.status, "error": self.error or None,
                "exit_code": self.exit_code}


def attention(s: JobState) -> int:
    """How much a job needs a person's eyes: 0 none; higher first."""
    if s.status in ("config_error", "failed"):
        return 4
    if s.report is not None:
        phase = s.report.memory.phase
        if phase in (Phase.HALTED, Phase.FAILED, Phase.PAUSED):
            return 3
        if PHASE_STYLE.get(phase) == WAIT and s.status == "watching":
            return 2
    return 1 if s.status == "busy" else 0


def _doing(s: JobState) -> Text:
    if s.status == "watching" and s.report is not None:
        phase = s.report.memory.phase
        return Text(PHASE_WORDS.get(phase, phase.value), style=PHASE_STYLE.get(phase, ""))
    if s.status == "finished" and s.report is not None:
        phase = s.report.memory.phase
        return Text(f"{PHASE_WORDS.get(phase, phase.value)} (exit {s.exit_code})", style=PHASE_STYLE.get(phase, ""))
    return Text(STATUS_WORDS.get(s.status, s.status), style=STATUS_STYLE.get(s.status, ""))


def _node_text(state: str, health: str) -> str:
    """READY, or READY with its health when not healthy (READY maintenance)."""
    if not health or health in ("HEALTHY", "HEALTH_UNSPECIFIED"):
        return state
    return f"{state} {health.lower().removeprefix('unhealthy_')}"


def jobs_table(states: Sequence[JobState], now: datetime) -> Table:
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    longest = max((len(s.name) for s in states), default=3)
    table.add_column("job", no_wrap=True, min_width=min(max(longest, 3), 20), max_width=20, overflow="ellipsis")
    table.add_column("doing", no_wrap=True, max_width=22, overflow="ellipsis")
    table.add_column("node", no_wrap=True, max_width=18, overflow="ellipsis")
    table.add_column("step", no_wrap=True, min_width=4, justify="right")
    table.add_column("ckpt age", no_wrap=True, min_width=8)
    table.add_column("last event", no_wrap=True, overflow="ellipsis")
    for s in states:
        r = s.report
        node = step = age = ""
        if r is not None:
            node = "missing" if r.node is None else _node_text(r.node.state, r.node.health)
            if r.checkpoint is not None:
                step = str(r.checkpoint.step)
                if r.checkpoint.time is not None:
                    age = human(max(0.0, (now - r.checkpoint.time).total_seconds()))
        last = s.last_event if s.status in ("watching", "finished") else s.error
        table.add_row(s.name, _doing(s), node, step, age, last)
    return table


def fleet_view(states: Sequence[JobState], now: datetime, *, title: str = "tpuwatch",
               width: int = 80) -> RenderableType:
    """The table, then the details of the job that needs attention most (if any does)."""
    parts: list[RenderableType] = [jobs_table(states, now)]
    worst = max(states, key=attention, default=None)
    if worst is not None and attention(worst) > 0:
        r = worst.report
        if worst.status in ("config_error", "failed", "busy") or r is None or r.pcfg is None:
            parts.append(Panel(Text(worst.error or worst.status), title=f"{worst.name} ({worst.path})",
                               border_style=STATUS_STYLE.get(worst.status, ""), width=min(width, 80)))
        else:
            parts.append(dashboard(r, worst.name, r.pcfg, worst.events, worst.next_at, now,
                                   title=title, width=width))
    ok = sum(1 for s in states if attention(s) == 0)
    head = Text(f"{title} · {len(states)} jobs, {ok} without trouble", style="bold")
    return Group(head, *parts)


class FleetLineView:
    """Off a terminal: `<UTC time> <job> <kind>: <text>` lines (per job, one per change, as for one
    job), or with `as_json` one JSON object per job per tick and one per change of a job's status."""

    def __init__(self, as_json: bool, out: Callable[[str], None] | None = None,
                 err: Callable[[str], None] | None = None) -> None:
        self.as_json = as_json
        self._lock = threading.Lock()
        out_fn = out or (lambda s: click.echo(s))
        err_fn = err or (lambda s: click.echo(s, err=True))
        self.out = self._locked(out_fn)
        self.err = self._locked(err_fn)
        self._lines: dict[Path, LineView] = {}
        self._status: dict[Path, str] = {}

    def _locked(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        def write(text: str) -> None:
            with self._lock:
                fn(text)
        return write

    def changed(self, state: JobState) -> None:
        if self._status.get(state.path) == state.status:
            return
        self._status[state.path] = state.status
        if state.status == "starting":
            return
        now = datetime.now(timezone.utc)
        if self.as_json:
            self.out(json.dumps({"time": now.isoformat(), **state.as_dict()}, sort_keys=True))
            return
        text = STATUS_WORDS.get(state.status, state.status)
        if state.status == "finished":
            text = f"finished (exit {state.exit_code})"
        detail = f": {state.error}" if state.error else ""
        self.out(f"{stamp(now)} {state.name} {state.status}: {text}{detail} ({state.path})")

    def ticked(self, state: JobState, report: TickReport) -> None:
        if self.as_json:
            self.out(json.dumps({**state.as_dict(), **tick_dict(report)}, sort_keys=True))
            return
        view = self._lines.get(state.path)
        if view is None:
            view = self._lines[state.path] = LineView(state.name, out=self.out, err=self.err)
        view.show(report, report.time)

    def warn(self, state: JobState, text: str) -> None:
        self.err(f"{stamp(datetime.now(timezone.utc))} {state.name} warning: {text}")

    def gone(self, path: Path) -> None:
        self._status.pop(path, None)
        self._lines.pop(path, None)
        now = datetime.now(timezone.utc)
        if self.as_json:
            self.out(json.dumps({"time": now.isoformat(), "job": path.stem, "config": str(path),
                                 "status": "removed", "error": None, "exit_code": 0}, sort_keys=True))
        else:
            self.out(f"{stamp(now)} {path.stem} removed: {path} is gone; no longer watched "
                     "(nothing was deleted or stopped)")


class FleetLiveView:
    """On a terminal: the table and the details, redrawn in place; warnings print above it."""

    def __init__(self, states: Callable[[], list[JobState]], *, title: str = "tpuwatch", console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.states = states
        self.title = title
        self.console = console or Console()
        self.live = Live(self, console=self.console, auto_refresh=True, refresh_per_second=2,
                         transient=False, redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> FleetLiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def __rich__(self) -> RenderableType:
        return fleet_view(self.states(), datetime.now(timezone.utc), title=self.title, width=self.console.width)

    def changed(self, state: JobState) -> None:
        return None  # the next refresh shows it

    def ticked(self, state: JobState, report: TickReport) -> None:
        return None

    def warn(self, state: JobState, text: str) -> None:
        self.console.print(Text(f"{state.name}: warning: {text}", style=WAIT))

    def gone(self, path: Path) -> None:
        self.console.print(Text(f"{path} removed: no longer watched (nothing was deleted or stopped)", style=WAIT))
