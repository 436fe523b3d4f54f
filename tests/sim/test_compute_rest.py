"""The simulator's compute v1 REST face, driven by the real `google.cloud.compute_v1` clients.

Every client points at the simulator (`client_options.api_endpoint`, anonymous credentials), and
operations are polled with an emulator-pointed ZoneOperationsClient: an ExtendedOperation's own
`result()` polls through a client built without those options, i.e. Google's endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator


@dataclass
class Compute:
    sim: Simulator
    rest: RestFace
    instances: compute_v1.InstancesClient
    ops: compute_v1.ZoneOperationsClient
    migs: compute_v1.InstanceGroupManagersClient
    templates: compute_v1.RegionInstanceTemplatesClient
    policies: compute_v1.ResourcePoliciesClient
    resizes: compute_v1.InstanceGroupManagerResizeRequestsClient

    @property
    def where(self) -> dict[str, str]:
        return {"project": self.sim.project, "zone": self.sim.zone}

    def wait(self, op: Any) -> compute_v1.Operation:
        """Poll a zone operation to DONE through the simulator (never `op.result()`)."""
        name = op.name
        for _ in range(200):
            done = self.ops.wait(operation=name, **self.where)
            if done.status == compute_v1.Operation.Status.DONE:
                return done
        raise AssertionError(f"operation {name} not DONE")


@pytest.fixture
def compute(tmp_path: Path) -> Iterator[Compute]:
    with Simulator(root=tmp_path / "sim", speed=600) as sim, RestFace(sim.world) as rest:
        kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "transport": "rest",
                              "client_options": ClientOptions(api_endpoint=rest.url.rstrip("/"))}
        yield Compute(sim, rest, compute_v1.InstancesClient(**kw), compute_v1.ZoneOperationsClient(**kw),
                      compute_v1.InstanceGroupManagersClient(**kw), compute_v1.RegionInstanceTemplatesClient(**kw),
                      compute_v1.ResourcePoliciesClient(**kw), compute_v1.InstanceGroupManagerResizeRequestsClient(**kw))


def test_insert_get_list_filter_and_delete_an_instance(compute: Compute) -> None:
    c, w = compute, compute.sim.world
    body = compute_v1.Instance(
        name="tpu-a", machine_type=f"zones/{c.sim.zone}/machineTypes/tpu7x-standard-4t",
        labels={"tpuwatch-job": "llm"},
        scheduling=compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="STOP",
                                         on_host_maintenance="TERMINATE"),
        network_interfaces=[compute_v1.NetworkInterface(access_configs=[compute_v1.AccessConfig(name="nat")])],
    )
    op = c.instances.insert(instance_resource=body, **c.where)
    assert c.wait(op).error.errors == []
    got = c.instances.get(instance="tpu-a", **c.where)
    assert got.status == "RUNNING" and got.id == w.instance("tpu-a").id
    assert got.machine_type.endswith(f"/zones/{c.sim.zone}/machineTypes/tpu7x-standard-4t")
    assert got.scheduling.provisioning_model == "SPOT" and got.scheduling.automatic_restart is False
    assert got.network_interfaces[0].network_i_p == got.network_interfaces[0].access_configs[0].nat_i_p
    assert got.self_link.endswith(f"/projects/{c.sim.project}/zones/{c.sim.zone}/instances/tpu-a")
    w.add_instance("other")
    mine = list(c.instances.list(request=compute_v1.ListInstancesRequest(
        filter='labels.tpuwatch-job = "llm"', **c.where)))
    assert [i.name for i in mine] == ["tpu-a"]
    pages = list(c.instances.list(request=compute_v1.ListInstancesRequest(max_results=1, **c.where)).pages)
    assert [[i.name for i in p.items] for p in pages] == [["other"], ["tpu-a"]]
    agg = dict(c.instances.aggregated_list(project=c.sim.project))
    assert sorted(i.name for i in agg[f"zones/{c.sim.zone}"].instances) == ["other", "tpu-a"]
    keys = c.instances.get_guest_attributes(request=compute_v1.GetGuestAttributesInstanceRequest(
        instance="tpu-a", query_path="hostkeys/", **c.where))
    assert [(e.namespace, e.key) for e in keys.query_value.items] == [("hostkeys", "ssh-ed25519")]
    c.wait(c.instances.delete(instance="tpu-a", **c.where))
    with pytest.raises(exceptions.NotFound, match="tpu-a"):
        c.instances.get(instance="tpu-a", **c.where)
    assert w.call_count("compute.v1.Instances/Get") == 2


def test_stockout_ends_the_insert_operation_with_the_zone_error(compute: Compute) -> None:
    c = compute
    c.sim.world.stockout()
    op = c.instances.insert(instance_resource=compute_v1.Instance(
        name="tpu-b", machine_type="zones/x/machineTypes/ct6e-standard-4t".replace("x", c.sim.zone)), **c.where)
    done = c.wait(op)
    assert done.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert done.http_error_status_code == 503
    assert c.sim.world.instances() == []


def test_labels_metadata_stop_start_and_maintenance_calls(compute: Compute) -> None:
    c, w = compute, compute.sim.world
    w.add_instance("vm")
    got = c.instances.get(instance="vm", **c.where)
    with pytest.raises(exceptions.PreconditionFailed):
        c.instances.set_labels(instance="vm", instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
            labels={"a": "b"}, label_fingerprint="stale"), **c.where)
    c.wait(c.instances.set_labels(instance="vm", instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
        labels={"a": "b"}, label_fingerprint=got.label_fingerprint), **c.where))
    c.wait(c.instances.set_metadata(instance="vm", metadata_resource=compute_v1.Metadata(
        items=[compute_v1.Items(key="k", value="v")], fingerprint=got.metadata.fingerprint), **c.where))
    assert w.instance("vm").labels == {"a": "b"} and w.instance("vm").metadata == {"k": "v"}
    with pytest.raises(exceptions.BadRequest, match="no pending maintenance"):
        c.instances.perform_maintenance(instance="vm", **c.where)
    w.schedule_instance_maintenance("vm", starts_in=86400)
    upcoming = c.instances.get(instance="vm", **c.where).resource_status.upcoming_maintenance
    assert upcoming.maintenance_status == "PENDING" and upcoming.type_ == "SCHEDULED"
    done = c.wait(c.instances.perform_maintenance(instance="vm", **c.where))
    assert done.operation_type == "performMaintenance"
    assert c.instances.get(instance="vm", **c.where).status == "RUNNING"
    c.wait(c.instances.simulate_maintenance_event(instance="vm", **c.where))
    methods = [e.method for e in w.audit_entries()]
    assert methods.count("compute.instances.terminateOnHostMaintenance") == 2
    c.wait(c.instances.stop(instance="vm", **c.where))
    assert c.instances.get(instance="vm", **c.where).status == "TERMINATED"
    c.wait(c.instances.start(instance="vm", **c.where))
    assert c.instances.get(instance="vm", **c.where).status == "RUNNING"
    with pytest.raises(exceptions.BadRequest, match="reservation-bound"):
        c.instances.report_host_as_faulty(instance="vm", instances_report_host_as_faulty_request_resource=
                                          compute_v1.InstancesReportHostAsFaultyRequest(disruption_schedule="IMMEDIATE"),
                                          **c.where)


def test_injected_errors_by_method_name(compute: Compute) -> None:
    c, w = compute, compute.sim.world
    w.add_instance("vm")
    w.api_errors(1.0, ["UNAVAILABLE"], methods=["compute.v1.Instances/Get"])
    with pytest.raises(exceptions.ServiceUnavailable):
        c.instances.get(instance="vm", retry=None, **c.where)  # the client retries 503 by default
    assert list(c.instances.list(**c.where))  # other methods are served
    assert w.injected["compute.v1.Instances/Get"] == 1


def test_mig_from_template_and_workload_policy_with_resize_requests(compute: Compute) -> None:
    c, w = compute, compute.sim.world
    region = c.sim.zone.rsplit("-", 1)[0]
    c.templates.insert(project=c.sim.project, region=region, instance_template_resource=compute_v1.InstanceTemplate(
        name="t", properties=compute_v1.InstanceProperties(machine_type="tpu7x-standard-4t")))
    c.policies.insert(project=c.sim.project, region=region, resource_policy_resource=compute_v1.ResourcePolicy(
        name="wp", workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT",
                                                                           accelerator_topology="2x2x4")))
    assert c.policies.get(project=c.sim.project, region=region, resource_policy="wp").workload_policy.accelerator_topology == "2x2x4"
    c.migs.insert(instance_group_manager_resource=compute_v1.InstanceGroupManager(
        name="slice", base_instance_name="slice", target_size=4,
        instance_template=f"projects/{c.sim.project}/regions/{region}/instanceTemplates/t",
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"projects/{c.sim.project}/regions/{region}/resourcePolicies/wp")), **c.where)
    w.wait_mig_stable("slice")
    mig = c.migs.get(instance_group_manager="slice", **c.where)
    assert mig.status.is_stable and mig.target_size == 4
    managed = list(c.migs.list_managed_instances(instance_group_manager="slice", **c.where))
    assert len(managed) == 4 and {m.current_action for m in managed} == {"NONE"}
    assert {m.instance_status for m in managed} == {"RUNNING"}
    old = {m.name: m.id for m in managed}
    c.wait(c.migs.recreate_instances(instance_group_manager="slice", **c.where,
           instance_group_managers_recreate_instances_request_resource=compute_v1.InstanceGroupManagersRecreateInstancesRequest(
               instances=[managed[0].instance])))
    assert {m.current_action for m in c.migs.list_managed_instances(instance_group_manager="slice", **c.where)} == {"RECREATING"}
    w.wait_mig_stable("slice")
    assert all(m.id != old[m.name] for m in c.migs.list_managed_instances(instance_group_manager="slice", **c.where))

    c.templates.insert(project=c.sim.project, region=region, instance_template_resource=compute_v1.InstanceTemplate(
        name="flex", properties=compute_v1.InstanceProperties(machine_type="ct6e-standard-4t")))
    c.migs.insert(instance_group_manager_resource=compute_v1.InstanceGroupManager(
        name="flex", base_instance_name="flex", target_size=0,
        instance_template=f"projects/{c.sim.project}/regions/{region}/instanceTemplates/flex"), **c.where)
    w.stockout()
    c.resizes.insert(instance_group_manager="flex", **c.where,
                     instance_group_manager_resize_request_resource=compute_v1.InstanceGroupManagerResizeRequest(
                         name="rr", resize_by=1, requested_run_duration=compute_v1.Duration(seconds=3600)))
    w.wait_for(lambda ww: ww.get_resize_request(c.sim.project, c.sim.zone, "flex", "rr").last_attempt, 10)
    rr = c.resizes.get(instance_group_manager="flex", resize_request="rr", **c.where)
    assert rr.state == "ACCEPTED" and rr.status.last_attempt.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    w.clear_errors()
    w.wait_for(lambda ww: ww.get_resize_request(c.sim.project, c.sim.zone, "flex", "rr").state == "SUCCEEDED", 10)
    assert [r.name for r in c.resizes.list(instance_group_manager="flex", **c.where)] == ["rr"]


def test_an_insert_google_refuses_is_refused_with_googles_message_through_the_client(compute: Compute) -> None:
    """A bare machine type, a value outside an enum, and (through the client's own REST session,
    since its typed messages cannot carry one) an unknown field: each the 400 Google answers, and
    no instance made."""
    c = compute
    good = {"name": "tpu-b", "machineType": f"zones/{c.sim.zone}/machineTypes/tpu7x-standard-4t"}

    def refused(body: dict[str, Any]) -> str:
        with pytest.raises(exceptions.BadRequest) as caught:
            c.instances.insert(instance_resource=compute_v1.Instance.from_json(json.dumps(body)), **c.where)
        return str(caught.value.message).split(": ", 1)[1]  # the client puts "POST URL: " first

    assert refused({**good, "machineType": "tpu7x-standard-4t"}) == (
        "Invalid value for field 'resource.machineType': 'tpu7x-standard-4t'. The URL is malformed.")
    assert refused({**good, "scheduling": {"provisioningModel": "CHEAP"}}) == (
        "Invalid value for field 'resource.scheduling.provisioningModel': 'CHEAP'.")
    session = c.instances._transport._session
    url = f"{c.rest.url}compute/v1/projects/{c.sim.project}/zones/{c.sim.zone}/instances"
    answer = session.post(url, json={**good, "scheduling": {"provisioningModel": "SPOT", "preemptable": True}})
    assert answer.status_code == 400
    assert answer.json()["error"]["errors"] == [{
        "message": "Invalid JSON payload received. Unknown name \"preemptable\" at 'resource.scheduling': "
                   "Cannot find field.", "domain": "global", "reason": "invalid"}]
    assert c.sim.world.instances() == [] and c.rest.calls["compute.v1.Instances/Insert"] == 0
