"""`tpuwatch recreate NAME`: a person's delete + create of the TPU from the saved spec.

It is the watcher's own recreate, asked for by a person: the Reconciler's ticks from row
`recreate_asked` (a running attempt stopped uncharged, the owned node deleted, the create in
tpu.zone, then each fallback zone once), with the settings and the end of policy/once.py
(`asked_recreate`, `recreate_refused`, `recreate_end`). What this module adds is what a person
needs around it: the config, spec and startup script are validated and the create request built
*before* anything is deleted (a bad config must not leave the user with no TPU); ownership is
checked before the question is asked; `--dry-run` prints the exact requests and changes nothing;
the job's journal is held for the whole recreate, so no watcher acts meanwhile and the next one
goes on from what was done here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpuwatch import zonespec
from tpuwatch.errors import JobFailed, TpuwatchError, UsageError

if TYPE_CHECKING:
    from tpuwatch.journal import Journal
    from tpuwatch.model import Checkpoint, NodeSnapshot
    from tpuwatch.policy import Memory, PolicyConfig
    from tpuwatch.policy.once import RecreateEnd
    from tpuwatch.ports import JobPorts
    from tpuwatch.tick import TickReport
    from tpuwatch.wiring import Job

HELP = """Delete the TPU and create it again from [tpu.spec] in the config, with
tpu.startup_script as its startup-script metadata. Asks for confirmation unless --yes.
A slice made through Compute Engine (tpu.api = "compute"), in its own zone: an
instance is deleted and inserted again from [tpu.compute_spec]; a MIG recreates
its instances (recreateInstances), and is inserted again only when it is gone.

It is the watcher's own recreate (policy row recreate_asked), asked for now and journaled:
an attempt the journal says runs is stopped first (not charged). Refuses a TPU that does
not carry the label tpuwatch-job=<job> (add it with `tpuwatch init NAME --adopt`, or pass
--adopt here). On no capacity or quota in the zone, tries each of tpu.fallback_zones once;
where none has any, the create stays queued in the journal and `tpuwatch watch` (or
`check`) goes on with it.

\b
--dry-run prints {"delete": request or null, "create": request or null} as JSON and
changes nothing.

Exit codes: 0 recreated (or dry run), 1 refused, failed, or no capacity anywhere,
2 bad usage or config (or no terminal to confirm on: pass --yes), 3 cloud API error.
"""


EPILOG = """\b
Examples:
  tpuwatch recreate llm-pod --dry-run            # print the requests only
  tpuwatch recreate llm-pod -c tpuwatch.toml     # asks before deleting
  tpuwatch recreate llm-pod --yes                # no question (scripts)
"""


@click.command(name="recreate", help=HELP, epilog=EPILOG)
@click.argument("name")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("tpuwatch.toml"), show_default=True, help="Config with [tpu.spec].")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Print the delete and create requests; change nothing.")
@click.option("--adopt", is_flag=True, help="Delete the TPU even without the tpuwatch-job label.")
@click.option("--project", help="GCP project (default: config, env, gcloud).")
@click.option("--zone", help="Zone (default: config, env, gcloud).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(name: str, config_path: Path, yes: bool, dry_run: bool, adopt: bool, project: str | None,
            zone: str | None, as_json: bool) -> None:
    from tpuwatch.policy import Phase
    from tpuwatch.policy.once import asked_recreate, recreate_refused
    from tpuwatch.wiring import load_job, real_ports

    job = load_job(config_path, project, zone, require_command=False)
    if name != job.cfg.tpu_name:
        raise UsageError(f"recreate: {name!r} is not the TPU of {config_path} (tpu.name = {job.cfg.tpu_name!r}); "
                         "pass the matching -c config")
    pcfg = asked_recreate(job.pcfg)
    memory = _memory(job)
    if (refused := recreate_refused(memory)) is not None:  # said before anything is asked; again under the lock
        raise JobFailed(f"recreate not started: {refused}")
    # SSH only to stop an attempt the journal says runs: a TPU is recreated without a login
    ports = real_ports(job, ssh=memory is not None and memory.phase is Phase.RUNNING)
    try:
        plan = _plan(job, pcfg, ports, adopt, memory)  # every check that can refuse, before any change
        if dry_run:
            click.echo(json.dumps({"delete": plan.delete, "create": plan.create}, indent=2))
            return
        if not yes:
            _confirm(plan.question, config_path)
        with _open_journal(job) as journal:
            say = _teller(journal, as_json)
            end, report = _recreate(job, pcfg, ports, journal, adopt, say)
            _finish(job, pcfg, ports, plan, end, report, config_path, as_json, say)
    finally:
        ports.workers.close()


@dataclass(frozen=True)
class _Plan:
    node: NodeSnapshot | None  # as it is before anything is done
    delete: dict[str, Any] | None  # the request the delete sends (None: nothing to delete)
    create: dict[str, Any] | None  # the request the create sends (None: the delete makes it again)
    question: str  # what the person is asked to confirm


def _plan(job: Job, pcfg: PolicyConfig, ports: JobPorts, adopt: bool, memory: Memory | None) -> _Plan:
    """The first requests, as the policy would send them: a config, spec or startup script the
    cloud cannot take, an unknown fallback zone, a TPU not owned, or one this job must not
    delete stops here, before anything changes."""
    from tpuwatch import recreate as rc
    from tpuwatch.model import job_node
    from tpuwatch.policy import Memory
    from tpuwatch.policy.operations import startup

    cfg, name, zone = job.cfg, pcfg.tpu_name, pcfg.zones[0]
    if not pcfg.recreatable:
        raise JobFailed(f"recreate: the slices of {name} ({', '.join(pcfg.slices)}) were created one by one, not by "
                        "one multislice queued resource; tpuwatch does not delete or create across them")
    zonespec.check(cfg.tpu["spec"], cfg.tpu["zone_overrides"], zone, cfg.tpu["fallback_zones"])
    launch = startup(pcfg, memory or Memory.initial(zone), _checkpoint(ports))
    if "launch" in launch and pcfg.checkpoints_on_vm and not pcfg.slices:
        click.echo(f"note: job.checkpoint_dir {cfg.job['checkpoint_dir']} is on the TPU VM: the new node's startup "
                   "script only sets up, and `tpuwatch watch`/`check` starts the job from what it finds there", err=True)
    create = rc.create_request_json(cfg, zone, job.location.project, launch)  # validates the spec and script
    for z in pcfg.zones[1:]:
        try:  # an unknown fallback zone must stop us before the delete, not after it
            ports.tpu_for(z).list_nodes()
        except UsageError as exc:
            raise UsageError(f"tpu.fallback_zones: {z!r} cannot be used: {exc}") from None
    node = job_node(ports.tpu_for(zone).get_node, name, pcfg.slices)
    if node is not None and not adopt and not node.owned_by(pcfg.job):
        raise rc.ownership_error(node, pcfg.job)
    delete, in_place = ports.lifecycle_for(zone).delete_plan(node)
    where = f"{job.location.project}/{zone}"
    question = (f"Recreate every instance of {name} ({node.state}) in {where}" if node is not None and in_place else
                f"Delete TPU {name} (id {node.id}, {node.state}) in {where} and create it again" if node is not None
                else f"TPU {name} does not exist in {where}. Create it")
    return _Plan(node, delete, None if in_place else rc.redacted(create), question)


def _memory(job: Job) -> Memory | None:
    """The job's memory as journaled (the attempt a create starts at boot), read without the lock."""
    from tpuwatch.errors import NotFoundError
    from tpuwatch.journal import Journal

    try:
        journal = Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, readonly=True)
    except NotFoundError:
        return None
    with journal:
        return journal.load_memory()


def _checkpoint(ports: JobPorts) -> Checkpoint | None:
    """The newest complete checkpoint, where this machine can read it (gs://)."""
    if ports.checkpoints is None:
        return None
    try:
        return ports.checkpoints.latest()
    except TpuwatchError as exc:
        click.echo(f"warning: checkpoints not read ({exc}); the startup script will start without a checkpoint",
                   err=True)
        return None


def _teller(journal: Journal, as_json: bool) -> Callable[[str], None]:
    """Tell the person what was done, and journal it beside the ticks' own records (kind
    "recreate": what `tpuwatch history` shows of a person's recreate)."""
    echo = (lambda text: click.echo(text, err=True)) if as_json else click.echo

    def say(text: str) -> None:
        echo(text)
        with journal.transaction():
            journal.add_event(datetime.now(timezone.utc), "recreate", text, {"by": "tpuwatch recreate"})

    return say


def _recreate(job: Job, pcfg: PolicyConfig, ports: JobPorts, journal: Journal, adopt: bool,
              say: Callable[[str], None]) -> tuple[RecreateEnd, TickReport]:
    """The Reconciler's ticks, from the one asked to recreate, until policy/once.py says the
    recreate ended; each tick's acts told as they are done (the tick journals them)."""
    from tpuwatch.policy.once import recreate_end, recreate_refused
    from tpuwatch.ports import Flags
    from tpuwatch.tick import Reconciler

    if (refused := recreate_refused(journal.load_memory())) is not None:
        raise JobFailed(f"recreate not started: {refused}")
    rec = Reconciler(job.cfg, pcfg, ports, journal, Flags(adopt=adopt, recreate=True))
    delay = 0.25
    while True:
        report = rec.tick()
        for line in (*report.done, *report.warnings):
            say(line)
        op = report.operation
        if report.decision.row == "no_capacity" and op is not None and op.name:
            say(f"create in {report.memory.zone} failed: {op.error_message}")
        end = recreate_end(report.decision, pcfg, first=rec.flags.recreate)
        if end is not None:
            return end, report
        rec.flags = Flags(adopt=adopt)  # asked once: the ticks that follow carry it out
        ports.sleep(delay)
        delay = min(delay * 1.6, 10.0)


def _finish(job: Job, pcfg: PolicyConfig, ports: JobPorts, plan: _Plan, end: RecreateEnd, report: TickReport,
            config_path: Path, as_json: bool, say: Callable[[str], None]) -> None:
    """Say how it ended: the new node (exit 0), or why not (exit 1)."""
    from tpuwatch import recreate as rc
    from tpuwatch.model import job_node

    name = pcfg.tpu_name
    if end.row == "recreate_queued":
        raise JobFailed(f"could not create {name}: no capacity or quota in {', '.join(pcfg.zones)} ({end.message}). "
                        f"The old TPU is deleted and the create stays queued in the journal: `tpuwatch watch -c "
                        f"{config_path}` (or `check` from cron) goes on with it until recovery.queue_timeout")
    if not end.ok:
        raise JobFailed(f"recreate of {name} failed: {end.message}")
    zone = report.memory.zone or pcfg.zones[0]
    read = ports.tpu_for(zone).get_node
    life = ports.lifecycle_for(zone)

    def booted() -> bool:
        """Made again in place (a MIG's instances), or through a queued resource, whose create
        ends once the request is accepted and whose slices come once it is provisioned (every
        one: a slice still missing reads MISSING): say what it is once it is up."""
        seen = job_node(read, name, pcfg.slices)
        if (seen is None or seen.state == "MISSING") and pcfg.queued_resource:
            qr = life.status()
            if qr is not None and qr.ended:
                raise JobFailed(f"recreate of {name}: queued resource {pcfg.queued_resource} is {qr.state}"
                                + (f" ({qr.error_message})" if qr.error_message else ""))
            return False
        return seen is None or seen.state != "CREATING"

    waiting = (f"queued resource {pcfg.queued_resource} not provisioned after recovery.operation_timeout; "
               f"`tpuwatch watch -c {config_path}` goes on with it" if pcfg.queued_resource
               else f"{name} still CREATING after recovery.operation_timeout")
    rc.poll_until(booted, waiting, timeout=pcfg.operation_timeout)
    new = job_node(read, name, pcfg.slices)
    old_id = plan.node.id if plan.node is not None else None
    new_id = new.id if new is not None else ""
    note = "" if zone == pcfg.zones[0] else f" (fallback zone: set tpu.zone = \"{zone}\" in {config_path})"
    say(f"recreated {name} in {zone}{note}: new id {new_id}" + (f" (was {old_id})" if old_id else ""))
    if as_json:
        click.echo(json.dumps({"name": name, "project": job.location.project, "zone": zone, "old_id": old_id,
                               "new_id": new_id, "state": new.state if new else "",
                               "queued_resource": pcfg.queued_resource or None}, indent=2))


def _confirm(what: str, config_path: Path) -> None:
    """Ask the person before anything is deleted or created (--yes skips it)."""
    if not sys.stdin.isatty():
        raise UsageError("recreate: no terminal to ask for confirmation on; pass --yes to recreate "
                         "without asking (or --dry-run to see the requests)")
    click.confirm(f"{what} from {config_path}?", abort=True)


def _open_journal(job: Job) -> Journal:
    from tpuwatch.journal import Busy, Journal

    try:
        return Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, wait=False)
    except Busy:
        raise JobFailed(f"another tpuwatch (watch or check) is working on {job.name}; stop it first "
                        "(it recreates the TPU itself when it will not heal)") from None
