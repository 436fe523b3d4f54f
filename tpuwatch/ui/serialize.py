"""JSON-ready dicts of model values; the field list is documented in docs/status-json.md.

Times are RFC 3339 UTC strings with microseconds ("2022-01-26T03:44:36.265703Z") or null.
Enum fields are the API's names; a number this version does not know is "UNKNOWN_ENUM_<n>".
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tpuwatch.model import AuditEvent, NodeSnapshot, UpcomingMaintenance
from tpuwatch.policy.maintenance import can_start_early, maintenance_plan


def rfc3339(t: datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def upcoming_json(um: UpcomingMaintenance | None, *, watched: bool) -> dict[str, Any] | None:
    if um is None:
        return None
    return {
        "type": um.type,
        "status": um.status,
        "can_reschedule": um.can_reschedule,
        "window_start": rfc3339(um.window_start),
        "window_end": rfc3339(um.window_end),
        "latest_window_start": rfc3339(um.latest_window_start),
        "can_start_early": can_start_early(um),
        "plan": maintenance_plan(um, watched=watched),
    }


def event_json(ev: AuditEvent) -> dict[str, Any]:
    return {
        "time": rfc3339(ev.time),
        "kind": ev.kind,
        "node": ev.node,
        "worker": ev.worker,
        "method": ev.method,
        "reason": ev.reason,
        "insert_id": ev.insert_id,
        "resource_name": ev.resource_name,
    }


def node_json(node: NodeSnapshot) -> dict[str, Any]:
    return {
        "name": node.name,
        "full_name": node.full_name,
        "kind": node.kind,
        "project": node.project,
        "zone": node.zone,
        "id": node.id,
        "create_time": rfc3339(node.create_time),
        "state": node.state,
        "health": node.health,
        "usable": node.usable,
        "health_description": node.health_description,
        "maintenance_time": rfc3339(node.maintenance_time),
        "symptoms": [
            {"type": s.type, "worker_id": s.worker_id, "time": rfc3339(s.time), "details": s.details}
            for s in node.symptoms
        ],
        "upcoming_maintenance": upcoming_json(node.upcoming_maintenance, watched=node.owner is not None),
        "workers": [
            {"index": w.index, "internal_ip": w.internal_ip, "external_ip": w.external_ip,
             **({"slice": w.slice, "node": w.node, "worker_id": w.worker_id} if node.slices else {})}
            for w in node.workers
        ],
        "accelerator_type": node.accelerator_type,
        "topology": node.topology,
        "runtime_version": node.runtime_version,
        "spot": node.spot,
        "preemptible": node.preemptible,
        "labels": dict(sorted(node.labels.items())),
        "metadata_keys": list(node.metadata_keys),
        "pending_stop": node.pending_stop,
    }
