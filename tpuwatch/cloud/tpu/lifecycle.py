"""Delete and create the job's node, plainly or through its queued resource (`ports.NodeLifecycle`).

The only code that knows queued resources exist. A node made through one ([tpu]
queued_resource) is deleted by deleting the request with force (its node goes first) and
created by creating the request again with the same node spec, tier and reservation; a plain
node is deleted and created directly. Callers (recreate.py, the tick, `tpuwatch recreate`) see
one delete, one create and, for a queued resource, its state as a `QueuedStatus`.

Rules kept here:
- A request the service gave up on (FAILED, SUSPENDING, SUSPENDED: "initiated by the user, or
  the Cloud TPU service", e.g. a spot preemption) keeps its name until deleted: a create over
  it is refused as ABORTED (transient: the caller queues it) after starting that delete.
- Nothing here decides whether to delete; ownership and the recovery policy do that first.
- A multislice request (`node_count` > 1) is deleted (force: every slice goes) and created again
  as a whole, with the same node count and prefix, only for a job that says it spans those slices
  ([tpu] names): the service provisions such a request all or nothing. For a one-node job it is
  never touched: creating it again as that node's request would shrink the job to one slice. It
  needs a person (JobFailed).
This module sends requests only through the TPU adapter's methods; it sees no protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tpuwatch.cloud.errors import MAINTENANCE_REFUSALS, ApiError
from tpuwatch.errors import (
    CloudError,
    HostReportRefused,
    JobFailed,
    MaintenanceRefused,
    NotFoundError,
    TpuwatchError,
)
from tpuwatch.model import QR_ENDED, NodeSnapshot, QueuedStatus
from tpuwatch.ports import TpuApi


class QueuedApi(TpuApi, Protocol):
    """The queued-resource calls of the TPU adapter (tpuwatch.cloud.tpu.TpuAdapter)."""

    project: str

    def queued_status(self, name: str, zone: str | None = None) -> QueuedStatus: ...

    def create_queued_resource(self, qr_id: str, queued_resource: Mapping[str, Any],
                               zone: str | None = None) -> str: ...

    def delete_queued_resource(self, name: str, *, force: bool = True, zone: str | None = None) -> str: ...

    def perform_maintenance(self, name: str) -> str: ...

    def perform_maintenance_queued_resource(self, name: str, node_names: list[str]) -> str: ...


class Refused(TpuwatchError):
    """A create that must wait: the job's old queued resource still holds the name (ABORTED:
    the caller classifies it as transient and queues the create)."""

    code = "ABORTED"


def refuse_multislice(status: QueuedStatus, slices: int = 0) -> None:
    """JobFailed when `status` is a request of another size than the job's `slices` (0: a
    one-node job): this lifecycle must not delete or create it."""
    count = max(status.node_count, 1)
    if not status.state or count == max(slices, 1):
        return
    qr = status.name.rsplit("/", 1)[-1]
    if slices:
        raise JobFailed(
            f"queued resource {qr} has {count} node(s), but tpu.names lists {slices}: tpuwatch will not "
            "delete or create it; make tpu.names list every node of the request (`tpuwatch init` on one of "
            "its nodes writes them)")
    raise JobFailed(
        f"queued resource {qr} is a multislice request ({count} nodes): tpuwatch keeps "
        "one node alive and will not delete it (force would take every slice) or create it again "
        f"as one node; recreate it by hand (gcloud compute tpus queued-resources delete {qr} --force, "
        "then create it with the same --node-count)"
    )


# The request's tier field for each `queued_resource_tier` (spec.QR_TIERS). best_effort and
# guaranteed.reserved exist only in v2alpha1: a request with them cannot be parsed as v2, so the
# adapter sends it through v2alpha1 (cloud.tpu.parse_message).
TIER_FIELDS: dict[str, dict[str, Any]] = {
    "spot": {"spot": {}},
    "guaranteed": {"guaranteed": {}},
    "reserved": {"guaranteed": {"reserved": True}},
    "best_effort": {"bestEffort": {}},
}


def queued_id(value: str) -> str:
    """The id in [tpu] queued_resource ("" for a plain node); a full name keeps only its id."""
    return str(value or "").rsplit("/", 1)[-1]


class Lifecycle:
    """Delete / create / state of one job's node in one zone (`ports.NodeLifecycle`)."""

    def __init__(self, tpu: QueuedApi, queued_resource: str = "", slices: tuple[str, ...] = ()) -> None:
        self.tpu = tpu
        self.queued_resource = queued_id(queued_resource)
        self.queue = f"queued resource {self.queued_resource}" if self.queued_resource else ""
        self.slices = slices  # a multislice job's nodes <prefix>-0..N-1 (config.multislice_prefix)

    def get_node(self, name: str) -> NodeSnapshot | None:
        """The node `name` in this zone, or None."""
        return self.tpu.get_node(name)

    def status(self) -> QueuedStatus | None:
        """The queued resource's state (state "" when it does not exist); None for a plain node."""
        if not self.queued_resource:
            return None
        return self.tpu.queued_status(self.queued_resource)

    def delete(self, node: NodeSnapshot | None) -> tuple[str, str]:
        """Start deleting the node (through its queued resource, force); (operation, what was deleted).

        With no node, only its queued resource is left to delete. NotFoundError when there is
        nothing left to delete.
        """
        qr = self.queued_resource
        status = self.tpu.queued_status(qr) if qr else None
        if status is not None and status.state:
            refuse_multislice(status, len(self.slices))
            try:
                op = self.tpu.delete_queued_resource(qr, force=True)
                what = (f"its {len(self.slices)} slices {', '.join(self.slices)}" if self.slices else
                        f"its node {node.name}" if node is not None else "no node left")
                return op, f"queued resource {qr} and {what} (force)"
            except NotFoundError:
                pass  # gone between the get and the delete: the node alone is left
        if node is None or self.slices:
            raise NotFoundError(f"nothing left to delete: no node and no queued resource {qr}")
        return self.tpu.delete_node(node.name), node.name

    def delete_plan(self, node: NodeSnapshot | None) -> tuple[dict[str, Any] | None, bool]:
        """What `delete` would call (`ports.NodeLifecycle.delete_plan`); a create always follows."""
        qr = self.queued_resource
        status = self.tpu.queued_status(qr) if qr else None
        if status is not None and status.state:
            refuse_multislice(status, len(self.slices))
            return {"method": "google.cloud.tpu.v2.Tpu.DeleteQueuedResource", "name": status.name, "force": True}, False
        if node is None or self.slices:
            return None, False
        return {"method": "google.cloud.tpu.v2.Tpu.DeleteNode", "name": node.full_name}, False

    def start_maintenance(self, node: NodeSnapshot) -> tuple[str, str]:
        """Start the node's announced maintenance now; (operation, what was asked). Through its
        queued resource (performMaintenanceQueuedResource naming the node) when it has one.
        MaintenanceRefused when the service refuses (MAINTENANCE_REFUSALS)."""
        api = self.tpu
        name = due_slice(node)
        try:
            if self.queued_resource:
                op = api.perform_maintenance_queued_resource(self.queued_resource, [name])
                return op, f"queued resource {self.queued_resource}'s node {name}"
            return api.perform_maintenance(name), name
        except ApiError as exc:
            if exc.code not in MAINTENANCE_REFUSALS:
                raise
            raise MaintenanceRefused(exc.message, code=exc.code) from exc

    def report_faulty_host(self, node: NodeSnapshot, worker: int, description: str) -> tuple[str, str]:
        """The Cloud TPU API has no call to report a faulty host: always HostReportRefused."""
        raise HostReportRefused(f"node {node.name}: the Cloud TPU API has no call to report a faulty host",
                                code="UNIMPLEMENTED")

    def faulty_host_request(self, node: NodeSnapshot, worker: int, description: str) -> str:
        return ""

    def start_node(self, node: NodeSnapshot) -> tuple[str, str]:
        """Never asked on the Cloud TPU API (only a Compute Engine VM stopped by Compute Engine is
        started again): refused."""
        raise CloudError(f"node {node.name}: tpuwatch starts only a Compute Engine VM Compute Engine stopped")

    def clear_ended(self) -> str:
        """Start deleting the queued resource when the service gave up on it; what was done ("")."""
        qr = self.queued_resource
        if not qr:
            return ""
        status = self.tpu.queued_status(qr)
        if status.state not in QR_ENDED:
            return ""
        refuse_multislice(status, len(self.slices))
        try:
            op = self.tpu.delete_queued_resource(qr, force=True)
        except NotFoundError:
            return ""
        return f"started deleting queued resource {qr} ({status.state}) so it can be created again: {op}"

    def create(self, name: str, node: Mapping[str, Any], zone: str, *, resumed: bool = False,
               tier: str = "", reservation: str = "") -> str:
        """Start creating `name` from a JSON-like Node spec; the operation name.

        "" when this job's own earlier request still stands (`resumed`: the journal says a
        create is ours and in flight). Refused while an ended request still holds the name.
        """
        qr = self.queued_resource
        if not qr:
            return self.tpu.create_node(name, node, zone)
        api = self.tpu
        status = api.queued_status(qr, zone)
        refuse_multislice(status, len(self.slices))
        if status.state in QR_ENDED:
            done = self.clear_ended()
            raise Refused(f"queued resource {qr} is {status.state}"
                          + ("; deleting it before the next create" if done else ""))
        if status.state == "DELETING":
            raise Refused(f"queued resource {qr} is still being deleted; it is created again once it is gone")
        if status.state and resumed:
            return ""
        parent = f"projects/{api.project}/locations/{zone}"
        return api.create_queued_resource(qr, queued_request(parent, name, node, tier, reservation, self.slices),
                                          zone)


def due_slice(node: NodeSnapshot) -> str:
    """The node whose announced maintenance comes first: one slice of a multislice job (one at a
    time, so the others keep their place), else the node itself."""
    pending = [(up.window_start.timestamp() if up.window_start is not None else float("inf"), s.name)
               for s in node.slices if (up := s.upcoming_maintenance) is not None and up.status != "ONGOING"]
    return min(pending)[1] if pending else node.name


def queued_request(parent: str, name: str, node: Mapping[str, Any], tier: str = "",
                   reservation: str = "", slices: tuple[str, ...] = ()) -> dict[str, Any]:
    """A QueuedResource (JSON-like) asking for node `name` with `node`'s spec, tier and reservation;
    for a multislice job, its `slices` (`<prefix>-0..N-1`) as one request."""
    spec: dict[str, Any] = {"parent": parent, "node": dict(node)}
    if slices:
        prefix = slices[0].rsplit("-", 1)[0]
        spec["multisliceParams"] = {"nodeCount": len(slices), "nodeIdPrefix": prefix}
    else:
        spec["nodeId"] = name
    request: dict[str, Any] = {"tpu": {"nodeSpec": [spec]}}
    if tier:
        request.update(TIER_FIELDS[tier])
    if reservation:
        request["reservationName"] = reservation
    return request
