"""The simulated Compute Engine in the World: instances as hosts, MIGs, faults, audit entries."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.errors import UsageError
from tpuwatch.sim.compute_json import instance_json
from tpuwatch.sim.instances import ComputeError
from tpuwatch.sim.simulator import Simulator


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Simulator]:
    with Simulator(root=tmp_path / "sim", speed=600) as s:
        yield s


def _metadata(sim: Simulator, key: str, path: str) -> str:
    req = urllib.request.Request(f"http://{sim.hosts.metadata_address(key, 0)}/computeMetadata/v1/{path}",
                                 headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def test_instance_is_a_host_with_its_own_metadata_server(sim: Simulator) -> None:
    rec = sim.world.add_instance("vm", "tpu7x-standard-4t", body={"metadata": {"items": [{"key": "a", "value": "b"}]}})
    assert rec.status == "RUNNING" and rec.ip
    assert sim.hosts.is_listening(rec.key, 0)
    assert _metadata(sim, rec.key, "instance/id") == str(rec.id)
    assert _metadata(sim, rec.key, "instance/name") == "vm"
    assert _metadata(sim, rec.key, "instance/attributes/a") == "b"
    assert json.loads(_metadata(sim, rec.key, "instance/upcoming-maintenance"))["error"]
    assert _metadata(sim, rec.key, "instance/preempted") == "FALSE"
    assert set(sim.world.instance_host_keys(rec)) == {"ssh-ed25519"}


def test_mig_with_topology_makes_a_slice_and_host_error_recovers_it_whole(sim: Simulator) -> None:
    w = sim.world
    mig = w.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4")
    names = sorted(mig.members)
    assert len(names) == 4 and all(n.startswith("slice-") and len(n) == len("slice-") + 4 for n in names)
    ids = {r.name: r.id for r in w.instances()}
    w.host_error(names[2], restart_after=60)
    assert {r.status for r in w.instances()} == {"TERMINATED"}
    w.wait_mig_stable("slice")
    assert {r.name: r.id for r in w.instances()} == ids  # restarted, not recreated
    methods = [(e.method, e.instance) for e in w.audit_entries()]
    assert methods[0] == ("compute.instances.hostError", names[2])
    assert sorted(i for m, i in methods if m == "compute.instances.automaticRestart") == names
    entry = w.audit_entries()[0]
    assert entry.resource_type == "gce_instance" and entry.service == "compute.googleapis.com"
    assert entry.resource_name == f"projects/{sim.project}/zones/{sim.zone}/instances/{names[2]}"
    assert entry.resource_labels["instance_id"] == str(ids[names[2]])


def test_multi_host_autoheal_recreates_every_instance_with_new_ids(sim: Simulator) -> None:
    w = sim.world
    mig = w.add_mig("slice", size=4, topology="2x2x4")
    ids = {r.name: r.id for r in w.instances()}
    w.autoheal("slice", sorted(mig.members)[0])
    assert {m.current_action for m in w.mig("slice").members.values()} == {"RECREATING"}
    w.wait_mig_stable("slice")
    after = {r.name: r.id for r in w.instances()}
    assert set(after) == set(ids) and all(after[n] != ids[n] for n in ids)
    assert [e.method for e in w.audit_entries()] == ["compute.instances.repair.recreateInstance"] * 4


def test_a_migs_vms_carry_agent_worker_number_only_with_the_shape_and_keep_it_when_recreated(
        sim: Simulator) -> None:
    w = sim.world
    w.add_mig("plain", size=2, topology="2x2x2")
    assert all("agent-worker-number" not in r.metadata for r in w.instances())  # Google documents none
    mig = w.add_mig("slice", size=4, topology="2x2x4", worker_numbers="reverse")
    names = sorted(mig.members)

    def numbers() -> dict[str, str]:
        return {n: w.instance(n).metadata["agent-worker-number"] for n in names}

    assert numbers() == dict(zip(names, "3210", strict=True))  # reverse name order
    for n in names:  # the instance's metadata items are what its metadata server serves
        rec = w.instance(n)
        assert _metadata(sim, rec.key, "instance/attributes/agent-worker-number") == numbers()[n]
    w.autoheal("slice", names[0])
    w.wait_mig_stable("slice")
    assert numbers() == dict(zip(names, "3210", strict=True))
    with pytest.raises(UsageError, match="worker_numbers must be one of"):
        w.add_mig("odd", worker_numbers="random")


def test_maintenance_notice_then_perform_maintenance_now(sim: Simulator) -> None:
    w = sim.world
    rec = w.add_instance("vm")
    w.schedule_instance_maintenance("vm", starts_in=86400, heal_after=60)
    notice = json.loads(_metadata(sim, rec.key, "instance/upcoming-maintenance"))
    assert notice["maintenance_status"] == "PENDING" and notice["type"] == "SCHEDULED"
    op = w.perform_instance_maintenance(sim.project, sim.zone, "vm", heal_after=60)
    assert w.instance("vm").status == "TERMINATED"
    w.wait_for(lambda ww: ww.get_compute_operation(sim.project, f"zones/{sim.zone}", op.name).done, 10)
    assert w.instance("vm").status == "RUNNING" and w.instance("vm").upcoming is None
    assert [e.method.rsplit(".", 1)[-1] for e in w.audit_entries()] == [
        "upcomingMaintenance", "upcomingMaintenance", "terminateOnHostMaintenance", "automaticRestart",
        "upcomingMaintenance"]
    with pytest.raises(ComputeError, match="no pending maintenance"):
        w.perform_instance_maintenance(sim.project, sim.zone, "vm")


def test_spot_preemption_stops_for_good(sim: Simulator) -> None:
    w = sim.world
    w.add_instance("spot", body={"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    w.preempt_instance("spot")
    rec = w.instance("spot")
    assert rec.status == "TERMINATED" and rec.preempted
    assert [e.method for e in w.audit_entries()] == ["compute.instances.preempted"]
    with pytest.raises(ComputeError, match="Delete it and create it again"):
        w.start_instance(sim.project, sim.zone, "spot")
    with pytest.raises(UsageError, match="not SPOT"):
        w.add_instance("std")
        w.preempt_instance("std")


def test_a_spot_preemption_may_show_stopping_before_terminated_as_a_persons_delete_does_before_gone(
        sim: Simulator) -> None:
    w = sim.world
    for name in ("spot", "other"):
        w.add_instance(name, body={"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    sim.inject("preempt-instance", instance="spot", stopping=1e9)
    assert w.instance("spot").status == "STOPPING" and w.instance("spot").preempted
    w.end_stopping("spot")
    assert w.instance("spot").status == "TERMINATED"
    with pytest.raises(UsageError, match="not stopping from a preemption"):
        w.end_stopping("spot")
    w.delays["delete"] = 1e9
    w.delete_instance(sim.project, sim.zone, "other")  # a person's: STOPPING too, then gone
    assert w.instance("other").status == "STOPPING" and [e.method for e in w.audit_entries()] == [
        "compute.instances.preempted"]


def test_a_mig_that_repairs_recreates_a_preempted_spot_vm_and_do_nothing_leaves_it(sim: Simulator) -> None:
    w = sim.world
    mig = w.add_mig("repairs", size=2, spot=True)  # defaultActionOnFailure absent: REPAIR
    left = w.add_mig("left", size=2, spot=True, on_failure="DO_NOTHING")
    victim, other = sorted(mig.members)
    ids = {r.name: r.id for r in w.instances()}
    w.preempt_instance(victim)
    w.preempt_instance(sorted(left.members)[0])
    w.wait_for(lambda ww: ww.mig("repairs").members[victim].current_action == "RECREATING", 10, "the MIG's repair")
    # recreateInstances of a VM the MIG is recreating sets a flag already set: nothing starts over
    w.recreate_instances(sim.project, sim.zone, "repairs", [victim])
    w.wait_mig_stable("repairs")
    assert w.instance(victim).id != ids[victim] and w.instance(other).id == ids[other]  # same name, new id
    assert [e.method for e in w.audit_entries() if e.resource_labels["instance_id"] == str(ids[victim])] == [
        "compute.instances.preempted", "compute.instances.repair.recreateInstance"]
    assert w.scheduler_errors == []  # no second remake of a name already made again
    gone = w.instance(sorted(left.members)[0])
    assert gone.status == "TERMINATED" and w.mig("left").members[gone.name].current_action == "NONE"
    with pytest.raises(UsageError, match="on_failure must be one of"):
        w.add_mig("odd", on_failure="DELETE")


def test_a_host_error_without_automatic_restart_leaves_a_standard_vm_terminated_until_started(sim: Simulator) -> None:
    w = sim.world
    w.add_instance("vm", body={"scheduling": {"automaticRestart": False}})
    w.host_error("vm", restart_after=1)
    time.sleep(0.1)  # well past the restart a VM with automatic restart would have had
    assert w.instance("vm").status == "TERMINATED"
    assert [e.method for e in w.audit_entries()] == ["compute.instances.hostError"]
    w.start_instance(sim.project, sim.zone, "vm")
    assert w.wait_instance("vm", "RUNNING").id == w.instance("vm").id


def test_a_spot_vm_with_delete_is_deleted_by_its_preemption_showing_shutdown_details_while_it_goes(
        sim: Simulator) -> None:
    from google.cloud import compute_v1

    from tpuwatch.sim.compute_json import instance_json

    w = sim.world
    # the guest's shutdown lasts 2 real seconds here (0.1 s by default), so the look below meets it
    # on a busy machine too
    w.delays["stop"] = 2 * w.speed
    w.add_instance("spot", body={"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}})
    w.preempt_instance("spot")
    assert [e.method for e in w.audit_entries()] == ["compute.instances.preempted"]
    rec = w.instance("spot")
    assert rec.status == "STOPPING"
    shown = instance_json(rec, "https://compute.googleapis.com/compute/v1/")
    details = compute_v1.Instance.from_json(json.dumps(shown), ignore_unknown_fields=False).resource_status
    assert (details.shutdown_details.stop_state, details.shutdown_details.target_state) == ("STOPPING", "DELETED")
    w.wait_for(lambda ww: not ww.instances(), 10, "the preempted VM gone")


def test_a_flex_start_vm_is_deleted_at_its_termination_time(sim: Simulator) -> None:
    from tpuwatch.cloud.logs import rfc3339_ns

    w = sim.world
    ends = rfc3339_ns(time.time_ns() + 1_000_000_000)  # a wall-clock time, one real second away
    w.add_instance("flex", body={"scheduling": {"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE",
                                                "terminationTime": ends}})
    assert w.instance("flex").status == "RUNNING"
    w.wait_for(lambda ww: not ww.instances(), 10, "the flex-start VM gone at its termination time")


def test_mig_create_in_a_stockout_waits_with_the_error_then_succeeds(sim: Simulator) -> None:
    w = sim.world
    w.stockout(duration=None)
    mig = w.add_mig("slice", size=4, topology="2x2x4", wait=False)
    w.wait_for(lambda ww: all(m.errors for m in ww.mig("slice").members.values()), 10)
    assert not w.instances()
    managed = w.managed_instances(sim.project, sim.zone, "slice")
    assert all(m.current_action == "CREATING" and m.errors[0][0] == "ZONE_RESOURCE_POOL_EXHAUSTED"
               for m, _ in managed)
    w.clear_errors()
    w.wait_mig_stable(mig.name)
    assert len(w.instances()) == 4


def test_resize_request_fails_in_a_long_stockout_and_succeeds_without(sim: Simulator) -> None:
    w = sim.world
    w.add_mig("flex", size=0)
    w.stockout(duration=None)
    w.insert_resize_request(sim.project, sim.zone, "flex", {"name": "rr1", "resizeBy": 1,
                                                            "requestedRunDuration": {"seconds": "3600"}})
    w.wait_for(lambda ww: ww.get_resize_request(sim.project, sim.zone, "flex", "rr1").state == "FAILED", 20)
    rr = w.get_resize_request(sim.project, sim.zone, "flex", "rr1")
    assert rr.error[0][0] == "ZONE_RESOURCE_POOL_EXHAUSTED" and not w.instances()
    w.clear_errors()
    w.insert_resize_request(sim.project, sim.zone, "flex", {"name": "rr2", "resizeBy": 1,
                                                            "requestedRunDuration": {"seconds": "600"}})
    w.wait_for(lambda ww: ww.get_resize_request(sim.project, sim.zone, "flex", "rr2").state == "SUCCEEDED", 20)
    (vm,) = w.instances()
    assert vm.provisioning_model == "FLEX_START"
    # the run duration ends: the VM is deleted and the MIG shrinks back
    w.wait_for(lambda ww: not ww.instances(), 20)
    assert w.mig("flex").target_size == 0


def test_scenario_starts_a_world_with_a_mig_and_an_instance(tmp_path: Path) -> None:
    from tpuwatch.sim import scenario

    sc = scenario.parse({
        "instance": [{"name": "vm", "machine_type": "ct6e-standard-4t", "provisioning_model": "SPOT",
                      "no_notice": "empty"}],
        "mig": [{"name": "slice", "machine_type": "tpu7x-standard-4t", "size": 4, "topology": "2x2x4"}],
        "step": [{"at": "1m", "fault": "host-error", "instance": "vm", "restart_after": "never"}],
    })
    with Simulator(root=tmp_path / "sim", scenario=sc) as sim:
        mig = sim.world.mig("slice")
        assert len(mig.members) == 4 and mig.topology == "2x2x4" and sim.world.mig_is_stable(mig)
        vm = sim.world.instance("vm")
        assert vm.provisioning_model == "SPOT" and vm.termination_action == "STOP"
        assert _metadata(sim, vm.key, "instance/upcoming-maintenance") == "{}"
        sim.world.wait_instance("vm", "TERMINATED")
        sim.inject("mig-autoheal", mig="slice")
        assert {m.current_action for m in sim.world.mig("slice").members.values()} == {"RECREATING"}


@pytest.mark.parametrize("table,row,error", [
    ("mig", {"name": "s", "size": 3, "topology": "2x2x4"}, "mig[0].topology: topology 2x2x4 holds 16 chips"),
    ("mig", {"name": "s", "machine_type": "v4-8"}, "mig[0].machine_type: machine type 'v4-8' is not a TPU"),
    ("instance", {"name": "s", "colour": "red"}, "instance[0].colour: unknown option"),
    ("instance", {"name": "s", "provisioning_model": "CHEAP"}, "instance[0].provisioning_model: expected one of"),
])
def test_scenario_compute_tables_are_checked(table: str, row: dict[str, object], error: str) -> None:
    from tpuwatch.sim import scenario

    with pytest.raises(UsageError, match=re.escape(error)):
        scenario.parse({table: [row]})


def test_compute_entries_are_served_by_the_logging_face_with_their_operation(sim: Simulator) -> None:
    from tpuwatch.sim import audit

    w = sim.world
    rec = w.add_instance("vm")
    w.host_error("vm", restart_after=60)
    rows, _ = w.list_log_entries([f"projects/{sim.project}"], 'resource.type="gce_instance" AND '
                                 'protoPayload.methodName="compute.instances.hostError"')
    assert [r.instance for r in rows] == ["vm"]
    entry = audit.to_log_entry(rows[0])
    assert entry.resource.labels["instance_id"] == str(rec.id)
    assert entry.operation.id.startswith("systemevent-") and entry.operation.producer == "compute.googleapis.com"
    ops = w.list_compute_operations(sim.project, f"zones/{sim.zone}")
    assert [o.op_type for o in ops] == ["compute.instances.hostError"] and ops[0].name == entry.operation.id


def test_an_instance_deleted_behind_a_migs_back_is_made_again(sim: Simulator) -> None:
    w = sim.world
    mig = w.add_mig("one", size=1)
    (name,) = mig.members
    old = w.instance(name).id
    sim.inject("delete-instance", instance=name)
    w.wait_mig_stable("one")
    assert w.instance(name).id != old


def test_a_spot_preemption_with_the_guests_term_first_then_its_notice_then_the_stop(
        sim: Simulator, tmp_path: Path) -> None:
    w = sim.world
    rec = w.add_instance("spot", body={"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP",
                                                      "preemptionNoticeDuration": {"seconds": "1200"}}})
    ready, got = tmp_path / "ready", tmp_path / "got"
    job = subprocess.Popen(["bash", "-c", f"trap 'echo TERM >{got}; exit 0' TERM; : >{ready}; "
                                          "while :; do sleep 0.05; done"],
                           env=sim.hosts.worker_env(sim.hosts._worker(rec.key, 0)))
    try:
        w.wait_for(lambda _: ready.exists(), timeout=10, what="the process on the VM")
        w.preempt_instance("spot", term_first=1200)  # the guest's TERM now, the rest 2 s later
        assert job.wait(timeout=10) == 0 and got.read_text() == "TERM\n"
    finally:
        job.kill()
    w.wait_for(lambda w: w.instance("spot").pending_stop_ns != 0, timeout=10, what="the notice")
    assert w.instance("spot").status == "RUNNING" and _metadata(sim, rec.key, "instance/preempted") == "TRUE"
    body = instance_json(w.instance("spot"), "https://compute.googleapis.com/compute/v1/")
    assert body["scheduling"]["preemptionNoticeDuration"] == {"seconds": "1200"}
    assert body["resourceStatus"]["shutdownDetails"]["stopState"] == "PENDING_STOP"
    assert body["resourceStatus"]["shutdownDetails"]["targetState"] == "STOPPED"
    w.wait_for(lambda w: w.instance("spot").status == "TERMINATED", timeout=10, what="the stop after the notice")
    assert w.instance("spot").pending_stop_ns == 0
