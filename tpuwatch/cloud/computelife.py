"""Delete and create a slice made through Compute Engine (`ports.NodeLifecycle`).

- An instance ([tpu] instance) is deleted, then inserted again from the instance it was, as
  `tpuwatch init` saved it ([tpu.compute_spec.instance]), with the ownership label and the
  launch's metadata.
- A MIG ([tpu] mig) is never deleted: Google's way to replace a multi-host slice is as a whole,
  and the MIG keeps its template and workload policy. "Delete" is `recreateInstances` of every
  instance (the snapshot's id changes once they are new, which the policy follows as the node
  made again); "create", for a MIG that is gone, inserts it from its saved insert body
  ([tpu.compute_spec.mig]), whose template must still exist.

Whether to delete at all (ownership, a MIG repairing by itself, a person's deletion) is the
policy's to decide from the snapshot (cloud/compute.py); this module only carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuwatch.cloud import computemaint
from tpuwatch.cloud.compute import ComputeAdapter
from tpuwatch.errors import NotFoundError
from tpuwatch.model import NodeSnapshot, QueuedStatus


class ComputeLifecycle:
    """Delete / create of the job's instance or MIG in its zone (`ports.NodeLifecycle`)."""

    queued_resource = ""  # Compute Engine has no queued resources

    def __init__(self, api: ComputeAdapter) -> None:
        self.api = api

    def get_node(self, name: str) -> NodeSnapshot | None:
        return self.api.get_node(name)

    def status(self) -> QueuedStatus | None:
        return None

    def delete(self, node: NodeSnapshot | None) -> tuple[str, str]:
        """Start deleting the instance, or recreating every instance of the MIG; (operation, what)."""
        if node is None:
            raise NotFoundError(f"nothing left to delete: no {self.api.kind}")
        if self.api.kind == "mig":
            op = self.api.recreate_mig(node.name)
            return op, (f"MIG {node.name}'s {len(node.workers)} instances (recreateInstances: a multi-host slice "
                        "is replaced as a whole; the MIG, its template and workload policy stay)")
        return self.api.delete_node(node.name), f"instance {node.name}"

    def clear_ended(self) -> str:
        return ""

    def start_maintenance(self, node: NodeSnapshot) -> tuple[str, str]:
        """performMaintenance on the slice's instances whose maintenance may start early
        (cloud/computemaint.py); MaintenanceRefused when Google refuses."""
        return computemaint.start_maintenance(self.api, node)

    def create(self, name: str, node: Mapping[str, Any], zone: str, *, resumed: bool = False,
               tier: str = "", reservation: str = "") -> str:
        """Start inserting the instance or MIG from its saved insert body; the operation name."""
        return self.api.create_node(name, node, zone)
