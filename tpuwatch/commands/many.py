"""`watch` and `check` with several jobs (-c repeated, --config-dir): tpuwatch/fleet does the work."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tpuwatch.errors import UsageError
from tpuwatch.ports import Flags

if TYPE_CHECKING:
    from tpuwatch.fleet.runner import Options


def _options(config_dir: Path | None, project: str | None, zone: str | None, flags: Flags) -> Options:
    from tpuwatch.fleet import sources
    from tpuwatch.fleet.runner import Options

    if config_dir is not None:
        sources.check_dir(config_dir)
    return Options(project=project, zone=zone, flags=flags)


def watch_many(files: tuple[Path, ...], config_dir: Path | None, project: str | None, zone: str | None,
               flags: Flags, *, as_json: bool, plain: bool, metrics_port: int | None) -> int:
    from tpuwatch.fleet.runner import Fleet
    from tpuwatch.metrics import Exporter
    from tpuwatch.ui.jobs import FleetLineView, FleetLiveView

    options = _options(config_dir, project, zone, flags)
    # One endpoint for every job (a `job_name` label each): --metrics-port; a job's own
    # [metrics] port names one process's endpoint and is not used here.
    exporter = Exporter(metrics_port, "--metrics-port", None) if metrics_port else None
    live = sys.stdout.isatty() and not (as_json or plain)
    fleet: Fleet
    if live:
        view = FleetLiveView(lambda: fleet.states())
        fleet = Fleet(files, config_dir, options, view, exporter)
    else:
        fleet = Fleet(files, config_dir, options, FleetLineView(as_json), exporter)
    try:
        if live:
            with view:
                return fleet.run()
        return fleet.run()
    except KeyboardInterrupt:
        click.echo("stopped watching; the jobs keep running on their workers. Resume with the same command.",
                   err=True)
        return 0
    finally:
        if exporter is not None:
            exporter.close()


def check_many(files: tuple[Path, ...], config_dir: Path | None, project: str | None, zone: str | None,
               flags: Flags, *, as_json: bool) -> int:
    from tpuwatch.fleet.once import check_all
    from tpuwatch.fleet.runner import most_severe
    from tpuwatch.ui.tickview import tick_dict, tick_line

    options = _options(config_dir, project, zone, flags)
    results = check_all(files, config_dir, options)
    if not results:
        raise UsageError(f"--config-dir {str(config_dir)!r} holds no *.toml: nothing to check")
    for r in results:
        s = r.state
        if as_json:
            out = {**s.as_dict(), **(tick_dict(r.report) if r.report is not None else {})}
            if r.report is not None:
                out["warnings"] = [*out["warnings"], *r.notes]
            click.echo(json.dumps(out, sort_keys=True))
        elif r.report is not None:
            click.echo(f"{s.name}: {tick_line(r.report)}")
            for line in (*r.report.done, *r.report.warnings, *r.notes):
                click.echo(f"  - {line}")
        else:
            click.echo(f"{s.name}: {s.status.replace('_', ' ')}: {s.error} ({s.path})")
    return most_severe([r.state.exit_code for r in results])
