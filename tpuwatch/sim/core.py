"""The World's state and the pieces every part of it shares.

`WorldCore` holds the state of the whole simulated cloud under one lock (nodes, queued
resources, operations, audit entries, call counters, fault windows), the scheduler thread that
runs timed transitions and host effects, names and zones, snapshots for readers, operations,
and the effects on the simulated hosts. The World's other parts (`calls.py`, `auditlog.py`,
`nodes.py`, `queued.py`, `maintenance.py`, `nodefaults.py`, and for Compute Engine
`instances.py`, `migs.py`, `cefaults.py`) are mixins stacked on it, each on
the one before it: they are not separate objects because they act on the same records under the
same lock in one step (a preemption marks the node, writes its audit entry and suspends its
queued resource under one hold of the lock), and each later part calls the earlier ones.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from tpuwatch.errors import UsageError
from tpuwatch.sim import audit, metadata
from tpuwatch.sim.cerecords import (
    ComputeOpRec,
    InstanceRec,
    MigRec,
    PolicyRec,
    ResizeRec,
    TemplateRec,
)
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
    NodeSpec,
    OperationRec,
    QueuedRec,
    Window,
    parse_node_name,
)
from tpuwatch.sim.scheduler import Scheduler, Timer
from tpuwatch.sim.shapes import (
    ZONE_RE,
    host_shape,
    worker_count,
)

log = logging.getLogger(__name__)


# The World as a predicate of `wait_for` sees it (the caller's own class, with every part).
W = TypeVar("W", bound="WorldCore")

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
    # a Compute Engine resize request waiting for capacity fails after this long
    "resize_timeout": 3600.0,
    # a MIG that repairs (defaultActionOnFailure REPAIR) begins recreating a failed VM this long after
    "mig_repair": 30.0,
}


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
    def repair(self, node_key: str) -> None: ...
    def ssh_fault(self, node_key: str, worker: int, mode: str) -> None: ...
    def keys_late(self, node_key: str, delay: float) -> None: ...
    def rotate_keys_on_reboot(self, node_key: str, on: bool = True) -> None: ...
    def wrong_host_key(self, node_key: str, worker: int) -> None: ...
    def published_host_keys(self, node_key: str, worker: int) -> dict[str, str]: ...

    def set_user(self, user: str) -> None: ...


class WorldCore:
    """The shared state and helpers of the simulated cloud; see `world.World`."""

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

        # Every part's state is declared here, typed once and guarded by this one lock.
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
        # Compute Engine (instances.py, migs.py): instances by "project/zone/instances/name",
        # operations by "project/scope/name", templates and policies by path, MIGs by key,
        # resize requests by "project/zone/mig/name"
        self._instances: dict[str, InstanceRec] = {}
        self._held_run_ends: set[str] = set()  # instance keys whose run ends when a test says (cefaults.py)
        self._cops: dict[str, ComputeOpRec] = {}
        self._templates: dict[str, TemplateRec] = {}
        self._policies: dict[str, PolicyRec] = {}
        self._migs: dict[str, MigRec] = {}
        # a project's commonInstanceMetadata once projects.setCommonInstanceMetadata set it
        # (before that, the REST face's own: the hosts' client key, guest attributes on)
        self._project_metadata: dict[str, dict[str, str]] = {}
        self._resizes: dict[str, ResizeRec] = {}
        self._fake_ips: dict[str, int] = {}  # node key -> address slot when there are no hosts
        self.host_errors: list[str] = []  # effects on the simulated hosts that failed
        # the windows and counters of calls.py
        self._stockouts: dict[str, Window] = {}  # zone -> window
        self._quota: dict[str, Window] = {}  # zone or "*" -> window
        self._api_errors: Window | None = None
        self._lost: Window | None = None  # calls served, then failed: the response is lost
        self._slow: Window | None = None  # calls answered late
        self._denied: Window | None = None
        self.calls: Counter[str] = Counter()
        self.list_filters: list[tuple[str, str]] = []  # (list method, its filter) of each list served
        self._call_times: dict[str, deque[tuple[float, str]]] = {}
        self.injected: Counter[str] = Counter()  # method -> calls failed by injection
        self.lost: Counter[str] = Counter()  # method -> calls served whose answer was an error
        # OS Login (the os-login fault): the POSIX name the workers know the user by, and the
        # public keys imported into the user's login profile (gcloud imports its key once)
        self.os_login_user: str | None = None
        self.os_login_keys: list[str] = []
        self._started = False

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
        self: W, predicate: Callable[[W], bool], timeout: float = 10.0, what: str = ""
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

        def ok(w: WorldCore) -> bool:
            n = w._nodes.get(key)
            return n is not None and n.state == state and (health is None or n.health == health)

        self.wait_for(ok, timeout, f"node {name} {state}{'/' + health if health else ''}")
        return self.node(name, project=project, zone=zone)

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

    def _ensure_live(self, rec: NodeRec, what: str) -> None:
        if rec.state in ("CREATING", "DELETING", "STOPPED", "STOPPING", "PREEMPTED", "TERMINATED"):
            raise UsageError(f"cannot inject {what} into node {rec.name}: it is {rec.state}")

    def _new_id(self) -> int:
        return self._rng.randrange(10**17, 9 * 10**18)

    def _op_name(self, project: str, zone: str) -> str:
        return f"projects/{project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{self._rng.getrandbits(64):016x}"

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
            notice = None if rec.upcoming is None else rec.upcoming.notice()
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
                tpu_env=self._tpu_env(rec, worker),
                directories_fail=rec.metadata_dirs_fail,
            )

    def _tpu_env(self, rec: NodeRec, worker: int) -> dict[str, str]:
        """The runtime's settings on a worker (a few of the many a TPU VM has). A node made by a
        multislice queued resource also gets how to join its slices, as JAX's cloud_tpu_cluster.py
        reads them: the coordinator is the host with process id 0 (slice 0's worker 0), and a
        slice's id is its index in the request. Slices created one by one get none. Call with
        the lock held."""
        env = {"ACCELERATOR_TYPE": rec.spec.accelerator_type, "NODE_ID": rec.name, "WORKER_ID": str(worker),
               "ZONE": rec.zone}
        qr = self._queued.get("/".join(rec.queued_resource.split("/")[1::2])) if rec.multislice_node else None
        if qr is None or qr.full_name != rec.queued_resource or rec.name not in qr.node_ids:
            return env
        first = self._nodes.get(f"{qr.project}/{qr.zone}/{qr.node_ids[0]}")
        if first is not None and first.ips:
            env["MEGASCALE_COORDINATOR_ADDRESS"] = first.ips[0]
        env["MEGASCALE_NUM_SLICES"] = str(qr.node_count)
        env["MEGASCALE_SLICE_ID"] = str(qr.node_ids.index(rec.name))
        return env

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

    def _until(self, duration: float | None) -> float:
        return float("inf") if duration is None else time.monotonic() + self.real(duration)
