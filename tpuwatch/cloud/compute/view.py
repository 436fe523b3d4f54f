"""What a TPU slice made through Compute Engine reads as to the policy: its instances, or its MIG
with the managed instances and their instances, mapped to one `NodeSnapshot`. Pure functions of
`compute_v1` messages (no request); the adapter (cloud/compute/adapter.py) reads, these map.

The job's slice ([tpu] instance or [tpu] mig) is shown to the tick and
the policy as one `NodeSnapshot`, in the policy's vocabulary (policy/nodes.py):

- `id` is its instances' ids, joined in worker order: it changes when any of them is recreated
  (a new incarnation, as a recreated TPU node's id does).
- `state` (`instance_state`, `mig_state`): RUNNING is READY; Google at work (an instance
  PROVISIONING, STAGING or REPAIRING after a host error, a MIG instance with a current action,
  or a MIG short of its target size or not stable) is a repair state, waited for with
  repair_timeout; a stopped Spot VM is PREEMPTED (Google: a Spot TPU VM is deleted and
  recreated, never restarted), a lone one with `stopping` while its stop is under way (a
  preemption's ends TERMINATED, a person's instances.delete gone: policy row `spot_stopping`); another stopped VM is STOPPED (a person's: left alone), and a MIG
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
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from tpuwatch.cloud import clients
from tpuwatch.cloud.base import parse_rfc3339
from tpuwatch.cloud.errors import CODE_NUMBERS
from tpuwatch.model import (
    OWNER_LABEL,
    NodeSnapshot,
    OperationStatus,
    UpcomingMaintenance,
    WorkerEndpoint,
)

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
# a stop still under way: a preemption's ends TERMINATED, a person's instances.delete gone
_STOPPING = frozenset({"STOPPING", "DEPROVISIONING"})
# The worst state first when a MIG's instances differ (as model.combine_slices ranks slices). A
# person's stop (STOPPING, STOPPED) is not among them: a MIG reads so only when every instance is
# stopped, since a person stops a slice as a whole and Google's own stops come one VM at a time.
_RANK = ("PREEMPTED", "REPAIRING", "STARTING", "CREATING")
_PERSON = ("STOPPING", "STOPPED")
# A managed instance's current actions while the MIG makes it (again)
MAKING = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING"})
NOT_STABLE = "MIG not stable"  # status.isStable false with no action under way (mig_state)
# google.rpc codes of a zone operation's error, by the Compute Engine error code it carries
OP_CODES: dict[str, str] = {
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


def time_of(text: str) -> datetime | None:
    """An RFC 3339 time of a Compute Engine message, or None when empty."""
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
    ends = time_of(sched.termination_time) if sched.termination_time else None
    if ends is None and "max_run_duration" in sched and inst.last_start_timestamp:
        started = time_of(inst.last_start_timestamp)
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
        can_reschedule=bool(um.can_reschedule), window_start=time_of(um.window_start_time),
        window_end=time_of(um.window_end_time), latest_window_start=time_of(um.latest_window_start_time),
    )


# The metadata resume-training.sh starts the job at boot with, and what makes it only set up
_BOOT_LAUNCH = ("tpuwatch-job", "tpuwatch-command", "tpuwatch-worker-script")
_SET_UP_ONLY = (("tpuwatch-launch", "false"), ("tpuwatch-env-withheld", "true"), ("tpuwatch-command-withheld", "true"))


def boots_job(inst: Any) -> bool:
    """The instance's startup script starts the job at boot: its metadata holds what it launches
    and nothing that says set up only (startup-scripts/resume-training.sh)."""
    meta = {item.key: item.value for item in inst.metadata.items}
    return all(meta.get(k) for k in _BOOT_LAUNCH) and not any(meta.get(k) == v for k, v in _SET_UP_ONLY)


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
        create_time=time_of(inst.creation_timestamp), state=state, health=_health([notice]),
        health_description=inst.status_message, maintenance_time=None, upcoming_maintenance=notice,
        workers=(_endpoint(0, inst),), accelerator_type=short(inst.machine_type), spot=spot(inst),
        preemptible=bool(inst.scheduling.preemptible), labels=dict(inst.labels),
        metadata_keys=tuple(sorted(item.key for item in inst.metadata.items)),
        resource=f"projects/{project}/zones/{zone}/instances/{inst.name}", kind="instance", pending_stop=pending_stop(inst),
        google_deletes=deletes, google_deletes_at=ends, google_deleting=deleting, auto_restart=auto_restart(inst),
        stopping=str(inst.status) in _STOPPING,
        boots_job=boots_job(inst),
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


def settling(doing: str, instances: Sequence[Any]) -> str:
    """A MIG not stable though its instances all run and none has an action under way: the end
    of its own repair, read across three calls (the MIG's status before its last instance came
    up, the instances after). Under way, as an action is: never recreated in its place."""
    if doing == NOT_STABLE and instances and all(instance_state(i) == "READY" for i in instances):
        return f"{NOT_STABLE}, every instance running: the MIG settling"
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
        return "REPAIRING", NOT_STABLE
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
    ending = settling(doing, ordered)  # only with no action under way (mig_state's NOT_STABLE)
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
    times = [t for t in (time_of(i.creation_timestamp) for i in ordered) if t is not None]
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
        kind="mig",
        repairs_itself=repairs_itself(mig), repair_under_way=mig_acting(mig, managed) or ending,
        repair_settling=bool(ending),
        pending_stop=any(pending_stop(i) for i in ordered), target_size=int(mig.target_size),
        boots_job=any(boots_job(i) for i in ordered), worker_states=tuple(instance_state(i) for i in ordered),
    )


def at_rest(mig: Any, listed: Iterable[Any], zone: str) -> list[Any] | None:
    """The managed instances of a MIG at rest, without listManagedInstances: when the MIG says it
    is stable, every instance of its target size is doing nothing (`currentActions.none`) and
    that many instances it made (their `created-by` metadata names it) are RUNNING, each is one
    of them, doing nothing. None otherwise: then only listManagedInstances says which instance
    does what, and why (and an instance that went down since the MIG was read is never taken
    for one at rest)."""
    compute_v1 = clients.compute_v1()

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
        name = OP_CODES.get(first.code) or _HTTP_CODES.get(int(op.http_error_status_code or 0), "UNKNOWN")
        code, message = CODE_NUMBERS[name], "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
    return OperationStatus(name=op.name, done=done, error_code=code, error_message=message)
