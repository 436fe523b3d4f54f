"""The `watch` dashboard: one job's node, workers, attempt, checkpoint, budgets and next step.

Pure rendering from a TickReport (plus the journal's last events and the next tick time); fits
80 columns. Colours mean what they mean in the node panel: green ok, yellow waiting or
recovering, red broken or needs a person. Every coloured fact is also said in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tpuwatch.durations import human
from tpuwatch.journal import JournalEvent
from tpuwatch.policy import Phase, PolicyConfig
from tpuwatch.tick import TickReport
from tpuwatch.ui.node import BAD, OK, WAIT, health_style, state_style

PHASE_STYLE = {
    Phase.RUNNING: OK, Phase.DONE: OK, Phase.IDLE: WAIT, Phase.BACKOFF: WAIT,
    Phase.WAITING_NODE: WAIT, Phase.DELETING: WAIT, Phase.CREATING: WAIT, Phase.QUEUED: WAIT,
    Phase.PAUSED: BAD, Phase.HALTED: BAD, Phase.FAILED: BAD,
}
WORKER_STYLE = {"running": OK, "exited": WAIT, "absent": "", "unreachable": BAD}


def dashboard(report: TickReport, job: str, pcfg: PolicyConfig, events: Sequence[JournalEvent],
              next_tick: datetime | None, now: datetime) -> RenderableType:
    mem = report.memory
    head = Table.grid(padding=(0, 1))
    head.add_column(style="bold", no_wrap=True)
    head.add_column(overflow="fold")
    node = report.node
    if node is None:
        head.add_row("node", Text(f"{pcfg.tpu_name}: not found", style=BAD))
    else:
        line = Text(f"{node.name} ({node.zone}) ")
        line.append(node.state, style=state_style(node.state))
        line.append(" / ")
        line.append(node.health or "-", style=health_style(node.health))
        head.add_row("node", line)
        if node.health_description:
            head.add_row("", Text(node.health_description, style="dim"))
    head.add_row("job", Text(f"{mem.phase.value}", style=PHASE_STYLE.get(mem.phase, "")) +
                 Text(f"  attempt {mem.attempt}" + (f", up {human((now - mem.attempt_start).total_seconds())}"
                                                      if mem.attempt_start and mem.phase is Phase.RUNNING else "")))
    ck = report.checkpoint
    if ck is None:
        head.add_row("checkpoint", Text("none yet", style="dim"))
    else:
        age = f", {human(max(0.0, (now - ck.time).total_seconds()))} old" if ck.time else ""
        head.add_row("checkpoint", f"step {ck.step}{age}  {ck.path}")
    head.add_row("budgets", f"restarts {mem.restarts}/{pcfg.max_restarts}  "
                            f"recreates {mem.recreates}/{pcfg.max_recreates}  "
                            f"no-progress {mem.no_progress}/{pcfg.no_progress_limit}  "
                            f"disruptions {mem.disruptions}")
    nxt = report.decision.summary
    if next_tick is not None and not report.decision.terminal:
        nxt += f"  (next look in {human(max(0.0, (next_tick - now).total_seconds()))})"
    head.add_row("now", Text(nxt, style=PHASE_STYLE.get(mem.phase, "")))
    parts: list[RenderableType] = [head]
    if report.probes:
        workers = Table(box=None, padding=(0, 1), show_edge=False)
        for col in ("worker", "state", "attempt", "exit"):
            workers.add_column(col, no_wrap=True)
        for p in report.probes:
            workers.add_row(str(p.worker), Text(p.state, style=WORKER_STYLE.get(p.state, "")),
                            "-" if p.attempt is None else str(p.attempt),
                            "-" if p.exit_code is None else str(p.exit_code))
        parts.append(workers)
    if events:
        log = Table.grid(padding=(0, 1))
        log.add_column(style="dim", no_wrap=True)
        log.add_column(overflow="fold")
        for ev in events[-6:]:
            log.add_row(ev.time.strftime("%H:%M:%S"), f"{ev.kind}: {ev.reason}")
        parts.append(Panel(log, title="last events", title_align="left", border_style="dim"))
    for w in report.warnings:
        parts.append(Text(f"warning: {w}", style=WAIT))
    return Panel(Group(*parts), title=f"tpuwatch · {job}", title_align="left", width=80)
