"""`tpuwatch events NAME [-c tpuwatch.toml] [--since 24h|7d|RFC3339]`: the node's maintenance timeline.

One audit-log query (all its pages), oldest event first, with terminateReason as the log
gives it; when the zone is known, one get of the node for its announced maintenance (the
window in local and relative time, whether it may start early, what tpuwatch will do) and its
instances, whose Compute Engine entries name them: v2alpha1's, or, for a slice made through
Compute Engine (-c with tpu.api = "compute", or no TPU node of that name), the instance's or
the MIG's.
Read-only; the zone, when known, also narrows matches to that zone's node.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpuwatch.cloud.apis import default_reader, other_readers
from tpuwatch.cloud.base import SliceReader, parse_rfc3339
from tpuwatch.cloud.location import resolve
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.config import Config
from tpuwatch.durations import parse_duration
from tpuwatch.errors import CloudError, ConfigError, NotFoundError, TpuwatchError, UsageError
from tpuwatch.model import NodeSnapshot
from tpuwatch.ui.node import relative, window_lines
from tpuwatch.ui.serialize import event_json, rfc3339, upcoming_json

_LOOKS_LIKE_DATE = re.compile(r"^\d{4}-")
_FULL_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:?\d\d)$")
_KIND_STYLE = {"terminate": "red", "restart": "yellow", "upcoming_maintenance": "yellow"}

HELP = """Show the maintenance timeline of a TPU from the system-event audit log:
tpu.nodes.terminate (with its terminateReason), tpu.nodes.restart and
compute.instances.upcomingMaintenance entries, oldest first. For a TPU made
through Compute Engine (an instance or a MIG), its instances' system events:
hostError, preempted, terminateOnHostMaintenance, automaticRestart,
repair.recreateInstance and upcomingMaintenance.

\b
NAME: the TPU, instance or MIG (default with -c: the job's [tpu] name; the
config's [tpu] api then says which API to ask).

\b
--since takes a duration back from now (90m, 24h, 7d) or an RFC 3339 time
(2024-05-01T00:00:00Z). Default 24h.
--json prints {"project", "zone", "node", "since", "events": [{time, kind, node,
worker, method, reason, insert_id, resource_name}], "upcoming_maintenance"
(as in status --json, or null), "upcoming_error"}. The upcoming maintenance
is read only when the zone is known.

Exit codes: 0 shown, 2 bad usage (e.g. a malformed --since), 3 cloud API error.
"""


def _node(project: str, zone: str | None, name: str, cfg: Config | None
          ) -> tuple[NodeSnapshot | None, dict[str, tuple[str, str]], str | None]:
    """The node (for its announced maintenance) and its worker VMs by instance name (whose
    Compute Engine entries name them), when the zone is known. With -c, the job's [tpu] api says
    where it is; without, the TPU API first, then a Compute Engine instance or MIG of that name.
    A failed read is told, not fatal: the timeline is this command's answer."""
    if not zone:
        return None, {}, None
    from tpuwatch.wiring import slice_reader

    apis: list[SliceReader] = ([slice_reader(cfg, project)(zone)] if cfg is not None else
                               [default_reader(project, zone), *other_readers(project, zone)])
    for n, api in enumerate(apis):
        try:
            node = api.get_node(name)
        except (CloudError, NotFoundError) as exc:
            return None, {}, str(exc) if n == 0 else None  # a guess at Compute Engine is not worth a warning
        except UsageError:
            if n == 0:
                raise
            node = None  # not a name Compute Engine allows
        if node is None:
            continue
        try:
            return node, dict(api.worker_instances(node)), None
        except TpuwatchError:
            return node, {}, None  # the node's own entries are still shown
    return None, {}, None


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
  tpuwatch events -c tpuwatch.toml --since 7d    # the job's TPU, instance or MIG
"""


@click.command(name="events", help=HELP, epilog=EPILOG)
@click.argument("name", required=False)
@click.option("--since", "since_text", default="24h", show_default=True,
              help="How far back: a duration (24h, 7d) or an RFC 3339 time.")
@click.option("--project", help="GCP project (default: env, gcloud).")
@click.option("--zone", help="Only this zone's node of that name (default: env, gcloud; else any zone).")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="tpuwatch.toml: its [tpu] name, api, project and zone are the defaults.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(name: str | None, since_text: str, project: str | None, zone: str | None,
            config_path: Path | None, as_json: bool) -> None:
    now = datetime.now(timezone.utc)
    start = parse_since(since_text, now)
    cfg: Config | None = None
    if config_path is not None:
        from tpuwatch.config import load_config

        cfg = load_config(config_path, require_command=False)
        name = cfg.tpu_name if name is None else name
    if name is None:
        raise UsageError("events: name a TPU (tpuwatch events NAME), or pass -c tpuwatch.toml for the job's")
    if not name:
        raise UsageError("events: NAME is empty; give a TPU name")
    loc = resolve(project, zone, need_zone=False, config_project=cfg.tpu["project"] if cfg else None,
                  config_zone=cfg.tpu["zone"] if cfg else None)
    node, instances, upcoming_error = _node(loc.project, loc.zone, name, cfg)
    reader = AuditLogReader(loc.project, zone=loc.zone)
    events = reader.since([name], start, instances)
    um = node.upcoming_maintenance if node is not None else None
    watched = node is not None and node.owner is not None
    if as_json:
        click.echo(json.dumps({
            "project": loc.project,
            "zone": loc.zone,
            "node": name,
            "since": rfc3339(start),
            "events": [event_json(e) for e in events],
            "upcoming_maintenance": upcoming_json(um, watched=watched),
            "upcoming_error": upcoming_error,
        }, indent=2))
        return
    console = Console(highlight=False)
    where = f"{loc.project}/{loc.zone}" if loc.zone else loc.project
    if um is not None:
        window, early, plan = window_lines(um, now, watched=watched)
        console.print(Text(f"upcoming  {window}", style="yellow"))
        console.print(f"          {early}; tpuwatch {plan}")
    elif upcoming_error:
        console.print(Text(f"upcoming maintenance unknown: {upcoming_error}", style="dim"))
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
