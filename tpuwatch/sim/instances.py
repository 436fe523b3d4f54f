"""Compute Engine instances: TPU VMs made through Compute Engine (machine types tpu7x-standard-4t,
ct6e-standard-4t, ct5p-hightpu-4t, ...), each one simulated host with its own sshd and metadata
server, and the zone operations their calls return.

Lifecycle as the compute v1 API shows it: insert (PROVISIONING -> STAGING -> RUNNING, or the
operation ends ZONE_RESOURCE_POOL_EXHAUSTED in a stockout and the instance is gone), stop
(STOPPING -> TERMINATED: Compute Engine calls a stopped VM TERMINATED), start (refused for a Spot
VM a preemption stopped: the Cloud TPU Spot page says delete and recreate it), delete,
setLabels / setMetadata (with fingerprints, refused 412 on a stale one), performMaintenance,
simulateMaintenanceEvent, reportHostAsFaulty and guest attributes (host keys under `hostkeys/`).
Faults (host error, maintenance, preemption) are in cefaults.py, MIGs in migs.py.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.sim import audit
from tpuwatch.sim import metadata as md
from tpuwatch.sim.cerecords import (
    HOSTNAME,
    NAME,
    PROVISIONING_MODELS,
    ComputeOpRec,
    InstanceRec,
    chips_of,
    fingerprint,
)
from tpuwatch.sim.logfilter import parse_rfc3339_ns
from tpuwatch.sim.nodefaults import NodeFaults
from tpuwatch.sim.records import ApiError

log = logging.getLogger(__name__)

# What instance/upcoming-maintenance says with nothing scheduled, by InstanceRec.no_notice.
NO_NOTICE_TEXT = {"error": json.dumps(md.NO_NOTICE, sort_keys=True), "empty": "{}", "none": "NONE"}
STOCKOUT_CODE = "ZONE_RESOURCE_POOL_EXHAUSTED"
# InstancesReportHostAsFaultyRequest.FaultReason.behavior, as compute v1 lists it
FAULT_BEHAVIORS = frozenset({"BEHAVIOR_UNSPECIFIED", "CHIP_ERROR", "PERFORMANCE", "SILENT_DATA_CORRUPTION",
                             "UNRECOVERABLE_GPU_ERROR"})


class ComputeError(ApiError):
    """An error a Compute Engine call answers with: a google.rpc code name (its HTTP status), the
    text, and Compute Engine's `reason` (notFound, alreadyExists, conditionNotMet, ...)."""

    def __init__(self, code: str, message: str, reason: str = "") -> None:
        super().__init__(code, message)
        self.reason = reason


def not_found(path: str) -> ComputeError:
    return ComputeError("NOT_FOUND", f"The resource '{path}' was not found", "notFound")


def _ns_of(seconds: float) -> int:
    return int(seconds * 1e9)


class Instances(NodeFaults):
    """Compute Engine instances and zone operations."""

    # ---- reads -------------------------------------------------------------------------------

    def _ikey(self, project: str | None, zone: str | None, name: str) -> str:
        return f"{project or self.project}/{zone or self.zone}/instances/{name}"

    def _require_instance(self, project: str, zone: str, name: str) -> InstanceRec:
        """The instance, or Compute Engine's 404. Call with the lock held."""
        self.check_compute_zone(project, zone)
        rec = self._instances.get(self._ikey(project, zone, name))
        if rec is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return rec

    def check_compute_zone(self, project: str, zone: str) -> None:
        try:
            self.check_zone(project, zone)
        except ApiError:
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'zone': '{zone}'. Unknown zone.",
                               "invalid")

    def _fault_instance(self, name: str, project: str | None, zone: str | None) -> InstanceRec:
        rec = self._instances.get(self._ikey(project, zone, name))
        if rec is None:
            known = ", ".join(sorted(r.name for r in self._instances.values())) or "none"
            raise UsageError(f"no simulated instance {name!r} in {project or self.project}/{zone or self.zone} "
                             f"(instances: {known})")
        return rec

    def get_instance(self, project: str, zone: str, name: str) -> InstanceRec:
        with self._lock:
            return copy.deepcopy(self._require_instance(project, zone, name))

    def list_instances(self, project: str, zone: str | None = None) -> list[InstanceRec]:
        """The project's instances in `zone` (None: every zone), by zone then name."""
        with self._lock:
            if zone is not None:
                self.check_compute_zone(project, zone)
            return [copy.deepcopy(r) for _, r in sorted(self._instances.items())
                    if r.project == project and (zone is None or r.zone == zone)]

    def instance(self, name: str, *, project: str | None = None, zone: str | None = None) -> InstanceRec:
        """A snapshot of one instance (for tests and the control service)."""
        with self._lock:
            return copy.deepcopy(self._fault_instance(name, project, zone))

    def instances(self) -> list[InstanceRec]:
        with self._lock:
            return [copy.deepcopy(r) for _, r in sorted(self._instances.items())]

    def wait_instance(self, name: str, status: str = "RUNNING", *, timeout: float = 10.0,
                      project: str | None = None, zone: str | None = None) -> InstanceRec:
        """Block until the instance shows `status`; return its snapshot."""
        key = self._ikey(project, zone, name)

        def ok(w: Instances) -> bool:
            r = w._instances.get(key)
            return r is not None and r.status == status

        self.wait_for(ok, timeout, f"instance {name} {status}")
        return self.instance(name, project=project, zone=zone)

    def instance_metadata(self, node_key: str, worker: int) -> md.Instance | None:
        """A Compute Engine instance's metadata server (its key has four parts), else a TPU
        node worker's."""
        parts = node_key.split("/")
        if len(parts) != 4 or parts[2] != "instances":
            return super().instance_metadata(node_key, worker)
        with self._lock:
            rec = self._instances.get(node_key)
            if rec is None or worker != 0:
                return None
            notice = None if rec.upcoming is None else rec.upcoming.notice()
            return md.Instance(
                project=rec.project, zone=rec.zone, worker=0, instance_id=str(rec.id), name=rec.name,
                attributes=dict(rec.metadata), preempted=rec.preempted or rec.preempt_notice,
                upcoming_maintenance=notice, ip=rec.ip, maintenance_event=rec.maintenance_event,
                no_notice=NO_NOTICE_TEXT[rec.no_notice],
            )

    def instance_host_keys(self, rec: InstanceRec) -> dict[str, str]:
        """The instance's host keys as its guest attributes publish them; none without a host."""
        if self.hosts is None or rec.status in ("PROVISIONING", "STAGING"):
            return {}
        try:
            return self.hosts.published_host_keys(rec.key, 0)
        except UsageError:
            return {}

    # ---- operations --------------------------------------------------------------------------

    def _new_cop(self, project: str, scope: str, op_type: str, target: str, target_id: int,
                 *, prefix: str = "operation", done: bool = False) -> ComputeOpRec:
        """A new operation (its name `<prefix>-<ms>-<hex>`, as Compute Engine names them). Call with
        the lock held."""
        now = time.time_ns()
        bits = f"{self._rng.getrandbits(128):032x}"
        name = f"{prefix}-{now // 1_000_000}-{bits[:13]}-{bits[13:21]}-{bits[21:29]}"
        op = ComputeOpRec(name, self._new_id(), project, scope, op_type, target, target_id, now)
        if done:
            op.status, op.end_ns = "DONE", now
        self._cops[op.key] = op
        self._touch()
        return op

    def _end_cop(self, key: str, errors: list[tuple[str, str]] | None = None, http_status: int = 0,
                 http_message: str = "") -> None:
        op = self._cops.get(key)
        if op is None or op.done:
            return
        op.status, op.end_ns = "DONE", time.time_ns()
        if errors:
            op.errors = list(errors)
            op.http_status, op.http_message = http_status or 400, http_message or "BAD REQUEST"
        self._touch()

    def get_compute_operation(self, project: str, scope: str, name: str) -> ComputeOpRec:
        with self._lock:
            op = self._cops.get(f"{project}/{scope}/{name}")
            if op is None:
                raise not_found(f"projects/{project}/{scope}/operations/{name}")
            return copy.deepcopy(op)

    def wait_compute_operation(self, project: str, scope: str, name: str) -> ComputeOpRec:
        """operations.wait: the operation once DONE, or as it is after about two minutes (the
        API's limit, in simulated time here), whichever comes first."""
        key = f"{project}/{scope}/{name}"
        self.get_compute_operation(project, scope, name)
        try:
            self.wait_for(lambda w: key not in w._cops or w._cops[key].done, self.real(120.0),
                          f"operation {name}")
        except TimeoutError:
            pass
        return self.get_compute_operation(project, scope, name)

    def list_compute_operations(self, project: str, scope: str) -> list[ComputeOpRec]:
        with self._lock:
            return sorted((copy.deepcopy(o) for o in self._cops.values()
                           if o.project == project and o.scope == scope), key=lambda o: o.insert_ns)

    def _system_event(self, rec: InstanceRec, method: str, message: str = "",
                      prefix: str = "systemevent") -> None:
        """A Compute Engine system event: a done zone operation whose type is the method, and the
        audit entry that names it. Call with the lock held."""
        op = self._new_cop(rec.project, f"zones/{rec.zone}", method, rec.path, rec.id, prefix=prefix,
                           done=True)
        self._write_instance_audit(rec, method, message, op.name)

    def _write_instance_audit(self, rec: InstanceRec, method: str, message: str = "",
                              operation: str = "") -> None:
        ts = time.time_ns()
        self._audit.append(audit.AuditRecord(
            seq=len(self._audit), time_ns=ts, receive_ns=ts + int(self.real(self.log_latency) * 1e9),
            project=rec.project, zone=rec.zone, node="", worker=None, method=method,
            insert_id=self._new_insert_id(), severity="INFO" if method.endswith("upcomingMaintenance") else "NOTICE",
            instance=rec.name, instance_id=str(rec.id), status_message=message, operation_id=operation,
        ))
        self._touch()

    # ---- creating ----------------------------------------------------------------------------

    def instance_from_body(self, project: str, zone: str, body: Mapping[str, Any]) -> InstanceRec:
        """An InstanceRec (not yet stored) from an Instance as JSON; Compute Engine's 400 for a
        field it cannot take."""
        name = str(body.get("name") or "")
        if not NAME.match(name):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'. Must be "
                               "a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", "invalid")
        machine = str(body.get("machineType") or "")
        short = machine.rsplit("/", 1)[-1]
        if machine and "/machineTypes/" not in machine:  # a bare name is for templates only
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.machineType': '{machine}'. "
                               "The URL is malformed.", "invalid")
        if "/zones/" in machine and f"/zones/{zone}/" not in machine and not machine.startswith(f"zones/{zone}/"):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.machineType': '{machine}'. "
                               "Machine type must be in the same zone as the instance.", "invalid")
        try:
            chips_of(short)
        except ValueError as exc:
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.machineType': "
                               f"'{machine}'. {exc} (the simulator serves TPU VMs only)", "invalid")
        sched = dict(body.get("scheduling") or {})
        model = str(sched.get("provisioningModel") or ("SPOT" if sched.get("preemptible") else "STANDARD"))
        if model not in PROVISIONING_MODELS:
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.scheduling.provisioningModel': "
                               f"'{model}'.", "invalid")
        on_maint = str(sched.get("onHostMaintenance") or "TERMINATE")
        if on_maint != "TERMINATE":
            raise ComputeError("INVALID_ARGUMENT", "Instances with guest accelerators do not support live "
                               "migration. Set onHostMaintenance to TERMINATE.", "invalid")
        restart = sched.get("automaticRestart")
        max_run = (sched.get("maxRunDuration") or {}).get("seconds")
        notice = sched.get("preemptionNoticeDuration")
        if notice is not None and model != "SPOT":
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.scheduling."
                               "preemptionNoticeDuration': it is for Spot VMs only.", "invalid")
        ends = str(sched.get("terminationTime") or "")
        if ends:
            try:
                passed = parse_rfc3339_ns(ends) <= time.time_ns()
            except ValueError:
                passed = True
            if passed:  # a time that has passed, or no time at all
                raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.scheduling.terminationTime': "
                                   f"'{ends}'. It must be a time in the future.", "invalid")
        host = str(body.get("hostname") or "")
        if host and not HOSTNAME.match(host):
            # Google: "The specified hostname must be RFC1035 compliant"; a custom one is fully
            # qualified (two labels or more), 253 characters at most
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.hostname': '{host}'. "
                               "Hostname must be RFC1035 compliant and fully qualified.", "invalid")
        meta = {str(i.get("key")): str(i.get("value", "")) for i in (body.get("metadata") or {}).get("items") or []}
        disks = body.get("disks") or [{}]
        image = str(((disks[0] or {}).get("initializeParams") or {}).get("sourceImage") or "")
        nics = body.get("networkInterfaces") or [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]
        rec = InstanceRec(
            project, zone, name, 0, 0, short,
            provisioning_model=model,
            termination_action=str(sched.get("instanceTerminationAction") or ("STOP" if model == "SPOT" else "")),
            # Spot VMs do not restart automatically; every other model does by default
            automatic_restart=bool(restart) if restart is not None else model != "SPOT",
            on_host_maintenance=on_maint,
            max_run_duration=float(max_run) if max_run is not None else None,
            preemption_notice=(float(notice.get("seconds") or 0) + float(notice.get("nanos") or 0) / 1e9
                               if notice is not None else None),
            termination_time=ends,
            labels={str(k): str(v) for k, v in (body.get("labels") or {}).items()},
            metadata=meta,
            description=str(body.get("description") or ""),
            hostname=host,
            image=image,
            resource_policies=[str(p) for p in body.get("resourcePolicies") or []],
            nat_ip="nat" if (nics[0] or {}).get("accessConfigs") else "",
        )
        if model in ("SPOT", "FLEX_START") and rec.termination_action not in ("STOP", "DELETE"):
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.scheduling."
                               "instanceTerminationAction': it must be STOP or DELETE.", "invalid")
        return rec

    def insert_instance(self, project: str, zone: str, body: Mapping[str, Any]) -> ComputeOpRec:
        """instances.insert: PROVISIONING now, STAGING, then RUNNING when the operation ends; in
        a stockout the operation ends ZONE_RESOURCE_POOL_EXHAUSTED and the instance is gone. In
        a quota window (fault `quota`) the insert itself is refused: 403 quotaExceeded; in a
        stockout `at_insert`, 503 ZONE_RESOURCE_POOL_EXHAUSTED."""
        with self._lock:
            self.check_compute_zone(project, zone)
            rec = self.instance_from_body(project, zone, body)
            quota = self.compute_quota_text(zone, rec.machine_type, rec.provisioning_model == "SPOT")
            if quota:
                raise ComputeError("RESOURCE_EXHAUSTED", quota, "quotaExceeded")
            if self.stockout_at_insert(zone):
                raise ComputeError("UNAVAILABLE", self.zone_exhausted_text(project, zone), STOCKOUT_CODE)
            self._store_new(rec)
            op = self._new_cop(project, f"zones/{zone}", "insert", rec.path, rec.id)
            self._provision(rec, op.key)
            return copy.deepcopy(op)

    def _store_new(self, rec: InstanceRec) -> None:
        """Give a new instance its id and store it; 409 when the name is taken. Lock held."""
        if rec.key in self._instances:
            raise ComputeError("ALREADY_EXISTS", f"The resource '{rec.path}' already exists", "alreadyExists")
        rec.id, rec.create_ns, rec.status = self._new_id(), time.time_ns(), "PROVISIONING"
        self._instances[rec.key] = rec
        self._touch()

    def _provision(self, rec: InstanceRec, op_key: str = "") -> None:
        """Bring a stored PROVISIONING instance up after delays["create"] (boot its host), or fail
        it in a stockout, ending `op_key` either way. Lock held."""
        key, ident, epoch = rec.key, rec.id, rec.epoch
        if self._in_stockout(rec.zone):
            def fail() -> None:
                with self._lock:
                    r = self._instances.get(key)
                    if r is not None and r.id == ident:
                        del self._instances[key]
                        self._instance_gone(r)
                    self._end_cop(op_key, [(STOCKOUT_CODE, self.zone_exhausted_text(rec.project, rec.zone))],
                                  503, "SERVICE UNAVAILABLE")
            self.after(self.delays["create_failed"], fail)
            return
        self.after(self.delays["create"] / 2, lambda: self._set_instance_status(key, ident, epoch, "STAGING"))
        self.after(self.delays["create"], lambda: self._finish_provision(key, ident, epoch, op_key))

    def zone_exhausted_text(self, project: str, zone: str) -> str:
        return (f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
                "fulfill the request.  Try a different zone, or try again later.")

    def _set_instance_status(self, key: str, ident: int, epoch: int, status: str) -> None:
        with self._lock:
            r = self._instances.get(key)
            if r is not None and r.id == ident and r.epoch == epoch:
                r.status = status
                self._touch()

    def _finish_provision(self, key: str, ident: int, epoch: int, op_key: str) -> None:
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.epoch != epoch:
                self._end_cop(op_key)
                return
            snapshot = copy.deepcopy(r)
        try:
            ip = self._boot_instance(snapshot)
        except Exception as exc:
            log.exception("simulated hosts: boot %s failed", key)
            self.host_errors.append(f"boot {key}: {exc}")
            with self._lock:
                r = self._instances.pop(key, None)
                if r is not None:
                    self._instance_gone(r)
                self._end_cop(op_key, [("INTERNAL_ERROR", f"Internal error while creating the instance: {exc}")], 500)
            return
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident:
                self._hosts_call("destroy", key)
                self._end_cop(op_key)
                return
            r.ip = ip
            r.nat_ip = ip if r.nat_ip else ""
            if r.epoch == epoch:
                r.status, r.last_start_ns = "RUNNING", time.time_ns()
            self._end_cop(op_key)
            self._instance_up(r)
            self._touch()  # a waiter on the instance (or on its MIG's stability) sees it RUNNING

    def _boot_instance(self, rec: InstanceRec) -> str:
        """Boot the instance's host (on the scheduler thread); its address."""
        if self.hosts is None:
            idx = self._fake_ips.setdefault(rec.key, len(self._fake_ips) + 1)
            return f"127.{1 + idx // 250}.{idx % 250}.0"
        ips = self.hosts.boot(rec.key, str(rec.id), 1, rec.metadata.get("startup-script"),
                              chips_per_host=rec.chips, vfio=True, metadata=dict(rec.metadata))
        return str(ips[0])

    def _instance_up(self, rec: InstanceRec) -> None:
        """Hook: an instance has just come up RUNNING (MIGs track it). Lock held."""

    def _instance_gone(self, rec: InstanceRec) -> None:
        """Hook: an instance has just been removed from the world (MIGs track it). Lock held."""

    def add_instance(self, name: str, machine_type: str = "tpu7x-standard-4t", *,
                     project: str | None = None, zone: str | None = None,
                     body: Mapping[str, Any] | None = None, mig: str = "") -> InstanceRec:
        """Create a RUNNING instance and boot its host now, without an operation (tests and
        scenarios); `body` may give any other Instance field as JSON."""
        project, zone = project or self.project, zone or self.zone
        fields = {**dict(body or {}), "name": name, "machineType": f"zones/{zone}/machineTypes/{machine_type}"}
        try:
            with self._lock:
                self.check_compute_zone(project, zone)
                rec = self.instance_from_body(project, zone, fields)
                rec.mig = mig
                self._store_new(rec)
                snapshot = copy.deepcopy(rec)
        except ApiError as exc:
            raise UsageError(f"instance {name!r}: {exc.message}")
        holder: dict[str, str] = {}

        def boot() -> None:
            holder["ip"] = self._boot_instance(snapshot)

        try:
            self._sched.run_sync(boot, timeout=120)
        except BaseException:
            with self._lock:
                self._instances.pop(snapshot.key, None)
            raise
        with self._lock:
            r = self._instances[snapshot.key]
            r.ip = holder["ip"]
            r.nat_ip = r.ip if r.nat_ip else ""
            r.status, r.last_start_ns = "RUNNING", time.time_ns()
            self._instance_up(r)
            self._touch()
            return copy.deepcopy(r)

    # ---- lifecycle calls ---------------------------------------------------------------------

    def delete_instance(self, project: str, zone: str, name: str) -> ComputeOpRec:
        """instances.delete: STOPPING, then gone when the operation ends."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            rec.status, rec.epoch = "STOPPING", rec.epoch + 1
            op = self._new_cop(project, f"zones/{zone}", "delete", rec.path, rec.id)
            key, ident = rec.key, rec.id
        self.after(self.delays["delete"], lambda: self._finish_delete_instance(key, ident, op.key))
        return copy.deepcopy(op)

    def _finish_delete_instance(self, key: str, ident: int, op_key: str = "") -> None:
        with self._lock:
            r = self._instances.get(key)
            gone = r is not None and r.id == ident
            if gone and r is not None:
                del self._instances[key]
                self._instance_gone(r)
                self._touch()  # a wait for it gone sees it now (Google's own deletes end no operation)
            self._end_cop(op_key)
        if gone:
            self._hosts_call("destroy", key)

    def stop_instance(self, project: str, zone: str, name: str) -> ComputeOpRec:
        """instances.stop: STOPPING, then TERMINATED (the host goes down)."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if rec.provisioning_model == "FLEX_START":
                raise ComputeError("INVALID_ARGUMENT", f"Instance '{name}' is a flex-start VM; it cannot be "
                                   "stopped, only deleted.", "badRequest")
            if rec.status in ("TERMINATED", "STOPPED"):
                return copy.deepcopy(self._new_cop(project, f"zones/{zone}", "stop", rec.path, rec.id, done=True))
            rec.status, rec.epoch = "STOPPING", rec.epoch + 1
            op = self._new_cop(project, f"zones/{zone}", "stop", rec.path, rec.id)
            key, ident, epoch = rec.key, rec.id, rec.epoch
            down = self._queue_hosts("down", key)

        def finish() -> None:
            with self._lock:
                r = self._instances.get(key)
                if r is not None and r.id == ident and r.epoch == epoch:
                    r.status, r.last_stop_ns = "TERMINATED", time.time_ns()
                self._end_cop(op.key)

        self.after(self.delays["stop"], finish)
        self._await(down)
        return copy.deepcopy(op)

    def start_instance(self, project: str, zone: str, name: str) -> ComputeOpRec:
        """instances.start of a TERMINATED instance: PROVISIONING ... RUNNING, the host reboots.
        A Spot TPU VM a preemption stopped is refused (delete and recreate it)."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if rec.status == "RUNNING":
                return copy.deepcopy(self._new_cop(project, f"zones/{zone}", "start", rec.path, rec.id, done=True))
            if rec.status not in ("TERMINATED", "STOPPED"):
                raise ComputeError("FAILED_PRECONDITION", f"The resource '{rec.path}' is not ready", "resourceNotReady")
            if rec.preempted:
                raise ComputeError(
                    "INVALID_ARGUMENT",
                    f"Instance '{name}' is a Spot TPU VM that was preempted; it cannot be restarted. "
                    "Delete it and create it again.", "badRequest")
            rec.status, rec.epoch = "PROVISIONING", rec.epoch + 1
            op = self._new_cop(project, f"zones/{zone}", "start", rec.path, rec.id)
            key, ident, epoch = rec.key, rec.id, rec.epoch
            self.after(self.delays["start"] / 2, lambda: self._set_instance_status(key, ident, epoch, "STAGING"))

        def finish() -> None:
            self._hosts_call("up", key)
            with self._lock:
                r = self._instances.get(key)
                if r is not None and r.id == ident and r.epoch == epoch:
                    r.status, r.last_start_ns = "RUNNING", time.time_ns()
                    self._instance_up(r)
                self._end_cop(op.key)

        self.after(self.delays["start"], finish)
        return copy.deepcopy(op)

    def set_labels(self, project: str, zone: str, name: str, labels: Mapping[str, str],
                   label_fingerprint: str) -> ComputeOpRec:
        """instances.setLabels: the fingerprint must be the current one (412 otherwise)."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if label_fingerprint != rec.label_fingerprint:
                raise ComputeError("FAILED_PRECONDITION", "Labels fingerprint either invalid or resource labels "
                                   "have changed", "conditionNotMet")
            rec.labels = {str(k): str(v) for k, v in labels.items()}
            return copy.deepcopy(self._new_cop(project, f"zones/{zone}", "setLabels", rec.path, rec.id, done=True))

    def set_metadata(self, project: str, zone: str, name: str, items: Mapping[str, str],
                     metadata_fingerprint: str) -> ComputeOpRec:
        """instances.setMetadata: the fingerprint must be the current one (412 otherwise)."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if metadata_fingerprint != rec.metadata_fingerprint:
                raise ComputeError("FAILED_PRECONDITION", "Supplied fingerprint does not match current metadata "
                                   "fingerprint.", "conditionNotMet")
            rec.metadata = {str(k): str(v) for k, v in items.items()}
            return copy.deepcopy(self._new_cop(project, f"zones/{zone}", "setMetadata", rec.path, rec.id, done=True))

    def project_metadata(self, project: str, initial: Mapping[str, str]) -> dict[str, str]:
        """The project's commonInstanceMetadata items: `initial` until setCommonInstanceMetadata."""
        with self._lock:
            return dict(self._project_metadata.get(project, initial))

    def set_project_metadata(self, project: str, initial: Mapping[str, str], items: Mapping[str, str],
                             metadata_fingerprint: str) -> ComputeOpRec:
        """projects.setCommonInstanceMetadata (what `gcloud compute ssh` calls to add the user's key to
        `ssh-keys`): the fingerprint must be the current one (412 otherwise). The simulated hosts
        take their one client key for their one user whatever the metadata holds, so a key gcloud
        adds for that user logs in at once, as it does once Google's guest agent has read it."""
        with self._lock:
            current = self._project_metadata.get(project, dict(initial))
            if metadata_fingerprint != fingerprint(sorted(current.items())):
                raise ComputeError("FAILED_PRECONDITION", "Supplied fingerprint does not match current metadata "
                                   "fingerprint.", "conditionNotMet")
            self._project_metadata[project] = {str(k): str(v) for k, v in items.items()}
            return copy.deepcopy(self._new_cop(project, "global", "setCommonInstanceMetadata", f"projects/{project}",
                                               int(md.project_number(project)), done=True))

    def report_host_as_faulty(self, project: str, zone: str, name: str, body: Mapping[str, Any]) -> ComputeOpRec:
        """instances.reportHostAsFaulty: documented for TPUs in All Capacity mode alone (a
        reservation-bound, RUNNING VM); the VM stops and its host is repaired (REPAIRING, for
        delays["simulated_maintenance_heal"]; Google says 3 to 14 days), then it runs again on the
        same name and id, on the same host repaired (a TPU VM in All Capacity mode is not moved):
        the host's hardware faults are gone."""
        schedule = str(body.get("disruptionSchedule") or "")
        reasons = body.get("faultReasons") or []
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if schedule not in ("IMMEDIATE", "FUTURE"):
                raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'disruptionSchedule': "
                                   f"'{schedule}'. It must be IMMEDIATE or FUTURE.", "invalid")
            for i, reason in enumerate(reasons):
                behavior = str(reason.get("behavior") or "") if isinstance(reason, Mapping) else ""
                if behavior not in FAULT_BEHAVIORS:
                    raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'faultReasons[{i}].behavior': "
                                       f"'{behavior}'.", "invalid")
            if rec.provisioning_model != "RESERVATION_BOUND":
                raise ComputeError("INVALID_ARGUMENT", f"Instance '{name}' is not reservation-bound; report a "
                                   "faulty host only for VMs in All Capacity mode.", "badRequest")
            if rec.status != "RUNNING":
                raise ComputeError("FAILED_PRECONDITION", f"The resource '{rec.path}' is not ready", "resourceNotReady")
            rec.faulty_reported = True
            rec.status, rec.epoch = "REPAIRING", rec.epoch + 1
            op = self._new_cop(project, f"zones/{zone}", "reportHostAsFaulty", rec.path, rec.id, done=True)
            key, ident, epoch = rec.key, rec.id, rec.epoch
            down = self._queue_hosts("down", key)
            self.after(self.delays["simulated_maintenance_heal"], lambda: self._host_repaired(key, ident, epoch))
        self._await(down)
        return copy.deepcopy(op)

    def _host_repaired(self, key: str, ident: int, epoch: int) -> None:
        """The reported host is repaired: its hardware faults end, and the instance runs again."""
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.epoch != epoch:
                return
        self._hosts_call("repair", key)
        self._restart_instance(key, ident, epoch, audit_method="")

    def _restart_instance(self, key: str, ident: int, epoch: int,
                          audit_method: str = "compute.instances.automaticRestart") -> None:
        """The instance runs again on healthy hardware: RUNNING, same name and id, its host
        rebooted; the audit entry `audit_method` ("" none). A stale timer does nothing."""
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.epoch != epoch:
                return
        self._hosts_call("up", key)
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.epoch != epoch:
                return
            r.status, r.last_start_ns, r.maintenance_event = "RUNNING", time.time_ns(), "NONE"
            if audit_method:
                self._system_event(r, audit_method)
            self._instance_up(r)
            self._touch()

    def instance_guest_attributes(self, project: str, zone: str, name: str, query_path: str,
                                  variable_key: str) -> list[tuple[str, str, str]]:
        """(namespace, key, value) of the instance's guest attributes under `query_path` (or the
        one `variable_key`): the guest agent publishes its host keys in namespace `hostkeys`."""
        with self._lock:
            rec = copy.deepcopy(self._require_instance(project, zone, name))
        items = [("hostkeys", k, v) for k, v in self.instance_host_keys(rec).items()]
        if variable_key:
            found = [i for i in items if f"{i[0]}/{i[1]}" == variable_key.strip("/")]
            if not found:
                raise not_found(f"projects/{project}/zones/{zone}/instances/{name}/guestAttributes/{variable_key}")
            return found
        wanted = query_path.strip("/")
        found = [i for i in items if not wanted or f"{i[0]}/{i[1]}".startswith(wanted)]
        if not found:
            # what Compute Engine answers for a namespace nothing was written to
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}/guestAttributes/{query_path}")
        return found
