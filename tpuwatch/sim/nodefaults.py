"""Faults of one node or its workers: any state at once, heal, preemption (with the queued
resource's suspension), termination, removal, symptoms, and the worker faults the simulated
hosts carry out (killed or hung processes, host faults, SSH faults, OS Login, host keys)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.sim import audit
from tpuwatch.sim.core import HostsLike
from tpuwatch.sim.maintenance import Maintenance
from tpuwatch.sim.records import (
    NodeRec,
    SymptomRec,
)

NODE_STATES = (
    "STATE_UNSPECIFIED", "CREATING", "READY", "RESTARTING", "REIMAGING", "DELETING", "REPAIRING",
    "STOPPED", "STOPPING", "STARTING", "PREEMPTED", "TERMINATED", "HIDING", "HIDDEN", "UNHIDING",
    "UNKNOWN",
)


NODE_HEALTHS = (
    "HEALTH_UNSPECIFIED", "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE",
)


SYMPTOM_TYPES = (
    "LOW_MEMORY",
    "OUT_OF_MEMORY",
    "EXECUTE_TIMED_OUT",
    "MESH_BUILD_FAIL",
    "HBM_OUT_OF_MEMORY",
    "PROJECT_ABUSE",
)


class NodeFaults(Maintenance):
    """Faults injected into one node or its workers."""

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
        term_first: float = 0.0,
    ) -> None:
        """Spot/preemptible node preempted: PREEMPTED for good, a terminate entry, workers gone.

        A node made through a queued resource is taken back by the service, as Google does: the
        request goes SUSPENDING, its node is deleted (PREEMPTED, then DELETING, then gone), and
        the request ends SUSPENDED, keeping its name until someone deletes it. One slice of a
        multislice request takes the whole request with it: the request was provisioned as one,
        and SUSPENDED means all of its resources are gone, so the other slices are deleted too. With `notice`
        (simulated seconds; about 30 on Compute Engine) the workers' metadata servers say
        `preempted` TRUE that long before. With `term_first` (simulated seconds) the guests'
        shutdown comes first: every worker process gets SIGTERM that long before the notice and
        the API's PREEMPTED (Google documents no order between them).
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
            key, ident = rec.key, rec.id
            term = self._queue_hosts("term", key) if term_first > 0 else None
        if term_first > 0:
            self._await(term)

            def then() -> None:
                with self._lock:
                    now = self._nodes.get(key)
                    if now is None or now.id != ident:
                        return
                with contextlib.suppress(UsageError):  # the node changed state meanwhile
                    self.preempt(node, project=project, zone=zone, reason=reason, notice=notice)

            self.after(term_first, then)
            return
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
