"""`tpuwatch status NAME... | --all`: what the TPU API and the audit log say about nodes now.

Calls per run: one v2alpha1 get per NAME (or ONE list for `--all`), plus ONE audit-log query
for every node together, plus, for named nodes only and only when the log holds entries about
worker VMs (upcoming maintenance), one guest-attribute read per node to name its VMs. With
-c for a slice made through Compute Engine (tpu.api = "compute"), the instance or MIG is read
instead (`--all`: one list of instances, one of MIGs, one listManagedInstances per MIG), and
each MIG's resize requests once, to show the one in flight; without -c, a name the TPU API
does not know costs a get of an instance and of a MIG of that name; with -c of a job of a spare
pool (tpu.spare_pool), one list of the zone finds the pool's nodes by their label. This command only reads;
it never changes a node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from tpuwatch.cloud.apis import default_reader, describe, other_readers
from tpuwatch.cloud.base import SliceReader
from tpuwatch.cloud.location import resolve
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.config import Config
from tpuwatch.durations import human
from tpuwatch.errors import CloudError, NotFoundError, UsageError
from tpuwatch.model import AuditEvent, NodeSnapshot, QueuedStatus
from tpuwatch.policy import priority
from tpuwatch.policy.pool import said as pool_said
from tpuwatch.policy.priority import LENT_BY
from tpuwatch.ui.node import node_panel, relative
from tpuwatch.ui.serialize import event_json, node_json, rfc3339
from tpuwatch.wiring import slice_reader

EVENTS_LOOKBACK = timedelta(days=7)

HELP = """Show TPU nodes: state and health (green ok, yellow transient or waiting,
red broken), healthDescription with the maintenance time parsed out, symptoms,
upcoming maintenance with a countdown, workers with IPs, and the last
terminate/restart events from the audit log (last 7 days).

\b
NAME... one or more TPU names; --all shows every TPU in the zone.
With -c for a slice made through Compute Engine (tpu.api = "compute"):
Compute Engine instances and MIGs (--all: each MIG as one node, each
instance no MIG manages as another), a MIG's resize request in flight
with its state and since when. Without -c, a NAME the TPU API does not
know is looked up as a Compute Engine instance, then as a MIG.
Project and zone: --project/--zone, then [tpu] in --config, then
CLOUDSDK_CORE_PROJECT, GOOGLE_CLOUD_PROJECT, CLOUDSDK_COMPUTE_ZONE,
then the active gcloud configuration.

\b
--json prints one object (every field: docs/status-json.md):
  {"project", "zone", "time", "nodes": [...], "missing": [...],
   "events_error"}
  a node: name, full_name, project, zone, id, create_time, state,
  health, usable, health_description, maintenance_time, symptoms,
  upcoming_maintenance, workers, accelerator_type, topology,
  runtime_version, spot, preemptible, labels, metadata_keys,
  events, job, resize_request, config_job (with -c: the config's
  job when the node's label names another, e.g. a node it lent).
With -c of a job of a spare pool (tpu.spare_pool), the pool's nodes
too, each with the job that holds it ("spare_pool": {name, idle,
nodes: [{name, held_by}]}, null otherwise).
Times are RFC 3339 UTC; an enum value unknown to this version
shows as "UNKNOWN_ENUM_<n>".

Exit codes: 0 shown, 1 a named TPU does not exist, 2 bad usage,
3 cloud API error.
"""


def job_rows(node: NodeSnapshot, job: str = "") -> list[tuple[str, str]]:
    """Rows for the job that runs on `node`, from its journal (found by the node's tpuwatch-job
    label in the state dir): its phase and attempt, the last environment checks (one line per
    failing item, with worker and value) and a checkpoint-age warning. [] when there is none.
    `job`: the -c config's job, when the node's label names another (a node it lent to a job of
    higher priority): that job's own row too, saying to whom and why it waits.
    """
    rows: list[tuple[str, str]] = []
    if job and (mine := journal_facts(node, job)) is not None:
        rows.append(("lent by" if node.labels.get(LENT_BY) == job else "this job", mine["job"]))
    facts = journal_facts(node)
    if facts is None:
        return rows
    rows.append(("job", facts["job"]))
    pre = facts["precheck"]
    if pre is not None:
        from tpuwatch.workers.precheck import failing_lines, report_from_dict, summary

        report = report_from_dict(pre)
        age = human(max(0.0, (datetime.now(timezone.utc) - report.time).total_seconds()))
        lines = failing_lines(report)
        if lines:
            rows += [("checks" if n == 0 else "", f"FAIL {line}") for n, line in enumerate(lines)]
            rows.append(("", f"checked {age} ago"))
        else:
            rows.append(("checks", f"{summary(report)}, {age} ago"))
    if facts["checkpoint_warning"]:
        rows.append(("warning", facts["checkpoint_warning"]))
    return rows


def pool_rows(pool_name: str, pool: Mapping[str, tuple[str, str]], node: str) -> list[tuple[str, str]]:
    """A row for a node of the config's job's spare pool: the job that holds it, or idle (and why
    it cannot be claimed now)."""
    if node not in pool:
        return []
    return [("spare pool", f"{pool_name}: {_held(*pool[node])}")]


def _held(job: str, why: str) -> str:
    return f"held by job {job}" if job else f"idle, {why}" if why else "idle"


def request_rows(request: QueuedStatus | None, now: datetime) -> list[tuple[str, str]]:
    """A row for a MIG's resize request in flight: its name, state and since when."""
    if request is None:
        return []
    since = f", since {request.since.strftime('%Y-%m-%d %H:%M:%SZ')} ({relative(request.since, now)})" \
        if request.since is not None else ""
    return [("resizing", f"resize request {request.name.rsplit('/', 1)[-1]} {request.state}{since}")]


def request_json(request: QueuedStatus | None) -> dict[str, Any] | None:
    if request is None:
        return None
    return {"name": request.name, "state": request.state, "since": rfc3339(request.since)}


def journal_facts(node: NodeSnapshot, job: str = "") -> dict[str, Any] | None:
    """What the job's journal says about the job on `node` (read-only), or None. `job`: another
    job's journal than the one the node's ownership label names (-c's, when the node is not its
    own now); None when that job's label is on the node (its facts are the node's)."""
    from tpuwatch.config import default_state_dir
    from tpuwatch.errors import TpuwatchError
    from tpuwatch.journal import Journal
    from tpuwatch.spec import OWNER_LABEL

    if job and job == node.labels.get(OWNER_LABEL, ""):
        return None
    job = job or node.labels.get(OWNER_LABEL, "")
    if not job:
        return None
    try:
        journal = Journal.open(default_state_dir(), job, None, readonly=True)
    except (TpuwatchError, OSError):
        return None
    try:
        with journal:
            mem = journal.load_memory()
            pre = journal.precheck_report()
            # the warning standing: the event that raised it (journaled once per stretch)
            warned = journal.last_event("checkpoint_stale") if mem is not None and mem.marks.checkpoint_warned else None
    except (TpuwatchError, OSError):
        return None
    out: dict[str, Any] = {"job": job, "precheck": pre, "checkpoint_warning": None}
    if mem is not None:
        out["job"] = f"{job}: {mem.phase.value}, attempt {mem.attempt.number}" + (f" ({mem.reason})" if mem.reason else "")
        if mem.limp.out:  # a multislice job that runs on fewer slices (job.min_slices)
            since = f" since {mem.limp.since.isoformat()}" if mem.limp.since is not None else ""
            out["job"] += f"; limping without {', '.join(mem.limp.out)}{since}"
        if mem.limp.swapped:  # slices that run on a spare (tpu.spares)
            out["job"] += "; on spares: " + ", ".join(f"{slot} -> {node or '(lent)'}" for slot, node in mem.limp.swapped)
        if lines := priority.said(mem):  # nodes taken from, lent or handed to another job (job.priority)
            out["job"] += "; " + "; ".join(lines)
    if warned is not None:
        out["checkpoint_warning"] = f"{warned.reason} (as of {warned.time.isoformat()})"
    return out


def _guess(guesses: list[SliceReader], name: str, found_by: dict[str, SliceReader]) -> NodeSnapshot | None:
    """Without -c, a name the default API does not know: the slice of that name another API
    reads (a Compute Engine instance, else a MIG), recorded in `found_by`, or None. A read the
    cloud refuses (no permission, the API off, a name it does not allow) is not an answer: the
    name stays missing."""
    for api in guesses:
        try:
            node = api.get_node(name)
        except (CloudError, UsageError):
            return None
        if node is not None:
            found_by[name] = api
            return node
    return None


def _events_by_node(
    reader: AuditLogReader, names: list[str], start: datetime,
    instances: Mapping[str, tuple[str, str]] | None = None,
) -> tuple[dict[str, list[AuditEvent]], str | None]:
    """One query for all names (and their worker VMs, whose upcoming-maintenance entries name
    them); a failure leaves the node facts shown with a warning."""
    by_node: dict[str, list[AuditEvent]] = {n: [] for n in names}
    if not names:
        return by_node, None
    try:
        events = reader.since(names, start, instances)
    except CloudError as exc:
        return by_node, exc.message
    for ev in events:
        by_node.setdefault(ev.node, []).append(ev)
    return by_node, None


EPILOG = """\b
Examples:
  tpuwatch status llm-pod --zone us-central2-b   # state, health, events
  tpuwatch status -c tpuwatch.toml               # with the job's attempt
  tpuwatch status --all --json                   # every TPU in the zone
"""


@click.command(name="status", help=HELP, epilog=EPILOG)
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option("--all", "all_nodes", is_flag=True, help="Every TPU in the zone (one list call).")
@click.option("--project", help="GCP project (default: config, env, gcloud).")
@click.option("--zone", help="Zone, e.g. us-central2-b (default: config, env, gcloud).")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="tpuwatch.toml: its [tpu] name (a multislice job's names), project and zone are the defaults.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (see above).")
def command(
    names: tuple[str, ...], all_nodes: bool, project: str | None, zone: str | None,
    config_path: Path | None, as_json: bool,
) -> None:
    cfg_project = cfg_zone = None
    cfg: Config | None = None
    wanted = list(dict.fromkeys(names))
    if config_path is not None:
        from tpuwatch.config import load_config

        cfg = load_config(config_path, require_command=False)
        cfg_project, cfg_zone = cfg.tpu["project"], cfg.tpu["zone"]
        if not wanted and not all_nodes:
            wanted = list(dict.fromkeys((*cfg.tpu_names, *cfg.tpu["spares"])))  # every slice, and the spares
    if all_nodes and wanted:
        raise UsageError("status: give TPU names or --all, not both")
    if not all_nodes and not wanted:
        raise UsageError("status: name a TPU (tpuwatch status NAME), or pass --all for every TPU in the zone")
    loc = resolve(project, zone, config_project=cfg_project, config_zone=cfg_zone)
    assert loc.zone is not None  # need_zone=True
    # with -c, the job's API reads it (a Compute Engine MIG is shown as it is, also with no VM:
    # a flex-start MIG waiting for its resize request); without, each API in turn
    tpu = (slice_reader(cfg, loc.project, as_is=True)(loc.zone) if cfg is not None else
           default_reader(loc.project, loc.zone))
    guesses: list[SliceReader] | None = None  # the other APIs' readers, made at the first name missing

    missing: list[str] = []
    nodes: list[NodeSnapshot] = []
    found_by: dict[str, SliceReader] = {}  # a node found by another API without -c: its adapter
    # a job of a spare pool: its nodes are found by their label (one list, also read for --all)
    listed = tpu.list_nodes() if all_nodes or (cfg is not None and cfg.tpu.get("spare_pool")) else []
    if all_nodes:
        nodes = sorted(listed, key=lambda n: n.name)
    else:
        for name in wanted:
            node = tpu.get_node(name)
            if node is None and cfg is None:
                guesses = other_readers(loc.project, loc.zone) if guesses is None else guesses
                node = _guess(guesses, name, found_by)
            if node is None:
                missing.append(name)
            else:
                nodes.append(node)
        if cfg is not None and not names and (label := str(cfg.tpu.get("spare_pool") or "")):
            # -c alone: the pool's nodes beside the job's own, idle or held by any job
            nodes += sorted((n for n in listed if pool_said(label, (n,)) and n.name not in {m.name for m in nodes}),
                            key=lambda n: n.name)

    now = datetime.now(timezone.utc)
    reader = AuditLogReader(loc.project, zone=loc.zone)
    def api(node: NodeSnapshot) -> SliceReader:
        return found_by.get(node.name, tpu)

    # Lazy: a node's guest attributes are read only if the log holds an entry about a worker VM;
    # not for --all, where that would be a read per node of the zone.
    instances: Mapping[str, tuple[str, str]] | None = None if all_nodes else tpu.worker_instances(*nodes)
    if found_by:  # (a TPU node's are read lazily; these are known from the get)
        instances = {k: v for n in nodes for k, v in api(n).worker_instances(n).items()}
    events, events_error = _events_by_node(reader, [n.name for n in nodes], now - EVENTS_LOOKBACK, instances)
    requests = {n.name: api(n).resize_request(n) for n in nodes}
    pool_name = str(cfg.tpu.get("spare_pool") or "") if cfg is not None else ""
    pool = pool_said(pool_name, tuple(listed)) if pool_name else {}

    if as_json:
        out: dict[str, Any] = {
            "project": loc.project,
            "zone": loc.zone,
            "time": rfc3339(now),
            "nodes": [
                {**node_json(n), "events": [event_json(e) for e in events.get(n.name, [])],
                 "job": journal_facts(n), "resize_request": request_json(requests.get(n.name)),
                 # -c's job when the node's label names another (lent to it): its own facts too
                 "config_job": journal_facts(n, cfg.job_name) if cfg is not None else None}
                for n in nodes
            ],
            "missing": missing,
            "events_error": events_error,
            "spare_pool": {"name": pool_name, "idle": sum(1 for j, why in pool.values() if not j and not why),
                           "nodes": [{"name": n, "held_by": j or None, "unclaimable": why or None}
                                     for n, (j, why) in pool.items()]} if pool_name else None,
        }
        click.echo(json.dumps(out, indent=2))
    else:
        console = Console(highlight=False, soft_wrap=False)
        if all_nodes and not nodes:
            console.print(f"no TPUs in {loc.project}/{loc.zone}")
        for n in nodes:
            console.print(node_panel(n, now=now, events=events.get(n.name, []),
                                     job=[("made as", describe(n)), *request_rows(requests.get(n.name), now),
                                          *pool_rows(pool_name, pool, n.name),
                                          *job_rows(n, cfg.job_name if cfg is not None else "")]))
        if pool_name:
            idle = sum(1 for j, why in pool.values() if not j and not why)
            said = ", ".join(f"{n} ({_held(j, why)})" for n, (j, why) in pool.items()) or "no node labelled so"
            console.print(f"spare pool {pool_name}: {len(pool)} node(s), {idle} idle and free to claim: {said}")
        if events_error:
            click.echo(f"warning: audit log not read: {events_error}", err=True)
    for note in dict.fromkeys([*tpu.take_notes(), *(n for a in found_by.values() for n in a.take_notes())]):
        click.echo(f"warning: {note}", err=True)
    if missing:
        raise NotFoundError(
            f"no TPU named {', '.join(missing)} in {loc.project}/{loc.zone} "
            "(check the name, --project and --zone; `tpuwatch status --all` lists the zone)"
        )
