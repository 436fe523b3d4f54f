"""The audit-log adapter (ports.AuditLog): TPU system events as `AuditEvent`s.

One ListLogEntries query per read covers every watched node (it may follow that query's
pages): the Logging read quota is 60 requests/min/project by default (raisable on request, but
not to be counted on). The filter is
the subset the simulator implements:

    logName="projects/P/logs/cloudaudit.googleapis.com%2Fsystem_event"
    AND protoPayload.methodName=("tpu.nodes.terminate" OR "tpu.nodes.restart" OR
                                 "compute.instances.upcomingMaintenance" OR
                                 "compute.instances.hostError" OR ... (METHODS))
    AND timestamp>="<RFC 3339>"
    AND (protoPayload.resourceName:"nodes/a" OR protoPayload.resourceName:"nodes/b"
         OR protoPayload.resourceName:"instances/t1v-n-0123abcd-w-0" OR ...)

`:` is a substring match, so every entry is checked again here: "nodes/a" must name node "a"
exactly (node level ".../nodes/a" or worker level ".../nodes/a/workers/0"), never "nodes/ab".
For a slice made through Compute Engine, every entry is about one of its instances (named by
ComputeAdapter.worker_instances) and is matched through `instances` the same way.
Upcoming maintenance is a Compute Engine entry about one worker VM,
`projects/P/zones/Z/instances/t1v-n-<hex>-w-<worker>`: it is matched through the node's
instance names (TpuAdapter.worker_instances, from the guest attribute `hostname`, read only
when such an entry is seen), passed as `instances`; without them such entries are not
attributed to any node.

The cursor is an opaque string: the newest entry time seen and the (time, insertId) keys of the
entries seen in the last `overlap`. The next read starts `overlap` before that time, so an entry
that reaches the log late is still found, and the keys make sure none is returned twice.
`watch` shares one project-wide query (`build_filter(project, None, ...)`, its Compute Engine
instances those the watchers name: `protoPayload.resourceName=("projects/P/zones/Z/instances/a"
OR ...)`) among the watchers of a state dir through auditcache.SharedAuditLog; `status`, `events` and `history` use this reader.
This module knows the Logging and AuditLog messages; it knows nothing of the policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from tpuwatch.cloud import calls, clients
from tpuwatch.cloud.errors import Call, is_transient, translate
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import TpuwatchError, UsageError
from tpuwatch.model import NODE_NAME, AuditEvent, AuditKind

SYSTEM_EVENT_LOG = "cloudaudit.googleapis.com%2Fsystem_event"
METHODS: dict[str, AuditKind] = {
    "tpu.nodes.terminate": "terminate",
    "tpu.nodes.restart": "restart",
    "compute.instances.upcomingMaintenance": "upcoming_maintenance",
    # A TPU VM made through Compute Engine (resource.type gce_instance): what took it down, and
    # its automatic restart after a host error or a terminate on maintenance.
    "compute.instances.hostError": "terminate",
    "compute.instances.preempted": "terminate",
    "compute.instances.terminateOnHostMaintenance": "terminate",
    "compute.instances.repair.recreateInstance": "terminate",
    "compute.instances.automaticRestart": "restart",
}
RPC_TIMEOUT = 30.0
PAGE_SIZE = 1000
CURSOR_VERSION = "v1"
_RESOURCE = re.compile(r"(?:^|/)nodes/(?P<node>[^/]+)(?:/workers/(?P<worker>[^/]+))?(?:/|$)")
_INSTANCE = re.compile(r"(?:^|/)zones/(?P<zone>[^/]+)/instances/(?P<instance>[^/]+)$")
INSTANCE_PREFIX = "instances/t1v-n-"  # TPU worker VMs; the shared query's clause for them
# Instances made through Compute Engine have names of their owner's choosing: the shared query
# names the instances its readers watch (`scope`), each by its resource name; only when they are
# too many for one filter (Logging takes 20,000 characters) does it take every instance's
# system events of METHODS (resource.type "gce_instance"). Each watcher keeps its own instances'.
GCE_INSTANCE = "gce_instance"
MAX_SCOPE_CHARS = 12_000
_ZONE = re.compile(r"[a-z0-9-]+")
_LOCATION = re.compile(r"(?:^|/)(?:locations|zones)/(?P<zone>[^/]+)/")
_NS = 1_000_000_000


def rfc3339_ns(ns: int) -> str:
    """Nanoseconds since the epoch as RFC 3339 UTC with nine fractional digits."""
    secs, frac = divmod(ns, _NS)
    base = datetime.fromtimestamp(secs, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}Z"


def to_ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * _NS + delta.microseconds * 1000


def from_ns(ns: int) -> datetime:
    secs, frac = divmod(ns, _NS)
    return datetime.fromtimestamp(secs, tz=timezone.utc) + timedelta(microseconds=frac // 1000)


def check_nodes(nodes: Iterable[str]) -> list[str]:
    """The distinct node names of `nodes`, sorted; UsageError for one that is not a TPU name."""
    names = sorted(set(nodes))
    for n in names:
        if not NODE_NAME.match(n):
            raise UsageError(f"{n!r} is not a TPU name (lowercase letters, digits and hyphens)")
    return names


def scope_clause(project: str, scope: Iterable[str] | None) -> str:
    """The shared query's clause for the Compute Engine instances its readers watch (`scope`:
    "zones/Z/instances/N" each): their exact resource names; every instance's events
    (resource.type "gce_instance") for `scope` None or a list too long for one filter; "" for none."""
    if scope is not None:
        names = sorted({s for s in scope if (m := _INSTANCE.search(s)) and NODE_NAME.match(m.group("instance"))
                        and _ZONE.fullmatch(m.group("zone"))})
        if not names:
            return ""
        clause = "protoPayload.resourceName=(" + " OR ".join(f'"projects/{project}/{s}"' for s in names) + ")"
        if len(clause) <= MAX_SCOPE_CHARS:
            return clause
    return f'resource.type="{GCE_INSTANCE}"'


def build_filter(project: str, nodes: Iterable[str] | None, start_ns: int,
                 instances: Iterable[str] = (), scope: Iterable[str] | None = None) -> str:
    """The one Logging filter covering every node in `nodes` (and worker VM in `instances`)
    from `start_ns` on.

    `nodes` None covers every TPU node of the project (the shared query of auditcache.py):
    the resource clauses are then `nodes/`, which every TPU resource name holds,
    `instances/t1v-n-`, which every TPU worker VM's Compute Engine name holds, and for TPU VMs
    made through Compute Engine, named as their owner chose, those of `scope` (`scope_clause`).
    """
    methods = " OR ".join(f'"{m}"' for m in METHODS)
    if nodes is None:
        resources = f'protoPayload.resourceName:"nodes/" OR protoPayload.resourceName:"{INSTANCE_PREFIX}"'
        if clause := scope_clause(project, scope):
            resources += f" OR {clause}"
    else:
        clauses = [f'protoPayload.resourceName:"nodes/{n}"' for n in check_nodes(nodes)]
        clauses += [f'protoPayload.resourceName:"instances/{i}"' for i in sorted(set(instances))
                    if NODE_NAME.match(i)]
        resources = " OR ".join(clauses)
    return (
        f'logName="projects/{project}/logs/{SYSTEM_EVENT_LOG}" '
        f"AND protoPayload.methodName=({methods}) "
        f'AND timestamp>="{rfc3339_ns(start_ns)}" '
        f"AND ({resources})"
    )


def match_resource(resource_name: str, nodes: Iterable[str], zone: str | None = None,
                   instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[str, str | None] | None:
    """(node, worker) when the resource name is exactly one of `nodes` (node or worker level),
    or a worker VM of one of them (`instances`: instance name -> (node, worker))."""
    wanted = set(nodes)
    m = _INSTANCE.search(resource_name)
    if m:
        owner = (instances or {}).get(m.group("instance"))
        if owner is None or owner[0] not in wanted or (zone and m.group("zone") != zone):
            return None
        return owner
    for m in _RESOURCE.finditer(resource_name):
        if m.group("node") in wanted:
            loc = _LOCATION.search(resource_name[: m.start() + 1])
            if zone and loc and loc.group("zone") != zone:
                return None
            return m.group("node"), m.group("worker")
    return None


# -- cursor ------------------------------------------------------------------------------------
def encode_cursor(high_ns: int, seen: Iterable[tuple[int, str]]) -> str:
    body = {"t": high_ns, "seen": sorted([ns, iid] for ns, iid in set(seen))}
    return f"{CURSOR_VERSION}:" + json.dumps(body, separators=(",", ":"))


def decode_cursor(cursor: str | None) -> tuple[int, set[tuple[int, str]]] | None:
    """(newest time seen, keys seen near it), or None for no or an unreadable cursor."""
    if not cursor or not cursor.startswith(f"{CURSOR_VERSION}:"):
        return None
    try:
        body = json.loads(cursor[len(CURSOR_VERSION) + 1 :])
        return int(body["t"]), {(int(ns), str(iid)) for ns, iid in body["seen"]}
    except (ValueError, KeyError, TypeError):
        return None


def _struct_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _payload(entry_pb: Any) -> tuple[str, str, dict[str, Any]] | None:
    """(methodName, resourceName, metadata) of an entry's AuditLog (proto or JSON payload)."""
    from google.protobuf import json_format

    if entry_pb.HasField("proto_payload"):
        from google.cloud.audit import audit_log_pb2

        audit = audit_log_pb2.AuditLog()
        if not entry_pb.proto_payload.Unpack(audit):
            return None
        meta = json_format.MessageToDict(audit.metadata) if audit.HasField("metadata") else {}
        return audit.method_name, audit.resource_name, meta
    if entry_pb.HasField("json_payload"):
        body = json_format.MessageToDict(entry_pb.json_payload)
        meta = body.get("metadata")
        return str(body.get("methodName", "")), str(body.get("resourceName", "")), meta if isinstance(meta, dict) else {}
    return None


class RawEntry(NamedTuple):
    """What an AuditEvent is rebuilt from for any node: one system-event entry as plain data."""

    ns: int
    insert_id: str
    method: str
    resource_name: str
    worker_label: str | None  # the entry's resource label worker_id
    reason: str  # metadata.terminateReason as text


def raw_entry(entry: Any) -> RawEntry | None:
    """The RawEntry of a LogEntry (proto-plus or protobuf); None when it holds no AuditLog."""
    pb = type(entry).pb(entry) if not hasattr(entry, "DESCRIPTOR") else entry
    payload = _payload(pb)
    if payload is None:
        return None
    method, resource, meta = payload
    return RawEntry(
        ns=pb.timestamp.seconds * _NS + pb.timestamp.nanos,
        insert_id=pb.insert_id,
        method=method,
        resource_name=resource,
        worker_label=pb.resource.labels.get("worker_id") or None,
        reason=_struct_text(meta.get("terminateReason")),
    )


def event_of(raw: RawEntry, nodes: Iterable[str], zone: str | None = None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> AuditEvent | None:
    """The AuditEvent of `raw` when it is about one of `nodes` (in `zone`); None otherwise."""
    matched = match_resource(raw.resource_name, nodes, zone, instances)
    if matched is None:
        return None
    node, worker = matched
    if worker is None:
        worker = raw.worker_label
    kind: AuditKind = "other"
    for suffix, k in METHODS.items():
        if raw.method == suffix or raw.method.endswith("." + suffix):
            kind = k
    return AuditEvent(
        time=from_ns(raw.ns),
        kind=kind,
        node=node,
        worker=worker,
        method=raw.method,
        reason=raw.reason,
        insert_id=raw.insert_id,
        resource_name=raw.resource_name,
    )


def take_new(
    found: Iterable[tuple[int, AuditEvent]], high: int, seen: set[tuple[int, str]], overlap_ns: int
) -> tuple[list[AuditEvent], int, set[tuple[int, str]]]:
    """The entries of `found` not in `seen`, and the cursor state after them.

    `found` is what a query from `high - overlap_ns` returned. An entry older than `high` that
    was not seen (it reached the log late) is still new; keys older than the next query's
    start are dropped, since that query cannot return them again.
    """
    seen = set(seen)
    fresh: list[AuditEvent] = []
    for ns, ev in found:
        key = (ns, ev.insert_id)
        if key in seen:
            continue
        seen.add(key)
        high = max(high, ns)
        fresh.append(ev)
    return fresh, high, {k for k in seen if k[0] >= high - overlap_ns}


class AuditLogReader:
    """ports.AuditLog over google-cloud-logging for one project."""

    def __init__(
        self,
        project: str,
        *,
        zone: str | None = None,
        retry: RetryPolicy | None = None,
        page_size: int = PAGE_SIZE,
        overlap: timedelta = timedelta(minutes=10),
        initial_lookback: timedelta = timedelta(hours=1),
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.project = project
        self.zone = zone
        self.retry = retry or RetryPolicy.from_env()
        self.page_size = page_size
        self.overlap_ns = int(overlap.total_seconds() * _NS)
        self.initial_lookback = initial_lookback
        self.now = now
        self._client: Any = None

    def query_raw(self, nodes: list[str] | None, start_ns: int, instances: Iterable[str] = (),
                  scope: Iterable[str] | None = None) -> list[RawEntry]:
        """Every system-event entry from start_ns on, oldest first: one query, all its pages.

        `nodes` None: every TPU node of the project (no resource-name clause per node) and the
        Compute Engine instances of `scope` (None: every instance); the caller matches entries
        to nodes (event_of). Errors are CloudError, as for `read`.
        """
        from google.cloud.logging_v2.types import ListLogEntriesRequest

        if self._client is None:
            self._client = clients.logging_client()
        client = self._client
        flt = build_filter(self.project, nodes, start_ns, instances, scope)
        call = Call("Logging API", "list_log_entries", f"projects/{self.project}",
                    "logging.logEntries.list", "logging.googleapis.com", "roles/logging.viewer")
        out: list[RawEntry] = []
        token = ""
        while True:
            req = ListLogEntriesRequest(
                resource_names=[f"projects/{self.project}"], filter=flt, order_by="timestamp asc",
                page_size=self.page_size, page_token=token,
            )

            def one_page(req: Any = req) -> Any:
                # The pager's `.entries` / `.next_page_token` are this one response's;
                # iterating it would fetch further pages outside the retry policy.
                return client.list_log_entries(request=req, retry=None, timeout=RPC_TIMEOUT)

            try:
                page = self.retry.call(calls.counted(call, one_page), transient=lambda e: is_transient(e, read=True))
            except TpuwatchError:
                raise
            except Exception as exc:
                raise translate(exc, call, project=self.project) from None
            for entry in page.entries:
                raw = raw_entry(entry)
                if raw is not None:
                    out.append(raw)
            token = page.next_page_token
            if not token:
                break
        out.sort(key=lambda r: r.ns)  # stable: keeps the API's order within a timestamp
        return out

    def _query(self, nodes: list[str], start_ns: int,
               instances: Mapping[str, tuple[str, str]] | None = None) -> list[tuple[int, AuditEvent]]:
        """Every matching entry about `nodes` from start_ns on, oldest first (one query)."""
        out: list[tuple[int, AuditEvent]] = []
        for raw in self.query_raw(nodes, start_ns, instances or {}):
            ev = event_of(raw, nodes, self.zone, instances)
            if ev is not None:
                out.append((raw.ns, ev))
        return out

    def take_warnings(self) -> list[str]:
        """A direct reader has no cache to warn about."""
        return []

    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        """Events about `nodes` not returned before under `cursor`, oldest first, and the new cursor.

        With no (or an unreadable) cursor, reading starts `initial_lookback` ago. `instances`:
        the nodes' worker VMs (TpuAdapter.worker_instances), for upcoming-maintenance entries.
        """
        names = sorted(set(nodes))
        state = decode_cursor(cursor)
        seen: set[tuple[int, str]]
        if state is None:
            high, seen = to_ns(self.now() - self.initial_lookback), set()
        else:
            high, seen = state
        if not names:
            return [], encode_cursor(high, seen)
        found = self._query(names, max(0, high - self.overlap_ns), instances)
        fresh, high, seen = take_new(found, high, seen, self.overlap_ns)
        return fresh, encode_cursor(high, seen)

    def since(self, nodes: Iterable[str], start_time: datetime,
              instances: Mapping[str, tuple[str, str]] | None = None) -> list[AuditEvent]:
        """Every event about `nodes` (and their worker VMs) from `start_time` on, oldest first."""
        names = sorted(set(nodes))
        if not names:
            return []
        out: list[AuditEvent] = []
        keys: set[tuple[int, str]] = set()
        for ns, ev in self._query(names, to_ns(start_time), instances):
            if (ns, ev.insert_id) not in keys:
                keys.add((ns, ev.insert_id))
                out.append(ev)
        return out

    def cursor_at(self, start_time: datetime) -> str:
        """A cursor whose first read returns events from `start_time` on (e.g. the job's start)."""
        return encode_cursor(to_ns(start_time) + self.overlap_ns, ())
