"""`tpuwatch history`: the job's journal as a timeline (events and attempts)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click

from tpuwatch.commands.common import CONFIG_OPTION
from tpuwatch.durations import human, parse_duration
from tpuwatch.errors import UsageError

EPILOG = """\b
Examples:
  tpuwatch history -c tpuwatch.toml
  tpuwatch history -c tpuwatch.toml --since 6h --json
"""


@click.command(epilog=EPILOG)
@CONFIG_OPTION
@click.option("--since", help="Only events newer than this: a duration (24h, 7d) or an RFC 3339 time.")
@click.option("--limit", type=click.IntRange(1, 100000), default=None, help="Only the newest N events.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with events and attempts.")
def command(config_path: Path, since: str | None, limit: int | None, as_json: bool) -> int:
    """Show what tpuwatch saw, decided and did for the job, oldest first, and its attempts."""
    from tpuwatch.config import load_config
    from tpuwatch.journal import Journal

    cfg = load_config(config_path, require_command=False)
    start = since_time(since)
    with Journal.open(cfg.state_dir, cfg.job_name, cfg.tpu_name, readonly=True) as journal:
        events = journal.events(since=start, limit=limit)
        attempts = journal.attempts()
    if as_json:
        click.echo(json.dumps({
            "job": cfg.job_name,
            "events": [{"time": e.time.isoformat(), "kind": e.kind, "reason": e.reason, "data": e.data}
                       for e in events],
            "attempts": [{"attempt": a.number, "start": a.start.isoformat(),
                          "end": a.end.isoformat() if a.end else None, "node_id": a.node_id,
                          "start_step": a.start_step, "end_step": a.end_step, "outcome": a.outcome,
                          "charged": a.charged, "exit_code": a.exit_code, "reason": a.reason}
                         for a in attempts],
        }, sort_keys=True))
        return 0
    for e in events:
        click.echo(f"{e.time.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}  {e.kind:<13} {e.reason}")
    if attempts:
        click.echo("")
        click.echo("attempt  ran      steps        outcome       charged  exit  node id")
        for a in attempts:
            ran = human((a.end - a.start).total_seconds()) if a.end else "running"
            steps = f"{'-' if a.start_step is None else a.start_step}->{'-' if a.end_step is None else a.end_step}"
            click.echo(f"{a.number:<8} {ran:<8} {steps:<12} {a.outcome or '-':<13} "
                       f"{'-' if a.charged is None else ('yes' if a.charged else 'no'):<8} "
                       f"{'-' if a.exit_code is None else a.exit_code:<5} {a.node_id}")
    return 0


def since_time(text: str | None) -> datetime | None:
    """--since: a duration back from now (24h, 7d) or an RFC 3339 time; exit 2 naming the flag."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        pass
    else:
        if when.tzinfo is None:
            raise UsageError(f"--since: {text[:100]!r} has no time zone; add one, e.g. {when.isoformat()}Z")
        return when
    try:
        seconds = parse_duration(text, key="--since")
    except UsageError:
        raise UsageError(f"--since: {text!r} is neither a duration (24h, 7d) nor an RFC 3339 time") from None
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)
