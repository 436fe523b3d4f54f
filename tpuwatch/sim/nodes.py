"""Node operations as the TPU API serves them: create (failing in a stockout), delete, stop,
start and update, each a long-running operation that ends after its delay; and `add_node`, which
makes a READY node at once for tests and scenarios."""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.model import NODE_NAME
from tpuwatch.sim.auditlog import AuditLog
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
    NodeSpec,
    OperationRec,
)
from tpuwatch.sim.shapes import (
    misplaced,
    worker_count,
)

log = logging.getLogger(__name__)


UPDATABLE = ("labels", "metadata", "description")


class NodeLifecycle(AuditLog):
    """Creating, deleting, stopping, starting and updating nodes."""

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
