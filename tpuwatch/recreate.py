"""The act side of delete + create: safety checks, the create request, create-error classes.

The tick (and `tpuwatch recreate`) call these; the policy decides *when*. Rules kept here:
- A node is deleted only when it carries `tpuwatch-job=<job>` with exactly that value, or the
  caller passes an explicit adopt (`--adopt`). `myjob-2` does not belong to `myjob`.
- A create request is built and validated (spec, startup script, metadata limits) before
  anything is deleted, so a bad config never leaves the user with no TPU.
- A failed create is classified from the API's own code and text by the policy's table
  (policy/create_errors.py): no capacity, quota and reservation shortfalls are worth queueing;
  an ALREADY_EXISTS answer to a create tpuwatch itself started is success; everything else is
  fatal and shown as the API said it.
This module knows the TPU API through the ports (`NodeLifecycle` deletes and creates, plainly
or through a queued resource), the config and the spec; it holds no clock or policy, and it
builds requests but never sends one except through those ports. The only loop is `poll_until`,
for `tpuwatch recreate` and `init`, which wait where the tick never does.
"""

from __future__ import annotations

import getpass
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch import credentials
from tpuwatch import spec as specmod
from tpuwatch.cloud.apis import api_for, api_of
from tpuwatch.cloud.base import LaunchParts
from tpuwatch.cloud.errors import CODE_NAMES, CODE_NUMBERS, api_failure
from tpuwatch.config import Config
from tpuwatch.errors import JobFailed, TpuwatchError
from tpuwatch.model import OWNER_LABEL, NodeSnapshot, OperationStatus, QueuedStatus
from tpuwatch.policy.create_errors import CODE_ALIASES, CREATE_RULES, OTHER, Kind, kind_of, rule_for
from tpuwatch.policy.pool import POOL_LABEL
from tpuwatch.ports import NodeLifecycle, TpuApi

# ---------------------------------------------------------------------------------------------
# ownership


def ownership_error(node: NodeSnapshot, job: str) -> JobFailed:
    name, zone = node.name, node.zone or "ZONE"
    have = node.owner
    why = "has no tpuwatch-job label" if have is None else f"has {OWNER_LABEL}={have}, not {OWNER_LABEL}={job}"
    how = api_of(node).label_hint(node, zone, job)
    return JobFailed(
        f"refusing to delete TPU {name}: it {why}, so tpuwatch does not own it. To let tpuwatch "
        f"delete and recreate it, {how}, or pass --adopt"
    )


def start_delete(life: NodeLifecycle, node: NodeSnapshot | None, job: str, adopt: bool = False) -> tuple[str, str]:
    """Start deleting an owned node (through its queued resource when it came from one; with no
    node, its queued resource alone); (operation name, what is deleted). The one guarded path
    to a delete: JobFailed (exit 1) when the node is not owned, NotFoundError when nothing is left."""
    if node is not None and not adopt and not node.owned_by(job):
        raise ownership_error(node, job)
    return life.delete(node)


# ---------------------------------------------------------------------------------------------
# the create request


def worker_script_text() -> str:
    """The packaged worker-side protocol script (tpuwatch/workers/remote.sh)."""
    from tpuwatch.workers.protocol import remote_script

    return remote_script()


def launch_metadata(cfg: Config, launch: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `tpuwatch-*` metadata every create writes for the startup script to read.

    `launch` may add `attempt`, `checkpoint` and `step` (or `launch = "false"`: set up only): at create time the job is not running
    anywhere, so the newest complete checkpoint cannot change before the new node boots. Its
    `user` is the user the watcher was last seen to log in as (OS Login may give another name
    than ssh.user), so the job the startup script starts and the watcher's share one home.
    """
    job = cfg.job
    env = job.get("env") or {}
    # Node metadata is readable by anyone with tpu.nodes.get: [job] env (API keys, often) and a
    # command that looks like it holds a credential go there only when the user says so.
    # Without them the startup script cannot start the job as configured, so it only sets up,
    # and the watcher starts the job over SSH (a tick later).
    withheld = bool(env) and not job.get("env_in_metadata", False)
    command_withheld = bool(command_credentials(cfg))
    meta = {
        "tpuwatch-job": cfg.job_name,
        "tpuwatch-command": "" if command_withheld else str(job.get("command") or ""),
        "tpuwatch-checkpoint-dir": str(job.get("checkpoint_dir") or ""),
        "tpuwatch-env": "" if withheld else "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())),
        # the job runs as the user tpuwatch connects as, so both see the same ~/.tpuwatch/<job>
        "tpuwatch-user": str((launch or {}).get("user") or cfg.ssh.get("user") or getpass.getuser()),
    }
    meta["tpuwatch-worker-script"] = worker_script_text()
    if withheld:
        meta["tpuwatch-env-withheld"] = "true"
    if command_withheld:
        meta["tpuwatch-command-withheld"] = "true"
    if withheld or command_withheld:
        return {k: v for k, v in meta.items() if v != ""}  # set up only: nothing starts at boot
    if launch and launch.get("launch") == "false":
        meta["tpuwatch-launch"] = "false"  # set up only: the watcher starts the job
    else:
        for key in ("attempt", "checkpoint", "step"):
            if launch and launch.get(key) not in (None, ""):
                meta[f"tpuwatch-{key}"] = str(launch[key])
    return {k: v for k, v in meta.items() if v != ""}


def command_credentials(cfg: Config) -> str:
    """What in [job] command looks like a credential and so stays out of node metadata ("" for
    nothing, or when the user opted in with job.command_in_metadata)."""
    if cfg.job.get("command_in_metadata", False):
        return ""
    return credentials.describe(str(cfg.job.get("command") or ""))


def command_withheld_note(cfg: Config) -> str:
    """What to tell the user when [job] command stays out of a create's metadata ("" when not)."""
    held = command_credentials(cfg)
    if not held:
        return ""
    return (f"job.command looks like it holds a credential ({held}), so it stays out of the node's "
            "metadata, which anyone with tpu.nodes.get reads: the startup script only sets up and the "
            "watcher starts the job over SSH (move the secret to [job] env, or set "
            "job.command_in_metadata = true to write it anyway)")


def config_base(cfg: Config) -> Path | None:
    """Where relative paths in the config are resolved: the config file's folder."""
    return cfg.path.parent if cfg.path is not None else None


def launch_parts(cfg: Config, launch: Mapping[str, str] | None = None) -> LaunchParts:
    """What a create writes for the startup script: the `tpuwatch-*` metadata and
    tpu.startup_script's text, each read only when the body needs it."""
    def script() -> str | None:
        path = str(cfg.tpu.get("startup_script") or "")
        return specmod.read_startup_script(path, base=config_base(cfg)) if path else None

    return LaunchParts(metadata=lambda: launch_metadata(cfg, launch), startup_script=script)


def create_request_json(cfg: Config, zone: str, project: str,
                        launch: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The exact create request (REST JSON) `start_create` would send: for --dry-run."""
    return api_for(cfg).request_json(cfg, zone, project, launch_parts(cfg, launch))


def redacted(request: Any) -> Any:
    """A request (REST JSON) fit to print: the job.env values in `tpuwatch-env` metadata hidden.

    They are often API keys; they go to the node (its startup script needs them) but never to
    a terminal or a log.
    """
    if isinstance(request, dict):
        return {k: (_redact_env(v) if k == "tpuwatch-env" and isinstance(v, str)
                    else credentials.redact(v) if k == "tpuwatch-command" and isinstance(v, str)
                    else redacted(v))
                for k, v in request.items()}
    if isinstance(request, list):
        return [redacted(v) for v in request]
    return request


def _redact_env(text: str) -> str:
    return "".join(f"{line.split('=', 1)[0]}=<redacted>\n" for line in text.splitlines() if line.strip())


def start_create(life: NodeLifecycle, cfg: Config, zone: str, *, resumed: bool = False,
                 launch: Mapping[str, str] | None = None) -> str:
    """Start creating the node from the spec in `zone` (through its queued resource when it came
    from one, with the same tier and reservation); the operation name.

    "" means the node already exists because of a create tpuwatch started earlier (`resumed`:
    the journal says a create of this name is ours); that is success. A refused create raises
    CreateRejected carrying its classification.
    """
    node, spec = api_for(cfg).create_body(cfg, zone, launch_parts(cfg, launch))
    try:
        return life.create(cfg.tpu_name, node, zone, resumed=resumed,
                           tier=str(spec.get("queued_resource_tier", "")),
                           reservation=str(spec.get("reservation_name", "")))
    except TpuwatchError as exc:
        failure = classify_exception(exc, started_by_us=resumed)
        if failure.kind == "exists":
            return ""
        if failure.reason == "already_exists" and not life.queue and _ours(life, cfg):
            # A create whose answer was lost (a deadline, a dropped connection) is retried by
            # the adapter and meets the node it made itself: it carries this job's label.
            return ""
        raise CreateRejected(failure, zone) from None


def start_spare_create(tpu: TpuApi, cfg: Config, name: str, zone: str) -> str:
    """Start creating spare `name` of a multislice job from [tpu.spec] in `zone`, a node made
    alone (never through the job's queued resource: a spare is not one of its slices); the
    operation's name. The body carries the job's ownership label, as the job's own create does,
    and `tpuwatch-launch = "false"`: a startup script sets the spare up and never starts the job
    at boot (it would start attempt 1 from scratch on an idle spare); the watcher launches there."""
    node, _ = api_for(cfg).create_body(cfg, zone, launch_parts(cfg, {"launch": "false"}))
    return tpu.create_node(name, spare_hostname(node, name, cfg.tpu_name), zone)


def spare_hostname(body: dict[str, Any], name: str, own: str) -> dict[str, Any]:
    """The insert body of spare `name` made from the job's node `own`'s saved one, with no
    hostname of another VM's: two VMs must not share one (a Compute Engine instance's custom
    `hostname`, RFC1035, fully qualified). One whose first label is `own` becomes the spare's
    (`own.corp.example` -> `name.corp.example`); any other is dropped: the spare takes the
    default, its own name in the zone's DNS."""
    host = str(body.get("hostname") or "")
    if not host or name == own:
        return body
    first, _, rest = host.partition(".")
    mine = f"{name}.{rest}" if first == own and rest else ""
    out = {k: v for k, v in body.items() if k != "hostname"}
    if mine and len(mine) <= 253:
        out["hostname"] = mine
    return out


def start_pool_create(tpu: TpuApi, cfg: Config, name: str, zone: str, pool: str) -> str:
    """Start creating spare `name` of spare pool `pool` from the keeper job's [tpu.spec], as a
    spare of its own is made (never started at boot), but labelled the pool's and no job's: an
    idle spare of the pool, for any of its jobs to claim. A Compute Engine instance's custom
    hostname is the spare's own, never the keeper's VM's (spare_hostname)."""
    node, _ = api_for(cfg).create_body(cfg, zone, launch_parts(cfg, {"launch": "false"}))
    labels = {k: v for k, v in dict(node.get("labels") or {}).items() if k != OWNER_LABEL}
    node["labels"] = {**labels, POOL_LABEL: pool}
    return tpu.create_node(name, spare_hostname(node, name, cfg.tpu_name), zone)


def compute_request(cfg: Config, launch: Mapping[str, str] | None = None, zone: str = "") -> dict[str, Any]:
    """The create body of the job's slice (a Compute Engine instance's or MIG's insert body, from
    [tpu.compute_spec]); UsageError (exit 2) when the cloud would refuse it, before any delete."""
    return api_for(cfg).create_body(cfg, zone, launch_parts(cfg, launch))[0]


def check_before_delete(cfg: Config, zone: str) -> None:
    """A slice made again from a body of the config's (a Compute Engine instance) has the body
    built before the delete: one the cloud would refuse stops the watcher here (UsageError), not
    after the delete."""
    if api_for(cfg).checks_body_before_delete(cfg):
        compute_request(cfg, zone=zone)


def gone_workers(cfg: Config) -> Mapping[str, tuple[str, str]] | None:
    """The worker VMs the audit log may name while the job's slice is gone, or None."""
    return api_for(cfg).gone_workers(cfg)


def _ours(life: NodeLifecycle, cfg: Config) -> bool:
    """The node named like the job's TPU exists and carries tpuwatch-job=<this job>."""
    try:
        existing = life.get_node(cfg.tpu_name)
    except TpuwatchError:
        return False  # cannot tell: the refusal stands
    return existing is not None and existing.owned_by(cfg.job_name)


# ---------------------------------------------------------------------------------------------
# create errors


@dataclass(frozen=True)
class CreateFailure:
    """Why a create did not make a node, and what to do about it (policy/create_errors.py)."""

    kind: Kind  # queueable: retry later or elsewhere; exists: ours already; fatal: stop
    reason: str  # no_capacity, quota, reservation, unavailable, already_exists, other
    code: str  # google.rpc code name
    message: str  # the API's own text
    falls_back: bool = False  # the next fallback zone is worth a try

    @property
    def queueable(self) -> bool:
        return self.kind == "queueable"


class CreateRejected(JobFailed):
    """A create request or operation failed; `.failure` says whether to queue."""

    def __init__(self, failure: CreateFailure, zone: str) -> None:
        what = next((r.what for r in CREATE_RULES if r.reason == failure.reason), OTHER.what)
        super().__init__(f"{what.format(zone=zone)}: {failure.code}: {failure.message}")
        self.failure = failure
        self.zone = zone

    def as_operation(self) -> OperationStatus:
        """The refusal as a done, failed operation with no name (what the policy observes)."""
        return OperationStatus(name="", done=True, error_code=CODE_NUMBERS.get(self.failure.code, 2),
                               error_message=self.failure.message)


def classify_create_error(code: int | str, message: str, *, started_by_us: bool) -> CreateFailure:
    """Classify a failed create from its google.rpc code (number or name) and the API's text,
    by the policy's table of create errors."""
    name = CODE_NAMES.get(code, str(code)) if isinstance(code, int) else code
    rule = rule_for(name, message)
    return CreateFailure(kind_of(rule, started_by_us=started_by_us), rule.reason,
                         CODE_ALIASES.get(name.upper(), name.upper()), message or "", rule.falls_back)


def classify_operation(op: OperationStatus, *, started_by_us: bool = True) -> CreateFailure | None:
    """None when a create operation succeeded (or is still running), else its classification."""
    if not op.done or op.error_code == 0:
        return None
    return classify_create_error(op.error_code, op.error_message, started_by_us=started_by_us)


def failure_reason(op: OperationStatus | None) -> str:
    """The CreateFailure reason of a failed create operation ("" when it did not fail)."""
    failure = classify_operation(op) if op is not None else None
    return failure.reason if failure is not None else ""


def classify_exception(exc: BaseException, *, started_by_us: bool) -> CreateFailure:
    """Classify an error raised by create_node (tpuwatch ApiError or a google.api_core error)."""
    code, message = api_failure(exc)
    if not code:
        return CreateFailure("fatal", "other", type(exc).__name__, message)
    return classify_create_error(code, message, started_by_us=started_by_us)


# ---------------------------------------------------------------------------------------------
# waiting (for `tpuwatch recreate` and `init`; the tick never waits, it follows operations across ticks)


def poll_until(done: Callable[[], bool], message: str, *, timeout: float,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Call `done` until it is true: first after 0.25 s, then at most every 10 s (x1.6 each time).

    JobFailed(message) once `timeout` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    delay = 0.25
    while not done():
        if time.monotonic() > deadline:
            raise JobFailed(message)
        sleep(delay)
        delay = min(delay * 1.6, 10.0)


def wait_operation(api: TpuApi, name: str, *, timeout: float = 3600.0, what: str = "operation",
                   sleep: Callable[[float], None] = time.sleep,
                   on_poll: Callable[[OperationStatus], None] | None = None) -> OperationStatus:
    """Poll an operation until done."""
    seen: list[OperationStatus] = []

    def done() -> bool:
        op = api.get_operation(name)
        if on_poll is not None:
            on_poll(op)
        seen.append(op)
        return op.done

    poll_until(done, f"{what} {name} still running after {timeout:g}s; check it with `tpuwatch status` "
                     "and run the command again", timeout=timeout, sleep=sleep)
    return seen[-1]


# ---------------------------------------------------------------------------------------------
# Queued resources (the requests themselves: the TPU API's, cloud/tpu/)


def queued_reason(status: QueuedStatus | None) -> str:
    """The CreateFailure reason of a queued resource the service gave up on ("" otherwise)."""
    failure = classify_queued(status) if status is not None else None
    return failure.reason if failure is not None else ""


def classify_queued(status: QueuedStatus) -> CreateFailure | None:
    """None while provisioning or ACTIVE; a failure for FAILED / SUSPENDING / SUSPENDED."""
    if not status.ended:
        return None
    if status.state == "FAILED":
        return classify_create_error(status.error_code or 2, status.error_message or "queued resource FAILED",
                                     started_by_us=True)
    return CreateFailure("fatal", "other", status.state, f"queued resource {status.name} is {status.state}")
