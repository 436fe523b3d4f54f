"""A Compute Engine slice's saved spec: what `init` captures of an instance or a MIG
([tpu.compute_spec]), and the check of an insert body against what Compute Engine takes, run
before a recreate deletes anything. Pure but for the reads `capture_*` make through the adapter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

from tpuwatch.cloud import clients
from tpuwatch.cloud.compute.view import short, time_of
from tpuwatch.errors import UsageError


class SpecReads(Protocol):
    """The reads a capture makes (cloud/compute/adapter.py's ComputeAdapter)."""

    zone: str

    def disk_params(self, url: str) -> dict[str, Any]: ...

    def get_template(self, url: str) -> Any | None: ...

    def get_resource_policy(self, url: str) -> Any | None: ...


# A full or partial Compute Engine URL, its collection captured: zones/Z/machineTypes/T,
# projects/P/global/instanceTemplates/T, https://compute.googleapis.com/compute/v1/projects/...
_URL = re.compile(r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/[^/]+/)?"
                  r"(?:zones/[^/]+/|regions/[^/]+/|global/)([A-Za-z]+)/[^/]+$")


def _url_fields(kind: str, body: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, value, collection) of the fields an insert takes as a URL only (compute.v1's
    descriptions: "full or partial URL"), present in `body`."""
    out: list[tuple[str, str, str]] = []
    if kind == "instance":
        if body.get("machineType"):
            out.append(("machineType", str(body["machineType"]), "machineTypes"))
        for i, disk in enumerate(body.get("disks") or []):
            params = disk.get("initializeParams") or {}
            if params.get("diskType"):
                out.append((f"disks[{i}].initializeParams.diskType", str(params["diskType"]), "diskTypes"))
            if disk.get("source"):
                out.append((f"disks[{i}].source", str(disk["source"]), "disks"))
    else:
        if body.get("instanceTemplate"):
            out.append(("instanceTemplate", str(body["instanceTemplate"]), "instanceTemplates"))
        policy = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        if policy:
            out.append(("resourcePolicies.workloadPolicy", str(policy), "resourcePolicies"))
    return out


def check_insert(kind: str, body: Mapping[str, Any], name: str, zone: str) -> Any:
    """The insert body of instance or MIG `name` as the client's message, or UsageError (naming the
    key and the fix) for one Compute Engine would refuse: a field its API does not have, or a bare
    name where it takes a URL only. A recreate calls it before anything is deleted; the insert again."""
    compute_v1 = clients.compute_v1()

    cls = compute_v1.Instance if kind == "instance" else compute_v1.InstanceGroupManager
    again = f"run `tpuwatch init {name} --zone {zone}` to capture it again"
    try:
        resource = cls.from_json(_json({**dict(body), "name": name}), ignore_unknown_fields=False)
    except Exception as exc:  # json_format.ParseError: a field this API does not know, a wrong type
        raise UsageError(f"tpu.compute_spec.{kind}: {exc}; {again}") from None
    for key, value, collection in _url_fields(kind, body):
        m = _URL.match(value)
        if m is None or m.group(1) != collection:
            raise UsageError(f"tpu.compute_spec.{kind}.{key}: {value!r} is not a full or partial URL, which Compute "
                             f"Engine refuses (\"The URL is malformed.\"); it takes e.g. zones/{zone}/{collection}/"
                             f"{value.rsplit('/', 1)[-1]} ({again})")
    return resource


def _json(data: Mapping[str, Any]) -> str:

    return json.dumps(data)


def to_json(message: Any) -> dict[str, Any]:
    """A Compute Engine message as JSON-like data (camelCase, defaults left out), as saved in
    [tpu.compute_spec]."""

    data: dict[str, Any] = json.loads(type(message).to_json(message, always_print_fields_with_no_presence=False, indent=0))
    return data


# Fields the API fills in, which an insert must not carry (output only).
_OUTPUT_ONLY = frozenset({
    "id", "kind", "selfLink", "creationTimestamp", "status", "statusMessage", "cpuPlatform", "fingerprint",
    "labelFingerprint", "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp", "resourceStatus",
    "satisfiesPzi", "satisfiesPzs", "startRestricted", "zone", "region", "currentActions", "instanceGroup",
})
_NIC_OUTPUT = frozenset({"networkIP", "fingerprint", "name", "kind", "ipv6AccessConfigs"})


def without_past_termination(body: Mapping[str, Any], now: float) -> Mapping[str, Any]:
    """An instance's insert body without a `scheduling.terminationTime` that has passed: the VM
    it describes was deleted (or stopped) then, and the VM made again in its place gets its run
    from `maxRunDuration`, if any, not a time already gone (an insert with one is refused)."""
    sched = body.get("scheduling")
    ends = time_of(str(sched.get("terminationTime") or "")) if isinstance(sched, Mapping) else None
    if not isinstance(sched, Mapping) or ends is None or ends.timestamp() > now:
        return body
    return {**body, "scheduling": {k: v for k, v in sched.items() if k != "terminationTime"}}


def capture_instance(api: SpecReads, inst: Any) -> dict[str, Any]:
    """An instance as the insert body that makes it again: output-only fields dropped, the network
    interfaces without their assigned addresses, and each disk deleted with the instance
    (autoDelete) as `initializeParams` from its disk (image, size, type), since its source disk
    goes with it. A disk that outlives the instance is attached again by its `source`."""
    body = {k: v for k, v in to_json(inst).items() if k not in _OUTPUT_ONLY}
    # Compute Engine takes only a full or partial URL here: the instance's own zone, partial
    body["machineType"] = f"zones/{api.zone}/machineTypes/{short(str(body.get('machineType', '')))}"
    nics = []
    for nic in body.get("networkInterfaces") or []:
        nic = {k: v for k, v in nic.items() if k not in _NIC_OUTPUT}
        nic["accessConfigs"] = [{k: v for k, v in ac.items() if k not in ("natIP", "kind")}
                                for ac in nic.get("accessConfigs") or []]
        nics.append(nic)
    if nics:
        body["networkInterfaces"] = nics
    disks = []
    for disk in body.get("disks") or []:
        kept = {k: v for k, v in disk.items() if k in ("autoDelete", "boot", "deviceName", "mode", "interface",
                                                       "type", "source")}
        if disk.get("autoDelete") and disk.get("source"):
            params = api.disk_params(str(disk["source"]))
            kept.pop("source")
            kept["initializeParams"] = params
        disks.append(kept)
    if disks:
        body["disks"] = disks
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        body["metadata"] = {k: v for k, v in metadata.items() if k in ("items",)}
    return body


def capture_mig(api: SpecReads, mig: Any) -> dict[str, Any]:
    """A MIG as `tpu.compute_spec`: `mig` (its insert body), `template` and `workload_policy` (the
    resources it was made from, as they are now, for a person to make them again if deleted)."""
    out: dict[str, Any] = {"mig": {k: v for k, v in to_json(mig).items() if k not in _OUTPUT_ONLY}}
    template = api.get_template(mig.instance_template) if mig.instance_template else None
    if template is not None:
        out["template"] = {k: v for k, v in to_json(template).items() if k not in _OUTPUT_ONLY}
    policy_url = mig.resource_policies.workload_policy if "resource_policies" in mig else ""
    policy = api.get_resource_policy(policy_url) if policy_url else None
    if policy is not None:
        out["workload_policy"] = {k: v for k, v in to_json(policy).items() if k not in _OUTPUT_ONLY}
    return out
