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

A host the policy found bad (the same worker's TPU that cannot be opened, attempt after attempt)
is reported through `instances.reportHostAsFaulty` on that worker's instance: Google stops the VM
and repairs its host, then runs it again (docs/compute-engine.md).

Whether to delete at all (ownership, a MIG repairing by itself, a person's deletion) is the
policy's to decide from the snapshot (cloud/compute/view.py); this module only carries it out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tpuwatch.cloud.compute import maint as computemaint
from tpuwatch.cloud.compute.adapter import (
    RESIZE_OP,
    ComputeAdapter,
    DirectReads,
    delete_ended_resize_requests,
    insert_resize_request,
    resize_status,
)
from tpuwatch.cloud.errors import MAINTENANCE_REFUSALS, ApiError
from tpuwatch.errors import CloudError, HostReportRefused, NotFoundError
from tpuwatch.model import NodeSnapshot, QueuedStatus

# What tpuwatch reports about a host: the repair starts at once (IMMEDIATE, the one schedule gcloud
# offers), and the behavior is BEHAVIOR_UNSPECIFIED, the one of Google's TPU page's values
# (PERFORMANCE, SILENT_DATA_CORRUPTION, BEHAVIOR_UNSPECIFIED) that fits a TPU that cannot be opened.
DISRUPTION = "IMMEDIATE"
BEHAVIOR = "BEHAVIOR_UNSPECIFIED"


def faulty_host_body(description: str) -> dict[str, Any]:
    """The body of instances.reportHostAsFaulty for a host tpuwatch found bad."""
    return {"disruptionSchedule": DISRUPTION, "faultReasons": [{"behavior": BEHAVIOR, "description": description}]}


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
        """The slice as it is now (never a zone listing shared with other jobs, which may have
        begun before this tick's delete)."""
        return self.api.read_node(name, DirectReads())

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
            mig = computemaint.on_mig(node)  # a spare MIG in the slot's place is its own
            op = self.api.recreate_mig(mig)
            return op, (f"MIG {mig}'s {len(node.workers)} instances (recreateInstances: a multi-host slice "
                        "is replaced as a whole; the MIG, its template and workload policy stay)")
        instance = self._vm(node)
        return self.api.delete_node(instance), f"instance {instance}"

    def delete_plan(self, node: NodeSnapshot | None) -> tuple[dict[str, Any] | None, bool]:
        """What `delete` would call (`ports.NodeLifecycle.delete_plan`): a MIG recreates its
        instances in place (no insert follows); an instance is deleted and inserted again."""
        if self.flex and (node is None or not node.workers):
            ended = self.status()  # the policy deletes Google's ended requests before a new one
            return ({"method": "compute.instanceGroupManagerResizeRequests.delete", "instanceGroupManager": self.mig,
                     "resizeRequest": ended.name.rsplit("/", 1)[-1]}
                    if ended is not None and ended.ended else None), False
        if node is None:
            return None, False
        if self.api.kind == "mig":
            return ({"method": "compute.instanceGroupManagers.recreateInstances", "name": node.full_name,
                     "instances": list(self.api.instance_names(node))}, True)
        return {"method": "compute.instances.delete", "name": node.full_name}, False

    def clear_ended(self) -> str:
        """Delete a flex-start MIG's ended resize requests (a FAILED one before its retry)."""
        if not self.flex:
            return ""
        op = delete_ended_resize_requests(self.api, self.mig)
        return f"deleted MIG {self.mig}'s ended resize requests ({op})" if op else ""

    def start_maintenance(self, node: NodeSnapshot) -> tuple[str, str]:
        """performMaintenance on the slice's instances whose maintenance may start early
        (cloud/compute/maint.py); MaintenanceRefused when Google refuses."""
        return computemaint.start_maintenance(self.api, node)

    def report_faulty_host(self, node: NodeSnapshot, worker: int, description: str) -> tuple[str, str]:
        """instances.reportHostAsFaulty on the worker's instance (IMMEDIATE); (operation, what).
        HostReportRefused when Google refuses it (it takes reports for TPU VMs in All Capacity
        mode, reservation-bound and running) or the worker has no instance."""
        instance = self._instance(node, worker)
        try:
            op = self.api.report_host_as_faulty(instance, faulty_host_body(description))
        except ApiError as exc:
            if exc.code not in MAINTENANCE_REFUSALS:
                raise
            raise HostReportRefused(f"instance {instance}: {exc.message}", code=exc.code) from exc
        return op, f"instance {instance} (worker {worker}) of {self.api.kind} {node.name}"

    def start_node(self, node: NodeSnapshot) -> tuple[str, str]:
        """instances.start of the instance (a MIG's stopped VMs are its own to restart: refused);
        (operation, what). A VM already running answers with a done operation."""
        if self.api.kind != "instance":
            raise CloudError(f"MIG {node.name}: its instances are restarted by the MIG, not started by tpuwatch")
        instance = self._vm(node)
        return self.api.start_instance(instance), f"instance {instance}"

    def _vm(self, node: NodeSnapshot) -> str:
        """The instance a job's node runs on: a spare in its place ([tpu] spares), read under the
        job's name, is its own instance (known by its id from its read), else the node itself."""
        names = self.api.instance_names(node)
        return names[0] if len(names) == 1 else node.name

    def faulty_host_request(self, node: NodeSnapshot, worker: int, description: str) -> str:
        try:
            instance = self._instance(node, worker)
        except HostReportRefused as exc:
            return str(exc)
        where = f"projects/{self.api.project}/zones/{self.api.zone}/instances/{instance}"
        return f"POST {where}/reportHostAsFaulty {json.dumps(faulty_host_body(description), sort_keys=True)}"

    def _instance(self, node: NodeSnapshot, worker: int) -> str:
        names = self.api.instance_names(node)
        if not 0 <= worker < len(names):
            raise HostReportRefused(f"{self.api.kind} {node.name} has no instance for worker {worker}", code="NOT_FOUND")
        return names[worker]

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
