"""The Compute Engine adapter (ports.TpuApi): a TPU slice made through Compute Engine, seen as one node.

On Compute Engine a TPU VM is an instance; a single-host slice is an instance or a managed
instance group (MIG) of one; a multi-host slice is a MIG whose workload policy names an
accelerator topology. The job's slice ([tpu] instance or [tpu] mig) is shown to the tick and
the policy as one `NodeSnapshot`, in the policy's vocabulary (policy/nodes.py):

- `id` is its instances' ids, joined in worker order: it changes when any of them is recreated
  (a new incarnation, as a recreated TPU node's id does).
- `state` (`instance_state`, `mig_state`): RUNNING is READY; Google at work (an instance
  PROVISIONING, STAGING or REPAIRING after a host error, a MIG instance with a current action,
  or a MIG short of its target size or not stable) is a repair state, waited for with
  repair_timeout; a stopped Spot VM is PREEMPTED (Google: a Spot TPU VM is deleted and
  recreated, never restarted); another stopped VM is STOPPED (a person's: left alone), and a MIG
  only when every instance of it is stopped (some stopped among running ones: REPAIRING).
- `repairs_itself`, `repair_under_way`: whether the MIG recreates a failed VM by itself
  (`defaultActionOnFailure` REPAIR, the default: then a preempted Spot VM is the MIG's to
  recreate) and what it is doing now; facts the policy weighs (policy/nodes.py, recovery.py).
- `health` is UNHEALTHY_MAINTENANCE while `resourceStatus.upcomingMaintenance` is ONGOING;
  `upcoming_maintenance` is the earliest notice of its instances.
- the workers are its instances in the runtime's order (`worker_order`): by their
  `agent-worker-number` metadata, which JAX reads for its process id on a TPU VM, where every
  instance carries one and they are 0..n-1; by name otherwise (docs/reliability.md says why).
- labels: an instance's own; a MIG's, those every instance carries (its template's), so the
  ownership label holds only when all of them say the same job.

Every request is one call under `tpuwatch.cloud.retry` with the client's own retry off.
Operations are zone operations, read with this adapter's own `ZoneOperationsClient` (built with
the same endpoint), never through a client's `.result()`, whose polling client is built without
the client options and so would reach Google even from a test. Nothing outside `cloud/` sees a
Compute Engine message: they become `tpuwatch.model` values here.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from google.api_core import exceptions as gexc

from tpuwatch.cloud import calls, clients
from tpuwatch.cloud.errors import (
    CODE_NUMBERS,
    ApiError,
    Call,
    is_transient,
    rate_limited,
    translate,
)
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.cloud.tpu import parse_rfc3339
from tpuwatch.errors import HostKeysRefused, NotFoundError, TpuwatchError, UsageError
from tpuwatch.model import (
    NODE_NAME,
    OWNER_LABEL,
    NodeSnapshot,
    OperationStatus,
    QueuedStatus,
    UpcomingMaintenance,
    WorkerEndpoint,
)

T = TypeVar("T")
Kind = Literal["instance", "mig"]
RPC_TIMEOUT = 30.0
# A regional MIG's operation (a region's, not a zone's), followed as `regionOperations/R/NAME`
REGION_OP = "regionOperations/"
PAGE_SIZE = 500
SERVICE = "compute.googleapis.com"
# The metadata item a TPU VM's worker number is in: JAX's cloud_tpu_cluster.py (GceTpuCluster)
# takes it as the process id; on Compute Engine a metadata item is what the VM's metadata server
# serves under instance/attributes/.
WORKER_NUMBER = "agent-worker-number"
_NUMBER = re.compile(r"[0-9]+")

# Instance.status -> the policy's state, for a VM that is not Spot.
_STATES: dict[str, str] = {
    "RUNNING": "READY",
    # "gracefully shutting down" (a Spot VM's preemption notice, a graceful shutdown): the guest and
    # the job still run, so it is READY with `pending_stop`, a notice to the policy, not a fault
    "PENDING_STOP": "READY",
    # created or restarted (after a host error: STAGING, then RUNNING on healthy hardware)
    "PROVISIONING": "STARTING", "STAGING": "STARTING", "PENDING": "STARTING",
    "REPAIRING": "REPAIRING",
    # stopped by a person (or by Google with no automatic restart): never deleted by tpuwatch
    "STOPPING": "STOPPING", "DEPROVISIONING": "STOPPING",
    "SUSPENDING": "STOPPING", "TERMINATED": "STOPPED", "STOPPED": "STOPPED", "SUSPENDED": "STOPPED",
}
# A Spot VM that stops was preempted: Google's word for TPUs is to delete and recreate it.
_SPOT_DOWN = frozenset({"STOPPING", "DEPROVISIONING", "TERMINATED", "STOPPED"})
# The worst state first when a MIG's instances differ (as model.combine_slices ranks slices). A
# person's stop (STOPPING, STOPPED) is not among them: a MIG reads so only when every instance is
# stopped, since a person stops a slice as a whole and Google's own stops come one VM at a time.
_RANK = ("PREEMPTED", "REPAIRING", "STARTING", "CREATING")
_PERSON = ("STOPPING", "STOPPED")
# A managed instance's current actions while the MIG makes it (again)
_MAKING = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING"})
# google.rpc codes of a zone operation's error, by the Compute Engine error code it carries
_OP_CODES: dict[str, str] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "RESOURCE_EXHAUSTED",
    "QUOTA_EXCEEDED": "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "RESOURCE_NOT_FOUND": "NOT_FOUND", "NOT_FOUND": "NOT_FOUND",
    "RESOURCE_ALREADY_EXISTS": "ALREADY_EXISTS", "ALREADY_EXISTS": "ALREADY_EXISTS",
    "PERMISSION_DENIED": "PERMISSION_DENIED", "CONDITION_NOT_MET": "FAILED_PRECONDITION",
    "INVALID_ARGUMENT": "INVALID_ARGUMENT", "INVALID_FIELD_VALUE": "INVALID_ARGUMENT",
}
_HTTP_CODES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
               412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def _name(value: Any) -> str:
    """An enum field's name: compute_v1 declares most as strings, a few (Operation.status) as enums."""
    return value.name if isinstance(value, enum.Enum) else str(value)


def short(url: str) -> str:
    """The last part of a resource URL or name ("…/instances/a-1" -> "a-1")."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def _time(text: str) -> datetime | None:
    return parse_rfc3339(text) if text else None


def spot(inst: Any) -> bool:
    """A Spot (or legacy preemptible) VM: `scheduling.provisioningModel` SPOT."""
    sched = inst.scheduling
    return sched.provisioning_model == "SPOT" or bool(sched.preemptible)


def instance_state(inst: Any) -> str:
    """An instance's state in the policy's words (see the module's docstring); a status this
    version does not know is kept as it is, which the policy waits for and never deletes."""
    status = str(inst.status)
    if spot(inst) and status in _SPOT_DOWN:
        return "PREEMPTED"
    return _STATES.get(status, status or "UNKNOWN")


def _shutdown(inst: Any) -> Any | None:
    """`resourceStatus.shutdownDetails`, or None while no stop is under way or scheduled."""
    if "resource_status" not in inst or "shutdown_details" not in inst.resource_status:
        return None
    return inst.resource_status.shutdown_details


def google_deletion(inst: Any) -> tuple[bool, datetime | None, str]:
    """(whether Google deletes the VM itself, when its run ends, what shows it deleting it now).

    Google runs a VM's termination action at a Spot preemption and at the end of its run
    (`scheduling.terminationTime`, or `maxRunDuration` from its last start); with DELETE (a
    flex-start VM's usual end) the VM is gone afterwards, which is Google's doing, not a
    person's. While it goes, `resourceStatus.shutdownDetails.targetState` is DELETED; a Spot VM
    with DELETE that is stopping is being preempted."""
    sched = inst.scheduling
    ends = _time(sched.termination_time) if sched.termination_time else None
    if ends is None and "max_run_duration" in sched and inst.last_start_timestamp:
        started = _time(inst.last_start_timestamp)
        ends = started + timedelta(seconds=int(sched.max_run_duration.seconds)) if started is not None else None
    deletes = str(sched.instance_termination_action) == "DELETE" and (
        spot(inst) or str(sched.provisioning_model) == "FLEX_START" or ends is not None)
    if not deletes:
        return False, None, ""
    shutdown, status = _shutdown(inst), str(inst.status)
    if shutdown is not None and str(shutdown.target_state) == "DELETED" and str(shutdown.stop_state) != "PENDING_STOP":
        since = f" since {shutdown.request_timestamp}" if shutdown.request_timestamp else ""
        return True, ends, f"shutdownDetails {shutdown.stop_state} to DELETED{since}"
    if spot(inst) and status in _SPOT_DOWN:
        return True, ends, f"a Spot VM with termination action DELETE is {status}"
    return True, ends, ""


def auto_restart(inst: Any) -> bool:
    """Compute Engine restarts the VM after a stop of its own (`scheduling.automaticRestart`,
    true unless set false; never for Spot)."""
    sched = inst.scheduling
    return not spot(inst) and ("automatic_restart" not in sched or bool(sched.automatic_restart))


def upcoming(inst: Any) -> UpcomingMaintenance | None:
    """`resourceStatus.upcomingMaintenance`, or None when nothing is scheduled."""
    if "resource_status" not in inst or "upcoming_maintenance" not in inst.resource_status:
        return None
    um = inst.resource_status.upcoming_maintenance
    return UpcomingMaintenance(
        type=um.type_ or "UNKNOWN_TYPE", status=um.maintenance_status or "UNKNOWN",
        can_reschedule=bool(um.can_reschedule), window_start=_time(um.window_start_time),
        window_end=_time(um.window_end_time), latest_window_start=_time(um.latest_window_start_time),
    )


def pending_stop(inst: Any) -> bool:
    """The VM "gracefully shutting down" while its guest and the job still run: status PENDING_STOP,
    or RUNNING with `resourceStatus.shutdownDetails.stopState` PENDING_STOP (Google documents both,
    not which a Spot preemption's notice, `scheduling.preemptionNoticeDuration`, shows)."""
    status = str(inst.status)
    if status == "PENDING_STOP":
        return True
    shutdown = _shutdown(inst)
    return status == "RUNNING" and shutdown is not None and str(shutdown.stop_state) == "PENDING_STOP"


def _health(notices: Iterable[UpcomingMaintenance | None]) -> str:
    return "UNHEALTHY_MAINTENANCE" if any(n is not None and n.status == "ONGOING" for n in notices) else "HEALTHY"


def _endpoint(index: int, inst: Any) -> WorkerEndpoint:
    nics = list(inst.network_interfaces)
    internal = nics[0].network_i_p if nics else ""
    external = next((ac.nat_i_p for ac in nics[0].access_configs if ac.nat_i_p), "") if nics else ""
    return WorkerEndpoint(index=index, internal_ip=internal, external_ip=external)


def worker_order(numbers: Mapping[str, str | None]) -> tuple[tuple[str, ...], str]:
    """A MIG's instances in worker order, and what is wrong with their numbers ("" when nothing).

    `numbers`: instance name -> its `agent-worker-number` metadata value (None without one). When
    every instance has one and they are 0..n-1, each once, instance i is worker i: the process
    id JAX takes on that VM. Otherwise name order: none has one (Google documents no such item on
    Compute Engine), or some lack one, or they repeat, skip or are not numbers, which is said."""
    by_name = tuple(sorted(numbers))
    given = {n: v for n, v in numbers.items() if v is not None}
    if not given:
        return by_name, ""
    parsed = {n: int(v) for n, v in given.items() if _NUMBER.fullmatch(v.strip())}
    if len(parsed) == len(numbers) and sorted(parsed.values()) == list(range(len(numbers))):
        return tuple(sorted(parsed, key=lambda n: parsed[n])), ""
    shown = ", ".join(f"{n}: {numbers[n] if numbers[n] is not None else 'none'}" for n in by_name)
    return by_name, (f"the instances' {WORKER_NUMBER} metadata is not 0..{len(numbers) - 1} once each ({shown}), "
                     "so tpuwatch numbers the workers by instance name. A job that takes its process id from "
                     "that metadata (JAX does) would disagree with tpuwatch's worker 0: pass {worker} (or "
                     "TPUWATCH_WORKER_ID) to the job as its process id, and worker 0's address as its coordinator")


def metadata_value(inst: Any, key: str) -> str | None:
    """An instance's metadata item `key`, or None when it has none."""
    return next((str(item.value) for item in inst.metadata.items if item.key == key), None)


def in_worker_order(instances: Sequence[Any]) -> tuple[list[Any], str]:
    """A MIG's `compute_v1.Instance`s in worker order (`worker_order`), and what is wrong with
    their numbers ("" when nothing)."""
    by_name = {i.name: i for i in instances}
    names, problem = worker_order({n: metadata_value(i, WORKER_NUMBER) for n, i in by_name.items()})
    return [by_name[n] for n in names], problem


def _earliest(notices: Sequence[UpcomingMaintenance]) -> UpcomingMaintenance | None:
    if not notices:
        return None
    return min(notices, key=lambda n: n.window_start.timestamp() if n.window_start is not None else float("inf"))


def instance_snapshot(inst: Any, *, project: str, zone: str) -> NodeSnapshot:
    """A single-host slice: one `compute_v1.Instance` as a node of one worker."""
    notice = upcoming(inst)
    deletes, ends, deleting = google_deletion(inst)
    # A VM Google is deleting is DELETING: the policy waits for it to go (policy/google.py), then
    # makes it again, rather than racing Google's delete with its own.
    state = "DELETING" if deleting else instance_state(inst)
    return NodeSnapshot(
        name=inst.name, project=project, zone=zone, id=str(inst.id) if inst.id else "",
        create_time=_time(inst.creation_timestamp), state=state, health=_health([notice]),
        health_description=inst.status_message, maintenance_time=None, upcoming_maintenance=notice,
        workers=(_endpoint(0, inst),), accelerator_type=short(inst.machine_type), spot=spot(inst),
        preemptible=bool(inst.scheduling.preemptible), labels=dict(inst.labels),
        metadata_keys=tuple(sorted(item.key for item in inst.metadata.items)),
        resource=f"projects/{project}/zones/{zone}/instances/{inst.name}", pending_stop=pending_stop(inst),
        google_deletes=deletes, google_deletes_at=ends, google_deleting=deleting, auto_restart=auto_restart(inst),
    )


def repairs_itself(mig: Any) -> bool:
    """The MIG recreates a failed VM by itself, a preempted Spot VM included (Google's TPU
    failure-recovery page): `instanceLifecyclePolicy.defaultActionOnFailure` REPAIR, which is the
    default when the field is absent. DO_NOTHING (or the beta DELETE) leaves it to tpuwatch."""
    policy = mig.instance_lifecycle_policy if "instance_lifecycle_policy" in mig else None
    action = str(policy.default_action_on_failure) if policy is not None else ""
    return action in ("", "REPAIR")


def mig_acting(mig: Any, managed: Sequence[Any]) -> str:
    """What the MIG is doing to its instances now: those with a current action (creating,
    recreating, restarting, ...), or how far short of its target size it is; "" when nothing."""
    acting = [f"{short(m.instance) or m.name}: {m.current_action}" for m in managed
              if m.current_action and m.current_action != "NONE"]
    if acting:
        return "MIG acting on " + ", ".join(acting)
    target = int(mig.target_size)
    if len(managed) < target:
        return f"MIG has {len(managed)} of its {target} instances"
    return ""


def mig_state(mig: Any, managed: Sequence[Any], instances: Sequence[Any]) -> tuple[str, str]:
    """(state, what Google is doing) of a MIG from its managed instances and their instances.

    The MIG at work (`mig_acting`), an instance not yet readable, or the MIG not stable (with no
    Spot VM preempted): REPAIRING, for the policy to wait with repair_timeout; it never deletes
    what a MIG repairs. A Spot VM preempted: PREEMPTED, a fact; whether the MIG repairs it by
    itself is the snapshot's `repairs_itself`, for the policy to weigh. A MIG scaled to zero, or
    every instance stopped: STOPPED (a person's). Some stopped while others run or are
    repaired: REPAIRING (Google's stop of one VM, such as a host error's). Otherwise the worst of
    its instances' states."""
    target = int(mig.target_size)
    if target == 0 and not managed:
        return "STOPPED", "target size 0"
    if doing := mig_acting(mig, managed):
        return "REPAIRING", doing
    if len(instances) < len(managed):
        return "REPAIRING", "MIG instances not all readable yet"
    states = [instance_state(i) for i in instances]
    if "PREEMPTED" in states:
        preempted = ", ".join(i.name for i, s in zip(instances, states, strict=True) if s == "PREEMPTED")
        return "PREEMPTED", f"Spot VM preempted: {preempted}"
    if "status" in mig and "is_stable" in mig.status and not mig.status.is_stable:
        # e.g. its instances TERMINATED by a host error, which Google restarts (a multi-host
        # slice as a whole), or stopped ones its autoheal restarts
        return "REPAIRING", "MIG not stable"
    down = [s for s in states if s != "READY"]
    if down and all(s in _PERSON for s in states):
        return ("STOPPING" if "STOPPING" in states else "STOPPED"), ""
    if any(s in _PERSON for s in down):
        stopped = ", ".join(f"{i.name}: {i.status}" for i, s in zip(instances, states, strict=True) if s in _PERSON)
        return "REPAIRING", f"some instances stopped, not all ({stopped}): not a person's stop of the slice"
    worst = next((s for s in _RANK if s in down), down[0] if down else "READY")
    return worst, ""


def mig_snapshot(mig: Any, managed: Sequence[Any], instances: Sequence[Any], *, project: str,
                 zone: str, template_labels: Mapping[str, str] | None = None, region: str = "") -> NodeSnapshot:
    """A MIG (`compute_v1.InstanceGroupManager`, its `ManagedInstance`s from listManagedInstances,
    and those instances) as one node whose workers are its instances in worker order
    (`in_worker_order`). With no instance readable (the MIG making them, e.g. through a
    stockout) its labels are `template_labels`, those its instances will carry, so its owner is
    still known. `region`: a regional MIG's (its instances in `zone`)."""
    ordered, _ = in_worker_order(instances)
    state, doing = mig_state(mig, managed, ordered)
    notices = [upcoming(i) for i in ordered]
    errors = [f"{short(m.instance) or m.name}: {e.code}: {e.message}" for m in managed
              if "last_attempt" in m and "errors" in m.last_attempt for e in m.last_attempt.errors.errors]
    described = "; ".join([d for d in (doing, *errors) if d] + [f"{i.name}: {i.status_message}" for i in ordered
                                                                 if i.status_message])
    label_sets = [dict(i.labels) for i in ordered]
    labels = ({k: v for k, v in label_sets[0].items() if all(s.get(k) == v for s in label_sets)} if label_sets
              else dict(template_labels or {}))
    if len({s.get(OWNER_LABEL) for s in label_sets}) > 1:
        labels.pop(OWNER_LABEL, None)
    times = [t for t in (_time(i.creation_timestamp) for i in ordered) if t is not None]
    first = ordered[0] if ordered else None
    return NodeSnapshot(
        name=mig.name, project=project, zone=zone,
        # no instance made yet: an id of its own, so that a delete's end ("replaced") is seen
        id="+".join(str(i.id) for i in ordered) if ordered else f"{mig.name}:none", create_time=max(times) if times else None,
        state=state, health=_health(notices), health_description=described, maintenance_time=None,
        upcoming_maintenance=_earliest([n for n in notices if n is not None]),
        workers=tuple(_endpoint(n, i) for n, i in enumerate(ordered)),
        accelerator_type=short(first.machine_type) if first is not None else "",
        spot=any(spot(i) for i in ordered), preemptible=any(bool(i.scheduling.preemptible) for i in ordered),
        labels=labels, metadata_keys=tuple(sorted(item.key for item in first.metadata.items)) if first else (),
        resource=f"projects/{project}/{f'regions/{region}' if region else f'zones/{zone}'}/instanceGroupManagers/{mig.name}",
        repairs_itself=repairs_itself(mig), repair_under_way=mig_acting(mig, managed),
        pending_stop=any(pending_stop(i) for i in ordered),
    )


def at_rest(mig: Any, listed: Iterable[Any], zone: str) -> list[Any] | None:
    """The managed instances of a MIG at rest, without listManagedInstances: when the MIG says it
    is stable, every instance of its target size is doing nothing (`currentActions.none`) and
    that many instances it made (their `created-by` metadata names it) are RUNNING, each is one
    of them, doing nothing. None otherwise: then only listManagedInstances says which instance
    does what, and why (and an instance that went down since the MIG was read is never taken
    for one at rest)."""
    from google.cloud import compute_v1

    target = int(mig.target_size)
    if not ("status" in mig and mig.status.is_stable) or "current_actions" not in mig:
        return None
    if int(mig.current_actions.none) != target:
        return None
    region = short(mig.region) if "region" in mig and mig.region else ""
    maker = f"/{f'regions/{region}' if region else f'zones/{zone}'}/instanceGroupManagers/{mig.name}"
    made = [i for i in listed if any(item.key == "created-by" and str(item.value).endswith(maker)
                                     for item in i.metadata.items)]
    if len(made) != target or any(str(i.status) != "RUNNING" for i in made):
        return None
    return [compute_v1.ManagedInstance(instance=i.self_link or i.name, name=i.name, current_action="NONE",
                                       instance_status=i.status) for i in made]


def name_filter(names: Sequence[str]) -> str:
    """An instances.list `filter` that keeps the instances named `names` (Compute Engine names
    are lowercase letters, digits and hyphens: nothing to escape in the regular expression)."""
    return f'name eq "({"|".join(names)})"'


def members(managed: Sequence[Any], listed: Callable[[], Iterable[Any]]) -> list[Any]:
    """The instances of `listed()` that the managed instances name (no request when none does)."""
    wanted = {short(m.instance) for m in managed if m.instance}
    return [i for i in listed() if i.name in wanted] if wanted else []


def operation_status(op: Any) -> OperationStatus:
    """A zone operation as an OperationStatus, its error as a google.rpc code (by its Compute
    Engine error code, else its HTTP status)."""
    done = _name(op.status) == "DONE"
    code, message = 0, ""
    if done and "error" in op and op.error.errors:
        first = op.error.errors[0]
        name = _OP_CODES.get(first.code) or _HTTP_CODES.get(int(op.http_error_status_code or 0), "UNKNOWN")
        code, message = CODE_NUMBERS[name], "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
    return OperationStatus(name=op.name, done=done, error_code=code, error_message=message)


class Reads(Protocol):
    """Where `get_node` reads the slice from: straight from the API (`DirectReads`: a get of the
    instance; or the MIG, its managed instances and the zone's instances), or from listings of
    the zone that the jobs of one watcher share (cloud/zoneinstances.py). Any request of the
    job's own goes through `api`, the job's adapter."""

    def instance(self, api: ComputeAdapter, name: str) -> Any | None:
        """The `compute_v1.Instance`, or None when it does not exist."""
        ...

    def mig_parts(self, api: ComputeAdapter, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        """(MIG, its managed instances, their instances), or None when the MIG does not exist."""
        ...


class DirectReads:
    """Reads of one job's slice through its own adapter, every tick."""

    def instance(self, api: ComputeAdapter, name: str) -> Any | None:
        return api.get_instance(name)

    def mig_parts(self, api: ComputeAdapter, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        return api.mig_parts(name)


class ComputeAdapter:
    """ports.TpuApi over google-cloud-compute for one project and zone and the job's kind of slice.

    `reads`: where `get_node` reads the slice (`DirectReads` unless given)."""

    def __init__(self, project: str, zone: str, kind: Kind, *, retry: RetryPolicy | None = None,
                 flex_start: float = 0.0, reads: Reads | None = None) -> None:
        self.project = project
        self.zone = zone
        self.kind: Kind = kind
        self.flex_start = flex_start  # [tpu] flex_start: the MIG's VMs come through resize requests of this run
        self.retry = retry or RetryPolicy.from_env()
        self.reads: Reads = reads or DirectReads()
        self._clients: dict[str, Any] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # node id -> its instances' names, in worker order
        self._notes: list[str] = []  # what the person watching should know, not yet taken
        self._noted: set[str] = set()
        # MIG name -> its region, for a regional MIG (regionInstanceGroupManagers) once found
        self._regions: dict[str, str] = {}
        self._zonal: set[str] = set()  # MIG names found in the zone

    # -- plumbing ---------------------------------------------------------------------------
    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            self._clients[kind] = clients.compute_client(kind)
        return self._clients[kind]

    def _call(self, method: str, target: str, needs: str, fn: Callable[[], T], *, read: bool,
              role: str = "roles/compute.viewer") -> T:
        call = Call("Compute Engine API", method, target, needs, SERVICE, role)
        try:
            return self.retry.call(calls.counted(call, fn), transient=lambda e: is_transient(e, read=read),
                                   patient=rate_limited)
        except TpuwatchError:
            raise
        except Exception as exc:
            raise translate(exc, call, project=self.project) from None

    def _where(self, zone: str | None = None) -> str:
        return f"projects/{self.project}/zones/{zone or self.zone}"

    def _get(self, kind: str, name: str, needs: str, fn: Callable[[Any], Any]) -> Any | None:
        """One get (`fn(client)`); None on NOT_FOUND."""
        client = self._client(kind)

        def get() -> Any:
            try:
                return fn(client)
            except gexc.NotFound:
                return None

        return self._call(f"get_{kind}", f"{self._where()}/{kind}/{name}", needs, get, read=True)

    def _pages(self, kind: str, method: str, target: str, needs: str, field: str,
               fetch: Callable[[Any, str], Any]) -> list[Any]:
        """Every item of a paged list: `fetch(client, token)` is one request for a page, whose
        items are its `field`."""
        client = self._client(kind)
        out: list[Any] = []
        token = ""
        while True:
            def page(token: str = token) -> Any:
                return fetch(client, token)

            resp = self._call(method, target, needs, page, read=True)
            out.extend(getattr(resp, field))
            token = resp.next_page_token
            if not token:
                return out

    # -- reads ------------------------------------------------------------------------------
    def get_instance(self, name: str) -> Any | None:
        """The `compute_v1.Instance`, or None."""
        return self._get("instances", name, "compute.instances.get", lambda c: c.get(
            project=self.project, zone=self.zone, instance=name, retry=None, timeout=RPC_TIMEOUT))

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def mig_region(self, name: str) -> str:
        """The region of MIG `name` when it is a regional MIG (known once read), else ""."""
        return self._regions.get(name, "")

    def scope_known(self, name: str) -> bool:
        """Whether MIG `name` was found, zonal or regional, by this adapter."""
        return name in self._regions or name in self._zonal

    def get_mig(self, name: str) -> Any | None:
        """The `compute_v1.InstanceGroupManager`, or None: the zone's MIG, else the zone's region's
        (a regional MIG, remembered so that later reads ask the region first, one request)."""
        if name not in self._regions:
            mig = self._get("instanceGroupManagers", name, "compute.instanceGroupManagers.get", lambda c: c.get(
                project=self.project, zone=self.zone, instance_group_manager=name, retry=None, timeout=RPC_TIMEOUT))
            if mig is not None:
                self._zonal.add(name)
                return mig
        mig = self._get("regionInstanceGroupManagers", name, "compute.instanceGroupManagers.get", lambda c: c.get(
            project=self.project, region=self.region, instance_group_manager=name, retry=None, timeout=RPC_TIMEOUT))
        if mig is not None:
            self._regions[name] = self.region
            return mig
        if self._regions.pop(name, None) is not None:  # gone from the region: perhaps made again in the zone
            return self.get_mig(name)
        return None

    def get_template(self, url: str) -> Any | None:
        """The MIG's `compute_v1.InstanceTemplate` (global or regional, by its URL), or None."""
        name = short(url)
        if "/regions/" in url:
            region = url.split("/regions/", 1)[1].split("/", 1)[0]
            return self._get("regionInstanceTemplates", name, "compute.instanceTemplates.get", lambda c: c.get(
                project=self.project, region=region, instance_template=name, retry=None, timeout=RPC_TIMEOUT))
        return self._get("instanceTemplates", name, "compute.instanceTemplates.get", lambda c: c.get(
            project=self.project, instance_template=name, retry=None, timeout=RPC_TIMEOUT))

    def get_resource_policy(self, url: str) -> Any | None:
        """A `compute_v1.ResourcePolicy` (the MIG's workload policy) by its URL, or None."""
        name = short(url)
        region = url.split("/regions/", 1)[1].split("/", 1)[0] if "/regions/" in url else self.zone.rsplit("-", 1)[0]
        return self._get("resourcePolicies", name, "compute.resourcePolicies.get", lambda c: c.get(
            project=self.project, region=region, resource_policy=name, retry=None, timeout=RPC_TIMEOUT))

    def managed_instances(self, name: str) -> list[Any]:
        """listManagedInstances: each `ManagedInstance` (current action, status, last attempt)."""
        from google.cloud import compute_v1

        if region := self.mig_region(name):
            return self._pages("regionInstanceGroupManagers", "list_managed_instances",
                               f"projects/{self.project}/regions/{region}/instanceGroupManagers/{name}",
                               "compute.instanceGroupManagers.get", "managed_instances",
                               lambda c, token: c.list_managed_instances(
                                   request=compute_v1.ListManagedInstancesRegionInstanceGroupManagersRequest(
                                       project=self.project, region=region, instance_group_manager=name,
                                       max_results=PAGE_SIZE, page_token=token), retry=None, timeout=RPC_TIMEOUT))
        return self._pages("instanceGroupManagers", "list_managed_instances",
                           f"{self._where()}/instanceGroupManagers/{name}", "compute.instanceGroupManagers.get",
                           "managed_instances", lambda c, token: c.list_managed_instances(
                               request=compute_v1.ListManagedInstancesInstanceGroupManagersRequest(
                                   project=self.project, zone=self.zone, instance_group_manager=name,
                                   max_results=PAGE_SIZE, page_token=token), retry=None, timeout=RPC_TIMEOUT))

    def list_instances(self, names: Iterable[str] | None = None) -> list[Any]:
        """Every instance of the zone (one request a page), or only those named `names`: a
        `filter` on their names (`name eq "(a|b|c)"`, a regular expression the whole name must
        match), so that a MIG's read is one page of its own instances, whatever else the zone holds."""
        from google.cloud import compute_v1

        wanted = sorted(set(names)) if names is not None else None
        if wanted == []:
            return []
        where = name_filter(wanted) if wanted is not None else ""
        return self._pages("instances", "list_instances", self._where(), "compute.instances.list", "items",
                           lambda c, token: c.list(request=compute_v1.ListInstancesRequest(
                               project=self.project, zone=self.zone, max_results=PAGE_SIZE, page_token=token,
                               filter=where), retry=None, timeout=RPC_TIMEOUT))

    def member_instances(self, managed: Sequence[Any]) -> list[Any]:
        """The instances a MIG's managed instances name, read with one filtered list. A regional
        MIG's instances in another zone than the job's are not read (the workers are reached in
        the job's zone), and are said once: they read as not there, so the slice never READY."""
        elsewhere = sorted(m.instance for m in managed if m.instance and f"/zones/{self.zone}/" not in
                           f"/{m.instance}" and "/zones/" in m.instance)
        if elsewhere and (note := f"MIG instances outside zone {self.zone}: " + ", ".join(
                f"{short(u)} ({u.split('/zones/', 1)[1].split('/', 1)[0]})" for u in elsewhere)) not in self._noted:
            self._noted.add(note)
            self._notes.append(f"{note}; tpuwatch reads and reaches a slice's VMs in the job's zone only (a TPU "
                               "slice's VMs are in one zone): set [tpu] zone to theirs")
        return self.list_instances([short(m.instance) for m in managed if m.instance and m.instance not in elsewhere])

    def list_migs(self) -> list[Any]:
        """Every MIG of the zone (one request a page)."""
        from google.cloud import compute_v1

        return self._pages("instanceGroupManagers", "list_instance_group_managers", self._where(),
                           "compute.instanceGroupManagers.list", "items",
                           lambda c, token: c.list(request=compute_v1.ListInstanceGroupManagersRequest(
                               project=self.project, zone=self.zone, max_results=PAGE_SIZE, page_token=token),
                               retry=None, timeout=RPC_TIMEOUT))

    def list_region_migs(self) -> list[Any]:
        """Every regional MIG of the zone's region (one request a page); each is remembered as
        regional, so that its managed instances are asked of the region."""
        from google.cloud import compute_v1

        migs = self._pages("regionInstanceGroupManagers", "list_region_instance_group_managers",
                           f"projects/{self.project}/regions/{self.region}", "compute.instanceGroupManagers.list",
                           "items", lambda c, token: c.list(request=compute_v1.ListRegionInstanceGroupManagersRequest(
                               project=self.project, region=self.region, max_results=PAGE_SIZE, page_token=token),
                               retry=None, timeout=RPC_TIMEOUT))
        self._regions.update({m.name: self.region for m in migs})
        return migs

    def mig_parts(self, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        """(MIG, its managed instances, their instances), or None when the MIG does not exist.
        Three requests: the MIG, listManagedInstances, and its instances (a list filtered to
        their names: never the zone's other instances)."""
        mig = self.get_mig(name)
        if mig is None:
            return None
        managed = self.managed_instances(name)
        return mig, managed, self.member_instances(managed)

    def disk_params(self, url: str) -> dict[str, Any]:
        """The `initializeParams` that make disk `url` again: its image, size and type."""
        name = short(url)
        disk = self._get("disks", name, "compute.disks.get", lambda c: c.get(
            project=self.project, zone=self.zone, disk=name, retry=None, timeout=RPC_TIMEOUT))
        if disk is None:
            return {}
        params: dict[str, Any] = {"diskSizeGb": str(disk.size_gb)} if disk.size_gb else {}
        if disk.source_image:
            params["sourceImage"] = disk.source_image
        if disk.type_:  # an instance insert takes it as a URL only (a bare name is for templates)
            params["diskType"] = f"zones/{self.zone}/diskTypes/{short(disk.type_)}"
        return params

    # -- ports.TpuApi -----------------------------------------------------------------------
    def get_node(self, name: str) -> NodeSnapshot | None:
        """The job's instance or MIG as one node, or None when it does not exist (read through
        `reads`: a tick's look, which the jobs of one watcher may share)."""
        return self.read_node(name, self.reads)

    def read_node(self, name: str, reads: Reads) -> NodeSnapshot | None:
        """The job's instance or MIG as one node read through `reads` (`DirectReads()`: as it is
        now, for an action that must not act on a shared look begun before it)."""
        self._check(name)
        if self.kind == "instance":
            inst = reads.instance(self, name)
            node = None if inst is None else instance_snapshot(inst, project=self.project, zone=self.zone)
            names: tuple[str, ...] = (name,)
        else:
            parts = reads.mig_parts(self, name)
            if parts is None or flex_emptied(self, *parts[:2]):
                return None
            mig, managed, instances = parts
            template = self.get_template(mig.instance_template) if not instances and mig.instance_template else None
            node = mig_snapshot(mig, managed, instances, project=self.project, zone=self.zone,
                                template_labels=dict(template.properties.labels) if template is not None else None,
                                region=self.mig_region(name))
            names = self._numbered(node, instances)
        if node is not None and node.id:
            self._names[node.id] = names
        return node

    def list_nodes(self) -> list[NodeSnapshot]:
        """Every slice of the zone (`status --all`): each MIG as one node of its instances, each
        instance no MIG manages as a node of one worker. One list of instances, one of MIGs,
        and one listManagedInstances per MIG."""
        instances = {i.name: i for i in self.list_instances()}
        nodes: list[NodeSnapshot] = []
        for mig in self.list_migs() + self.list_region_migs():
            managed = self.managed_instances(mig.name)
            members = [instances.pop(n) for n in (short(m.instance) or m.name for m in managed) if n in instances]
            if self.mig_region(mig.name) and not members:
                continue  # a regional MIG with no VM in this zone: another zone's slice
            nodes.append(node := mig_snapshot(mig, managed, members, project=self.project, zone=self.zone,
                                              region=self.mig_region(mig.name)))
            self._numbered(node, members)
        return nodes + [instance_snapshot(i, project=self.project, zone=self.zone) for i in instances.values()]

    def _numbered(self, node: NodeSnapshot, instances: Sequence[Any]) -> tuple[str, ...]:
        """The MIG's instance names in worker order; a READY MIG's numbers that tpuwatch cannot
        follow are said once (while a MIG makes or repairs its instances, some are missing)."""
        ordered, problem = in_worker_order(instances)
        note = f"MIG {node.name}: {problem}"
        if problem and node.state == "READY" and note not in self._noted:
            self._noted.add(note)
            self._notes.append(note)
        return tuple(i.name for i in ordered)

    def take_notes(self) -> list[str]:
        """What the person watching should know, once (a MIG whose worker numbers tpuwatch
        cannot follow)."""
        notes, self._notes = self._notes, []
        return notes

    def instance_names(self, node: NodeSnapshot) -> tuple[str, ...]:
        """The node's instances in worker order (known from its last get)."""
        return self._names.get(node.id, (node.name,) if self.kind == "instance" else ())

    def worker_instances(self, *nodes: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        """Instance name -> (node, worker id), for the audit log's entries about the instances."""
        return {inst: (node.name, str(i)) for node in nodes for i, inst in enumerate(self.instance_names(node))}

    def host_keys(self, name: str) -> dict[int, tuple[str, ...]]:
        """Each worker's SSH host keys from its instance's guest attributes (`hostkeys/`, which
        `gcloud compute ssh` reads): worker index -> ("ssh-ed25519 AAAA...", ...). One request per
        instance; none for an instance that publishes none (guest attributes off, or gone).
        HostKeysRefused when the read is refused for lack of compute.instances.getGuestAttributes
        (a 403 that is not a rate limit, which is retried as every read is)."""
        node = self.get_node(name) if self.kind == "mig" else None
        names = self.instance_names(node) if node is not None else (name,)
        client = self._client("instances")
        out: dict[int, tuple[str, ...]] = {}
        for worker, inst in enumerate(names):
            def get(inst: str = inst) -> Any:
                from google.cloud import compute_v1

                request = compute_v1.GetGuestAttributesInstanceRequest(project=self.project, zone=self.zone,
                                                                       instance=inst, query_path="hostkeys/")
                try:
                    return client.get_guest_attributes(request=request, retry=None, timeout=RPC_TIMEOUT)
                except (gexc.NotFound, gexc.FailedPrecondition):
                    return None

            try:
                answer = self._call("get_guest_attributes", f"{self._where()}/instances/{inst}",
                                    "compute.instances.getGuestAttributes", get, read=True)
            except ApiError as exc:
                if exc.code != "PERMISSION_DENIED":
                    raise
                raise HostKeysRefused(exc.message, permission=exc.permission) from None
            if answer is None or "query_value" not in answer:
                continue
            keys = tuple(f"{item.key} {item.value}" for item in answer.query_value.items
                         if item.namespace == "hostkeys" and item.key and item.value)
            if keys:
                out[worker] = keys
        return out

    def get_operation(self, name: str) -> OperationStatus:
        """The zone operation (zoneOperations.get through this adapter's own client); for a
        flex-start MIG's create, the resize request it is (`RESIZE_OP` + its name)."""
        if name.startswith(RESIZE_OP):
            return resize_operation(self, name)
        if name.startswith(REGION_OP):
            region, op_name = name[len(REGION_OP):].split("/", 1)
            regional = self._client("regionOperations")
            op = self._call("get_operation", f"projects/{self.project}/regions/{region}/operations/{op_name}",
                            "compute.regionOperations.get", lambda: regional.get(
                                project=self.project, region=region, operation=op_name, retry=None,
                                timeout=RPC_TIMEOUT), read=True)
            return replace(operation_status(op), name=name)
        client = self._client("zoneOperations")
        op = self._call("get_operation", f"{self._where()}/operations/{name}", "compute.zoneOperations.get",
                        lambda: client.get(project=self.project, zone=self.zone, operation=name, retry=None,
                                           timeout=RPC_TIMEOUT), read=True)
        return operation_status(op)

    # -- writes -----------------------------------------------------------------------------
    def delete_node(self, name: str) -> str:
        """Start deleting the instance; the operation name. NotFoundError when it is gone.
        A MIG is not deleted: `recreate_mig` recreates its instances."""
        self._check(name)
        if self.kind == "mig":
            return self.recreate_mig(name)
        client = self._client("instances")

        def delete() -> Any:
            return client.delete_unary(project=self.project, zone=self.zone, instance=name, retry=None,
                                       timeout=RPC_TIMEOUT)

        return self._write("delete_instance", f"{self._where()}/instances/{name}", "compute.instances.delete",
                           delete, gone=f"no instance {name} in {self.project}/{self.zone} to delete")

    def recreate_mig(self, name: str) -> str:
        """recreateInstances on every instance of the MIG (a multi-host slice only as a whole);
        the operation name. NotFoundError when the MIG or all its instances are gone, or when the
        MIG is already making some of them again (CREATING, RECREATING): the policy saw it idle,
        and it began its own repair since. A recreate then would only flag what is flagged (or,
        on a multi-host slice, which Google replaces as a whole, start the whole slice over), so
        none is sent and the next tick sees the MIG at work."""
        from google.cloud import compute_v1

        managed = self.managed_instances(name)
        making = [f"{short(m.instance) or m.name}: {m.current_action}" for m in managed
                  if str(m.current_action) in _MAKING]
        if making:
            raise NotFoundError(f"MIG {name} is already making its instances again ({', '.join(making)}); "
                                "no recreateInstances sent")
        urls = [m.instance for m in managed if m.instance]
        if not urls:
            raise NotFoundError(f"MIG {name} in {self.project}/{self.zone} has no instances to recreate")
        if region := self.mig_region(name):
            regional = self._client("regionInstanceGroupManagers")

            def recreate_regional() -> Any:
                return regional.recreate_instances_unary(
                    project=self.project, region=region, instance_group_manager=name,
                    region_instance_group_managers_recreate_request_resource=compute_v1.
                    RegionInstanceGroupManagersRecreateRequest(instances=urls), retry=None, timeout=RPC_TIMEOUT)

            op = self._write("recreate_instances", f"projects/{self.project}/regions/{region}/instanceGroupManagers/"
                             f"{name}", "compute.instanceGroupManagers.update", recreate_regional,
                             gone=f"no MIG {name} in {self.project}/{region} to recreate")
            return f"{REGION_OP}{region}/{op}"
        client = self._client("instanceGroupManagers")
        body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(instances=urls)

        def recreate() -> Any:
            return client.recreate_instances_unary(
                project=self.project, zone=self.zone, instance_group_manager=name,
                instance_group_managers_recreate_instances_request_resource=body, retry=None, timeout=RPC_TIMEOUT)

        return self._write("recreate_instances", f"{self._where()}/instanceGroupManagers/{name}",
                           "compute.instanceGroupManagers.update", recreate,
                           gone=f"no MIG {name} in {self.project}/{self.zone} to recreate")

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        """Start inserting the instance (or MIG) `name` from its JSON-like insert body; the
        operation name. RESOURCE_EXHAUSTED (no capacity, quota) raises ApiError, unretried."""
        self._check(name)

        if zone not in (None, self.zone):
            raise UsageError(f"a Compute Engine slice is created in its own zone {self.zone}, not {zone}")
        kind = "instances" if self.kind == "instance" else "instanceGroupManagers"
        if self.kind == "instance":
            node = without_past_termination(node, time.time())
        resource = check_insert(self.kind, node, name, self.zone)
        if self.kind == "mig" and "distributionPolicy" in node:  # a regional MIG (init saved its distribution)
            regional = self._client("regionInstanceGroupManagers")

            def insert_regional() -> Any:
                return regional.insert_unary(project=self.project, region=self.region,
                                             instance_group_manager_resource=resource, retry=None, timeout=RPC_TIMEOUT)

            op = self._write("insert_mig", f"projects/{self.project}/regions/{self.region}/instanceGroupManagers/{name}",
                             "compute.instanceGroupManagers.create", insert_regional)
            self._regions[name] = self.region
            return f"{REGION_OP}{self.region}/{op}"
        client = self._client(kind)

        def insert() -> Any:
            if self.kind == "instance":
                return client.insert_unary(project=self.project, zone=self.zone, instance_resource=resource,
                                           retry=None, timeout=RPC_TIMEOUT)
            return client.insert_unary(project=self.project, zone=self.zone,
                                       instance_group_manager_resource=resource, retry=None, timeout=RPC_TIMEOUT)

        return self._write(f"insert_{self.kind}", f"{self._where()}/{kind}/{name}", f"compute.{kind}.create", insert)

    # -- maintenance ------------------------------------------------------------------------
    def perform_maintenance(self, instance: str) -> str:
        """instances.performMaintenance: start the instance's pending maintenance now; the
        operation name. Google refuses it (an ApiError) when none is pending or the machine
        type does not offer it."""
        self._check(instance)
        client = self._client("instances")

        def perform() -> Any:
            return client.perform_maintenance_unary(project=self.project, zone=self.zone, instance=instance,
                                                    retry=None, timeout=RPC_TIMEOUT)

        return self._write("perform_maintenance", f"{self._where()}/instances/{instance}",
                           "compute.instances.performMaintenance", perform)

    def start_instance(self, instance: str) -> str:
        """instances.start: run a stopped (TERMINATED) instance again; the operation name.
        NotFoundError when it is gone."""
        self._check(instance)
        client = self._client("instances")

        def start() -> Any:
            return client.start_unary(project=self.project, zone=self.zone, instance=instance, retry=None,
                                      timeout=RPC_TIMEOUT)

        return self._write("start_instance", f"{self._where()}/instances/{instance}", "compute.instances.start",
                           start, gone=f"no instance {instance} in {self.project}/{self.zone} to start")

    def simulate_maintenance_event(self, instance: str) -> str:
        """instances.simulateMaintenanceEvent on one instance (`tpuwatch drill`); the operation
        name. NotFoundError when the instance is gone."""
        self._check(instance)
        client = self._client("instances")

        def simulate() -> Any:
            return client.simulate_maintenance_event_unary(project=self.project, zone=self.zone, instance=instance,
                                                           retry=None, timeout=RPC_TIMEOUT)

        return self._write("simulate_maintenance_event", f"{self._where()}/instances/{instance}",
                           "compute.instances.simulateMaintenanceEvent", simulate,
                           gone=f"no instance {instance} in {self.project}/{self.zone}")

    def report_host_as_faulty(self, instance: str, body: Mapping[str, Any]) -> str:
        """instances.reportHostAsFaulty with `body` (`faulty_host_body`); the operation name.
        Google refuses it (an ApiError) for a VM it does not take reports for, or not running."""
        self._check(instance)
        from google.cloud import compute_v1

        request = compute_v1.InstancesReportHostAsFaultyRequest.from_json(_json(body), ignore_unknown_fields=False)
        client = self._client("instances")

        def report() -> Any:
            return client.report_host_as_faulty_unary(
                project=self.project, zone=self.zone, instance=instance,
                instances_report_host_as_faulty_request_resource=request, retry=None, timeout=RPC_TIMEOUT)

        return self._write("report_host_as_faulty", f"{self._where()}/instances/{instance}",
                           "compute.instances.reportHostAsFaulty", report)

    def _write(self, method: str, target: str, needs: str, fn: Callable[[], Any], *, gone: str = "") -> str:
        try:
            op = self._call(method, target, needs, fn, read=False, role="roles/compute.instanceAdmin.v1")
        except TpuwatchError as exc:
            if gone and getattr(exc, "code", "") == "NOT_FOUND":
                raise NotFoundError(gone) from None
            raise
        return str(op.name)

    def _check(self, name: str) -> None:
        if not NODE_NAME.match(name):
            raise UsageError(f"{name!r} is not a Compute Engine {self.kind} name (lowercase letters, digits and "
                             "hyphens, starting with a letter)")


# -- flex-start: a MIG whose VMs come through resize requests ([tpu] flex_start) -----------------
# The "operation" of a flex-start create is the resize request itself, named so in the journal.
RESIZE_OP = "resizeRequests/"
# A resize request's state as a queued resource's (model.QR_ENDED marks the ended ones): a
# request that FAILED (its VMs rolled back) or was CANCELLED makes nothing; one that SUCCEEDED
# and whose VMs are all gone again ended with its run duration (Google deletes flex-start VMs
# then), which the policy reads as the service taking the slice back. A CANCELLED request is a
# person's word: not ended to the policy, so a slice missing after it waits for a person.
_RESIZE_STATES = {"CREATING": "CREATING", "ACCEPTED": "WAITING_FOR_RESOURCES", "SUCCEEDED": "ACTIVE",
                  "FAILED": "FAILED", "CANCELLED": "CANCELLED", "DELETING": "DELETING"}


def resize_error(rr: Any) -> tuple[int, str]:
    """(google.rpc code, text) of a resize request's final `status.error` ((0, "") when none):
    ZONE_RESOURCE_POOL_EXHAUSTED is RESOURCE_EXHAUSTED, as for a zone operation."""
    if "status" not in rr or "error" not in rr.status or not rr.status.error.errors:
        return 0, ""
    errors = list(rr.status.error.errors)
    name = _OP_CODES.get(errors[0].code, "UNKNOWN")
    return CODE_NUMBERS[name], "; ".join(f"{e.code}: {e.message}" for e in errors)


def flex_emptied(adapter: ComputeAdapter, mig: Any, managed: Sequence[Any]) -> bool:
    """A flex-start MIG with no managed instance: its run duration ended (or no request made
    any), so the slice is missing, and its resize requests say why. Whether Google lowers the
    target size then is not documented: the absence of instances decides (a request in flight
    has its managed instances CREATING)."""
    return bool(adapter.flex_start) and not managed


def _resizes(adapter: ComputeAdapter, mig: str) -> tuple[Any, dict[str, str], str]:
    """The resize-request client of MIG `mig`, where it is (`zone=` or, for a regional MIG,
    `region=`), and the MIG's path: a regional MIG's requests are the region's
    (`regionInstanceGroupManagerResizeRequests`). The MIG is read first when its scope is not known."""
    if not adapter.scope_known(mig):
        adapter.get_mig(mig)
    if region := adapter.mig_region(mig):
        return (adapter._client("regionInstanceGroupManagerResizeRequests"), {"region": region},
                f"projects/{adapter.project}/regions/{region}/instanceGroupManagers/{mig}")
    return (adapter._client("instanceGroupManagerResizeRequests"), {"zone": adapter.zone},
            f"{adapter._where()}/instanceGroupManagers/{mig}")


def _scoped_op(where: dict[str, str], op: str) -> str:
    """An operation's name as followed: a region's prefixed with `REGION_OP` and the region."""
    return f"{REGION_OP}{where['region']}/{op}" if "region" in where and op else op


def resize_requests(adapter: ComputeAdapter, mig: str) -> list[Any]:
    """The MIG's resize requests, oldest first (one page: a MIG keeps few)."""
    client, where, path = _resizes(adapter, mig)
    resp = adapter._call("list_resize_requests", path, "compute.instanceGroupManagers.get", lambda: client.list(
        project=adapter.project, instance_group_manager=mig, retry=None, timeout=RPC_TIMEOUT, **where), read=True)
    return sorted(resp, key=lambda r: (r.creation_timestamp, r.name))


def resize_status(adapter: ComputeAdapter, mig: str) -> QueuedStatus:
    """The newest resize request of the MIG as a `QueuedStatus` (state "" when it has none)."""
    requests = resize_requests(adapter, mig)
    if not requests:
        return QueuedStatus(name="", state="")
    rr = requests[-1]
    code, text = resize_error(rr)
    state = _RESIZE_STATES.get(str(rr.state), str(rr.state))
    if state == "ACTIVE" and (parts := adapter.mig_parts(mig)) is not None and flex_emptied(adapter, *parts[:2]):
        state, text = "SUSPENDED", "its flex-start VMs were deleted at the end of their run duration"
    if str(rr.state) == "CANCELLED":
        text = text or "the resize request was cancelled"
    return QueuedStatus(name=f"{_resizes(adapter, mig)[2]}/resizeRequests/{rr.name}",
                        state=state, error_code=code, error_message=text, kind="resize_request",
                        since=_time(rr.creation_timestamp))


def is_mig(node: NodeSnapshot) -> bool:
    """Whether the node is a MIG (its instances the workers), not one instance."""
    return node.resource.endswith(f"/instanceGroupManagers/{node.name}")


def resize_in_flight(adapter: ComputeAdapter, mig: str) -> QueuedStatus | None:
    """The MIG's newest resize request still at work (CREATING, or ACCEPTED: waiting for
    capacity), with when it was made; None when none is (`status`)."""
    live = [r for r in resize_requests(adapter, mig) if str(r.state) in ("CREATING", "ACCEPTED")]
    if not live:
        return None
    rr = live[-1]
    return QueuedStatus(name=f"{_resizes(adapter, mig)[2]}/resizeRequests/{rr.name}",
                        state=_RESIZE_STATES[str(rr.state)], kind="resize_request",
                        since=_time(rr.creation_timestamp))


def resize_operation(adapter: ComputeAdapter, op: str) -> OperationStatus:
    """A flex-start create followed as an operation: done once its resize request SUCCEEDED,
    failed with its `status.error` when it FAILED (RESOURCE_EXHAUSTED for a stockout, which the
    policy queues and retries within queue_timeout), CANCELLED as CANCELLED (a person's: the
    create fails, never retried)."""
    mig, name = op[len(RESIZE_OP):].split("/", 1)
    client, where, path = _resizes(adapter, mig)

    def get() -> Any:
        try:
            return client.get(project=adapter.project, instance_group_manager=mig, resize_request=name, retry=None,
                              timeout=RPC_TIMEOUT, **where)
        except gexc.NotFound:
            return None

    rr = adapter._call("get_resize_request", f"{path}/resizeRequests/{name}", "compute.instanceGroupManagers.get",
                       get, read=True)
    if rr is None:
        return OperationStatus(name=op, done=True, error_code=CODE_NUMBERS["NOT_FOUND"],
                               error_message=f"resize request {name} of MIG {mig} is gone")
    state = str(rr.state)
    if state == "FAILED":
        code, text = resize_error(rr)
        return OperationStatus(name=op, done=True, error_code=code or CODE_NUMBERS["UNKNOWN"],
                               error_message=text or "the resize request failed")
    if state == "CANCELLED":
        return OperationStatus(name=op, done=True, error_code=CODE_NUMBERS["CANCELLED"],
                               error_message=f"resize request {name} was cancelled")
    return OperationStatus(name=op, done=state == "SUCCEEDED")


def flex_run(adapter: ComputeAdapter, mig: str) -> str:
    """The `requestedRunDuration` of the MIG's newest resize request that asks for one, as
    [tpu] flex_start ("86400s"), or "" when none does (not a flex-start MIG)."""
    runs = [r for r in resize_requests(adapter, mig) if "requested_run_duration" in r]
    return f"{int(runs[-1].requested_run_duration.seconds)}s" if runs else ""


def insert_resize_request(adapter: ComputeAdapter, mig: str, resize_by: int) -> str:
    """Ask for `resize_by` flex-start VMs for the MIG, to run `adapter.flex_start` seconds; the
    operation name to follow (`RESIZE_OP` + MIG + request name)."""
    from google.cloud import compute_v1

    name = f"{mig[:40]}-tpuwatch-{time.time_ns() // 1_000_000}"  # unique per try, as retries are ms apart at least
    body = compute_v1.InstanceGroupManagerResizeRequest(
        name=name, resize_by=resize_by, requested_run_duration=compute_v1.Duration(seconds=int(adapter.flex_start)))
    client, where, path = _resizes(adapter, mig)

    def insert() -> Any:
        return client.insert_unary(project=adapter.project, instance_group_manager=mig,
                                   instance_group_manager_resize_request_resource=body, retry=None,
                                   timeout=RPC_TIMEOUT, **where)

    adapter._write("insert_resize_request", path, "compute.instanceGroupManagers.update", insert)
    return f"{RESIZE_OP}{mig}/{name}"


def delete_ended_resize_requests(adapter: ComputeAdapter, mig: str) -> str:
    """Delete the MIG's ended resize requests (SUCCEEDED, FAILED, CANCELLED: Google keeps them
    until deleted); the last delete's operation name ("" when none had ended)."""
    client, where, path = _resizes(adapter, mig)
    op = ""
    for rr in resize_requests(adapter, mig):
        if str(rr.state) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            continue

        def delete(rr_name: str = str(rr.name)) -> Any:
            return client.delete_unary(project=adapter.project, instance_group_manager=mig, resize_request=rr_name,
                                       retry=None, timeout=RPC_TIMEOUT, **where)

        try:
            op = adapter._write("delete_resize_request", f"{path}/resizeRequests/{rr.name}",
                                "compute.instanceGroupManagers.update", delete, gone="gone")
        except NotFoundError:
            continue
    return _scoped_op(where, op)


# A full or partial Compute Engine URL, its collection captured: zones/Z/machineTypes/T,
# projects/P/global/instanceTemplates/T, https://compute.googleapis.com/compute/v1/projects/...
_URL = re.compile(r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/[^/]+/)?"
                  r"(?:zones/[^/]+/|regions/[^/]+/|global/)([A-Za-z]+)/[^/]+$")


def _url_fields(kind: str, body: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, value, collection) of the fields an insert takes as a URL only (compute.v1's
    descriptions: "full or partial URL"), present in `body`."""
    out: list[tuple[str, str, str]] = []
    if kind == "instance":
        if body.get("machineType"):
            out.append(("machineType", str(body["machineType"]), "machineTypes"))
        for i, disk in enumerate(body.get("disks") or []):
            params = disk.get("initializeParams") or {}
            if params.get("diskType"):
                out.append((f"disks[{i}].initializeParams.diskType", str(params["diskType"]), "diskTypes"))
            if disk.get("source"):
                out.append((f"disks[{i}].source", str(disk["source"]), "disks"))
    else:
        if body.get("instanceTemplate"):
            out.append(("instanceTemplate", str(body["instanceTemplate"]), "instanceTemplates"))
        policy = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if policy:
            out.append(("resourcePolicies.workloadPolicy", str(policy), "resourcePolicies"))
    return out


def check_insert(kind: str, body: Mapping[str, Any], name: str, zone: str) -> Any:
    """The insert body of instance or MIG `name` as the client's message, or UsageError (naming the
    key and the fix) for one Compute Engine would refuse: a field its API does not have, or a bare
    name where it takes a URL only. A recreate calls it before anything is deleted; the insert again."""
    from google.cloud import compute_v1

    cls = compute_v1.Instance if kind == "instance" else compute_v1.InstanceGroupManager
    again = f"run `tpuwatch init {name} --zone {zone}` to capture it again"
    try:
        resource = cls.from_json(_json({**dict(body), "name": name}), ignore_unknown_fields=False)
    except Exception as exc:  # json_format.ParseError: a field this API does not know, a wrong type
        raise UsageError(f"tpu.compute_spec.{kind}: {exc}; {again}") from None
    for key, value, collection in _url_fields(kind, body):
        m = _URL.match(value)
        if m is None or m.group(1) != collection:
            raise UsageError(f"tpu.compute_spec.{kind}.{key}: {value!r} is not a full or partial URL, which Compute "
                             f"Engine refuses (\"The URL is malformed.\"); it takes e.g. zones/{zone}/{collection}/"
                             f"{value.rsplit('/', 1)[-1]} ({again})")
    return resource


def _json(data: Mapping[str, Any]) -> str:
    import json

    return json.dumps(data)


def to_json(message: Any) -> dict[str, Any]:
    """A Compute Engine message as JSON-like data (camelCase, defaults left out), as saved in
    [tpu.compute_spec]."""
    import json

    data: dict[str, Any] = json.loads(type(message).to_json(message, always_print_fields_with_no_presence=False, indent=0))
    return data


# Fields the API fills in, which an insert must not carry (output only).
_OUTPUT_ONLY = frozenset({
    "id", "kind", "selfLink", "creationTimestamp", "status", "statusMessage", "cpuPlatform", "fingerprint",
    "labelFingerprint", "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp", "resourceStatus",
    "satisfiesPzi", "satisfiesPzs", "startRestricted", "zone", "region", "currentActions", "instanceGroup",
})
_NIC_OUTPUT = frozenset({"networkIP", "fingerprint", "name", "kind", "ipv6AccessConfigs"})


def without_past_termination(body: Mapping[str, Any], now: float) -> Mapping[str, Any]:
    """An instance's insert body without a `scheduling.terminationTime` that has passed: the VM
    it describes was deleted (or stopped) then, and the VM made again in its place gets its run
    from `maxRunDuration`, if any, not a time already gone (an insert with one is refused)."""
    sched = body.get("scheduling")
    ends = _time(str(sched.get("terminationTime") or "")) if isinstance(sched, Mapping) else None
    if not isinstance(sched, Mapping) or ends is None or ends.timestamp() > now:
        return body
    return {**body, "scheduling": {k: v for k, v in sched.items() if k != "terminationTime"}}


def capture_instance(api: ComputeAdapter, inst: Any) -> dict[str, Any]:
    """An instance as the insert body that makes it again: output-only fields dropped, the network
    interfaces without their assigned addresses, and each disk deleted with the instance
    (autoDelete) as `initializeParams` from its disk (image, size, type), since its source disk
    goes with it. A disk that outlives the instance is attached again by its `source`."""
    body = {k: v for k, v in to_json(inst).items() if k not in _OUTPUT_ONLY}
    # Compute Engine takes only a full or partial URL here: the instance's own zone, partial
    body["machineType"] = f"zones/{api.zone}/machineTypes/{short(str(body.get('machineType', '')))}"
    nics = []
    for nic in body.get("networkInterfaces") or []:
        nic = {k: v for k, v in nic.items() if k not in _NIC_OUTPUT}
        nic["accessConfigs"] = [{k: v for k, v in ac.items() if k not in ("natIP", "kind")}
                                for ac in nic.get("accessConfigs") or []]
        nics.append(nic)
    if nics:
        body["networkInterfaces"] = nics
    disks = []
    for disk in body.get("disks") or []:
        kept = {k: v for k, v in disk.items() if k in ("autoDelete", "boot", "deviceName", "mode", "interface",
                                                       "type", "source")}
        if disk.get("autoDelete") and disk.get("source"):
            params = api.disk_params(str(disk["source"]))
            kept.pop("source")
            kept["initializeParams"] = params
        disks.append(kept)
    if disks:
        body["disks"] = disks
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        body["metadata"] = {k: v for k, v in metadata.items() if k in ("items",)}
    return body


def capture_mig(api: ComputeAdapter, mig: Any) -> dict[str, Any]:
    """A MIG as `tpu.compute_spec`: `mig` (its insert body), `template` and `workload_policy` (the
    resources it was made from, as they are now, for a person to make them again if deleted)."""
    out: dict[str, Any] = {"mig": {k: v for k, v in to_json(mig).items() if k not in _OUTPUT_ONLY}}
    template = api.get_template(mig.instance_template) if mig.instance_template else None
    if template is not None:
        out["template"] = {k: v for k, v in to_json(template).items() if k not in _OUTPUT_ONLY}
    policy_url = mig.resource_policies.workload_policy if "resource_policies" in mig else ""
    policy = api.get_resource_policy(policy_url) if policy_url else None
    if policy is not None:
        out["workload_policy"] = {k: v for k, v in to_json(policy).items() if k not in _OUTPUT_ONLY}
    return out
