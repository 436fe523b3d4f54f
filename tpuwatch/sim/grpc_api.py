"""The simulator's gRPC services, built from the message types the Google client packages ship.

Served: `google.cloud.tpu.v2.Tpu` and `google.cloud.tpu.v2alpha1.Tpu` (nodes, UpdateNode of
labels/metadata/description, queued resources, guest attributes; maintenance in v2alpha1),
`google.longrunning.Operations`, `google.logging.v2.LoggingServiceV2/ListLogEntries`, and the simulator's own JSON control
service `tpuwatch.sim.Control` (inject faults, read call counters, create nodes) used by
`tpuwatch sim inject`. Every Google call is counted and may fail by injection before it runs
(`World.before_call`). This module translates between protobufs and the world's plain records;
it holds no state of its own.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.cloud import tpu_v2, tpu_v2alpha1
from google.cloud.logging_v2.types import ListLogEntriesRequest, ListLogEntriesResponse
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2

from tpuwatch.errors import TpuwatchError
from tpuwatch.sim import audit, schema
from tpuwatch.sim.metadata import worker_hostname
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
    NodeSpec,
    OperationRec,
    QueuedRec,
    parse_node_name,
    rfc3339_ns,
)
from tpuwatch.sim.shapes import accelerator_from_config
from tpuwatch.sim.world import World

log = logging.getLogger(__name__)

TPU_V2 = "google.cloud.tpu.v2.Tpu"
TPU_V2ALPHA1 = "google.cloud.tpu.v2alpha1.Tpu"
OPERATIONS = "google.longrunning.Operations"
LOGGING = "google.logging.v2.LoggingServiceV2"
CONTROL = "tpuwatch.sim.Control"

_VERSIONS: dict[str, Any] = {"v2": tpu_v2, "v2alpha1": tpu_v2alpha1}
SUBNET_RANGE = "10.128.0.0/20"  # the simulated project's default subnetwork in every region


def _ts(ns: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def _parent(parent: str) -> tuple[str, str]:
    parts = parent.split("/")
    if (
        len(parts) != 4
        or parts[0] != "projects"
        or parts[2] != "locations"
        or not parts[1]
        or not parts[3]
    ):
        raise ApiError(
            "INVALID_ARGUMENT", f"Invalid parent {parent!r}; expected projects/P/locations/Z"
        )
    return parts[1], parts[3]


def _child(name: str, collection: str) -> tuple[str, str, str]:
    parts = name.split("/")
    if (
        len(parts) != 6
        or parts[0] != "projects"
        or parts[2] != "locations"
        or parts[4] != collection
    ):
        raise ApiError(
            "INVALID_ARGUMENT",
            f"Invalid resource name {name!r}; expected projects/P/locations/Z/{collection}/NAME",
        )
    return parts[1], parts[3], parts[5]


# --- rendering ----------------------------------------------------------------------------


def nic_addresses(ip: str, networks: int) -> list[str]:
    """A worker's address on each of its `networks` networks: `ip` first, then loopback
    addresses in 127.255-k.x.y that no simulated host listens on (a client that takes one for a
    worker fails to reach it)."""
    tail = ip.split(".", 2)[-1] if ip.startswith("127.") else "0.1"
    return [ip, *(f"127.{255 - k}.{tail}" for k in range(max(networks, 1) - 1))]


def render_node(rec: NodeRec, version: str) -> Any:
    """The node as `tpu_v2.Node` or `tpu_v2alpha1.Node`; request fields echoed as given."""
    mod = _VERSIONS[version]
    node = (
        mod.Node.from_json(rec.spec.spec_json, ignore_unknown_fields=True)
        if rec.spec.spec_json
        else mod.Node()
    )
    node.name = rec.full_name
    node.accelerator_type = (
        rec.spec.accelerator_type if not rec.spec.accelerator_config else node.accelerator_type
    )
    node.runtime_version = rec.spec.runtime_version
    node.description = rec.spec.description
    node.state = mod.Node.State[rec.state]
    node.health = mod.Node.Health[rec.health]
    node.health_description = rec.health_description
    node.id = rec.id
    node.create_time = _ts(rec.create_ns)
    node.api_version = mod.Node.ApiVersion.V2 if version == "v2" else mod.Node.ApiVersion.V2_ALPHA1
    node.labels = dict(rec.spec.labels)
    node.metadata = dict(rec.spec.metadata)
    sched = mod.SchedulingConfig(spot=rec.spec.spot, preemptible=rec.spec.preemptible)
    if "scheduling_config" in node:
        sched.reserved = node.scheduling_config.reserved
    node.scheduling_config = sched
    if not node.cidr_block:  # filled in by the API: the range the workers' addresses come from
        node.cidr_block = SUBNET_RANGE
    node.queued_resource = rec.queued_resource
    node.multislice_node = rec.multislice_node
    # As Google lists a node with several networks: each worker's interfaces side by side, its
    # first network's first. The other interfaces get addresses no simulated host listens on.
    node.network_endpoints = [
        mod.NetworkEndpoint(
            ip_address=nic_ip, port=8470, access_config=mod.AccessConfig(external_ip=nic_ip)
        )
        for ip in rec.ips
        for nic_ip in nic_addresses(ip, len(node.network_configs))
    ]
    node.symptoms = [
        mod.Symptom(
            create_time=_ts(s.time_ns),
            symptom_type=mod.Symptom.SymptomType[s.type],
            details=s.details,
            worker_id=s.worker_id,
        )
        for s in rec.symptoms
    ]
    if version == "v2alpha1" and rec.upcoming is not None:
        u = rec.upcoming
        node.upcoming_maintenance = mod.UpcomingMaintenance(
            type_=mod.UpcomingMaintenance.MaintenanceType[u.type],
            can_reschedule=u.can_reschedule,
            # These three are RFC 3339 strings in v2alpha1, not Timestamps.
            window_start_time=rfc3339_ns(u.window_start_ns),
            window_end_time=rfc3339_ns(u.window_end_ns),
            latest_window_start_time=rfc3339_ns(u.latest_window_start_ns),
            maintenance_status=mod.UpcomingMaintenance.MaintenanceStatus[u.status],
        )
    return node


def render_queued(qr: QueuedRec, version: str = "v2") -> Any:
    """The queued resource as `tpu_v2.QueuedResource` or `tpu_v2alpha1.QueuedResource`."""
    mod = _VERSIONS[version]
    out = (
        mod.QueuedResource.from_json(qr.spec_json, ignore_unknown_fields=True)
        if qr.spec_json
        else mod.QueuedResource()
    )
    out.name = qr.full_name
    out.create_time = _ts(qr.create_ns)
    if qr.node_count and out.tpu.node_spec:
        # Echo the multislice parameters under this version's name for them, as Google
        # does, with the prefix it defaulted (the request's id when none was given).
        ns = out.tpu.node_spec[0]
        params_type = (
            mod.QueuedResource.Tpu.NodeSpec.MultisliceParams
            if version == "v2"
            else mod.QueuedResource.Tpu.NodeSpec.MultiNodeParams
        )
        setattr(ns, _multislice_field(version),
                params_type(node_count=qr.node_count, node_id_prefix=qr.node_prefix))
        out.tpu.node_spec = [ns]
    state = mod.QueuedResourceState(state=mod.QueuedResourceState.State[qr.state])
    if qr.state == "FAILED":
        state.failed_data = mod.QueuedResourceState.FailedData(
            error=status_pb2.Status(code=8, message=qr.error)
        )
    out.state = state
    return out


def _multislice_field(version: str) -> str:
    """v2 calls the node spec's multislice parameters `multislice_params`; v2alpha1 calls the
    same message `multi_node_params` (gcloud's queued-resources util says so too)."""
    return "multislice_params" if version == "v2" else "multi_node_params"


def create_queued(w: World, version: str, p: str, z: str, qr_id: str, qr: Any) -> OperationRec:
    """Create a queued resource from a `QueuedResource` message of `version` (gRPC or REST)."""
    w.check_zone(p, z)
    specs = list(qr.tpu.node_spec)
    if len(specs) != 1:
        raise ApiError(
            "INVALID_ARGUMENT",
            "the simulator supports queued resources with exactly one tpu.node_spec",
        )
    ns = specs[0]
    spec = spec_from_node(ns.node, z)
    if "spot" in qr:
        spec.spot = True
    multi = _multislice_field(version)
    params = getattr(ns, multi) if multi in ns else None
    return w.create_queued_resource(
        p,
        z,
        qr_id,
        ns.node_id,
        spec,
        spec.spot,
        type(qr).to_json(qr),
        api_version=version,
        node_count=params.node_count if params is not None else 0,
        node_prefix=params.node_id_prefix if params is not None else "",
    )


def render_operation(op: OperationRec) -> operations_pb2.Operation:
    mod = _VERSIONS[op.api_version]
    out = operations_pb2.Operation(name=op.name, done=op.done)
    meta = mod.OperationMetadata(
        create_time=_ts(op.create_ns),
        target=op.target,
        verb=op.verb,
        api_version=op.api_version,
    )
    if op.done:
        meta.end_time = _ts(op.end_ns)
    out.metadata.Pack(mod.OperationMetadata.pb(meta))
    if op.done:
        if op.error is not None:
            out.error.CopyFrom(status_pb2.Status(code=op.error[0], message=op.error[1]))
        elif op.response_kind == "node" and op.response is not None:
            out.response.Pack(mod.Node.pb(render_node(op.response, op.api_version)))
        elif op.response_kind == "queued_resource" and op.response is not None:
            out.response.Pack(mod.QueuedResource.pb(render_queued(op.response, op.api_version)))
        else:
            out.response.Pack(empty_pb2.Empty())
    return out


def spec_from_node(node: Any, zone: str) -> NodeSpec:
    """What the world needs from a create request's Node (v2 or v2alpha1)."""
    accel = node.accelerator_type
    config: tuple[str, str] | None = None
    if not accel and "accelerator_config" in node:
        type_name = node.accelerator_config.type_.name
        topology = node.accelerator_config.topology
        try:
            accel = accelerator_from_config(type_name, topology)
        except ValueError as exc:
            raise ApiError("INVALID_ARGUMENT", str(exc))
        config = (type_name, topology)
    if not accel:
        raise ApiError(
            "INVALID_ARGUMENT", "Node.accelerator_type or Node.accelerator_config is required"
        )
    if not node.runtime_version:
        raise ApiError("INVALID_ARGUMENT", "Node.runtime_version is required")
    if node.cidr_block:
        try:
            block = ipaddress.ip_network(node.cidr_block, strict=False)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for field 'cidr_block': {node.cidr_block!r}")
        if block.overlaps(ipaddress.ip_network(SUBNET_RANGE)):
            # As Google documents the field: a block that conflicts with a subnetwork of the
            # network is an error (a node reports its subnetwork's range, so sending it back fails).
            raise ApiError("INVALID_ARGUMENT", f"CIDR block {node.cidr_block} conflicts with subnetwork "
                           f"default ({SUBNET_RANGE}) in network default")
    sched = node.scheduling_config
    return NodeSpec(
        accelerator_type=accel,
        runtime_version=node.runtime_version,
        spot=bool(sched.spot),
        preemptible=bool(sched.preemptible),
        labels=dict(node.labels),
        metadata=dict(node.metadata),
        description=node.description,
        spec_json=type(node).to_json(node),
        accelerator_config=config,
    )


# --- the services -------------------------------------------------------------------------


def _as_dict(request: Any) -> dict[str, Any]:
    """A proto-plus or protobuf request in the JSON mapping (camelCase, enum names)."""
    pb = request if isinstance(request, Message) else type(request).pb(request)
    return dict(json_format.MessageToDict(pb))


class Services:
    """Request handlers over one World; `handlers()` returns the gRPC generic handlers."""

    def __init__(
        self, world: World, control: Callable[[str, dict[str, Any]], Any] | None = None
    ) -> None:
        self.world = world
        self.control = control

    def _wrap(
        self, service: str, method: str, fn: Callable[[Any], Any], resource: Callable[[Any], str]
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        full = f"{service}/{method}"

        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                res = resource(request)
            except Exception:
                res = ""
            if service in (TPU_V2, TPU_V2ALPHA1):
                try:  # what Google's front end refuses of the request (discovery document)
                    schema.check_grpc("v2" if service == TPU_V2 else "v2alpha1", method, _as_dict(request))
                except schema.Refusal as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            injected = self.world.before_call(full, res)
            if injected is not None:
                context.abort(getattr(grpc.StatusCode, injected.code), injected.message)
            try:
                answer = fn(request)
            except ApiError as exc:
                context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            except Exception as exc:  # a simulator bug: surface it as INTERNAL with the cause
                log.exception("%s failed", full)
                context.abort(
                    grpc.StatusCode.INTERNAL,
                    f"simulator error in {method}: {type(exc).__name__}: {exc}",
                )
            lost = self.world.after_call(full)  # served, but the answer never arrives
            if lost is not None:
                context.abort(getattr(grpc.StatusCode, lost.code), lost.message)
            return answer

        return handler

    # --- TPU ---

    def _tpu_methods(self, version: str) -> dict[str, grpc.RpcMethodHandler]:
        mod = _VERSIONS[version]
        svc = TPU_V2 if version == "v2" else TPU_V2ALPHA1
        w = self.world
        op_ser = operations_pb2.Operation.SerializeToString

        def get_node(req: Any) -> Any:
            p, z, n = parse_node_name(req.name)
            return render_node(w.get_node(p, z, n), version)

        def list_nodes(req: Any) -> Any:
            p, z = _parent(req.parent)
            nodes = w.list_nodes(p, z)
            start = _page_start(req.page_token)
            size = req.page_size if req.page_size > 0 else 1000
            page = nodes[start : start + size]
            token = str(start + size) if start + size < len(nodes) else ""
            return mod.ListNodesResponse(
                nodes=[render_node(n, version) for n in page], next_page_token=token
            )

        def create_node(req: Any) -> Any:
            p, z = _parent(req.parent)
            w.check_zone(p, z)
            return render_operation(
                w.create_node(p, z, req.node_id, spec_from_node(req.node, z), version)
            )

        def delete_node(req: Any) -> Any:
            p, z, n = parse_node_name(req.name)
            return render_operation(w.delete_node(p, z, n, version))

        def stop_node(req: Any) -> Any:
            p, z, n = parse_node_name(req.name)
            return render_operation(w.stop_node(p, z, n, version))

        def start_node(req: Any) -> Any:
            p, z, n = parse_node_name(req.name)
            return render_operation(w.start_node(p, z, n, version))

        def guest_attributes(req: Any) -> Any:
            p, z, n = parse_node_name(req.name)
            rec = w.get_node(p, z, n)
            wanted = {int(x) for x in req.worker_ids if str(x).isdigit()} or set(
                range(rec.n_workers)
            )
            out = []
            for i, ip in enumerate(rec.ips):
                if i not in wanted:
                    continue
                items = [
                    mod.GuestAttributesEntry(
                        namespace="guestInventory",
                        key="hostname",  # gcloud's TPU ssh reads the instance name by this key
                        value=worker_hostname(rec.id, i),
                    ),
                    mod.GuestAttributesEntry(
                        namespace="guestInventory", key="InternalIP", value=ip
                    ),
                ]
                # each worker publishes its SSH host keys; tpuwatch pins them from here
                items += [
                    mod.GuestAttributesEntry(namespace="hostkeys", key=k, value=v)
                    for k, v in w.host_keys(rec, i).items()
                ]
                if req.query_path:
                    items = [
                        e
                        for e in items
                        if f"{e.namespace}/{e.key}".startswith(req.query_path.strip("/"))
                    ]
                out.append(
                    mod.GuestAttributes(
                        query_path=req.query_path, query_value=mod.GuestAttributesValue(items=items)
                    )
                )
            return mod.GetGuestAttributesResponse(guest_attributes=out)

        def update_node(req: Any) -> Any:
            p, z, n = parse_node_name(req.node.name)
            node = req.node
            fields = {
                "labels": dict(node.labels),
                "metadata": dict(node.metadata),
                "description": node.description,
            }
            return render_operation(
                w.update_node(p, z, n, fields, list(req.update_mask.paths), version)
            )

        def name_of(req: Any) -> str:
            node_name: Any = getattr(getattr(req, "node", None), "name", None)
            if node_name:  # UpdateNode names its node inside the request's Node
                return str(node_name)
            return str(getattr(req, "name", "") or getattr(req, "parent", ""))

        table: dict[str, tuple[Callable[[Any], Any], Any, Any]] = {
            "GetNode": (get_node, mod.GetNodeRequest.deserialize, mod.Node.serialize),
            "ListNodes": (
                list_nodes,
                mod.ListNodesRequest.deserialize,
                mod.ListNodesResponse.serialize,
            ),
            "CreateNode": (create_node, mod.CreateNodeRequest.deserialize, op_ser),
            "DeleteNode": (delete_node, mod.DeleteNodeRequest.deserialize, op_ser),
            "StopNode": (stop_node, mod.StopNodeRequest.deserialize, op_ser),
            "StartNode": (start_node, mod.StartNodeRequest.deserialize, op_ser),
            "UpdateNode": (update_node, mod.UpdateNodeRequest.deserialize, op_ser),
            "GetGuestAttributes": (
                guest_attributes,
                mod.GetGuestAttributesRequest.deserialize,
                mod.GetGuestAttributesResponse.serialize,
            ),
        }
        if version == "v2alpha1":

            def simulate(req: Any) -> Any:
                p, z, n = parse_node_name(req.name)
                return render_operation(w.simulate_maintenance_event(p, z, n, list(req.worker_ids)))

            def perform(req: Any) -> Any:
                p, z, n = parse_node_name(req.name)
                return render_operation(w.perform_maintenance(p, z, n))

            table["SimulateMaintenanceEvent"] = (
                simulate,
                mod.SimulateMaintenanceEventRequest.deserialize,
                op_ser,
            )
            table["PerformMaintenance"] = (
                perform,
                mod.PerformMaintenanceRequest.deserialize,
                op_ser,
            )

            def perform_qr(req: Any) -> Any:
                p, z, n = _child(req.name, "queuedResources")
                return render_operation(
                    w.perform_maintenance_queued_resource(p, z, n, list(req.node_names))
                )

            table["PerformMaintenanceQueuedResource"] = (
                perform_qr,
                mod.PerformMaintenanceQueuedResourceRequest.deserialize,
                op_ser,
            )

        def create_qr(req: Any) -> Any:
            p, z = _parent(req.parent)
            return render_operation(
                create_queued(w, version, p, z, req.queued_resource_id, req.queued_resource)
            )

        def get_qr(req: Any) -> Any:
            p, z, n = _child(req.name, "queuedResources")
            return render_queued(w.get_queued_resource(p, z, n), version)

        def list_qr(req: Any) -> Any:
            p, z = _parent(req.parent)
            items = w.list_queued_resources(p, z)
            start = _page_start(req.page_token)
            size = req.page_size if req.page_size > 0 else 1000
            token = str(start + size) if start + size < len(items) else ""
            return mod.ListQueuedResourcesResponse(
                queued_resources=[render_queued(q, version) for q in items[start : start + size]],
                next_page_token=token,
            )

        def delete_qr(req: Any) -> Any:
            p, z, n = _child(req.name, "queuedResources")
            return render_operation(
                w.delete_queued_resource(p, z, n, bool(req.force), api_version=version)
            )

        table["CreateQueuedResource"] = (
            create_qr,
            mod.CreateQueuedResourceRequest.deserialize,
            op_ser,
        )
        table["GetQueuedResource"] = (
            get_qr,
            mod.GetQueuedResourceRequest.deserialize,
            mod.QueuedResource.serialize,
        )
        table["ListQueuedResources"] = (
            list_qr,
            mod.ListQueuedResourcesRequest.deserialize,
            mod.ListQueuedResourcesResponse.serialize,
        )
        table["DeleteQueuedResource"] = (
            delete_qr,
            mod.DeleteQueuedResourceRequest.deserialize,
            op_ser,
        )
        return {
            method: grpc.unary_unary_rpc_method_handler(
                self._wrap(svc, method, fn, name_of),
                request_deserializer=de,
                response_serializer=ser,
            )
            for method, (fn, de, ser) in table.items()
        }

    # --- Operations ---

    def _operation_methods(self) -> dict[str, grpc.RpcMethodHandler]:
        w = self.world

        def get(req: operations_pb2.GetOperationRequest) -> operations_pb2.Operation:
            return render_operation(w.get_operation(req.name))

        def list_(
            req: operations_pb2.ListOperationsRequest,
        ) -> operations_pb2.ListOperationsResponse:
            ops = w.list_operations(req.name)
            start = _page_start(req.page_token)
            size = req.page_size if req.page_size > 0 else 1000
            token = str(start + size) if start + size < len(ops) else ""
            return operations_pb2.ListOperationsResponse(
                operations=[render_operation(o) for o in ops[start : start + size]],
                next_page_token=token,
            )

        def delete(req: operations_pb2.DeleteOperationRequest) -> empty_pb2.Empty:
            w.delete_operation(req.name)
            return empty_pb2.Empty()

        def cancel(req: operations_pb2.CancelOperationRequest) -> empty_pb2.Empty:
            w.get_operation(req.name)
            raise ApiError("FAILED_PRECONDITION", "Cloud TPU operations cannot be cancelled")

        def name_of(req: Any) -> str:
            return str(req.name)

        table: dict[str, tuple[Callable[[Any], Any], Any, Any]] = {
            "GetOperation": (
                get,
                operations_pb2.GetOperationRequest.FromString,
                operations_pb2.Operation.SerializeToString,
            ),
            "ListOperations": (
                list_,
                operations_pb2.ListOperationsRequest.FromString,
                operations_pb2.ListOperationsResponse.SerializeToString,
            ),
            "DeleteOperation": (
                delete,
                operations_pb2.DeleteOperationRequest.FromString,
                empty_pb2.Empty.SerializeToString,
            ),
            "CancelOperation": (
                cancel,
                operations_pb2.CancelOperationRequest.FromString,
                empty_pb2.Empty.SerializeToString,
            ),
        }
        return {
            m: grpc.unary_unary_rpc_method_handler(
                self._wrap(OPERATIONS, m, fn, name_of),
                request_deserializer=de,
                response_serializer=ser,
            )
            for m, (fn, de, ser) in table.items()
        }

    # --- Logging ---

    def _logging_methods(self) -> dict[str, grpc.RpcMethodHandler]:
        w = self.world

        def list_entries(req: Any) -> Any:
            rows, token = w.list_log_entries(
                list(req.resource_names), req.filter, req.order_by, req.page_size, req.page_token
            )
            return ListLogEntriesResponse(
                entries=[audit.to_log_entry(r) for r in rows], next_page_token=token
            )

        def name_of(req: Any) -> str:
            return str(req.resource_names[0]) if req.resource_names else ""

        return {
            "ListLogEntries": grpc.unary_unary_rpc_method_handler(
                self._wrap(LOGGING, "ListLogEntries", list_entries, name_of),
                request_deserializer=ListLogEntriesRequest.deserialize,
                response_serializer=ListLogEntriesResponse.serialize,
            )
        }

    # --- Control (JSON) ---

    def _control_methods(self) -> dict[str, grpc.RpcMethodHandler]:
        control = self.control

        def make(method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
            def handler(request: Any, context: grpc.ServicerContext) -> Any:
                if control is None:
                    context.abort(
                        grpc.StatusCode.UNIMPLEMENTED, "this simulator has no control service"
                    )
                    return None
                try:
                    return control(method, request if isinstance(request, dict) else {})
                except TpuwatchError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
                except ApiError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)

            return handler

        return {
            m: grpc.unary_unary_rpc_method_handler(
                make(m), request_deserializer=json_load, response_serializer=json_dump
            )
            for m in ("Inject", "Stats", "Nodes")
        }

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        return [
            grpc.method_handlers_generic_handler(TPU_V2, self._tpu_methods("v2")),
            grpc.method_handlers_generic_handler(TPU_V2ALPHA1, self._tpu_methods("v2alpha1")),
            grpc.method_handlers_generic_handler(OPERATIONS, self._operation_methods()),
            grpc.method_handlers_generic_handler(LOGGING, self._logging_methods()),
            grpc.method_handlers_generic_handler(CONTROL, self._control_methods()),
        ]


def _page_start(token: str) -> int:
    if not token:
        return 0
    if not token.isdigit():
        raise ApiError("INVALID_ARGUMENT", f"page_token {token!r} is not valid")
    return int(token)


def json_load(data: bytes) -> Any:
    return json.loads(data.decode() or "{}")


def json_dump(obj: Any) -> bytes:
    return json.dumps(obj, default=str).encode()


def control_call(address: str, method: str, payload: dict[str, Any], timeout: float = 60.0) -> Any:
    """Call the control service of a running simulator (used by `tpuwatch sim inject`)."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(
            f"/{CONTROL}/{method}", request_serializer=json_dump, response_deserializer=json_load
        )
        return stub(payload, timeout=timeout)
