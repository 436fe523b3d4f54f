"""Compute Engine messages (real `google.cloud.compute_v1` objects) as the node the policy judges."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from google.cloud import compute_v1

from tpuwatch.cloud.compute.spec import to_json
from tpuwatch.cloud.compute.view import (
    instance_snapshot,
    mig_snapshot,
    operation_status,
    worker_order,
)
from tpuwatch.model import OWNER_LABEL, combine_slices
from tpuwatch.policy.nodes import Cond, node_condition

P, Z = "proj", "us-central1-c"


def instance(name: str, status: str = "RUNNING", *, ident: int = 1, spot: bool = False,
             labels: dict[str, str] | None = None, **extra: Any) -> compute_v1.Instance:
    inst = compute_v1.Instance(
        name=name, id=ident, status=status, creation_timestamp="2026-11-27T01:00:00.000-08:00",
        machine_type=f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/machineTypes/tpu7x-standard-4t",
        network_interfaces=[compute_v1.NetworkInterface(
            network_i_p=f"10.0.0.{ident}", access_configs=[compute_v1.AccessConfig(nat_i_p=f"34.1.1.{ident}")])],
        scheduling=compute_v1.Scheduling(provisioning_model="SPOT" if spot else "STANDARD",
                                         instance_termination_action="STOP" if spot else "",
                                         automatic_restart=not spot),
        labels=labels if labels is not None else {OWNER_LABEL: "job"},
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value="true")]),
        **extra,
    )
    return inst


def mig(name: str = "slice", size: int = 4, stable: bool = True, on_failure: str = "") -> compute_v1.InstanceGroupManager:
    m = compute_v1.InstanceGroupManager(name=name, target_size=size, base_instance_name=name,
                                        status=compute_v1.InstanceGroupManagerStatus(is_stable=stable))
    if on_failure:  # absent: REPAIR, Google's default
        m.instance_lifecycle_policy = compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure=on_failure)
    return m


def managed(inst: compute_v1.Instance, action: str = "NONE", error: str = "") -> compute_v1.ManagedInstance:
    m = compute_v1.ManagedInstance(
        instance=f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/instances/{inst.name}",
        id=inst.id, instance_status=inst.status, current_action=action, name=inst.name)
    if error:
        m.last_attempt = compute_v1.ManagedInstanceLastAttempt(errors=compute_v1.ManagedInstanceLastAttemptErrors(
            errors=[compute_v1.Errors(code="ZONE_RESOURCE_POOL_EXHAUSTED", message=error)]))
    return m


def four(status: str = "RUNNING", **kw: Any) -> list[compute_v1.Instance]:
    # names not in id order: workers go by name
    return [instance(f"slice-{s}", status, ident=i, **kw) for i, s in zip((4, 2, 3, 1), "dbca", strict=True)]


@pytest.mark.parametrize(("status", "is_spot", "state", "cond"), [
    ("RUNNING", False, "READY", Cond.USABLE),
    ("STAGING", False, "STARTING", Cond.REPAIR),
    ("PROVISIONING", False, "STARTING", Cond.REPAIR),
    ("REPAIRING", False, "REPAIRING", Cond.REPAIR),  # a host error: Google restarts it
    ("TERMINATED", False, "STOPPED", Cond.PERSON),  # stopped, not by a fault tpuwatch may undo
    ("STOPPING", False, "STOPPING", Cond.PERSON),
    ("SUSPENDED", False, "STOPPED", Cond.PERSON),
    ("TERMINATED", True, "PREEMPTED", Cond.DEAD),  # Spot: delete and recreate, never restart
    ("STOPPING", True, "PREEMPTED", Cond.DEAD),
    ("RUNNING", True, "READY", Cond.USABLE),
    ("UNDEFINED_STATUS", False, "UNDEFINED_STATUS", Cond.UNRECOGNIZED),
])
def test_an_instance_state_in_the_policys_words(status: str, is_spot: bool, state: str, cond: Cond) -> None:
    node = instance_snapshot(instance("vm", status, spot=is_spot), project=P, zone=Z)
    assert (node.state, node_condition(node)) == (state, cond)
    # a stop under way: where it ends (TERMINATED, or gone) tells a preemption from a person's delete
    assert node.stopping == (status == "STOPPING")


def test_an_instance_is_a_node_of_one_worker() -> None:
    node = instance_snapshot(instance("vm", ident=77), project=P, zone=Z)
    assert (node.name, node.id, node.accelerator_type) == ("vm", "77", "tpu7x-standard-4t")
    assert [(w.index, w.internal_ip, w.external_ip) for w in node.workers] == [(0, "10.0.0.77", "34.1.1.77")]
    assert node.owned_by("job") and node.metadata_keys == ("startup-script",)
    assert node.create_time == datetime(2026, 11, 27, 9, 0, tzinfo=timezone.utc)
    assert node.upcoming_maintenance is None and node.health == "HEALTHY"


def test_upcoming_maintenance_is_read_and_ongoing_is_unhealthy() -> None:
    notice = compute_v1.UpcomingMaintenance(type_="SCHEDULED", maintenance_status="ONGOING", can_reschedule=True,
                                            window_start_time="2026-11-28T10:00:00Z",
                                            window_end_time="2026-11-28T12:00:00Z")
    inst = instance("vm", resource_status=compute_v1.ResourceStatus(upcoming_maintenance=notice))
    node = instance_snapshot(inst, project=P, zone=Z)
    up = node.upcoming_maintenance
    assert up is not None and (up.type, up.status, up.can_reschedule) == ("SCHEDULED", "ONGOING", True)
    assert up.window_start == datetime(2026, 11, 28, 10, tzinfo=timezone.utc)
    assert node.health == "UNHEALTHY_MAINTENANCE" and node_condition(node) is Cond.REPAIR


def test_a_mig_is_one_node_whose_workers_are_its_instances_in_name_order() -> None:
    vms = four()
    node = mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "READY" and node.name == "slice"
    assert [w.internal_ip for w in node.workers] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert node.id == "1+2+3+4" and node.owned_by("job")


def test_a_migs_size_and_whether_its_vms_start_the_job_at_boot_are_read_from_its_template_made_vms() -> None:
    """A spare MIG's shape includes its target size; its VMs' metadata (its template's) says
    whether resume-training.sh starts the job at boot, as an idle spare must not."""
    def with_meta(**items: str) -> list[compute_v1.Instance]:
        vms = four()
        for v in vms:
            v.metadata = compute_v1.Metadata(items=[compute_v1.Items(key=k.replace("_", "-"), value=val)
                                                    for k, val in items.items()])
        return vms

    launch = {"tpuwatch_job": "job", "tpuwatch_command": "python train.py", "tpuwatch_worker_script": "#!/bin/sh"}
    for items, boots in ((launch, True), ({**launch, "tpuwatch_launch": "false"}, False),
                         ({**launch, "tpuwatch_command_withheld": "true"}, False),
                         ({"tpuwatch_job": "job"}, False), ({}, False)):
        vms = with_meta(**items)
        node = mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z)
        assert (node.target_size, node.boots_job) == (4, boots), items


# instance name -> its agent-worker-number (None: no such item), the worker order, whether it is said
@pytest.mark.parametrize(("numbers", "order", "said"), [
    ({"b": None, "a": None, "c": None}, "abc", False),  # none numbered (all Google documents): name order
    ({"a": "2", "b": "0", "c": "1"}, "bca", False),  # numbered 0..n-1: the runtime's order
    ({"a": "1", "b": "0"}, "ba", False),
    ({"a": " 1\n", "b": "0"}, "ba", False),  # as a metadata server may serve it
    ({"a": "0"}, "a", False),
    ({"a": "0", "b": None, "c": "1"}, "abc", True),  # partial
    ({"a": "0", "b": "0", "c": "1"}, "abc", True),  # repeated
    ({"a": "0", "b": "2", "c": "3"}, "abc", True),  # not from 0, or with a gap
    ({"a": "1", "b": "2"}, "ab", True),
    ({"a": "0", "b": "one"}, "ab", True),  # not a number
    ({"a": "0", "b": "-1"}, "ab", True),
    ({"a": "0", "b": ""}, "ab", True),
    ({}, "", False),
])
def test_a_migs_workers_follow_the_agent_worker_number_only_when_it_numbers_them_all(
        numbers: dict[str, str | None], order: str, said: bool) -> None:
    names, problem = worker_order(numbers)
    assert "".join(names) == order
    assert bool(problem) is said
    if said:  # what is wrong, each instance's number, and what a person does about it
        assert "agent-worker-number" in problem and "by instance name" in problem and "{worker}" in problem
        assert all(f"{n}: {v if v is not None else 'none'}" in problem for n, v in numbers.items())


def test_a_mig_numbered_by_agent_worker_number_has_its_workers_in_that_order() -> None:
    vms = four()  # slice-a .. slice-d, numbered in reverse name order
    for vm, number in zip(sorted(vms, key=lambda v: v.name), "3210", strict=True):
        vm.metadata.items.append(compute_v1.Items(key="agent-worker-number", value=number))
    node = mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert [w.internal_ip for w in node.workers] == ["10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.1"]
    assert [w.index for w in node.workers] == [0, 1, 2, 3] and node.id == "4+3+2+1"


def test_a_recreated_instance_makes_a_new_incarnation() -> None:
    vms = four()
    before = mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).id
    vms[1] = instance("slice-b", ident=99)
    assert mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).id != before


@pytest.mark.parametrize("action", ["RECREATING", "CREATING", "RESTARTING", "DELETING", "VERIFYING"])
def test_a_mig_at_work_is_repairing_never_deleted(action: str) -> None:
    vms = four()
    parts = [managed(v, action if i == 0 else "NONE") for i, v in enumerate(vms)]
    node = mig_snapshot(mig(), parts, vms, project=P, zone=Z)
    assert node.state == "REPAIRING" and node_condition(node) is Cond.REPAIR
    assert action in node.health_description


def test_a_mig_short_of_its_size_or_unstable_is_repairing() -> None:
    vms = four()[:3]
    assert mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).state == "REPAIRING"
    vms = four()
    assert mig_snapshot(mig(stable=False), [managed(v) for v in vms], vms, project=P, zone=Z).state == "REPAIRING"


def test_an_unstable_mig_whose_instances_all_run_with_no_action_is_settling_a_repair_under_way() -> None:
    """Its status read before its last instance came up, the instances after (three calls): the
    end of the MIG's own repair, under way, so that it is never recreated past repair_timeout."""
    vms = four()
    node = mig_snapshot(mig(stable=False), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "REPAIRING" and "settling" in node.repair_under_way and node.repair_settling, node
    down = four()
    down[1] = instance("slice-b", "TERMINATED", ident=2)  # a VM stopped, not the MIG's doing: not under way
    node = mig_snapshot(mig(stable=False), [managed(v) for v in down], down, project=P, zone=Z)
    assert node.state == "REPAIRING" and node.repair_under_way == "", node


def test_a_mig_shows_its_instances_last_attempt_errors() -> None:
    vms = four()
    parts = [managed(v, error="no capacity" if i == 2 else "") for i, v in enumerate(vms)]
    node = mig_snapshot(mig(), parts, vms, project=P, zone=Z)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED: no capacity" in node.health_description


def test_a_preempted_spot_mig_is_dead_a_host_error_is_a_repair() -> None:
    vms = four(spot=True)
    vms[2] = instance("slice-c", "TERMINATED", ident=3, spot=True)
    node = mig_snapshot(mig(on_failure="DO_NOTHING"), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "PREEMPTED" and node_condition(node) is Cond.DEAD and not node.repairs_itself
    vms = four()
    vms[0] = instance("slice-d", "REPAIRING", ident=4)
    assert mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).state == "REPAIRING"


def test_the_vms_still_running_of_a_preempted_mig_can_be_reached_the_preempted_one_not() -> None:
    # its worker order is by name: slice-a (0), slice-b (1), slice-c (2), slice-d (3)
    vms = four(spot=True)
    vms[2] = instance("slice-c", "TERMINATED", ident=3, spot=True)
    node = mig_snapshot(mig(on_failure="DO_NOTHING"), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "PREEMPTED" and node.worker_states == ("READY", "READY", "PREEMPTED", "READY")
    assert node.reachable and [w.index for w in node.reachable_workers] == [0, 1, 3]
    view = combine_slices("slice", [node])  # the job's node: the MIG as its one slice
    assert view is not None and view.reachable and [w.index for w in view.reachable_workers] == [0, 1, 3]
    vms = four("TERMINATED", spot=True)  # every VM down: none to reach
    gone = mig_snapshot(mig(on_failure="DO_NOTHING"), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert not gone.reachable and gone.reachable_workers == ()


def test_a_mig_is_owned_only_when_every_instance_says_the_job() -> None:
    vms = four()
    vms[3] = instance("slice-a", ident=1, labels={OWNER_LABEL: "other"})
    assert mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).owner is None
    vms = four(labels={})
    assert mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z).owner is None


def test_a_mig_scaled_to_zero_is_a_persons() -> None:
    node = mig_snapshot(mig(size=0), [], [], project=P, zone=Z)
    assert node.state == "STOPPED" and node_condition(node) is Cond.PERSON and node.workers == ()


def test_a_zone_operation_error_becomes_a_grpc_code() -> None:
    op = compute_v1.Operation(name="operation-1", status="DONE", http_error_status_code=503, error=compute_v1.Error(
        errors=[compute_v1.Errors(code="ZONE_RESOURCE_POOL_EXHAUSTED", message="no TPUs")]))
    status = operation_status(op)
    assert (status.done, status.error_code) == (True, 8) and "no TPUs" in status.error_message
    assert operation_status(compute_v1.Operation(name="o", status="RUNNING")).done is False
    assert operation_status(compute_v1.Operation(name="o", status="DONE")).error_code == 0


def test_a_message_is_saved_as_json_without_defaults() -> None:
    data = to_json(mig())
    assert data == {"name": "slice", "targetSize": 4, "baseInstanceName": "slice", "status": {"isStable": True}}


def test_a_host_error_in_a_multi_host_mig_is_a_repair_not_a_persons_stop() -> None:
    vms = four("TERMINATED")  # the whole slice stops; Google restarts it
    node = mig_snapshot(mig(stable=False), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "REPAIRING" and node_condition(node) is Cond.REPAIR


def test_a_preempted_spot_vm_in_an_unstable_mig_is_still_dead() -> None:
    vms = four(spot=True)
    vms[0] = instance("slice-d", "TERMINATED", ident=4, spot=True)
    node = mig_snapshot(mig(stable=False, on_failure="DO_NOTHING"), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert node.state == "PREEMPTED" and node_condition(node) is Cond.DEAD


@pytest.mark.parametrize("on_failure", ["", "REPAIR"])
def test_a_preempted_spot_vm_in_a_mig_that_repairs_is_waited_for(on_failure: str) -> None:
    # Google's MIG recreates it by itself (same name): a repair, not a recreate of the slice
    vms = four(spot=True)
    vms[0] = instance("slice-d", "TERMINATED", ident=4, spot=True)
    node = mig_snapshot(mig(stable=False, on_failure=on_failure), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert (node.state, node.repairs_itself, node.repair_under_way) == ("PREEMPTED", True, "")
    assert node_condition(node) is Cond.REPAIR and "slice-d" in node.health_description
    # then the MIG at work on it: what it does is said, for the policy to wait past repair_timeout
    parts = [managed(v, "RECREATING" if v.name == "slice-d" else "NONE") for v in vms]
    node = mig_snapshot(mig(stable=False, on_failure=on_failure), parts, vms, project=P, zone=Z)
    assert node.state == "REPAIRING" and node.repair_under_way == "MIG acting on slice-d: RECREATING"
    assert not node.repair_settling  # an action under way: waited for as long as it lasts


@pytest.mark.parametrize(("statuses", "state", "cond"), [
    (("TERMINATED", "REPAIRING", "RUNNING", "RUNNING"), "REPAIRING", Cond.REPAIR),  # Google's, one VM at a time
    (("TERMINATED", "RUNNING", "RUNNING", "RUNNING"), "REPAIRING", Cond.REPAIR),
    (("STOPPING", "STAGING", "RUNNING", "RUNNING"), "REPAIRING", Cond.REPAIR),
    (("TERMINATED", "TERMINATED", "TERMINATED", "TERMINATED"), "STOPPED", Cond.PERSON),  # the whole slice
    (("SUSPENDED", "TERMINATED", "STOPPING", "TERMINATED"), "STOPPING", Cond.PERSON),
    (("STAGING", "RUNNING", "RUNNING", "RUNNING"), "STARTING", Cond.REPAIR),
])
def test_a_stable_mig_reads_as_stopped_by_a_person_only_when_every_vm_is_stopped(
        statuses: tuple[str, ...], state: str, cond: Cond) -> None:
    vms = [instance(f"slice-{s}", status, ident=i) for i, (s, status) in enumerate(zip("abcd", statuses, strict=True))]
    node = mig_snapshot(mig(), [managed(v) for v in vms], vms, project=P, zone=Z)
    assert (node.state, node_condition(node)) == (state, cond), node.health_description


def _deleting(status: str, *, model: str = "SPOT", **sched: Any) -> compute_v1.Instance:
    inst = instance("vm", status, spot=model == "SPOT")
    inst.scheduling = compute_v1.Scheduling(provisioning_model=model, instance_termination_action="DELETE", **sched)
    return inst


def test_a_vm_google_deletes_itself_says_so_and_reads_deleting_while_it_goes() -> None:
    from tpuwatch.cloud.compute.spec import without_past_termination

    running = instance_snapshot(_deleting("RUNNING"), project=P, zone=Z)
    assert running.google_deletes and running.state == "READY" and not running.google_deleting
    assert not running.auto_restart  # Spot: never restarted by Google
    going = _deleting("STOPPING")
    assert instance_snapshot(going, project=P, zone=Z).state == "DELETING"
    flex = _deleting("STOPPING", model="FLEX_START", termination_time="2026-11-27T10:00:00Z")
    flex.resource_status = compute_v1.ResourceStatus(shutdown_details=compute_v1.ResourceStatusShutdownDetails(
        stop_state="STOPPING", target_state="DELETED", request_timestamp="2026-11-27T10:00:00Z"))
    node = instance_snapshot(flex, project=P, zone=Z)
    assert node.state == "DELETING" and "DELETED" in node.google_deleting
    assert node.google_deletes_at == datetime(2026, 11, 27, 10, tzinfo=timezone.utc)
    stop = instance_snapshot(instance("vm", "TERMINATED", spot=True), project=P, zone=Z)
    assert not stop.google_deletes and stop.state == "PREEMPTED"  # STOP: Google never deletes it
    body = {"name": "vm", "scheduling": {"terminationTime": "2026-11-27T10:00:00Z", "maxRunDuration": {"seconds": "60"}}}
    assert without_past_termination(body, datetime(2026, 11, 28, tzinfo=timezone.utc).timestamp()) == {
        "name": "vm", "scheduling": {"maxRunDuration": {"seconds": "60"}}}
    assert without_past_termination(body, datetime(2026, 11, 26, tzinfo=timezone.utc).timestamp()) == body


@pytest.mark.parametrize("termination", ["STOP", "DELETE"])
def test_a_spot_vms_graceful_shutdown_is_a_notice_while_the_job_runs_not_a_preemption_or_a_deletion(
        termination: str) -> None:
    # Google documents both a status PENDING_STOP ("gracefully shutting down") and a RUNNING VM with
    # shutdownDetails PENDING_STOP; either way the job still runs and may save: nothing is recreated
    # or waited out as gone until the VM is really stopping.
    target = "DELETED" if termination == "DELETE" else "STOPPED"
    for status in ("RUNNING", "PENDING_STOP"):
        inst = instance("vm", status, spot=True)
        inst.scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action=termination)
        inst.resource_status = compute_v1.ResourceStatus(shutdown_details=compute_v1.ResourceStatusShutdownDetails(
            stop_state="PENDING_STOP", target_state=target, request_timestamp="2026-11-27T10:00:00Z"))
        node = instance_snapshot(inst, project=P, zone=Z)
        assert (node.state, node.pending_stop, node.google_deleting) == ("READY", True, ""), status
        assert node_condition(node) is Cond.USABLE
    inst.status = "STOPPING"
    inst.resource_status.shutdown_details.stop_state = "STOPPING"
    gone = instance_snapshot(inst, project=P, zone=Z)
    assert not gone.pending_stop and gone.state == ("DELETING" if termination == "DELETE" else "PREEMPTED")
