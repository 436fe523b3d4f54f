"""A MIG read and recreated through the real google-cloud-compute client against the simulator's
Compute Engine face: its own instances only, and no recreateInstances of what it is making again."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.errors import NotFoundError
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

RECREATE = "compute.v1.InstanceGroupManagers/RecreateInstances"


@pytest.fixture
def rest(sim_api: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        yield face


def test_a_mig_is_read_with_its_own_instances_only(sim_api: Simulator, rest: RestFace) -> None:
    w = sim_api.world
    for n in range(3):
        w.add_instance(f"other-{n}")
    mig = w.add_mig("slice", size=4, topology="2x2x4")
    w.reset_calls()
    node = ComputeAdapter(w.project, w.zone, "mig").get_node("slice")
    assert node is not None and node.state == "READY" and len(node.workers) == 4
    assert w.calls["compute.v1.Instances/List"] == 1, dict(w.calls)
    assert [f for m, f in w.list_filters if m == "instances.list"] == [f'name eq "({"|".join(sorted(mig.members))})"']


def test_no_recreate_instances_is_sent_while_the_mig_makes_its_vms_again(sim_api: Simulator, rest: RestFace) -> None:
    w = sim_api.world
    mig = w.add_mig("slice", size=4, topology="2x2x4")
    api = ComputeAdapter(w.project, w.zone, "mig")
    w.stockout(w.zone, duration=10**6)  # the MIG's remake waits for capacity: RECREATING all along
    w.autoheal("slice", sorted(mig.members)[0])
    with pytest.raises(NotFoundError, match="already making its instances again"):
        api.recreate_mig("slice")
    assert w.calls[RECREATE] == 0
    w.clear_errors()
    w.wait_mig_stable("slice", timeout=30)
    assert api.recreate_mig("slice") and w.calls[RECREATE] == 1  # idle again: the slice is recreated


def test_a_regional_mig_is_found_from_its_zone_read_through_its_region_and_recreated_there(
        sim_api: Simulator, rest: RestFace) -> None:
    w = sim_api.world
    region = w.zone.rsplit("-", 1)[0]
    mig = w.add_mig("slice", size=2, region=region, on_failure="DO_NOTHING")
    api = ComputeAdapter(w.project, w.zone, "mig")  # the job's zone: where the MIG's VMs are
    node = api.get_node("slice")
    assert node is not None and node.state == "READY" and len(node.workers) == 2
    assert node.resource == f"projects/{w.project}/regions/{region}/instanceGroupManagers/slice"
    assert (w.calls["compute.v1.InstanceGroupManagers/Get"], w.calls["compute.v1.RegionInstanceGroupManagers/Get"]) == (1, 1)
    w.reset_calls()
    assert api.get_node("slice") is not None  # known regional now: the region asked first, once
    assert dict(w.calls) == {"compute.v1.RegionInstanceGroupManagers/Get": 1,
                             "compute.v1.RegionInstanceGroupManagers/ListManagedInstances": 1,
                             "compute.v1.Instances/List": 1}, dict(w.calls)
    before = {n: w.instance(n).id for n in mig.members}
    op = api.recreate_mig("slice")
    assert op.startswith(f"regionOperations/{region}/") and w.calls["compute.v1.RegionInstanceGroupManagers/RecreateInstances"] == 1
    assert api.get_operation(op).done and api.get_operation(op).name == op
    w.wait_mig_stable("slice", region=region, timeout=30)
    assert all(w.instance(n).id != before[n] for n in before)
    assert [n.name for n in api.list_nodes()] == ["slice"]  # `status --all`: the regional MIG, its VMs in it


def test_a_regional_flex_start_migs_vms_come_through_the_regions_resize_requests(
        sim_api: Simulator, rest: RestFace) -> None:
    from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle

    w = sim_api.world
    region = w.zone.rsplit("-", 1)[0]
    w.add_mig("slice", size=0, region=region)
    api = ComputeAdapter(w.project, w.zone, "mig", flex_start=86400.0)
    life = ComputeLifecycle(api, mig="slice", size=2)
    op = life.create("slice", {}, w.zone)
    assert w.calls["compute.v1.RegionInstanceGroupManagerResizeRequests/Insert"] == 1, dict(w.calls)
    deadline = time.monotonic() + 30
    while not api.get_operation(op).done:  # the request SUCCEEDS once its VMs run
        assert time.monotonic() < deadline, "the resize request never SUCCEEDED"
        time.sleep(0.05)
    status = life.status()
    assert status is not None and status.state == "ACTIVE"
    assert status.name.startswith(f"projects/{w.project}/regions/{region}/instanceGroupManagers/slice/resizeRequests/")
    node = api.get_node("slice")
    assert node is not None and node.state == "READY" and len(node.workers) == 2
    w.end_resize_run("slice", region=region)  # the run duration ends: Google deletes the VMs
    w.wait_for(lambda ww: not ww.mig("slice", region=region).members, 30, "the VMs deleted")
    status = life.status()
    assert status is not None and status.state == "SUSPENDED" and api.get_node("slice") is None
    deleted, _ = life.delete(None)
    assert deleted.startswith(f"regionOperations/{region}/") and api.get_operation(deleted).done
    assert w.list_resize_requests(w.project, f"regions/{region}", "slice") == []
