"""Immutable facts tpuwatch observes: node snapshots, audit events, worker probes, checkpoints.

These are plain values shared by the adapters (cloud/, workers/, checkpoints), the pure policy
and the UI. They know nothing of Google client types, SSH or time sources. Enum-like fields
hold the API's enum *names* as strings ("READY", "UNHEALTHY_MAINTENANCE"); a value this
version does not know is kept as "UNKNOWN_ENUM_<n>" rather than crashing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

# A TPU node (or queued resource) id: lowercase letters, digits and hyphens, starting with a letter.
NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Health values that mean the node is not usable now (NodeSnapshot.usable).
UNHEALTHY = frozenset({"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"})
# The label that marks a node as a job's: tpuwatch deletes a node only when it says that job.
OWNER_LABEL = "tpuwatch-job"
# The labels that say where a node stands between jobs: handed over by priority
# (policy/priority.py) or a spare of a pool (policy/pool.py).
PRIORITY_LABEL = "tpuwatch-priority"
WANTED_BY = "tpuwatch-wanted-by"
WANTED_PRIORITY = "tpuwatch-wanted-priority"
LENT_BY = "tpuwatch-lent-by"  # the lender, owed a node back
RETURNED_BY = "tpuwatch-returned-by"
IDLE_LABEL = "tpuwatch-idle"  # held by a job with a priority that does not train on it: asked for first
POOL_LABEL = "tpuwatch-pool"
# on an idle pool spare whose launch-time checks failed on the job it names: never claimed again
POOL_BAD_LABEL = "tpuwatch-pool-bad"
# They are the state of the node read, never of one made from a spec: `init` keeps none of them,
# and a node made again carries none (a kept tpuwatch-lent-by would read as a loan).
PLACE_LABELS = frozenset({PRIORITY_LABEL, WANTED_BY, WANTED_PRIORITY, LENT_BY, RETURNED_BY, IDLE_LABEL, POOL_LABEL,
                          POOL_BAD_LABEL})


@dataclass(frozen=True)
class Symptom:
    type: str
    worker_id: str
    time: datetime | None
    details: str


@dataclass(frozen=True)
class UpcomingMaintenance:
    type: str  # UNKNOWN_TYPE, SCHEDULED, UNSCHEDULED
    status: str  # UNKNOWN, PENDING, ONGOING
    can_reschedule: bool
    window_start: datetime | None
    window_end: datetime | None
    latest_window_start: datetime | None


@dataclass(frozen=True)
class WorkerEndpoint:
    index: int  # the job's worker number: across every slice of a multislice job
    internal_ip: str
    external_ip: str
    slice: int = 0  # which slice (node) of the job it belongs to
    node: str = ""  # that slice's node name ("": the node itself)
    local: int | None = None  # its worker id within that node (None: `index`)

    @property
    def worker_id(self) -> int:
        """The worker id its own node knows it by (gcloud's --worker, TPU_WORKER_ID)."""
        return self.index if self.local is None else self.local

    def address(self, internal: bool) -> str:
        """The IP to reach this worker by; falls back to the other one when empty."""
        if internal:
            return self.internal_ip or self.external_ip
        return self.external_ip or self.internal_ip


@dataclass(frozen=True)
class NodeSnapshot:
    """One node as the API showed it at one moment."""

    name: str  # short name, e.g. "llm-pod"
    project: str
    zone: str
    id: str  # changes when the node is recreated
    create_time: datetime | None
    state: str
    health: str
    health_description: str
    maintenance_time: datetime | None  # parsed out of health_description when present
    symptoms: tuple[Symptom, ...] = ()
    upcoming_maintenance: UpcomingMaintenance | None = None
    workers: tuple[WorkerEndpoint, ...] = ()
    accelerator_type: str = ""
    topology: str = ""
    runtime_version: str = ""
    spot: bool = False
    preemptible: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    metadata_keys: tuple[str, ...] = ()
    # A multislice job's nodes, in slice order (`combine_slices`); empty for one node
    slices: tuple[NodeSnapshot, ...] = ()
    # A multislice job that limps ([job] min_slices): its slices left out of `slices` (names)
    slices_out: tuple[str, ...] = ()
    # The multislice queued resource that made this node with its other slices (full name; the
    # API's `queued_resource` when `multislice_node`), "" for a node made alone
    multislice_request: str = ""
    # Compute Engine: a running VM (of the MIG) shows resourceStatus.shutdownDetails.stopState
    # PENDING_STOP, a Spot preemption's notice (scheduling.preemptionNoticeDuration): a notice, not a fault
    pending_stop: bool = False
    # Its full name where that is not a TPU API node's: a Compute Engine instance's or MIG's
    resource: str = ""
    # What made it, as the adapter that read it says ("node": a Cloud TPU API node; "instance",
    # "mig": Compute Engine's): commands show it, and the registry (cloud/apis.py) finds its API by it
    kind: str = "node"
    # A Compute Engine MIG's own repair, facts for the policy: whether it recreates a failed VM
    # by itself (`instanceLifecyclePolicy.defaultActionOnFailure` REPAIR, the default), and what
    # it is doing now ("" when no instance of it has a current action)
    repairs_itself: bool = False
    repair_under_way: str = ""
    # ... and whether that repair shows only as the MIG not stable yet, every VM running and none
    # with an action: the end of a repair, read across calls; waited for up to repair_timeout
    repair_settling: bool = False
    # A Compute Engine MIG's target size: how many VMs the slice has when whole (a spare MIG of
    # another size is of another shape, whatever its machine type)
    target_size: int = 0
    # Its VMs' metadata starts the job at boot (startup-scripts/resume-training.sh: the job, its
    # command and worker script, and no tpuwatch-launch = "false"): an idle spare would run it alone
    boots_job: bool = False
    # Google's own stops of a VM made through Compute Engine (cloud/compute/view.py). `google_deletes`:
    # Google deletes it itself, at a preemption or at the end of its run (termination action DELETE
    # on a Spot or flex-start VM, or one with a run duration or termination time), and
    # `google_deletes_at` when that run ends; `google_deleting`: what shows Google deleting it now
    # ("" nothing); `auto_restart`: Compute Engine restarts it after a stop of its own
    # (scheduling.automaticRestart, off for Spot).
    google_deletes: bool = False
    google_deletes_at: datetime | None = None
    google_deleting: str = ""
    auto_restart: bool = True
    # A Compute Engine VM still stopping (STOPPING, DEPROVISIONING): whose stop it is shows where it
    # ends, TERMINATED (a Spot preemption) or gone (a person's instances.delete)
    stopping: bool = False
    # A Compute Engine MIG's VMs' states in worker order (the policy's words, as `state`): the MIG
    # reads as its worst VM, while the VMs of it still RUNNING can be reached (a stop of what runs
    # there, an attempt the MIG's lost VM ended); empty for a node whose workers share its state
    worker_states: tuple[str, ...] = ()

    @property
    def full_name(self) -> str:
        return self.resource or f"projects/{self.project}/locations/{self.zone}/nodes/{self.name}"

    @property
    def usable(self) -> bool:
        """READY and not reported unhealthy: a job may run here."""
        return self.state == "READY" and self.health not in UNHEALTHY

    @property
    def multislice(self) -> bool:
        """Several slices that join over the data-center network (the slices a job limps without
        count): not one node, whether its own or a spare in its place (a pool of one slot)."""
        return len(self.slices) + len(self.slices_out) > 1

    @property
    def reachable(self) -> bool:
        """Some of its workers can be reached: it is READY, or one of its slices or VMs is."""
        return self.state == "READY" or "READY" in self.worker_states or any(s.reachable for s in self.slices)

    def worker_up(self, worker: int) -> bool:
        """Its worker `worker` (the id this node knows it by) can be reached: the node is READY, or
        that worker's VM is (a MIG one VM of which is lost)."""
        if self.state == "READY":
            return True
        return 0 <= worker < len(self.worker_states) and self.worker_states[worker] == "READY"

    def slice_of(self, worker: WorkerEndpoint) -> NodeSnapshot:
        """The node `worker` runs on: its slice, or this node."""
        if self.slices and 0 <= worker.slice < len(self.slices):
            return self.slices[worker.slice]
        return self

    @property
    def reachable_workers(self) -> tuple[WorkerEndpoint, ...]:
        """The workers on READY nodes (all of them for one READY node) or on a MIG's RUNNING VMs."""
        if not self.slices:
            return tuple(w for w in self.workers if self.worker_up(w.worker_id))
        return tuple(w for w in self.workers if self.slice_of(w).worker_up(w.worker_id))

    @property
    def owner(self) -> str | None:
        """The value of the ownership label, or None."""
        value = self.labels.get(OWNER_LABEL)
        return None if value is None else str(value)

    def owned_by(self, job: str) -> bool:
        """True only when the ownership label equals `job` exactly (`myjob-2` is not `myjob`'s)."""
        return bool(job) and self.owner == job


def megascale_from_runtime(node: NodeSnapshot) -> bool:
    """Whether the TPU runtime tells a multislice job's workers how to join the slices itself:
    slices made together by one multislice queued resource get MEGASCALE_COORDINATOR_ADDRESS,
    MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID in their `tpu-env` metadata (JAX and libtpu
    read it; an environment variable overrides it). Slices created one by one get none."""
    if node.slices_out:  # tpu-env counts every slice of the request: wrong for the ones left
        return False
    requests = {s.multislice_request for s in node.slices}
    return len(requests) == 1 and "" not in requests


def megascale_note(node: NodeSnapshot) -> str:
    """Where a multislice job's MEGASCALE_* come from, said in its launch event; "" for one node."""
    if not node.multislice:
        return ""
    if node.slices_out:
        return (f"MEGASCALE_* set by tpuwatch for the {len(node.slices)} slices the job limps on "
                f"({', '.join(node.slices_out)} left out)")
    if megascale_from_runtime(node):
        return "MEGASCALE_* from the TPU runtime's tpu-env (one multislice queued resource)"
    return "MEGASCALE_* set by tpuwatch in tpu.names order (slices created one by one)"


# The order a multislice job shows the worst of its slices' states in: going away first, READY last.
_STATE_RANK = ("PREEMPTED", "TERMINATED", "DELETING", "HIDING", "HIDDEN", "STOPPING", "STOPPED", "REPAIRING",
               "RESTARTING", "REIMAGING", "STARTING", "CREATING", "UNHIDING", "UNKNOWN")


def combine_slices(name: str, nodes: Sequence[NodeSnapshot | None]) -> NodeSnapshot | None:
    """The nodes of a multislice job as one node the policy can judge: READY and HEALTHY only
    when every slice is, its id changing whenever any slice's does, its workers every slice's
    workers numbered on in slice order. None while every slice is missing; a slice that is
    missing while others exist shows as state MISSING (the job cannot run without it)."""
    present = [n for n in nodes if n is not None]
    if not present:
        return None
    first = present[0]
    missing = [i for i, n in enumerate(nodes) if n is None]
    states = [n.state for n in present]
    state = "MISSING" if missing else next(
        (s for s in _STATE_RANK if s in states), next((s for s in states if s != "READY"), "READY"))
    unhealthy = [n for n in present if n.health in UNHEALTHY]
    health = unhealthy[0].health if unhealthy else next((n.health for n in present if n.health), "")
    described = "; ".join(f"{n.name}: {n.health_description}" for n in present if n.health_description)
    if missing:
        described = "; ".join([f"slice {i} missing" for i in missing] + ([described] if described else []))
    workers: list[WorkerEndpoint] = []
    slices: list[NodeSnapshot] = []
    for i, n in enumerate(nodes):
        part = n if n is not None else NodeSnapshot(name="", project=first.project, zone=first.zone, id="",
                                                    create_time=None, state="MISSING", health="",
                                                    health_description="", maintenance_time=None)
        slices.append(part)
        for w in sorted(part.workers, key=lambda w: w.index):
            workers.append(WorkerEndpoint(len(workers), w.internal_ip, w.external_ip, slice=i, node=part.name,
                                          local=w.index))
    times = [n.maintenance_time for n in present if n.maintenance_time is not None]
    notices = [n.upcoming_maintenance for n in present if n.upcoming_maintenance is not None]
    owners = {n.owner for n in present}
    labels = dict(first.labels)
    if len(owners) != 1:  # owned only when every slice says the same job
        labels.pop(OWNER_LABEL, None)
    view = NodeSnapshot(
        name=name, project=first.project, zone=first.zone,
        id="+".join(n.id if n is not None else "-" for n in nodes),
        create_time=max((n.create_time for n in present if n.create_time is not None), default=None),
        state=state, health=health, health_description=described,
        maintenance_time=max(times) if times else None,
        symptoms=tuple(s for n in present for s in n.symptoms),
        upcoming_maintenance=min(notices, key=_window_key) if notices else None,
        workers=tuple(workers), accelerator_type=first.accelerator_type, topology=first.topology,
        runtime_version=first.runtime_version, spot=any(n.spot for n in present),
        preemptible=any(n.preemptible for n in present), labels=labels, metadata_keys=first.metadata_keys,
        slices=tuple(slices), kind=first.kind,
    )
    if len(nodes) == 1:  # a pool of one slot is watched through the node it runs on: a Compute Engine
        # instance's own facts (its URL, Google's stops and deletions of it) are the job's
        view = replace(view, resource=first.resource, pending_stop=first.pending_stop,
                       google_deletes=first.google_deletes, google_deletes_at=first.google_deletes_at,
                       google_deleting=first.google_deleting, auto_restart=first.auto_restart,
                       repairs_itself=first.repairs_itself, repair_under_way=first.repair_under_way,
                       repair_settling=first.repair_settling)
    return view


def job_node(get_node: Callable[[str], NodeSnapshot | None], name: str,
             slices: Sequence[str] = ()) -> NodeSnapshot | None:
    """The job's node as the tick sees it: node `name`, or a multislice job's `slices` combined."""
    if not slices:
        return get_node(name)
    return combine_slices(name, [get_node(s) for s in slices])


def bound_view(name: str, slices: Sequence[str], read: Mapping[str, NodeSnapshot | None], out: Sequence[str],
               swapped: Mapping[str, str] | None = None) -> tuple[NodeSnapshot | None, tuple[NodeSnapshot | None, ...]]:
    """A multislice job's node as it runs now, and its slices left out: each slot of `slices`
    (tpu.names) read from `read` under the node it runs on (`swapped`: slot -> a spare in its
    place, which keeps the slot's slice id), combined without the slots named in `out` (a job
    that limps), which come second, in `out`'s order."""
    on = swapped or {}
    view = combine_slices(name, [read.get(on.get(s, s)) for s in slices if s not in out])
    if view is not None and out:
        view = replace(view, slices_out=tuple(out))
    return view, tuple(read.get(on.get(s, s)) for s in out)


def _window_key(up: UpcomingMaintenance) -> float:
    return up.window_start.timestamp() if up.window_start is not None else float("inf")


AuditKind = Literal["terminate", "restart", "upcoming_maintenance", "other"]


@dataclass(frozen=True)
class AuditEvent:
    """One system-event audit log entry about a TPU node."""

    time: datetime
    kind: AuditKind
    node: str  # short node name
    worker: str | None  # worker id when the resource name says so
    method: str  # protoPayload.methodName
    reason: str  # protoPayload.metadata.terminateReason, opaque text ("" when absent)
    insert_id: str
    resource_name: str


WorkerState = Literal["running", "exited", "absent", "unreachable"]


# The notices the relay beside an attempt passes on (instance/maintenance-event, instance/preempted,
# instance/upcoming-maintenance turning ONGOING).
NOTICES = ("TERMINATE_ON_HOST_MAINTENANCE", "PREEMPTED", "MAINTENANCE_ONGOING")


@dataclass(frozen=True)
class WorkerProbe:
    """What one worker's job files say right now."""

    worker: int
    state: WorkerState
    attempt: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    detail: str = ""  # e.g. the ssh error for "unreachable"
    # "exited", but processes of the attempt live on (they hold its lock, or are in its session)
    lingering: bool = False
    log_bytes: int | None = None  # size of the attempt's output log (its activity, for hang detection)
    # seconds since the attempt's log was last written, measured on the worker (no clock skew)
    log_age: float | None = None
    # the first line of the attempt's log matching a known runtime signature (policy/signatures.py)
    log_match: str = ""
    login_refused: bool = False  # "unreachable" because ssh's login was refused (Permission denied)
    # JSON: a local job.checkpoint_dir as the first worker sees it (checkpoints.WorkerCheckpoints)
    checkpoint_listing: str = ""
    # what the relay beside this attempt passed on from the metadata server: a NOTICES value, or ""
    notice: str = ""
    # the attempt's session got a SIGTERM that neither tpuwatch's stop nor the relay sent (the
    # guest shutting down before the notice): its exit code, 0 included, may not be the job's own
    foreign_term: bool = False


@dataclass(frozen=True)
class Checkpoint:
    """The newest complete checkpoint found under the job's checkpoint_dir."""

    path: str
    step: int
    layout: str  # orbax, flax, t5x, levanter, pytorch_xla
    time: datetime | None = None  # when it was written, when the store says


@dataclass(frozen=True)
class OperationStatus:
    """A long-running cloud operation as last seen."""

    name: str
    done: bool
    error_code: int = 0  # google.rpc.Code; 0 = OK
    error_message: str = ""
    started: datetime | None = None  # when tpuwatch started it (from the journal), when known


CheckVerdict = Literal["pass", "fail", "warn", "skip"]


@dataclass(frozen=True)
class CheckItem:
    """One environment check on one worker (tpuwatch.workers.precheck): what was measured, against what."""

    check: str  # disk, shm, cache, ulimit, dns, devices, device_holders, libtpu_lock, interpreter, custom:<name>
    worker: int
    verdict: CheckVerdict
    value: str = ""  # the measured value, for people ("12.3 GB free")
    threshold: str = ""  # what passes ("> 32 GB free")
    detail: str = ""
    fixable: bool = False  # tpuwatch can fix it itself (stop orphan holders, remove a stale lockfile)

    def as_dict(self) -> dict[str, object]:
        return {"check": self.check, "worker": self.worker, "verdict": self.verdict, "value": self.value,
                "threshold": self.threshold, "detail": self.detail, "fixable": self.fixable}

    def line(self) -> str:
        """`w2 devices: 3 found, need >= 4 (missing /dev/accel3)`, one line for people."""
        text = f"w{self.worker} {self.check}: {self.value or self.verdict}"
        if self.threshold:
            text += f", need {self.threshold}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class PrecheckReport:
    """The environment checks of one round trip to the workers of a node."""

    time: datetime
    context: Literal["launch", "running"]  # before a launch, or periodic while the job runs
    node_id: str
    items: tuple[CheckItem, ...] = ()
    unreachable: tuple[tuple[int, str], ...] = ()  # (worker, why) for workers that did not answer

    @property
    def failing(self) -> tuple[CheckItem, ...]:
        return tuple(i for i in self.items if i.verdict == "fail")

    @property
    def warnings(self) -> tuple[CheckItem, ...]:
        return tuple(i for i in self.items if i.verdict == "warn")

    @property
    def ok(self) -> bool:
        """Every worker answered and no check failed."""
        return not self.failing and not self.unreachable

    @property
    def fixable(self) -> bool:
        """Something failed, and tpuwatch can fix every failing item itself."""
        failing = self.failing
        return bool(failing) and all(i.fixable for i in failing)


# -- what the workers answered to a launch or a stop ------------------------------------------

OWN_SCAN = ("other users' TPU device holders not seen: the login user is not root and `sudo -n` is "
            "not allowed (give it passwordless sudo to see and stop them)")
LaunchOutcome = Literal["launched", "running", "ran", "busy", "newer", "error", "unreachable"]


@dataclass(frozen=True)
class StopResult:
    """What one worker's stop did: processes stopped, device holders, the libtpu lockfile."""

    worker: int
    ok: bool
    stopped: tuple[int, ...] = ()
    device_holders: tuple[int, ...] = ()
    libtpu_lockfile: str = "absent"  # absent, removed, held by PIDS, stale, cannot remove
    leftover: tuple[int, ...] = ()
    detail: str = ""
    unreachable: bool = False
    # how device holders were found: root, sudo (sudo -n), own (other users' processes unseen)
    device_scan: str = ""
    killed: tuple[int, ...] = ()  # ignored SIGTERM for the whole grace: KILLed
    stopping: tuple[int, ...] = ()  # a stop not waited for: still alive, KILLed after the grace
    grace: float = 0.0  # seconds from TERM to KILL

    def describe(self) -> str:
        if self.unreachable:
            return f"worker {self.worker}: unreachable ({self.detail})"
        bits = []
        if self.stopping:
            bits.append(f"{len(self.stopping)} of {len(self.stopped)} job process(es) still running after "
                        f"SIGTERM: killed after {self.grace:g}s unless they exit")
        elif self.killed:
            bits.append(f"{len(self.killed)} of {len(self.stopped)} job process(es) ignored SIGTERM for "
                        f"{self.grace:g}s: killed")
        elif self.stopped:
            bits.append(f"stopped {len(self.stopped)} job process(es)")
        if self.device_holders:
            bits.append("stopped TPU device holder(s) " + " ".join(map(str, self.device_holders)))
        if self.libtpu_lockfile not in ("absent", ""):
            bits.append(f"libtpu lockfile {self.libtpu_lockfile}")
        if self.leftover:
            bits.append("still alive after KILL: " + " ".join(map(str, self.leftover)))
        if self.device_scan == "own":
            bits.append(OWN_SCAN)
        if self.detail:
            bits.append(self.detail)
        return f"worker {self.worker}: " + ("; ".join(bits) or "nothing to stop")


@dataclass(frozen=True)
class LaunchResult:
    """What one worker did with a launch request.

    launched: started now. running: this very attempt already runs (an earlier try got
    through). ran: this attempt already ran and ended. busy: another attempt's processes hold
    the lock. newer: a newer attempt was launched here. error / unreachable: see detail.
    """

    worker: int
    outcome: LaunchOutcome
    attempt: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    detail: str = ""
    cleanup: StopResult | None = None  # what the launch's own cleanup did (clean_grace), if it ran

    @property
    def started(self) -> bool:
        """The attempt runs on this worker now (launched by this call or by an earlier try)."""
        return self.outcome in ("launched", "running")

    def describe(self) -> str:
        what = {
            "launched": f"launched attempt {self.attempt} (pid {self.pid})",
            "running": f"attempt {self.attempt} already running (pid {self.pid}), not started again",
            "ran": f"attempt {self.attempt} already ran (exit code {self.exit_code}), not started again",
            "busy": f"refused: attempt {self.attempt} still holds the job lock",
            "newer": f"refused: a newer attempt {self.attempt} was launched here",
            "error": "failed",
            "unreachable": "unreachable",
        }[self.outcome]
        return f"worker {self.worker}: {what}" + (f" ({self.detail})" if self.detail else "")


# -- queued resources ---------------------------------------------------------------------------

# QueuedResourceState names after which the request never makes (or keeps) its node: the service
# gave up on it (FAILED), or deleted its node ("initiated by the user, or the Cloud TPU service",
# e.g. a spot preemption: SUSPENDING, then SUSPENDED).
QR_ENDED = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})


# What stands in line for the capacity: a Cloud TPU queued resource, or a Compute Engine MIG's
# flex-start resize request
QueuedKind = Literal["queued_resource", "resize_request"]


@dataclass(frozen=True)
class QueuedStatus:
    """A queued resource as last seen, or the flex-start resize request of a MIG that stands for
    one on Compute Engine (its state in the queued resource's words)."""

    name: str  # full name
    state: str  # QueuedResourceState.State name; "" when it does not exist
    error_code: int = 0  # google.rpc.Code of a FAILED request
    error_message: str = ""
    node_count: int = 0  # a multislice request's number of nodes (slices); 0 for one node
    kind: QueuedKind = "queued_resource"
    since: datetime | None = None  # when the request was made, when known

    @property
    def ended(self) -> bool:
        return self.state in QR_ENDED


# -- who the watcher is on the workers ----------------------------------------------------------

LOGIN_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")  # a POSIX login name, as OS Login makes them


@dataclass(frozen=True)
class Login:
    """Who the watcher is on a node incarnation, learned over SSH."""

    node_id: str
    user: str
    home: str = ""
    via: str = "gcloud"

    def as_dict(self) -> dict[str, str]:
        return {"node_id": self.node_id, "user": self.user, "home": self.home, "via": self.via}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Login | None:
        user, node_id = str(data.get("user") or ""), str(data.get("node_id") or "")
        if not user or not LOGIN_USER.fullmatch(user):
            return None
        return cls(node_id, user, str(data.get("home") or ""), str(data.get("via") or "gcloud"))
