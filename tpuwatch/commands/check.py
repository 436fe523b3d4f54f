"""`tpuwatch check`: exactly one reconcile tick, then exit (for cron or a systemd timer)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tpuwatch.commands.common import jobs_options, open_journal_or_busy, single_config, tick_flags
from tpuwatch.errors import UsageError

EPILOG = """\b
Examples:
  tpuwatch check -c ~/tpuwatch.toml
  */2 * * * * tpuwatch check -c $HOME/tpuwatch.toml || echo "tpuwatch needs you"
  tpuwatch check -c ~/tpuwatch.toml --metrics-file /var/lib/node_exporter/textfile/tpuwatch.prom
  tpuwatch check --config-dir ~/jobs/       # one tick of every job there; the most severe exit code

Exit codes: 0 running, recovering or finished (also when another tpuwatch holds the job);
1 the job failed or needs a person; 2 bad config or flags; 3 the cloud API cannot be used.
"""


@click.command(epilog=EPILOG)
@jobs_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: what was seen, decided, done.")
@click.option("--metrics-file", type=click.Path(path_type=Path), default=None,
              help="Also write the job's Prometheus metrics to this *.prom file (node_exporter's textfile "
                   "collector), atomically.")
def command(config_path: tuple[Path, ...], config_dir: Path | None, project: str | None, zone: str | None,
            adopt: bool, recreate_missing: bool, dry_run: bool, as_json: bool, metrics_file: Path | None) -> int:
    """Run one tick: look at the TPU, the workers and the checkpoints, act, journal, exit.

    It never waits for a long cloud operation: it starts it, journals it, and the next
    check follows it up. Safe to overlap: a second check while one runs exits 0 at once.
    Alerts ([[notify]]) of this tick are sent once, for at most 15 s; what is not sent by then
    is sent by the next check. With several jobs (-c repeated, --config-dir) each gets one
    tick (a few at once), and the exit code is the most severe of theirs.
    """
    one = single_config(config_path, config_dir)
    if one is None:
        from tpuwatch.commands.many import check_many

        if metrics_file is not None:
            raise UsageError("--metrics-file takes one job; with several jobs use `watch --metrics-port`")
        return check_many(config_path, config_dir, project, zone, tick_flags(adopt, recreate_missing, dry_run),
                          as_json=as_json)
    return _check_one(one, project, zone, adopt, recreate_missing, dry_run, as_json, metrics_file)


def _check_one(config_path: Path, project: str | None, zone: str | None, adopt: bool,
               recreate_missing: bool, dry_run: bool, as_json: bool, metrics_file: Path | None) -> int:
    from tpuwatch.outputs import Outputs
    from tpuwatch.tick import Reconciler
    from tpuwatch.ui.tickview import tick_dict, tick_line
    from tpuwatch.wiring import load_job, real_ports

    job = load_job(config_path, project, zone)
    outputs = Outputs.prepare(job, dry_run=dry_run, metrics_file=metrics_file)
    journal = open_journal_or_busy(job)
    if journal is None:
        click.echo(f"another tpuwatch is working on {job.name}; nothing to do")
        return 0
    with journal:
        outputs.start(journal)
        ports = real_ports(job)
        rec = Reconciler(job.cfg, job.pcfg, ports, journal, tick_flags(adopt, recreate_missing, dry_run))
        try:
            report = rec.tick()
        finally:
            ports.workers.close()  # the shared SSH connections end with the run
        notes = outputs.after_tick(report)
        notes += outputs.close(report)
    if as_json:
        out = tick_dict(report)
        out["warnings"] = [*out["warnings"], *notes]  # alerts not sent yet, or given up
        click.echo(json.dumps(out, sort_keys=True))
    else:
        click.echo(f"{job.name}: {tick_line(report)}")
        for line in (*report.done, *report.warnings, *notes):
            click.echo(f"  - {line}")
    return report.exit_code
