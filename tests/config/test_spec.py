"""The saved node spec: capture from a live Node, validation, create request, tpuwatch.toml writer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from google.cloud import tpu_v2, tpu_v2alpha1

from tpuwatch import spec as specmod
from tpuwatch.config import validate
from tpuwatch.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Output only, or filled in by the API (cidr_block: the subnetwork's range, which a create refuses)
OUTPUT_ONLY = ("name", "id", "create_time", "state", "health", "health_description", "network_endpoints",
               "symptoms", "queued_resource", "multislice_node", "api_version", "cidr_block")


def live_node(**over: object) -> tpu_v2.Node:
    """A node as the API returns it: every spec field set, and the output-only ones too."""
    fields: dict[str, object] = dict(
        name="projects/p/locations/us-central2-b/nodes/llm-pod",
        description="training box",
        accelerator_type="v4-32",
        runtime_version="tpu-ubuntu2204-base",
        network_config={"network": "projects/p/global/networks/default",
                        "subnetwork": "projects/p/regions/us-central2/subnetworks/default",
                        "enable_external_ips": True, "queue_count": 4},
        cidr_block="10.0.0.0/24",
        service_account={"email": "sa@p.iam.gserviceaccount.com",
                         "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
        scheduling_config={"spot": True},
        labels={"team": "research", "env": "prod"},
        metadata={"startup-script": "#!/bin/bash\necho old\n", "ssh-keys": "me:ssh-ed25519 AAAA me",
                  "tpuwatch-command": "old command", "tpuwatch-setup": "pip install -r req.txt"},
        tags=["tpu", "allow-ssh"],
        data_disks=[{"source_disk": "projects/p/zones/us-central2-b/disks/data", "mode": "READ_ONLY"}],
        shielded_instance_config={"enable_secure_boot": True},
        # output only
        id=1234567890,
        create_time={"seconds": 1700000000},
        state=tpu_v2.Node.State.READY,
        health=tpu_v2.Node.Health.HEALTHY,
        health_description="",
        network_endpoints=[{"ip_address": "10.0.0.2", "port": 8470, "access_config": {"external_ip": "34.1.2.3"}}],
        symptoms=[{"symptom_type": tpu_v2.Symptom.SymptomType.LOW_MEMORY, "details": "x"}],
        queued_resource="projects/p/locations/us-central2-b/queuedResources/qr1",
        multislice_node=False,
    )
    fields.update(over)
    return tpu_v2.Node(**fields)


def test_capture_round_trip_keeps_spec_fields_drops_output_only_and_adds_owner() -> None:
    node = live_node()
    spec = specmod.capture(node, "myjob")
    assert spec["labels"][specmod.OWNER_LABEL] == "myjob"
    built = specmod.build_node(spec, None, job="myjob")
    assert isinstance(built, tpu_v2.Node)

    expected = tpu_v2.Node(node)
    for f in OUTPUT_ONLY:
        expected.__delattr__(f)  # clear
    expected.labels[specmod.OWNER_LABEL] = "myjob"
    del expected.metadata["tpuwatch-command"]  # tpuwatch's own keys are written afresh by each create
    assert built == expected
    for f in OUTPUT_ONLY:
        assert f not in built, f
    assert built.metadata["tpuwatch-setup"] == "pip install -r req.txt"  # a user's tpuwatch-* key stays
    assert "id" not in spec and "state" not in spec and "network_endpoints" not in spec


def test_capture_survives_toml_round_trip() -> None:
    spec = specmod.capture(live_node(), "myjob")
    text = specmod.render_config(name="llm-pod", project="my-proj", zone="us-central2-b", spec=spec)
    again = validate(tomllib.loads(text))["tpu"]["spec"]
    assert again == spec
    assert specmod.build_node(again, None, job="myjob") == specmod.build_node(spec, None, job="myjob")


def test_accelerator_config_and_several_networks_round_trip() -> None:
    node = live_node(
        accelerator_type="v5p-16",  # the API fills this in; the config is what was asked for
        accelerator_config={"type_": tpu_v2.AcceleratorConfig.Type.V5P, "topology": "2x2x2"},
        network_config=None,
        network_configs=[{"network": "a", "subnetwork": "sa"}, {"network": "b", "subnetwork": "sb", "queue_count": 2}],
    )
    spec = specmod.capture(node, "j")
    assert "accelerator_type" not in spec
    assert spec["accelerator_config"] == {"type": "V5P", "topology": "2x2x2"}
    built = specmod.build_node(spec)
    assert built.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5P
    assert [c.network for c in built.network_configs] == ["a", "b"]
    assert built.network_configs[1].queue_count == 2
    assert "network_config" not in built


def test_v2alpha1_boot_disk_and_autocheckpoint_are_captured_and_built_with_v2alpha1() -> None:
    node = tpu_v2alpha1.Node(
        accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite",
        autocheckpoint_enabled=True,
        boot_disk_config={"customer_encryption_key": {"kms_key_name": "projects/p/k"},
                          "enable_confidential_compute": True},
        upcoming_maintenance={"can_reschedule": True},
    )
    spec = specmod.capture(node, "j")
    assert spec["boot_disk"] == {"kms_key_name": "projects/p/k", "enable_confidential_compute": True}
    built = specmod.build_node(spec)
    assert isinstance(built, tpu_v2alpha1.Node)
    assert built.autocheckpoint_enabled
    assert built.boot_disk_config.customer_encryption_key.kms_key_name == "projects/p/k"
    assert "upcoming_maintenance" not in built


def test_build_node_startup_script_replaces_captured_one_and_keeps_other_metadata() -> None:
    spec = specmod.capture(live_node(), "myjob")
    built = specmod.build_node(spec, "#!/bin/bash\necho new\n", job="myjob",
                               extra_metadata={"tpuwatch-job": "myjob"})
    assert built.metadata["startup-script"] == "#!/bin/bash\necho new\n"
    assert built.metadata["ssh-keys"] == "me:ssh-ed25519 AAAA me"
    assert built.metadata["tpuwatch-job"] == "myjob"
    js = specmod.node_to_json(built)
    assert js["metadata"]["startup-script"].endswith("echo new\n")
    assert js["schedulingConfig"] == {"spot": True}


def test_build_node_sets_owner_label_to_the_job_exactly() -> None:
    spec = {"accelerator_type": "v4-8", "runtime_version": "rt", "labels": {"tpuwatch-job": "other"}}
    assert specmod.build_node(spec, job="myjob").labels[specmod.OWNER_LABEL] == "myjob"


PLACE = {"tpuwatch-lent-by": "lo", "tpuwatch-wanted-by": "hi", "tpuwatch-wanted-priority": "500",
         "tpuwatch-returned-by": "hi", "tpuwatch-priority": "100", "tpuwatch-idle": "true", "tpuwatch-pool": "v4",
         "tpuwatch-pool-bad": "a"}


def test_where_a_node_stood_between_jobs_is_never_captured_nor_made_again() -> None:
    # a node captured while lent (or claimed from a pool) and made again from that spec would read
    # as a loan (tpuwatch-lent-by) or as the pool's: the spec keeps the user's labels only
    captured = specmod.capture(live_node(labels={"team": "llm", "tpuwatch-job": "lo", **PLACE}), "lo")
    assert captured["labels"] == {"team": "llm", "tpuwatch-job": "lo"}
    old = {"accelerator_type": "v4-8", "runtime_version": "rt", "labels": {"team": "llm", **PLACE}}  # an older init's
    assert dict(specmod.build_node(old, job="lo").labels) == {"team": "llm", "tpuwatch-job": "lo"}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"accelerator_type": "v4-8"}, "tpu.spec.runtime_version: missing"),
        ({"runtime_version": "rt"}, "tpu.spec.accelerator_type: missing"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "acelerator_config": {}},
         "did you mean 'accelerator_config'"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "sport": True}, "did you mean 'spot'"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "spot": "yes"}, "tpu.spec.spot: expected true or false"),
        ({"runtime_version": "rt", "accelerator_config": {"type": "V9", "topology": "2x2"}},
         "tpu.spec.accelerator_config.type"),
        ({"runtime_version": "rt", "accelerator_config": {"type": "V4"}}, "accelerator_config.topology: missing"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "labels": {"tpuwatch-job": "My Job"}},
         "tpu.spec.labels.tpuwatch-job"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "data_disks": [{"mode": "READ_ONLY"}]},
         "tpu.spec.data_disks[0].source_disk: missing"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "spot": True, "preemptible": True},
         "at most one of spot"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "metadata": {"big": "x" * 262_145}},
         "tpu.spec.metadata.big: 262145 bytes is over the metadata value limit"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt",
          "metadata": {f"k{i}": "x" * 200_000 for i in range(3)}}, "512 KB"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "queued_resource_tier": "best-effort"},
         "tpu.spec.queued_resource_tier: 'best-effort' is not one of 'spot', 'guaranteed', 'reserved', "
         "'best_effort' or \"\" (on demand) (did you mean 'best_effort'?)"),
        ({"accelerator_type": "v4-8", "runtime_version": "rt", "reservation_name": "my-res"},
         "tpu.spec.reservation_name: 'my-res' is not a reservation's full name; write "
         "\"projects/PROJECT/locations/ZONE/reservations/NAME\""),
    ],
)
def test_bad_specs_name_the_key(spec: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        specmod.validate_spec(spec)
    assert needle in str(err.value)
    assert err.value.exit_code == 2


def test_startup_script_missing_or_too_big(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tpu.startup_script: file .*nope.sh' not found"):
        specmod.read_startup_script("nope.sh", base=tmp_path)
    big = tmp_path / "big.sh"
    big.write_bytes(b"#" * (specmod.METADATA_VALUE_MAX + 1))
    with pytest.raises(ConfigError, match=r"tpu.startup_script: .* over the metadata value limit"):
        specmod.read_startup_script(str(big))
    ok = tmp_path / "ok.sh"
    ok.write_text("echo hi\n")
    assert specmod.read_startup_script("ok.sh", base=tmp_path) == "echo hi\n"
    # a script within the per-value limit that pushes the total over 512 KB is caught at build
    spec = {"accelerator_type": "v4-8", "runtime_version": "rt", "metadata": {"a": "x" * 200_000, "b": "y" * 200_000}}
    with pytest.raises(ConfigError, match="512 KB"):
        specmod.build_node(spec, "z" * 200_000)


def test_render_config_is_accepted_by_load_config(tmp_path: Path) -> None:
    from tpuwatch.config import load_config

    spec = specmod.capture(live_node(), "llm-pod")
    text = specmod.render_config(name="llm-pod", project="my-proj", zone="us-central2-b", spec=spec,
                                 queued_resource="qr1", checkpoint_dir="gs://b/run/ckpt")
    path = tmp_path / "tpuwatch.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.tpu_name == "llm-pod"
    assert cfg.get("tpu.queued_resource") == "qr1"
    assert cfg.get("job.checkpoint_dir") == "gs://b/run/ckpt"
    assert cfg.tpu["spec"]["metadata"]["startup-script"] == "#!/bin/bash\necho old\n"
    assert "# [recovery]" in text and "# [ssh]" in text


@pytest.mark.parametrize(("tier", "reserved", "expected"), [
    ("best_effort", False, "best_effort"), ("guaranteed", True, "reserved"), ("guaranteed", False, "guaranteed"),
    ("spot", False, "spot"), ("", False, ""),
])
def test_a_queued_resources_tier_is_captured_from_v2alpha1_and_asked_for_again(
        tier: str, reserved: bool, expected: str) -> None:
    from google.cloud import tpu_v2alpha1

    from tpuwatch.cloud.tpu.adapter import parse_message
    from tpuwatch.cloud.tpu.lifecycle import TIER_FIELDS, queued_request

    res = "projects/p/locations/us-central2-b/reservations/r1"
    qr = tpu_v2alpha1.QueuedResource(reservation_name=res)
    if tier == "guaranteed":
        qr.guaranteed = tpu_v2alpha1.QueuedResource.Guaranteed(reserved=reserved)
    elif tier:
        setattr(qr, tier, {})
    table = specmod.capture_queued_resource(qr)
    assert table == {"queued_resource_tier": expected, "reservation_name": res}
    specmod.validate_spec({"accelerator_type": "v4-8", "runtime_version": "rt", **table})
    assert set(TIER_FIELDS) == set(specmod.QR_TIERS) - {""}
    request = queued_request("projects/p/locations/us-central2-b", "pod", {"acceleratorType": "v4-8"}, expected, res)
    version, msg = parse_message("QueuedResource", request, "tpu.spec")
    # v2 cannot hold best_effort or guaranteed.reserved: such a request goes through v2alpha1
    assert version == ("v2alpha1" if expected in specmod.QR_ALPHA_TIERS else "v2")
    assert specmod.capture_queued_resource(msg) == table


def test_a_tier_or_reservation_on_a_plain_node_is_refused(tmp_path: Path) -> None:
    """Only a queued resource carries them: on a plain node a recreate would drop them silently."""
    from tpuwatch.config import load_config

    path = tmp_path / "tpuwatch.toml"
    base = ('[tpu]\nname = "pod"\nzone = "us-central2-b"\n{qr}[tpu.spec]\naccelerator_type = "v4-8"\n'
            'runtime_version = "rt"\n{key}\n[job]\ncommand = "python3 train.py"\n')
    for key in ('queued_resource_tier = "best_effort"',
                'reservation_name = "projects/p/locations/us-central2-b/reservations/r1"'):
        path.write_text(base.format(qr="", key=key))
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert err.value.message.startswith(f"tpu.spec.{key.split()[0]}: only a queued resource has a tier or a "
                                            "reservation, and tpu.queued_resource is not set"), err.value.message
        assert err.value.exit_code == 2
        path.write_text(base.format(qr='queued_resource = "qr1"\n', key=key))
        load_config(path)
