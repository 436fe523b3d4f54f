"""The Cloud TPU adapter (ports.TpuApi): nodes as `NodeSnapshot`s, create/delete, operations.

Reads go through the v2alpha1 API only: its Node holds every v2 field plus
`upcoming_maintenance`, and its QueuedResource the best_effort tier and guaranteed.reserved,
so one get sees everything (v2 is used for reads only if v2alpha1 answers UNIMPLEMENTED).
Writes and operations use v2, except a create whose request has fields only v2alpha1 knows
(boot_disk_config, autocheckpoint_enabled, a queued resource's best_effort or
guaranteed.reserved), which goes through v2alpha1 rather than losing them. Every request is one RPC under `tpuwatch.cloud.retry`
(the client's own retry is off), so call counts are exact.

Public calls: get_node / require_node / list_nodes / get_node_message / host_keys (reads), create_node /
delete_node / set_labels / update_node (nodes), get_queued_resource / queued_status /
create_queued_resource / delete_queued_resource / queued_resource_name (queued resources),
get_operation. Queued resources are used through tpuwatch.cloud.tpu.lifecycle.

This module turns Google messages into `tpuwatch.model` values and Google errors into tpuwatch
errors; nothing outside `cloud/` sees a protobuf. Enum fields become their names; a number
this client does not know becomes "UNKNOWN_ENUM_<n>" instead of an exception.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from google.api_core import exceptions as gexc

from tpuwatch.cloud import calls, clients
from tpuwatch.cloud.base import parse_rfc3339
from tpuwatch.cloud.errors import ApiError, Call, is_transient, rate_limited, translate
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import HostKeysRefused, NotFoundError, TpuwatchError, UsageError
from tpuwatch.model import (
    NODE_NAME,
    NodeSnapshot,
    OperationStatus,
    QueuedStatus,
    Symptom,
    UpcomingMaintenance,
    WorkerEndpoint,
)

T = TypeVar("T")
INSTANCES_RETRY = 300.0  # seconds between guest-attribute reads of a node whose workers have not all published
RPC_TIMEOUT = 30.0  # seconds per request; the retry policy bounds the total
PAGE_SIZE = 500

def parse_maintenance_time(text: str) -> datetime | None:
    """The time in "The TPU had a maintenance event at <RFC 3339>"; None for other texts.

    The wording is not a documented format, so any healthDescription that talks about
    maintenance and carries an RFC 3339 time counts; the text itself is always kept as is.
    """
    if not text or "maintenance" not in text.lower():
        return None
    return parse_rfc3339(text)


def _pb(msg: Any) -> Any:
    """The raw protobuf of a proto-plus message (or the message itself if already raw)."""
    pb = getattr(type(msg), "pb", None)
    return pb(msg) if callable(pb) and not hasattr(msg, "DESCRIPTOR") else msg


def enum_name(msg: Any, field: str) -> str:
    """The enum value's name, or "UNKNOWN_ENUM_<n>" for a number this client does not know."""
    fields = msg.DESCRIPTOR.fields_by_name
    if field not in fields:  # the generated protos rename `type` to `type_`
        field += "_"
    number = getattr(msg, field)
    enum_type = fields[field].enum_type
    value = enum_type.values_by_number.get(number)
    return value.name if value is not None else f"UNKNOWN_ENUM_{number}"


def _time(msg: Any, field: str) -> datetime | None:
    """A Timestamp field, or an RFC 3339 string field, as an aware datetime; None when unset."""
    desc = msg.DESCRIPTOR.fields_by_name[field]
    if desc.message_type is None:
        return parse_rfc3339(getattr(msg, field) or "")
    if not msg.HasField(field):
        return None
    ts = getattr(msg, field)
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=timezone.utc)


def split_node_name(full: str) -> tuple[str, str, str]:
    """(project, zone, short name) of "projects/P/locations/Z/nodes/N"; blanks when absent."""
    parts = full.split("/")
    found = {parts[i]: parts[i + 1] for i in range(0, len(parts) - 1) if parts[i] in ("projects", "locations", "nodes")}
    return found.get("projects", ""), found.get("locations", ""), found.get("nodes", parts[-1])


def snapshot(node: Any, *, project: str = "", zone: str = "") -> NodeSnapshot:
    """A NodeSnapshot of a v2 or v2alpha1 Node (proto-plus or raw protobuf)."""
    pb = _pb(node)
    p, z, short = split_node_name(pb.name)
    fields = pb.DESCRIPTOR.fields_by_name
    upcoming = None
    if "upcoming_maintenance" in fields and pb.HasField("upcoming_maintenance"):
        um = pb.upcoming_maintenance
        # v2alpha1 declares these window times as RFC 3339 strings, not Timestamps.
        upcoming = UpcomingMaintenance(
            type=enum_name(um, "type"),
            status=enum_name(um, "maintenance_status"),
            can_reschedule=bool(um.can_reschedule),
            window_start=_time(um, "window_start_time"),
            window_end=_time(um, "window_end_time"),
            latest_window_start=_time(um, "latest_window_start_time"),
        )
    accel, topology = pb.accelerator_type, ""
    if pb.HasField("accelerator_config"):
        topology = pb.accelerator_config.topology
        if not accel:
            accel = enum_name(pb.accelerator_config, "type").lower()
    return NodeSnapshot(
        name=short,
        project=project or p,
        zone=z or zone,
        id=str(pb.id) if pb.id else "",
        create_time=_time(pb, "create_time"),
        state=enum_name(pb, "state"),
        health=enum_name(pb, "health"),
        health_description=pb.health_description,
        maintenance_time=parse_maintenance_time(pb.health_description),
        symptoms=tuple(
            Symptom(
                type=enum_name(s, "symptom_type"),
                worker_id=s.worker_id,
                time=_time(s, "create_time"),
                details=s.details,
            )
            for s in pb.symptoms
        ),
        upcoming_maintenance=upcoming,
        workers=tuple(
            WorkerEndpoint(index=i, internal_ip=ep.ip_address, external_ip=ep.access_config.external_ip)
            for i, ep in enumerate(primary_endpoints(pb))
        ),
        accelerator_type=accel,
        topology=topology,
        runtime_version=pb.runtime_version,
        spot=bool(pb.scheduling_config.spot),
        preemptible=bool(pb.scheduling_config.preemptible),
        labels=dict(pb.labels),
        metadata_keys=tuple(sorted(pb.metadata)),
        multislice_request=pb.queued_resource if pb.multislice_node else "",
    )


def primary_endpoints(pb: Any) -> list[Any]:
    """Each worker's endpoint on its first network. A node with several `network_configs` lists
    workers x networks endpoints, each worker's interfaces side by side (as gcloud's TPU VM ssh
    reads them: worker k is entry k x networks); the others are secondary NICs, not workers."""
    nets = max(1, len(pb.network_configs))
    return list(pb.network_endpoints)[::nets]


def multislice_params(qr: Any) -> tuple[int, str]:
    """(node count, node id prefix) of a multislice queued resource, (0, "") for one node. v2 names
    the node spec's field `multislice_params`, v2alpha1 `multi_node_params`."""
    specs = _pb(qr).tpu.node_spec
    if not specs:
        return 0, ""
    spec = specs[0]
    fields = spec.DESCRIPTOR.fields_by_name
    if "multislice_params" in fields and spec.HasField("multislice_params"):
        params = spec.multislice_params
    elif "multi_node_params" in fields and spec.HasField("multi_node_params"):
        params = spec.multi_node_params
    else:
        return 0, ""
    return int(params.node_count), str(params.node_id_prefix)


_LOCATION_NOT_FOUND = (
    re.compile(r"locations/[^/\s'\"]+['\"]?\s+(?:is|was)\s+not\s+found", re.IGNORECASE),
    re.compile(r"^location\s+['\"]?[^/\s'\"]+['\"]?\s+(?:is|was)\s+not\s+found", re.IGNORECASE),
)


def _zone_not_found(exc: gexc.GoogleAPICallError) -> bool:
    """NOT_FOUND about the location itself (an unknown zone), not about a resource in it."""
    text = exc.message or ""
    return any(rx.search(text) for rx in _LOCATION_NOT_FOUND)


def parse_message(kind: str, data: Mapping[str, Any], what: str) -> tuple[str, Any]:
    """(API version, proto-plus message) of a JSON-like `kind` ("Node", "QueuedResource").

    Proto and JSON field names both work. v2 is preferred; a message v2 cannot hold (a field only
    v2alpha1 has) is built with v2alpha1. UsageError naming `what` when neither knows a field.
    """
    from google.cloud import tpu_v2, tpu_v2alpha1
    from google.protobuf import json_format

    error: json_format.ParseError | None = None
    for version, mod in (("v2", tpu_v2), ("v2alpha1", tpu_v2alpha1)):
        cls = getattr(mod, kind)
        pb = cls.pb()()
        try:
            json_format.ParseDict(_alpha_names(data) if version == "v2alpha1" else dict(data), pb)
        except json_format.ParseError as exc:
            error = exc
            continue
        return version, cls.wrap(pb)
    raise UsageError(f"{what}: {error}; use the fields of a TPU node (see `tpuwatch init`)")


def _alpha_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """A QueuedResource's v2 field names as v2alpha1 spells them: its node spec's
    `multisliceParams` is `multiNodeParams` there."""
    out = dict(data)
    tpu = out.get("tpu")
    if isinstance(tpu, Mapping) and isinstance(tpu.get("nodeSpec"), list):
        specs = [{("multiNodeParams" if k == "multisliceParams" else k): v for k, v in spec.items()}
                 if isinstance(spec, Mapping) else spec for spec in tpu["nodeSpec"]]
        out["tpu"] = {**tpu, "nodeSpec": specs}
    return out


def _types(version: str) -> Any:
    from google.cloud import tpu_v2, tpu_v2alpha1

    return tpu_v2alpha1 if version == "v2alpha1" else tpu_v2


def operation_status(op: Any) -> OperationStatus:
    """OperationStatus of a google.longrunning Operation protobuf."""
    done = bool(op.done)
    code, message = 0, ""
    if done and op.HasField("error"):
        code, message = int(op.error.code), op.error.message
    return OperationStatus(name=op.name, done=done, error_code=code, error_message=message)


class _LazyInstances(Mapping[str, tuple[str, str]]):
    """A mapping computed on its first use."""

    def __init__(self, make: Callable[[], dict[str, tuple[str, str]]]) -> None:
        self._make = make
        self._value: dict[str, tuple[str, str]] | None = None

    def _get(self) -> dict[str, tuple[str, str]]:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __getitem__(self, key: str) -> tuple[str, str]:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class TpuAdapter:
    """ports.TpuApi over google-cloud-tpu for one project and zone."""

    def __init__(self, project: str, zone: str, *, retry: RetryPolicy | None = None,
                 page_size: int = PAGE_SIZE) -> None:
        self.project = project
        self.zone = zone
        self.retry = retry or RetryPolicy.from_env()
        self.page_size = page_size
        self._read_version = "v2alpha1"
        self._clients: dict[str, Any] = {}
        self._instances: dict[str, tuple[str, ...]] = {}  # node id -> its workers' instance names
        self._instances_tried: dict[str, float] = {}  # node id -> when a read found them incomplete

    # -- plumbing ---------------------------------------------------------------------------
    def _client(self, version: str) -> Any:
        if version not in self._clients:
            self._clients[version] = clients.tpu_client(version)
        return self._clients[version]

    def _parent(self, zone: str | None = None) -> str:
        return f"projects/{self.project}/locations/{zone or self.zone}"

    def _full(self, name: str) -> str:
        if name.startswith("projects/"):
            return name
        if not NODE_NAME.match(name):
            raise UsageError(
                f"{name!r} is not a TPU name (lowercase letters, digits and hyphens, starting with a letter)"
            )
        return f"{self._parent()}/nodes/{name}"

    def _call(self, call: Call, fn: Callable[[], T], *, read: bool) -> T:
        try:
            return self.retry.call(calls.counted(call, fn), transient=lambda e: is_transient(e, read=read),
                                   patient=rate_limited)
        except TpuwatchError:
            raise
        except gexc.NotFound as exc:
            if _zone_not_found(exc):
                zone = split_node_name(call.target + "/")[1] or self.zone
                raise UsageError(
                    f"{call}: zone {zone!r} is not a Cloud TPU location in project "
                    f"{self.project} ({exc.message}); check --zone"
                ) from None
            raise translate(exc, call, project=self.project) from None
        except Exception as exc:
            raise translate(exc, call, project=self.project) from None

    def _read(self, method: str, target: str, needs: str, fn: Callable[[Any, Any], T]) -> T:
        """A read through v2alpha1, falling back to v2 once if v2alpha1 is not served."""
        call = Call("TPU API", method, target, needs, "tpu.googleapis.com")
        from google.cloud import tpu_v2, tpu_v2alpha1

        def attempt() -> T:
            version = self._read_version
            types = tpu_v2alpha1 if version == "v2alpha1" else tpu_v2
            return fn(self._client(version), types)

        try:
            return self._call(call, attempt, read=True)
        except TpuwatchError as exc:
            if getattr(exc, "code", "") == "UNIMPLEMENTED" and self._read_version == "v2alpha1":
                self._read_version = "v2"
                return self._call(call, attempt, read=True)
            raise

    # -- ports.TpuApi -----------------------------------------------------------------------
    def get_node(self, name: str) -> NodeSnapshot | None:
        """The node, or None when the API says NOT_FOUND."""
        node = self.get_node_message(name)
        return None if node is None else snapshot(node, project=self.project, zone=self.zone)

    def worker_instances(self, *nodes: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        """Instance name -> (node, worker id) for the audit readers (logs.match_resource); of
        every slice of a multislice job.

        Lazy: the guest attributes are read on the first lookup, which a reader makes only when
        the log holds an entry about a TPU worker VM (an upcoming-maintenance notice).
        """
        return _LazyInstances(lambda: {inst: (part.name, str(i)) for node in nodes for part in node.slices or (node,)
                                       if part.name for i, inst in enumerate(self.instance_names(part)) if inst})

    def take_notes(self) -> list[str]:
        """Nothing to say: a TPU API node's workers are numbered by the API itself."""
        return []

    def resize_request(self, node: NodeSnapshot) -> QueuedStatus | None:
        """None: a TPU API node asks for capacity through its queued resource, not a request of its own."""
        return None

    def drill_target(self, node: NodeSnapshot, worker: int) -> tuple[str, str]:
        """A multislice job's worker N is a worker of one of its slices, with its id there."""
        slice_name, worker_id = _drill_worker(node, worker)
        return f"worker {worker_id}", slice_name

    def simulate_worker_maintenance(self, node: NodeSnapshot, worker: int) -> str:
        slice_name, worker_id = _drill_worker(node, worker)
        return self.simulate_maintenance_event(slice_name, [str(worker_id)])

    def instance_names(self, node: NodeSnapshot) -> tuple[str, ...]:
        """The workers' Compute Engine instance names (guest attribute `hostname`, as gcloud
        reads it): one GetGuestAttributes per node id, while READY; () until every worker has
        published one (retried every INSTANCES_RETRY s), and when the call fails (the audit log
        then only misses upcoming-maintenance entries)."""
        if not node.id or node.state != "READY" or not node.workers:
            return self._instances.get(node.id, ())
        if node.id in self._instances:
            return self._instances[node.id]
        tried = self._instances_tried.get(node.id)
        if tried is not None and time.monotonic() - tried < INSTANCES_RETRY:
            return ()
        self._instances_tried[node.id] = time.monotonic()
        full = self._full(node.name)

        def get(client: Any, types: Any) -> Any:
            return client.get_guest_attributes(request=types.GetGuestAttributesRequest(name=full),
                                               retry=None, timeout=RPC_TIMEOUT)

        try:
            response = self._read("get_guest_attributes", full, "tpu.nodes.get", get)
        except TpuwatchError:
            return ()
        names = tuple(next((str(item.value) for item in ga.query_value.items if item.key == "hostname"), "")
                      for ga in response.guest_attributes)
        if len(names) != len(node.workers) or not all(names):
            return ()
        self._instances[node.id] = names
        return names

    def get_node_message(self, name: str) -> Any | None:
        """The node as the API's v2alpha1 (or v2) `Node` message with every field; None when missing.

        For callers that need more than a snapshot (capturing a spec to recreate from).
        One request, under the same retry and error translation as every other read.
        """
        full = self._full(name)

        def get(client: Any, types: Any) -> Any:
            try:
                return client.get_node(request=types.GetNodeRequest(name=full), retry=None, timeout=RPC_TIMEOUT)
            except gexc.NotFound as exc:
                if _zone_not_found(exc):
                    raise
                return None

        return self._read("get_node", full, "tpu.nodes.get", get)

    def host_keys(self, name: str) -> dict[int, tuple[str, ...]]:
        """Each worker's SSH host keys as its guest attributes publish them (query path
        `hostkeys/`): worker index -> ("ssh-ed25519 AAAA...", ...). One request for every worker;
        the answer lists the workers in index order, as gcloud reads it.

        Empty when the node publishes none: it is gone, or guest attributes are not readable
        (the `compute.disableGuestAttributesAccess` organization policy, a VM older than the
        feature). HostKeysRefused when the read is refused for lack of a permission
        (tpu.nodes.getGuestAttributes); other errors raise as every read does.
        """
        full = self._full(name)

        def get(client: Any, types: Any) -> Any:
            try:
                return client.get_guest_attributes(
                    request=types.GetGuestAttributesRequest(name=full, query_path="hostkeys/"),
                    retry=None, timeout=RPC_TIMEOUT)
            except gexc.NotFound as exc:
                if _zone_not_found(exc):
                    raise
                return None
            except gexc.FailedPrecondition:
                return None

        try:
            answer = self._read("get_guest_attributes", full, "tpu.nodes.getGuestAttributes", get)
        except ApiError as exc:
            if exc.code != "PERMISSION_DENIED":
                raise
            raise HostKeysRefused(exc.message, permission=exc.permission) from None
        out: dict[int, tuple[str, ...]] = {}
        for worker, attrs in enumerate(answer.guest_attributes if answer is not None else ()):
            keys = tuple(f"{item.key} {item.value}" for item in attrs.query_value.items
                         if item.namespace == "hostkeys" and item.key and item.value)
            if keys:
                out[worker] = keys
        return out

    def get_queued_resource(self, name: str) -> Any | None:
        """A `tpu_v2alpha1.QueuedResource` (`tpu_v2` where v2alpha1 is not served) by short or
        full name, or None when it does not exist. Read like a node, through v2alpha1: only it
        shows the best_effort tier and guaranteed.reserved, which a recreate must ask for again."""
        full = self.queued_resource_name(name)

        def get(client: Any, types: Any) -> Any:
            try:
                return client.get_queued_resource(request=types.GetQueuedResourceRequest(name=full), retry=None,
                                                  timeout=RPC_TIMEOUT)
            except gexc.NotFound as exc:
                if _zone_not_found(exc):
                    raise
                return None

        return self._read("get_queued_resource", full, "tpu.queuedResources.get", get)

    def queued_status(self, name: str, zone: str | None = None) -> QueuedStatus:
        """The queued resource's state as a model value (state "" when it does not exist)."""
        full = self.queued_resource_name(name, zone)
        qr = self.get_queued_resource(full)
        if qr is None:
            return QueuedStatus(full, "")
        pb = _pb(qr)
        state = pb.state
        code, message = 0, ""
        if state.HasField("failed_data"):
            code, message = int(state.failed_data.error.code), state.failed_data.error.message
        count, _prefix = multislice_params(qr)
        return QueuedStatus(full, enum_name(state, "state"), code, message, count)

    def require_node(self, name: str) -> NodeSnapshot:
        """get_node, or NotFoundError (exit 1) saying where tpuwatch looked."""
        node = self.get_node(name)
        if node is None:
            raise NotFoundError(
                f"no TPU named {name} in {self.project}/{self.zone} "
                "(check the name, --project and --zone; `tpuwatch status --all` lists the zone)"
            )
        return node

    def list_nodes(self, zone: str | None = None) -> list[NodeSnapshot]:
        """Every node in the zone: one List request per page, each page retried on its own."""
        parent = self._parent(zone)
        out: list[NodeSnapshot] = []
        token = ""
        while True:
            def page(client: Any, types: Any, token: str = token) -> Any:
                req = types.ListNodesRequest(parent=parent, page_size=self.page_size, page_token=token)
                # The pager delegates `.nodes` / `.next_page_token` to this one response;
                # iterating it would fetch further pages outside the retry policy.
                return client.list_nodes(request=req, retry=None, timeout=RPC_TIMEOUT)

            resp = self._read("list_nodes", parent, "tpu.nodes.list", page)
            out.extend(snapshot(n, project=self.project, zone=zone or self.zone) for n in resp.nodes)
            token = resp.next_page_token
            if not token:
                return out

    def delete_node(self, name: str) -> str:
        """Start a delete; the operation name. NotFoundError when the node is already gone."""
        from google.cloud import tpu_v2

        full = self._full(name)
        call = Call("TPU API", "delete_node", full, "tpu.nodes.delete", "tpu.googleapis.com", "roles/tpu.admin")
        client = self._client("v2")
        try:
            op = self._call(
                call,
                lambda: client.delete_node(request=tpu_v2.DeleteNodeRequest(name=full), retry=None,
                                           timeout=RPC_TIMEOUT),
                read=False,
            )
        except TpuwatchError as exc:
            if getattr(exc, "code", "") == "NOT_FOUND":
                raise NotFoundError(f"no TPU named {split_node_name(full)[2]} in {self.project}/{self.zone} to delete") from None
            raise
        return str(op.operation.name)

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        """Start a create of `name` from a JSON-like spec of Node fields; the operation name.

        The spec takes proto or JSON field names (`accelerator_type` or `acceleratorType`); one
        with v2alpha1-only fields (`bootDiskConfig`, `autocheckpointEnabled`) is sent to v2alpha1.
        RESOURCE_EXHAUSTED (no capacity, quota) is not retried here: it raises ApiError with
        code "RESOURCE_EXHAUSTED" for the caller's policy to decide.
        """
        if not NODE_NAME.match(name):
            raise UsageError(f"tpu.name: {name!r} is not a TPU name")
        parent = self._parent(zone)
        version, msg = parse_message("Node", node, "tpu.spec")
        types = _types(version)
        request = types.CreateNodeRequest(parent=parent, node_id=name, node=msg)
        call = Call("TPU API", "create_node", f"{parent}/nodes/{name}", "tpu.nodes.create", "tpu.googleapis.com",
                    "roles/tpu.admin")
        client = self._client(version)
        op = self._call(call, lambda: client.create_node(request=request, retry=None, timeout=RPC_TIMEOUT),
                        read=False)
        return str(op.operation.name)

    def update_node(self, name: str, fields: Mapping[str, Any], mask: Sequence[str]) -> str:
        """Start an update of the `mask` paths (e.g. ["labels"]) of the node to `fields`; the operation name.

        Only the masked fields change; a masked field missing from `fields` is cleared.
        NotFoundError when the node does not exist.
        """
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        full = self._full(name)
        if not mask:
            raise UsageError("update_node: name the fields to change (mask), e.g. [\"labels\"]")
        _version, msg = parse_message("Node", {**dict(fields), "name": full}, "update_node")
        if not isinstance(msg, tpu_v2.Node):
            raise UsageError(f"update_node: {', '.join(fields)} cannot be updated through the v2 API")
        request = tpu_v2.UpdateNodeRequest(node=msg, update_mask=field_mask_pb2.FieldMask(paths=list(mask)))
        call = Call("TPU API", "update_node", full, "tpu.nodes.update", "tpu.googleapis.com", "roles/tpu.admin")
        client = self._client("v2")
        try:
            op = self._call(call, lambda: client.update_node(request=request, retry=None, timeout=RPC_TIMEOUT),
                            read=False)
        except TpuwatchError as exc:
            if getattr(exc, "code", "") == "NOT_FOUND":
                raise NotFoundError(f"no TPU named {split_node_name(full)[2]} in {self.project}/{self.zone} "
                                    "to update") from None
            raise
        return str(op.operation.name)

    def read_node(self, name: str) -> NodeSnapshot | None:
        """ports.NodeLabels: the node as the API says it now."""
        return self.get_node(name)

    def set_labels(self, name: str, labels: Mapping[str, str]) -> str:
        """Start replacing the node's labels with `labels` (update_node, mask "labels"); the operation name.

        Pass the labels to keep too: the API sets the whole map.
        """
        return self.update_node(name, {"labels": dict(labels)}, ["labels"])

    # -- queued resources ---------------------------------------------------------------------
    def queued_resource_name(self, name: str, zone: str | None = None) -> str:
        """The full name of queued resource `name` (short or full) in `zone` (default: ours)."""
        return name if name.startswith("projects/") else f"{self._parent(zone)}/queuedResources/{name}"

    def create_queued_resource(self, qr_id: str, queued_resource: Mapping[str, Any],
                               zone: str | None = None) -> str:
        """Start creating queued resource `qr_id` from a JSON-like QueuedResource; the operation name.

        Like create_node: v2, or v2alpha1 when the request needs it (a v2alpha1-only node field, or
        the best_effort tier or guaranteed.reserved); RESOURCE_EXHAUSTED is raised
        (not retried) for the caller to classify.
        """
        if not NODE_NAME.match(qr_id):
            raise UsageError(f"tpu.queued_resource: {qr_id!r} is not a queued resource id")
        parent = self._parent(zone)
        version, msg = parse_message("QueuedResource", queued_resource, "tpu.spec")
        types = _types(version)
        request = types.CreateQueuedResourceRequest(parent=parent, queued_resource_id=qr_id, queued_resource=msg)
        call = Call("TPU API", "create_queued_resource", f"{parent}/queuedResources/{qr_id}",
                    "tpu.queuedResources.create", "tpu.googleapis.com", "roles/tpu.admin")
        client = self._client(version)
        op = self._call(call, lambda: client.create_queued_resource(request=request, retry=None,
                                                                    timeout=RPC_TIMEOUT), read=False)
        return str(op.operation.name)

    def delete_queued_resource(self, name: str, *, force: bool = True, zone: str | None = None) -> str:
        """Start deleting the queued resource (with `force`, its node goes first); the operation name.

        NotFoundError when it does not exist.
        """
        from google.cloud import tpu_v2

        full = self.queued_resource_name(name, zone)
        call = Call("TPU API", "delete_queued_resource", full, "tpu.queuedResources.delete", "tpu.googleapis.com",
                    "roles/tpu.admin")
        client = self._client("v2")
        request = tpu_v2.DeleteQueuedResourceRequest(name=full, force=force)
        try:
            op = self._call(call, lambda: client.delete_queued_resource(request=request, retry=None,
                                                                        timeout=RPC_TIMEOUT), read=False)
        except TpuwatchError as exc:
            if getattr(exc, "code", "") == "NOT_FOUND":
                raise NotFoundError(f"no queued resource {full} to delete") from None
            raise
        return str(op.operation.name)

    def perform_maintenance(self, name: str) -> str:
        """Start the node's announced maintenance now (v2alpha1 nodes.performMaintenance); the
        operation name. A refusal (UNIMPLEMENTED for a TPU type that does not offer it,
        FAILED_PRECONDITION with nothing pending, or any other lifecycle.MAINTENANCE_REFUSALS code)
        raises ApiError with that code, unretried."""
        from google.cloud import tpu_v2alpha1

        full = self._full(name)
        call = Call("TPU API", "perform_maintenance", full, "tpu.nodes.performMaintenance", "tpu.googleapis.com",
                    "roles/tpu.admin")
        client = self._client("v2alpha1")
        request = tpu_v2alpha1.PerformMaintenanceRequest(name=full)
        op = self._call(call, lambda: client.perform_maintenance(request=request, retry=None, timeout=RPC_TIMEOUT),
                        read=False)
        return str(op.operation.name)

    def simulate_maintenance_event(self, name: str, worker_ids: list[str]) -> str:
        """A fire drill: v2alpha1 nodes.simulateMaintenanceEvent on `worker_ids` (Google uses the
        first listed worker today); the operation name."""
        from google.cloud import tpu_v2alpha1

        full = self._full(name)
        call = Call("TPU API", "simulate_maintenance_event", full, "tpu.nodes.simulateMaintenanceEvent",
                    "tpu.googleapis.com", "roles/tpu.admin")
        client = self._client("v2alpha1")
        request = tpu_v2alpha1.SimulateMaintenanceEventRequest(name=full, worker_ids=worker_ids)
        op = self._call(call, lambda: client.simulate_maintenance_event(request=request, retry=None,
                                                                        timeout=RPC_TIMEOUT), read=False)
        return str(op.operation.name)

    def perform_maintenance_queued_resource(self, name: str, node_names: list[str]) -> str:
        """Start the announced maintenance of the queued resource's nodes `node_names` now (v2alpha1
        queuedResources.performMaintenanceQueuedResource); the operation name. The nodes go by their
        short names, as gcloud passes `--node-names` and getMaintenanceInfo names them ("unqualified
        node name"): a full name is reduced to its last part."""
        from google.cloud import tpu_v2alpha1

        full = self.queued_resource_name(name)
        call = Call("TPU API", "perform_maintenance_queued_resource", full,
                    "tpu.queuedResources.performMaintenanceQueuedResource", "tpu.googleapis.com", "roles/tpu.admin")
        client = self._client("v2alpha1")
        request = tpu_v2alpha1.PerformMaintenanceQueuedResourceRequest(
            name=full, node_names=[n.rsplit("/", 1)[-1] for n in node_names])
        op = self._call(call, lambda: client.perform_maintenance_queued_resource(
            request=request, retry=None, timeout=RPC_TIMEOUT), read=False)
        return str(op.operation.name)

    def get_operation(self, name: str) -> OperationStatus:
        from google.longrunning import operations_pb2

        call = Call("TPU API", "get_operation", name, "tpu.operations.get", "tpu.googleapis.com")
        client = self._client("v2")
        op = self._call(
            call,
            lambda: client.get_operation(request=operations_pb2.GetOperationRequest(name=name), retry=None,
                                         timeout=RPC_TIMEOUT),
            read=True,
        )
        return operation_status(op)

    def snapshot(self, node: Any) -> NodeSnapshot:
        return snapshot(node, project=self.project, zone=self.zone)


def _drill_worker(node: NodeSnapshot, worker: int) -> tuple[str, int]:
    """The slice worker `worker` (numbered across a multislice job's slices) is on, and its id there."""
    hit = next(w for w in node.workers if w.index == worker) if node.slices else None
    return (hit.node, hit.worker_id) if hit is not None else (node.name, worker)
