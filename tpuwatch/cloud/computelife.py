"""Delete and create a slice made through Compute Engine (`ports.NodeLifecycle`).

- An instance ([tpu] instance) is deleted, then inserted again from the instance it was, as
  `tpuwatch init` saved it ([tpu.compute_spec.instance]), with the ownership label and the
  launch's metadata.
- A MIG ([tpu] mig) is never deleted: Google's way to replace a multi-host slice is as a whole,
  and the MIG keeps its template and workload policy. "Delete" is `recreateInstances` of every
  instance (the snapshot's id changes once they are new, which the policy follows as the node
  made again); "create", for a MIG that is gone, inserts it from its saved insert body
  ([tpu.compute_spec.mig]), whose template must still exist.

A flex-start MIG ([tpu] flex_start) gets its VMs through resize requests, which play the part
of a queued resource: `status` is its newest request (FAILED, or SUSPENDED once Google deleted
its VMs at the end of their run duration); "delete" deletes its ended requests; "create" asks
for the slice's VMs in a new request, followed as the create's operation until it SUCCEEDS, or
FAILS (a stockout: RESOURCE_EXHAUSTED, queued and retried within queue_timeout).

Whether to delete at all (ownership, a MIG repairing by itself, a person's deletion) is the
policy's to decide from the snapshot (cloud/compute.py); this module only carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuwatch.cloud import computemaint
from tpuwatch.cloud.compute import (
    RESIZE_OP,
    ComputeAdapter,
    delete_ended_resize_requests,
    insert_resize_request,
    resize_status,
)
from tpuwatch.errors import NotFoundError
from tpuwatch.model import NodeSnapshot, QueuedStatus


class ComputeLifecycle:
    """Delete / create of the job's instance or MIG in its zone (`ports.NodeLifecycle`)."""

    def __init__(self, api: ComputeAdapter, *, mig: str = "", size: int = 0) -> None:
        self.api = api
        self.mig = mig  # a flex-start MIG's name, and its VMs: what each resize request asks for
        self.size = size
        # Compute Engine has no queued resources; a flex-start MIG's resize requests stand in
        self.queue = f"a resize request of MIG {mig}" if self.flex else ""

    @property
    def flex(self) -> bool:
        return bool(self.api.flex_start) and self.api.kind == "mig"

    def get_node(self, name: str) -> NodeSnapshot | None:
        return self.api.get_node(name)

    def status(self) -> QueuedStatus | None:
        """A flex-start MIG's newest resize request as a queued resource's state; else None."""
        return resize_status(self.api, self.mig) if self.flex else None

    def delete(self, node: NodeSnapshot | None) -> tuple[str, str]:
        """Start deleting the instance, or recreating every instance of the MIG; (operation, what)."""
        if self.flex and (node is None or not node.workers):
            # Google took the VMs back (run duration ended) or a request made none: clear the
            # ended requests, so the next one is the job's only one
            op = delete_ended_resize_requests(self.api, self.mig)
            if not op:
                raise NotFoundError(f"nothing left to delete: MIG {self.mig} has no VM and no ended resize request")
            return op, f"MIG {self.mig}'s ended resize requests"
        if node is None:
            raise NotFoundError(f"nothing left to delete: no {self.api.kind}")
        if self.api.kind == "mig":
            op = self.api.recreate_mig(node.name)
            return op, (f"MIG {node.name}'s {len(node.workers)} instances (recreateInstances: a multi-host slice "
                        "is replaced as a whole; the MIG, its template and workload policy stay)")
        return self.api.delete_node(node.name), f"instance {node.name}"

    def clear_ended(self) -> str:
        """Delete a flex-start MIG's ended resize requests (a FAILED one before its retry)."""
        if not self.flex:
            return ""
        op = delete_ended_resize_requests(self.api, self.mig)
        return f"deleted MIG {self.mig}'s ended resize requests ({op})" if op else ""

    def start_maintenance(self, node: NodeSnapshot) -> tuple[str, str]:
        """performMaintenance on the slice's instances whose maintenance may start early
        (cloud/computemaint.py); MaintenanceRefused when Google refuses."""
        return computemaint.start_maintenance(self.api, node)

    def create(self, name: str, node: Mapping[str, Any], zone: str, *, resumed: bool = False,
               tier: str = "", reservation: str = "") -> str:
        """Start inserting the instance or MIG from its saved insert body; the operation name.
        A flex-start MIG that exists gets its VMs through a new resize request instead, followed
        as the operation (`resumed`: one of this job's still in flight is followed again)."""
        if self.flex and self.api.get_mig(self.mig) is not None:
            status = resize_status(self.api, self.mig)
            if resumed and status.state in ("CREATING", "WAITING_FOR_RESOURCES"):
                return f"{RESIZE_OP}{self.mig}/{status.name.rsplit('/', 1)[-1]}"
            return insert_resize_request(self.api, self.mig, self.size)
        return self.api.create_node(name, node, zone)
