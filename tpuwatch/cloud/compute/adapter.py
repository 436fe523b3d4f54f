"""The Compute Engine adapter (ports.TpuApi): a TPU slice made through Compute Engine, seen as one node.

On Compute Engine a TPU VM is an instance; a single-host slice is an instance or a managed
instance group (MIG) of one; a multi-host slice is a MIG whose workload policy names an
accelerator topology. The job's slice ([tpu] instance or [tpu] mig) is shown to the tick and the policy as one
`NodeSnapshot`, mapped by cloud/compute/view.py; what an insert must hold is cloud/compute/spec.py's.

Every request is one call under `tpuwatch.cloud.retry` with the client's own retry off.
Operations are zone operations, read with this adapter's own `ZoneOperationsClient` (built with
the same endpoint), never through a client's `.result()`, whose polling client is built without
the client options and so would reach Google even from a test. Nothing outside `cloud/` sees a
Compute Engine message: they become `tpuwatch.model` values here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol, TypeVar

from google.api_core import exceptions as gexc

from tpuwatch.cloud import calls, clients
from tpuwatch.cloud.compute.spec import check_insert, without_past_termination
from tpuwatch.cloud.compute.view import (
    MAKING,
    OP_CODES,
    in_worker_order,
    instance_snapshot,
    mig_snapshot,
    name_filter,
    operation_status,
    short,
    time_of,
)
from tpuwatch.cloud.errors import (
    CODE_NUMBERS,
    ApiError,
    Call,
    is_transient,
    rate_limited,
    translate,
)
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import HostKeysRefused, NotFoundError, TpuwatchError, UsageError
from tpuwatch.model import (
    NODE_NAME,
    NodeSnapshot,
    OperationStatus,
    QueuedStatus,
)
from tpuwatch.policy.priority import PRIORITY_LABEL

T = TypeVar("T")
Kind = Literal["instance", "mig"]
RPC_TIMEOUT = 30.0
# A regional MIG's operation (a region's, not a zone's), followed as `regionOperations/R/NAME`
REGION_OP = "regionOperations/"
PAGE_SIZE = 500
SERVICE = "compute.googleapis.com"
class Reads(Protocol):
    """Where `get_node` reads the slice from: straight from the API (`DirectReads`: a get of the
    instance; or the MIG, its managed instances and the zone's instances), or from listings of
    the zone that the jobs of one watcher share (cloud/compute/zoneinstances.py). Any request of the
    job's own goes through `api`, the job's adapter."""

    def instance(self, api: ComputeAdapter, name: str) -> Any | None:
        """The `compute_v1.Instance`, or None when it does not exist."""
        ...

    def mig_parts(self, api: ComputeAdapter, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        """(MIG, its managed instances, their instances), or None when the MIG does not exist."""
        ...

    def listed(self, api: ComputeAdapter) -> list[Any]:
        """Every `compute_v1.Instance` of the zone (a job with a priority looks for one to ask for)."""
        ...


class DirectReads:
    """Reads of one job's slice through its own adapter, every tick."""

    def instance(self, api: ComputeAdapter, name: str) -> Any | None:
        return api.get_instance(name)

    def mig_parts(self, api: ComputeAdapter, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        return api.mig_parts(name)

    def listed(self, api: ComputeAdapter) -> list[Any]:
        return api.list_instances()


class ComputeAdapter:
    """ports.TpuApi over google-cloud-compute for one project and zone and the job's kind of slice.

    `reads`: where `get_node` reads the slice (`DirectReads` unless given)."""

    def __init__(self, project: str, zone: str, kind: Kind, *, retry: RetryPolicy | None = None,
                 flex_start: float = 0.0, reads: Reads | None = None) -> None:
        self.project = project
        self.zone = zone
        self.kind: Kind = kind
        self.flex_start = flex_start  # [tpu] flex_start: the MIG's VMs come through resize requests of this run
        self.retry = retry or RetryPolicy.from_env()
        self.reads: Reads = reads or DirectReads()
        self._clients: dict[str, Any] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # node id -> its instances' names, in worker order
        self._notes: list[str] = []  # what the person watching should know, not yet taken
        self._noted: set[str] = set()
        # MIG name -> its region, for a regional MIG (regionInstanceGroupManagers) once found
        self._regions: dict[str, str] = {}
        self._zonal: set[str] = set()  # MIG names found in the zone
        # instance name -> its labelFingerprint at its last `read_node`: a label write sends the
        # fingerprint of the read its labels were made from, so a change since is refused (412)
        self._label_prints: dict[str, str] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            self._clients[kind] = clients.compute_client(kind)
        return self._clients[kind]

    def _call(self, method: str, target: str, needs: str, fn: Callable[[], T], *, read: bool,
              role: str = "roles/compute.viewer") -> T:
        call = Call("Compute Engine API", method, target, needs, SERVICE, role)
        try:
            return self.retry.call(calls.counted(call, fn), transient=lambda e: is_transient(e, read=read),
                                   patient=rate_limited)
        except TpuwatchError:
            raise
        except Exception as exc:
            raise translate(exc, call, project=self.project) from None

    def _where(self, zone: str | None = None) -> str:
        return f"projects/{self.project}/zones/{zone or self.zone}"

    def _get(self, kind: str, name: str, needs: str, fn: Callable[[Any], Any]) -> Any | None:
        """One get (`fn(client)`); None on NOT_FOUND."""
        client = self._client(kind)

        def get() -> Any:
            try:
                return fn(client)
            except gexc.NotFound:
                return None

        return self._call(f"get_{kind}", f"{self._where()}/{kind}/{name}", needs, get, read=True)

    def _pages(self, kind: str, method: str, target: str, needs: str, field: str,
               fetch: Callable[[Any, str], Any]) -> list[Any]:
        """Every item of a paged list: `fetch(client, token)` is one request for a page, whose
        items are its `field`."""
        client = self._client(kind)
        out: list[Any] = []
        token = ""
        while True:
            def page(token: str = token) -> Any:
                return fetch(client, token)

            resp = self._call(method, target, needs, page, read=True)
            out.extend(getattr(resp, field))
            token = resp.next_page_token
            if not token:
                return out

    # -- reads ------------------------------------------------------------------------------
    def get_instance(self, name: str) -> Any | None:
        """The `compute_v1.Instance`, or None."""
        return self._get("instances", name, "compute.instances.get", lambda c: c.get(
            project=self.project, zone=self.zone, instance=name, retry=None, timeout=RPC_TIMEOUT))

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def mig_region(self, name: str) -> str:
        """The region of MIG `name` when it is a regional MIG (known once read), else ""."""
        return self._regions.get(name, "")

    def scope_known(self, name: str) -> bool:
        """Whether MIG `name` was found, zonal or regional, by this adapter."""
        return name in self._regions or name in self._zonal

    def get_mig(self, name: str) -> Any | None:
        """The `compute_v1.InstanceGroupManager`, or None: the zone's MIG, else the zone's region's
        (a regional MIG, remembered so that later reads ask the region first, one request)."""
        if name not in self._regions:
            mig = self._get("instanceGroupManagers", name, "compute.instanceGroupManagers.get", lambda c: c.get(
                project=self.project, zone=self.zone, instance_group_manager=name, retry=None, timeout=RPC_TIMEOUT))
            if mig is not None:
                self._zonal.add(name)
                return mig
        mig = self._get("regionInstanceGroupManagers", name, "compute.instanceGroupManagers.get", lambda c: c.get(
            project=self.project, region=self.region, instance_group_manager=name, retry=None, timeout=RPC_TIMEOUT))
        if mig is not None:
            self._regions[name] = self.region
            return mig
        if self._regions.pop(name, None) is not None:  # gone from the region: perhaps made again in the zone
            return self.get_mig(name)
        return None

    def get_template(self, url: str) -> Any | None:
        """The MIG's `compute_v1.InstanceTemplate` (global or regional, by its URL), or None."""
        name = short(url)
        if "/regions/" in url:
            region = url.split("/regions/", 1)[1].split("/", 1)[0]
            return self._get("regionInstanceTemplates", name, "compute.instanceTemplates.get", lambda c: c.get(
                project=self.project, region=region, instance_template=name, retry=None, timeout=RPC_TIMEOUT))
        return self._get("instanceTemplates", name, "compute.instanceTemplates.get", lambda c: c.get(
            project=self.project, instance_template=name, retry=None, timeout=RPC_TIMEOUT))

    def get_resource_policy(self, url: str) -> Any | None:
        """A `compute_v1.ResourcePolicy` (the MIG's workload policy) by its URL, or None."""
        name = short(url)
        region = url.split("/regions/", 1)[1].split("/", 1)[0] if "/regions/" in url else self.zone.rsplit("-", 1)[0]
        return self._get("resourcePolicies", name, "compute.resourcePolicies.get", lambda c: c.get(
            project=self.project, region=region, resource_policy=name, retry=None, timeout=RPC_TIMEOUT))

    def managed_instances(self, name: str) -> list[Any]:
        """listManagedInstances: each `ManagedInstance` (current action, status, last attempt)."""
        compute_v1 = clients.compute_v1()

        if region := self.mig_region(name):
            return self._pages("regionInstanceGroupManagers", "list_managed_instances",
                               f"projects/{self.project}/regions/{region}/instanceGroupManagers/{name}",
                               "compute.instanceGroupManagers.get", "managed_instances",
                               lambda c, token: c.list_managed_instances(
                                   request=compute_v1.ListManagedInstancesRegionInstanceGroupManagersRequest(
                                       project=self.project, region=region, instance_group_manager=name,
                                       max_results=PAGE_SIZE, page_token=token), retry=None, timeout=RPC_TIMEOUT))
        return self._pages("instanceGroupManagers", "list_managed_instances",
                           f"{self._where()}/instanceGroupManagers/{name}", "compute.instanceGroupManagers.get",
                           "managed_instances", lambda c, token: c.list_managed_instances(
                               request=compute_v1.ListManagedInstancesInstanceGroupManagersRequest(
                                   project=self.project, zone=self.zone, instance_group_manager=name,
                                   max_results=PAGE_SIZE, page_token=token), retry=None, timeout=RPC_TIMEOUT))

    def list_instances(self, names: Iterable[str] | None = None) -> list[Any]:
        """Every instance of the zone (one request a page), or only those named `names`: a
        `filter` on their names (`name eq "(a|b|c)"`, a regular expression the whole name must
        match), so that a MIG's read is one page of its own instances, whatever else the zone holds."""
        compute_v1 = clients.compute_v1()

        wanted = sorted(set(names)) if names is not None else None
        if wanted == []:
            return []
        where = name_filter(wanted) if wanted is not None else ""
        return self._pages("instances", "list_instances", self._where(), "compute.instances.list", "items",
                           lambda c, token: c.list(request=compute_v1.ListInstancesRequest(
                               project=self.project, zone=self.zone, max_results=PAGE_SIZE, page_token=token,
                               filter=where), retry=None, timeout=RPC_TIMEOUT))

    def member_instances(self, managed: Sequence[Any]) -> list[Any]:
        """The instances a MIG's managed instances name, read with one filtered list. A regional
        MIG's instances in another zone than the job's are not read (the workers are reached in
        the job's zone), and are said once: they read as not there, so the slice never READY."""
        elsewhere = sorted(m.instance for m in managed if m.instance and f"/zones/{self.zone}/" not in
                           f"/{m.instance}" and "/zones/" in m.instance)
        if elsewhere and (note := f"MIG instances outside zone {self.zone}: " + ", ".join(
                f"{short(u)} ({u.split('/zones/', 1)[1].split('/', 1)[0]})" for u in elsewhere)) not in self._noted:
            self._noted.add(note)
            self._notes.append(f"{note}; tpuwatch reads and reaches a slice's VMs in the job's zone only (a TPU "
                               "slice's VMs are in one zone): set [tpu] zone to theirs")
        return self.list_instances([short(m.instance) for m in managed if m.instance and m.instance not in elsewhere])

    def list_migs(self) -> list[Any]:
        """Every MIG of the zone (one request a page)."""
        compute_v1 = clients.compute_v1()

        return self._pages("instanceGroupManagers", "list_instance_group_managers", self._where(),
                           "compute.instanceGroupManagers.list", "items",
                           lambda c, token: c.list(request=compute_v1.ListInstanceGroupManagersRequest(
                               project=self.project, zone=self.zone, max_results=PAGE_SIZE, page_token=token),
                               retry=None, timeout=RPC_TIMEOUT))

    def list_region_migs(self) -> list[Any]:
        """Every regional MIG of the zone's region (one request a page); each is remembered as
        regional, so that its managed instances are asked of the region."""
        compute_v1 = clients.compute_v1()

        migs = self._pages("regionInstanceGroupManagers", "list_region_instance_group_managers",
                           f"projects/{self.project}/regions/{self.region}", "compute.instanceGroupManagers.list",
                           "items", lambda c, token: c.list(request=compute_v1.ListRegionInstanceGroupManagersRequest(
                               project=self.project, region=self.region, max_results=PAGE_SIZE, page_token=token),
                               retry=None, timeout=RPC_TIMEOUT))
        self._regions.update({m.name: self.region for m in migs})
        return migs

    def mig_parts(self, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        """(MIG, its managed instances, their instances), or None when the MIG does not exist.
        Three requests: the MIG, listManagedInstances, and its instances (a list filtered to
        their names: never the zone's other instances)."""
        mig = self.get_mig(name)
        if mig is None:
            return None
        managed = self.managed_instances(name)
        return mig, managed, self.member_instances(managed)

    def disk_params(self, url: str) -> dict[str, Any]:
        """The `initializeParams` that make disk `url` again: its image, size and type."""
        name = short(url)
        disk = self._get("disks", name, "compute.disks.get", lambda c: c.get(
            project=self.project, zone=self.zone, disk=name, retry=None, timeout=RPC_TIMEOUT))
        if disk is None:
            return {}
        params: dict[str, Any] = {"diskSizeGb": str(disk.size_gb)} if disk.size_gb else {}
        if disk.source_image:
            params["sourceImage"] = disk.source_image
        if disk.type_:  # an instance insert takes it as a URL only (a bare name is for templates)
            params["diskType"] = f"zones/{self.zone}/diskTypes/{short(disk.type_)}"
        return params

    # -- ports.TpuApi -----------------------------------------------------------------------
    def get_node(self, name: str) -> NodeSnapshot | None:
        """The job's instance or MIG as one node, or None when it does not exist (read through
        `reads`: a tick's look, which the jobs of one watcher may share)."""
        return self.read_node(name, self.reads)

    def read_node(self, name: str, reads: Reads | None = None) -> NodeSnapshot | None:
        """The job's instance or MIG as one node read through `reads` (`DirectReads()`, the
        default: as it is now, for an action that must not act on a shared look begun before it;
        ports.NodeLabels: the read a label write is made from)."""
        self._check(name)
        if self.kind == "instance":
            inst = (reads or DirectReads()).instance(self, name)
            if reads is None and inst is not None:
                self._label_prints[name] = str(inst.label_fingerprint)
            node = None if inst is None else instance_snapshot(inst, project=self.project, zone=self.zone)
            names: tuple[str, ...] = (name,)
        else:
            parts = (reads or DirectReads()).mig_parts(self, name)
            if parts is None or flex_emptied(self, *parts[:2]):
                return None
            mig, managed, instances = parts
            template = self.get_template(mig.instance_template) if not instances and mig.instance_template else None
            node = mig_snapshot(mig, managed, instances, project=self.project, zone=self.zone,
                                template_labels=dict(template.properties.labels) if template is not None else None,
                                region=self.mig_region(name))
            names = self._numbered(node, instances)
        if node is not None and node.id:
            self._names[node.id] = names
        return node

    def list_nodes(self) -> list[NodeSnapshot]:
        """Every slice of the zone (`status --all`): each MIG as one node of its instances, each
        instance no MIG manages as a node of one worker. One list of instances, one of MIGs,
        and one listManagedInstances per MIG."""
        instances = {i.name: i for i in self.list_instances()}
        nodes: list[NodeSnapshot] = []
        for mig in self.list_migs() + self.list_region_migs():
            managed = self.managed_instances(mig.name)
            members = [instances.pop(n) for n in (short(m.instance) or m.name for m in managed) if n in instances]
            if self.mig_region(mig.name) and not members:
                continue  # a regional MIG with no VM in this zone: another zone's slice
            nodes.append(node := mig_snapshot(mig, managed, members, project=self.project, zone=self.zone,
                                              region=self.mig_region(mig.name)))
            self._numbered(node, members)
        return nodes + [instance_snapshot(i, project=self.project, zone=self.zone) for i in instances.values()]

    def listed(self) -> list[NodeSnapshot]:
        """ports.ZoneListing: the zone's instances no MIG made, each a node of one worker, from
        the zone's instances list (shared by a watcher's jobs; one list a tick alone). A job with
        a priority looks there for an instance of a job of lower priority (policy/priority.py);
        a MIG's VMs take their labels from its template and are never lent one by one."""
        nodes = [instance_snapshot(i, project=self.project, zone=self.zone) for i in self.reads.listed(self)
                 if not any(item.key == "created-by" and "/instanceGroupManagers/" in str(item.value)
                            for item in i.metadata.items)]
        for n in nodes:  # why one a job of lower priority holds is never asked for, said once
            note = (f"instance {n.name} (job {n.owner}, {PRIORITY_LABEL}={n.labels.get(PRIORITY_LABEL)}) starts its "
                    "job at boot (tpuwatch-command in its metadata without tpuwatch-launch = \"false\"): no job asks "
                    "for it, since a restart after a hand-over would run that job beside the taker's; set "
                    "tpuwatch-launch = \"false\" in its metadata to lend it")
            if n.boots_job and n.owner and PRIORITY_LABEL in n.labels and note not in self._noted:
                self._noted.add(note)
                self._notes.append(note)
        return nodes

    def _numbered(self, node: NodeSnapshot, instances: Sequence[Any]) -> tuple[str, ...]:
        """The MIG's instance names in worker order; a READY MIG's numbers that tpuwatch cannot
        follow are said once (while a MIG makes or repairs its instances, some are missing)."""
        ordered, problem = in_worker_order(instances)
        note = f"MIG {node.name}: {problem}"
        if problem and node.state == "READY" and note not in self._noted:
            self._noted.add(note)
            self._notes.append(note)
        return tuple(i.name for i in ordered)

    def take_notes(self) -> list[str]:
        """What the person watching should know, once (a MIG whose worker numbers tpuwatch
        cannot follow)."""
        notes, self._notes = self._notes, []
        return notes

    def resize_request(self, node: NodeSnapshot) -> QueuedStatus | None:
        """A MIG's newest resize request still at work; None for an instance, or when none is."""
        return resize_in_flight(self, node.name) if is_mig(node) else None

    def drill_target(self, node: NodeSnapshot, worker: int) -> tuple[str, str]:
        """Worker N is an instance of its own (the slice's instances in worker order)."""
        return f"instance {self.instance_names(node)[worker]} (worker {worker})", node.name

    def simulate_worker_maintenance(self, node: NodeSnapshot, worker: int) -> str:
        return self.simulate_maintenance_event(self.instance_names(node)[worker])

    def instance_names(self, node: NodeSnapshot) -> tuple[str, ...]:
        """The node's instances in worker order (known from its last get)."""
        return self._names.get(node.id, (node.name,) if self.kind == "instance" else ())

    def worker_instances(self, *nodes: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        """Instance name -> (node, worker id), for the audit log's entries about the instances."""
        return {inst: (node.name, str(i)) for node in nodes for i, inst in enumerate(self.instance_names(node))}

    def host_keys(self, name: str) -> dict[int, tuple[str, ...]]:
        """Each worker's SSH host keys from its instance's guest attributes (`hostkeys/`, which
        `gcloud compute ssh` reads): worker index -> ("ssh-ed25519 AAAA...", ...). One request per
        instance; none for an instance that publishes none (guest attributes off, or gone).
        HostKeysRefused when the read is refused for lack of compute.instances.getGuestAttributes
        (a 403 that is not a rate limit, which is retried as every read is)."""
        node = self.get_node(name) if self.kind == "mig" else None
        names = self.instance_names(node) if node is not None else (name,)
        client = self._client("instances")
        out: dict[int, tuple[str, ...]] = {}
        for worker, inst in enumerate(names):
            def get(inst: str = inst) -> Any:
                compute_v1 = clients.compute_v1()

                request = compute_v1.GetGuestAttributesInstanceRequest(project=self.project, zone=self.zone,
                                                                       instance=inst, query_path="hostkeys/")
                try:
                    return client.get_guest_attributes(request=request, retry=None, timeout=RPC_TIMEOUT)
                except (gexc.NotFound, gexc.FailedPrecondition):
                    return None

            try:
                answer = self._call("get_guest_attributes", f"{self._where()}/instances/{inst}",
                                    "compute.instances.getGuestAttributes", get, read=True)
            except ApiError as exc:
                if exc.code != "PERMISSION_DENIED":
                    raise
                raise HostKeysRefused(exc.message, permission=exc.permission) from None
            if answer is None or "query_value" not in answer:
                continue
            keys = tuple(f"{item.key} {item.value}" for item in answer.query_value.items
                         if item.namespace == "hostkeys" and item.key and item.value)
            if keys:
                out[worker] = keys
        return out

    def get_operation(self, name: str) -> OperationStatus:
        """The zone operation (zoneOperations.get through this adapter's own client); for a
        flex-start MIG's create, the resize request it is (`RESIZE_OP` + its name)."""
        if name.startswith(RESIZE_OP):
            return resize_operation(self, name)
        if name.startswith(REGION_OP):
            region, op_name = name[len(REGION_OP):].split("/", 1)
            regional = self._client("regionOperations")
            op = self._call("get_operation", f"projects/{self.project}/regions/{region}/operations/{op_name}",
                            "compute.regionOperations.get", lambda: regional.get(
                                project=self.project, region=region, operation=op_name, retry=None,
                                timeout=RPC_TIMEOUT), read=True)
            return replace(operation_status(op), name=name)
        client = self._client("zoneOperations")
        op = self._call("get_operation", f"{self._where()}/operations/{name}", "compute.zoneOperations.get",
                        lambda: client.get(project=self.project, zone=self.zone, operation=name, retry=None,
                                           timeout=RPC_TIMEOUT), read=True)
        return operation_status(op)

    # -- writes -----------------------------------------------------------------------------
    def delete_node(self, name: str) -> str:
        """Start deleting the instance; the operation name. NotFoundError when it is gone.
        A MIG is not deleted: `recreate_mig` recreates its instances."""
        self._check(name)
        if self.kind == "mig":
            return self.recreate_mig(name)
        client = self._client("instances")

        def delete() -> Any:
            return client.delete_unary(project=self.project, zone=self.zone, instance=name, retry=None,
                                       timeout=RPC_TIMEOUT)

        return self._write("delete_instance", f"{self._where()}/instances/{name}", "compute.instances.delete",
                           delete, gone=f"no instance {name} in {self.project}/{self.zone} to delete")

    def recreate_mig(self, name: str) -> str:
        """recreateInstances on every instance of the MIG (a multi-host slice only as a whole);
        the operation name. NotFoundError when the MIG or all its instances are gone, or when the
        MIG is already making some of them again (CREATING, RECREATING): the policy saw it idle,
        and it began its own repair since. A recreate then would only flag what is flagged (or,
        on a multi-host slice, which Google replaces as a whole, start the whole slice over), so
        none is sent and the next tick sees the MIG at work."""
        compute_v1 = clients.compute_v1()

        managed = self.managed_instances(name)
        making = [f"{short(m.instance) or m.name}: {m.current_action}" for m in managed
                  if str(m.current_action) in MAKING]
        if making:
            raise NotFoundError(f"MIG {name} is already making its instances again ({', '.join(making)}); "
                                "no recreateInstances sent")
        urls = [m.instance for m in managed if m.instance]
        if not urls:
            raise NotFoundError(f"MIG {name} in {self.project}/{self.zone} has no instances to recreate")
        if region := self.mig_region(name):
            regional = self._client("regionInstanceGroupManagers")

            def recreate_regional() -> Any:
                return regional.recreate_instances_unary(
                    project=self.project, region=region, instance_group_manager=name,
                    region_instance_group_managers_recreate_request_resource=compute_v1.
                    RegionInstanceGroupManagersRecreateRequest(instances=urls), retry=None, timeout=RPC_TIMEOUT)

            op = self._write("recreate_instances", f"projects/{self.project}/regions/{region}/instanceGroupManagers/"
                             f"{name}", "compute.instanceGroupManagers.update", recreate_regional,
                             gone=f"no MIG {name} in {self.project}/{region} to recreate")
            return f"{REGION_OP}{region}/{op}"
        client = self._client("instanceGroupManagers")
        body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(instances=urls)

        def recreate() -> Any:
            return client.recreate_instances_unary(
                project=self.project, zone=self.zone, instance_group_manager=name,
                instance_group_managers_recreate_instances_request_resource=body, retry=None, timeout=RPC_TIMEOUT)

        return self._write("recreate_instances", f"{self._where()}/instanceGroupManagers/{name}",
                           "compute.instanceGroupManagers.update", recreate,
                           gone=f"no MIG {name} in {self.project}/{self.zone} to recreate")

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        """Start inserting the instance (or MIG) `name` from its JSON-like insert body; the
        operation name. RESOURCE_EXHAUSTED (no capacity, quota) raises ApiError, unretried."""
        self._check(name)

        if zone not in (None, self.zone):
            raise UsageError(f"a Compute Engine slice is created in its own zone {self.zone}, not {zone}")
        kind = "instances" if self.kind == "instance" else "instanceGroupManagers"
        if self.kind == "instance":
            node = without_past_termination(node, time.time())
        resource = check_insert(self.kind, node, name, self.zone)
        if self.kind == "mig" and "distributionPolicy" in node:  # a regional MIG (init saved its distribution)
            regional = self._client("regionInstanceGroupManagers")

            def insert_regional() -> Any:
                return regional.insert_unary(project=self.project, region=self.region,
                                             instance_group_manager_resource=resource, retry=None, timeout=RPC_TIMEOUT)

            op = self._write("insert_mig", f"projects/{self.project}/regions/{self.region}/instanceGroupManagers/{name}",
                             "compute.instanceGroupManagers.create", insert_regional)
            self._regions[name] = self.region
            return f"{REGION_OP}{self.region}/{op}"
        client = self._client(kind)

        def insert() -> Any:
            if self.kind == "instance":
                return client.insert_unary(project=self.project, zone=self.zone, instance_resource=resource,
                                           retry=None, timeout=RPC_TIMEOUT)
            return client.insert_unary(project=self.project, zone=self.zone,
                                       instance_group_manager_resource=resource, retry=None, timeout=RPC_TIMEOUT)

        return self._write(f"insert_{self.kind}", f"{self._where()}/{kind}/{name}", f"compute.{kind}.create", insert)

    # -- maintenance ------------------------------------------------------------------------
    def perform_maintenance(self, instance: str) -> str:
        """instances.performMaintenance: start the instance's pending maintenance now; the
        operation name. Google refuses it (an ApiError) when none is pending or the machine
        type does not offer it."""
        self._check(instance)
        client = self._client("instances")

        def perform() -> Any:
            return client.perform_maintenance_unary(project=self.project, zone=self.zone, instance=instance,
                                                    retry=None, timeout=RPC_TIMEOUT)

        return self._write("perform_maintenance", f"{self._where()}/instances/{instance}",
                           "compute.instances.performMaintenance", perform)

    def start_instance(self, instance: str) -> str:
        """instances.start: run a stopped (TERMINATED) instance again; the operation name.
        NotFoundError when it is gone."""
        self._check(instance)
        client = self._client("instances")

        def start() -> Any:
            return client.start_unary(project=self.project, zone=self.zone, instance=instance, retry=None,
                                      timeout=RPC_TIMEOUT)

        return self._write("start_instance", f"{self._where()}/instances/{instance}", "compute.instances.start",
                           start, gone=f"no instance {instance} in {self.project}/{self.zone} to start")

    def simulate_maintenance_event(self, instance: str) -> str:
        """instances.simulateMaintenanceEvent on one instance (`tpuwatch drill`); the operation
        name. NotFoundError when the instance is gone."""
        self._check(instance)
        client = self._client("instances")

        def simulate() -> Any:
            return client.simulate_maintenance_event_unary(project=self.project, zone=self.zone, instance=instance,
                                                           retry=None, timeout=RPC_TIMEOUT)

        return self._write("simulate_maintenance_event", f"{self._where()}/instances/{instance}",
                           "compute.instances.simulateMaintenanceEvent", simulate,
                           gone=f"no instance {instance} in {self.project}/{self.zone}")

    def report_host_as_faulty(self, instance: str, body: Mapping[str, Any]) -> str:
        """instances.reportHostAsFaulty with `body` (`faulty_host_body`); the operation name.
        Google refuses it (an ApiError) for a VM it does not take reports for, or not running."""
        self._check(instance)
        compute_v1 = clients.compute_v1()

        request = compute_v1.InstancesReportHostAsFaultyRequest.from_json(json.dumps(body), ignore_unknown_fields=False)
        client = self._client("instances")

        def report() -> Any:
            return client.report_host_as_faulty_unary(
                project=self.project, zone=self.zone, instance=instance,
                instances_report_host_as_faulty_request_resource=request, retry=None, timeout=RPC_TIMEOUT)

        return self._write("report_host_as_faulty", f"{self._where()}/instances/{instance}",
                           "compute.instances.reportHostAsFaulty", report)

    def set_labels(self, name: str, labels: Mapping[str, str]) -> str:
        """ports.NodeLabels: instances.setLabels, replacing the instance's labels with `labels`;
        the operation name. It carries the labelFingerprint of the instance's last `read_node`
        (a fresh get when none), so Compute Engine refuses it (412, an ApiError) when the labels
        changed since that read: the policy writes again from a new read. NotFoundError when the
        instance is gone; a MIG has no labels (its VMs take its template's)."""
        self._check(name)
        if self.kind != "instance":
            raise UsageError(f"{name}: a MIG has no labels of its own (its VMs take its instance template's)")
        compute_v1 = clients.compute_v1()

        stamp = self._label_prints.pop(name, None)
        if stamp is None:
            inst = self.get_instance(name)
            if inst is None:
                raise NotFoundError(f"no instance {name} in {self.project}/{self.zone} to label")
            stamp = str(inst.label_fingerprint)
        request = compute_v1.InstancesSetLabelsRequest(labels=dict(labels), label_fingerprint=stamp)
        client = self._client("instances")

        def put() -> Any:
            return client.set_labels_unary(project=self.project, zone=self.zone, instance=name,
                                           instances_set_labels_request_resource=request, retry=None,
                                           timeout=RPC_TIMEOUT)

        return self._write("set_labels", f"{self._where()}/instances/{name}", "compute.instances.setLabels", put,
                           gone=f"no instance {name} in {self.project}/{self.zone} to label")

    def _write(self, method: str, target: str, needs: str, fn: Callable[[], Any], *, gone: str = "") -> str:
        try:
            op = self._call(method, target, needs, fn, read=False, role="roles/compute.instanceAdmin.v1")
        except TpuwatchError as exc:
            if gone and getattr(exc, "code", "") == "NOT_FOUND":
                raise NotFoundError(gone) from None
            raise
        return str(op.name)

    def _check(self, name: str) -> None:
        if not NODE_NAME.match(name):
            raise UsageError(f"{name!r} is not a Compute Engine {self.kind} name (lowercase letters, digits and "
                             "hyphens, starting with a letter)")


# -- flex-start: a MIG whose VMs come through resize requests ([tpu] flex_start) -----------------
# The "operation" of a flex-start create is the resize request itself, named so in the journal.
RESIZE_OP = "resizeRequests/"
# A resize request's state as a queued resource's (model.QR_ENDED marks the ended ones): a
# request that FAILED (its VMs rolled back) or was CANCELLED makes nothing; one that SUCCEEDED
# and whose VMs are all gone again ended with its run duration (Google deletes flex-start VMs
# then), which the policy reads as the service taking the slice back. A CANCELLED request is a
# person's word: not ended to the policy, so a slice missing after it waits for a person.
_RESIZE_STATES = {"CREATING": "CREATING", "ACCEPTED": "WAITING_FOR_RESOURCES", "SUCCEEDED": "ACTIVE",
                  "FAILED": "FAILED", "CANCELLED": "CANCELLED", "DELETING": "DELETING"}


def resize_error(rr: Any) -> tuple[int, str]:
    """(google.rpc code, text) of a resize request's final `status.error` ((0, "") when none):
    ZONE_RESOURCE_POOL_EXHAUSTED is RESOURCE_EXHAUSTED, as for a zone operation."""
    if "status" not in rr or "error" not in rr.status or not rr.status.error.errors:
        return 0, ""
    errors = list(rr.status.error.errors)
    name = OP_CODES.get(errors[0].code, "UNKNOWN")
    return CODE_NUMBERS[name], "; ".join(f"{e.code}: {e.message}" for e in errors)


def flex_emptied(adapter: ComputeAdapter, mig: Any, managed: Sequence[Any]) -> bool:
    """A flex-start MIG with no managed instance: its run duration ended (or no request made
    any), so the slice is missing, and its resize requests say why. Whether Google lowers the
    target size then is not documented: the absence of instances decides (a request in flight
    has its managed instances CREATING)."""
    return bool(adapter.flex_start) and not managed


def _resizes(adapter: ComputeAdapter, mig: str) -> tuple[Any, dict[str, str], str]:
    """The resize-request client of MIG `mig`, where it is (`zone=` or, for a regional MIG,
    `region=`), and the MIG's path: a regional MIG's requests are the region's
    (`regionInstanceGroupManagerResizeRequests`). The MIG is read first when its scope is not known."""
    if not adapter.scope_known(mig):
        adapter.get_mig(mig)
    if region := adapter.mig_region(mig):
        return (adapter._client("regionInstanceGroupManagerResizeRequests"), {"region": region},
                f"projects/{adapter.project}/regions/{region}/instanceGroupManagers/{mig}")
    return (adapter._client("instanceGroupManagerResizeRequests"), {"zone": adapter.zone},
            f"{adapter._where()}/instanceGroupManagers/{mig}")


def _scoped_op(where: dict[str, str], op: str) -> str:
    """An operation's name as followed: a region's prefixed with `REGION_OP` and the region."""
    return f"{REGION_OP}{where['region']}/{op}" if "region" in where and op else op


def resize_requests(adapter: ComputeAdapter, mig: str) -> list[Any]:
    """The MIG's resize requests, oldest first (one page: a MIG keeps few)."""
    client, where, path = _resizes(adapter, mig)
    resp = adapter._call("list_resize_requests", path, "compute.instanceGroupManagers.get", lambda: client.list(
        project=adapter.project, instance_group_manager=mig, retry=None, timeout=RPC_TIMEOUT, **where), read=True)
    return sorted(resp, key=lambda r: (r.creation_timestamp, r.name))


def resize_status(adapter: ComputeAdapter, mig: str) -> QueuedStatus:
    """The newest resize request of the MIG as a `QueuedStatus` (state "" when it has none)."""
    requests = resize_requests(adapter, mig)
    if not requests:
        return QueuedStatus(name="", state="")
    rr = requests[-1]
    code, text = resize_error(rr)
    state = _RESIZE_STATES.get(str(rr.state), str(rr.state))
    if state == "ACTIVE" and (parts := adapter.mig_parts(mig)) is not None and flex_emptied(adapter, *parts[:2]):
        state, text = "SUSPENDED", "its flex-start VMs were deleted at the end of their run duration"
    if str(rr.state) == "CANCELLED":
        text = text or "the resize request was cancelled"
    return QueuedStatus(name=f"{_resizes(adapter, mig)[2]}/resizeRequests/{rr.name}",
                        state=state, error_code=code, error_message=text, kind="resize_request",
                        since=time_of(rr.creation_timestamp))


def is_mig(node: NodeSnapshot) -> bool:
    """Whether the node is a MIG (its instances the workers), not one instance."""
    return node.kind == "mig"


def resize_in_flight(adapter: ComputeAdapter, mig: str) -> QueuedStatus | None:
    """The MIG's newest resize request still at work (CREATING, or ACCEPTED: waiting for
    capacity), with when it was made; None when none is (`status`)."""
    live = [r for r in resize_requests(adapter, mig) if str(r.state) in ("CREATING", "ACCEPTED")]
    if not live:
        return None
    rr = live[-1]
    return QueuedStatus(name=f"{_resizes(adapter, mig)[2]}/resizeRequests/{rr.name}",
                        state=_RESIZE_STATES[str(rr.state)], kind="resize_request",
                        since=time_of(rr.creation_timestamp))


def resize_operation(adapter: ComputeAdapter, op: str) -> OperationStatus:
    """A flex-start create followed as an operation: done once its resize request SUCCEEDED,
    failed with its `status.error` when it FAILED (RESOURCE_EXHAUSTED for a stockout, which the
    policy queues and retries within queue_timeout), CANCELLED as CANCELLED (a person's: the
    create fails, never retried)."""
    mig, name = op[len(RESIZE_OP):].split("/", 1)
    client, where, path = _resizes(adapter, mig)

    def get() -> Any:
        try:
            return client.get(project=adapter.project, instance_group_manager=mig, resize_request=name, retry=None,
                              timeout=RPC_TIMEOUT, **where)
        except gexc.NotFound:
            return None

    rr = adapter._call("get_resize_request", f"{path}/resizeRequests/{name}", "compute.instanceGroupManagers.get",
                       get, read=True)
    if rr is None:
        return OperationStatus(name=op, done=True, error_code=CODE_NUMBERS["NOT_FOUND"],
                               error_message=f"resize request {name} of MIG {mig} is gone")
    state = str(rr.state)
    if state == "FAILED":
        code, text = resize_error(rr)
        return OperationStatus(name=op, done=True, error_code=code or CODE_NUMBERS["UNKNOWN"],
                               error_message=text or "the resize request failed")
    if state == "CANCELLED":
        return OperationStatus(name=op, done=True, error_code=CODE_NUMBERS["CANCELLED"],
                               error_message=f"resize request {name} was cancelled")
    return OperationStatus(name=op, done=state == "SUCCEEDED")


def flex_run(adapter: ComputeAdapter, mig: str) -> str:
    """The `requestedRunDuration` of the MIG's newest resize request that asks for one, as
    [tpu] flex_start ("86400s"), or "" when none does (not a flex-start MIG)."""
    runs = [r for r in resize_requests(adapter, mig) if "requested_run_duration" in r]
    return f"{int(runs[-1].requested_run_duration.seconds)}s" if runs else ""


def insert_resize_request(adapter: ComputeAdapter, mig: str, resize_by: int) -> str:
    """Ask for `resize_by` flex-start VMs for the MIG, to run `adapter.flex_start` seconds; the
    operation name to follow (`RESIZE_OP` + MIG + request name)."""
    compute_v1 = clients.compute_v1()

    name = f"{mig[:40]}-tpuwatch-{time.time_ns() // 1_000_000}"  # unique per try, as retries are ms apart at least
    body = compute_v1.InstanceGroupManagerResizeRequest(
        name=name, resize_by=resize_by, requested_run_duration=compute_v1.Duration(seconds=int(adapter.flex_start)))
    client, where, path = _resizes(adapter, mig)

    def insert() -> Any:
        return client.insert_unary(project=adapter.project, instance_group_manager=mig,
                                   instance_group_manager_resize_request_resource=body, retry=None,
                                   timeout=RPC_TIMEOUT, **where)

    adapter._write("insert_resize_request", path, "compute.instanceGroupManagers.update", insert)
    return f"{RESIZE_OP}{mig}/{name}"


def delete_ended_resize_requests(adapter: ComputeAdapter, mig: str) -> str:
    """Delete the MIG's ended resize requests (SUCCEEDED, FAILED, CANCELLED: Google keeps them
    until deleted); the last delete's operation name ("" when none had ended)."""
    client, where, path = _resizes(adapter, mig)
    op = ""
    for rr in resize_requests(adapter, mig):
        if str(rr.state) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            continue

        def delete(rr_name: str = str(rr.name)) -> Any:
            return client.delete_unary(project=adapter.project, instance_group_manager=mig, resize_request=rr_name,
                                       retry=None, timeout=RPC_TIMEOUT, **where)

        try:
            op = adapter._write("delete_resize_request", f"{path}/resizeRequests/{rr.name}",
                                "compute.instanceGroupManagers.update", delete, gone="gone")
        except NotFoundError:
            continue
    return _scoped_op(where, op)
