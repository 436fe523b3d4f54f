"""The simulated Compute Engine's records: instances, zone/region/global operations, instance
templates, resource policies, managed instance groups and their resize requests.

Plain data, with no lock and no behaviour, like `records.py`: the World owns them under its one
lock, and `compute_rest.py` renders them as Compute Engine's JSON. Names and values follow the
compute v1 API (`Instance.status` PROVISIONING ... TERMINATED, `Scheduling.provisioningModel`
STANDARD / SPOT / FLEX_START / RESERVATION_BOUND, `ManagedInstance.currentAction`, ...).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tpuwatch.sim.records import UpcomingRec

INSTANCE_STATUSES = (
    "PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED",
    "REPAIRING", "TERMINATED", "DEPROVISIONING",
)
PROVISIONING_MODELS = ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")
# How many chips each TPU machine type puts on one VM (the `-<n>t` suffix).
MACHINE_TYPE = re.compile(r"^(tpu7x-standard|ct6e-standard|ct5p-hightpu|ct5lp-hightpu|ct4p-hightpu)-(\d+)t$")
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# A custom Instance.hostname: RFC1035 labels, two or more, 253 characters at most
HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z]([-a-z0-9]{0,61}[a-z0-9])?)+$")


def chips_of(machine_type: str) -> int:
    """Chips on one VM of this TPU machine type; ValueError when it is not a TPU machine type."""
    m = MACHINE_TYPE.match(machine_type.rsplit("/", 1)[-1])
    if m is None:
        raise ValueError(
            f"machine type {machine_type!r} is not a TPU machine type such as tpu7x-standard-4t, "
            "ct6e-standard-4t or ct5p-hightpu-4t"
        )
    return int(m.group(2))


def topology_chips(topology: str) -> int:
    """Chips in an accelerator topology such as 2x2x4; ValueError when it is not one."""
    if not re.match(r"^\d+(x\d+){1,2}$", topology or ""):
        raise ValueError(f"accelerator topology {topology!r} is not of the form AxB or AxBxC, e.g. 2x2x4")
    total = 1
    for part in topology.split("x"):
        total *= int(part)
    return total


def fingerprint(value: Any) -> str:
    """A fingerprint as Compute Engine gives one: base64 of a hash of the value (8 bytes)."""
    data = json.dumps(value, sort_keys=True).encode()
    return base64.b64encode(hashlib.sha256(data).digest()[:8]).decode()


def compute_time(ns: int) -> str:
    """`2024-05-01T10:20:30.123+00:00`: RFC 3339 with milliseconds and an offset, as Compute
    Engine writes creationTimestamp and an operation's times."""
    secs, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{rest // 1_000_000:03d}+00:00"


@dataclass
class InstanceRec:
    project: str
    zone: str
    name: str
    id: int
    create_ns: int
    machine_type: str  # short name, e.g. tpu7x-standard-4t
    status: str = "PROVISIONING"
    status_message: str = ""
    provisioning_model: str = "STANDARD"
    termination_action: str = ""  # STOP / DELETE ("" unset)
    automatic_restart: bool = True
    on_host_maintenance: str = "TERMINATE"
    max_run_duration: float | None = None  # seconds (scheduling.maxRunDuration)
    # seconds (scheduling.preemptionNoticeDuration, Spot only): instance/preempted TRUE and
    # resourceStatus.shutdownDetails PENDING_STOP that long before a preemption's soft off
    preemption_notice: float | None = None
    pending_stop_ns: int = 0  # when a preemption's notice began (shutdownDetails PENDING_STOP); 0 none
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str = ""
    hostname: str = ""  # a custom hostname (Instance.hostname); "" for the default, which the API does not show
    image: str = ""  # the boot disk's source image (the runtime's role on Compute Engine)
    resource_policies: list[str] = field(default_factory=list)
    ip: str = ""
    nat_ip: str = ""
    upcoming: UpcomingRec | None = None
    maintenance_event: str = "NONE"  # the metadata server's instance/maintenance-event
    preempt_notice: bool = False  # instance/preempted TRUE ahead of a preemption
    preempted: bool = False  # stopped by a Spot preemption (start is refused)
    # What instance/upcoming-maintenance says with nothing scheduled: "error" (the error JSON),
    # "empty" ({}) or "none" (NONE); Google's docs and users show all three.
    no_notice: str = "error"
    mig: str = ""  # key of the MIG that made it ("" a standalone instance)
    faulty_reported: bool = False
    # resourceStatus.shutdownDetails while Google stops or deletes it: (stopState, targetState,
    # requestTimestamp in ns); None otherwise
    shutdown: tuple[str, str, int] | None = None
    termination_time: str = ""  # scheduling.terminationTime (RFC 3339): the termination action runs then
    last_start_ns: int = 0
    last_stop_ns: int = 0
    epoch: int = 0  # bumped by every lifecycle change and fault; stale timers check it

    @property
    def key(self) -> str:
        """The World's key and the simulated host's key: "project/zone/instances/name"."""
        return f"{self.project}/{self.zone}/instances/{self.name}"

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    @property
    def chips(self) -> int:
        return chips_of(self.machine_type)

    @property
    def label_fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def metadata_fingerprint(self) -> str:
        return fingerprint(self.metadata)


@dataclass
class ComputeOpRec:
    """A Compute Engine operation (zonal, regional or global, by `scope`)."""

    name: str
    id: int
    project: str
    scope: str  # "zones/Z", "regions/R" or "global"
    op_type: str  # insert, delete, start, stop, setLabels, compute.instances.hostError, ...
    target: str  # the target's path, projects/P/zones/Z/instances/I
    target_id: int
    insert_ns: int
    status: str = "RUNNING"  # PENDING / RUNNING / DONE
    end_ns: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (code, message)
    http_status: int = 0  # httpErrorStatusCode when it failed
    http_message: str = ""
    user: str = "tpuwatch-sim@example.com"
    status_message: str = ""

    @property
    def key(self) -> str:
        return f"{self.project}/{self.scope}/{self.name}"

    @property
    def done(self) -> bool:
        return self.status == "DONE"


@dataclass
class TemplateRec:
    project: str
    region: str  # "" for a global template
    name: str
    id: int
    create_ns: int
    properties: dict[str, Any]  # InstanceProperties as JSON, kept as given

    @property
    def path(self) -> str:
        where = f"regions/{self.region}" if self.region else "global"
        return f"projects/{self.project}/{where}/instanceTemplates/{self.name}"


@dataclass
class PolicyRec:
    project: str
    region: str
    name: str
    id: int
    create_ns: int
    body: dict[str, Any]  # the ResourcePolicy as JSON, kept as given

    @property
    def path(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.name}"

    @property
    def topology(self) -> str:
        return str((self.body.get("workloadPolicy") or {}).get("acceleratorTopology") or "")


@dataclass
class ManagedRec:
    """One instance a MIG manages, as listManagedInstances shows it."""

    name: str
    current_action: str = "CREATING"
    errors: list[tuple[str, str]] = field(default_factory=list)  # lastAttempt.errors (code, message)


@dataclass
class MigRec:
    project: str
    zone: str
    name: str
    id: int
    create_ns: int
    base_instance_name: str
    template: str  # the template's path
    target_size: int
    workload_policy: str = ""  # the resource policy's path
    topology: str = ""  # its acceleratorTopology: a multi-host slice, made and repaired as a whole
    default_action_on_failure: str = "REPAIR"
    description: str = ""
    members: dict[str, ManagedRec] = field(default_factory=dict)  # instance name -> managed record
    # A regional MIG (regionInstanceGroupManagers): its region; `zone` is then the one zone it
    # makes its instances in (a TPU slice's VMs are in one zone: distribution shape ANY_SINGLE_ZONE)
    region: str = ""
    epoch: int = 0
    # Shape (not documented by Google, off by default): each instance made carries an
    # `agent-worker-number` metadata item, numbering the members in name order ("name") or in
    # reverse name order ("reverse"), as a TPU VM of the TPU API carries its worker number.
    worker_numbers: str = ""

    @property
    def scope(self) -> str:
        """Where the MIG is: `zones/Z`, or `regions/R` for a regional MIG."""
        return f"regions/{self.region}" if self.region else f"zones/{self.zone}"

    @property
    def key(self) -> str:
        return f"{self.project}/{self.region and 'regions/' + self.region or self.zone}/instanceGroupManagers/{self.name}"

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/instanceGroupManagers/{self.name}"

    @property
    def multi_host(self) -> bool:
        return bool(self.topology)


@dataclass
class ResizeRec:
    project: str
    zone: str
    mig: str  # the MIG's name
    name: str
    id: int
    create_ns: int
    resize_by: int
    run_duration: float | None = None  # requestedRunDuration in seconds
    state: str = "CREATING"  # CREATING / ACCEPTED / SUCCEEDED / FAILED / CANCELLED / DELETING
    error: list[tuple[str, str]] = field(default_factory=list)  # status.error.errors (final)
    last_attempt: list[tuple[str, str]] = field(default_factory=list)  # status.lastAttempt (transient)
    instances: list[str] = field(default_factory=list)  # the instances it made
    description: str = ""

    @property
    def key(self) -> str:
        return f"{self.project}/{self.zone}/{self.mig}/{self.name}"

    @property
    def path(self) -> str:
        # `zone` is `regions/R` for a regional MIG's request
        scope = self.zone if self.zone.startswith("regions/") else f"zones/{self.zone}"
        return f"projects/{self.project}/{scope}/instanceGroupManagers/{self.mig}/resizeRequests/{self.name}"
