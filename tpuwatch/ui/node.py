"""The node panel: one TPU's state, health, maintenance, symptoms, workers and recent events.

Colours carry one meaning each, and the text always says the same thing without them:
green = ok, yellow = transient or waiting (the service is working on it), red = broken or
stopped (it will not come back by itself). The panel fits 80 columns. Pure rendering: the
caller passes `now` and whatever job rows it has (attempt, checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpuwatch.durations import human
from tpuwatch.model import AuditEvent, NodeSnapshot, UpcomingMaintenance
from tpuwatch.policy.maintenance import can_start_early, maintenance_plan

if TYPE_CHECKING:  # rich is imported where a panel is drawn: the plain lines (window_lines, the
    # styles) are all a watcher whose output is not a terminal needs from here
    from rich.console import RenderableType
    from rich.panel import Panel
    from rich.text import Text

OK, WAIT, BAD = "green", "yellow", "red"

_STATE_STYLE = {
    "READY": OK,
    "CREATING": WAIT, "RESTARTING": WAIT, "REIMAGING": WAIT, "DELETING": WAIT, "REPAIRING": WAIT,
    "STARTING": WAIT, "STOPPING": WAIT, "HIDING": WAIT, "UNHIDING": WAIT,
    "UNKNOWN": WAIT,  # "unknown state after a failed repair": tpuwatch waits 5 min, then recreates it
    "PREEMPTED": BAD, "TERMINATED": BAD, "STOPPED": BAD, "HIDDEN": BAD,
}
_HEALTH_STYLE = {
    "HEALTHY": OK,
    "TIMEOUT": WAIT,
    "UNHEALTHY_MAINTENANCE": WAIT,  # resumes once the maintenance is over
    "UNHEALTHY_TENSORFLOW": BAD,
}
_EVENT_STYLE = {"terminate": BAD, "restart": WAIT, "upcoming_maintenance": WAIT}


def _style(value: str, table: dict[str, str]) -> str:
    if value.startswith("UNKNOWN_ENUM_"):
        return BAD  # a value added after this release: flag it rather than call it fine
    return table.get(value, "")


def state_style(state: str) -> str:
    """"green", "yellow", "red", or "" (unspecified)."""
    return _style(state, _STATE_STYLE)


def health_style(health: str) -> str:
    return _style(health, _HEALTH_STYLE)


def when(t: datetime | None, now: datetime) -> str:
    """"2022-01-26 03:44:36Z (2h05m ago)" or "(in 3h05m)"; "-" when unknown."""
    if t is None:
        return "-"
    t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    stamp = t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{stamp} ({relative(t, now)})"


def relative(t: datetime, now: datetime) -> str:
    delta = (t - now).total_seconds()
    return f"in {human(delta)}" if delta > 0 else f"{human(-delta)} ago"


def local(t: datetime) -> str:
    """`Wed 01 May 17:00 CEST`: the time in this machine's time zone (TZ), for people."""
    t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return t.astimezone().strftime("%a %d %b %H:%M %Z")


def window_lines(um: UpcomingMaintenance, now: datetime, *, watched: bool, start_early: bool = True,
                 next_checkpoint_in: float | None = None) -> list[str]:
    """The announced window in local and relative time, whether it can be started early, and
    what tpuwatch will do: the lines `status`, the dashboard and `events` show."""
    lines = []
    if um.window_start is not None:
        span = local(um.window_start)
        if um.window_end is not None:
            end = local(um.window_end)
            same_day = span[:len("Wed 01 May")] == end[:len("Wed 01 May")]
            span += " to " + (end[len("Wed 01 May "):] if same_day else end)
        lines.append(f"{um.type} {um.status} {relative(um.window_start, now)}: {span}")
    else:
        lines.append(f"{um.type} {um.status}, window not given")
    lines.append("may be started early" if can_start_early(um) else "cannot be started early")
    lines.append(maintenance_plan(um, watched=watched, start_early=start_early,
                                  next_checkpoint_in=next_checkpoint_in))
    return lines


def _upcoming(um: UpcomingMaintenance, now: datetime, watched: bool) -> Text:
    from rich.text import Text

    text = Text()
    text.append(f"{um.type} {um.status}", style=WAIT)
    if um.window_start is not None:
        text.append(f"\nwindow {when(um.window_start, now)}")
        text.append(f"\n  local {local(um.window_start)}")
        if um.window_end is not None:
            text.append(f"\n  to {when(um.window_end, now)}")
    if um.latest_window_start is not None:
        text.append(f"\nlatest start {when(um.latest_window_start, now)}")
    _, early, plan = window_lines(um, now, watched=watched)
    text.append(f"\n{early}\ntpuwatch: {plan}")
    return text


def _kind(node: NodeSnapshot) -> str:
    bits = [node.accelerator_type or "?"]
    if node.topology:
        bits[0] += f" ({node.topology})"
    if node.runtime_version:
        bits.append(node.runtime_version)
    if node.spot:
        bits.append("spot")
    elif node.preemptible:
        bits.append("preemptible")
    return " · ".join(bits)


def node_panel(
    node: NodeSnapshot,
    *,
    now: datetime,
    events: Sequence[AuditEvent] = (),
    job: Sequence[tuple[str, str]] = (),
    max_events: int = 5,
    max_symptoms: int = 5,
) -> Panel:
    """A rich Panel for one node; `events` are this node's, oldest first; `job` extra rows."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, min_width=9)
    grid.add_column(overflow="fold")

    status = Text()
    status.append(node.state, style=state_style(node.state))
    if node.usable:
        status.append("  usable", style=OK)
    grid.add_row("state", status)
    health = Text()
    health.append(node.health, style=health_style(node.health))
    if node.health_description:
        health.append("\n" + node.health_description)
    grid.add_row("health", health)
    if node.maintenance_time is not None:
        grid.add_row("maint.", when(node.maintenance_time, now))
    grid.add_row("type", _kind(node))
    grid.add_row("zone", f"{node.project}/{node.zone}")
    if node.labels:
        grid.add_row("labels", ", ".join(f"{k}={v}" for k, v in sorted(node.labels.items())))
    ident = node.id or "-"
    if node.create_time is not None:
        ident += f", created {when(node.create_time, now)}"
    grid.add_row("id", ident)
    if node.upcoming_maintenance is not None:
        grid.add_row("upcoming", _upcoming(node.upcoming_maintenance, now, node.owner is not None))
    if node.symptoms:
        rows = []
        newest = sorted(node.symptoms, key=lambda s: s.time or datetime.min.replace(tzinfo=timezone.utc))
        for s in newest[-max_symptoms:]:
            line = Text()
            line.append(s.type, style=BAD)
            line.append(f" worker {s.worker_id or '?'} {when(s.time, now)}")
            if s.details:
                line.append(f": {s.details}")
            rows.append(line)
        if len(node.symptoms) > max_symptoms:
            rows.insert(0, Text(f"({len(node.symptoms) - max_symptoms} older not shown)", style="dim"))
        grid.add_row("symptoms", Group(*rows))
    grid.add_row("workers", _workers(node))
    disruptions = [e for e in events if e.kind in ("terminate", "restart")]
    if disruptions:
        rows = []
        for e in disruptions[-max_events:]:
            line = Text()
            line.append(f"{e.kind:<9}", style=_EVENT_STYLE.get(e.kind, ""))
            line.append(f" {when(e.time, now)}")
            if e.worker is not None:
                line.append(f" worker {e.worker}")
            if e.reason:
                line.append(f" {e.reason}")
            rows.append(line)
        grid.add_row("events", Group(*rows))
    else:
        grid.add_row("events", Text("no terminate/restart in the audit log", style="dim"))
    for key, value in job:
        grid.add_row(key, value)
    return Panel(grid, title=Text(node.name, style="bold"), title_align="left", border_style=state_style(node.state) or "dim")


def _workers(node: NodeSnapshot) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    if not node.workers:
        return Text("none reported", style="dim")
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right")
    table.add_column()
    table.add_column()
    for w in node.workers:
        table.add_row(str(w.index), w.internal_ip or "-", w.external_ip or "(no external IP)")
    return table
