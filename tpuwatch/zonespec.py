"""Per-zone spec overrides: the regional and zonal fields of `[tpu.spec]` in a fallback zone.

A spec is captured in one zone. Some of its fields name resources that live in one region or
one zone, and the TPU API answers INVALID_ARGUMENT (fatal, after the old node is gone) when a
create in another zone names them:

- regional: `subnetwork` (and each `network_configs[].subnetwork`),
  `projects/P/regions/R/subnetworks/S`, or a bare name, looked up in the zone's own region;
- zonal: `data_disks[].source_disk` (`projects/P/zones/Z/disks/D`; a regional disk
  `.../regions/R/disks/D` serves its region) and `reservation_name`
  (`projects/P/locations/Z/reservations/R`).

`[tpu.zone_overrides."<zone>"]` gives, for one fallback zone, the values of those fields there;
everything else of the spec is kept. `check` rejects at load a config whose spec would be
invalid in one of its fallback zones, naming the key, the zone and the fix; `for_zone` is the
spec a create in a zone sends. Pure functions over config values: no I/O, no cloud client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tpuwatch.errors import ConfigError

KEY = "tpu.zone_overrides"
# The spec keys an override may set: those whose resources are regional or zonal.
OVERRIDABLE = ("subnetwork", "network_configs", "data_disks", "reservation_name")

_REGION_PART = re.compile(r"(?:^|/)regions/(?P<r>[^/]+)/")
_ZONE_PART = re.compile(r"(?:^|/)(?:zones|locations)/(?P<z>[^/]+)/")


def region_of(zone: str) -> str:
    """`us-central2` for `us-central2-b`."""
    return zone.rsplit("-", 1)[0]


def for_zone(spec: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]], zone: str) -> dict[str, Any]:
    """The spec a create in `zone` sends: the spec with that zone's overrides put in."""
    out = dict(spec)
    over = dict(overrides.get(zone, {}))
    if "network_configs" in over:  # one or the other shape of the network, as validate_spec wants
        out.pop("subnetwork", None)
    if "subnetwork" in over:
        out.pop("network_configs", None)
    out.update(over)
    return out


def _subnet_problem(value: str, primary: str, zone: str) -> str:
    m = _REGION_PART.search(value)
    where = m.group("r") if m else region_of(primary)
    if where == region_of(zone):
        return ""
    if m:
        return f"is in region {where}"
    return f"names a subnetwork of region {where} (a bare name is looked up in the zone's own region)"


def _zonal_problem(value: str, primary: str, zone: str) -> str:
    m = _REGION_PART.search(value)
    if m:  # a regional disk serves both zones of its region
        return "" if m.group("r") == region_of(zone) else f"is in region {m.group('r')}"
    m = _ZONE_PART.search(value)
    where = m.group("z") if m else primary
    return "" if where == zone else f"is in zone {where}"


def problems(spec: Mapping[str, Any], primary: str, zone: str) -> list[tuple[str, str, str]]:
    """(spec key, value, what is wrong) for each field of `spec` that a create in `zone` cannot use."""
    out: list[tuple[str, str, str]] = []

    def add(key: str, value: str, why: str) -> None:
        if why:
            out.append((key, value, why))

    if spec.get("subnetwork"):
        add("subnetwork", spec["subnetwork"], _subnet_problem(spec["subnetwork"], primary, zone))
    for i, net in enumerate(spec.get("network_configs") or ()):
        if net.get("subnetwork"):
            add(f"network_configs[{i}].subnetwork", net["subnetwork"], _subnet_problem(net["subnetwork"], primary, zone))
    for i, disk in enumerate(spec.get("data_disks") or ()):
        add(f"data_disks[{i}].source_disk", disk["source_disk"], _zonal_problem(disk["source_disk"], primary, zone))
    if spec.get("reservation_name"):
        add("reservation_name", spec["reservation_name"], _zonal_problem(spec["reservation_name"], primary, zone))
    return out


def check_overrides(value: Any) -> dict[str, dict[str, Any]]:
    """Validate the `[tpu.zone_overrides]` table's shape (zones, keys, value types)."""
    from tpuwatch.spec import (  # the spec's own value rules
        SPEC_KEYS,
        _check_value,
        check_reservation,
    )

    if not isinstance(value, Mapping):
        raise ConfigError(f'{KEY}: expected a table of zones, e.g. [{KEY}."us-east5-a"]')
    out: dict[str, dict[str, Any]] = {}
    for zone, table in value.items():
        where = f"{KEY}.{zone}"
        if not re.match(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$", zone):
            raise ConfigError(f"{where}: {zone!r} is not a zone name such as us-east5-a")
        if not isinstance(table, Mapping) or not table:
            raise ConfigError(f"{where}: expected a table with some of {', '.join(OVERRIDABLE)}")
        for k, v in table.items():
            if k not in OVERRIDABLE:
                raise ConfigError(
                    f"{where}.{k}: cannot be set per zone; a zone override holds only the regional "
                    f"and zonal spec keys: {', '.join(OVERRIDABLE)}")
            _check_value(f"{where}.{k}", SPEC_KEYS[k][0], v)
            if k == "reservation_name":
                check_reservation(f"{where}.{k}", v)
        for i, disk in enumerate(table.get("data_disks") or ()):
            if not disk.get("source_disk"):
                raise ConfigError(f"{where}.data_disks[{i}].source_disk: missing")
        out[zone] = dict(table)
    return out


def check(spec: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]], primary: str,
          fallback_zones: Sequence[str]) -> None:
    """ConfigError (exit 2) when the spec would be invalid in a fallback zone, or an override is idle.

    `primary` is the zone the spec was captured in ("" when not known yet: only overrides'
    zones are checked against the fallback list then).
    """
    fallbacks = [z for z in fallback_zones if z != primary]
    for zone in overrides:
        if primary and zone == primary:
            raise ConfigError(f"{KEY}.{zone}: that is tpu.zone itself; put its values in [tpu.spec]")
        if zone not in fallbacks:
            raise ConfigError(f"{KEY}.{zone}: {zone} is not in tpu.fallback_zones, so this override would "
                              "never be used; add the zone to fallback_zones or remove the override")
    if not primary or not spec:
        return
    for zone in fallbacks:
        bad = problems(for_zone(spec, overrides, zone), primary, zone)
        if bad:
            key, value, why = bad[0]
            field = key.split("[", 1)[0].split(".", 1)[0]
            raise ConfigError(
                f"tpu.fallback_zones: {zone} (region {region_of(zone)}) cannot use tpu.spec.{key} = {value!r}: "
                f"it {why}, and a create in {zone} would fail with INVALID_ARGUMENT. Give the value for "
                f"that zone under [{KEY}.\"{zone}\"] ({field} = ...), or remove {zone} from fallback_zones")
