"""`tpuwatch watch`: reconcile tick after tick until the job finishes (0) or fails (1)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click

from tpuwatch.commands.common import job_options, open_journal_or_busy, tick_flags
from tpuwatch.errors import EXIT_CLOUD, CloudError, JobFailed

EPILOG = """\b
Examples:
  tpuwatch watch -c tpuwatch.toml            # live dashboard on a terminal
  tpuwatch watch -c tpuwatch.toml --json     # one JSON object per change, for machines
  nohup tpuwatch watch -c tpuwatch.toml >> watch.log 2>&1 &   # plain timestamped lines

Ctrl-C stops watching and leaves the job running on the workers.
"""
MAX_CLOUD_FAILURES = 10  # ticks in a row the cloud API may fail (after its own retries) before exit 3


def next_delay(report: Any, poll: float) -> float:
    """Seconds to the next tick: the poll interval while all is well, faster while it is not."""
    d = report.decision
    steady = d.row in ("running", "terminal", "person_stopped")
    delay = poll if steady else min(poll, max(poll / 6, 1.0) if poll >= 1 else poll)
    for action in d.actions:
        until = getattr(action, "until", None)
        if isinstance(until, datetime):
            delay = min(delay, max((until - report.time).total_seconds(), 0.05))
    return max(delay, 0.05)


@click.command(epilog=EPILOG)
@job_options
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one per change.")
@click.option("--plain", is_flag=True, help="Plain timestamped lines even on a terminal.")
def command(config_path: Path, project: str | None, zone: str | None, adopt: bool,
            recreate_missing: bool, dry_run: bool, as_json: bool, plain: bool) -> int:
    """Keep the job alive: watch the TPU, its audit log and the workers, and recover.

    On a terminal it shows a live dashboard; otherwise it prints one timestamped line per
    event. It returns when the job has finished (exit 0) or failed (exit 1).
    """
    from tpuwatch.tick import Reconciler
    from tpuwatch.wiring import load_job, real_ports

    job = load_job(config_path, project, zone)
    journal = open_journal_or_busy(job)
    if journal is None:
        raise JobFailed(f"another tpuwatch is working on {job.name}; stop it first (only one may watch a job)")
    poll = float(job.cfg.recovery["poll_interval"])
    live = sys.stdout.isatty() and not (as_json or plain)
    with journal:
        rec = Reconciler(job.cfg, job.pcfg, real_ports(job), journal,
                         tick_flags(adopt, recreate_missing, dry_run))
        view = _Live(job, journal) if live else _Lines(job.name, as_json)
        failures = 0
        try:
            with view:
                while True:
                    try:
                        report = rec.tick()
                        failures = 0
                    except CloudError as exc:
                        failures += 1
                        if failures == 1 and view.ticks == 0 or failures >= MAX_CLOUD_FAILURES \
                                or exc.exit_code != EXIT_CLOUD:
                            raise
                        view.warn(f"cloud API failed ({failures}/{MAX_CLOUD_FAILURES}): {exc.message}")
                        time.sleep(poll)
                        continue
                    delay = next_delay(report, poll)
                    view.show(report, report.time + timedelta(seconds=delay))
                    if report.decision.terminal or dry_run:
                        return report.exit_code
                    time.sleep(delay)
        except KeyboardInterrupt:
            click.echo(f"stopped watching {job.name}; the job keeps running on the workers. "
                       f"Resume with `tpuwatch watch -c {config_path}`.", err=True)
            return 0


class _Lines:
    """Non-TTY output: a timestamped line (or JSON object) per change, never one per quiet tick."""

    def __init__(self, job: str, as_json: bool) -> None:
        self.job = job
        self.as_json = as_json
        self.last: tuple[Any, ...] | None = None
        self.ticks = 0

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def warn(self, text: str) -> None:
        click.echo(f"{_stamp(datetime.now(timezone.utc))} {self.job} warning: {text}", err=True)

    def show(self, report: Any, next_tick: datetime) -> None:
        self.ticks += 1
        node = report.node
        key = (report.decision.row, report.memory.phase, report.memory.attempt,
               None if node is None else (node.state, node.health, node.id),
               None if report.checkpoint is None else report.checkpoint.step)
        if key == self.last and not report.done and not report.events and not report.warnings:
            return
        self.last = key
        if self.as_json:
            click.echo(json.dumps({"job": self.job, **report.as_dict()}, sort_keys=True))
            return
        stamp = _stamp(report.time)
        for ev in report.events:
            click.echo(f"{stamp} {self.job} audit: {ev.kind} {ev.node}"
                       f"{'' if ev.worker is None else ' worker ' + ev.worker} at {_stamp(ev.time)}"
                       f"{' reason=' + ev.reason if ev.reason else ''}")
        click.echo(f"{stamp} {self.job} {report.line()}")
        for line in (*report.done, *report.warnings):
            click.echo(f"{stamp} {self.job}   - {line}")


class _Live:
    """TTY output: a rich Live dashboard, redrawn in place (no flicker, no scrolling)."""

    def __init__(self, job: Any, journal: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        self.job = job
        self.journal = journal
        self.console = Console()
        self.live = Live(console=self.console, auto_refresh=True, refresh_per_second=2,
                         transient=False, redirect_stderr=False)
        self.ticks = 0
        self.report: Any = None
        self.next_tick: datetime | None = None

    def __enter__(self) -> _Live:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/] {text}")

    def show(self, report: Any, next_tick: datetime) -> None:
        from tpuwatch.ui.dashboard import dashboard

        self.ticks += 1
        events = self.journal.events(limit=6)
        now = datetime.now(timezone.utc)
        self.live.update(dashboard(report, self.job.name, self.job.pcfg, events, next_tick, now))


def _stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
