"""`tpuwatch events NAME [--since 24h|7d|RFC3339]`: the node's maintenance timeline.

One audit-log query (all its pages), oldest event first, with terminateReason as the log
gives it. Read-only; the zone, when known, only narrows matches to that zone's node.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpuwatch.cloud.location import resolve
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.cloud.tpu import TpuAdapter, parse_rfc3339
from tpuwatch.durations import parse_duration
from tpuwatch.errors import ConfigError, TpuwatchError, UsageError
from tpuwatch.ui.node import relative
from tpuwatch.ui.serialize import event_json, rfc3339

_LOOKS_LIKE_DATE = re.compile(r"^\d{4}-")
_FULL_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:?\d\d)$")
_KIND_STYLE = {"terminate": "red", "restart": "yellow", "upcoming_maintenance": "yellow"}

HELP = """Show the maintenance timeline of a TPU from the system-event audit log:
tpu.nodes.terminate (with its terminateReason), tpu.nodes.restart and
compute.instances.upcomingMaintenance entries, oldest first.

\b
--since takes a duration back from now (90m, 24h, 7d) or an RFC 3339 time
(2024-05-01T00:00:00Z). Default 24h.
--json prints {"project", "zone", "node", "since", "events": [{time, kind, node,
worker, method, reason, insert_id, resource_name}]}.

Exit codes: 0 shown, 2 bad usage (e.g. a malformed --since), 3 cloud API error.
"""


def parse_since(text: str, now: datetime) -> datetime:
    """`--since` as an absolute UTC time; UsageError naming --since when malformed."""
    value = text.strip()
    if _LOOKS_LIKE_DATE.match(value):
        t = parse_rfc3339(value) if _FULL_RFC3339.match(value) else None
        if t is None:
            raise UsageError(
                f"--since: {text!r} is not an RFC 3339 time; write e.g. 2024-05-01T00:00:00Z, or a duration such as 24h or 7d"
            )
        return t
    try:
        seconds = parse_duration(value, key="--since")
    except ConfigError:
        raise UsageError(
            f"--since: {text!r} is not a duration or a time; write e.g. 90m, 24h, 7d or 2024-05-01T00:00:00Z"
        ) from None
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:
        raise UsageError(f"--since: {text!r} reaches back before year 1") from None


EPILOG = """\b
Examples:
  tpuwatch events llm-pod                        # the last 24 hours
  tpuwatch events llm-pod --since 7d             # the last week
  tpuwatch events llm-pod --since 2024-05-01T00:00:00Z --json
"""


def _instances(project: str, zone: str | None, name: str) -> dict[str, tuple[str, str]]:
    """The node's worker VMs, whose upcoming-maintenance entries name them; {} when unknown."""
    if not zone:
        return {}
    adapter = TpuAdapter(project, zone)
    try:
        node = adapter.get_node(name)
    except TpuwatchError:
        return {}  # the node's own entries are still shown
    return dict(adapter.worker_instances(node)) if node is not None else {}


@click.command(name="events", help=HELP, epilog=EPILOG)
@click.argument("name")
@click.option("--since", "since_text", default="24h", show_default=True,
              help="How far back: a duration (24h, 7d) or an RFC 3339 time.")
@click.option("--project", help="GCP project (default: env, gcloud).")
@click.option("--zone", help="Only this zone's node of that name (default: env, gcloud; else any zone).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(name: str, since_text: str, project: str | None, zone: str | None, as_json: bool) -> None:
    now = datetime.now(timezone.utc)
    start = parse_since(since_text, now)
    loc = resolve(project, zone, need_zone=False)
    reader = AuditLogReader(loc.project, zone=loc.zone)
    events = reader.since([name], start, _instances(loc.project, loc.zone, name))
    if as_json:
        click.echo(json.dumps({
            "project": loc.project,
            "zone": loc.zone,
            "node": name,
            "since": rfc3339(start),
            "events": [event_json(e) for e in events],
        }, indent=2))
        return
    console = Console(highlight=False)
    where = f"{loc.project}/{loc.zone}" if loc.zone else loc.project
    if not events:
        console.print(f"no maintenance events for {name} in {where} since {rfc3339(start)}")
        return
    table = Table(title=f"{name} in {where}, since {start.strftime('%Y-%m-%d %H:%M:%SZ')}",
                  title_justify="left", box=None, padding=(0, 1), header_style="bold")
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("ago", no_wrap=True, justify="right")
    table.add_column("event", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for e in events:
        table.add_row(
            e.time.strftime("%Y-%m-%d %H:%M:%S"),
            relative(e.time, now),
            Text(e.kind.replace("_", " "), style=_KIND_STYLE.get(e.kind, "")),
            e.worker if e.worker is not None else "-",
            e.reason or "-",
        )
    console.print(table)
