"""The compute v1 REST paths of the simulator's HTTP face (mounted by rest.py's RestFace), and
gcloud's multipart batch requests to `/batch/compute/v1`.

Served under `/compute/v1/projects/P/`: `zones/Z/instances` (get, list, insert, delete, start,
stop, performMaintenance, simulateMaintenanceEvent, reportHostAsFaulty, getGuestAttributes,
setLabels, setMetadata), `aggregated/instances`, `zones/Z/disks/D` (get: each VM's boot disk), `zones/Z/operations` (get, wait, list) and
their `regions/R/` and `global/` twins, `regions/R/instanceTemplates` and
`global/instanceTemplates` (insert, get, list), `regions/R/resourcePolicies` (insert, get),
`zones/Z/instanceGroupManagers` (insert, get, list, delete, listManagedInstances,
recreateInstances, resize), `regions/R/instanceGroupManagers` (insert, get, list,
listManagedInstances, recreateInstances, resizeRequests), `aggregated/instanceGroupManagers`,
`zones/Z/instanceGroupManagers/G/resizeRequests` (insert, get, list, delete, cancel) and
`zones/Z/autoscalers` (always empty: gcloud's MIG describe asks) and `zones/Z/instanceGroups` (list:
each MIG's group and its size, which gcloud's MIG list reads).

Every request is counted and may be failed by injection under its method name,
`compute.v1.Instances/Get`, `compute.v1.ZoneOperations/Wait`,
`compute.v1.InstanceGroupManagers/ListManagedInstances`, ...; errors have Compute Engine's
shape, `{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}`, and its
statuses: an injected RESOURCE_EXHAUSTED is a rate limit, 403 `rateLimitExceeded`; an insert in
a quota window is refused 403 `quotaExceeded` (instances.py).
"""

from __future__ import annotations

import email.message
import email.parser
import email.policy
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tpuwatch.sim import schema
from tpuwatch.sim.cerecords import compute_time
from tpuwatch.sim.compute_json import (
    disk_json,
    instance_json,
    managed_json,
    mig_json,
    operation_json,
    parse_filter,
    policy_json,
    resize_json,
    template_json,
)
from tpuwatch.sim.instances import ComputeError
from tpuwatch.sim.records import ApiError
from tpuwatch.sim.world import World

_S = r"([^/]+)"
_P = rf"^/compute/v1/projects/{_S}"
_Z = _P + rf"/zones/{_S}"
_I = _Z + rf"/instances/{_S}"
_G = _Z + rf"/instanceGroupManagers/{_S}"
_RG = _P + rf"/regions/{_S}/instanceGroupManagers/{_S}"  # a regional MIG
_SCOPE = r"(zones/[^/]+|regions/[^/]+|global)"

# (HTTP method, path pattern, method name for the meter, handler)
ROUTES: list[tuple[str, re.Pattern[str], str, str]] = [
    (m, re.compile(p), name, h) for m, p, name, h in (
        ("GET", _Z + r"/instances$", "Instances/List", "list_instances"),
        ("POST", _Z + r"/instances$", "Instances/Insert", "insert_instance"),
        ("GET", _I + r"$", "Instances/Get", "get_instance"),
        ("DELETE", _I + r"$", "Instances/Delete", "delete_instance"),
        ("POST", _I + r"/start$", "Instances/Start", "start"),
        ("POST", _I + r"/stop$", "Instances/Stop", "stop"),
        ("POST", _I + r"/performMaintenance$", "Instances/PerformMaintenance", "perform_maintenance"),
        ("POST", _I + r"/simulateMaintenanceEvent$", "Instances/SimulateMaintenanceEvent", "simulate_maintenance"),
        ("POST", _I + r"/reportHostAsFaulty$", "Instances/ReportHostAsFaulty", "report_faulty"),
        ("GET", _I + r"/getGuestAttributes$", "Instances/GetGuestAttributes", "guest_attributes"),
        ("POST", _I + r"/setLabels$", "Instances/SetLabels", "set_labels"),
        ("POST", _I + r"/setMetadata$", "Instances/SetMetadata", "set_metadata"),
        ("GET", _P + r"/aggregated/instances$", "Instances/AggregatedList", "aggregated_instances"),
        ("GET", _Z + rf"/disks/{_S}$", "Disks/Get", "get_disk"),
        ("GET", _P + rf"/{_SCOPE}/operations$", "Operations/List", "list_operations"),
        ("GET", _P + rf"/{_SCOPE}/operations/{_S}$", "Operations/Get", "get_operation"),
        ("POST", _P + rf"/{_SCOPE}/operations/{_S}/wait$", "Operations/Wait", "wait_operation"),
        ("POST", _P + r"/(regions/[^/]+|global)/instanceTemplates$", "InstanceTemplates/Insert", "insert_template"),
        ("GET", _P + r"/(regions/[^/]+|global)/instanceTemplates$", "InstanceTemplates/List", "list_templates"),
        ("GET", _P + rf"/(regions/[^/]+|global)/instanceTemplates/{_S}$", "InstanceTemplates/Get", "get_template"),
        ("POST", _P + rf"/regions/{_S}/resourcePolicies$", "ResourcePolicies/Insert", "insert_policy"),
        ("GET", _P + rf"/regions/{_S}/resourcePolicies/{_S}$", "ResourcePolicies/Get", "get_policy"),
        ("GET", _Z + r"/instanceGroupManagers$", "InstanceGroupManagers/List", "list_migs"),
        ("POST", _Z + r"/instanceGroupManagers$", "InstanceGroupManagers/Insert", "insert_mig"),
        ("GET", _G + r"$", "InstanceGroupManagers/Get", "get_mig"),
        ("DELETE", _G + r"$", "InstanceGroupManagers/Delete", "delete_mig"),
        ("POST", _G + r"/listManagedInstances$", "InstanceGroupManagers/ListManagedInstances", "managed_instances"),
        ("POST", _G + r"/recreateInstances$", "InstanceGroupManagers/RecreateInstances", "recreate_instances"),
        ("POST", _G + r"/resize$", "InstanceGroupManagers/Resize", "resize_mig"),
        ("GET", _P + r"/aggregated/instanceGroupManagers$", "InstanceGroupManagers/AggregatedList", "aggregated_migs"),
        ("GET", _P + rf"/regions/{_S}/instanceGroupManagers$", "RegionInstanceGroupManagers/List", "list_region_migs"),
        ("POST", _P + rf"/regions/{_S}/instanceGroupManagers$", "RegionInstanceGroupManagers/Insert",
         "insert_region_mig"),
        ("GET", _RG + r"$", "RegionInstanceGroupManagers/Get", "get_region_mig"),
        ("POST", _RG + r"/listManagedInstances$", "RegionInstanceGroupManagers/ListManagedInstances",
         "region_managed_instances"),
        ("POST", _RG + r"/recreateInstances$", "RegionInstanceGroupManagers/RecreateInstances",
         "region_recreate_instances"),
        ("POST", _RG + r"/resizeRequests$", "RegionInstanceGroupManagerResizeRequests/Insert", "region_insert_resize"),
        ("GET", _RG + r"/resizeRequests$", "RegionInstanceGroupManagerResizeRequests/List", "region_list_resizes"),
        ("GET", _RG + rf"/resizeRequests/{_S}$", "RegionInstanceGroupManagerResizeRequests/Get", "region_get_resize"),
        ("DELETE", _RG + rf"/resizeRequests/{_S}$", "RegionInstanceGroupManagerResizeRequests/Delete",
         "region_delete_resize"),
        ("POST", _RG + rf"/resizeRequests/{_S}/cancel$", "RegionInstanceGroupManagerResizeRequests/Cancel",
         "region_cancel_resize"),
        ("POST", _G + r"/resizeRequests$", "InstanceGroupManagerResizeRequests/Insert", "insert_resize"),
        ("GET", _G + r"/resizeRequests$", "InstanceGroupManagerResizeRequests/List", "list_resizes"),
        ("GET", _G + rf"/resizeRequests/{_S}$", "InstanceGroupManagerResizeRequests/Get", "get_resize"),
        ("DELETE", _G + rf"/resizeRequests/{_S}$", "InstanceGroupManagerResizeRequests/Delete", "delete_resize"),
        ("POST", _G + rf"/resizeRequests/{_S}/cancel$", "InstanceGroupManagerResizeRequests/Cancel", "cancel_resize"),
        ("GET", _Z + r"/autoscalers$", "Autoscalers/List", "list_autoscalers"),
        ("GET", _Z + r"/instanceGroups$", "InstanceGroups/List", "list_groups"),
    )
]
BATCH_PATH = "/batch/compute/v1"
# Compute Engine answers a rate quota overrun with 403 rateLimitExceeded (page "Rate quotas"), an
# insert beyond a resource quota with 403 quotaExceeded (a ComputeError's own reason): never 429.
_REASONS = {"NOT_FOUND": "notFound", "ALREADY_EXISTS": "alreadyExists", "INVALID_ARGUMENT": "invalid",
            "FAILED_PRECONDITION": "conditionNotMet", "PERMISSION_DENIED": "forbidden",
            "RESOURCE_EXHAUSTED": "rateLimitExceeded", "UNAVAILABLE": "backendError", "INTERNAL": "backendError",
            "DEADLINE_EXCEEDED": "backendError", "UNKNOWN": "backendError", "UNIMPLEMENTED": "notImplemented"}
_HTTP = {"NOT_FOUND": 404, "ALREADY_EXISTS": 409, "INVALID_ARGUMENT": 400, "PERMISSION_DENIED": 403,
         "RESOURCE_EXHAUSTED": 403, "UNAVAILABLE": 503, "INTERNAL": 500, "DEADLINE_EXCEEDED": 504,
         "UNKNOWN": 500, "UNIMPLEMENTED": 501}


@dataclass(frozen=True)
class RawBody:
    """A response body that is not JSON (the multipart answer to a batch)."""

    content_type: str
    data: bytes


def compute_error(exc: ApiError) -> tuple[int, dict[str, Any]]:
    """HTTP status and Compute Engine's error body for an error."""
    reason = exc.reason if isinstance(exc, ComputeError) and exc.reason else _REASONS.get(exc.code, "backendError")
    # a stale fingerprint is 412 conditionNotMet; other failed preconditions are 400
    http = 412 if reason == "conditionNotMet" else _HTTP.get(exc.code, 400)
    domain = "usageLimits" if reason in ("rateLimitExceeded", "quotaExceeded") else "global"
    return http, {"error": {"code": http, "message": exc.message,
                            "errors": [{"message": exc.message, "domain": domain, "reason": reason}]}}


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    start = query.get("pageToken", "") or "0"
    if not start.isdigit():
        raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'pageToken': '{start}'.", "invalid")
    size = int(query.get("maxResults") or 500)
    if not 0 <= size <= 500:
        raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'maxResults': {size}. Must be less than "
                           "or equal to 500", "invalid")
    begin = int(start)
    size = size or 500
    return items[begin:begin + size], (str(begin + size) if begin + size < len(items) else "")


def _list(kind: str, self_link: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    items = [i for i in items if parse_filter(query.get("filter", ""))(i)]
    page, token = _page(items, query)
    out: dict[str, Any] = {"kind": kind, "id": self_link, "items": page, "selfLink": self_link}
    if token:
        out["nextPageToken"] = token
    return out


class ComputeRest:
    """The compute v1 routes over `world`; `call(method, resource)` counts a call and raises the
    error injected for it; `base()` is the URL links are made under."""

    def __init__(self, world: World, call: Callable[[str, str], None], base: Callable[[], str]) -> None:
        self.world = world
        self._call = call
        self._base = base
        self.batches = 0  # batch requests served (each part is also counted by its method)

    def handles(self, path: str) -> bool:
        return path == BATCH_PATH or any(p.match(path) for _, p, _, _ in ROUTES)

    def handle(self, method: str, raw_path: str, body: bytes, content_type: str = "") -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        path = unquote(parts.path)
        if path == BATCH_PATH and method == "POST":
            return self._batch(body, content_type)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:  # Google's front end refuses what its discovery document does not take
            schema.check_http(method, path, parse_qs(parts.query, keep_blank_values=True), body)
        except schema.Refusal as exc:
            return compute_error(ComputeError(exc.code, exc.message, exc.reason))
        for verb, pattern, name, handler in ROUTES:
            m = pattern.match(path)
            if m is None or verb != method:
                continue
            if name.startswith("Operations/"):  # ZoneOperations, RegionOperations, GlobalOperations
                kind = m.group(2).split("/", 1)[0]
                name = {"zones": "Zone", "regions": "Region"}.get(kind, "Global") + name
            full = f"compute.v1.{name}"
            try:
                payload = json.loads(body.decode() or "{}") if body else {}
                if not isinstance(payload, dict):
                    raise ComputeError("INVALID_ARGUMENT", "Invalid JSON payload received: expected an object", "parseError")
                self._call(full, path.removeprefix("/compute/v1/"))
                result = getattr(self, "_" + handler)(*m.groups(), query=query, body=payload)
                lost = self.world.after_call(full)  # served, but the answer never arrives
                if lost is not None:
                    raise lost
                return 200, result
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                return compute_error(ComputeError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}", "parseError"))
            except ApiError as exc:
                return compute_error(exc)
        return compute_error(ComputeError("NOT_FOUND", f"{method} {path}: not served by the simulator", "notFound"))

    # ---- batch -------------------------------------------------------------------------------

    def _batch(self, body: bytes, content_type: str) -> tuple[int, Any]:
        """A multipart/mixed batch (what gcloud's apitools sends): each part an HTTP request,
        answered by a part with Content-ID `<response-ID>`."""
        msg = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + body)
        self.batches += 1
        if not msg.is_multipart():
            return compute_error(ComputeError("INVALID_ARGUMENT", "A batch request must be multipart/mixed", "invalid"))
        boundary = uuid.uuid4().hex
        out: list[bytes] = []
        for part in msg.get_payload():
            if not isinstance(part, email.message.Message):
                continue
            cid = str(part.get("Content-ID", "")).strip()
            raw = part.get_payload()
            text = raw if isinstance(raw, str) else ""
            request_line, _, rest = text.replace("\r\n", "\n").partition("\n")
            head, _, sub_body = rest.partition("\n\n")
            fields = request_line.split()
            if len(fields) < 2:
                status, payload = compute_error(ComputeError("INVALID_ARGUMENT", "bad request line in batch", "invalid"))
            else:
                status, payload = self.handle(fields[0], fields[1], sub_body.strip().encode())
            data = json.dumps(payload, indent=1)
            rid = cid[1:-1] if cid.startswith("<") and cid.endswith(">") else cid
            out.append(
                f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <response-{rid}>\r\n\r\n"
                f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                f"Content-Type: application/json; charset=UTF-8\r\nContent-Length: {len(data.encode())}\r\n\r\n"
                f"{data}\r\n".encode())
        out.append(f"--{boundary}--\r\n".encode())
        return 200, RawBody(f"multipart/mixed; boundary={boundary}", b"".join(out))

    # ---- instances ---------------------------------------------------------------------------

    def _get_instance(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return instance_json(self.world.get_instance(p, z, n), self._base())

    def _get_disk(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        # the simulator's VMs have one disk each, the boot disk named after the VM, gone with it
        try:
            rec = self.world.get_instance(p, z, n)
        except ApiError as exc:
            if exc.code != "NOT_FOUND":
                raise
            raise ComputeError("NOT_FOUND", f"The resource 'projects/{p}/zones/{z}/disks/{n}' was not found",
                               "notFound") from None
        return disk_json(rec, self._base())

    def _list_instances(self, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        with self.world._lock:
            self.world.list_filters.append(("instances.list", query.get("filter", "")))
        items = [instance_json(r, base) for r in self.world.list_instances(p, z)]
        return _list("compute#instanceList", f"{base}projects/{p}/zones/{z}/instances", items, query)

    def _aggregated_instances(self, p: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [instance_json(r, base) for r in self.world.list_instances(p)]
        return self._aggregated("compute#instanceAggregatedList", "instances", p, items, query,
                                f"{base}projects/{p}/aggregated/instances")

    def _aggregated(self, kind: str, field: str, p: str, items: list[dict[str, Any]], query: dict[str, str],
                    link: str) -> dict[str, Any]:
        """An aggregatedList: one page of matching items, grouped by `zones/Z` (a regional MIG's by
        `regions/R`), every zone of the simulator present (those with none carry the
        NO_RESULTS_ON_PAGE warning)."""
        items = [i for i in items if parse_filter(query.get("filter", ""))(i)]
        page, token = _page(items, query)
        zones = self.world.zones or (self.world.zone,)

        def scope(i: dict[str, Any]) -> str:
            return "/".join(str(i.get("zone") or i.get("region")).split("/")[-2:])

        scoped: dict[str, Any] = {}
        for s in sorted({*(f"zones/{z}" for z in zones), *(scope(i) for i in page)}):
            mine = [i for i in page if scope(i) == s]
            scoped[s] = {field: mine} if mine else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{s}' on this page.",
                "data": [{"key": "scope", "value": s}]}}
        out: dict[str, Any] = {"kind": kind, "id": f"projects/{p}/aggregated/{field}", "items": scoped, "selfLink": link}
        if token:
            out["nextPageToken"] = token
        return out

    def _op(self, op: Any) -> dict[str, Any]:
        return operation_json(op, self._base())

    def _insert_instance(self, p: str, z: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_instance(p, z, body))

    def _delete_instance(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.delete_instance(p, z, n))

    def _start(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.start_instance(p, z, n))

    def _stop(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.stop_instance(p, z, n))

    def _perform_maintenance(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.perform_instance_maintenance(p, z, n))

    def _simulate_maintenance(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.simulate_instance_maintenance(p, z, n))

    def _report_faulty(self, p: str, z: str, n: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.report_host_as_faulty(p, z, n, body))

    def _set_labels(self, p: str, z: str, n: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.set_labels(p, z, n, dict(body.get("labels") or {}),
                                              str(body.get("labelFingerprint") or "")))

    def _set_metadata(self, p: str, z: str, n: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        items = {str(i.get("key")): str(i.get("value", "")) for i in body.get("items") or []}
        return self._op(self.world.set_metadata(p, z, n, items, str(body.get("fingerprint") or "")))

    def _guest_attributes(self, p: str, z: str, n: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        qpath, vkey = query.get("queryPath", ""), query.get("variableKey", "")
        found = self.world.instance_guest_attributes(p, z, n, qpath, vkey)
        out: dict[str, Any] = {"kind": "compute#guestAttributes",
                               "selfLink": f"{base}projects/{p}/zones/{z}/instances/{n}/getGuestAttributes"}
        if vkey:
            out.update({"variableKey": vkey, "variableValue": found[0][2]})
        else:
            out.update({"queryPath": qpath, "queryValue": {
                "items": [{"namespace": ns, "key": k, "value": v} for ns, k, v in found]}})
        return out

    # ---- operations --------------------------------------------------------------------------

    def _get_operation(self, p: str, scope: str, o: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.get_compute_operation(p, scope, o))

    def _wait_operation(self, p: str, scope: str, o: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.wait_compute_operation(p, scope, o))

    def _list_operations(self, p: str, scope: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [operation_json(o, base) for o in self.world.list_compute_operations(p, scope)]
        return _list("compute#operationList", f"{base}projects/{p}/{scope}/operations", items, query)

    # ---- templates and policies --------------------------------------------------------------

    @staticmethod
    def _region(scope: str) -> str:
        return scope.split("/", 1)[1] if scope.startswith("regions/") else ""

    def _insert_template(self, p: str, scope: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_template(p, self._region(scope), body))

    def _get_template(self, p: str, scope: str, n: str, **_: Any) -> dict[str, Any]:
        return template_json(self.world.get_template(p, self._region(scope), n), self._base())

    def _list_templates(self, p: str, scope: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [template_json(t, base) for t in self.world.list_templates(p, self._region(scope))]
        return _list("compute#instanceTemplateList", f"{base}projects/{p}/{scope}/instanceTemplates", items, query)

    def _insert_policy(self, p: str, r: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_resource_policy(p, r, body))

    def _get_policy(self, p: str, r: str, n: str, **_: Any) -> dict[str, Any]:
        return policy_json(self.world.get_resource_policy(p, r, n), self._base())

    # ---- MIGs --------------------------------------------------------------------------------

    def _mig(self, mig: Any) -> dict[str, Any]:
        return mig_json(mig, self._base(), self.world.mig_is_stable(mig))

    def _insert_mig(self, p: str, z: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_mig(p, z, body))

    def _get_mig(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._mig(self.world.get_mig(p, z, n))

    def _list_migs(self, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        self.world.check_compute_zone(p, z)
        items = [self._mig(m) for m in self.world.list_migs(p, z)]
        return _list("compute#instanceGroupManagerList", f"{base}projects/{p}/zones/{z}/instanceGroupManagers",
                     items, query)

    def _aggregated_migs(self, p: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [self._mig(m) for m in self.world.list_migs(p)]
        return self._aggregated("compute#instanceGroupManagerAggregatedList", "instanceGroupManagers", p, items,
                                query, f"{base}projects/{p}/aggregated/instanceGroupManagers")

    def _delete_mig(self, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.delete_mig(p, z, n))

    def _managed_instances(self, p: str, z: str, n: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        mig = self.world.get_mig(p, z, n)
        items = [managed_json(m, r, mig, base) for m, r in self.world.managed_instances(p, z, n)]
        items = [i for i in items if parse_filter(query.get("filter", ""))(i)]
        page, token = _page(items, query)
        out: dict[str, Any] = {"managedInstances": page}
        if token:
            out["nextPageToken"] = token
        return out

    # a regional MIG: the same over `regions/R` (the world's MIG methods take it for a zone)
    def _list_region_migs(self, p: str, r: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [self._mig(m) for m in self.world.list_region_migs(p, r)]
        return _list("compute#regionInstanceGroupManagerList",
                     f"{base}projects/{p}/regions/{r}/instanceGroupManagers", items, query)

    def _insert_region_mig(self, p: str, r: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_mig(p, f"regions/{r}", body))

    def _get_region_mig(self, p: str, r: str, n: str, **_: Any) -> dict[str, Any]:
        return self._get_mig(p, f"regions/{r}", n)

    def _region_managed_instances(self, p: str, r: str, n: str, **kw: Any) -> dict[str, Any]:
        return self._managed_instances(p, f"regions/{r}", n, **kw)

    def _region_recreate_instances(self, p: str, r: str, n: str, **kw: Any) -> dict[str, Any]:
        return self._recreate_instances(p, f"regions/{r}", n, **kw)

    def _recreate_instances(self, p: str, z: str, n: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.recreate_instances(p, z, n, [str(u) for u in body.get("instances") or []]))

    def _resize_mig(self, p: str, z: str, n: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        size = query.get("size", "")
        if not size.lstrip("-").isdigit():
            raise ComputeError("INVALID_ARGUMENT", "Required field 'size' not specified", "required")
        return self._op(self.world.resize_mig(p, z, n, int(size)))

    def _list_autoscalers(self, p: str, z: str, **_: Any) -> dict[str, Any]:
        self.world.check_compute_zone(p, z)
        link = f"{self._base()}projects/{p}/zones/{z}/autoscalers"
        return {"kind": "compute#autoscalerList", "id": link, "items": [], "selfLink": link}

    def _list_groups(self, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        self.world.check_compute_zone(p, z)
        items = [{"kind": "compute#instanceGroup", "id": str(m.id), "name": m.name,
                  "creationTimestamp": compute_time(m.create_ns), "zone": f"{base}projects/{p}/zones/{z}",
                  "size": len(self.world.managed_instances(p, z, m.name)),
                  "network": f"{base}projects/{p}/global/networks/default",
                  "selfLink": f"{base}projects/{p}/zones/{z}/instanceGroups/{m.name}"}
                 for m in self.world.list_migs(p, z)]
        return _list("compute#instanceGroupList", f"{base}projects/{p}/zones/{z}/instanceGroups", items, query)

    # ---- resize requests ---------------------------------------------------------------------

    def _insert_resize(self, p: str, z: str, g: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self._op(self.world.insert_resize_request(p, z, g, body))

    def _get_resize(self, p: str, z: str, g: str, n: str, **_: Any) -> dict[str, Any]:
        return resize_json(self.world.get_resize_request(p, z, g, n), self._base())

    def _list_resizes(self, p: str, z: str, g: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        base = self._base()
        items = [resize_json(r, base) for r in self.world.list_resize_requests(p, z, g)]
        scope = z if z.startswith("regions/") else f"zones/{z}"
        return _list("compute#instanceGroupManagerResizeRequestList" if scope.startswith("zones/") else
                     "compute#regionInstanceGroupManagerResizeRequestList",
                     f"{base}projects/{p}/{scope}/instanceGroupManagers/{g}/resizeRequests", items, query)

    # a regional MIG's resize requests: the same over `regions/R`
    def _region_insert_resize(self, p: str, r: str, g: str, **kw: Any) -> dict[str, Any]:
        return self._insert_resize(p, f"regions/{r}", g, **kw)

    def _region_list_resizes(self, p: str, r: str, g: str, **kw: Any) -> dict[str, Any]:
        return self._list_resizes(p, f"regions/{r}", g, **kw)

    def _region_get_resize(self, p: str, r: str, g: str, n: str, **kw: Any) -> dict[str, Any]:
        return self._get_resize(p, f"regions/{r}", g, n, **kw)

    def _region_delete_resize(self, p: str, r: str, g: str, n: str, **kw: Any) -> dict[str, Any]:
        return self._delete_resize(p, f"regions/{r}", g, n, **kw)

    def _region_cancel_resize(self, p: str, r: str, g: str, n: str, **kw: Any) -> dict[str, Any]:
        return self._cancel_resize(p, f"regions/{r}", g, n, **kw)

    def _delete_resize(self, p: str, z: str, g: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.delete_resize_request(p, z, g, n))

    def _cancel_resize(self, p: str, z: str, g: str, n: str, **_: Any) -> dict[str, Any]:
        return self._op(self.world.cancel_resize_request(p, z, g, n))
