"""Queued resources: a request for one node or a multislice of them, stepping through
ACCEPTED and PROVISIONING to ACTIVE (or WAITING_FOR_RESOURCES in a stockout, FAILED all or
none), suspended by the service when a node is taken back, and deleted (with force, nodes
first)."""

from __future__ import annotations

import copy
import json
import re
import time
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.model import NODE_NAME
from tpuwatch.sim.nodes import NodeLifecycle
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
    NodeSpec,
    OperationRec,
    QueuedRec,
)

MULTISLICE_PREFIX = re.compile(r"^[A-Za-z0-9_.+%-]+$")


def tier_of(request: dict[str, Any]) -> str:
    """The tier a QueuedResource (JSON) asks for: its `tier` oneof, with v2alpha1's
    guaranteed.reserved told apart."""
    if "spot" in request:
        return "spot"
    if "bestEffort" in request:
        return "best_effort"
    if "guaranteed" in request:
        return "reserved" if (request["guaranteed"] or {}).get("reserved") else "guaranteed"
    return ""


class QueuedResources(NodeLifecycle):
    """Queued-resource requests and the nodes they make."""

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
                request = json.loads(spec_json or "{}")
            except ValueError:
                request = {}
            reservation = str(request.get("reservationName", ""))
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
                tier=tier_of(request),
                reservation=reservation,
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

    def _require_queued(self, project: str, zone: str, name: str) -> QueuedRec:
        """The queued resource, or the NOT_FOUND (or bad zone) error the API answers. Call with
        the lock held."""
        self.check_zone(project, zone)
        qr = self._queued.get(f"{project}/{zone}/{name}")
        if qr is None:
            raise ApiError(
                "NOT_FOUND",
                f"Resource 'projects/{project}/locations/{zone}/queuedResources/{name}' was not found",
            )
        return qr

    def get_queued_resource(self, project: str, zone: str, name: str) -> QueuedRec:
        with self._lock:
            return copy.deepcopy(self._require_queued(project, zone, name))

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
            qr = self._require_queued(project, zone, name)
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
