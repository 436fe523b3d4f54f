"""Faults of Compute Engine TPU VMs, as Google documents them, and the maintenance calls.

- Host error (docs.cloud.google.com/tpu/docs/failure-recovery): the instance stops at once
  (TERMINATED, `compute.instances.hostError`), and with managed capacity Compute Engine restarts
  it on healthy hardware (RUNNING, same name and id, `compute.instances.automaticRestart`). A
  multi-host slice (a MIG whose workload policy names a topology) is recovered as a whole: every
  instance of it stops and comes back together.
- Maintenance: `resourceStatus.upcomingMaintenance` PENDING (an `upcomingMaintenance` entry
  saying it is scheduled), the metadata server's notices before it starts, then ONGOING: the
  instance stops (`compute.instances.terminateOnHostMaintenance`, a TPU VM does not migrate),
  and is restarted after the repair (`automaticRestart`, then `upcomingMaintenance` completed).
  `instances.performMaintenance` starts a pending one now; `simulateMaintenanceEvent` runs one.
- Spot preemption: `compute.instances.preempted`; with termination action STOP the instance is
  TERMINATED and cannot be started again, with DELETE it is deleted: STOPPING first, its
  `resourceStatus.shutdownDetails` saying STOPPING to DELETED, then gone.
- Run ending (flex-start: `scheduling.maxRunDuration` from its start, or `terminationTime`) with
  termination action DELETE: deleted the same way, with no audit entry (none is documented).
  `hold_run_end` keeps a VM running past that time until `end_run_duration` (a test's moment).
- A bad host: the instance runs, but its TPU cannot be opened until a person or tpuwatch
  reports the host (`instances.reportHostAsFaulty`) and Google repairs it.
"""

from __future__ import annotations

import copy
import functools
import time

from tpuwatch.errors import UsageError
from tpuwatch.sim.cerecords import ComputeOpRec, InstanceRec
from tpuwatch.sim.hostfaults import HARDWARE
from tpuwatch.sim.instances import ComputeError, Instances
from tpuwatch.sim.logfilter import parse_rfc3339_ns
from tpuwatch.sim.records import UpcomingRec, rfc3339_s
from tpuwatch.sim.scheduler import Timer

HOST_ERROR = "compute.instances.hostError"
AUTOMATIC_RESTART = "compute.instances.automaticRestart"
PREEMPTED = "compute.instances.preempted"
TERMINATE_ON_MAINTENANCE = "compute.instances.terminateOnHostMaintenance"
UPCOMING = "compute.instances.upcomingMaintenance"
REPAIR_RECREATE = "compute.instances.repair.recreateInstance"
NO_PENDING_MAINTENANCE = "There is no pending maintenance for instance '{name}'."


class ComputeFaults(Instances):
    """Faults of Compute Engine instances and the calls that start maintenance."""

    def _live_instance(self, name: str, project: str | None, zone: str | None, what: str) -> InstanceRec:
        rec = self._fault_instance(name, project, zone)
        if rec.status != "RUNNING":
            raise UsageError(f"cannot inject {what} into instance {rec.name}: it is {rec.status}")
        return rec

    def slice_of(self, rec: InstanceRec) -> list[InstanceRec]:
        """The instances recovered together with `rec`: its multi-host MIG's, or itself alone.
        Call with the lock held."""
        mig = self._migs.get(rec.mig)
        if mig is None or not mig.multi_host:
            return [rec]
        return [r for r in (self._instances.get(self._ikey(mig.project, mig.zone, n)) for n in mig.members)
                if r is not None]

    # ---- host error --------------------------------------------------------------------------

    def host_error(self, name: str, *, restart_after: float | None = 120.0,
                   project: str | None = None, zone: str | None = None) -> None:
        """The instance's host fails: TERMINATED now (with its slice), restarted after
        `restart_after` simulated seconds when automatic restart is on (None: never)."""
        with self._lock:
            rec = self._live_instance(name, project, zone, "a host error")
            self._system_event(rec, HOST_ERROR, "Instance terminated by Compute Engine.")
            downs = []
            for r in self.slice_of(rec):
                r.status, r.epoch, r.last_stop_ns = "TERMINATED", r.epoch + 1, time.time_ns()
                downs.append(self._queue_hosts("down", r.key))
                if restart_after is not None and r.automatic_restart:
                    key, ident, epoch = r.key, r.id, r.epoch
                    self.after(restart_after, functools.partial(self._restart_instance, key, ident, epoch))
            self._touch()
        for d in downs:
            self._await(d)

    def bad_host(self, name: str, fault: str = "tpu-fault", *, project: str | None = None,
                 zone: str | None = None) -> None:
        """The instance's host goes bad: its TPU cannot be opened (`tpu-fault`), or a chip's device
        file is gone (`device-missing`: the environment checks see it), across reboots and
        cleanups, until the host is repaired (reportHostAsFaulty). The instance stays RUNNING:
        Compute Engine sees nothing wrong."""
        if fault not in HARDWARE:
            raise UsageError(f"a bad host's fault is one of {', '.join(HARDWARE)}, got {fault!r}")
        with self._lock:
            rec = self._live_instance(name, project, zone, "a bad host")
            effect = self._queue_hosts("host_fault", rec.key, 0, fault, {})
        self._await(effect)

    # ---- maintenance -------------------------------------------------------------------------

    def schedule_instance_maintenance(
        self, name: str, *, starts_in: float = 7 * 86400.0, window: float | None = None,
        heal_after: float | None = 1800.0, kind: str = "SCHEDULED", can_reschedule: bool = True,
        notice: float = 60.0, project: str | None = None, zone: str | None = None,
    ) -> None:
        """Announce maintenance: upcomingMaintenance PENDING now; the metadata server's
        maintenance-event notice `notice` before the window; at the window's start it runs."""
        if kind not in ("SCHEDULED", "UNSCHEDULED"):
            raise UsageError(f"type must be SCHEDULED or UNSCHEDULED, got {kind!r}")
        with self._lock:
            rec = self._live_instance(name, project, zone, "maintenance")
            now = time.time_ns()
            start = now + int(self.real(starts_in) * 1e9)
            length = window if window is not None else self.delays["maintenance_window"]
            rec.upcoming = UpcomingRec(kind, "PENDING", can_reschedule, start,
                                       start + int(self.real(length) * 1e9), start)
            self._write_instance_audit(rec, UPCOMING, f"Maintenance is scheduled for this instance from "
                                       f"{rfc3339_s(start)} to {rfc3339_s(rec.upcoming.window_end_ns)}.")
            key, ident, token = rec.key, rec.id, start
        if notice > 0:
            self.after(max(starts_in - notice, 0.0), lambda: self._maintenance_notice(key, ident, token))
        self.after(starts_in, lambda: self._begin_maintenance(key, ident, token, heal_after))

    def _maintenance_notice(self, key: str, ident: int, token: int) -> None:
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.upcoming is None or r.upcoming.window_start_ns != token:
                return
            r.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
            self._touch()

    def _begin_maintenance(self, key: str, ident: int, token: int | None, heal_after: float | None,
                           op_key: str = "") -> None:
        """The maintenance starts: ONGOING, the instance stops, and with automatic restart it
        runs again `heal_after` later. `token` ties a timer to the notice that scheduled it
        (None: simulateMaintenanceEvent, which needs no notice)."""
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident:
                self._end_cop(op_key)
                return
            if token is not None and (r.upcoming is None or r.upcoming.window_start_ns != token
                                      or r.upcoming.status != "PENDING"):
                return  # started by hand already, or replaced
            if r.status != "RUNNING":
                self._end_cop(op_key)
                return
            if r.upcoming is None:
                now = time.time_ns()
                r.upcoming = UpcomingRec("UNSCHEDULED", "ONGOING", False, now,
                                         now + int(self.real(self.delays["maintenance_window"]) * 1e9), now)
            r.upcoming.status, r.upcoming.can_reschedule = "ONGOING", False
            self._write_instance_audit(r, UPCOMING, "Maintenance is ongoing on this instance.")
            self._system_event(r, TERMINATE_ON_MAINTENANCE, "Instance terminated during Compute Engine maintenance.")
            r.status, r.epoch, r.last_stop_ns = "TERMINATED", r.epoch + 1, time.time_ns()
            r.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
            epoch, restart = r.epoch, r.automatic_restart
            down = self._queue_hosts("down", key)
            if heal_after is not None:
                self.after(heal_after, lambda: self._end_maintenance(key, ident, epoch, restart, op_key))
            self._touch()
        self._await(down)

    def _end_maintenance(self, key: str, ident: int, epoch: int, restart: bool, op_key: str) -> None:
        if restart:
            self._restart_instance(key, ident, epoch)
        with self._lock:
            r = self._instances.get(key)
            if r is not None and r.id == ident and r.upcoming is not None:
                r.upcoming, r.maintenance_event = None, "NONE"
                self._write_instance_audit(r, UPCOMING, "Maintenance is completed on this instance.")
            self._end_cop(op_key)

    def perform_instance_maintenance(self, project: str, zone: str, name: str,
                                     heal_after: float = 1800.0) -> ComputeOpRec:
        """instances.performMaintenance: start the pending maintenance now; refused when none
        is pending. On a VM of a multi-host slice it starts on every VM of the slice (Cloud TPU:
        "all of the instances within the slice will go into maintenance"). The operation ends
        once the instance runs again."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if rec.upcoming is None or rec.upcoming.status != "PENDING":
                raise ComputeError("INVALID_ARGUMENT", NO_PENDING_MAINTENANCE.format(name=name), "badRequest")
            op = self._new_cop(project, f"zones/{zone}", "performMaintenance", rec.path, rec.id)
            key, ident, token = rec.key, rec.id, rec.upcoming.window_start_ns
            peers = [(r.key, r.id, r.upcoming.window_start_ns if r.upcoming is not None else None)
                     for r in self.slice_of(rec) if r.key != key and r.status == "RUNNING"
                     and (r.upcoming is None or r.upcoming.status == "PENDING")]

        def begin() -> None:
            self._begin_maintenance(key, ident, token, heal_after, op.key)
            for k, i, t in peers:
                self._begin_maintenance(k, i, t, heal_after)

        self._sched.run_sync(begin)
        return self.get_compute_operation(project, f"zones/{zone}", op.name)

    def simulate_instance_maintenance(self, project: str, zone: str, name: str,
                                      heal_after: float | None = None) -> ComputeOpRec:
        """instances.simulateMaintenanceEvent: a maintenance event now (a TPU VM stops and is
        restarted), ending when the instance runs again."""
        with self._lock:
            rec = self._require_instance(project, zone, name)
            if rec.status != "RUNNING":
                raise ComputeError("FAILED_PRECONDITION", f"The resource '{rec.path}' is not ready", "resourceNotReady")
            op = self._new_cop(project, f"zones/{zone}", "simulateMaintenanceEvent", rec.path, rec.id)
            key, ident = rec.key, rec.id
        heal = heal_after if heal_after is not None else self.delays["simulated_maintenance_heal"]
        self._sched.run_sync(lambda: self._begin_maintenance(key, ident, None, heal, op.key))
        return self.get_compute_operation(project, f"zones/{zone}", op.name)

    # ---- preemption, run duration ------------------------------------------------------------

    def preempt_instance(self, name: str, *, notice: float | None = None, project: str | None = None,
                         zone: str | None = None, term_first: float = 0.0, stopping: float = 0.0) -> None:
        """A Spot instance is preempted: with termination action STOP it is TERMINATED for good
        (start refused), with DELETE deleted. Its `scheduling.preemptionNoticeDuration` (or
        `notice`, simulated seconds, when given) before, instance/preempted turns TRUE and the API
        shows `resourceStatus.shutdownDetails.stopState` PENDING_STOP while the VM still runs.
        With `term_first` (simulated seconds) the guest's shutdown comes first: its processes get
        SIGTERM that long before the notice and the API's change (Google documents no order).
        With `stopping` (simulated seconds) a VM with action STOP shows STOPPING that long before
        TERMINATED, as Google's stop of a VM passes through it (the API's STOPPING: "either being
        deleted or killed", a person's instances.delete alike), or until `end_stopping`."""
        with self._lock:
            rec = self._live_instance(name, project, zone, "preemption")
            if rec.provisioning_model != "SPOT":
                raise UsageError(f"instance {rec.name} is {rec.provisioning_model}, not SPOT, so it cannot be "
                                 "preempted; create it with spot = true")
            term = self._queue_hosts("term", rec.key) if term_first > 0 else None
            key, ident = rec.key, rec.id
        if term_first > 0:
            self._await(term)

            def then() -> None:
                with self._lock:
                    r = self._instances.get(key)
                    if r is None or r.id != ident or r.status != "RUNNING":
                        return
                self.preempt_instance(name, notice=notice, project=project, zone=zone, stopping=stopping)

            self.after(term_first, then)
            return
        with self._lock:
            rec = self._live_instance(name, project, zone, "preemption")
            if notice is None:
                notice = rec.preemption_notice or 0.0
            if notice > 0:
                rec.preempt_notice, rec.pending_stop_ns = True, time.time_ns()
                key, ident = rec.key, rec.id
                self._touch()
        if notice > 0:
            self.after(notice, lambda: self._preempt_now(key, ident, stopping))
            return
        self._preempt_now(rec.key, rec.id, stopping)

    def _preempt_now(self, key: str, ident: int, stopping: float = 0.0) -> None:
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.status != "RUNNING":
                return
            self._system_event(r, PREEMPTED, "Instance was preempted.")
            r.preempt_notice, r.pending_stop_ns = False, 0
            if r.termination_action == "DELETE":
                down = self._google_delete(r)
            else:
                r.epoch, r.last_stop_ns = r.epoch + 1, time.time_ns()
                r.status, r.preempted = ("STOPPING" if stopping > 0 else "TERMINATED"), True
                down = self._queue_hosts("down", key)
                if stopping > 0:
                    epoch = r.epoch
                    self.after(stopping, lambda: self._stopped(key, ident, epoch))
            self._touch()
        self._await(down)

    def _stopped(self, key: str, ident: int, epoch: int) -> None:
        """A preemption's stop (action STOP) ends: TERMINATED, unless the VM changed since."""
        with self._lock:
            r = self._instances.get(key)
            if r is not None and r.id == ident and r.epoch == epoch and r.status == "STOPPING":
                r.status = "TERMINATED"
                self._touch()

    def end_stopping(self, name: str, *, project: str | None = None, zone: str | None = None) -> None:
        """A preemption's stop under way (`preempt_instance`'s `stopping`) ends now: TERMINATED.
        Lets a test end it once it has seen what it tests, not at a time the watcher races."""
        with self._lock:
            rec = self._fault_instance(name, project, zone)
            if not (rec.preempted and rec.status == "STOPPING"):
                raise UsageError(f"instance {rec.name} is {rec.status}, not stopping from a preemption")
            key, ident, epoch = rec.key, rec.id, rec.epoch
        self._stopped(key, ident, epoch)

    def _google_delete(self, r: InstanceRec) -> Timer | None:
        """Google deletes the instance (its termination action DELETE, at a preemption or the end of
        its run): STOPPING, `shutdownDetails` saying it goes to DELETED, for delays["stop"] while
        the guest shuts down, then gone. The host effect to await. Lock held."""
        now = time.time_ns()
        r.status, r.epoch, r.last_stop_ns, r.shutdown = "STOPPING", r.epoch + 1, now, ("STOPPING", "DELETED", now)
        key, ident = r.key, r.id
        down = self._queue_hosts("down", key)
        self.after(self.delays["stop"], lambda: self._finish_delete_instance(key, ident))
        self._touch()
        return down

    def end_run_duration(self, name: str, *, project: str | None = None, zone: str | None = None) -> None:
        """The instance's run duration (flex-start, maxRunDuration) ends: Google deletes it (a
        hold_run_end on it is over)."""
        with self._lock:
            rec = self._fault_instance(name, project, zone)
            key, ident, epoch = rec.key, rec.id, rec.epoch
            self._held_run_ends.discard(key)
        self._run_ended(key, ident, epoch)

    def hold_run_end(self, name: str, *, project: str | None = None, zone: str | None = None) -> None:
        """The termination action of instance `name` (this one or one made later under the name)
        waits past its terminationTime or maxRunDuration until end_run_duration: the VM runs on
        meanwhile, as it does for the moments Google's action lags. Lets a test end a run when
        the job has reached the point it tests, not at a wall-clock time raced by the job."""
        with self._lock:
            self._held_run_ends.add(self._ikey(project, zone, name))

    def _run_ended(self, key: str, ident: int, epoch: int) -> None:
        """The run of the instance as it was at `epoch` ends: Google deletes it (no audit entry is
        documented for it; none is written)."""
        with self._lock:
            r = self._instances.get(key)
            if r is None or r.id != ident or r.epoch != epoch or key in self._held_run_ends:
                return
            down = self._google_delete(r)
        self._await(down)

    def _arm_run_duration(self, rec: InstanceRec, seconds: float | None) -> None:
        """End the instance's run `seconds` (simulated) after now, unless it changed. Lock held."""
        if seconds is None:
            return
        key, ident, epoch = rec.key, rec.id, rec.epoch
        self.after(seconds, lambda: self._run_ended(key, ident, epoch))

    def _instance_up(self, rec: InstanceRec) -> None:
        if rec.termination_action == "DELETE" and rec.last_start_ns:
            if rec.termination_time:  # a wall-clock time: its real distance from now, in simulated seconds
                left = (parse_rfc3339_ns(rec.termination_time) - time.time_ns()) / 1e9
                self._arm_run_duration(rec, max(left, 0.0) * self.speed)
            elif rec.max_run_duration is not None:
                self._arm_run_duration(rec, rec.max_run_duration)
        super()._instance_up(rec)

    def set_no_notice(self, name: str, form: str, *, project: str | None = None, zone: str | None = None) -> None:
        """What instance/upcoming-maintenance says with nothing scheduled: "error", "empty" or "none"."""
        if form not in ("error", "empty", "none"):
            raise UsageError(f"no_notice must be error, empty or none, got {form!r}")
        with self._lock:
            self._fault_instance(name, project, zone).no_notice = form
            self._touch()

    def remove_instance(self, name: str, *, project: str | None = None, zone: str | None = None) -> None:
        """Someone deleted the instance outside tpuwatch (gone at once)."""
        with self._lock:
            rec = copy.deepcopy(self._fault_instance(name, project, zone))
        self._finish_delete_instance(rec.key, rec.id)
