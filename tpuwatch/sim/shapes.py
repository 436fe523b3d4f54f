"""Zones and accelerator shapes: which accelerator types exist, how many hosts and chips a
slice has, which region a zone is in, and what Google refuses as misplaced in a create."""

from __future__ import annotations

import json
import re

ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")


_ACCEL_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")


_SMALL_SLICES = (1, 2, 4, 8)


def worker_count(accelerator_type: str) -> int:
    """Hosts (workers) in a slice of this type; ValueError naming the type when unknown."""
    m = _ACCEL_RE.match(accelerator_type.strip().lower())
    if not m:
        raise ValueError(
            f"unknown accelerator type {accelerator_type!r}; expected e.g. v4-8, v4-32, "
            "v5litepod-16, v5p-64, v6e-8"
        )
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        # Chips: up to 8 on one host, then 4 chips per host.
        if n in _SMALL_SLICES:
            return 1
        if n >= 16 and n % 4 == 0 and n & (n - 1) == 0 and n <= 256:
            return n // 4
    elif n >= 8 and n % 8 == 0:
        # TensorCores (v2-v4) or chips x2 (v5p): 8 per host.
        return n // 8
    raise ValueError(
        f"unknown accelerator type {accelerator_type!r}: no {family} slice has size {n}"
    )


_CONFIG_FAMILY = {
    "V2": "v2",
    "V3": "v3",
    "V4": "v4",
    "V5P": "v5p",
    "V5LITE_POD": "v5litepod",
    "V6E": "v6e",
}


def accelerator_from_config(type_name: str, topology: str) -> str:
    """The accelerator_type string an AcceleratorConfig (type + topology) amounts to."""
    family = _CONFIG_FAMILY.get(type_name)
    if family is None or not re.match(r"^\d+(x\d+){1,2}$", topology):
        raise ValueError(f"unknown accelerator config {type_name} {topology!r}")
    chips = 1
    for d in topology.split("x"):
        chips *= int(d)
    size = chips if family in ("v5litepod", "v6e") else chips * 2
    return f"{family}-{size}"


def host_shape(accelerator_type: str) -> tuple[int, bool]:
    """(chips per host, devices under /dev/vfio rather than /dev/accel) for a valid type."""
    family, n = accelerator_type.lower().split("-", 1)
    vfio = family in ("v5p", "v5litepod", "v6e")
    if family in ("v5litepod", "v6e"):
        return (int(n) if int(n) <= 8 else 4), vfio
    return 4, vfio


def manual_maintenance_allowed(accelerator_type: str) -> bool:
    """Whether Google documents starting maintenance by hand for this type: any v4 or v5p, and
    v5e or v6e slices of 8 chips (2x4) or more."""
    m = _ACCEL_RE.match(accelerator_type.strip().lower())
    family, size = (m.group(1), int(m.group(2))) if m else ("", 0)
    return family in ("v4", "v5p") or (family in ("v5litepod", "v6e") and size >= 8)


def accelerator_generation(accelerator_type: str) -> str:
    return accelerator_type.split("-", 1)[0].upper()


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


_REGION_PART = re.compile(r"(?:^|/)regions/([^/]+)/")


_ZONE_PART = re.compile(r"(?:^|/)(?:zones|locations)/([^/]+)/")


def misplaced(zone: str, node_json: str, reservation: str = "") -> str:
    """The INVALID_ARGUMENT text for a create in `zone` naming another region's subnetwork or
    another zone's disk or reservation (what Google answers); "" when all is in place."""
    try:
        node = json.loads(node_json) if node_json else {}
    except ValueError:
        node = {}
    region = region_of(zone)
    nets = [node.get("networkConfig") or {}, *(node.get("networkConfigs") or [])]
    for net in nets:
        m = _REGION_PART.search(str(net.get("subnetwork", "")))
        if m and m.group(1) != region:
            return (f"Invalid value for field 'subnetwork': '{net['subnetwork']}'. The subnetwork must be in "
                    f"region '{region}' of zone '{zone}'.")
    for disk in node.get("dataDisks") or []:
        src = str(disk.get("sourceDisk", ""))
        m = _REGION_PART.search(src)
        z = _ZONE_PART.search(src)
        if (m and m.group(1) != region) or (not m and z and z.group(1) != zone):
            return f"Invalid value for field 'source_disk': '{src}'. The disk must be in zone '{zone}'."
    z = _ZONE_PART.search(reservation)
    if z and z.group(1) != zone:
        return f"Invalid value for field 'reservation_name': '{reservation}'. The reservation must be in zone '{zone}'."
    return ""
