"""`tpuwatch watch`: reconcile tick after tick until the job finishes (0) or fails (1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tpuwatch.commands.common import jobs_options, open_journal_or_busy, single_config, tick_flags
from tpuwatch.errors import JobFailed

EPILOG = """\b
Examples:
  tpuwatch watch -c tpuwatch.toml            # live dashboard on a terminal
  tpuwatch watch -c tpuwatch.toml --json     # one JSON object per change
  tpuwatch watch -c tpuwatch.toml --plain    # timestamped lines on a terminal
  tpuwatch watch -c tpuwatch.toml --metrics-port 9464   # Prometheus /metrics and /healthz
  nohup tpuwatch watch -c tpuwatch.toml >> watch.log 2>&1 & # to a file
  tpuwatch watch -c a.toml -c b.toml         # several jobs in one watcher, a row each
  tpuwatch watch --config-dir ~/jobs/        # every *.toml there; new, removed, changed files picked up

Ctrl-C stops watching and leaves the job running on the workers.
"""


@click.command(epilog=EPILOG)
@jobs_options
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one per change.")
@click.option("--plain", is_flag=True, help="Plain timestamped lines even on a terminal.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve Prometheus /metrics and /healthz on this port (default: [metrics] port).")
def command(config_path: tuple[Path, ...], config_dir: Path | None, project: str | None, zone: str | None,
            adopt: bool, recreate_missing: bool, dry_run: bool, as_json: bool, plain: bool,
            metrics_port: int | None) -> int:
    """Keep the job alive: watch the TPU, its audit log and the workers, and recover.

    On a terminal it shows a live dashboard; otherwise it prints one timestamped line per
    event. It returns when the job has finished (exit 0), or has failed or needs a person
    (exit 1: e.g. the TPU was deleted by someone else, or is not tpuwatch's to delete).
    With several jobs (-c repeated, --config-dir) it shows a row per job and returns when
    every job named by -c has ended, with the most severe of their exit codes; a directory
    is watched until Ctrl-C.
    """
    one = single_config(config_path, config_dir)
    if one is None:
        from tpuwatch.commands.many import watch_many

        return watch_many(config_path, config_dir, project, zone, tick_flags(adopt, recreate_missing, dry_run),
                          as_json=as_json, plain=plain, metrics_port=metrics_port)
    return _watch_one(one, project, zone, adopt, recreate_missing, dry_run, as_json, plain, metrics_port)


def _watch_one(config_path: Path, project: str | None, zone: str | None, adopt: bool,
               recreate_missing: bool, dry_run: bool, as_json: bool, plain: bool, metrics_port: int | None) -> int:
    from tpuwatch.loop import run_job
    from tpuwatch.outputs import Outputs
    from tpuwatch.wiring import load_job, real_ports

    job = load_job(config_path, project, zone)
    outputs = Outputs.prepare(job, dry_run=dry_run, metrics_port=metrics_port, serve=True)
    journal = open_journal_or_busy(job)
    if journal is None:
        raise JobFailed(f"another tpuwatch is working on {job.name}; stop it first (only one may watch a job)")
    live = sys.stdout.isatty() and not (as_json or plain)
    with journal:
        ports = real_ports(job)
        view = _view(job, journal, live, as_json)
        try:
            with view:
                # A job that needs a person (HALTED) ends the watch too (exit 1), so a wrapper or
                # unit sees it; the journal keeps everything, and the next watch resumes.
                report = run_job(job.cfg, job.pcfg, ports, journal, tick_flags(adopt, recreate_missing, dry_run),
                                 view, outputs=outputs)
                return int(report.exit_code)
        except KeyboardInterrupt:
            click.echo(f"stopped watching {job.name}; the job keeps running on the workers. "
                       f"Resume with `tpuwatch watch -c {config_path}`.", err=True)
            return 0


def _view(job: Any, journal: Any, live: bool, as_json: bool) -> Any:
    """The dashboard on a terminal; otherwise one parseable timestamped line per change."""
    from tpuwatch.ui.dashboard import LineView, LiveView

    return LiveView(job.name, job.pcfg, journal) if live else LineView(job.name, as_json)
