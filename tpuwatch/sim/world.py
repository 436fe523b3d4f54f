"""The simulated cloud: projects, zones, TPU nodes, operations, audit log, injected faults.

Everything here is plain Python data guarded by one lock; the gRPC layer (`grpc_api.py`)
renders it as the real protobuf messages and nothing here imports grpc or Google types.
Timed transitions and every effect on the simulated hosts (start, kill, refuse SSH) run on
the one scheduler thread, in the order they were scheduled.

Time: timestamps (create_time, audit entries, healthDescription) are real wall-clock time, so
that a client comparing them with its own clock sees the truth. Durations given to the
simulator (repair takes "30m", a step at "5m", a stockout for "1h") are simulated and run
`speed` times faster: at the default speed 600 a "30m" repair takes 3 s.

Errors an API call would return are `ApiError(code name, message)`; errors in a fault request
(unknown node, bad option) are `tpuwatch.errors.UsageError`.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpuwatch.errors import UsageError
from tpuwatch.model import NODE_NAME
from tpuwatch.sim import audit, logfilter, metadata
from tpuwatch.sim.metadata import worker_hostname, worker_instance_id
from tpuwatch.sim.scheduler import Scheduler, Timer

log = logging.getLogger(__name__)

ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
TPU_RUNTIME_PORT = 8470

# Simulated seconds each operation takes (scaled by speed).
DEFAULT_DELAYS: dict[str, float] = {
    "create": 120.0,
    "create_failed": 60.0,  # a create that ends in stockout
    "delete": 60.0,
    "stop": 60.0,
    "start": 60.0,
    "update": 10.0,  # update_node (labels, metadata, description)
    "repairing_after": 60.0,  # UNHEALTHY_MAINTENANCE -> REPAIRING (capped at a tenth of the repair)
    "simulated_maintenance_heal": 600.0,  # v2alpha1 SimulateMaintenanceEvent repair time
    "maintenance_window": 3600.0,
    "queued_accept": 10.0,
    "queued_provision": 30.0,
    # a multislice request's other slices restart when one comes back from a fault (0: they do not)
    "multislice_restart": 60.0,
}

INJECTABLE_CODES = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "INTERNAL",
        "PERMISSION_DENIED",
        "UNKNOWN",
    }
)
STUCK_MODES = ("REPAIRING", "UNHEALTHY_MAINTENANCE", "UNKNOWN")
# Node.State and Node.Health names (as google-cloud-tpu defines them), for `set_state`.
NODE_STATES = (
    "STATE_UNSPECIFIED", "CREATING", "READY", "RESTARTING", "REIMAGING", "DELETING", "REPAIRING",
    "STOPPED", "STOPPING", "STARTING", "PREEMPTED", "TERMINATED", "HIDING", "HIDDEN", "UNHIDING",
    "UNKNOWN",
)
NODE_HEALTHS = (
    "HEALTH_UNSPECIFIED", "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE",
)
# update_node: the mask paths the simulator applies (the real API takes a few more).
UPDATABLE = ("labels", "metadata", "description")
SYMPTOM_TYPES = (
    "LOW_MEMORY",
    "OUT_OF_MEMORY",
    "EXECUTE_TIMED_OUT",
    "MESH_BUILD_FAIL",
    "HBM_OUT_OF_MEMORY",
    "PROJECT_ABUSE",
)


class ApiError(Exception):
    """An error the API returns: a google.rpc code name and the service's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class HostsLike(Protocol):
    """What the world needs from the simulated hosts (tpuwatch/sim/hosts.py)."""

    def boot(
        self,
        node_key: str,
        node_id: str,
        n_workers: int,
        startup_script: str | None,
        *,
        chips_per_host: int = 4,
        vfio: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> list[str]: ...
    def down(self, node_key: str) -> None: ...
    def up(self, node_key: str) -> None: ...
    def destroy(self, node_key: str) -> None: ...
    def kill_worker(self, node_key: str, worker: int) -> None: ...
    def hang(self, node_key: str, worker: int | None = None) -> None: ...
    def host_fault(self, node_key: str, worker: int, kind: str, params: Mapping[str, Any] | None = None) -> None: ...
    def ssh_fault(self, node_key: str, worker: int, mode: str) -> None: ...
    def keys_late(self, node_key: str, delay: float) -> None: ...
    def rotate_keys_on_reboot(self, node_key: str, on: bool = True) -> None: ...
    def wrong_host_key(self, node_key: str, worker: int) -> None: ...
    def published_host_keys(self, node_key: str, worker: int) -> dict[str, str]: ...

    def set_user(self, user: str) -> None: ...


# --- accelerator types --------------------------------------------------------------------

_ACCEL_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")
_SMALL_SLICES = (1, 2, 4, 8)


def worker_count(accelerator_type: str) -> int:
    """Hosts (workers) in a slice of this type; ValueError naming the type when unknown."""
    m = _ACCEL_RE.match(accelerator_type.strip().lower())
    if not m:
        raise ValueError(
            f"unknown accelerator type {accelerator_type!r}; expected e.g. v4-8, v4-32, "
            "v5litepod-16, v5p-64, v6e-8"
        )
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        # Chips: up to 8 on one host, then 4 chips per host.
        if n in _SMALL_SLICES:
            return 1
        if n >= 16 and n % 4 == 0 and n & (n - 1) == 0 and n <= 256:
            return n // 4
    elif n >= 8 and n % 8 == 0:
        # TensorCores (v2-v4) or chips x2 (v5p): 8 per host.
        return n // 8
    raise ValueError(
        f"unknown accelerator type {accelerator_type!r}: no {family} slice has size {n}"
    )


_CONFIG_FAMILY = {
    "V2": "v2",
    "V3": "v3",
    "V4": "v4",
    "V5P": "v5p",
    "V5LITE_POD": "v5litepod",
    "V6E": "v6e",
}


def accelerator_from_config(type_name: str, topology: str) -> str:
    """The accelerator_type string an AcceleratorConfig (type + topology) amounts to."""
    family = _CONFIG_FAMILY.get(type_name)
    if family is None or not re.match(r"^\d+(x\d+){1,2}$", topology):
        raise ValueError(f"unknown accelerator config {type_name} {topology!r}")
    chips = 1
    for d in topology.split("x"):
        chips *= int(d)
    size = chips if family in ("v5litepod", "v6e") else chips * 2
    return f"{family}-{size}"


def host_shape(accelerator_type: str) -> tuple[int, bool]:
    """(chips per host, devices under /dev/vfio rather than /dev/accel) for a valid type."""
    family, n = accelerator_type.lower().split("-", 1)
    vfio = family in ("v5p", "v5litepod", "v6e")
    if family in ("v5litepod", "v6e"):
        return (int(n) if int(n) <= 8 else 4), vfio
    return 4, vfio


def accelerator_generation(accelerator_type: str) -> str:
    return accelerator_type.split("-", 1)[0].upper()


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


_REGION_PART = re.compile(r"(?:^|/)regions/([^/]+)/")
_ZONE_PART = re.compile(r"(?:^|/)(?:zones|locations)/([^/]+)/")


def misplaced(zone: str, node_json: str, reservation: str = "") -> str:
    """The INVALID_ARGUMENT text for a create in `zone` naming another region's subnetwork or
    another zone's disk or reservation (what Google answers); "" when all is in place."""
    try:
        node = json.loads(node_json) if node_json else {}
    except ValueError:
        node = {}
    region = region_of(zone)
    nets = [node.get("networkConfig") or {}, *(node.get("networkConfigs") or [])]
    for net in nets:
        m = _REGION_PART.search(str(net.get("subnetwork", "")))
        if m and m.group(1) != region:
            return (f"Invalid value for field 'subnetwork': '{net['subnetwork']}'. The subnetwork must be in "
                    f"region '{region}' of zone '{zone}'.")
    for disk in node.get("dataDisks") or []:
        src = str(disk.get("sourceDisk", ""))
        m = _REGION_PART.search(src)
        z = _ZONE_PART.search(src)
        if (m and m.group(1) != region) or (not m and z and z.group(1) != zone):
            return f"Invalid value for field 'source_disk': '{src}'. The disk must be in zone '{zone}'."
    z = _ZONE_PART.search(reservation)
    if z and z.group(1) != zone:
        return f"Invalid value for field 'reservation_name': '{reservation}'. The reservation must be in zone '{zone}'."
    return ""


def rfc3339_ns(ns: int) -> str:
    """`2022-01-26T03:44:36.265703305Z`: nanosecond RFC 3339, as healthDescription shows it."""
    secs, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{nanos:09d}Z"


def rfc3339_s(ns: int) -> str:
    """`2024-11-15T04:00:00Z`: whole seconds, as maintenance notices show them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 1_000_000_000))


# --- records ------------------------------------------------------------------------------


@dataclass
class SymptomRec:
    type: str
    worker_id: str
    details: str
    time_ns: int


@dataclass
class UpcomingRec:
    type: str  # SCHEDULED / UNSCHEDULED
    status: str  # PENDING / ONGOING
    can_reschedule: bool
    window_start_ns: int
    window_end_ns: int
    latest_window_start_ns: int


@dataclass
class NodeSpec:
    """What a create request asked for (the fields the world acts on, plus the whole request)."""

    accelerator_type: str
    runtime_version: str = "tpu-ubuntu2204-base"
    spot: bool = False
    preemptible: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str = ""
    spec_json: str = ""  # the request's Node as JSON: every other field is echoed back from it
    accelerator_config: tuple[str, str] | None = None  # (type name, topology) when given that way


@dataclass
class NodeRec:
    project: str
    zone: str
    name: str
    spec: NodeSpec
    id: int
    create_ns: int
    n_workers: int
    state: str = "CREATING"
    health: str = "HEALTH_UNSPECIFIED"
    health_description: str = ""
    ips: list[str] = field(default_factory=list)
    symptoms: list[SymptomRec] = field(default_factory=list)
    upcoming: UpcomingRec | None = None
    # What the workers' metadata servers say shortly before the host stops (the notice).
    maintenance_event: str = "NONE"
    preempt_notice: bool = False
    queued_resource: str = ""
    multislice_node: bool = False  # one of the nodes of a multislice queued resource
    api_version: str = "v2"
    epoch: int = 0  # bumped by every fault and lifecycle change; stale timers check it

    @property
    def key(self) -> str:
        return f"{self.project}/{self.zone}/{self.name}"

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.name}"


@dataclass
class OperationRec:
    name: str
    project: str
    zone: str
    verb: str  # create, delete, stop, start, simulateMaintenanceEvent, performMaintenance, ...
    target: str
    api_version: str
    create_ns: int
    end_ns: int = 0
    done: bool = False
    error: tuple[int, str] | None = None  # (google.rpc code, message)
    response_kind: str = "node"  # node, empty, queued_resource
    response: Any = None  # NodeRec / QueuedRec snapshot when done


@dataclass
class QueuedRec:
    project: str
    zone: str
    name: str
    node_id: str  # "" for a multislice request
    spec: NodeSpec
    spot: bool
    create_ns: int
    state: str = "CREATING"
    error: str = ""
    spec_json: str = ""
    epoch: int = 0
    api_version: str = "v2"
    node_count: int = 0  # multislice: how many nodes (> 1), named `<node_prefix>-<i>`
    node_prefix: str = ""

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.name}"

    @property
    def node_ids(self) -> list[str]:
        """The nodes this request provisions, as Google names them."""
        if self.node_count:
            return [f"{self.node_prefix}-{i}" for i in range(self.node_count)]
        return [self.node_id]


# `QueuedResource.Tpu.NodeSpec.MultisliceParams.node_id_prefix`, as google-cloud-tpu documents it.
MULTISLICE_PREFIX = re.compile(r"^[A-Za-z0-9_.+%-]+$")

RESERVATION_SHORTFALL = "Insufficient reserved capacity. Contact customer support to increase your reservation."


@dataclass
class _Window:
    until: float  # monotonic; inf = until cleared
    data: dict[str, Any] = field(default_factory=dict)

    def active(self) -> bool:
        return time.monotonic() < self.until


_API_ERROR_TEXT = {
    "UNAVAILABLE": "The service is currently unavailable.",
    "RESOURCE_EXHAUSTED": "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'.",
    "DEADLINE_EXCEEDED": "Deadline Exceeded",
    "INTERNAL": "Internal error encountered.",
    "UNKNOWN": "An unknown error occurred.",
}


class World:
    """The simulated cloud. Thread-safe; see the module docstring for time and errors."""

    def __init__(
        self,
        *,
        speed: float = 600.0,
        seed: int = 0,
        project: str = "sim-project",
        zone: str = "us-central2-b",
        zones: Iterable[str] | None = None,
        hosts: HostsLike | None = None,
        delays: Mapping[str, float] | None = None,
        log_latency: float = 0.0,
        log_read_quota: int | None = None,
    ) -> None:
        if not speed > 0:
            raise UsageError(f"speed must be above zero, got {speed!r}")
        self.speed = float(speed)
        self.project = project
        self.zone = zone
        self.zones: tuple[str, ...] | None = tuple(zones) if zones else None
        for z in (zone, *(self.zones or ())):
            if not ZONE_RE.match(z):
                raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        if self.zones is not None and zone not in self.zones:
            self.zones = (zone, *self.zones)
        self.hosts = hosts
        self.delays = dict(DEFAULT_DELAYS)
        for k, v in (delays or {}).items():
            if k not in self.delays:
                raise UsageError(f"unknown delay {k!r}; known: {', '.join(sorted(self.delays))}")
            self.delays[k] = float(v)
        self.log_latency = float(log_latency)  # simulated seconds before an entry is readable
        self.log_read_quota = log_read_quota  # ListLogEntries per minute per project, None = off

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._sched = Scheduler()
        self._rng = random.Random(seed)
        self._err_rng = random.Random(seed ^ 0x5EED)
        self._nodes: dict[str, NodeRec] = {}
        self._queued: dict[str, QueuedRec] = {}
        self._ops: dict[str, OperationRec] = {}
        self._audit: list[audit.AuditRecord] = []
        self._insert_ids: set[str] = set()
        self._stockouts: dict[str, _Window] = {}  # zone -> window
        self._quota: dict[str, _Window] = {}  # zone or "*" -> window
        self._api_errors: _Window | None = None
        self._lost: _Window | None = None  # calls served, then failed: the response is lost
        self._slow: _Window | None = None  # calls answered late
        self._denied: _Window | None = None
        self._fake_ips: dict[str, int] = {}
        self.calls: Counter[str] = Counter()
        self._call_times: dict[str, deque[tuple[float, str]]] = {}
        self.injected: Counter[str] = Counter()  # method -> calls failed by injection
        self.lost: Counter[str] = Counter()  # method -> calls served whose answer was an error
        self.host_errors: list[str] = []  # effects on the simulated hosts that failed
        # OS Login (the os-login fault): the POSIX name the workers know the user by, and the
        # public keys imported into the user's login profile (gcloud imports its key once)
        self.os_login_user: str | None = None
        self.os_login_keys: list[str] = []
        self._started = False

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._sched.start()

    def close(self) -> None:
        self._sched.close()

    @property
    def scheduler_errors(self) -> list[BaseException]:
        return list(self._sched.errors)

    def real(self, sim_seconds: float) -> float:
        """Real seconds a simulated duration takes."""
        return sim_seconds / self.speed

    def after(self, sim_seconds: float, fn: Callable[[], Any]) -> Timer:
        """Run `fn` on the scheduler thread after a simulated duration."""
        return self._sched.call_later(self.real(sim_seconds), fn)

    def _touch(self) -> None:
        self._changed.notify_all()

    def wait_for(
        self, predicate: Callable[[World], bool], timeout: float = 10.0, what: str = ""
    ) -> None:
        """Block until `predicate(world)` holds (re-checked on every change); TimeoutError otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self), timeout):
                raise TimeoutError(
                    f"simulator: {what or 'condition'} not reached within {timeout:g}s"
                )

    def wait_node(
        self,
        name: str,
        state: str = "READY",
        *,
        health: str | None = None,
        timeout: float = 10.0,
        project: str | None = None,
        zone: str | None = None,
    ) -> NodeRec:
        """Block until the node shows `state` (and `health` when given); return its snapshot."""
        key = self._key(project, zone, name)

        def ok(w: World) -> bool:
            n = w._nodes.get(key)
            return n is not None and n.state == state and (health is None or n.health == health)

        self.wait_for(ok, timeout, f"node {name} {state}{'/' + health if health else ''}")
        return self.node(name, project=project, zone=zone)

    # --- calls: counting and injected errors -----------------------------------------

    def before_call(self, method: str, resource: str = "") -> ApiError | None:
        """Count one API call; return the error to inject for it, if any.

        A `slow_calls` fault then makes it wait (on the serving thread, outside the lock): the
        call has arrived, its answer comes late.
        """
        error = self._count_call(method, resource)
        slow = self._slow
        if slow is not None and slow.active() and _method_selected(method, slow.data["methods"]):
            with self._lock:
                share = 1.0 + slow.data["jitter"] * (2 * self._err_rng.random() - 1)
            time.sleep(self.real(slow.data["latency"]) * share)
        return error

    def _count_call(self, method: str, resource: str) -> ApiError | None:
        project = _project_of(resource) or self.project
        now = time.monotonic()
        with self._lock:
            self.calls[method] += 1
            q = self._call_times.setdefault(method, deque(maxlen=100_000))
            q.append((now, project))
            denied = self._denied
            if (
                denied is not None
                and denied.active()
                and _method_selected(method, denied.data["methods"])
            ):
                self.injected[method] += 1
                perm = _permission_for(method)
                return ApiError(
                    "PERMISSION_DENIED",
                    f"Permission '{perm}' denied on resource '//tpu.googleapis.com/{resource or 'projects/' + project}' "
                    "(or it may not exist).",
                )
            errs = self._api_errors
            # The RNG is drawn only for selected calls, so a seed gives the same failures.
            if (
                errs is not None
                and errs.active()
                and _method_selected(method, errs.data["methods"])
                and self._err_rng.random() < errs.data["rate"]
            ):
                code = self._err_rng.choice(errs.data["codes"])
                self.injected[method] += 1
                return ApiError(code, _API_ERROR_TEXT.get(code, code))
            if self.log_read_quota is not None and method.endswith("/ListLogEntries"):
                recent = sum(1 for t, p in q if p == project and now - t < 60.0)
                if recent > self.log_read_quota:
                    self.injected[method] += 1
                    return ApiError(
                        "RESOURCE_EXHAUSTED",
                        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
                        f"minute' of service 'logging.googleapis.com' for consumer 'project_number:{project}'.",
                    )
        return None

    def after_call(self, method: str) -> ApiError | None:
        """For a call that was served: the error to answer instead (`lose_responses`), if any."""
        lost = self._lost
        if lost is None or not lost.active() or not _method_selected(method, lost.data["methods"]):
            return None
        with self._lock:
            if self._err_rng.random() >= lost.data["rate"]:
                return None
            code = self._err_rng.choice(lost.data["codes"])
            self.injected[method] += 1
            self.lost[method] += 1
        return ApiError(code, _API_ERROR_TEXT.get(code, code))

    def call_count(self, suffix: str) -> int:
        """Calls whose method ends with `suffix` ("GetNode", "Tpu/GetNode", "ListLogEntries")."""
        with self._lock:
            return sum(n for m, n in self.calls.items() if m.endswith(suffix))

    def max_calls_per_window(
        self, suffix: str, window: float = 60.0, project: str | None = None
    ) -> int:
        """The most calls matching `suffix` seen in any `window` real seconds (quota checks)."""
        with self._lock:
            times = sorted(
                t
                for m, q in self._call_times.items()
                if m.endswith(suffix)
                for t, p in q
                if project is None or p == project
            )
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def reset_calls(self) -> None:
        with self._lock:
            self.calls.clear()
            self._call_times.clear()
            self.injected.clear()

    # --- names, zones -----------------------------------------------------------------

    def _key(self, project: str | None, zone: str | None, name: str) -> str:
        if name.startswith("projects/"):
            p, z, n = parse_node_name(name)
            return f"{p}/{z}/{n}"
        return f"{project or self.project}/{zone or self.zone}/{name}"

    def check_zone(self, project: str, zone: str) -> None:
        if not ZONE_RE.match(zone) or (self.zones is not None and zone not in self.zones):
            raise ApiError(
                "NOT_FOUND" if ZONE_RE.match(zone) else "INVALID_ARGUMENT",
                f"Location 'projects/{project}/locations/{zone}' is not found or access is unauthorized.",
            )

    def _require(self, project: str, zone: str, name: str) -> NodeRec:
        self.check_zone(project, zone)
        rec = self._nodes.get(f"{project}/{zone}/{name}")
        if rec is None:
            raise ApiError(
                "NOT_FOUND",
                f"Resource 'projects/{project}/locations/{zone}/nodes/{name}' was not found",
            )
        return rec

    def _fault_node(self, node: str, project: str | None, zone: str | None) -> NodeRec:
        key = self._key(project, zone, node)
        rec = self._nodes.get(key)
        if rec is None:
            known = ", ".join(sorted(self._nodes)) or "none"
            raise UsageError(f"no simulated node {key!r} (nodes: {known})")
        return rec

    def _new_id(self) -> int:
        return self._rng.randrange(10**17, 9 * 10**18)

    def _op_name(self, project: str, zone: str) -> str:
        return f"projects/{project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{self._rng.getrandbits(64):016x}"

    # --- reads ------------------------------------------------------------------------

    def node(self, name: str, *, project: str | None = None, zone: str | None = None) -> NodeRec:
        """A snapshot of one node (for tests and the control service)."""
        with self._lock:
            rec = self._nodes.get(self._key(project, zone, name))
            if rec is None:
                raise UsageError(f"no simulated node {name!r}")
            return copy.deepcopy(rec)

    def instance_metadata(self, node_key: str, worker: int) -> metadata.Instance | None:
        """What worker `worker` of node "project/zone/name" reads from its metadata server now:
        the node's metadata, preempted, the upcoming-maintenance notice. None when no such worker."""
        with self._lock:
            rec = self._nodes.get(node_key)
            if rec is None or not 0 <= worker < rec.n_workers:
                return None
            notice = None
            if rec.upcoming is not None:
                u = rec.upcoming
                notice = {
                    "can_reschedule": u.can_reschedule,
                    "latest_window_start_time": rfc3339_s(u.latest_window_start_ns),
                    "maintenance_status": u.status,
                    "type": u.type,
                    "window_end_time": rfc3339_s(u.window_end_ns),
                    "window_start_time": rfc3339_s(u.window_start_ns),
                }
            return metadata.make_instance(
                project=rec.project,
                zone=rec.zone,
                node_id=rec.id,
                worker=worker,
                metadata=rec.spec.metadata,
                accelerator_type=rec.spec.accelerator_type,
                preempted=rec.state == "PREEMPTED" or rec.preempt_notice,
                upcoming_maintenance=notice,
                ip=rec.ips[worker] if worker < len(rec.ips) else "",
                maintenance_event=rec.maintenance_event,
            )

    def has_node(self, name: str, *, project: str | None = None, zone: str | None = None) -> bool:
        with self._lock:
            return self._key(project, zone, name) in self._nodes

    def nodes(self) -> list[NodeRec]:
        with self._lock:
            return [copy.deepcopy(n) for _, n in sorted(self._nodes.items())]

    def get_node(self, project: str, zone: str, name: str) -> NodeRec:
        with self._lock:
            return copy.deepcopy(self._require(project, zone, name))

    def list_nodes(self, project: str, zone: str) -> list[NodeRec]:
        with self._lock:
            if zone != "-":
                self.check_zone(project, zone)
            return [
                copy.deepcopy(n)
                for _, n in sorted(self._nodes.items())
                if n.project == project and (zone == "-" or n.zone == zone)
            ]

    # --- create / delete / stop / start ----------------------------------------------

    def _validate_spec(self, zone: str, spec: NodeSpec, reservation: str = "") -> int:
        bad = misplaced(zone, spec.spec_json, reservation)
        if bad:
            raise ApiError("INVALID_ARGUMENT", bad)
        try:
            return worker_count(spec.accelerator_type)
        except ValueError:
            raise ApiError(
                "INVALID_ARGUMENT",
                f'Accelerator type "{spec.accelerator_type}" is not available in zone "{zone}". '
                "Valid types look like v4-8, v4-32, v5litepod-16, v5p-64, v6e-8.",
            )

    def _quota_error(self, zone: str, spec: NodeSpec) -> ApiError | None:
        win = self._quota.get(zone) or self._quota.get("*")
        if win is None or not win.active():
            return None
        limit = win.data.get("limit") or (
            f"TPU{accelerator_generation(spec.accelerator_type)}"
            f"{'Preemptible' if spec.spot or spec.preemptible else ''}PerProjectPerRegionForTPUAPI"
        )
        return ApiError(
            "RESOURCE_EXHAUSTED",
            f"Quota limit '{limit}' has been exceeded. Limit: 0 in region {region_of(zone)}.",
        )

    def stockout_text(self, zone: str) -> str:
        return (
            f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
            "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
            f"[EID: 0x{self._rng.getrandbits(64):016x}]"
        )

    def _in_stockout(self, zone: str) -> bool:
        win = self._stockouts.get(zone) or self._stockouts.get("*")
        return win is not None and win.active()

    def _create_failure_text(self, zone: str) -> str:
        win = self._stockouts.get(zone) or self._stockouts.get("*")
        if win is not None and win.data.get("reservation"):
            # Seen by users with code 8, like a stockout, though the docs show it with code 9.
            return RESERVATION_SHORTFALL
        return self.stockout_text(zone)

    def create_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        spec: NodeSpec,
        api_version: str = "v2",
        *,
        queued_resource: str = "",
        multislice_node: bool = False,
    ) -> OperationRec:
        with self._lock:
            self.check_zone(project, zone)
            if not NODE_NAME.match(node_id or ""):
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"Invalid node_id {node_id!r}: it must start with a lowercase letter, contain only "
                    "lowercase letters, digits and hyphens, and be at most 63 characters.",
                )
            n_workers = self._validate_spec(zone, spec)
            quota = self._quota_error(zone, spec)
            if quota is not None:
                raise quota
            key = f"{project}/{zone}/{node_id}"
            if key in self._nodes:
                raise ApiError(
                    "ALREADY_EXISTS",
                    f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists",
                )
            rec = NodeRec(
                project,
                zone,
                node_id,
                copy.deepcopy(spec),
                self._new_id(),
                time.time_ns(),
                n_workers,
                api_version=api_version,
                queued_resource=queued_resource,
                multislice_node=multislice_node,
            )
            self._nodes[key] = rec
            op = self._new_op(project, zone, "create", rec.full_name, api_version)
            doomed = self._in_stockout(zone)
            node_id_now, epoch = rec.id, rec.epoch
            self._touch()
        if doomed:
            self.after(
                self.delays["create_failed"],
                lambda: self._finish_create_failed(key, node_id_now, op.name),
            )
        else:
            self.after(
                self.delays["create"], lambda: self._finish_create(key, node_id_now, epoch, op.name)
            )
        return copy.deepcopy(op)

    def _new_op(
        self,
        project: str,
        zone: str,
        verb: str,
        target: str,
        api_version: str,
        response_kind: str = "node",
    ) -> OperationRec:
        op = OperationRec(
            self._op_name(project, zone),
            project,
            zone,
            verb,
            target,
            api_version,
            time.time_ns(),
            response_kind=response_kind,
        )
        self._ops[op.name] = op
        return op

    def _end_op(
        self, name: str, *, error: tuple[int, str] | None = None, response: Any = None
    ) -> None:
        op = self._ops.get(name)
        if op is None or op.done:
            return
        op.done, op.end_ns, op.error, op.response = (
            True,
            time.time_ns(),
            error,
            copy.deepcopy(response),
        )
        self._touch()

    def _finish_create_failed(self, key: str, node_id: int, op_name: str) -> None:
        with self._lock:
            rec = self._nodes.get(key)
            zone = key.split("/")[1]
            if rec is not None and rec.id == node_id:
                del self._nodes[key]
            self._end_op(op_name, error=(8, self._create_failure_text(zone)))

    def _finish_create(self, key: str, node_id: int, epoch: int, op_name: str) -> None:
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != node_id or rec.epoch != epoch:
                return  # deleted (or changed) while creating; that path ends the operation
            spec, ident = copy.deepcopy(rec.spec), str(rec.id)
        try:
            ips = self._boot(key, ident, spec)
        except Exception as exc:
            log.exception("simulated hosts: boot %s failed", key)
            self.host_errors.append(f"boot {key}: {exc}")
            with self._lock:
                rec = self._nodes.get(key)
                if rec is not None and rec.id == node_id:
                    del self._nodes[key]
                self._end_op(op_name, error=(13, f"Internal error while creating the node: {exc}"))
            return
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != node_id:
                self._hosts_call("destroy", key)
                return
            rec.ips = ips
            if rec.epoch == epoch:
                rec.state, rec.health = "READY", "HEALTHY"
            self._end_op(op_name, response=rec)

    def _boot(self, key: str, ident: str, spec: NodeSpec) -> list[str]:
        n_workers = worker_count(spec.accelerator_type)
        if self.hosts is None:
            idx = self._fake_ips.setdefault(key, len(self._fake_ips) + 1)
            return [f"127.{1 + idx // 250}.{idx % 250}.{w}" for w in range(n_workers)]
        chips, vfio = host_shape(spec.accelerator_type)
        return list(
            self.hosts.boot(
                key,
                ident,
                n_workers,
                spec.metadata.get("startup-script"),
                chips_per_host=chips,
                vfio=vfio,
                metadata=dict(spec.metadata),
            )
        )

    def _hosts_call(self, what: str, key: str, *args: Any) -> None:
        """Apply an effect to the simulated hosts, logging (not raising) its failure."""
        if self.hosts is None:
            return
        try:
            getattr(self.hosts, what)(key, *args)
        except Exception as exc:
            log.exception("simulated hosts: %s %s failed", what, key)
            self.host_errors.append(f"{what} {key}: {exc}")

    def _queue_hosts(self, what: str, key: str, *args: Any) -> Timer | None:
        """Queue a host effect on the scheduler thread, behind what is already due.

        Call it with the world lock held and before scheduling the fault's follow-up timers
        (a repair that ends "now" must not bring the host up before it went down); then
        `_await` it after releasing the lock.
        """
        if self.hosts is None:
            return None
        return self._sched.submit(lambda: self._hosts_call(what, key, *args))

    def _await(self, timer: Timer | None) -> None:
        """Wait for a queued host effect, unless on the scheduler thread (it runs next)."""
        if timer is not None and not self._sched.in_thread():
            timer.wait(120)

    def delete_node(
        self, project: str, zone: str, name: str, api_version: str = "v2"
    ) -> OperationRec:
        with self._lock:
            rec = self._require(project, zone, name)
            # A second delete of a DELETING node gets its own operation that ends with the first.
            rec.state, rec.epoch = "DELETING", rec.epoch + 1
            op = self._new_op(
                project, zone, "delete", rec.full_name, api_version, response_kind="empty"
            )
            key, node_id = rec.key, rec.id
            self._touch()
        self.after(self.delays["delete"], lambda: self._finish_delete(key, node_id, op.name))
        return copy.deepcopy(op)

    def _finish_delete(self, key: str, node_id: int, op_name: str) -> None:
        with self._lock:
            rec = self._nodes.get(key)
            gone = rec is not None and rec.id == node_id
            if gone:
                del self._nodes[key]
            # A create still in flight for this incarnation fails as the real one would.
            project, zone, name = key.split("/")
            target = f"projects/{project}/locations/{zone}/nodes/{name}"
            for op in list(self._ops.values()):
                if not op.done and op.verb == "create" and op.target == target:
                    self._end_op(
                        op.name, error=(10, "The node was deleted while it was being created.")
                    )
            self._end_op(op_name, response=None)
        if gone:
            self._hosts_call("destroy", key)

    def stop_node(
        self, project: str, zone: str, name: str, api_version: str = "v2"
    ) -> OperationRec:
        return self._transition(project, zone, name, api_version, "stop", "READY",
                                ("STOPPING", "STOPPED", "HEALTH_UNSPECIFIED"), hosts="down")

    def start_node(
        self, project: str, zone: str, name: str, api_version: str = "v2"
    ) -> OperationRec:
        return self._transition(project, zone, name, api_version, "start", "STOPPED",
                                ("STARTING", "READY", "HEALTHY"), hosts="up")

    def _transition(
        self, project: str, zone: str, name: str, api_version: str, verb: str, from_state: str,
        states: tuple[str, str, str], *, hosts: str,
    ) -> OperationRec:
        """A node operation that moves `from_state` -> states[0] now and, after delays[verb],
        -> states[1] with health states[2] (the hosts go `hosts` first); refused in any other
        state, as the API refuses it, and failed if the node changed meanwhile."""
        during, after, health = states
        with self._lock:
            rec = self._require(project, zone, name)
            if rec.state != from_state:
                raise ApiError(
                    "FAILED_PRECONDITION", f"{verb} is not supported while in state {rec.state}"
                )
            rec.state, rec.epoch = during, rec.epoch + 1
            op = self._new_op(project, zone, verb, rec.full_name, api_version)
            key, node_id, epoch = rec.key, rec.id, rec.epoch
            self._touch()

        def finish() -> None:
            self._hosts_call(hosts, key)
            with self._lock:
                rec = self._nodes.get(key)
                if rec is not None and rec.id == node_id and rec.epoch == epoch:
                    rec.state, rec.health = after, health
                    self._end_op(op.name, response=rec)
                else:
                    gerund = {"stop": "stopped", "start": "started"}.get(verb, verb)
                    self._end_op(op.name, error=(10, f"The node changed while it was being {gerund}."))

        self.after(self.delays[verb], finish)
        return copy.deepcopy(op)

    def update_node(
        self,
        project: str,
        zone: str,
        name: str,
        fields: Mapping[str, Any],
        paths: Iterable[str],
        api_version: str = "v2",
    ) -> OperationRec:
        """UpdateNode: the masked `paths` of `fields` (labels, metadata, description) are applied
        when the operation ends. Errors as the API gives them: no mask or an unknown path is
        INVALID_ARGUMENT, and so is a node not READY or STOPPED ("update is not supported while
        in state PREEMPTED", as Google answers)."""
        wanted = [p.strip() for p in paths if p.strip()]
        with self._lock:
            rec = self._require(project, zone, name)
            if not wanted:
                raise ApiError(
                    "INVALID_ARGUMENT", "update_mask is required: name the fields to update, e.g. labels"
                )
            bad = [p for p in wanted if p not in UPDATABLE]
            if bad:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"update_mask: {', '.join(bad)} cannot be updated in the simulator "
                    f"(it updates {', '.join(UPDATABLE)})",
                )
            if "labels" in wanted:
                _check_labels(fields.get("labels") or {})
            if rec.state not in ("READY", "STOPPED"):
                raise ApiError(
                    "INVALID_ARGUMENT", f"update is not supported while in state {rec.state}"
                )
            changes = {p: copy.deepcopy(fields.get(p)) for p in wanted}
            # An update is not a fault: the epoch stays, so pending transitions still happen.
            op = self._new_op(project, zone, "update", rec.full_name, api_version)
            key, node_id = rec.key, rec.id
            self._touch()

        def finish() -> None:
            with self._lock:
                rec = self._nodes.get(key)
                if rec is None or rec.id != node_id:
                    self._end_op(
                        op.name, error=(10, "The node was deleted while it was being updated.")
                    )
                    return
                for path, value in changes.items():
                    if path == "labels":
                        rec.spec.labels = {str(k): str(v) for k, v in dict(value or {}).items()}
                    elif path == "metadata":
                        rec.spec.metadata = {str(k): str(v) for k, v in dict(value or {}).items()}
                    else:
                        rec.spec.description = str(value or "")
                self._end_op(op.name, response=rec)

        self.after(self.delays["update"], finish)
        return copy.deepcopy(op)

    # --- operations -------------------------------------------------------------------

    def get_operation(self, name: str) -> OperationRec:
        with self._lock:
            op = self._ops.get(name)
            if op is None:
                raise ApiError("NOT_FOUND", f"Operation '{name}' was not found")
            return copy.deepcopy(op)

    def list_operations(self, parent: str) -> list[OperationRec]:
        parent = parent.rstrip("/")
        if parent.endswith("/operations"):
            parent = parent[: -len("/operations")]
        with self._lock:
            return [
                copy.deepcopy(o)
                for o in self._ops.values()
                if o.name.startswith(parent + "/operations/")
            ]

    def delete_operation(self, name: str) -> None:
        with self._lock:
            if self._ops.pop(name, None) is None:
                raise ApiError("NOT_FOUND", f"Operation '{name}' was not found")

    def wait_operation(self, name: str, timeout: float = 10.0) -> OperationRec:
        self.wait_for(
            lambda w: w._ops.get(name) is None or w._ops[name].done, timeout, f"operation {name}"
        )
        return self.get_operation(name)

    # --- the audit log ----------------------------------------------------------------

    def _write_audit(
        self,
        rec: NodeRec,
        method: str,
        *,
        worker: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        severity: str = "NOTICE",
        at_ns: int | None = None,
        instance: str = "",
    ) -> audit.AuditRecord:
        ts = at_ns if at_ns is not None else time.time_ns()
        while True:
            insert_id = f"{self._rng.getrandbits(40):010x}"
            if insert_id not in self._insert_ids:
                break
        self._insert_ids.add(insert_id)
        entry = audit.AuditRecord(
            seq=len(self._audit),
            time_ns=ts,
            receive_ns=ts + int(self.real(self.log_latency) * 1e9),
            project=rec.project,
            zone=rec.zone,
            node=rec.name,
            worker=None if worker is None else str(worker),
            method=method,
            insert_id=insert_id,
            severity=severity,
            metadata=dict(metadata or {}),
            instance=instance,
            instance_id=worker_instance_id(rec.id, worker or 0) if instance else "",
        )
        self._audit.append(entry)
        self._touch()
        return entry

    def system_event(self, node: str, method: str, *, worker: int | None = None,
                     project: str | None = None, zone: str | None = None) -> None:
        """Write one system-event entry about a node and do nothing else (for tests)."""
        with self._lock:
            self._write_audit(self._fault_node(node, project, zone), method, worker=worker)

    def audit_entries(self) -> list[audit.AuditRecord]:
        """Every entry written so far, visible or not (for tests)."""
        with self._lock:
            return list(self._audit)

    def list_log_entries(
        self,
        resource_names: Iterable[str],
        filter_text: str = "",
        order_by: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[audit.AuditRecord], str]:
        projects = set()
        names = list(resource_names)
        if not names:
            raise ApiError(
                "INVALID_ARGUMENT",
                "resource_names: at least one resource name is required, e.g. projects/my-project",
            )
        for r in names:
            m = re.match(r"^projects/([^/]+)$", r)
            if not m:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"resource_names: {r!r} is not supported by the simulator; use projects/PROJECT",
                )
            projects.add(m.group(1))
        order = (order_by or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc", "timestamp"):
            raise ApiError(
                "INVALID_ARGUMENT",
                f'order_by: {order_by!r} is not supported; use "timestamp asc" or "timestamp desc"',
            )
        desc = order == "timestamp desc"
        if page_size < 0:
            raise ApiError("INVALID_ARGUMENT", "page_size must not be negative")
        size = min(page_size or 50, 1000)
        try:
            tree = logfilter.parse(filter_text or "")
        except logfilter.FilterError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {exc}")
        fingerprint = f"{sorted(projects)}|{filter_text}|{desc}"
        after: tuple[int, int] | None = None
        if page_token:
            after = _decode_token(page_token, fingerprint)
        now = time.time_ns()
        with self._lock:
            rows = [e for e in self._audit if e.project in projects and e.receive_ns <= now]
        rows = [e for e in rows if tree.matches(audit.filter_fields(e))]
        rows.sort(key=lambda e: (e.time_ns, e.seq), reverse=desc)
        if after is not None:
            rows = [
                e
                for e in rows
                if ((e.time_ns, e.seq) < after if desc else (e.time_ns, e.seq) > after)
            ]
        page, rest = rows[:size], rows[size:]
        token = _encode_token((page[-1].time_ns, page[-1].seq), fingerprint) if rest else ""
        return page, token

    # --- faults -----------------------------------------------------------------------

    def _ensure_live(self, rec: NodeRec, what: str) -> None:
        if rec.state in ("CREATING", "DELETING", "STOPPED", "STOPPING", "PREEMPTED", "TERMINATED"):
            raise UsageError(f"cannot inject {what} into node {rec.name}: it is {rec.state}")

    def maintenance(
        self,
        node: str,
        *,
        heal_after: float | None = 1800.0,
        stuck: str | None = None,
        worker: int | None = None,
        reason: str = "MAINTENANCE",
        project: str | None = None,
        zone: str | None = None,
        op_name: str | None = None,
        notice: float = 0.0,
    ) -> None:
        """Start maintenance: job killed, SSH refused, health UNHEALTHY_MAINTENANCE then REPAIRING.

        With `heal_after` (simulated seconds) the node comes back READY+HEALTHY with
        "The TPU had a maintenance event at ..." and a restart entry; with `stuck` it never does
        (REPAIRING, UNHEALTHY_MAINTENANCE, or UNKNOWN after a failed repair). With `notice`
        (simulated seconds; Compute Engine gives about 60), the workers' metadata servers say
        `maintenance-event` TERMINATE_ON_HOST_MAINTENANCE that long before the host stops.
        """
        if stuck is not None and stuck not in STUCK_MODES:
            raise UsageError(f"stuck must be one of {', '.join(STUCK_MODES)}, got {stuck!r}")
        if notice > 0:
            def stop() -> None:
                self.maintenance(node, heal_after=heal_after, stuck=stuck, worker=worker, reason=reason,
                                 project=project, zone=zone, op_name=op_name)
            self._give_notice(node, project, zone, "maintenance", notice, stop)
            return
        with self._lock:
            rec = self._fault_node(node, project, zone)
            self._ensure_live(rec, "maintenance")
            if worker is not None and not 0 <= worker < rec.n_workers:
                raise UsageError(
                    f"worker must be 0..{rec.n_workers - 1} for node {rec.name}, got {worker}"
                )
            rec.epoch += 1
            t0 = time.time_ns()
            rec.health, rec.health_description = "UNHEALTHY_MAINTENANCE", ""
            self._write_audit(
                rec, audit.TERMINATE, worker=worker, metadata={"terminateReason": reason}, at_ns=t0
            )
            key, ident, epoch = rec.key, rec.id, rec.epoch
            self._touch()
            down = self._queue_hosts("down", key)
            repair_in = self.delays["repairing_after"]
            if heal_after is not None and stuck is None:
                repair_in = min(repair_in, heal_after / 10)
            if stuck != "UNHEALTHY_MAINTENANCE":
                self.after(repair_in, lambda: self._set_state(key, ident, epoch, "REPAIRING"))
            if stuck == "UNKNOWN":
                self.after(
                    2 * repair_in,
                    lambda: self._set_state(key, ident, epoch, "UNKNOWN", "HEALTH_UNSPECIFIED"),
                )
            if stuck is None and heal_after is not None:
                self.after(heal_after, lambda: self._heal(key, ident, epoch, t0, worker, op_name))
        self._await(down)

    def _give_notice(self, node: str, project: str | None, zone: str | None, what: str, notice: float,
                     then: Callable[[], None]) -> None:
        """Post the metadata server's notice of `what` (maintenance or preemption) now, and run
        `then` (the fault itself) `notice` simulated seconds later if the node is still the same."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            self._ensure_live(rec, what)
            if what == "maintenance":
                rec.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
            else:
                rec.preempt_notice = True
            key, ident = rec.key, rec.id
            self._touch()

        def due() -> None:
            with self._lock:
                rec = self._nodes.get(key)
                if rec is None or rec.id != ident:
                    return
            try:
                then()
            except UsageError:
                pass  # the node changed state before the notice ran out

        self.after(notice, due)

    def set_state(
        self,
        node: str,
        state: str,
        health: str | None = None,
        *,
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        """Put a node in any state (and health) at once, for tests: no fault reaches them all.

        Timed transitions still pending for the node are dropped (as after any fault); the
        simulated hosts are not touched, so SSH answers as before.
        """
        if state not in NODE_STATES:
            raise UsageError(f"state must be one of {', '.join(NODE_STATES)}, got {state!r}")
        if health is not None and health not in NODE_HEALTHS:
            raise UsageError(f"health must be one of {', '.join(NODE_HEALTHS)}, got {health!r}")
        with self._lock:
            rec = self._fault_node(node, project, zone)
            rec.epoch += 1
            rec.state = state
            if health is not None:
                rec.health = health
            self._touch()

    def _set_state(
        self, key: str, ident: int, epoch: int, state: str, health: str | None = None
    ) -> None:
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != ident or rec.epoch != epoch:
                return
            rec.state = state
            if health is not None:
                rec.health = health
            self._touch()

    def _heal(
        self,
        key: str,
        ident: int,
        epoch: int,
        event_ns: int | None,
        worker: int | None,
        op_name: str | None,
    ) -> None:
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != ident or rec.epoch != epoch:
                return
        # SSH listens again before the API says READY, as on a real VM that finished booting.
        self._hosts_call("up", key)
        down: list[Timer | None] = []
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != ident or rec.epoch != epoch:
                return
            down = self._restart_peers(rec)
            rec.state, rec.health = "READY", "HEALTHY"
            rec.maintenance_event = "NONE"
            if event_ns is not None:
                rec.health_description = (
                    f"The TPU had a maintenance event at {rfc3339_ns(event_ns)}"
                )
            rec.upcoming = None
            rec.epoch += 1
            self._write_audit(rec, audit.RESTART, worker=worker, severity="INFO")
            if op_name:
                self._end_op(op_name, response=rec)
            self._touch()
        for timer in down:
            self._await(timer)

    def _restart_peers(self, rec: NodeRec) -> list[Timer | None]:
        """Google's multislice autorepair: once a slice is back, "all other slices in the
        Multislice environment are restarted so training can continue". The others go
        RESTARTING (their jobs killed, SSH refused) in the same instant, and come back READY with
        a restart entry `multislice_restart` later. Call with the lock held."""
        qr = self._queued_of(rec) if rec.multislice_node else None
        wait = self.delays["multislice_restart"]
        if qr is None or wait <= 0:
            return []
        down = []
        for peer in self._nodes_of(qr):
            if peer.key == rec.key or peer.state != "READY":
                continue
            peer.epoch += 1
            peer.state = "RESTARTING"
            down.append(self._queue_hosts("down", peer.key))
            self.after(wait, functools.partial(self._restarted, peer.key, peer.id, peer.epoch))
        return down

    def _restarted(self, key: str, ident: int, epoch: int) -> None:
        """A restarted slice is back: SSH first, then READY+HEALTHY and a restart entry; its own
        announced maintenance, if any, still stands."""
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != ident or rec.epoch != epoch:
                return
        self._hosts_call("up", key)
        with self._lock:
            rec = self._nodes.get(key)
            if rec is None or rec.id != ident or rec.epoch != epoch:
                return
            rec.state, rec.health = "READY", "HEALTHY"
            rec.epoch += 1
            self._write_audit(rec, audit.RESTART, severity="INFO")
            self._touch()

    def heal(self, node: str, *, project: str | None = None, zone: str | None = None) -> None:
        """End whatever fault the node is in now: READY+HEALTHY, SSH back, a restart entry."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if rec.state in ("CREATING", "DELETING"):
                raise UsageError(f"cannot heal node {rec.name}: it is {rec.state}")
            key, ident, epoch = rec.key, rec.id, rec.epoch
        self._sched.run_sync(lambda: self._heal(key, ident, epoch, None, None, None))

    def preempt(
        self,
        node: str,
        *,
        project: str | None = None,
        zone: str | None = None,
        reason: str = "PREEMPTED",
        notice: float = 0.0,
    ) -> None:
        """Spot/preemptible node preempted: PREEMPTED for good, a terminate entry, workers gone.

        A node made through a queued resource is taken back by the service, as Google does: the
        request goes SUSPENDING, its node is deleted (PREEMPTED, then DELETING, then gone), and
        the request ends SUSPENDED, keeping its name until someone deletes it. One slice of a
        multislice request takes the whole request with it: the request was provisioned as one,
        and SUSPENDED means all of its resources are gone, so the other slices are deleted too. With `notice`
        (simulated seconds; about 30 on Compute Engine) the workers' metadata servers say
        `preempted` TRUE that long before.
        """
        with self._lock:
            rec = self._fault_node(node, project, zone)
            qr = self._queued_of(rec)
            if not (rec.spec.spot or rec.spec.preemptible or (qr is not None and qr.spot)):
                raise UsageError(
                    f"node {rec.name} is neither spot nor preemptible, so it cannot be preempted; "
                    "create it with spot = true, or use terminate"
                )
            self._ensure_live(rec, "preemption")
        if notice > 0:
            self._give_notice(node, project, zone, "preemption", notice,
                              lambda: self.preempt(node, project=project, zone=zone, reason=reason))
            return
        with self._lock:
            rec = self._fault_node(node, project, zone)
            qr = self._queued_of(rec)
            self._ensure_live(rec, "preemption")
            rec.epoch += 1
            rec.state, rec.health, rec.health_description = "PREEMPTED", "HEALTH_UNSPECIFIED", ""
            self._write_audit(rec, audit.TERMINATE, metadata={"terminateReason": reason})
            down = self._queue_hosts("down", rec.key)
            if qr is not None:
                qr.state = "SUSPENDING"
                self._touch()
                qr_key, created = f"{qr.project}/{qr.zone}/{qr.name}", qr.create_ns
        self._await(down)
        if qr is not None:
            self.after(self.delays["queued_accept"], lambda: self._qr_suspend(qr_key, created))

    def _queued_of(self, rec: NodeRec) -> QueuedRec | None:
        """The queued resource that made this node (and still stands), if any."""
        if not rec.queued_resource:
            return None
        project, zone, name = rec.queued_resource.split("/")[1::2]
        qr = self._queued.get(f"{project}/{zone}/{name}")
        return qr if qr is not None and qr.full_name == rec.queued_resource else None

    def _nodes_of(self, qr: QueuedRec) -> list[NodeRec]:
        """The nodes this request made that still exist (any of them may already be gone)."""
        found = (self._nodes.get(f"{qr.project}/{qr.zone}/{n}") for n in qr.node_ids)
        return [n for n in found if n is not None and n.queued_resource == qr.full_name]

    def _qr_suspend(self, key: str, created: int) -> None:
        """The service deletes a SUSPENDING request's nodes, then the request is SUSPENDED."""
        with self._lock:
            qr = self._queued.get(key)
            if qr is None or qr.create_ns != created or qr.state != "SUSPENDING":
                return
            nodes = self._nodes_of(qr)
            if not nodes:
                qr.state = "SUSPENDED"
                self._touch()
                return
            to_delete = [(n.project, n.zone, n.name) for n in nodes if n.state != "DELETING"]
        for project, zone, name in to_delete:
            self.delete_node(project, zone, name)
        self.after(self.delays["delete"] / 2, lambda: self._qr_suspend(key, created))

    def terminate(
        self,
        node: str,
        *,
        reason: str = "MAINTENANCE",
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        """Node TERMINATED for good (maintenance termination, end of life)."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            self._ensure_live(rec, "termination")
            rec.epoch += 1
            rec.state, rec.health, rec.health_description = "TERMINATED", "HEALTH_UNSPECIFIED", ""
            self._write_audit(rec, audit.TERMINATE, metadata={"terminateReason": reason})
            down = self._queue_hosts("down", rec.key)
        self._await(down)

    def kill_worker(
        self, node: str, worker: int = 0, *, project: str | None = None, zone: str | None = None
    ) -> None:
        """Kill the processes on one worker (the node stays READY: a crash, not an event)."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if not 0 <= worker < rec.n_workers:
                raise UsageError(
                    f"worker must be 0..{rec.n_workers - 1} for node {rec.name}, got {worker}"
                )
            effect = self._queue_hosts("kill_worker", rec.key, worker)
        self._await(effect)

    def host_fault(
        self, node: str, kind: str, worker: int = 0, params: Mapping[str, Any] | None = None, *,
        project: str | None = None, zone: str | None = None,
    ) -> None:
        """A fault of one worker's host that tpuwatch's environment checks see (the node stays
        READY+HEALTHY): see tpuwatch.sim.hostfaults for the kinds."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if not 0 <= worker < rec.n_workers:
                raise UsageError(
                    f"worker must be 0..{rec.n_workers - 1} for node {rec.name}, got {worker}"
                )
            if self.hosts is None:
                raise UsageError(f"{kind}: the simulator runs without workers (hosts)")
            effect = self._queue_hosts("host_fault", rec.key, worker, kind, dict(params or {}))
        self._await(effect)

    def hang(
        self,
        node: str,
        worker: int | None = None,
        *,
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        """Stop (SIGSTOP) the job's processes on one worker or all: no exit, no progress."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if worker is not None and not 0 <= worker < rec.n_workers:
                raise UsageError(
                    f"worker must be 0..{rec.n_workers - 1} for node {rec.name}, got {worker}"
                )
            effect = self._queue_hosts("hang", rec.key, worker)
        self._await(effect)

    def ssh_fault(
        self,
        node: str,
        worker: int = 0,
        mode: str = "hang",
        *,
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        """One worker's SSH server refuses connections, or accepts and never answers ("hang"),
        or serves again ("serve"), or cuts its open connections ("drop"); the API keeps saying
        READY/HEALTHY."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if not 0 <= worker < rec.n_workers:
                raise UsageError(f"node {node} has workers 0..{rec.n_workers - 1}, not {worker}")
            key = rec.key
        if self.hosts is None:
            raise UsageError("ssh faults need the simulated workers (the simulator runs without them)")
        self.hosts.ssh_fault(key, worker, mode)

    def os_login(self, user: str) -> None:
        """OS Login on: the workers accept only `user` (the OS Login POSIX name, not the local
        name), the project metadata says enable-oslogin=TRUE and the OS Login API answers with a
        login profile whose primary account is `user`, as Google does for a Google account."""
        if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", user):
            raise UsageError(f"os-login user {user!r} is not a POSIX user name (e.g. alice_example_com)")
        with self._lock:
            self.os_login_user = user
        if self.hosts is not None:
            self.hosts.set_user(user)

    def _ssh_hosts(self, what: str) -> HostsLike:
        if self.hosts is None:
            raise UsageError(f"{what}: the simulator runs without workers (hosts)")
        return self.hosts

    def keys_late(self, node: str, delay: float, *, project: str | None = None,
                  zone: str | None = None) -> None:
        """From the node's next boot on (a create, a heal), its workers refuse every SSH key for
        `delay` simulated seconds: the guest agent installs keys after sshd listens."""
        with self._lock:
            key = self._fault_node(node, project, zone).key
        self._ssh_hosts("keys-late").keys_late(key, delay)

    def rotate_host_keys(self, node: str, *, project: str | None = None, zone: str | None = None) -> None:
        """Every later heal of the node gives its workers new host keys (published as guest
        attributes); a recreate always does."""
        with self._lock:
            key = self._fault_node(node, project, zone).key
        self._ssh_hosts("rotate-host-keys").rotate_keys_on_reboot(key)

    def wrong_host_key(self, node: str, worker: int = 0, *, project: str | None = None,
                       zone: str | None = None) -> None:
        """One worker presents a host key that its guest attributes do not publish."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            if not 0 <= worker < rec.n_workers:
                raise UsageError(f"node {node} has workers 0..{rec.n_workers - 1}, not {worker}")
            key = rec.key
        self._ssh_hosts("wrong-host-key").wrong_host_key(key, worker)

    def host_keys(self, rec: NodeRec, worker: int) -> dict[str, str]:
        """The worker's host keys as its guest attributes (namespace hostkeys) publish them:
        key type -> base64; none while it has no running host (booting, deleted)."""
        if self.hosts is None or rec.state in ("CREATING", "DELETING"):
            return {}
        try:
            return self.hosts.published_host_keys(rec.key, worker)
        except UsageError:
            return {}

    def add_symptom(
        self,
        node: str,
        symptom_type: str = "EXECUTE_TIMED_OUT",
        *,
        worker: int = 0,
        details: str = "",
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        if symptom_type not in SYMPTOM_TYPES:
            raise UsageError(
                f"symptom type must be one of {', '.join(SYMPTOM_TYPES)}, got {symptom_type!r}"
            )
        with self._lock:
            rec = self._fault_node(node, project, zone)
            # Symptoms do not bump the epoch: they do not cancel pending transitions.
            rec.symptoms.append(
                SymptomRec(
                    symptom_type,
                    str(worker),
                    details or f"{symptom_type} on worker {worker}",
                    time.time_ns(),
                )
            )
            self._touch()

    def upcoming_maintenance(
        self,
        node: str,
        *,
        starts_in: float = 7 * 86400.0,
        window: float | None = None,
        heal_after: float | None = 1800.0,
        kind: str = "SCHEDULED",
        can_reschedule: bool = True,
        project: str | None = None,
        zone: str | None = None,
        notice: float = 0.0,
    ) -> None:
        """Announce maintenance `starts_in` from now (v2alpha1 upcoming_maintenance + audit entry);
        when the window opens, run it (healing after `heal_after`), after the workers' `notice`."""
        if kind not in ("SCHEDULED", "UNSCHEDULED"):
            raise UsageError(f"maintenance type must be SCHEDULED or UNSCHEDULED, got {kind!r}")
        with self._lock:
            rec = self._fault_node(node, project, zone)
            self._ensure_live(rec, "upcoming maintenance")
            now = time.time_ns()
            start = now + int(self.real(starts_in) * 1e9)
            end = start + int(
                self.real(window if window is not None else self.delays["maintenance_window"]) * 1e9
            )
            rec.upcoming = UpcomingRec(kind, "PENDING", can_reschedule, start, end, start)
            for w in range(rec.n_workers):  # a Compute Engine entry about each worker VM
                self._write_audit(
                    rec,
                    audit.UPCOMING_MAINTENANCE,
                    worker=w,
                    instance=worker_hostname(rec.id, w),
                    severity="INFO",
                    metadata={
                        "maintenanceStatus": "PENDING",
                        "type": kind,
                        "windowStartTime": rfc3339_ns(start),
                        "windowEndTime": rfc3339_ns(end),
                        "latestWindowStartTime": rfc3339_ns(start),
                        "canReschedule": can_reschedule,
                    },
                )
            key, ident = rec.key, rec.id
            self._touch()

        def begin() -> None:
            with self._lock:
                rec = self._nodes.get(key)
                if (
                    rec is None
                    or rec.id != ident
                    or rec.upcoming is None
                    or rec.upcoming.status != "PENDING"
                ):
                    return
                rec.upcoming.status = "ONGOING"
                name, project_, zone_ = rec.name, rec.project, rec.zone
            try:
                self.maintenance(name, heal_after=heal_after, project=project_, zone=zone_, notice=notice)
            except UsageError:
                pass  # the node went away or changed state before the window

        self.after(starts_in, begin)

    def simulate_maintenance_event(
        self, project: str, zone: str, name: str, worker_ids: list[str]
    ) -> OperationRec:
        with self._lock:
            rec = self._require(project, zone, name)
            if rec.state != "READY":
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"simulateMaintenanceEvent is not supported while in state {rec.state}",
                )
            worker = 0
            if worker_ids:
                try:
                    worker = int(worker_ids[0])
                except ValueError:
                    raise ApiError(
                        "INVALID_ARGUMENT",
                        f"worker id {worker_ids[0]!r} is not a worker of {rec.full_name}",
                    )
                if not 0 <= worker < rec.n_workers:
                    raise ApiError(
                        "INVALID_ARGUMENT", f"worker id {worker} is not a worker of {rec.full_name}"
                    )
            op = self._new_op(project, zone, "simulateMaintenanceEvent", rec.full_name, "v2alpha1")
        self._start_op_maintenance(op, name, worker)
        return self.get_operation(op.name)

    def _start_op_maintenance(self, op: OperationRec, name: str, worker: int | None) -> None:
        try:
            self.maintenance(
                name,
                heal_after=self.delays["simulated_maintenance_heal"],
                worker=worker,
                project=op.project,
                zone=op.zone,
                op_name=op.name,
            )
        except UsageError as exc:
            with self._lock:
                self._end_op(op.name, error=(9, str(exc)))

    def _check_manual_maintenance(self, rec: NodeRec) -> None:
        """Google documents starting maintenance by hand for any v4 or v5p, and for v5e or v6e
        slices of 8 chips (2x4) or more; elsewhere, and without a pending notice that may be
        rescheduled (canReschedule, PENDING), it is refused."""
        m = _ACCEL_RE.match(rec.spec.accelerator_type.strip().lower())
        family, size = (m.group(1), int(m.group(2))) if m else ("", 0)
        if not (family in ("v4", "v5p") or (family in ("v5litepod", "v6e") and size >= 8)):
            raise ApiError(
                "UNIMPLEMENTED",
                f"Manual maintenance is not supported for accelerator type {rec.spec.accelerator_type}",
            )
        if rec.upcoming is None or rec.upcoming.status != "PENDING":
            raise ApiError(
                "FAILED_PRECONDITION", f"There is no pending maintenance for {rec.full_name}"
            )
        if not rec.upcoming.can_reschedule:
            raise ApiError(
                "FAILED_PRECONDITION", f"The maintenance of {rec.full_name} cannot be rescheduled"
            )

    def perform_maintenance(self, project: str, zone: str, name: str) -> OperationRec:
        """v2alpha1 nodes.performMaintenance: start the node's pending maintenance now."""
        with self._lock:
            rec = self._require(project, zone, name)
            self._check_manual_maintenance(rec)
            assert rec.upcoming is not None
            rec.upcoming.status = "ONGOING"
            op = self._new_op(project, zone, "performMaintenance", rec.full_name, "v2alpha1")
        self._start_op_maintenance(op, name, None)
        return self.get_operation(op.name)

    def perform_maintenance_queued_resource(
        self, project: str, zone: str, name: str, node_names: list[str]
    ) -> OperationRec:
        """v2alpha1 queuedResources.performMaintenanceQueuedResource: start the pending
        maintenance of the named nodes of the queued resource (full node names)."""
        with self._lock:
            qr = self._queued.get(f"{project}/{zone}/{name}")
            if qr is None:
                self.check_zone(project, zone)
                raise ApiError(
                    "NOT_FOUND",
                    f"Resource 'projects/{project}/locations/{zone}/queuedResources/{name}' was not found",
                )
            if not node_names:
                raise ApiError("INVALID_ARGUMENT", "node_names must name at least one node")
            recs = []
            for full in node_names:
                short = full.rsplit("/", 1)[-1]
                rec = self._nodes.get(f"{project}/{zone}/{short}")
                if rec is None or rec.queued_resource != qr.full_name:
                    raise ApiError(
                        "INVALID_ARGUMENT", f"node {full!r} is not a node of {qr.full_name}"
                    )
                self._check_manual_maintenance(rec)
                recs.append(rec)
            for rec in recs:
                assert rec.upcoming is not None
                rec.upcoming.status = "ONGOING"
            op = self._new_op(
                project, zone, "performMaintenanceQueuedResource", qr.full_name, "v2alpha1",
                response_kind="queued_resource",
            )
            names, qr_key = [rec.name for rec in recs], f"{project}/{zone}/{name}"
        heal = self.delays["simulated_maintenance_heal"]
        for n in names:
            self.maintenance(n, heal_after=heal, project=project, zone=zone)

        def done() -> None:  # the operation's answer is the queued resource, once its nodes are back
            with self._lock:
                self._end_op(op.name, response=self._queued.get(qr_key))

        self.after(heal, done)
        return self.get_operation(op.name)

    def remove_node(
        self, node: str, *, project: str | None = None, zone: str | None = None
    ) -> None:
        """Someone deleted the node outside tpuwatch: it is gone at once."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            del self._nodes[rec.key]
            self._touch()
            effect = self._queue_hosts("destroy", rec.key)
        self._await(effect)

    # --- zone- and project-wide faults -------------------------------------------------

    def _until(self, duration: float | None) -> float:
        return float("inf") if duration is None else time.monotonic() + self.real(duration)

    def stockout(self, zone: str | None = None, duration: float | None = None) -> None:
        """Creates in `zone` ("*" = every zone) fail with the no-capacity error for a while."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._stockouts[z] = _Window(self._until(duration))
            self._touch()

    def reservation_shortfall(self, zone: str | None = None, duration: float | None = None) -> None:
        """Creates in `zone` ("*" = every zone) end with code 8 "Insufficient reserved capacity"."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._stockouts[z] = _Window(self._until(duration), {"reservation": True})
            self._touch()

    def quota(
        self, zone: str | None = None, duration: float | None = None, limit: str = ""
    ) -> None:
        """CreateNode in `zone` ("*" = every zone) is refused with RESOURCE_EXHAUSTED quota text."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._quota[z] = _Window(self._until(duration), {"limit": limit})

    def api_errors(
        self,
        rate: float,
        codes: Iterable[str] = ("UNAVAILABLE",),
        *,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Fail this fraction of API calls (seeded) with these codes; methods filter by substring."""
        window = self._error_window(rate, codes, "UNAVAILABLE", methods, duration)
        with self._lock:
            self._api_errors = window

    def lose_responses(
        self,
        rate: float,
        codes: Iterable[str] = ("DEADLINE_EXCEEDED",),
        *,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Serve this fraction of matching calls (seeded), then answer with an error: the call
        took effect but the client never hears so, as after a deadline or a dropped connection."""
        window = self._error_window(rate, codes, "DEADLINE_EXCEEDED", methods, duration)
        with self._lock:
            self._lost = window

    def _error_window(self, rate: float, codes: Iterable[str], default: str, methods: Iterable[str],
                      duration: float | None) -> _Window:
        """The window of an error-answering fault; UsageError for a code or rate it cannot use."""
        chosen = tuple(c.upper() for c in codes) or (default,)
        bad = [c for c in chosen if c not in INJECTABLE_CODES]
        if bad:
            raise UsageError(
                f"codes: {', '.join(bad)} cannot be injected; use {', '.join(sorted(INJECTABLE_CODES))}"
            )
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"rate must be between 0 and 1, got {rate!r}")
        return _Window(self._until(duration), {"rate": rate, "codes": chosen, "methods": tuple(methods)})

    def slow_calls(
        self,
        latency: float,
        *,
        jitter: float = 0.5,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Matching calls answer `latency` simulated seconds late, give or take `jitter` of it."""
        if not latency >= 0 or not 0 <= jitter <= 1:
            raise UsageError(f"latency must be >= 0 and jitter 0..1, got {latency!r}, {jitter!r}")
        with self._lock:
            self._slow = _Window(
                self._until(duration),
                {"latency": float(latency), "jitter": float(jitter), "methods": tuple(methods)},
            )

    def deny(self, *, methods: Iterable[str] = (), duration: float | None = None) -> None:
        """Every matching call fails PERMISSION_DENIED (all calls when methods is empty)."""
        with self._lock:
            self._denied = _Window(self._until(duration), {"methods": tuple(methods)})

    def clear_errors(self) -> None:
        """Lift injected API errors, lost responses, slow calls, denials, stockouts and quota errors."""
        with self._lock:
            self._api_errors = self._denied = self._lost = self._slow = None
            self._stockouts.clear()
            self._quota.clear()

    # --- direct creation (tests, scenarios) -------------------------------------------

    def add_node(
        self, name: str, spec: NodeSpec, *, project: str | None = None, zone: str | None = None
    ) -> NodeRec:
        """Create a node and boot its workers now, without an operation; returns it READY."""
        project, zone = project or self.project, zone or self.zone
        try:
            n_workers = worker_count(spec.accelerator_type)
        except ValueError as exc:
            raise UsageError(str(exc))
        if not NODE_NAME.match(name):
            raise UsageError(
                f"node name {name!r} must be lowercase letters, digits and hyphens, starting with a letter"
            )
        with self._lock:
            try:
                self.check_zone(project, zone)
            except ApiError as exc:
                raise UsageError(f"zone {zone!r}: {exc.message}")
            key = f"{project}/{zone}/{name}"
            if key in self._nodes:
                raise UsageError(f"node {name!r} already exists in {project}/{zone}")
            rec = NodeRec(
                project, zone, name, copy.deepcopy(spec), self._new_id(), time.time_ns(), n_workers
            )
            self._nodes[key] = rec
            ident, epoch = rec.id, rec.epoch
            self._touch()
        holder: dict[str, list[str]] = {}

        def boot() -> None:
            holder["ips"] = self._boot(key, str(ident), spec)

        try:
            self._sched.run_sync(boot, timeout=120)
        except BaseException:
            with self._lock:
                self._nodes.pop(key, None)
            raise
        with self._lock:
            rec = self._nodes[key]
            rec.ips = holder["ips"]
            if rec.epoch == epoch:
                rec.state, rec.health = "READY", "HEALTHY"
            self._touch()
            return copy.deepcopy(rec)

    def queue_resource(
        self,
        name: str,
        spec: NodeSpec,
        *,
        node_count: int = 0,
        node_prefix: str = "",
        project: str | None = None,
        zone: str | None = None,
    ) -> QueuedRec:
        """Queue a request for one node named like it or, with `node_count`, a multislice of
        `<node_prefix or name>-0` …, as a client would (v2); it provisions as any other does."""
        project, zone = project or self.project, zone or self.zone
        node: dict[str, Any] = {
            "acceleratorType": spec.accelerator_type,
            "runtimeVersion": spec.runtime_version,
            "labels": dict(spec.labels),
            "metadata": dict(spec.metadata),
        }
        node_spec: dict[str, Any] = {"parent": f"projects/{project}/locations/{zone}", "node": node}
        if node_count:
            node_spec["multisliceParams"] = {"nodeCount": node_count, "nodeIdPrefix": node_prefix}
        else:
            node_spec["nodeId"] = name
        request: dict[str, Any] = {"tpu": {"nodeSpec": [node_spec]}}
        if spec.spot:
            request["spot"] = {}
        try:
            self.create_queued_resource(
                project, zone, name, "" if node_count else name, spec, spec.spot,
                json.dumps(request), node_count=node_count, node_prefix=node_prefix,
            )
        except ApiError as exc:
            raise UsageError(f"queued resource {name!r}: {exc.message}")
        return self.get_queued_resource(project, zone, name)

    # --- queued resources ---------------------------------------------------------------

    def create_queued_resource(
        self,
        project: str,
        zone: str,
        qr_id: str,
        node_id: str,
        spec: NodeSpec,
        spot: bool,
        spec_json: str,
        *,
        api_version: str = "v2",
        node_count: int = 0,
        node_prefix: str = "",
    ) -> OperationRec:
        """Queue a request for one node (`node_id`) or, multislice, `node_count` nodes named
        `<node_prefix>-0` … (the prefix defaults to the request's id), provisioned all or none."""
        with self._lock:
            self.check_zone(project, zone)
            if not NODE_NAME.match(qr_id or ""):
                raise ApiError("INVALID_ARGUMENT", f"Invalid queued_resource_id {qr_id!r}")
            if node_count or node_prefix:  # node_id and these are one oneof in the request
                if node_count <= 1:
                    raise ApiError(
                        "INVALID_ARGUMENT",
                        f"multislice_params.node_count must be greater than 1, got {node_count}",
                    )
                node_prefix = node_prefix or qr_id
                if not MULTISLICE_PREFIX.match(node_prefix):
                    raise ApiError(
                        "INVALID_ARGUMENT",
                        f"Invalid multislice_params.node_id_prefix {node_prefix!r}: "
                        "it must match ^[A-Za-z0-9_.+%-]+$",
                    )
            node_ids = (
                [f"{node_prefix}-{i}" for i in range(node_count)] if node_count else [node_id]
            )
            for nid in node_ids:
                if not NODE_NAME.match(nid or ""):
                    raise ApiError(
                        "INVALID_ARGUMENT",
                        f"Invalid node_id {nid!r} in the queued resource's node spec",
                    )
            try:
                reservation = str(json.loads(spec_json or "{}").get("reservationName", ""))
            except ValueError:
                reservation = ""
            self._validate_spec(zone, spec, reservation)
            key = f"{project}/{zone}/{qr_id}"
            if key in self._queued:
                raise ApiError(
                    "ALREADY_EXISTS",
                    f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}' already exists",
                )
            qr = QueuedRec(
                project,
                zone,
                qr_id,
                "" if node_count else node_id,
                copy.deepcopy(spec),
                spot,
                time.time_ns(),
                spec_json=spec_json,
                api_version=api_version,
                node_count=node_count,
                node_prefix=node_prefix if node_count else "",
            )
            self._queued[key] = qr
            op = self._new_op(
                project, zone, "create", qr.full_name, api_version, response_kind="queued_resource"
            )
            self._end_op(op.name, response=qr)
            self._touch()
        self.after(self.delays["queued_accept"], lambda: self._qr_step(key, qr.create_ns))
        return copy.deepcopy(self._ops[op.name])

    def _qr_step(self, key: str, created: int) -> None:
        with self._lock:
            qr = self._queued.get(key)
            if qr is None or qr.create_ns != created:
                return
            if qr.state in ("CREATING", "WAITING_FOR_RESOURCES"):
                if self._in_stockout(qr.zone):
                    qr.state = "WAITING_FOR_RESOURCES"
                    self._touch()
                    self.after(self.delays["queued_accept"], lambda: self._qr_step(key, created))
                    return
                qr.state = "ACCEPTED"
                self._touch()
                self.after(self.delays["queued_accept"], lambda: self._qr_step(key, created))
                return
            if qr.state == "ACCEPTED":
                qr.state = "PROVISIONING"
                quota = self._quota_error(qr.zone, qr.spec)
                if quota is not None:
                    qr.state, qr.error = "FAILED", quota.message
                    self._touch()
                    return
                ops: list[str] = []
                for nid in qr.node_ids:
                    try:
                        ops.append(self.create_node(
                            qr.project,
                            qr.zone,
                            nid,
                            qr.spec,
                            qr.api_version,
                            queued_resource=qr.full_name,
                            multislice_node=qr.node_count > 0,
                        ).name)
                    except ApiError as exc:
                        self._qr_fail(qr, exc.message)
                        return
                self._touch()
                self.after(self.delays["create"] + 1, lambda: self._qr_check(key, created, ops))

    def _qr_fail(self, qr: QueuedRec, error: str) -> None:
        """All or nothing: a request that could not get every node gives back those it got."""
        qr.state, qr.error = "FAILED", error
        self._touch()
        for node in self._nodes_of(qr):
            if node.state != "DELETING":
                self.delete_node(node.project, node.zone, node.name)

    def _qr_check(self, key: str, created: int, op_names: list[str]) -> None:
        with self._lock:
            qr = self._queued.get(key)
            ops = [self._ops.get(name) for name in op_names]
            if qr is None or qr.create_ns != created or qr.state != "PROVISIONING" or None in ops:
                return
            failed = next((op for op in ops if op is not None and op.error), None)
            if failed is not None and failed.error is not None:
                self._qr_fail(qr, failed.error[1])
                return
            if not all(op is not None and op.done for op in ops):
                self.after(
                    self.delays["queued_accept"], lambda: self._qr_check(key, created, op_names)
                )
                return
            qr.state = "ACTIVE"
            self._touch()

    def get_queued_resource(self, project: str, zone: str, name: str) -> QueuedRec:
        with self._lock:
            self.check_zone(project, zone)
            qr = self._queued.get(f"{project}/{zone}/{name}")
            if qr is None:
                raise ApiError(
                    "NOT_FOUND",
                    f"Resource 'projects/{project}/locations/{zone}/queuedResources/{name}' was not found",
                )
            return copy.deepcopy(qr)

    def list_queued_resources(self, project: str, zone: str) -> list[QueuedRec]:
        with self._lock:
            if zone != "-":
                self.check_zone(project, zone)
            return [
                copy.deepcopy(q)
                for _, q in sorted(self._queued.items())
                if q.project == project and (zone == "-" or q.zone == zone)
            ]

    def delete_queued_resource(
        self, project: str, zone: str, name: str, force: bool, *, api_version: str = "v2"
    ) -> OperationRec:
        with self._lock:
            qr = self._queued.get(f"{project}/{zone}/{name}")
            if qr is None:
                self.check_zone(project, zone)
                raise ApiError(
                    "NOT_FOUND",
                    f"Resource 'projects/{project}/locations/{zone}/queuedResources/{name}' was not found",
                )
            nodes = self._nodes_of(qr)
            if nodes and not force:
                raise ApiError(
                    "FAILED_PRECONDITION",
                    f"Cannot delete queued resource {qr.full_name} while its node {nodes[0].name} exists; "
                    "delete the node first or use force",
                )
            qr.state = "DELETING"
            op = self._new_op(
                project, zone, "delete", qr.full_name, api_version, response_kind="empty"
            )
            key = f"{project}/{zone}/{name}"
            node_ids = {n.id for n in nodes}
            self._touch()
        for node in nodes:  # force: every node first, then the request
            if node.state != "DELETING":
                self.delete_node(project, zone, node.name)

        def finish() -> None:
            with self._lock:
                if any(n.id in node_ids for n in self._nodes.values()):
                    self.after(self.delays["delete"] / 2, finish)
                    return
                self._queued.pop(key, None)
                self._end_op(op.name)

        self.after(self.delays["delete"] / 2, finish)
        return copy.deepcopy(op)


# --- helpers ------------------------------------------------------------------------------


def parse_node_name(name: str) -> tuple[str, str, str]:
    m = re.match(r"^projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)$", name)
    if not m:
        raise ApiError(
            "INVALID_ARGUMENT",
            f"Invalid resource name {name!r}; expected projects/P/locations/Z/nodes/N",
        )
    return m.group(1), m.group(2), m.group(3)


_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _check_labels(labels: Mapping[str, Any]) -> None:
    if len(labels) > 64:
        raise ApiError("INVALID_ARGUMENT", f"a resource may have at most 64 labels, not {len(labels)}")
    for k, v in labels.items():
        if not _LABEL_KEY.match(str(k)) or not _LABEL_VALUE.match(str(v)):
            raise ApiError(
                "INVALID_ARGUMENT",
                f"Invalid label {k}={v}: keys start with a lowercase letter; keys and values hold "
                "lowercase letters, digits, _ and -, at most 63 characters",
            )


def _project_of(resource: str) -> str | None:
    m = re.match(r"^projects/([^/]+)", resource or "")
    return m.group(1) if m else None


def _method_selected(method: str, selectors: tuple[str, ...]) -> bool:
    return not selectors or any(s.lower() in method.lower() for s in selectors)


def _permission_for(method: str) -> str:
    short = method.rsplit("/", 1)[-1]
    if short == "ListLogEntries":
        return "logging.logEntries.list"
    verb = re.sub(r"(?<!^)(?=[A-Z])", "_", short).lower().split("_")
    resource = "nodes"
    if "queued" in verb:
        resource = "queuedResources"
    elif "operation" in verb or "operations" in verb:
        resource = "operations"
    return f"tpu.{resource}.{verb[0]}"


def _encode_token(key: tuple[int, int], fingerprint: str) -> str:
    import base64
    import hashlib
    import json

    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return base64.urlsafe_b64encode(json.dumps({"k": list(key), "f": digest}).encode()).decode()


def _decode_token(token: str, fingerprint: str) -> tuple[int, int]:
    import base64
    import hashlib
    import json

    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        key = (int(data["k"][0]), int(data["k"][1]))
        digest = data["f"]
    except Exception:
        raise ApiError("INVALID_ARGUMENT", f"page_token {token!r} is not valid")
    if digest != hashlib.sha256(fingerprint.encode()).hexdigest()[:16]:
        raise ApiError(
            "INVALID_ARGUMENT",
            "page_token does not match the filter, order or resource names of this request",
        )
    return key
