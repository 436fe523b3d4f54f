"""Starting a Compute Engine slice's maintenance early (cloud/compute/maint.py) and the drill's
call, through the real google-cloud-compute client against the simulator's Compute Engine face."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle
from tpuwatch.errors import MaintenanceRefused, NotFoundError, UsageError
from tpuwatch.model import NodeSnapshot
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

PERFORM = "compute.v1.Instances/PerformMaintenance"


@pytest.fixture
def rest(sim_api: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        yield face


def lifecycle(sim: Simulator, kind: str) -> ComputeLifecycle:
    return ComputeLifecycle(ComputeAdapter(sim.world.project, sim.world.zone, "mig" if kind == "mig" else "instance"))


def test_an_instance_with_nothing_pending_is_refused_with_googles_words(sim_api: Simulator, rest: RestFace) -> None:
    sim_api.world.add_instance("vm")
    life = lifecycle(sim_api, "instance")
    node = life.get_node("vm")
    assert node is not None
    with pytest.raises(MaintenanceRefused) as err:
        life.start_maintenance(node)
    assert err.value.code == "INVALID_ARGUMENT" and "no pending maintenance" in err.value.message, err.value


def test_an_instances_pending_maintenance_is_started(sim_api: Simulator, rest: RestFace) -> None:
    sim_api.world.add_instance("vm")
    sim_api.world.schedule_instance_maintenance("vm")
    life = lifecycle(sim_api, "instance")
    node = life.get_node("vm")
    assert node is not None and node.upcoming_maintenance is not None
    op, what = life.start_maintenance(node)
    assert op and what == "instance vm"
    assert sim_api.world.instance("vm").status == "TERMINATED"  # in maintenance, restarted by Google


def test_a_multi_host_migs_maintenance_is_started_by_one_call(sim_api: Simulator, rest: RestFace) -> None:
    mig = sim_api.world.add_mig("slice", size=4, topology="2x2x4")
    names = sorted(mig.members)
    for n, name in enumerate(names):  # the last VM's window opens first
        sim_api.world.schedule_instance_maintenance(name, starts_in=86400.0 * (10 - n))
    life = lifecycle(sim_api, "mig")
    node = life.get_node("slice")
    assert node is not None
    _, what = life.start_maintenance(node)
    assert what == f"MIG slice (performMaintenance on {names[-1]})", what
    assert sim_api.world.calls[PERFORM] == 1
    assert all(sim_api.world.instance(n).status == "TERMINATED" for n in names)  # the slice as a whole


def test_a_mig_of_independent_vms_has_each_pending_maintenance_started(sim_api: Simulator, rest: RestFace) -> None:
    mig = sim_api.world.add_mig("singles", size=3)
    names = sorted(mig.members)
    for name in names[:2]:
        sim_api.world.schedule_instance_maintenance(name)
    life = lifecycle(sim_api, "mig")
    node = life.get_node("singles")
    assert node is not None
    _, what = life.start_maintenance(node)
    assert what == f"MIG singles (performMaintenance on {names[0]}, {names[1]})", what
    assert sim_api.world.calls[PERFORM] == 2
    assert sim_api.world.instance(names[2]).status == "RUNNING"  # nothing announced there


def test_a_mig_with_nothing_that_may_start_early_is_refused(sim_api: Simulator, rest: RestFace) -> None:
    mig = sim_api.world.add_mig("slice", size=2, topology="2x2x2")
    for name in mig.members:
        sim_api.world.schedule_instance_maintenance(name, can_reschedule=False)
    life = lifecycle(sim_api, "mig")
    node = life.get_node("slice")
    assert node is not None
    with pytest.raises(MaintenanceRefused) as err:
        life.start_maintenance(node)
    assert err.value.code == "FAILED_PRECONDITION" and sim_api.world.calls[PERFORM] == 0


def test_simulating_a_maintenance_on_a_gone_instance_is_not_found(sim_api: Simulator, rest: RestFace) -> None:
    api = ComputeAdapter(sim_api.world.project, sim_api.world.zone, "instance")
    with pytest.raises(NotFoundError):
        api.simulate_maintenance_event("gone")
    sim_api.world.add_instance("vm")
    assert api.simulate_maintenance_event("vm")
    assert sim_api.world.instance("vm").status == "TERMINATED"


def test_a_host_report_is_refused_for_a_vm_google_takes_none_for_and_sent_for_a_reservation_bound_one(
        sim_api: Simulator, rest: RestFace) -> None:
    from tpuwatch.errors import HostReportRefused

    w = sim_api.world
    w.add_instance("vm")  # on-demand (STANDARD): Google takes reports for All Capacity mode VMs only
    life = lifecycle(sim_api, "instance")
    node = life.get_node("vm")
    assert node is not None
    with pytest.raises(HostReportRefused) as err:
        life.report_faulty_host(node, 0, "worker 0's TPU could not be opened")
    assert err.value.code == "INVALID_ARGUMENT" and "reservation-bound" in err.value.message, err.value
    with pytest.raises(HostReportRefused, match="no instance for worker 1"):
        life.report_faulty_host(node, 1, "x")
    assert "compute.v1.Instances/ReportHostAsFaulty" in w.calls  # refused by Google, not by tpuwatch

    w.add_instance("ac", body={"scheduling": {"provisioningModel": "RESERVATION_BOUND"}})
    node = life.get_node("ac")
    assert node is not None
    request = life.faulty_host_request(node, 0, "bad")
    assert request.startswith(f"POST projects/{w.project}/zones/{w.zone}/instances/ac/reportHostAsFaulty ")
    assert '"behavior": "BEHAVIOR_UNSPECIFIED"' in request and '"disruptionSchedule": "IMMEDIATE"' in request
    op, what = life.report_faulty_host(node, 0, "bad")
    assert op and what == "instance ac (worker 0) of instance ac"
    rec = w.instance("ac")
    assert rec.faulty_reported and rec.status == "REPAIRING"  # stopped for the repair


def test_a_spot_vms_preemption_notice_shows_as_pending_stop_while_it_runs(sim_api: Simulator, rest: RestFace) -> None:
    # scheduling.preemptionNoticeDuration: 2 simulated hours (12 s here), so the VM is read in it.
    sim_api.world.add_instance("vm", body={"scheduling": {
        "provisioningModel": "SPOT", "instanceTerminationAction": "STOP",
        "preemptionNoticeDuration": {"seconds": "7200"}}})
    life = lifecycle(sim_api, "instance")
    node = life.get_node("vm")
    assert node is not None and node.state == "READY" and not node.pending_stop
    sim_api.world.preempt_instance("vm")
    node = life.get_node("vm")
    assert node is not None and node.pending_stop and node.state == "READY" and node.health == "HEALTHY"
    vm = sim_api.world.instance("vm")
    assert vm.preempt_notice and vm.status == "RUNNING"  # the metadata server's preempted TRUE too


def test_a_preemption_notice_duration_is_for_spot_vms_only(sim_api: Simulator) -> None:
    with pytest.raises(UsageError, match="preemptionNoticeDuration.*Spot VMs only"):
        sim_api.world.add_instance("vm", body={"scheduling": {"preemptionNoticeDuration": {"seconds": "30"}}})


def test_acts_on_a_job_running_on_a_spare_go_to_the_spare_instance(sim_api: Simulator, rest: RestFace) -> None:
    """A job on instance vm with spares ([tpu] spares), its slot bound to spare sp: its view is
    named vm but is sp's, and an instances.start or performMaintenance of it goes to sp."""
    from tpuwatch.model import bound_view

    for name in ("vm", "sp"):
        sim_api.world.add_instance(name, body={"scheduling": {"automaticRestart": False}})
    life = lifecycle(sim_api, "instance")

    def view() -> NodeSnapshot:
        read = {n: life.api.get_node(n) for n in ("vm", "sp")}
        seen, _ = bound_view("vm", ("vm",), read, (), {"vm": "sp"})
        assert seen is not None and seen.name == "vm" and seen.kind == "instance" and seen.full_name.endswith("/sp")
        return seen

    sim_api.world.host_error("sp", restart_after=None)
    _, what = life.start_node(view())
    assert what == "instance sp"
    sim_api.world.wait_instance("sp", "RUNNING", timeout=30)
    assert sim_api.world.call_count("compute.v1.Instances/Start") == 1
    sim_api.world.schedule_instance_maintenance("sp")
    _, what = life.start_maintenance(view())
    assert what == "instance sp" and sim_api.world.call_count(PERFORM) == 1
    assert sim_api.world.instance("vm").status == "RUNNING"  # the job's own instance, idle, untouched


def test_acts_on_a_job_running_on_a_spare_mig_go_to_the_spare_mig(sim_api: Simulator, rest: RestFace) -> None:
    """A job on MIG slice with spare MIGs, its slot bound to spare MIG sp: its view is named slice
    but is sp's (its instances the workers), and a performMaintenance or a recreate of it goes to
    sp's instances."""
    from tpuwatch.model import bound_view

    slice_vms = sorted(sim_api.world.add_mig("slice", size=2).members)
    sp = sim_api.world.add_mig("sp", size=2)
    sp_vms = sorted(sp.members)
    life = lifecycle(sim_api, "mig")

    def view() -> NodeSnapshot:
        read = {n: life.api.get_node(n) for n in ("slice", "sp")}
        seen, _ = bound_view("slice", ("slice",), read, (), {"slice": "sp"})
        assert seen is not None and seen.name == "slice" and seen.kind == "mig" and seen.full_name.endswith("/sp")
        assert life.api.instance_names(seen) == tuple(sp_vms)  # the workers are sp's instances
        return seen

    sim_api.world.schedule_instance_maintenance(sp_vms[0])
    _, what = life.start_maintenance(view())
    assert what == f"MIG sp (performMaintenance on {sp_vms[0]})", what
    assert all(sim_api.world.instance(n).status == "RUNNING" for n in slice_vms)  # the idle MIG, untouched
    sim_api.world.wait_mig_stable("sp", timeout=60)
    before = {n: sim_api.world.instance(n).id for n in slice_vms}
    _, what = life.delete(view())
    assert what.startswith("MIG sp's 2 instances (recreateInstances"), what
    assert {n: sim_api.world.instance(n).id for n in slice_vms} == before
