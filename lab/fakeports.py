"""tpuwatch's ports over the benchmark's BenchWorld: the TPU API, audit log, workers and checkpoints.

In-memory implementations of the protocols of `tpuwatch.ports` (and of what `tpuwatch.tick`
needs beyond them: `stop(node, workers)`, an OpenSSH-like `transport`, a port probe), so that
`tpuwatch.tick.Reconciler` runs unchanged against the simulated slice in virtual time. They
answer with the product's own value types (NodeSnapshot, WorkerProbe, OperationStatus,
LaunchResult, StopResult, ApiError) and count every call in the run's Meter: one TPU API call
per get/list/delete/create/operation read, one log read per audit-log query, one storage list
per checkpoint lookup and one ssh connection per worker touched.

This module holds no recovery rule and no loop: it only answers calls from what the BenchWorld holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from lab.clock import Signal
from lab.world import BenchWorld, Meter
from tpuwatch.cloud.errors import ApiError, Call
from tpuwatch.errors import NotFoundError
from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    Login,
    NodeSnapshot,
    OperationStatus,
    QueuedStatus,
    UpcomingMaintenance,
    WorkerEndpoint,
    WorkerProbe,
)
from tpuwatch.spec import OWNER_LABEL
from tpuwatch.workers.protocol import LaunchResult, StopResult

EPOCH = datetime(2025, 1, 1, tzinfo=timezone.utc)
ZONE = "us-central2-b"
PROJECT = "bench-project"


def at(t: float) -> datetime:
    """Virtual seconds -> the datetime the product sees."""
    return EPOCH + timedelta(seconds=t)


class BenchTpu:
    """The TPU API of one zone (tpuwatch.ports.TpuApi) over the BenchWorld's slices' nodes and
    operations: each slice is a node of its own name, with its workers numbered from 0."""

    def __init__(self, world: BenchWorld, meter: Meter, job: str, zone: str = ZONE) -> None:
        self.world = world
        self.meter = meter
        self.job = job
        self.zone = zone
        self.project = PROJECT
        self._key: dict[int, tuple[Any, ...]] = {}
        self._snap: dict[int, NodeSnapshot] = {}

    def snapshot(self, s: int = 0) -> NodeSnapshot | None:
        """Slice `s`'s node as the API would show it now (no call counted)."""
        w = self.world
        sl = w.slices[s]
        node = sl.node
        if node is None:
            return None
        up = w.upcoming if s == 0 else None
        key = (node.id, node.state, node.health, node.description, node.maintenance_time,
               (up.status, up.start) if up is not None else None)
        if key != self._key.get(s):
            self._key[s] = key
            um = None
            if up is not None:  # v2alpha1 upcomingMaintenance; canReschedule only while PENDING
                um = UpcomingMaintenance(up.type, up.status, up.can_reschedule and up.status == "PENDING",
                                         at(up.start), at(up.start + 3600.0), at(up.start))
            self._snap[s] = NodeSnapshot(
                name=sl.name, project=PROJECT, zone=self.zone, id=str(node.id), create_time=at(node.created),
                state=node.state, health=node.health, health_description=node.description,
                maintenance_time=at(node.maintenance_time) if node.maintenance_time is not None else None,
                workers=tuple(WorkerEndpoint(i, f"10.{s}.0.{i + 2}", "") for i in range(w.p.workers)),
                accelerator_type="v4-32", spot=True, labels={OWNER_LABEL: self.job}, upcoming_maintenance=um,
            )
        return self._snap[s]

    def worker_instances(self, node: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        return {}  # the benchmark's audit log has no worker-VM entries

    def take_notes(self) -> list[str]:
        return []

    def get_node(self, name: str) -> NodeSnapshot | None:
        self.meter.tpu += 1
        s = self.world.slice_of(name)
        return self.snapshot(s) if s is not None else None

    def list_nodes(self) -> list[NodeSnapshot]:
        self.meter.tpu += 1
        snaps = (self.snapshot(s) for s in range(len(self.world.slices)))
        return [snap for snap in snaps if snap is not None]

    def delete_node(self, name: str) -> str:
        self.meter.tpu += 1
        s = self.world.slice_of(name)
        op = self.world.delete_node(s) if s is not None else None
        if op is None:
            raise NotFoundError(f"no TPU named {name} in {self.zone}")
        return op.name

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        self.meter.tpu += 1
        s = self.world.slice_of(name)
        if s is None or self.world.slices[s].node is not None:
            call = Call("TPU API", "create_node", f"projects/{PROJECT}/locations/{self.zone}/nodes/{name}",
                        "tpu.nodes.create", "tpu.googleapis.com")
            raise ApiError(f"{call}: ALREADY_EXISTS: node {name} already exists", call=call, code="ALREADY_EXISTS")
        return self.world.create_node(s).name

    def perform_maintenance(self, name: str) -> str:
        """v2alpha1 performMaintenance (what `Lifecycle.start_maintenance` calls for a plain node)."""
        self.meter.tpu += 1
        op = self.world.perform_maintenance() if name == self.world.slices[0].name else None
        if op is None:
            call = Call("TPU API", "perform_maintenance", f"projects/{PROJECT}/locations/{self.zone}/nodes/{name}",
                        "tpu.nodes.performMaintenance", "tpu.googleapis.com")
            raise ApiError(f"{call}: FAILED_PRECONDITION: there is no pending maintenance for {name}", call=call,
                           code="FAILED_PRECONDITION")
        return op.name

    # A multislice job's queued resource (tpuwatch.cloud.tpu.lifecycle.QueuedApi)

    def queued_status(self, name: str, zone: str | None = None) -> QueuedStatus:
        self.meter.tpu += 1
        w = self.world
        state = w.queued if name == w.name else ""
        return QueuedStatus(f"projects/{PROJECT}/locations/{self.zone}/queuedResources/{name}", state,
                            node_count=len(w.slices) if len(w.slices) > 1 else 0)

    def delete_queued_resource(self, name: str, *, force: bool = True, zone: str | None = None) -> str:
        self.meter.tpu += 1
        op = self.world.delete_queued() if name == self.world.name and force else None
        if op is None:
            raise NotFoundError(f"no queued resource named {name} in {self.zone}")
        return op.name

    def create_queued_resource(self, qr_id: str, queued_resource: Mapping[str, Any],
                               zone: str | None = None) -> str:
        self.meter.tpu += 1
        op = self.world.create_queued() if qr_id == self.world.name else None
        if op is None:
            call = Call("TPU API", "create_queued_resource",
                        f"projects/{PROJECT}/locations/{self.zone}/queuedResources/{qr_id}",
                        "tpu.queuedResources.create", "tpu.googleapis.com")
            raise ApiError(f"{call}: ALREADY_EXISTS: queued resource {qr_id} already exists", call=call,
                           code="ALREADY_EXISTS")
        return op.name

    def perform_maintenance_queued_resource(self, name: str, node_names: list[str]) -> str:
        """performMaintenanceQueuedResource (what `Lifecycle.start_maintenance` calls for a node of a
        queued resource): start the announced maintenance of the named node now. The BenchWorld
        announces maintenance on slice 0 only, so a request naming another node is refused."""
        self.meter.tpu += 1
        w = self.world
        names = {n.rsplit("/", 1)[-1] for n in node_names}
        op = w.perform_maintenance() if name == w.name and names == {w.slices[0].name} else None
        if op is None:
            call = Call("TPU API", "perform_maintenance_queued_resource",
                        f"projects/{PROJECT}/locations/{self.zone}/queuedResources/{name}",
                        "tpu.queuedResources.performMaintenanceQueuedResource", "tpu.googleapis.com")
            raise ApiError(f"{call}: FAILED_PRECONDITION: there is no pending maintenance for {', '.join(node_names)}",
                           call=call, code="FAILED_PRECONDITION")
        return op.name

    def get_operation(self, name: str) -> OperationStatus:
        self.meter.tpu += 1
        op = self.world.ops[name]
        return OperationStatus(op.name, op.done, op.error_code, op.error_message)


class BenchAudit:
    """The system-event audit log (tpuwatch.ports.AuditLog): entries readable `audit_delay` after
    the event, after a cursor (the index of the next entry, as text)."""

    def __init__(self, world: BenchWorld, meter: Meter) -> None:
        self.world = world
        self.meter = meter

    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        self.meter.log += 1
        w = self.world
        recs, end = w.audit_since(int(cursor) if cursor else 0)
        names = set(nodes)
        events = [
            AuditEvent(time=at(r.time), kind="terminate" if r.kind == "terminate" else "restart", node=r.node,
                       worker=None, method=f"tpu.nodes.{r.kind}", reason=r.reason,
                       insert_id=f"{r.time:.3f}-{r.kind}",
                       resource_name=f"projects/{PROJECT}/locations/{ZONE}/nodes/{r.node}")
            for r in recs if r.node in names
        ]
        return events, str(end)

    def take_warnings(self) -> list[str]:
        return []


LOG_BANNER, LOG_LINE = 2000, 80  # bytes a launch prints, then per training step
# What Megascale logs on a multislice hang (the MXLA debugging workflow guide's example line)
MEGASCALE_LINE = ("E0926 17:26:32 Megascale hang detected: Timed out waiting for 4 graphs to complete at launch_id "
                  "13650. Already completed: 100. StepGloballyInProgress: true. Timeout: 5m")


class BenchWorkers:
    """The workers (tpuwatch.ports.Workers) over the BenchWorld's job: every slice's workers, numbered
    globally, or (`slice`) one slice's alone, numbered from 0, for a watcher of that slice only."""

    def __init__(self, world: BenchWorld, meter: Meter, slice: int | None = None,
                 rouse: Callable[[], None] | None = None) -> None:
        self.world = world
        self.meter = meter
        self.slice = slice
        # A followed attempt ended: besides `wake`, tell the clock (a watcher sharing it with
        # others sleeps until it is roused).
        self.rouse = rouse
        self._following: tuple[int, frozenset[tuple[int, int]], Callable[[], None]] | None = None  # (slice, worker)
        self._watching: Signal | None = None  # the world's change signal we are called on

    def login(self, node: NodeSnapshot) -> Login | None:
        return None

    def remember(self, login: Login) -> None:
        pass

    def take_notes(self) -> list[str]:
        return []

    def port_target(self, node: NodeSnapshot) -> tuple[str, int] | None:
        """As OpenSSH to the external IPs, port 22 (SshWorkers.port_target: worker 0, or of a
        multislice job the first worker of a slice that is down)."""
        candidates = [w for w in node.workers if not node.slice_of(w).usable] if node.slices else node.workers
        first = min(candidates, key=lambda w: w.index) if candidates else None
        host = first.address(False) if first is not None else ""
        return (host, 22) if host else None

    def places(self, node: NodeSnapshot) -> list[tuple[int, int, int]]:
        """(the job's worker number, the world's slice, the slice's own worker number) of each of
        `node`'s workers. The node may be a multislice job's view of fewer slices than the world
        has (a job that limps), its workers numbered over those alone, as the tick hands it."""
        if self.slice is not None:
            return [(e.index, self.slice, e.index) for e in node.workers]
        if not node.slices:
            return [(e.index, 0, e.index) for e in node.workers]
        out = []
        for e in node.workers:
            s = self.world.slice_of(e.node)
            if s is not None:
                out.append((e.index, s, e.worker_id))
        return out

    def follow_ends(self, node: NodeSnapshot, attempt: int, workers: Sequence[int],
                    wake: Callable[[], None]) -> None:
        """As SshWorkers' follow channels: `wake()` the moment `attempt` ends on one of `workers`
        (in virtual time, on the world's change). Hosts that go away are not an end (a channel
        that drops): only the next probe says what happened."""
        chosen = set(workers)
        where = frozenset((s, local) for i, s, local in self.places(node) if i in chosen)
        self._following = (attempt, where, wake)
        self._check()

    def unfollow(self) -> None:
        self._following = None

    def close(self) -> None:
        self.unfollow()

    def _check(self, _: object = None) -> None:
        """Wake the follower if its attempt ended; else look again at the world's next change."""
        if self._following is None:
            return
        attempt, where, wake = self._following
        slices = sorted({s for s, _ in where})
        if any((s, w) in where and no == attempt and state in ("exited", "absent")
               for s in slices for w, state, no, _ in self.world.probe_slice(s)):
            self._following = None  # a channel reports an end once
            wake()
            if self.rouse is not None:
                self.rouse()
            return
        changed = self.world.changed
        if self._watching is not changed:
            self._watching = changed
            changed.callbacks.append(self._check)

    def probe(self, node: NodeSnapshot) -> list[WorkerProbe]:
        self.meter.ssh += len(node.workers)
        if self.slice is not None:
            return [self._probe(w, state, no, code) for w, state, no, code in self.world.probe_slice(self.slice)]
        a = self.world.attempt
        notice = a.notice if a is not None else ""  # the relay's file beside that attempt
        seen: dict[int, list[tuple[int, str, int | None, int | None]]] = {}
        out = []
        for i, s, local in self.places(node):  # the node's workers, numbered as the node numbers them
            _, state, no, code = (seen[s] if s in seen else seen.setdefault(s, self.world.probe_slice(s)))[local]
            out.append(replace(self._probe(i, state, no, code),
                               notice=notice if a is not None and no == a.no and state != "unreachable" else ""))
        return out

    def _probe(self, worker: int, state: str, attempt: int | None, code: int | None) -> WorkerProbe:
        if state == "unreachable":
            return WorkerProbe(worker, "unreachable", attempt=attempt, exit_code=code)
        age, line = self._log(attempt)
        return WorkerProbe(worker, state, attempt=attempt, exit_code=code,  # type: ignore[arg-type]
                           log_bytes=self._log_bytes(attempt), log_age=age, log_match=line)

    def at(self, probes: Sequence[WorkerProbe], t: float) -> tuple[WorkerProbe, ...]:
        """`probes` as they would read at virtual time `t` if nothing else changed: the logs' ages
        move on (a job that trains keeps writing; a frozen one does not)."""
        return tuple(replace(p, log_age=self._log(p.attempt, t)[0]) if p.log_age is not None else p for p in probes)

    def _log(self, attempt: int | None, t: float | None = None) -> tuple[float | None, str]:
        """The log's age (whole seconds, as remote.sh gives it) and the Megascale hang line once
        it was logged: what the probe reports of attempt `attempt`'s log (now, or at `t`)."""
        w = self.world
        now = w.now if t is None else t
        if self.slice is not None:
            pr = w.slices[self.slice].procs
            if attempt is None or pr is None or pr.no != attempt:
                return None, ""
            a, t0 = pr.attempt, pr.t0  # processes waiting for their peers wrote only the banner
        else:
            a = w.attempt
            if attempt is None or a is None or a.no != attempt:
                return None, ""
            t0 = a.t0
        wrote = a.last_write(now) if a is not None else t0
        return float(int(now - wrote)), MEGASCALE_LINE if a is not None and a.megascale_at is not None else ""

    def _log_bytes(self, attempt: int | None) -> int | None:
        """The attempt log's size: a start-up banner, then a line per step; it stops growing
        when progress stops (a hang, a crash, the bug's exit)."""
        if self.slice is not None:  # processes still waiting for their peers print only the banner
            pr = self.world.slices[self.slice].procs
            if attempt is None or pr is None or pr.no != attempt:
                return None
            a = pr.attempt
            return LOG_BANNER + (LOG_LINE * (a.progress(self.world.now)[0] - a.s0) if a is not None else 0)
        a = self.world.attempt
        if attempt is None or a is None or a.no != attempt:
            return None
        step, _, _ = a.progress(self.world.now)
        return LOG_BANNER + LOG_LINE * (step - a.s0)

    def launch(self, node: NodeSnapshot, attempt: int, checkpoint: Checkpoint | None,
               clean: bool = False) -> Sequence[LaunchResult]:
        w = self.world
        n = len(node.workers)
        self.meter.ssh += n
        if self.slice is not None:
            return self._launch_slice(self.slice, n, attempt, clean)
        live = w.live()
        # the slices the node names, in its order: all of the job's, or those it limps on
        slices = list(dict.fromkeys(s for _, s, _ in self.places(node)))
        if len(slices) < max(1, len(node.slices)) or any(
                w.slices[s].node is None or w.slices[s].node.state != "READY" or not w.slices[s].hosts_up  # type: ignore[union-attr]
                for s in slices):
            return [LaunchResult(i, "unreachable", detail="connection timed out") for i in range(n)]
        if clean and live is not None and live.no < attempt:
            # remote.sh's TW_CLEAN_MS: an older attempt is stopped in the launch's connection.
            w.stop_job(slices)
            live = w.live()
        if live is not None:
            outcome = "running" if live.no == attempt else "busy"
            return [LaunchResult(i, outcome, attempt=live.no, pid=1000 + i) for i in range(n)]  # type: ignore[arg-type]
        if w.launch(attempt, checkpoint.step if checkpoint is not None else 0,
                    slices=slices if node.slices else None) is None:
            return [LaunchResult(i, "error", detail="the job is complete") for i in range(n)]
        return [LaunchResult(i, "launched", attempt=attempt, pid=1000 + i) for i in range(n)]

    def _launch_slice(self, s: int, n: int, attempt: int, clean: bool) -> Sequence[LaunchResult]:
        w = self.world
        sl = w.slices[s]
        if sl.node is None or sl.node.state != "READY" or not sl.hosts_up:
            return [LaunchResult(i, "unreachable", detail="connection timed out") for i in range(n)]
        live = sl.procs if sl.procs is not None and not sl.procs.ended else None
        if clean and live is not None and live.no < attempt:
            w.stop_job([s])
            live = None
        if live is not None:
            outcome = "running" if live.no == attempt else "busy"
            return [LaunchResult(i, outcome, attempt=live.no, pid=1000 + i) for i in range(n)]  # type: ignore[arg-type]
        if w.launch_slice(s, attempt) is None:
            return [LaunchResult(i, "error", detail="the job is complete") for i in range(n)]
        return [LaunchResult(i, "launched", attempt=attempt, pid=1000 + i) for i in range(n)]

    def stop(self, node: NodeSnapshot, workers: Sequence[int] | None = None, *,
             wait: bool = True) -> list[StopResult]:
        w = self.world
        which = list(workers) if workers is not None else [e.index for e in node.workers]
        self.meter.ssh += len(which)
        places = self.places(node)
        # The node's slices, each reached or not as a whole: the workers of a slice whose hosts
        # are down do not answer; the others are stopped (of a multislice job, only the slices
        # the node names: a job that limps is stopped on the slices it runs on).
        down = {s for _, s, _ in places if not w.slices[s].hosts_up}
        # A slice's processes run on every worker of the slice or on none; a stop that spares some
        # of them (the launch's cleanup of the others) leaves them running.
        hit = []
        for s in dict.fromkeys(s for _, s, _ in places if s not in down):
            mine = {local: i for i, t, local in places if t == s}
            running = {mine[wk] for wk, state, _, _ in w.probe_slice(s) if state == "running" and wk in mine}
            if running and running <= set(which):
                hit.append(s)
        stopped = bool(hit) and w.stop_job(hit)
        slice_of = {i: s for i, s, _ in places}
        return [StopResult(i, False, unreachable=True, detail="connection timed out") if slice_of.get(i) in down
                else StopResult(i, True, stopped=(2000 + i,) if stopped else ()) for i in which]


class BenchCheckpoints:
    """The checkpoint store (tpuwatch.ports.CheckpointStore): the newest complete save, with the
    time its save completed, as a gs:// listing gives it."""

    def __init__(self, world: BenchWorld, meter: Meter) -> None:
        self.world = world
        self.meter = meter

    def latest(self) -> Checkpoint | None:
        self.meter.storage += 1
        step, t = self.world.checkpoint()
        if step <= 0:
            return None
        return Checkpoint(f"gs://bench/ckpt/{step}", step, "orbax", at(t) if t is not None else None)
