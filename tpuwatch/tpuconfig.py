"""The [tpu] table's per-API part: which API made the job's TPU (`api`), the keys each API takes,
and the checks of those keys (config.py's SCHEMA declares them; this says which go together).

The APIs' own code is under tpuwatch/cloud/ (one package each, cloud/apis.py their registry);
this is the config file's schema, below cloud/ in the layers, so it names the APIs as data.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from tpuwatch.durations import parse_duration
from tpuwatch.errors import ConfigError

# Which Google API made the job's TPU: the Cloud TPU API (nodes, queued resources), or Compute
# Engine (an instance, or a managed instance group), the only way to TPU7x and later. The first
# is the default; cloud/apis.py has one handler for each.
TPU_APIS = ("tpu", "compute")
# What [tpu.compute_spec] holds at its top (written by `tpuwatch init`): the instance to insert
# again, or the MIG (its insert body) with the template and workload policy it was made from.
COMPUTE_SPEC_KEYS = ("instance", "mig", "template", "workload_policy")

# The [tpu] keys only one API takes: api -> key -> what a job of another API is told when it sets it.
API_KEYS: dict[str, dict[str, str]] = {
    "tpu": {
        "names": "not with api = \"compute\" (a multislice job spans TPU API nodes; Compute Engine multislice "
                 "is not documented by Google); remove it",
        "queued_resource": "not with api = \"compute\" (queued resources are the TPU API's; on Compute Engine a "
                           "MIG's resize requests take their place); remove it",
        "fallback_zones": "not with api = \"compute\" (a Compute Engine slice is recreated in its own zone only); "
                          "remove it",
        "zone_overrides": "not with api = \"compute\" (a Compute Engine slice is recreated in its own zone only); "
                          "remove it",
        "spec": "not with api = \"compute\" ([tpu.spec] is a TPU API node's spec; on Compute Engine it is "
                "[tpu.compute_spec]); remove it",
    },
    "compute": {
        "instance": "names a Compute Engine instance, but tpu.api is \"tpu\"; add api = \"compute\" under [tpu]",
        "mig": "names a Compute Engine MIG, but tpu.api is \"tpu\"; add api = \"compute\" under [tpu]",
        "compute_spec": "only for api = \"compute\"; a TPU API node's spec is [tpu.spec]",
        "flex_start": "a Compute Engine MIG's resize requests; on the TPU API a queued resource takes their "
                      "place (tpu.queued_resource): remove it",
    },
}
# The table a job's node is made again from, as messages name it: api -> [tpu.spec] or its like
SPEC_TABLES: dict[str, str] = {"tpu": "[tpu.spec]", "compute": "[tpu.compute_spec.instance]"}


def spec_table(tpu: Mapping[str, Any]) -> str:
    """The table a node of the job whose [tpu] table is `tpu` is made again from (SPEC_TABLES)."""
    return SPEC_TABLES[str(tpu["api"])]


# Keys of other sections only one API takes: "section.key" -> (the API, what another API's job is told)
API_ONLY: dict[str, tuple[str, str]] = {
    "recovery.report_faulty_hosts": (
        "compute", "the Cloud TPU API has no call to report a faulty host (Compute Engine's "
        "instances.reportHostAsFaulty is for TPU VMs made through it, tpu.api = \"compute\"); remove it, or set it "
        "to false: tpuwatch still says what a person should do"),
}


def flex_start(key: str, value: Any) -> float:
    """A resize request's requestedRunDuration: Google takes 10 minutes to 7 days."""
    seconds = parse_duration(value, key=key)
    if seconds and not 600 <= seconds <= 7 * 86400:
        raise ConfigError(f"{key}: {value!r} is not a flex-start run duration; Compute Engine takes 10m to 7d "
                          "(requestedRunDuration), e.g. flex_start = \"24h\"")
    return seconds


def compute_spec(key: str, value: Any) -> dict[str, Any]:
    """A table of the COMPUTE_SPEC_KEYS tables; their fields are checked against the Compute Engine
    API's messages when a recreate builds its request (tpuwatch.cloud.compute.spec)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table")
    for part, table in value.items():
        if part not in COMPUTE_SPEC_KEYS:
            hint = difflib.get_close_matches(part, list(COMPUTE_SPEC_KEYS), n=1, cutoff=0.6)
            raise ConfigError(f"{key}.{part}: unknown key{f' (did you mean {hint[0]!r}?)' if hint else ''}; "
                              f"[{key}] holds {', '.join(COMPUTE_SPEC_KEYS)} (`tpuwatch init` writes them)")
        if not isinstance(table, dict):
            raise ConfigError(f"{key}.{part}: expected a table")
    if "instance" in value and "mig" in value:
        raise ConfigError(f"{key}: holds both an instance and a mig; keep the one tpu.instance or tpu.mig names")
    return dict(value)


# An instance insert takes its machine type and each new disk's type as a full or partial URL
# only (`zones/ZONE/machineTypes/TYPE`, `zones/ZONE/diskTypes/TYPE`); Compute Engine refuses a bare
# name there with "The URL is malformed." (bare names are for instance templates). An `init` before
# this was known saved bare names: they are made into partial URLs of the slice's own zone.
_BARE = re.compile(r"^[a-z0-9][-a-z0-9]*$")
_repaired_said: set[str] = set()


def repair_compute_urls(instance: dict[str, Any], zone: str) -> list[str]:
    """Make the bare machine type and disk types of an instance insert body (as an older `init`
    saved them) partial URLs in `zone`, in place; the keys repaired."""
    fixed = []
    machine = instance.get("machineType")
    if isinstance(machine, str) and _BARE.match(machine):
        instance["machineType"] = f"zones/{zone}/machineTypes/{machine}"
        fixed.append("tpu.compute_spec.instance.machineType")
    for i, disk in enumerate(instance.get("disks") or []):
        params = disk.get("initializeParams") if isinstance(disk, dict) else None
        kind = params.get("diskType") if isinstance(params, dict) else None
        if isinstance(params, dict) and isinstance(kind, str) and _BARE.match(kind):
            params["diskType"] = f"zones/{zone}/diskTypes/{kind}"
            fixed.append(f"tpu.compute_spec.instance.disks[{i}].initializeParams.diskType")
    return fixed


def repair_compute_spec(instance: dict[str, Any], zone: str, target: str) -> None:
    """Repair an older `init`'s bare names in an instance insert body, in place, into partial
    URLs in `zone` (said once per process)."""
    fixed = repair_compute_urls(instance, zone)
    key = f"{target}:{zone}"
    if fixed and key not in _repaired_said:
        _repaired_said.add(key)
        logging.getLogger("tpuwatch.config").warning(
            "%s: bare names written by an older `tpuwatch init`; used as partial URLs in zone %s (Compute Engine "
            "refuses bare names in an instance insert). Run `tpuwatch init %s --zone %s` again to write them so",
            ", ".join(fixed), zone, target, zone)


# A spare instance (or, beside a MIG, a spare MIG) as a user may give it besides its name: its URL,
# partial or full, as gcloud and the console show it (zones/Z/instances/N,
# projects/P/zones/Z/instanceGroupManagers/N, regions/R/instanceGroupManagers/N for a regional MIG,
# https://compute.googleapis.com/compute/v1/projects/P/zones/Z/instances/N).
_INSTANCE_URL = re.compile(r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/(?P<project>[^/]+)/)?"
                           r"(?P<scope>zones|regions)/(?P<zone>[^/]+)/(?P<collection>[A-Za-z]+)/(?P<name>[^/]+)$")
_INSTANCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# what each kind of job's spares are: (their collection in a URL, what they are called)
_SPARE_KINDS = {"instance": ("instances", "instance"), "mig": ("instanceGroupManagers", "MIG")}


def _compute_spares(raw: dict[str, Any]) -> None:
    """A Compute Engine job's spares given as URLs become their names, in place: each must be of
    the job's kind (instances beside tpu.instance, MIGs beside tpu.mig) and of the job's project
    and zone (a spare stands in for the job's slice, whose workers are reached in that zone: a
    regional MIG's URL names the zone's region); with tpu.zone unset, a zonal URL's zone is the job's."""
    spares = raw.get("spares")
    if not isinstance(spares, list):
        return  # the field's own check says what it takes
    kind = "mig" if raw.get("mig") and not raw.get("instance") else "instance"
    collection, what = _SPARE_KINDS[kind]
    names: list[Any] = []
    for given in spares:
        m = _INSTANCE_URL.match(given) if isinstance(given, str) else None
        if m is None:
            if isinstance(given, str) and not _INSTANCE_NAME.match(given):
                raise ConfigError(f"tpu.spares: {given!r} is not {'a MIG' if kind == 'mig' else 'an instance'} name "
                                  "(lowercase letters, digits, hyphens; starts with a letter) nor its URL; give the "
                                  f"{what}'s name, or zones/ZONE/{collection}/NAME")
            names.append(given)
            continue
        if m["collection"] != collection or (kind == "instance" and m["scope"] != "zones"):
            raise ConfigError(f"tpu.spares: {given!r} is not {'a MIG' if kind == 'mig' else 'an instance'} "
                              f"({m['collection']}); a spare of a job on tpu.{kind} is {'a MIG' if kind == 'mig' else 'an instance'} "
                              f"in the job's zone: give its name")
        zone, project = str(raw.get("zone") or ""), str(raw.get("project") or "")
        if m["scope"] == "regions":  # a regional MIG: of the job's zone's region
            if zone and zone.rsplit("-", 1)[0] != m["zone"]:
                raise ConfigError(f"tpu.spares: {given!r} is a MIG of region {m['zone']}, not of the job's zone "
                                  f"{zone}; a spare stands in for the job's MIG in its own zone: list MIGs of that zone")
        else:
            if not zone:  # the job's zone, as the spare's URL says (a spare is in the job's zone)
                raw["zone"] = zone = m["zone"]
            if m["zone"] != zone:
                raise ConfigError(f"tpu.spares: {given!r} is in zone {m['zone']}, not the job's zone {zone}; a spare "
                                  f"stands in for the job's {what} in its own zone: list {what}s of that zone")
        if m["project"] and project and m["project"] != project:
            raise ConfigError(f"tpu.spares: {given!r} is in project {m['project']}, not the job's project {project}; "
                              f"list {what}s of the job's project")
        names.append(m["name"])
    raw["spares"] = names


def _compute_naming(raw: dict[str, Any], check: Callable[[str, Any], Any]) -> None:
    """A Compute Engine job's [tpu] before its keys are read: its spares' URLs made names, and
    `name` from the instance or MIG."""
    _compute_spares(raw)
    _compute_target(raw, check)


def _compute_target(raw: dict[str, Any], check: Callable[[str, Any], Any]) -> None:
    """With api = "compute", [tpu] names its slice by `instance` or `mig`; `name`, when left out,
    is that name (the job's and the journal's). `check`: (key, value) -> the value, as SCHEMA checks it."""
    if "name" in raw:
        return
    key = "instance" if raw.get("instance") else "mig"
    target = raw.get(key)
    if target:
        raw["name"] = check(key, target)
    elif not target:
        raise ConfigError("tpu.instance, tpu.mig: with api = \"compute\", set one: instance = \"NAME\" for a "
                          "single VM, or mig = \"NAME\" for a managed instance group (`tpuwatch init NAME` finds "
                          "which)")


def _compute_names(t: Mapping[str, Any]) -> None:
    """A Compute Engine job's slice is named by exactly one of tpu.instance and tpu.mig."""
    if bool(t["instance"]) == bool(t["mig"]):
        raise ConfigError("tpu.instance, tpu.mig: with api = \"compute\", set exactly one: instance = \"NAME\" "
                          "for a single VM, or mig = \"NAME\" for a managed instance group (`tpuwatch init NAME` "
                          "finds which)" + ("" if t["instance"] else "; neither is set"))
    target = t["instance"] or t["mig"]
    if t["name"] != target:
        key = "instance" if t["instance"] else "mig"
        raise ConfigError(f"tpu.name: {t['name']!r} is not tpu.{key} {target!r}; with api = \"compute\" the "
                          f"slice is named by tpu.{key}: drop tpu.name (name the job with job.name)")


def _compute_spec_fits(t: Mapping[str, Any]) -> None:
    """A flex-start MIG knows its size; [tpu.compute_spec] is of the slice tpu names. An older
    `init`'s bare names in the instance's body become partial URLs when the zone is known (else
    when a recreate knows it: cloud/compute/api.py)."""
    spec = t["compute_spec"]
    target = t["instance"] or t["mig"]
    if t["flex_start"]:
        if not t["mig"]:
            raise ConfigError("tpu.flex_start: flex-start resize requests are a MIG's; name the MIG with tpu.mig "
                              "(a single VM is a MIG of one), or remove tpu.flex_start")
        if not int((spec.get("mig") or {}).get("targetSize") or 0):
            raise ConfigError("tpu.compute_spec.mig.targetSize: tpu.flex_start needs how many VMs each resize "
                              f"request asks for; run `tpuwatch init {target}` while the slice runs, or set it")
    if spec:
        kind = "instance" if t["instance"] else "mig"
        other = "mig" if kind == "instance" else "instance"
        if other in spec:
            raise ConfigError(f"tpu.compute_spec.{other}: the job names a {kind} (tpu.{kind}); run "
                              f"`tpuwatch init {target}` to write its spec")
    instance = spec.get("instance")
    if isinstance(instance, dict) and t["zone"]:
        repair_compute_spec(instance, t["zone"], t["instance"] or t["name"])
    _compute_spares_fit(t)
    _compute_pool(t)


def _compute_pool(t: Mapping[str, Any]) -> None:
    """[tpu] spare_pool of a Compute Engine job: on an instance. A claim or a return relabels the
    spare (instances.setLabels); a MIG has no labels of its own (its VMs take their template's,
    and a recreate puts those back)."""
    if t["spare_pool"] and t["mig"]:
        raise ConfigError("tpu.spare_pool: not with tpu.mig: a job claims a pool's spare by relabelling it, and a MIG "
                          "has no labels of its own (its VMs take their instance template's, and a recreate puts those "
                          "back); give the job spare MIGs of its own (tpu.spares), or run it on one instance "
                          "(tpu.instance)")


def compute_priority(t: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    """[job] priority of a Compute Engine job: on an instance only. A hand-over relabels the
    node (instances.setLabels); a MIG has no labels of its own, and its VMs' labels come from its
    template, so a recreate (its repair, or tpuwatch's) would undo one."""
    if t["api"] == "compute" and t["mig"] and job.get("priority", "off") != "off":
        raise ConfigError("job.priority: not with tpu.mig: jobs lend each other a node by relabelling it, and a MIG "
                          "has no labels of its own (its VMs take their instance template's, and a recreate puts "
                          "those back); remove job.priority, or run the job on one instance (tpu.instance)")


def _compute_spares_fit(t: Mapping[str, Any]) -> None:
    """A Compute Engine job's spares: instances beside the job's instance, MIGs beside its MIG
    (not a flex-start one), never the job's own; an instance made again from
    [tpu.compute_spec.instance] must not attach a disk of the job's instance read-write (Compute
    Engine refuses a second such attachment)."""
    spares = t["spares"]
    if not spares:
        return
    if t["mig"]:
        if t["mig"] in spares:
            raise ConfigError(f"tpu.spares: {t['mig']!r} is the job's own MIG (tpu.mig); a spare is an idle MIG of "
                              "its own: drop it from tpu.spares")
        if t["flex_start"]:
            raise ConfigError("tpu.spares: not with tpu.flex_start: a flex-start MIG holds no VM until a resize "
                              "request is served, so an idle spare MIG would have to hold its VMs (and their run "
                              "duration) all along; drop tpu.spares, or tpu.flex_start for MIGs whose VMs stay")
        return
    if t["instance"] in spares:
        raise ConfigError(f"tpu.spares: {t['instance']!r} is the job's own instance (tpu.instance); a spare is an "
                          "idle instance of its own: drop it from tpu.spares")
    instance = (t["compute_spec"] or {}).get("instance") or {}
    for i, disk in enumerate(instance.get("disks") or []):
        if isinstance(disk, dict) and disk.get("source") and disk.get("mode", "READ_WRITE") == "READ_WRITE":
            raise ConfigError(
                f"tpu.compute_spec.instance.disks[{i}].source: attaches disk {disk['source']!r} read-write, which a "
                "spare made again from this spec cannot also attach (one instance holds a disk read-write); with "
                "tpu.spares, let the disk be made with the instance (autoDelete, as `tpuwatch init` captures it), "
                "attach it READ_ONLY, or drop tpu.spares")


# api -> its own checks of the given [tpu] table (before its keys are read), and of the validated
# table (before, and after, the other APIs' keys are refused)
_NAMING: dict[str, Callable[[dict[str, Any], Callable[[str, Any], Any]], None]] = {"compute": _compute_naming}
_BEFORE: dict[str, Callable[[Mapping[str, Any]], None]] = {"compute": _compute_names}
_AFTER: dict[str, Callable[[Mapping[str, Any]], None]] = {"compute": _compute_spec_fits}


def name_the_slice(raw: dict[str, Any], check: Callable[[str, Any], Any]) -> None:
    """The given [tpu] table's `name`, where its API names the slice otherwise (a Compute Engine
    instance or MIG), from that name; `check`: (key, value) -> the value, as SCHEMA checks it."""
    naming = _NAMING.get(str(raw.get("api") or TPU_APIS[0]))
    if naming is not None:
        naming(raw, check)


def check(t: Mapping[str, Any], sections: Mapping[str, Mapping[str, Any]]) -> None:
    """ConfigError for a [tpu] table whose keys do not fit its `api`, or a key of another section
    that only another API takes."""
    api = t["api"]
    if (before := _BEFORE.get(api)) is not None:
        before(t)
    for other, keys in API_KEYS.items():
        if other != api:
            for key, refusal in keys.items():
                if t[key]:
                    raise ConfigError(f"tpu.{key}: {refusal}")
    if (after := _AFTER.get(api)) is not None:
        after(t)
    compute_priority(t, sections["job"])
    for dotted, (only, refusal) in API_ONLY.items():
        section, key = dotted.split(".", 1)
        if api != only and sections[section][key] not in (False, "off"):  # set: not its default
            raise ConfigError(f"{dotted}: {refusal}")


def queued_only(spec: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """ConfigError for a tier or reservation on a plain node: only a queued resource carries them
    (the node's own scheduling config has no reservation name in google-cloud-tpu), so a recreate
    would silently create the node without them."""
    given = [("tpu.spec", spec), *((f'tpu.zone_overrides."{z}"', o) for z, o in overrides.items())]
    for where, table in given:
        for key in ("queued_resource_tier", "reservation_name"):
            if table.get(key):
                raise ConfigError(
                    f"{where}.{key}: only a queued resource has a tier or a reservation, and tpu.queued_resource "
                    "is not set, so a recreate would create the node without it; set tpu.queued_resource to the "
                    "request that made the node (`tpuwatch init` writes both), or remove the key")
