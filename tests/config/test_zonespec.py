"""Fallback zones and the spec's regional and zonal fields: refused at load unless overridden per zone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuwatch import recreate, zonespec
from tpuwatch.cloud.tpu.api import node_message, zone_spec
from tpuwatch.config import load_config
from tpuwatch.errors import ConfigError
from tpuwatch.sim import shapes

SUBNET = "projects/p/regions/us-central2/subnetworks/tpu-net"
EAST_SUBNET = "projects/p/regions/us-east5/subnetworks/tpu-net"
DISK = "projects/p/zones/us-central2-b/disks/data"
RESERVATION = "projects/p/locations/us-central2-b/reservations/r1"


def config(tmp_path: Path, fallback: list[str], spec: str, overrides: str = "", zone: str = "us-central2-b") -> Path:
    path = tmp_path / "tpuwatch.toml"
    zones = ", ".join(f'"{z}"' for z in fallback)
    path.write_text(f'[tpu]\nname = "pod"\nzone = "{zone}"\nfallback_zones = [{zones}]\nqueued_resource = "qr1"\n'
                    '[tpu.spec]\naccelerator_type = "v4-8"\nruntime_version = "tpu-ubuntu2204-base"\n'
                    f'{spec}\n[job]\ncommand = "python3 train.py"\n{overrides}')
    return path


@pytest.mark.parametrize(
    ("spec", "fallback", "names"),
    [
        (f'subnetwork = "{SUBNET}"', "us-east5-a", "tpu.spec.subnetwork"),
        ('subnetwork = "tpu-net"', "us-east5-a", "tpu.spec.subnetwork"),  # a bare name: the zone's region
        (f'network_configs = [{{ network = "n", subnetwork = "{SUBNET}" }}]', "us-east5-a",
         "tpu.spec.network_configs[0].subnetwork"),
        (f'data_disks = [{{ source_disk = "{DISK}" }}]', "us-east5-a", "tpu.spec.data_disks[0].source_disk"),
        # Zonal resources are wrong in another zone of the same region too.
        (f'data_disks = [{{ source_disk = "{DISK}" }}]', "us-central2-c", "tpu.spec.data_disks[0].source_disk"),
        (f'reservation_name = "{RESERVATION}"', "us-central2-c", "tpu.spec.reservation_name"),
    ],
)
def test_a_spec_invalid_in_a_fallback_zone_is_refused_at_load_naming_key_and_zone(
        tmp_path: Path, spec: str, fallback: str, names: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(config(tmp_path, [fallback], spec))
    msg = err.value.message
    assert err.value.exit_code == 2
    assert msg.startswith(f"tpu.fallback_zones: {fallback} ") and names in msg, msg
    assert f'[tpu.zone_overrides."{fallback}"]' in msg and "INVALID_ARGUMENT" in msg, msg


def test_same_region_subnetworks_and_regional_disks_need_no_override(tmp_path: Path) -> None:
    spec = (f'subnetwork = "{SUBNET}"\n'
            'data_disks = [{ source_disk = "projects/p/regions/us-central2/disks/shared" }]')
    load_config(config(tmp_path, ["us-central2-c"], spec))


def test_overrides_make_the_spec_valid_and_a_create_there_sends_them(tmp_path: Path) -> None:
    spec = f'subnetwork = "{SUBNET}"\ndata_disks = [{{ source_disk = "{DISK}" }}]\nreservation_name = "{RESERVATION}"'
    over = (f'[tpu.zone_overrides."us-east5-a"]\nsubnetwork = "{EAST_SUBNET}"\ndata_disks = []\n'
            'reservation_name = ""\n')
    cfg = load_config(config(tmp_path, ["us-east5-a"], spec, over))
    east = zone_spec(cfg, "us-east5-a")
    assert east["subnetwork"] == EAST_SUBNET and east["data_disks"] == [] and east["reservation_name"] == ""
    home = zone_spec(cfg, "us-central2-b")
    assert home["subnetwork"] == SUBNET and home["data_disks"] == [{"source_disk": DISK}]
    node = node_message(cfg, "us-east5-a", recreate.launch_parts(cfg))
    assert node.network_config.subnetwork == EAST_SUBNET and not node.data_disks


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ('[tpu.zone_overrides."us-west4-a"]\nsubnetwork = "x"\n', "tpu.zone_overrides.us-west4-a: us-west4-a is not in tpu.fallback_zones"),
        ('[tpu.zone_overrides."us-central2-b"]\nsubnetwork = "x"\n', "tpu.zone_overrides.us-central2-b: that is tpu.zone itself"),
        ('[tpu.zone_overrides."us-east5-a"]\nspot = true\n', "tpu.zone_overrides.us-east5-a.spot: cannot be set per zone"),
        ('[tpu.zone_overrides."us-east5-a"]\nsubnetwork = 3\n', "tpu.zone_overrides.us-east5-a.subnetwork: expected a string"),
        ('[tpu.zone_overrides."east"]\nsubnetwork = "x"\n', "tpu.zone_overrides.east: 'east' is not a zone name"),
        (f'[tpu.zone_overrides."us-east5-a"]\nsubnetwork = "{SUBNET}"\n', "tpu.fallback_zones: us-east5-a"),
    ],
)
def test_bad_overrides_are_refused_naming_the_key(tmp_path: Path, over: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(config(tmp_path, ["us-east5-a"], f'subnetwork = "{SUBNET}"', over))
    assert message in err.value.message and err.value.exit_code == 2, err.value.message


def test_a_zone_from_flags_is_checked_when_the_policy_config_is_made(tmp_path: Path) -> None:
    from tpuwatch.policy.values import PolicyConfig

    cfg = load_config(config(tmp_path, ["us-east5-a"], f'subnetwork = "{SUBNET}"', zone=""))
    with pytest.raises(ConfigError, match="tpu.fallback_zones: us-east5-a"):
        PolicyConfig.from_config(cfg, "us-central2-b")


def test_the_simulator_refuses_what_google_refuses() -> None:
    def misplaced(zone: str, node: dict[str, object], reservation: str = "") -> str:
        return shapes.misplaced(zone, json.dumps(node), reservation)

    assert "region 'us-east5'" in misplaced("us-east5-a", {"networkConfig": {"subnetwork": SUBNET}})
    assert "zone 'us-central2-c'" in misplaced("us-central2-c", {"dataDisks": [{"sourceDisk": DISK}]})
    assert "reservation" in misplaced("us-central2-c", {}, RESERVATION)
    assert misplaced("us-central2-b", {"networkConfig": {"subnetwork": SUBNET},
                                       "dataDisks": [{"sourceDisk": DISK}]}, RESERVATION) == ""


def test_region_of() -> None:
    assert zonespec.region_of("us-central2-b") == "us-central2"
