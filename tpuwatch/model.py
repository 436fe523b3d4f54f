"""Immutable facts tpuwatch observes: node snapshots, audit events, worker probes, checkpoints.

These are plain values shared by the adapters (cloud/, workers/, checkpoints), the pure policy
and the UI. They know nothing of Google client types, SSH or time sources. Enum-like fields
hold the API's enum *names* as strings ("READY", "UNHEALTHY_MAINTENANCE"); a value this
version does not know is kept as "UNKNOWN_ENUM_<n>" rather than crashing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

# Node.State names that mean "the service is working on it; wait up to repair_timeout".
REPAIR_STATES = frozenset({"REPAIRING", "RESTARTING", "UNKNOWN", "REIMAGING", "STARTING", "CREATING"})
# Health values that mean the node is not usable now.
UNHEALTHY = frozenset({"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"})
# States a person caused; tpuwatch leaves the node alone.
PERSON_STATES = frozenset({"STOPPED", "STOPPING", "HIDDEN", "HIDING", "UNHIDING"})
# States from which the node never comes back by itself.
DEAD_STATES = frozenset({"PREEMPTED", "TERMINATED"})


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
    index: int
    internal_ip: str
    external_ip: str

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

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.name}"

    @property
    def usable(self) -> bool:
        """READY and not reported unhealthy: a job may run here."""
        return self.state == "READY" and self.health not in UNHEALTHY


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


@dataclass(frozen=True)
class WorkerProbe:
    """What one worker's job files say right now."""

    worker: int
    state: WorkerState
    attempt: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    detail: str = ""  # e.g. the ssh error for "unreachable"
    log_bytes: int | None = None  # size of the attempt's output log (its activity, for hang detection)
    # JSON: a local job.checkpoint_dir as the first worker sees it (checkpoints.WorkerCheckpoints)
    checkpoint_listing: str = ""


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
    """One environment check on one worker (tpuwatch.precheck): what was measured, against what."""

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
