"""`tpuwatch recreate NAME`: a person's delete + create of the TPU from the saved spec.

Order, and why: the config, spec and startup script are validated and the create request is
built *before* anything is deleted (a bad config must not leave the user with no TPU); the
ownership label is checked before any change; the delete is waited for and the name seen
free before the create starts (never a create while a delete of the same name is pending);
one create at a time, the next zone in `fallback_zones` only after the last one failed for
lack of capacity or quota. `--dry-run` prints the exact requests and changes nothing.

Calls: one get, then (not dry-run) delete + operation polls, gets until the name is free,
create + operation polls, one get of the new node.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpuwatch import zonespec
from tpuwatch.config import Config
from tpuwatch.errors import JobFailed, UsageError
from tpuwatch.workers import login

if TYPE_CHECKING:
    from tpuwatch.journal import Journal

HELP = """Delete the TPU and create it again from [tpu.spec] in the config, with
tpu.startup_script as its startup-script metadata. Asks for confirmation unless --yes.
A slice made through Compute Engine (tpu.api = "compute"), in its own zone: an
instance is deleted and inserted again from [tpu.compute_spec]; a MIG recreates
its instances (recreateInstances), and is inserted again only when it is gone.

Refuses a TPU that does not carry the label tpuwatch-job=<job> (add it with
`tpuwatch init NAME --adopt`, or pass --adopt here). On no capacity or quota in the zone,
tries each of tpu.fallback_zones once; `tpuwatch watch` is the one that waits and retries.

\b
--dry-run prints {"delete": request or null, "create": request} as JSON and changes nothing.

Exit codes: 0 recreated (or dry run), 1 refused, failed, or no capacity anywhere,
2 bad usage or config (or no terminal to confirm on: pass --yes), 3 cloud API error.
"""


def _latest_checkpoint(cfg: Any) -> dict[str, str]:
    """attempt/checkpoint/step for the startup script, as far as they are known here."""
    out: dict[str, str] = {}
    ckdir = str(cfg.job.get("checkpoint_dir") or "")
    if ckdir and not ckdir.startswith("gs://"):
        # A path is on the TPU VM, not on this machine: only a watcher, reading the new node,
        # knows where to resume, so the startup script only sets up.
        click.echo(f"note: job.checkpoint_dir {ckdir} is on the TPU VM: the new node's startup script "
                   "only sets up, and `tpuwatch watch`/`check` starts the job from what it finds there", err=True)
        return {"launch": "false"}
    if ckdir:
        from tpuwatch.checkpoints import CheckpointDir
        from tpuwatch.errors import TpuwatchError

        try:
            latest = CheckpointDir(ckdir, cfg.job["checkpoint_layout"]).latest()
        except TpuwatchError as exc:
            click.echo(f"warning: checkpoints not read ({exc}); the startup script will start "
                       "without a checkpoint", err=True)
            latest = None
        if latest is not None:
            out["checkpoint"], out["step"] = latest.path, str(latest.step)
    return out


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
    from tpuwatch import recreate as rc
    from tpuwatch.cloud.location import resolve
    from tpuwatch.cloud.tpu import TpuAdapter
    from tpuwatch.cloud.tpu.lifecycle import Lifecycle, refuse_multislice
    from tpuwatch.config import load_config
    from tpuwatch.model import job_node

    cfg = load_config(config_path, require_command=False)
    if name != cfg.tpu_name:
        raise UsageError(f"recreate: {name!r} is not the TPU of {config_path} (tpu.name = {cfg.tpu_name!r}); "
                         "pass the matching -c config")
    if cfg.tpu["api"] == "compute":
        _recreate_compute(cfg, config_path, project, zone, yes=yes, dry_run=dry_run, adopt=adopt, as_json=as_json)
        return
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None
    api = TpuAdapter(loc.project, loc.zone)
    job = cfg.job_name
    launch = _latest_checkpoint(cfg)
    queued = str(cfg.tpu.get("queued_resource") or "")
    slices = tuple(cfg.tpu["names"])
    if slices and not queued:
        raise JobFailed(f"recreate: the slices of {name} ({', '.join(slices)}) were created one by one, not by one "
                        "multislice queued resource; tpuwatch does not delete or create across them")
    if slices:  # the watcher launches a multislice job on every slice at once: the new nodes only set up
        launch = {"launch": "false"}
    if queued:  # validates before any change
        create = rc.qr_request_json(cfg, loc.zone, loc.project, launch)
    else:
        create = rc.create_request_json(cfg, loc.zone, loc.project, launch)

    zones = [loc.zone, *[z for z in cfg.tpu["fallback_zones"] if z != loc.zone]]
    zonespec.check(cfg.tpu["spec"], cfg.tpu["zone_overrides"], loc.zone, cfg.tpu["fallback_zones"])
    for z in zones[1:]:
        # An unknown fallback zone must stop us before the delete, not after it.
        try:
            TpuAdapter(loc.project, z).list_nodes()
        except UsageError as exc:
            raise UsageError(f"tpu.fallback_zones: {z!r} cannot be used: {exc}") from None

    node = job_node(api.get_node, name, slices)
    if node is not None and not adopt and not node.owned_by(job):
        raise rc.ownership_error(node, job)
    delete: dict[str, Any] | None = None
    life = Lifecycle(api, queued, slices)
    qr_now = life.status()
    if qr_now is not None:
        refuse_multislice(qr_now, len(slices))  # before the plan is shown or asked about, not at the delete
    if qr_now is not None and qr_now.state:
        delete = {"method": "google.cloud.tpu.v2.Tpu.DeleteQueuedResource", "name": qr_now.name, "force": True}
    elif node is not None:
        delete = {"method": "google.cloud.tpu.v2.Tpu.DeleteNode", "name": node.full_name}

    if dry_run:
        click.echo(json.dumps({"delete": delete, "create": rc.redacted(create)}, indent=2))
        return

    if not yes:
        _confirm(f"Delete TPU {name} (id {node.id}, {node.state}) in {loc.project}/{loc.zone} and create it again"
                 if node is not None else f"TPU {name} does not exist in {loc.project}/{loc.zone}. Create it",
                 config_path)
    journal, launch, say = _begin(cfg, launch, as_json)
    try:
        old_id = node.id if node is not None else None
        if qr_now is not None and qr_now.state:
            if node is not None and not adopt and not node.owned_by(job):  # checked above; kept next to the act
                raise rc.ownership_error(node, job)
            op = api.delete_queued_resource(queued, force=True)
            what = f"its {len(slices)} slices {', '.join(slices)}" if slices else f"its TPU {name}"
            say(f"deleting queued resource {life.queued_resource} and {what} (force): {op}")
            _wait_done(rc, api, op, f"delete of queued resource {queued}")
            rc.poll_until(lambda: not _queued_state(life) and job_node(api.get_node, name, slices) is None,
                          f"queued resource {queued} still exists after its delete finished", timeout=1800.0)
        elif node is not None:
            op, _ = rc.start_delete(life, node, job, adopt=adopt)
            say(f"deleting {name} (id {node.id}): {op}")
            _wait_done(rc, api, op, f"delete of {name}")
            rc.wait_node_gone(api, name)

        failures: list[str] = []
        for z in zones:
            zapi = TpuAdapter(loc.project, z)
            zlife = Lifecycle(zapi, queued, slices)
            try:
                op = rc.start_create(zlife, cfg, z, launch=launch)
            except rc.CreateRejected as exc:
                if not exc.failure.falls_back:
                    raise
                failures.append(f"{z}: {exc.failure.message}")
                say(f"create in {z} refused: {exc.failure.message}")
                continue
            say(f"creating {name} in {z}" + (f" through queued resource {queued}" if queued else "") + f": {op}")
            if note := rc.command_withheld_note(cfg):
                click.echo(f"note: {note}", err=as_json)
            failure = None
            if op:
                status = rc.wait_operation(api, op, timeout=3600, what=f"create of {name} in {z}")
                failure = rc.classify_operation(status, started_by_us=True)
            if queued and failure is None:
                failure = _wait_queued(rc, zlife, z)
            if failure is None or failure.kind == "exists":
                new = job_node(zapi.get_node, name, slices)
                new_id = new.id if new is not None else ""
                if as_json:
                    click.echo(json.dumps({"name": name, "project": loc.project, "zone": z, "old_id": old_id,
                                           "new_id": new_id, "state": new.state if new else "",
                                           "queued_resource": queued or None}, indent=2))
                else:
                    note = "" if z == loc.zone else f" (fallback zone: set tpu.zone = \"{z}\" in {config_path})"
                    say(f"recreated {name} in {z}{note}: new id {new_id}" + (f" (was {old_id})" if old_id else ""))
                return
            if not failure.falls_back:
                raise JobFailed(f"create of {name} in {z} failed: {failure.code}: {failure.message}")
            failures.append(f"{z}: {failure.message}")
            say(f"create in {z} failed: {failure.message}")
        raise JobFailed(
            f"could not create {name}: no capacity or quota in {', '.join(zones)} ({'; '.join(failures)}). "
            f"The old TPU is deleted; run `tpuwatch recreate {name} --yes` again later, or let `tpuwatch watch` "
            "queue the create until recovery.queue_timeout"
        )

    finally:
        journal.close()

def _recreate_compute(cfg: Config, config_path: Path, project: str | None, zone: str | None, *, yes: bool,
                      dry_run: bool, adopt: bool, as_json: bool) -> None:
    """A slice made through Compute Engine, in its own zone (it has no fallback zones): an
    instance is deleted, then inserted again from [tpu.compute_spec.instance]; a MIG recreates
    its instances (recreateInstances: a multi-host slice only as a whole; the MIG, its template
    and workload policy stay), and is inserted from its saved body only when it is gone (a
    flex-start MIG with no VM: a new resize request asks for them)."""
    from tpuwatch import recreate as rc
    from tpuwatch.cloud.compute import is_mig
    from tpuwatch.cloud.location import resolve
    from tpuwatch.wiring import compute_adapter, compute_lifecycle

    name, job = cfg.tpu_name, cfg.job_name
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None
    api = compute_adapter(cfg, loc.project, loc.zone)
    life = compute_lifecycle(cfg, api)
    launch = _latest_checkpoint(cfg)
    node = api.get_node(name)
    if node is not None and not adopt and not node.owned_by(job):
        raise rc.ownership_error(node, job)
    recreated_in_place = node is not None and is_mig(node)  # the MIG stays: no insert
    create = None if recreated_in_place else rc.compute_request(cfg, launch, loc.zone)  # validates before any change
    delete: dict[str, Any] | None = None
    if node is not None:
        delete = ({"method": "compute.instanceGroupManagers.recreateInstances", "name": node.full_name,
                   "instances": list(api.instance_names(node))} if recreated_in_place else
                  {"method": "compute.instances.delete", "name": node.full_name})
    if dry_run:
        click.echo(json.dumps({"delete": delete, "create": None if create is None else rc.redacted(create)}, indent=2))
        return
    where = f"{loc.project}/{loc.zone}"
    if not yes:
        _confirm(f"Recreate every instance of MIG {name} ({node.state}) in {where}" if recreated_in_place and node else
                 f"Delete instance {name} (id {node.id}, {node.state}) in {where} and create it again" if node else
                 f"{name} does not exist in {where}. Create it", config_path)
    journal, launch, say = _begin(cfg, launch, as_json)
    try:
        old_id = node.id if node is not None else None
        if node is not None:
            op, what = rc.start_delete(life, node, job, adopt=adopt)
            say(f"{'recreating' if recreated_in_place else 'deleting'} {what}: {op}")
            _wait_done(rc, api, op, f"{'recreate' if recreated_in_place else 'delete'} of {name}")
            # an instance's name is free once it is gone; a MIG's instances are new once its id
            # changed and it runs again
            rc.poll_until(lambda: (seen := api.get_node(name)) is None or (seen.id != old_id and seen.usable),
                          f"{name} not recreated after its {'recreate' if recreated_in_place else 'delete'} "
                          "finished", timeout=3600.0)
        new = api.get_node(name) if recreated_in_place else None
        if new is None:
            if cleared := life.clear_ended():  # a flex-start MIG's ended resize requests
                say(cleared)
            try:
                op = rc.start_create(life, cfg, loc.zone, launch=launch)
            except rc.CreateRejected as exc:
                raise JobFailed(f"create of {name} in {loc.zone} refused: {exc.failure.message}"
                                + (" (no capacity or quota; `tpuwatch watch` queues the create until "
                                   "recovery.queue_timeout)" if exc.failure.queueable else "")) from None
            say(f"creating {name} in {loc.zone}" + (f" through {life.queue}" if life.queue else "") + f": {op}")
            if op:
                status = rc.wait_operation(api, op, timeout=3600, what=f"create of {name} in {loc.zone}")
                failure = rc.classify_operation(status, started_by_us=True)
                if failure is not None and failure.kind != "exists":
                    raise JobFailed(f"create of {name} in {loc.zone} failed: {failure.code}: {failure.message}")
            new = api.get_node(name)
        new_id = new.id if new is not None else ""
        if as_json:
            click.echo(json.dumps({"name": name, "project": loc.project, "zone": loc.zone, "old_id": old_id,
                                   "new_id": new_id, "state": new.state if new else "", "queued_resource": None},
                                  indent=2))
        else:
            say(f"recreated {name} in {loc.zone}: new id {new_id}" + (f" (was {old_id})" if old_id else ""))
    finally:
        journal.close()


def _confirm(what: str, config_path: Path) -> None:
    """Ask the person before anything is deleted or created (--yes skips it)."""
    if not sys.stdin.isatty():
        raise UsageError("recreate: no terminal to ask for confirmation on; pass --yes to recreate "
                         "without asking (or --dry-run to see the requests)")
    click.confirm(f"{what} from {config_path}?", abort=True)


def _begin(cfg: Config, launch: dict[str, str], as_json: bool) -> tuple[Journal, dict[str, str], Callable[[str], None]]:
    """The job's journal, held for the whole recreate: no `watch` or cron `check` acts on the job
    meanwhile, and the next one reads what was done here. Returns it, the launch metadata with the
    attempt to start at boot and the user the watcher last logged in as, and `say`: tell the
    person and journal it before the next step (every delete/create is journaled before and
    after, with its operation name). The caller closes the journal."""
    journal = _open_journal(cfg)
    try:
        mem = journal.load_memory()
        if mem is not None and "launch" not in launch:
            launch = {**launch, "attempt": str(mem.attempt.number + 1)}
        if user := login.user_for_create(journal):
            launch = {**launch, "user": user}
    except BaseException:
        journal.close()
        raise
    echo = (lambda text: click.echo(text, err=True)) if as_json else click.echo

    def say(text: str) -> None:
        echo(text)
        with journal.transaction():
            journal.add_event(datetime.now(timezone.utc), "recreate", text, {"by": "tpuwatch recreate"})

    return journal, launch, say


def _open_journal(cfg: Config) -> Journal:
    from tpuwatch.journal import Busy, Journal

    try:
        return Journal.open(cfg.state_dir, cfg.job_name, cfg.tpu_name, wait=False)
    except Busy:
        raise JobFailed(f"another tpuwatch (watch or check) is working on {cfg.job_name}; stop it first "
                        "(it recreates the TPU itself when it will not heal)") from None


def _wait_done(rc: Any, api: Any, op: str, what: str) -> None:
    status = rc.wait_operation(api, op, timeout=1800, what=what)
    if status.error_code and status.error_code != 5:  # NOT_FOUND: already gone
        raise JobFailed(f"{what} failed: {rc.CODE_NAMES.get(status.error_code, status.error_code)}: "
                        f"{status.error_message}; the TPU was not recreated")


def _queued_state(life: Any) -> str:
    status = life.status()
    return "" if status is None else str(status.state)


def _wait_queued(rc: Any, life: Any, zone: str, timeout: float = 6 * 3600.0) -> Any:
    """Follow the queued resource until ACTIVE (None) or given up (its classification)."""
    result: list[Any] = []

    def settled() -> bool:
        status = life.status()
        if status.state == "ACTIVE":
            return True
        failure = rc.classify_queued(status)
        if failure is not None:
            result.append(failure)
            return True
        return False

    rc.poll_until(settled, f"queued resource {life.queued_resource} in {zone} not ACTIVE after {timeout:g}s",
                  timeout=timeout)
    if result and result[0].queueable:  # free the name for the next try
        with contextlib.suppress(Exception):
            life.clear_ended()
    return result[0] if result else None
