"""`tpuwatch check`: exactly one reconcile tick, then exit (for cron or a systemd timer)."""

from __future__ import annotations

import json
from dataclasses import replace
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
  tpuwatch check -c ~/tpuwatch.toml --recreate   # delete + create now, by the policy's own path

Exit codes: 0 running, recovering or finished (also when another tpuwatch holds the job);
1 the job failed or needs a person (or --recreate was not started); 2 bad config or flags; 3 the cloud API cannot be used.
"""


@click.command(epilog=EPILOG)
@jobs_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: what was seen, decided, done.")
@click.option("--metrics-file", type=click.Path(path_type=Path), default=None,
              help="Also write the job's Prometheus metrics to this *.prom file (node_exporter's textfile "
                   "collector), atomically.")
@click.option("--recreate", is_flag=True,
              help="Delete the TPU and create it again in this tick, by the policy's own path (row "
                   "recreate_asked): the running attempt is stopped uncharged, an owned TPU is deleted, and "
                   "this and later ticks create it through stockouts and fallback_zones. One job only; "
                   "exit 1 when the recreate could not be started (another tpuwatch holds the job, an "
                   "operation is in flight, the TPU is not owned).")
def command(config_path: tuple[Path, ...], config_dir: Path | None, project: str | None, zone: str | None,
            adopt: bool, recreate_missing: bool, dry_run: bool, as_json: bool, metrics_file: Path | None,
            recreate: bool) -> int:
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
        if recreate:
            raise UsageError("--recreate takes one job (-c FILE): name the job whose TPU to recreate")
        return check_many(config_path, config_dir, project, zone, tick_flags(adopt, recreate_missing, dry_run),
                          as_json=as_json)
    return _check_one(one, project, zone, adopt, recreate_missing, dry_run, as_json, metrics_file, recreate)


def _check_one(config_path: Path, project: str | None, zone: str | None, adopt: bool,
               recreate_missing: bool, dry_run: bool, as_json: bool, metrics_file: Path | None,
               recreate: bool) -> int:
    from tpuwatch.outputs import Outputs
    from tpuwatch.tick import Reconciler
    from tpuwatch.ui.tickview import tick_dict, tick_line
    from tpuwatch.wiring import load_job, real_ports

    job = load_job(config_path, project, zone)
    outputs = Outputs.prepare(job, dry_run=dry_run, metrics_file=metrics_file)
    journal = open_journal_or_busy(job)
    if journal is None:
        if recreate:
            click.echo(f"recreate not asked: another tpuwatch is working on {job.name}; stop it first, "
                       "then run check --recreate again", err=True)
            return 1
        click.echo(f"another tpuwatch is working on {job.name}; nothing to do")
        return 0
    with journal:
        outputs.start(journal)
        ports = real_ports(job)
        flags = replace(tick_flags(adopt, recreate_missing, dry_run), recreate=recreate)
        rec = Reconciler(job.cfg, job.pcfg, ports, journal, flags)
        try:
            report = rec.tick()
        finally:
            ports.workers.close()  # the shared SSH connections end with the run
        notes = outputs.after_tick(report)
        notes += outputs.close(report)
    code = report.exit_code
    if recreate and report.decision.row != "recreate_asked":
        # an operation in flight is followed first; a refusal has its own row (not_owned, ...)
        notes.append(f"recreate not started: {report.decision.row}: {report.decision.summary}")
        code = max(code, 1)
    if as_json:
        out = tick_dict(report)
        out["warnings"] = [*out["warnings"], *notes]  # alerts not sent yet, or given up
        click.echo(json.dumps(out, sort_keys=True))
    else:
        click.echo(f"{job.name}: {tick_line(report)}")
        for line in (*report.done, *report.warnings, *notes):
            click.echo(f"  - {line}")
    return code
