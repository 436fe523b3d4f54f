"""The real google-cloud-tpu clients against the simulator's gRPC server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import create_through_queued_resource
from google.api_core import exceptions
from google.cloud import tpu_v2, tpu_v2alpha1

from tpuwatch.cloud.clients import tpu_client
from tpuwatch.errors import UsageError
from tpuwatch.sim import faults
from tpuwatch.sim.shapes import worker_count
from tpuwatch.sim.simulator import Simulator

STOCKOUT = re.compile(
    r'^There is no more capacity in the zone "us-central2-b"; you can try in another zone where '
    r"Cloud TPU Nodes are offered \(see https://cloud\.google\.com/tpu/docs/regions\) \[EID: 0x[0-9a-f]+\]$"
)


def parent(sim: Simulator, zone: str | None = None) -> str:
    return f"projects/{sim.project}/locations/{zone or sim.zone}"


def create(client: Any, sim: Simulator, name: str, accel: str = "v4-8", **node: Any) -> Any:
    return client.create_node(
        parent=parent(sim),
        node_id=name,
        node=tpu_v2.Node(accelerator_type=accel, runtime_version="tpu-ubuntu2204-base", **node),
    )


@pytest.mark.parametrize(
    ("accel", "workers"),
    [
        ("v2-8", 1),
        ("v3-8", 1),
        ("v4-8", 1),
        ("v5litepod-1", 1),
        ("v5litepod-8", 1),
        ("v6e-8", 1),
        ("v4-32", 4),
        ("v5litepod-16", 4),
        ("v5p-64", 8),
        ("v6e-16", 4),
        ("v2-32", 4),
        ("v3-32", 4),
        ("v5p-8", 1),
    ],
)
def test_worker_count_follows_the_accelerator_type(accel: str, workers: int) -> None:
    assert worker_count(accel) == workers


@pytest.mark.parametrize("accel", ["v9-8", "v4-12", "v4", "v5litepod-3", "tpu"])
def test_unknown_accelerator_type_is_rejected(accel: str) -> None:
    with pytest.raises(ValueError, match="unknown accelerator type"):
        worker_count(accel)


def test_create_get_list_delete_with_the_real_client(sim_api: Simulator, lro_polling: Any) -> None:
    c = tpu_client()
    op = create(
        c,
        sim_api,
        "pod",
        "v4-32",
        labels={"team": "ml"},
        metadata={"startup-script": "echo hi"},
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        network_config=tpu_v2.NetworkConfig(network="default", enable_external_ips=True),
    )
    assert c.get_node(name=f"{parent(sim_api)}/nodes/pod").state == tpu_v2.Node.State.CREATING
    node = op.result(polling=lro_polling)
    assert node.name == f"{parent(sim_api)}/nodes/pod"
    assert (node.state, node.health) == (tpu_v2.Node.State.READY, tpu_v2.Node.Health.HEALTHY)
    assert len(node.network_endpoints) == 4
    assert all(e.ip_address and e.access_config.external_ip for e in node.network_endpoints)
    assert dict(node.labels) == {"team": "ml"} and node.metadata["startup-script"] == "echo hi"
    assert node.scheduling_config.spot and node.network_config.network == "default"
    assert node.accelerator_type == "v4-32" and node.id and node.create_time

    got = c.get_node(name=node.name)
    assert got.id == node.id and got.state == tpu_v2.Node.State.READY
    attrs = c.get_guest_attributes(
        request={"name": node.name, "worker_ids": ["1"]}
    ).guest_attributes
    assert [a.query_value.items[1].value for a in attrs] == [node.network_endpoints[1].ip_address]
    assert [n.name for n in c.list_nodes(parent=parent(sim_api))] == [node.name]

    c.delete_node(name=node.name).result(polling=lro_polling)
    with pytest.raises(exceptions.NotFound) as err:
        c.get_node(name=node.name)
    assert err.value.message == f"Resource '{node.name}' was not found"

    again = create(c, sim_api, "pod", "v4-32").result(polling=lro_polling)
    assert again.id != node.id and again.create_time > node.create_time


def test_reservation_shortfall_from_a_scenario_step_fails_the_create_with_code_8(
    sim_api: Simulator, lro_polling: Any, tmp_path: Path
) -> None:
    from tpuwatch.sim import scenario
    from tpuwatch.sim.faults import apply

    path = tmp_path / "s.toml"
    path.write_text('[[step]]\nat = "0s"\nfault = "reservation-shortfall"\nduration = "1h"\n')
    (step,) = scenario.load(path).steps
    apply(sim_api.world, step.fault, step.params)
    op = create(tpu_client(), sim_api, "pod")
    with pytest.raises(exceptions.ResourceExhausted):
        op.result(polling=lro_polling)
    # As users see it: code 8, like a stockout, with the reservation's own words.
    assert op.operation.error.code == 8
    assert op.operation.error.message.startswith("Insufficient reserved capacity.")


def test_stockout_fails_the_create_operation_with_code_8(
    sim_api: Simulator, lro_polling: Any
) -> None:
    c = tpu_client()
    sim_api.world.stockout(sim_api.zone)
    op = create(c, sim_api, "pod")
    with pytest.raises(exceptions.ResourceExhausted) as err:
        op.result(polling=lro_polling)
    assert op.operation.error.code == 8
    assert STOCKOUT.match(op.operation.error.message), op.operation.error.message
    assert STOCKOUT.match(err.value.message)
    with pytest.raises(exceptions.NotFound):
        c.get_node(name=f"{parent(sim_api)}/nodes/pod")
    # Other zones have capacity; the stocked-out one does again once the stockout ends.
    other = c.create_node(
        parent=parent(sim_api, "us-east5-a"),
        node_id="pod",
        node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e"),
    )
    assert other.result(polling=lro_polling).state == tpu_v2.Node.State.READY
    sim_api.world.clear_errors()
    assert create(c, sim_api, "pod").result(polling=lro_polling).state == tpu_v2.Node.State.READY


def test_create_errors_are_the_real_exceptions(sim_api: Simulator, lro_polling: Any) -> None:
    c = tpu_client()
    create(c, sim_api, "pod").result(polling=lro_polling)
    with pytest.raises(exceptions.AlreadyExists, match="nodes/pod' already exists"):
        create(c, sim_api, "pod")
    with pytest.raises(exceptions.InvalidArgument, match="v9-8"):
        create(c, sim_api, "other", "v9-8")
    with pytest.raises(exceptions.InvalidArgument, match="node_id"):
        create(c, sim_api, "Bad_Name")
    with pytest.raises(exceptions.InvalidArgument, match="locations/nowhere"):
        c.list_nodes(parent=f"projects/{sim_api.project}/locations/nowhere")
    sim_api.world.quota(sim_api.zone)
    with pytest.raises(exceptions.ResourceExhausted) as err:
        create(c, sim_api, "other", "v6e-8", scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    assert err.value.message == (
        "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
        "Limit: 0 in region us-central2."
    )


def test_explicit_zone_list_makes_other_zones_not_found(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Simulator(root=tmp_path, workers=False, zones=["us-central2-b"]) as sim:
        monkeypatch.setenv("TPUWATCH_EMULATOR_HOST", sim.address)
        c = tpu_client()
        assert list(c.list_nodes(parent=parent(sim))) == []
        with pytest.raises(exceptions.NotFound, match="locations/us-east5-a"):
            c.list_nodes(parent=parent(sim, "us-east5-a"))


def test_list_pages_and_all_locations(sim_api: Simulator) -> None:
    for name in ("a", "b", "c"):
        sim_api.create_node(name)
    sim_api.create_node("d", zone="us-east5-a")
    c = tpu_client()
    sim_api.world.reset_calls()
    names = [
        n.name.rsplit("/", 1)[1]
        for n in c.list_nodes(request={"parent": parent(sim_api), "page_size": 1})
    ]
    assert names == ["a", "b", "c"]
    assert sim_api.world.call_count("Tpu/ListNodes") == 3
    everywhere = c.list_nodes(parent=f"projects/{sim_api.project}/locations/-")
    assert sorted(n.name.rsplit("/", 1)[1] for n in everywhere) == ["a", "b", "c", "d"]


def test_stop_start_and_operations_service(sim_api: Simulator, lro_polling: Any) -> None:
    sim_api.create_node("pod")
    c = tpu_client()
    name = f"{parent(sim_api)}/nodes/pod"
    stopped = c.stop_node(request={"name": name}).result(polling=lro_polling)
    assert stopped.state == tpu_v2.Node.State.STOPPED
    with pytest.raises(exceptions.FailedPrecondition):
        c.stop_node(request={"name": name})
    assert (
        c.start_node(request={"name": name}).result(polling=lro_polling).state
        == tpu_v2.Node.State.READY
    )
    ops = c.list_operations(request={"name": parent(sim_api)})
    assert [o.done for o in ops.operations] == [True, True]
    got = c.get_operation(request={"name": ops.operations[0].name})
    assert got.done and got.response.type_url.endswith("google.cloud.tpu.v2.Node")


def test_injected_unavailable_makes_raw_calls_fail(sim_api: Simulator) -> None:
    sim_api.create_node("pod")
    c = tpu_client()
    name = f"{parent(sim_api)}/nodes/pod"
    sim_api.world.api_errors(0.3, ["UNAVAILABLE"])
    failures = 0
    for _ in range(200):
        try:
            c.get_node(name=name, retry=None)
        except exceptions.ServiceUnavailable:
            failures += 1
    assert 35 <= failures <= 85
    assert sim_api.world.call_count("Tpu/GetNode") == 200
    assert sim_api.world.injected["google.cloud.tpu.v2.Tpu/GetNode"] == failures
    sim_api.world.clear_errors()
    c.get_node(name=name, retry=None)


def test_permission_denied_and_method_filter(sim_api: Simulator) -> None:
    sim_api.create_node("pod")
    c = tpu_client()
    name = f"{parent(sim_api)}/nodes/pod"
    sim_api.world.deny(methods=["GetNode"])
    with pytest.raises(exceptions.PermissionDenied, match="tpu.nodes.get"):
        c.get_node(name=name)
    assert len(list(c.list_nodes(parent=parent(sim_api)))) == 1  # other methods still work


def test_v2alpha1_upcoming_and_simulated_maintenance(sim_api: Simulator, lro_polling: Any) -> None:
    sim_api.create_node("pod", "v4-32")  # manual maintenance is documented for any v4
    sim_api.world.delays["simulated_maintenance_heal"] = 120.0  # 0.2 s at speed 600
    c = tpu_client("v2alpha1")
    name = f"{parent(sim_api)}/nodes/pod"
    assert "upcoming_maintenance" not in c.get_node(name=name)

    sim_api.world.upcoming_maintenance("pod", starts_in=7 * 86400)
    um = c.get_node(name=name).upcoming_maintenance
    assert um.type_ == tpu_v2alpha1.UpcomingMaintenance.MaintenanceType.SCHEDULED
    assert um.maintenance_status == tpu_v2alpha1.UpcomingMaintenance.MaintenanceStatus.PENDING
    assert um.window_start_time < um.window_end_time and um.can_reschedule

    healed = c.perform_maintenance(request={"name": name}).result(polling=lro_polling)
    assert healed.health == tpu_v2alpha1.Node.Health.HEALTHY
    assert healed.health_description.startswith("The TPU had a maintenance event at ")
    assert "upcoming_maintenance" not in healed

    op = c.simulate_maintenance_event(request={"name": name, "worker_ids": ["2"]})
    assert c.get_node(name=name).health == tpu_v2alpha1.Node.Health.UNHEALTHY_MAINTENANCE
    node = op.result(polling=lro_polling)
    assert (node.state, node.health) == (
        tpu_v2alpha1.Node.State.READY,
        tpu_v2alpha1.Node.Health.HEALTHY,
    )
    assert re.fullmatch(
        r"The TPU had a maintenance event at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z",
        node.health_description,
    )
    workers = [e.resource_name for e in sim_api.world.audit_entries()]
    assert workers[-2:] == [f"{name}/workers/2", f"{name}/workers/2"]


def test_maintenance_that_never_heals(sim_api: Simulator) -> None:
    for n in ("r", "u", "k"):
        sim_api.create_node(n)
    w = sim_api.world
    w.maintenance("r", stuck="REPAIRING")
    w.maintenance("u", stuck="UNHEALTHY_MAINTENANCE")
    w.maintenance("k", stuck="UNKNOWN")
    w.wait_node("r", "REPAIRING", health="UNHEALTHY_MAINTENANCE")
    w.wait_node("k", "UNKNOWN")
    c = tpu_client()
    u = c.get_node(name=f"{parent(sim_api)}/nodes/u")
    assert (u.state, u.health) == (
        tpu_v2.Node.State.READY,
        tpu_v2.Node.Health.UNHEALTHY_MAINTENANCE,
    )
    assert c.get_node(name=f"{parent(sim_api)}/nodes/k").state == tpu_v2.Node.State.UNKNOWN


def test_preempt_terminate_and_symptoms(sim_api: Simulator) -> None:
    sim_api.create_node("spot", spot=True)
    sim_api.create_node("plain")
    w = sim_api.world
    with pytest.raises(UsageError, match="neither spot nor preemptible"):
        w.preempt("plain")
    w.preempt("spot")
    w.terminate("plain")
    w2 = sim_api.create_node("sick")
    w.add_symptom("sick", "HBM_OUT_OF_MEMORY", worker=0, details="oom")
    c = tpu_client()
    assert c.get_node(name=f"{parent(sim_api)}/nodes/spot").state == tpu_v2.Node.State.PREEMPTED
    assert c.get_node(name=f"{parent(sim_api)}/nodes/plain").state == tpu_v2.Node.State.TERMINATED
    (s,) = c.get_node(name=f"{parent(sim_api)}/nodes/sick").symptoms
    assert (s.symptom_type, s.worker_id, s.details) == (
        tpu_v2.Symptom.SymptomType.HBM_OUT_OF_MEMORY,
        "0",
        "oom",
    )
    assert w2.state == "READY"


def test_perform_maintenance_refusals_as_google_documents_them(sim_api: Simulator, lro_polling: Any) -> None:
    sim_api.create_node("old", "v3-32")
    sim_api.create_node("new", "v6e-8")
    c = tpu_client("v2alpha1")
    for n in ("old", "new"):
        sim_api.world.upcoming_maintenance(n, starts_in=7 * 86400, can_reschedule=n == "old")
    with pytest.raises(exceptions.MethodNotImplemented, match="not supported for accelerator type v3-32"):
        c.perform_maintenance(request={"name": f"{parent(sim_api)}/nodes/old"})
    with pytest.raises(exceptions.FailedPrecondition, match="cannot be rescheduled"):
        c.perform_maintenance(request={"name": f"{parent(sim_api)}/nodes/new"})
    sim_api.create_node("idle", "v6e-8")
    with pytest.raises(exceptions.FailedPrecondition, match="no pending maintenance"):
        c.perform_maintenance(request={"name": f"{parent(sim_api)}/nodes/idle"})
    assert sim_api.world.node("old").upcoming.status == "PENDING"  # type: ignore[union-attr]


@pytest.mark.parametrize("code, error", [("PERMISSION_DENIED", exceptions.PermissionDenied),
                                         ("NOT_FOUND", exceptions.NotFound),
                                         ("INVALID_ARGUMENT", exceptions.InvalidArgument)])
def test_the_refuse_maintenance_fault_refuses_both_calls_with_its_code(
        sim_api: Simulator, lro_polling: Any, code: str, error: type[Exception]) -> None:
    create_through_queued_resource(sim_api, "qr", "v6e-16", {}, spot=False)
    sim_api.create_node("plain", "v6e-8")
    for n in ("pod", "plain"):
        sim_api.world.upcoming_maintenance(n, starts_in=7 * 86400)
        faults.apply(sim_api.world, "refuse-maintenance", faults.normalize("refuse-maintenance", {"node": n, "code": code}))
    c = tpu_client("v2alpha1")
    with pytest.raises(error):
        c.perform_maintenance(request={"name": f"{parent(sim_api)}/nodes/plain"})
    with pytest.raises(error):
        c.perform_maintenance_queued_resource(request={"name": f"{parent(sim_api)}/queuedResources/qr",
                                                       "node_names": ["pod"]})
    assert all(sim_api.world.node(n).upcoming.status == "PENDING" for n in ("pod", "plain"))  # type: ignore[union-attr]
    faults.apply(sim_api.world, "refuse-maintenance", faults.normalize("refuse-maintenance", {"node": "plain",
                                                                                             "code": "none"}))
    sim_api.world.delays["simulated_maintenance_heal"] = 120.0
    c.perform_maintenance(request={"name": f"{parent(sim_api)}/nodes/plain"}).result(polling=lro_polling)
    assert sim_api.world.node("plain").upcoming is None


def test_perform_maintenance_of_a_queued_resources_node(sim_api: Simulator, lro_polling: Any) -> None:
    c = tpu_client("v2alpha1")
    qr = tpu_v2alpha1.QueuedResource(tpu=tpu_v2alpha1.QueuedResource.Tpu(node_spec=[
        tpu_v2alpha1.QueuedResource.Tpu.NodeSpec(
            parent=parent(sim_api), node_id="pod",
            node=tpu_v2alpha1.Node(accelerator_type="v6e-16", runtime_version="v2-alpha-tpuv6e"))]))
    c.create_queued_resource(parent=parent(sim_api), queued_resource_id="qr", queued_resource=qr
                             ).result(polling=lro_polling)
    sim_api.world.wait_for(lambda w: w.has_node("pod") and w.node("pod").state == "READY", what="the node")
    sim_api.world.delays["simulated_maintenance_heal"] = 120.0  # 0.2 s at speed 600
    sim_api.world.upcoming_maintenance("pod", starts_in=7 * 86400)
    qname = f"{parent(sim_api)}/queuedResources/qr"
    with pytest.raises(exceptions.InvalidArgument):
        c.perform_maintenance_queued_resource(request={"name": qname, "node_names": ["projects/x/nodes/other"]})
    # Nodes go by their short names (gcloud --node-names=node-a): a full resource name is refused.
    with pytest.raises(exceptions.InvalidArgument, match="is not a node of"):
        c.perform_maintenance_queued_resource(request={"name": qname, "node_names": [f"{parent(sim_api)}/nodes/pod"]})
    op = c.perform_maintenance_queued_resource(request={"name": qname, "node_names": ["pod"]})
    assert c.get_node(name=f"{parent(sim_api)}/nodes/pod").health == tpu_v2alpha1.Node.Health.UNHEALTHY_MAINTENANCE
    op.result(polling=lro_polling)
    healed = c.get_node(name=f"{parent(sim_api)}/nodes/pod")
    assert healed.health == tpu_v2alpha1.Node.Health.HEALTHY and "upcoming_maintenance" not in healed


def test_queued_resource_provisions_and_force_delete(sim_api: Simulator, lro_polling: Any) -> None:
    c = tpu_client()
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(
                    parent=parent(sim_api),
                    node_id="pod",
                    node=tpu_v2.Node(
                        accelerator_type="v5litepod-16", runtime_version="v2-alpha-tpuv5-lite"
                    ),
                )
            ]
        ),
        spot=tpu_v2.QueuedResource.Spot(),
    )
    c.create_queued_resource(
        parent=parent(sim_api), queued_resource_id="qr", queued_resource=qr
    ).result(polling=lro_polling)
    qname = f"{parent(sim_api)}/queuedResources/qr"
    sim_api.world.wait_for(
        lambda w: w.get_queued_resource(sim_api.project, sim_api.zone, "qr").state == "ACTIVE",
        what="queued resource ACTIVE",
    )
    assert c.get_queued_resource(name=qname).state.state == tpu_v2.QueuedResourceState.State.ACTIVE
    node = c.get_node(name=f"{parent(sim_api)}/nodes/pod")
    assert (
        node.queued_resource == qname
        and len(node.network_endpoints) == 4
        and node.scheduling_config.spot
    )
    with pytest.raises(exceptions.FailedPrecondition):
        c.delete_queued_resource(name=qname)
    c.delete_queued_resource(request={"name": qname, "force": True}).result(polling=lro_polling)
    with pytest.raises(exceptions.NotFound):
        c.get_node(name=f"{parent(sim_api)}/nodes/pod")
    assert list(c.list_queued_resources(parent=parent(sim_api))) == []


def test_update_node_with_the_real_client_and_set_state(sim_api: Simulator, lro_polling: Any) -> None:
    from google.protobuf import field_mask_pb2

    sim_api.create_node("pod", "v4-8", labels={"a": "1"}, metadata={"k": "v"})
    client = tpu_client("v2alpha1")
    name = f"{parent(sim_api)}/nodes/pod"
    op = client.update_node(node=tpu_v2alpha1.Node(name=name, labels={"b": "2"}, description="d"),
                            update_mask=field_mask_pb2.FieldMask(paths=["labels", "description"]))
    node = op.result(polling=lro_polling)
    assert dict(node.labels) == {"b": "2"} and node.description == "d" and dict(node.metadata) == {"k": "v"}
    assert sim_api.world.node("pod").state == "READY"  # an update is not a fault

    sim_api.world.set_state("pod", "REPAIRING", "UNHEALTHY_MAINTENANCE")
    got = client.get_node(name=name)
    assert (got.state.name, got.health.name) == ("REPAIRING", "UNHEALTHY_MAINTENANCE")
    with pytest.raises(exceptions.InvalidArgument, match="update is not supported while in state REPAIRING"):
        client.update_node(node=tpu_v2alpha1.Node(name=name, labels={}),
                           update_mask=field_mask_pb2.FieldMask(paths=["labels"]))
    with pytest.raises(UsageError, match="state must be one of"):
        sim_api.world.set_state("pod", "BROKEN")
    with pytest.raises(UsageError, match="no simulated node"):
        sim_api.world.set_state("nope", "READY")


def test_a_preemption_with_the_guests_term_first_shows_in_the_api_after_it(sim_api: Simulator) -> None:
    # term_first: the guests' SIGTERM now (no hosts here), the API's PREEMPTED 1 s (600 simulated s) later.
    sim_api.create_node("spot", spot=True)
    w = sim_api.world
    w.preempt("spot", term_first=600.0)
    c = tpu_client()
    assert c.get_node(name=f"{parent(sim_api)}/nodes/spot").state == tpu_v2.Node.State.READY
    w.wait_for(lambda w: w.node("spot").state == "PREEMPTED", timeout=10, what="the preemption after the TERM")
    assert [e for e in w.audit_entries() if "terminate" in e.method.lower()]
