"""The act side of delete + create: safety checks, the create request, create-error classes.

The tick (and `tpuwatch recreate`) call these; the policy decides *when*. Rules kept here:
- A node is deleted only when it carries `tpuwatch-job=<job>` with exactly that value, or the
  caller passes an explicit adopt (`--adopt`). `myjob-2` does not belong to `myjob`.
- A create request is built and validated (spec, startup script, metadata limits) before
  anything is deleted, so a bad config never leaves the user with no TPU.
- A failed create is classified from the API's own code and text (REFERENCE.md "Errors seen
  when creating"): no capacity, quota and reservation shortfalls are worth queueing; an
  ALREADY_EXISTS answer to a create tpuwatch itself started is success; everything else is fatal
  and shown as the API said it.
This module knows the TPU API through its public adapter methods (`RecreateApi`: the TpuApi
port plus queued resources and labels), the config and the spec; it holds no loop, clock or
policy, and it builds requests but never sends one except through those methods.
"""

from __future__ import annotations

import getpass
import json
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from tpuwatch import spec as specmod
from tpuwatch import zonespec
from tpuwatch.config import Config
from tpuwatch.errors import ConfigError, JobFailed, NotFoundError, TpuwatchError
from tpuwatch.model import NodeSnapshot, OperationStatus
from tpuwatch.ports import TpuApi

OWNER_LABEL = specmod.OWNER_LABEL


class RecreateApi(TpuApi, Protocol):
    """What recreate and init need of the TPU API beyond the TpuApi port (tpuwatch.cloud.tpu.TpuAdapter)."""

    project: str
    zone: str

    def get_node_message(self, name: str) -> Any | None: ...

    def set_labels(self, name: str, labels: Mapping[str, str]) -> str: ...

    def get_queued_resource(self, name: str) -> Any | None: ...

    def queued_resource_name(self, name: str, zone: str | None = None) -> str: ...

    def create_queued_resource(self, qr_id: str, queued_resource: Mapping[str, Any],
                               zone: str | None = None) -> str: ...

    def delete_queued_resource(self, name: str, *, force: bool = True, zone: str | None = None) -> str: ...

# google.rpc.Code numbers
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
CODE_NUMBERS = {name: number for number, name in CODE_NAMES.items()}


# ---------------------------------------------------------------------------------------------
# ownership


def owner_of(node: Any) -> str | None:
    """The value of the ownership label, or None. Takes a NodeSnapshot or a Node message."""
    labels = getattr(node, "labels", None) or {}
    value = labels.get(OWNER_LABEL) if hasattr(labels, "get") else None
    return None if value is None else str(value)


def owned(node: Any, job: str) -> bool:
    """True only when the node's `tpuwatch-job` label equals `job` exactly."""
    return bool(job) and owner_of(node) == job


def ownership_error(node: NodeSnapshot | Any, job: str) -> JobFailed:
    name = getattr(node, "name", "?").rsplit("/", 1)[-1]
    zone = getattr(node, "zone", "") or "ZONE"
    have = owner_of(node)
    why = "has no tpuwatch-job label" if have is None else f"has {OWNER_LABEL}={have}, not {OWNER_LABEL}={job}"
    return JobFailed(
        f"refusing to delete TPU {name}: it {why}, so tpuwatch does not own it. To let tpuwatch "
        f"delete and recreate it, run `tpuwatch init {name} --adopt` (or add the label: "
        f"`gcloud compute tpus tpu-vm update {name} --zone {zone} --update-labels {OWNER_LABEL}={job}`), "
        "or pass --adopt"
    )


def start_delete(api: TpuApi, node: NodeSnapshot, job: str, adopt: bool = False) -> str:
    """Start deleting an owned node; the operation name. JobFailed (exit 1) when not owned."""
    if not adopt and not owned(node, job):
        raise ownership_error(node, job)
    return api.delete_node(node.name)


# ---------------------------------------------------------------------------------------------
# the create request


def worker_script_text() -> str:
    """The packaged worker-side protocol script (tpuwatch/workers/remote.sh)."""
    from tpuwatch.workers.protocol import remote_script

    return remote_script()


def launch_metadata(cfg: Config, launch: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `tpuwatch-*` metadata every create writes for the startup script to read.

    `launch` may add `attempt`, `checkpoint` and `step`: at create time the job is not running
    anywhere, so the newest complete checkpoint cannot change before the new node boots.
    """
    job = cfg.job
    env = job.get("env") or {}
    # Node metadata is readable by anyone with tpu.nodes.get: [job] env (API keys, often) goes
    # there only when the user says so. Without it the startup script cannot start the job as
    # configured, so it only sets up, and the watcher starts the job over SSH (a tick later).
    withheld = bool(env) and not job.get("env_in_metadata", False)
    meta = {
        "tpuwatch-job": cfg.job_name,
        "tpuwatch-command": str(job.get("command") or ""),
        "tpuwatch-checkpoint-dir": str(job.get("checkpoint_dir") or ""),
        "tpuwatch-env": "" if withheld else "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())),
        # the job runs as the user tpuwatch connects as, so both see the same ~/.tpuwatch/<job>
        "tpuwatch-user": str(cfg.ssh.get("user") or getpass.getuser()),
    }
    meta["tpuwatch-worker-script"] = worker_script_text()
    if withheld:
        meta["tpuwatch-env-withheld"] = "true"
    else:
        for key in ("attempt", "checkpoint", "step"):
            if launch and launch.get(key) not in (None, ""):
                meta[f"tpuwatch-{key}"] = str(launch[key])
    return {k: v for k, v in meta.items() if v != ""}


def config_base(cfg: Config) -> Path | None:
    """Where relative paths in the config are resolved: the config file's folder."""
    return cfg.path.parent if cfg.path is not None else None


def build_request(cfg: Config, launch: Mapping[str, str] | None = None, zone: str = "") -> Any:
    """The validated create request's Node for this config in `zone` (nothing is sent)."""
    raw_spec = zone_spec(cfg, zone)
    if not raw_spec:
        raise ConfigError(
            f"tpu.spec: missing; run `tpuwatch init {cfg.tpu_name}` to capture the TPU's spec "
            "before tpuwatch can recreate it"
        )
    script_path = str(cfg.tpu.get("startup_script") or "")
    script = specmod.read_startup_script(script_path, base=config_base(cfg)) if script_path else None
    # A spec with v2alpha1-only fields gives a tpu_v2alpha1.Node; the adapter sends that to v2alpha1.
    return specmod.build_node(raw_spec, script, job=cfg.job_name, extra_metadata=launch_metadata(cfg, launch))


def zone_spec(cfg: Config, zone: str) -> dict[str, Any]:
    """[tpu.spec] as a create in `zone` sends it: with [tpu.zone_overrides] for that zone."""
    return zonespec.for_zone(cfg.tpu.get("spec") or {}, cfg.tpu.get("zone_overrides") or {}, zone)


def _api_version(message: Any) -> str:
    """"v2alpha1" for a tpu_v2alpha1 message, else "v2" (for the method names --dry-run prints)."""
    return "v2alpha1" if "v2alpha1" in type(message).__module__ else "v2"


def create_request_json(cfg: Config, zone: str, project: str,
                        launch: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The exact CreateNode request (REST JSON) `start_create` would send: for --dry-run."""
    node = build_request(cfg, launch, zone)
    return {
        "method": f"google.cloud.tpu.{_api_version(node)}.Tpu.CreateNode",
        "parent": f"projects/{project}/locations/{zone}",
        "nodeId": cfg.tpu_name,
        "node": specmod.node_to_json(node),
    }


def redacted(request: Any) -> Any:
    """A request (REST JSON) fit to print: the job.env values in `tpuwatch-env` metadata hidden.

    They are often API keys; they go to the node (its startup script needs them) but never to
    a terminal or a log.
    """
    if isinstance(request, dict):
        return {k: (_redact_env(v) if k == "tpuwatch-env" and isinstance(v, str) else redacted(v))
                for k, v in request.items()}
    if isinstance(request, list):
        return [redacted(v) for v in request]
    return request


def _redact_env(text: str) -> str:
    return "".join(f"{line.split('=', 1)[0]}=<redacted>\n" for line in text.splitlines() if line.strip())


def start_create(api: TpuApi, cfg: Config, zone: str, *, resumed: bool = False,
                 launch: Mapping[str, str] | None = None) -> str:
    """Start creating the node from the spec in `zone`; the operation name.

    "" means the node already exists because of a create tpuwatch started earlier (`resumed`:
    the journal says a create of this name is ours); that is success. A refused create raises
    CreateRejected carrying its classification.
    """
    node = build_request(cfg, launch, zone)
    try:
        return api.create_node(cfg.tpu_name, specmod.node_to_json(node), zone)
    except TpuwatchError as exc:
        failure = classify_exception(exc, started_by_us=resumed)
        if failure.kind == "exists":
            return ""
        if failure.reason == "already_exists" and _ours(api, cfg):
            # A create whose answer was lost (a deadline, a dropped connection) is retried by
            # the adapter and meets the node it made itself: it carries this job's label.
            return ""
        raise CreateRejected(failure, zone) from None


def _ours(api: TpuApi, cfg: Config) -> bool:
    """The node named like the job's TPU exists and carries tpuwatch-job=<this job>."""
    try:
        existing = api.get_node(cfg.tpu_name)
    except TpuwatchError:
        return False  # cannot tell: the refusal stands
    return existing is not None and owned(existing, cfg.job_name)


# ---------------------------------------------------------------------------------------------
# create errors


Kind = Literal["queueable", "exists", "fatal"]


@dataclass(frozen=True)
class CreateFailure:
    """Why a create did not make a node, and what to do about it."""

    kind: Kind  # queueable: retry later or elsewhere; exists: ours already; fatal: stop
    reason: str  # no_capacity, quota, reservation, unavailable, already_exists, other
    code: str  # google.rpc code name
    message: str  # the API's own text

    @property
    def queueable(self) -> bool:
        return self.kind == "queueable"


class CreateRejected(JobFailed):
    """A create request or operation failed; `.failure` says whether to queue."""

    def __init__(self, failure: CreateFailure, zone: str) -> None:
        what = {
            "no_capacity": f"no capacity in {zone}",
            "quota": f"out of quota in {zone}",
            "reservation": f"not enough reserved capacity in {zone}",
            "unavailable": f"the create in {zone} failed for a transient reason",
            "already_exists": "a node of that name already exists and tpuwatch did not create it",
        }.get(failure.reason, f"the create in {zone} failed")
        super().__init__(f"{what}: {failure.code}: {failure.message}")
        self.failure = failure
        self.zone = zone

    def as_operation(self) -> OperationStatus:
        """The refusal as a done, failed operation with no name (what the policy observes)."""
        return OperationStatus(name="", done=True, error_code=CODE_NUMBERS.get(self.failure.code, 2),
                               error_message=self.failure.message)


def _code_name(code: int | str) -> str:
    if isinstance(code, int):
        return CODE_NAMES.get(code, str(code))
    code = code.upper()
    return {"429": "RESOURCE_EXHAUSTED", "TOO_MANY_REQUESTS": "RESOURCE_EXHAUSTED", "409": "ALREADY_EXISTS",
            "CONFLICT": "ALREADY_EXISTS"}.get(code, code)


def classify_create_error(code: int | str, message: str, *, started_by_us: bool) -> CreateFailure:
    """Classify a failed create from its google.rpc code (number or name) and the API's text."""
    name = _code_name(code)
    text = message or ""
    low = text.lower()
    if "reserved capacity" in low and name in ("RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"):
        # "Insufficient reserved capacity" comes with code 9 and with code 8: the text decides.
        return CreateFailure("queueable", "reservation", name, text)
    if name == "RESOURCE_EXHAUSTED" and "quota" in low:
        return CreateFailure("queueable", "quota", name, text)
    if name == "RESOURCE_EXHAUSTED":
        # "There is no more capacity in the zone ..."; any other exhaustion of a create is also
        # a shortage that may end, and queue_timeout bounds how long it is waited for.
        return CreateFailure("queueable", "no_capacity", name, text)
    if name in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED") or name == "INTERNAL" and "try again" in low:
        return CreateFailure("queueable", "unavailable", name, text)
    if name == "ALREADY_EXISTS":
        return CreateFailure("exists" if started_by_us else "fatal", "already_exists", name, text)
    return CreateFailure("fatal", "other", name, text)


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
    code: int | str = getattr(exc, "code", "") or ""
    grpc_code = getattr(exc, "grpc_status_code", None)
    if grpc_code is not None:
        code = str(grpc_code.name)
    message = getattr(exc, "message", None) or str(exc)
    # The adapter wraps Google errors (raise ... from None keeps the original as __context__):
    # classify and report the API's own words, not the wrapper's.
    original = exc.__context__
    if original is not None and getattr(original, "grpc_status_code", None) is not None:
        message = getattr(original, "message", None) or message
        code = code or str(original.grpc_status_code.name)  # type: ignore[attr-defined]
    if not code:
        return CreateFailure("fatal", "other", type(exc).__name__, message)
    return classify_create_error(code, message, started_by_us=started_by_us)


# ---------------------------------------------------------------------------------------------
# waiting (for `tpuwatch recreate`; the tick never waits, it follows operations across ticks)


def wait_operation(api: TpuApi, name: str, *, timeout: float = 3600.0, what: str = "operation",
                   sleep: Callable[[float], None] = time.sleep,
                   on_poll: Callable[[OperationStatus], None] | None = None) -> OperationStatus:
    """Poll an operation until done: first after 0.25 s, then at most every 10 s."""
    deadline = time.monotonic() + timeout
    delay = 0.25
    while True:
        op = api.get_operation(name)
        if on_poll is not None:
            on_poll(op)
        if op.done:
            return op
        if time.monotonic() > deadline:
            raise JobFailed(f"{what} {name} still running after {timeout:g}s; check it with "
                            "`tpuwatch status` and run the command again")
        sleep(delay)
        delay = min(delay * 1.6, 10.0)


def wait_node_gone(api: TpuApi, name: str, *, timeout: float = 600.0,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """After a delete operation ends, the name is free once get_node says NOT_FOUND."""
    deadline = time.monotonic() + timeout
    delay = 0.25
    while api.get_node(name) is not None:
        if time.monotonic() > deadline:
            raise JobFailed(f"TPU {name} still exists {timeout:g}s after its delete finished")
        sleep(delay)
        delay = min(delay * 1.6, 10.0)


def require(api: TpuApi, name: str, where: str) -> NodeSnapshot:
    node = api.get_node(name)
    if node is None:
        raise NotFoundError(f"no TPU named {name} in {where}")
    return node


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Ownership label on a live node (`tpuwatch init --adopt`)


def set_owner_label(api: RecreateApi, name: str, labels: Mapping[str, str], job: str) -> str:
    """Start an update_node that sets `tpuwatch-job=<job>` (other labels kept); the operation name."""
    return api.set_labels(name, {**dict(labels), OWNER_LABEL: job})


# ---------------------------------------------------------------------------------------------
# Queued resources: a node made through one is recreated through one, same tier and node spec.
# Delete with force removes the node first; the new request follows
# CREATING/WAITING_FOR_RESOURCES -> ACCEPTED -> PROVISIONING -> ACTIVE, or FAILED/SUSPENDED.

QR_DONE_OK = frozenset({"ACTIVE"})
QR_DONE_BAD = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})


@dataclass(frozen=True)
class QueuedStatus:
    name: str
    state: str  # QueuedResourceState.State name; "" when it does not exist
    error_code: int = 0
    error_message: str = ""


def qr_full_name(api: RecreateApi, name: str, zone: str | None = None) -> str:
    return api.queued_resource_name(name, zone)


def queued_status(api: RecreateApi, name: str, zone: str | None = None) -> QueuedStatus:
    full = qr_full_name(api, name, zone)
    qr = api.get_queued_resource(full)
    if qr is None:
        return QueuedStatus(full, "")
    state = qr.state.state.name
    code, message = 0, ""
    if "failed_data" in qr.state:
        code, message = int(qr.state.failed_data.error.code), qr.state.failed_data.error.message
    return QueuedStatus(full, state, code, message)


def start_qr_delete(api: RecreateApi, name: str) -> str:
    """Delete the queued resource with force (its node goes first); the operation name."""
    return api.delete_queued_resource(qr_full_name(api, name), force=True)


def qr_request(cfg: Config, zone: str, project: str, launch: Mapping[str, str] | None = None) -> Any:
    """The CreateQueuedResource request: same name, tier and node spec as the saved one.

    A tpu_v2 request, or tpu_v2alpha1 when the node spec has v2alpha1-only fields.
    """
    from google.cloud import tpu_v2, tpu_v2alpha1

    node = build_request(cfg, launch, zone)
    tpu: Any = tpu_v2alpha1 if _api_version(node) == "v2alpha1" else tpu_v2
    spec = zone_spec(cfg, zone)
    parent = f"projects/{project}/locations/{zone}"
    qr = tpu.QueuedResource(
        tpu=tpu.QueuedResource.Tpu(node_spec=[
            tpu.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=cfg.tpu_name, node=node)
        ]),
    )
    tier = spec.get("queued_resource_tier", "")
    if tier == "spot":
        qr.spot = tpu.QueuedResource.Spot()
    elif tier == "guaranteed":
        qr.guaranteed = tpu.QueuedResource.Guaranteed()
    if spec.get("reservation_name"):
        qr.reservation_name = spec["reservation_name"]
    qr_id = str(cfg.tpu["queued_resource"]).rsplit("/", 1)[-1]
    return tpu.CreateQueuedResourceRequest(parent=parent, queued_resource_id=qr_id, queued_resource=qr)


def _json(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    result: dict[str, Any] = MessageToDict(type(message).pb(message))
    return result


def qr_request_json(cfg: Config, zone: str, project: str,
                    launch: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The exact CreateQueuedResource request (REST JSON) `start_qr_create` would send: for --dry-run."""
    request = qr_request(cfg, zone, project, launch)
    return {"method": f"google.cloud.tpu.{_api_version(request)}.Tpu.CreateQueuedResource", **_json(request)}


def start_qr_create(api: RecreateApi, cfg: Config, zone: str, *, resumed: bool = False,
                    launch: Mapping[str, str] | None = None) -> str:
    """Create the queued resource again in `zone`; the operation name ("" = ours exists already)."""
    request = qr_request(cfg, zone, api.project, launch)
    try:
        return api.create_queued_resource(request.queued_resource_id, _json(request.queued_resource), zone)
    except TpuwatchError as exc:
        failure = classify_exception(exc, started_by_us=resumed)
        if failure.kind == "exists":
            return ""
        raise CreateRejected(failure, zone) from None


def classify_queued(status: QueuedStatus) -> CreateFailure | None:
    """None while provisioning or ACTIVE; a failure for FAILED / SUSPENDED."""
    if status.state in QR_DONE_BAD:
        if status.state == "FAILED":
            return classify_create_error(status.error_code or 2, status.error_message or "queued resource FAILED",
                                         started_by_us=True)
        return CreateFailure("fatal", "other", status.state, f"queued resource {status.name} is {status.state}")
    return None
