"""Maintenance: the fault (UNHEALTHY_MAINTENANCE, REPAIRING, then healed or stuck), the
workers' notice before it, the heal and the multislice restart of the other slices, announced
upcoming maintenance, and the API calls that start maintenance (simulateMaintenanceEvent,
performMaintenance, performMaintenanceQueuedResource)."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable

from tpuwatch.errors import UsageError
from tpuwatch.sim import audit
from tpuwatch.sim.metadata import worker_hostname
from tpuwatch.sim.queued import QueuedResources
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
    NodeSpec,
    OperationRec,
    UpcomingRec,
    rfc3339_ns,
)
from tpuwatch.sim.scheduler import Timer
from tpuwatch.sim.shapes import manual_maintenance_allowed

STUCK_MODES = ("REPAIRING", "UNHEALTHY_MAINTENANCE", "UNKNOWN")
# Which metadata key gives the workers the last-minute notice of a maintenance: maintenance-event
# TERMINATE_ON_HOST_MAINTENANCE (Compute Engine fills it only for VMs set to migrate or with a
# GPU), or upcoming-maintenance turning ONGOING alone (where the Cloud TPU documentation points).
NOTICE_KEYS = ("MAINTENANCE-EVENT", "UPCOMING-MAINTENANCE")
# Codes the refuse-maintenance fault answers performMaintenance(QueuedResource) with, each with the
# text Google's API gives for that code in general (it documents none for this call).
MAINTENANCE_REFUSALS = {
    "UNIMPLEMENTED": "Manual maintenance is not supported for {node}",
    "FAILED_PRECONDITION": "There is no pending maintenance for {node}",
    "INVALID_ARGUMENT": "Request contains an invalid argument.",
    "NOT_FOUND": "Resource '{node}' was not found",
    "PERMISSION_DENIED": "Permission 'tpu.nodes.performMaintenance' denied on resource "
                         "'//tpu.googleapis.com/{node}' (or it may not exist).",
}


class Maintenance(QueuedResources):
    """Maintenance events, their heal, and the calls that start them."""

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
        notice_via: str = "MAINTENANCE-EVENT",
    ) -> None:
        """Start maintenance: job killed, SSH refused, health UNHEALTHY_MAINTENANCE then REPAIRING.

        With `heal_after` (simulated seconds) the node comes back READY+HEALTHY with
        "The TPU had a maintenance event at ..." and a restart entry; with `stuck` it never does
        (REPAIRING, UNHEALTHY_MAINTENANCE, or UNKNOWN after a failed repair). With `notice`
        (simulated seconds; Compute Engine gives about 60), the workers' metadata servers say
        `maintenance-event` TERMINATE_ON_HOST_MAINTENANCE that long before the host stops, or with
        `notice_via` UPCOMING-MAINTENANCE only `upcoming-maintenance` ONGOING (an unscheduled
        notice when none was announced).
        """
        if stuck is not None and stuck not in STUCK_MODES:
            raise UsageError(f"stuck must be one of {', '.join(STUCK_MODES)}, got {stuck!r}")
        if notice_via not in NOTICE_KEYS:
            raise UsageError(f"notice_via must be one of {', '.join(NOTICE_KEYS)}, got {notice_via!r}")
        if notice > 0:
            def stop() -> None:
                self.maintenance(node, heal_after=heal_after, stuck=stuck, worker=worker, reason=reason,
                                 project=project, zone=zone, op_name=op_name)
            self._give_notice(node, project, zone, "maintenance", notice, stop, via=notice_via)
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
                     then: Callable[[], None], via: str = "MAINTENANCE-EVENT") -> None:
        """Post the metadata server's notice of `what` (maintenance or preemption) now, and run
        `then` (the fault itself) `notice` simulated seconds later if the node is still the same.
        A maintenance's notice comes `via` maintenance-event or upcoming-maintenance ONGOING."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            self._ensure_live(rec, what)
            if what == "maintenance" and via == "UPCOMING-MAINTENANCE":
                if rec.upcoming is None:
                    now = time.time_ns()
                    end = now + int(self.real(self.delays["maintenance_window"]) * 1e9)
                    rec.upcoming = UpcomingRec("UNSCHEDULED", "ONGOING", False, now, end, now)
                rec.upcoming.status, rec.upcoming.can_reschedule = "ONGOING", False
            elif what == "maintenance":
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

    def replace_slice(
        self,
        node: str,
        *,
        hardware_after: float = 600.0,
        project: str | None = None,
        zone: str | None = None,
    ) -> None:
        """Google's multislice autorepair of a slice that failed for good (hardware): "Cloud TPU
        creates a new slice, waiting for hardware if needed", then restarts the others. The slice's
        node goes at once (a terminate entry, its workers gone, NOT_FOUND) while the request stays
        ACTIVE; `hardware_after` simulated seconds later a node of the same name and spec is
        created with a new id, and once it is READY the other slices restart."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            qr = self._queued_of(rec) if rec.multislice_node else None
            if qr is None or qr.state != "ACTIVE":
                raise UsageError(f"node {rec.name} is not a slice of an ACTIVE multislice queued resource")
            self._ensure_live(rec, "slice replacement")
            self._write_audit(rec, audit.TERMINATE, metadata={"terminateReason": "HARDWARE_FAILURE"})
            del self._nodes[rec.key]
            self._touch()
            gone = self._queue_hosts("destroy", rec.key)
            args = (rec.project, rec.zone, rec.name, copy.deepcopy(rec.spec), rec.api_version, qr.full_name,
                    f"{qr.project}/{qr.zone}/{qr.name}", qr.create_ns)
        self._await(gone)
        self.after(hardware_after, lambda: self._new_slice(*args))

    def _new_slice(self, project: str, zone: str, name: str, spec: NodeSpec, api_version: str,
                   qr_name: str, qr_key: str, created: int) -> None:
        """The replacement slice, created as the request's own; its peers restart once it is READY."""
        with self._lock:
            qr = self._queued.get(qr_key)
            if qr is None or qr.create_ns != created or qr.state != "ACTIVE":
                return  # the request was deleted (or replaced) meanwhile
        try:
            self.create_node(project, zone, name, spec, api_version, queued_resource=qr_name, multislice_node=True)
        except ApiError:
            return  # the name is taken again (a recreate of the whole request)
        with self._lock:
            ident = self._nodes[f"{project}/{zone}/{name}"].id

        def ready() -> None:
            with self._lock:
                rec = self._nodes.get(f"{project}/{zone}/{name}")
                if rec is None or rec.id != ident:
                    return
                if rec.state != "READY":
                    self.after(1.0, ready)
                    return
                down = self._restart_peers(rec)
                self._write_audit(rec, audit.RESTART, severity="INFO")
                self._touch()
            for timer in down:
                self._await(timer)

        self.after(self.delays["create"], ready)

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
        notice_via: str = "MAINTENANCE-EVENT",
    ) -> None:
        """Announce maintenance `starts_in` from now (v2alpha1 upcoming_maintenance + audit entry);
        when the window opens, run it (healing after `heal_after`), after the workers' `notice`
        (given `notice_via`, as World.maintenance does)."""
        if kind not in ("SCHEDULED", "UNSCHEDULED"):
            raise UsageError(f"maintenance type must be SCHEDULED or UNSCHEDULED, got {kind!r}")
        if notice_via not in NOTICE_KEYS:
            raise UsageError(f"notice_via must be one of {', '.join(NOTICE_KEYS)}, got {notice_via!r}")
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
                self.maintenance(name, heal_after=heal_after, project=project_, zone=zone_, notice=notice,
                                 notice_via=notice_via)
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

    def refuse_maintenance(self, node: str, code: str, *, project: str | None = None,
                           zone: str | None = None) -> None:
        """Fault: starting the node's maintenance by hand (performMaintenance, or through its
        queued resource) is refused with `code` (a MAINTENANCE_REFUSALS key; "" ends the fault)."""
        if code and code not in MAINTENANCE_REFUSALS:
            raise UsageError(f"code must be one of {', '.join(MAINTENANCE_REFUSALS)}, got {code!r}")
        with self._lock:
            rec = self._fault_node(node, project, zone)
            rec.maintenance_refusal = code

    def metadata_directories_fail(self, node: str, fails: bool = True, *, project: str | None = None,
                                  zone: str | None = None) -> None:
        """Fault: the node's workers' metadata servers answer every directory query (a listing,
        or ?recursive=true) with 503, each key still served; `fails` False ends it. A new node
        (a recreate) starts without it."""
        with self._lock:
            rec = self._fault_node(node, project, zone)
            rec.metadata_dirs_fail = fails
            self._touch()

    def _check_manual_maintenance(self, rec: NodeRec) -> None:
        """Google documents starting maintenance by hand for any v4 or v5p, and for v5e or v6e
        slices of 8 chips (2x4) or more; elsewhere, and without a pending notice that may be
        rescheduled (canReschedule, PENDING), it is refused. The refuse-maintenance fault
        refuses it with the code it names."""
        if rec.maintenance_refusal:
            code = rec.maintenance_refusal
            raise ApiError(code, MAINTENANCE_REFUSALS[code].format(node=rec.full_name))
        if not manual_maintenance_allowed(rec.spec.accelerator_type):
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
        maintenance of the named nodes of the queued resource.

        Nodes go by their short names (node ids), as gcloud's `--node-names` example and
        getMaintenanceInfo's "unqualified node name" have them; Google does not say what it
        answers to a full resource name, so it is refused as a node the request does not hold
        (INVALID_ARGUMENT), the strictest reading."""
        with self._lock:
            qr = self._require_queued(project, zone, name)
            if not node_names:
                raise ApiError("INVALID_ARGUMENT", "node_names must name at least one node")
            recs = []
            for short in node_names:
                rec = None if "/" in short else self._nodes.get(f"{project}/{zone}/{short}")
                if rec is None or rec.queued_resource != qr.full_name:
                    raise ApiError(
                        "INVALID_ARGUMENT", f"node {short!r} is not a node of {qr.full_name}"
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
