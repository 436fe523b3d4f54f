"""System-event audit log entries the simulated TPU service writes, in the real shape.

TPU entries name the node (`projects/P/locations/Z/nodes/N[/workers/W]`, a `tpu_worker`
resource); upcoming maintenance is a Compute Engine entry about one worker VM
(`projects/P/zones/Z/instances/t1v-n-<hex>-w-<W>`, service compute.googleapis.com, a
`gce_instance` resource), as in Google's "View maintenance notifications" example. A TPU VM made
through Compute Engine gets Compute Engine entries alone (`compute.instances.hostError`, ...),
each also a zone operation (`operation.id`).

An `AuditRecord` is one entry as plain data; `to_log_entry` renders it as the
`google.logging.v2.LogEntry` the Logging API returns (a `tpu_worker` resource, an `AuditLog`
packed in `proto_payload`), and `filter_fields` gives the flat field view the Logging filter
(`logfilter.py`) evaluates. This module does not decide when entries are written: the world does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYSTEM_EVENT_LOG = "cloudaudit.googleapis.com%2Fsystem_event"
SERVICE = "tpu.googleapis.com"
COMPUTE_SERVICE = "compute.googleapis.com"
AUDIT_TYPE = "type.googleapis.com/google.cloud.audit.AuditLog"

TERMINATE = "tpu.nodes.terminate"
RESTART = "tpu.nodes.restart"
UPCOMING_MAINTENANCE = "compute.instances.upcomingMaintenance"


@dataclass(frozen=True)
class AuditRecord:
    seq: int  # order of writing; ties on timestamp are broken by it
    time_ns: int
    receive_ns: int  # when the entry becomes visible to readers (ingestion latency)
    project: str
    zone: str
    node: str
    worker: str | None  # worker-level entry when set
    method: str
    insert_id: str
    severity: str = "NOTICE"
    metadata: dict[str, Any] = field(default_factory=dict)
    instance: str = ""  # a Compute Engine entry about this worker VM (upcoming maintenance)
    instance_id: str = ""  # its numeric instance id (resource label)
    status_message: str = ""  # protoPayload.status.message (upcomingMaintenance says which stage)
    operation_id: str = ""  # the zone operation the event is (operation.id, first and last)

    @property
    def service(self) -> str:
        return COMPUTE_SERVICE if self.instance else SERVICE

    @property
    def resource_type(self) -> str:
        return "gce_instance" if self.instance else "tpu_worker"

    @property
    def log_name(self) -> str:
        return f"projects/{self.project}/logs/{SYSTEM_EVENT_LOG}"

    @property
    def resource_name(self) -> str:
        if self.instance:
            return f"projects/{self.project}/zones/{self.zone}/instances/{self.instance}"
        base = f"projects/{self.project}/locations/{self.zone}/nodes/{self.node}"
        return f"{base}/workers/{self.worker}" if self.worker is not None else base

    @property
    def resource_labels(self) -> dict[str, str]:
        if self.instance:
            return {"project_id": self.project, "zone": self.zone, "instance_id": self.instance_id}
        labels = {"project_id": self.project, "zone": self.zone, "node_id": self.node}
        if self.worker is not None:
            labels["worker_id"] = self.worker
        return labels


def filter_fields(rec: AuditRecord) -> dict[str, str | int]:
    """The entry's fields by Logging filter path; `timestamp` is in nanoseconds."""
    out: dict[str, str | int] = {
        "logName": rec.log_name,
        "timestamp": rec.time_ns,
        "receiveTimestamp": rec.receive_ns,
        "insertId": rec.insert_id,
        "severity": rec.severity,
        "resource.type": rec.resource_type,
        "protoPayload.@type": AUDIT_TYPE,
        "protoPayload.methodName": rec.method,
        "protoPayload.resourceName": rec.resource_name,
        "protoPayload.serviceName": rec.service,
    }
    for k, v in rec.resource_labels.items():
        out[f"resource.labels.{k}"] = v
    if rec.status_message:
        out["protoPayload.status.message"] = rec.status_message
    if rec.operation_id:
        out["operation.id"] = rec.operation_id
        out["operation.producer"] = rec.service
    for k, v in rec.metadata.items():
        if isinstance(v, (str, int, float, bool)):
            out[f"protoPayload.metadata.{k}"] = str(v)
    return out


def _timestamp(ns: int) -> Any:
    from google.protobuf import timestamp_pb2

    return timestamp_pb2.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def to_log_entry(rec: AuditRecord) -> Any:
    """A `google.cloud.logging_v2.types.LogEntry` holding the entry's AuditLog."""
    from google.api import monitored_resource_pb2
    from google.cloud.audit import audit_log_pb2
    from google.cloud.logging_v2.types import LogEntry
    from google.logging.type import log_severity_pb2
    from google.protobuf import any_pb2, struct_pb2

    payload = audit_log_pb2.AuditLog(
        service_name=rec.service,
        method_name=rec.method,
        resource_name=rec.resource_name,
    )
    if rec.status_message:
        payload.status.message = rec.status_message
    if rec.metadata:
        meta = struct_pb2.Struct()
        meta.update(rec.metadata)
        payload.metadata.CopyFrom(meta)
    packed = any_pb2.Any()
    packed.Pack(payload)
    entry = LogEntry.pb()(
        log_name=rec.log_name,
        resource=monitored_resource_pb2.MonitoredResource(
            type=rec.resource_type, labels=rec.resource_labels
        ),
        proto_payload=packed,
        timestamp=_timestamp(rec.time_ns),
        receive_timestamp=_timestamp(rec.receive_ns),
        severity=log_severity_pb2.LogSeverity.Value(rec.severity),
        insert_id=rec.insert_id,
    )
    if rec.operation_id:
        entry.operation.id = rec.operation_id
        entry.operation.producer = rec.service
        entry.operation.first = entry.operation.last = True
    return LogEntry.wrap(entry)
