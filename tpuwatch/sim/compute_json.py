"""The simulated Compute Engine's records as compute v1 JSON (field names as in the API's
discovery document and gcloud's generated messages), and the list `filter` expressions.

Links (`selfLink`, `zone`, `machineType`, `targetLink`, ...) are full URLs under the base the
simulator serves (`http://127.0.0.1:PORT/compute/v1/`), as Compute Engine gives links under its
own endpoint: gcloud and the client library follow and parse them against the endpoint they
were pointed at.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tpuwatch.sim.cerecords import (
    ComputeOpRec,
    InstanceRec,
    ManagedRec,
    MigRec,
    PolicyRec,
    ResizeRec,
    TemplateRec,
    compute_time,
    fingerprint,
)
from tpuwatch.sim.records import ApiError, rfc3339_s
from tpuwatch.sim.shapes import region_of


def _errors(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    return {"errors": [{"code": c, "message": m} for c, m in pairs]}


def disk_json(rec: InstanceRec, base: str) -> dict[str, Any]:
    """An instance's boot disk (named after it, deleted with it), as disks.get shows it: its type
    and `users` as full URLs, as Google gives every link."""
    zone = f"{base}projects/{rec.project}/zones/{rec.zone}"
    out: dict[str, Any] = {
        "kind": "compute#disk", "id": str(rec.id + 1), "creationTimestamp": compute_time(rec.create_ns),
        "name": rec.name, "sizeGb": "100", "zone": zone, "status": "READY",
        "type": f"{zone}/diskTypes/hyperdisk-balanced", "users": [f"{zone}/instances/{rec.name}"],
        "selfLink": f"{zone}/disks/{rec.name}", "physicalBlockSizeBytes": "4096",
    }
    if rec.image:
        out["sourceImage"] = rec.image
    return out


def instance_json(rec: InstanceRec, base: str) -> dict[str, Any]:
    zone = f"{base}projects/{rec.project}/zones/{rec.zone}"
    sched: dict[str, Any] = {
        "onHostMaintenance": rec.on_host_maintenance,
        "automaticRestart": rec.automatic_restart,
        "preemptible": rec.provisioning_model == "SPOT",
        "provisioningModel": rec.provisioning_model,
    }
    if rec.termination_action:
        sched["instanceTerminationAction"] = rec.termination_action
    if rec.max_run_duration is not None:
        sched["maxRunDuration"] = {"seconds": str(int(rec.max_run_duration))}
    if rec.preemption_notice is not None:
        sched["preemptionNoticeDuration"] = _duration(rec.preemption_notice)
    if rec.termination_time:
        sched["terminationTime"] = rec.termination_time
    nic: dict[str, Any] = {
        "kind": "compute#networkInterface", "name": "nic0", "stackType": "IPV4_ONLY",
        "network": f"{base}projects/{rec.project}/global/networks/default",
        "subnetwork": f"{base}projects/{rec.project}/regions/{region_of(rec.zone)}/subnetworks/default",
        "fingerprint": fingerprint([rec.id, "nic0"]),
    }
    if rec.ip:
        nic["networkIP"] = rec.ip
    if rec.nat_ip:
        nic["accessConfigs"] = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                                 "natIP": rec.nat_ip, "networkTier": "PREMIUM"}]
    out: dict[str, Any] = {
        "kind": "compute#instance",
        "id": str(rec.id),
        "creationTimestamp": compute_time(rec.create_ns),
        "name": rec.name,
        "machineType": f"{zone}/machineTypes/{rec.machine_type}",
        "status": rec.status,
        "zone": zone,
        "canIpForward": False,
        "networkInterfaces": [nic],
        "disks": [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "boot": True,
                   "autoDelete": True, "deviceName": "persistent-disk-0", "index": 0, "interface": "NVME",
                   "source": f"{zone}/disks/{rec.name}"}],
        "metadata": {"kind": "compute#metadata", "fingerprint": rec.metadata_fingerprint,
                     "items": [{"key": k, "value": v} for k, v in rec.metadata.items()]},
        "selfLink": f"{zone}/instances/{rec.name}",
        "scheduling": sched,
        "cpuPlatform": "AMD Turin" if rec.machine_type.startswith("tpu7x") else "AMD Genoa",
        "labelFingerprint": rec.label_fingerprint,
        "startRestricted": False,
        "deletionProtection": False,
        "fingerprint": fingerprint([rec.id, rec.status, rec.labels, rec.metadata]),
    }
    if rec.hostname:  # only a custom one: the default ([NAME].[ZONE].c.[PROJECT].internal) is not shown
        out["hostname"] = rec.hostname
    if not rec.metadata:
        del out["metadata"]["items"]
    if rec.labels:
        out["labels"] = dict(rec.labels)
    if rec.description:
        out["description"] = rec.description
    if rec.status_message:
        out["statusMessage"] = rec.status_message
    if rec.resource_policies:
        out["resourcePolicies"] = list(rec.resource_policies)
    if rec.last_start_ns:
        out["lastStartTimestamp"] = compute_time(rec.last_start_ns)
    if rec.last_stop_ns:
        out["lastStopTimestamp"] = compute_time(rec.last_stop_ns)
    if rec.upcoming is not None:
        u = rec.upcoming
        out["resourceStatus"] = {"upcomingMaintenance": {
            "type": u.type, "canReschedule": u.can_reschedule, "maintenanceStatus": u.status,
            "windowStartTime": rfc3339_s(u.window_start_ns), "windowEndTime": rfc3339_s(u.window_end_ns),
            "latestWindowStartTime": rfc3339_s(u.latest_window_start_ns),
        }}
    if rec.shutdown is not None:  # Google deleting it
        stop_state, target, since = rec.shutdown
        out.setdefault("resourceStatus", {})["shutdownDetails"] = {
            "stopState": stop_state, "targetState": target, "requestTimestamp": compute_time(since)}
    elif rec.pending_stop_ns:  # a Spot preemption's notice
        out.setdefault("resourceStatus", {})["shutdownDetails"] = {
            "stopState": "PENDING_STOP", "targetState": "DELETED" if rec.termination_action == "DELETE" else "STOPPED",
            "requestTimestamp": rfc3339_s(rec.pending_stop_ns),
            "maxDuration": _duration(rec.preemption_notice or 0.0),
        }
    return out


def _duration(seconds: float) -> dict[str, Any]:
    """A Compute Engine Duration: whole seconds as a string, the rest as nanos."""
    whole = int(seconds)
    nanos = int(round((seconds - whole) * 1e9))
    return {"seconds": str(whole), **({"nanos": nanos} if nanos else {})}


def operation_json(op: ComputeOpRec, base: str) -> dict[str, Any]:
    scope = f"{base}projects/{op.project}/{op.scope}"
    out: dict[str, Any] = {
        "kind": "compute#operation",
        "id": str(op.id),
        "name": op.name,
        "operationType": op.op_type,
        "targetLink": f"{base}{op.target}",
        "targetId": str(op.target_id),
        "status": op.status,
        "user": op.user,
        "progress": 100 if op.done else 0,
        "insertTime": compute_time(op.insert_ns),
        "startTime": compute_time(op.insert_ns),
        "selfLink": f"{scope}/operations/{op.name}",
    }
    if op.scope.startswith("zones/"):
        out["zone"] = scope
    elif op.scope.startswith("regions/"):
        out["region"] = scope
    if op.done:
        out["endTime"] = compute_time(op.end_ns)
    if op.errors:
        out["error"] = _errors(op.errors)
        out["httpErrorStatusCode"] = op.http_status
        out["httpErrorMessage"] = op.http_message
    if op.status_message:
        out["statusMessage"] = op.status_message
    return out


def template_json(rec: TemplateRec, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "compute#instanceTemplate", "id": str(rec.id), "name": rec.name,
                           "creationTimestamp": compute_time(rec.create_ns), "properties": dict(rec.properties),
                           "selfLink": f"{base}{rec.path}"}
    if rec.region:
        out["region"] = f"{base}projects/{rec.project}/regions/{rec.region}"
    return out


def policy_json(rec: PolicyRec, base: str) -> dict[str, Any]:
    return {**rec.body, "kind": "compute#resourcePolicy", "id": str(rec.id), "name": rec.name,
            "creationTimestamp": compute_time(rec.create_ns), "status": "READY",
            "region": f"{base}projects/{rec.project}/regions/{rec.region}", "selfLink": f"{base}{rec.path}"}


def mig_json(mig: MigRec, base: str, stable: bool) -> dict[str, Any]:
    zone = f"{base}projects/{mig.project}/zones/{mig.zone}"
    actions = {a: 0 for a in ("abandoning", "creating", "creatingWithoutRetries", "deleting", "none",
                              "recreating", "refreshing", "restarting", "resuming", "starting", "stopping",
                              "suspending", "verifying")}
    for m in mig.members.values():
        name = re.sub(r"_([a-z])", lambda x: x.group(1).upper(), m.current_action.lower())
        actions[name] = actions.get(name, 0) + 1
    out: dict[str, Any] = {
        "kind": "compute#instanceGroupManager",
        "id": str(mig.id),
        "creationTimestamp": compute_time(mig.create_ns),
        "name": mig.name,
        "zone": zone,
        "instanceTemplate": f"{base}{mig.template}",
        "versions": [{"instanceTemplate": f"{base}{mig.template}", "targetSize": {"calculated": mig.target_size}}],
        "instanceGroup": f"{base}projects/{mig.project}/{mig.scope}/instanceGroups/{mig.name}",
        "baseInstanceName": mig.base_instance_name,
        "fingerprint": fingerprint([mig.id, mig.target_size, mig.template]),
        "currentActions": actions,
        "status": {"isStable": stable, "stateful": {"hasStatefulConfig": False, "perInstanceConfigs": {
            "allEffective": True}}, "versionTarget": {"isReached": True}, "allInstancesConfig": {"effective": True}},
        "targetSize": mig.target_size,
        "selfLink": f"{base}{mig.path}",
        "updatePolicy": {"type": "OPPORTUNISTIC", "minimalAction": "REPLACE", "replacementMethod": "SUBSTITUTE",
                         "maxSurge": {"fixed": 0, "calculated": 0}, "maxUnavailable": {"fixed": 1, "calculated": 1}},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": mig.default_action_on_failure,
                                    "forceUpdateOnRepair": "NO"},
        "listManagedInstancesResults": "PAGELESS",
    }
    if mig.region:  # a regional MIG: its region, and the one zone it makes its VMs in
        del out["zone"]
        out["region"] = f"{base}projects/{mig.project}/regions/{mig.region}"
        out["distributionPolicy"] = {"zones": [{"zone": zone}], "targetShape": "ANY_SINGLE_ZONE"}
    if mig.workload_policy:
        out["resourcePolicies"] = {"workloadPolicy": f"{base}{mig.workload_policy}"}
    if mig.description:
        out["description"] = mig.description
    return out


def managed_json(m: ManagedRec, rec: InstanceRec | None, mig: MigRec, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "instance": f"{base}projects/{mig.project}/zones/{mig.zone}/instances/{m.name}",
        "name": m.name,
        "currentAction": m.current_action,
        "version": {"instanceTemplate": f"{base}{mig.template}"},
    }
    if rec is not None:
        out["id"] = str(rec.id)
        out["instanceStatus"] = rec.status
    if m.errors:
        out["lastAttempt"] = {"errors": _errors(m.errors)}
    return out


def resize_json(rr: ResizeRec, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "compute#instanceGroupManagerResizeRequest",
        "id": str(rr.id),
        "name": rr.name,
        "creationTimestamp": compute_time(rr.create_ns),
        "zone": f"{base}projects/{rr.project}/zones/{rr.zone}",
        "resizeBy": rr.resize_by,
        "state": rr.state,
        "selfLink": f"{base}{rr.path}",
        "selfLinkWithId": f"{base}{rr.path.rsplit('/', 1)[0]}/{rr.id}",
        "status": {},
    }
    if rr.zone.startswith("regions/"):  # a regional MIG's request
        del out["zone"]
        out["region"] = f"{base}projects/{rr.project}/{rr.zone}"
    if rr.run_duration is not None:
        out["requestedRunDuration"] = {"seconds": str(int(rr.run_duration))}
    if rr.error:
        out["status"]["error"] = _errors(rr.error)
    if rr.last_attempt:
        out["status"]["lastAttempt"] = {"error": _errors(rr.last_attempt)}
    if rr.description:
        out["description"] = rr.description
    return out


# ---- list filters ------------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(\(|\)|!=|=|:|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[^\s()=!:]+)')


def _lookup(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and "/" in value and value.startswith("http"):
        return value.rsplit("/", 1)[-1]
    return "" if value is None else str(value)


def parse_filter(expression: str) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over a resource's JSON for a list call's `filter`: comparisons `FIELD = V`,
    `FIELD != V`, `FIELD:*` (has), `FIELD eq REGEX` and `FIELD ne REGEX` (RE2, the whole value, as
    gcloud writes them), joined by AND (or juxtaposition) and OR, with parentheses. A link-valued
    field compares by its last segment (`zone = us-central1-a`). INVALID_ARGUMENT otherwise."""
    tokens = [t for t in _TOKEN.findall(expression or "") if t.strip()]
    pos = 0

    def bad(why: str) -> ApiError:
        return ApiError("INVALID_ARGUMENT", f"Invalid value for field 'filter': '{expression}'. {why}")

    def peek() -> str:
        return tokens[pos] if pos < len(tokens) else ""

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise bad("Unexpected end of expression.")
        pos += 1
        return tokens[pos - 1]

    def unquote(v: str) -> str:
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            return re.sub(r"\\(.)", r"\1", v[1:-1])
        return v

    def term() -> Callable[[Mapping[str, Any]], bool]:
        if peek() == "(":
            take()
            inner = disjunction()
            if take() != ")":
                raise bad("Unbalanced parentheses.")
            return inner
        if peek().upper() == "NOT":
            take()
            inner = term()
            return lambda o: not inner(o)
        field, op = take(), take()
        value = unquote(take())
        if op in ("=", "!="):
            want = value
            return (lambda o: _text(_lookup(o, field)) == want) if op == "=" else (
                lambda o: _text(_lookup(o, field)) != want)
        if op == ":":
            if value == "*":
                return lambda o: _lookup(o, field) is not None
            return lambda o: value in _text(_lookup(o, field))
        if op.lower() in ("eq", "ne"):
            try:
                rx = re.compile(value)
            except re.error as exc:
                raise bad(f"Invalid regular expression: {exc}.")
            match = op.lower() == "eq"
            return lambda o: (rx.fullmatch(_text(_lookup(o, field))) is not None) == match
        raise bad(f"Unknown operator {op!r}.")

    def conjunction() -> Callable[[Mapping[str, Any]], bool]:
        parts = [term()]
        while peek() and peek() != ")" and peek().upper() != "OR":
            if peek().upper() == "AND":
                take()
            parts.append(term())
        return lambda o: all(p(o) for p in parts)

    def disjunction() -> Callable[[Mapping[str, Any]], bool]:
        parts = [conjunction()]
        while peek().upper() == "OR":
            take()
            parts.append(conjunction())
        return lambda o: any(p(o) for p in parts)

    if not tokens:
        return lambda o: True
    pred = disjunction()
    if pos != len(tokens):
        raise bad(f"Unexpected {tokens[pos]!r}.")
    return pred
