"""The Compute Engine adapter as ports.NodeLabels and ports.ZoneListing (job priorities hand an
instance over by its labels), through the real google-cloud-compute client against the
simulator's REST face: instances.setLabels carries the labelFingerprint of the read its labels
were made from, so a label changed since is refused (412), never overwritten; the zone's
listing holds the instances no MIG made, with their labels and machine type."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpuwatch.cloud.base import Due
from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.compute.zoneinstances import SharedCompute
from tpuwatch.cloud.errors import ApiError
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import NotFoundError
from tpuwatch.ports import NodeLabels, ZoneListing
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

ONE_TRY = RetryPolicy(max_attempts=1, max_delay=30.0, multiplier=0.0, max_wait=0.0)


@pytest.fixture
def rest(sim_api: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        yield face


def test_an_instance_is_relabelled_from_the_read_its_labels_were_made_from(sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.add_instance("lo", body={"labels": {"tpuwatch-job": "lo", "team": "ml"}})
    api = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)
    assert isinstance(api, NodeLabels) and isinstance(api, ZoneListing)
    node = api.read_node("lo")
    assert node is not None and node.owner == "lo"
    api.set_labels("lo", {**node.labels, "tpuwatch-job": "hi", "tpuwatch-lent-by": "lo"})
    assert world.instance("lo").labels == {"tpuwatch-job": "hi", "tpuwatch-lent-by": "lo", "team": "ml"}
    assert world.calls["compute.v1.Instances/SetLabels"] == 1
    # a label a person changed between the read and the write: refused, not overwritten
    fresh = api.read_node("lo")
    other = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)  # as a person's write
    seen = other.read_node("lo")
    assert seen is not None and fresh is not None
    other.set_labels("lo", {**seen.labels, "owner-note": "mine"})
    with pytest.raises(ApiError) as refused:
        api.set_labels("lo", {**fresh.labels, "tpuwatch-job": "lo"})
    assert "fingerprint" in refused.value.message.lower(), refused.value.message
    assert world.instance("lo").labels["tpuwatch-job"] == "hi" and world.instance("lo").labels["owner-note"] == "mine"
    # read again: the write goes through
    again = api.read_node("lo")
    assert again is not None
    api.set_labels("lo", {**again.labels, "tpuwatch-job": "lo"})
    assert world.instance("lo").labels["tpuwatch-job"] == "lo" and world.instance("lo").labels["owner-note"] == "mine"
    with pytest.raises(NotFoundError):  # gone: said so, nothing written
        api.set_labels("gone", {"tpuwatch-job": "lo"})


def test_the_zones_listing_holds_its_instances_with_labels_and_machine_type_not_a_migs(
        sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.add_instance("lo", body={"labels": {"tpuwatch-job": "lo", "tpuwatch-priority": "100"}})
    world.add_instance("big", "tpu7x-standard-8t", body={"labels": {"tpuwatch-job": "big"}})
    world.add_instance("boots", body={"labels": {"tpuwatch-job": "b", "tpuwatch-priority": "5"}, "metadata": {"items": [
        {"key": "tpuwatch-job", "value": "b"}, {"key": "tpuwatch-command", "value": "python3 train.py"},
        {"key": "tpuwatch-worker-script", "value": "#!/bin/sh"}]}})
    world.add_instance("slice-0001", body={"labels": {"tpuwatch-job": "m"}, "metadata": {"items": [
        {"key": "created-by", "value": f"projects/1/zones/{world.zone}/instanceGroupManagers/slice"}]}})
    alone = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)
    shared = SharedCompute(lambda p, z: ComputeAdapter(p, z, "instance", retry=ONE_TRY))

    job = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY,
                         reads=shared.zone(world.project, world.zone).job(Due(), slack=1.0))
    for api in (alone, job):
        listed = {n.name: n for n in api.listed()}
        assert sorted(listed) == ["big", "boots", "lo"], listed
        assert listed["lo"].labels["tpuwatch-priority"] == "100" and listed["lo"].kind == "instance"
        assert listed["big"].accelerator_type == "tpu7x-standard-8t"
        assert listed["boots"].boots_job and not listed["lo"].boots_job
        # said once why the one that starts its job at boot is never asked for
        said = [n for n in api.take_notes() if "boots" in n]
        assert len(said) == 1 and "starts its job at boot" in said[0] and "tpuwatch-launch" in said[0], said
        api.listed()
        assert [n for n in api.take_notes() if "boots" in n] == []
