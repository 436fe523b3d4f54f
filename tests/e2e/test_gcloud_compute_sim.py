"""The real `gcloud` lists and describes simulated Compute Engine TPU VMs and MIGs.

gcloud points at the simulator's REST face through a private configuration
(`api_endpoint_overrides/compute`); one call is made with `compute/force_batch_request` so that
it goes through gcloud's multipart batch to `/batch/compute/v1`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.sim import gcloudcfg
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

GCLOUD = shutil.which("gcloud") or "/usr/bin/gcloud"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(GCLOUD), reason="needs the Google Cloud CLI (gcloud)"),
]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Simulator, RestFace, dict[str, str]]]:
    with Simulator(root=tmp_path / "sim", speed=600) as sim, RestFace(sim.world) as rest:
        cfg = gcloudcfg.write_config(tmp_path / "gcloud", url=rest.url, project=sim.project, zone=sim.zone)
        env = {**os.environ, **cfg.env}
        for k in ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE"):
            env.pop(k, None)
        yield sim, rest, env


def _gcloud(env: dict[str, str], *args: str) -> str:
    p = subprocess.run([GCLOUD, *args, "--format=json"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_gcloud_lists_and_describes_instances_and_migs(world: tuple[Simulator, RestFace, dict[str, str]]) -> None:
    sim, rest, env = world
    vm = sim.world.add_instance("vm", body={"labels": {"team": "ml"},
                                            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4")
    listed = json.loads(_gcloud(env, "compute", "instances", "list"))
    assert sorted(i["name"] for i in listed) == sorted(["vm", *mig.members])
    only = json.loads(_gcloud(env, "compute", "instances", "list", "--filter=labels.team=ml"))
    assert [i["name"] for i in only] == ["vm"]
    described = json.loads(_gcloud(env, "compute", "instances", "describe", "vm"))
    assert described["id"] == str(vm.id) and described["scheduling"]["provisioningModel"] == "SPOT"
    assert described["machineType"].endswith("/machineTypes/tpu7x-standard-4t")
    managed = json.loads(_gcloud(env, "compute", "instance-groups", "managed", "list-instances", "slice"))
    assert sorted(m["name"] for m in managed) == sorted(mig.members)
    assert {m["currentAction"] for m in managed} == {"NONE"}
    group = json.loads(_gcloud(env, "compute", "instance-groups", "managed", "describe", "slice"))
    assert group["status"]["isStable"] is True and group["targetSize"] == 4
    assert group["resourcePolicies"]["workloadPolicy"].endswith("/resourcePolicies/slice-policy")
    batched = {**env, "CLOUDSDK_COMPUTE_FORCE_BATCH_REQUEST": "true"}
    listed = json.loads(_gcloud(batched, "compute", "instances", "list", f"--zones={sim.zone}"))
    assert len(listed) == 5 and rest.compute.batches >= 1


def test_what_gcloud_lets_through_to_an_insert_google_refuses_is_refused_with_googles_message(
        world: tuple[Simulator, RestFace, dict[str, str]]) -> None:
    """gcloud builds the insert body from its own copy of the schema: its flags' enums are checked
    before anything is sent (`--provisioning-model=CHEAP` never reaches Google, so the simulator
    must not see it either), and no flag makes an unknown field. What it lets through is a type
    given as a path: it appends `--machine-type` / `--boot-disk-type` to its own URL, which Google
    refuses as a malformed URL. Those refusals reach the user in Google's words; a bare type,
    which gcloud makes a URL of, is taken."""
    sim, rest, env = world
    base = f"{rest.compute_url}projects/{sim.project}/zones/{sim.zone}"

    def create(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GCLOUD, "compute", "instances", "create", "vm", *flags, "--format=json"], env=env,
                              capture_output=True, text=True, timeout=120)

    cheap = create("--machine-type=tpu7x-standard-4t", "--provisioning-model=CHEAP")
    assert cheap.returncode == 2 and "Invalid choice: 'CHEAP'" in cheap.stderr, cheap.stderr
    assert rest.calls["compute.v1.Instances/Insert"] == 0
    path = create(f"--machine-type=zones/{sim.zone}/diskTypes/tpu7x-standard-4t")
    assert path.returncode == 1, path.stderr
    assert (f"Invalid value for field 'resource.machineType': '{base}/machineTypes/zones/{sim.zone}/diskTypes/"
            "tpu7x-standard-4t'. The URL is malformed.") in path.stderr
    disk = create("--machine-type=tpu7x-standard-4t", f"--boot-disk-type=zones/{sim.zone}/diskTypes/hyperdisk-balanced")
    assert disk.returncode == 1, disk.stderr
    assert ("Invalid value for field 'resource.disks[0].initializeParams.diskType': "
            f"'{base}/diskTypes/zones/{sim.zone}/diskTypes/hyperdisk-balanced'. The URL is malformed.") in disk.stderr
    assert sim.world.instances() == []
    made = create("--machine-type=tpu7x-standard-4t", "--provisioning-model=SPOT", "--instance-termination-action=STOP",
                  "--boot-disk-type=hyperdisk-balanced")
    assert made.returncode == 0, made.stderr
    assert [r.name for r in sim.world.instances()] == ["vm"]
