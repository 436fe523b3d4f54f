"""TpuAdapter against the simulator: reads, pages, create/delete/operations, errors, retries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.cloud.errors import ApiError
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.errors import EXIT_CLOUD, NotFoundError, UsageError
from tpuwatch.sim.records import NodeSpec
from tpuwatch.sim.simulator import Simulator

FAST = RetryPolicy(multiplier=0.005, max_wait=0.05)


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    with Simulator(root=tmp_path / "sim", speed=600, seed=3, workers=False) as s:
        for k, v in s.env.items():
            monkeypatch.setenv(k, v)
        yield s


def adapter(sim: Simulator, **kw: object) -> TpuAdapter:
    return TpuAdapter(sim.project, sim.zone, retry=FAST, **kw)  # type: ignore[arg-type]


def test_get_and_missing(sim: Simulator) -> None:
    sim.create_node("pod", "v4-32", spot=True, labels={"tpuwatch-job": "run1"}, metadata={"startup-script": "x"})
    tpu = adapter(sim)
    node = tpu.get_node("pod")
    assert node is not None
    assert (node.name, node.state, node.health, node.accelerator_type) == ("pod", "READY", "HEALTHY", "v4-32")
    assert node.spot and node.labels == {"tpuwatch-job": "run1"} and node.metadata_keys == ("startup-script",)
    assert len(node.workers) == 4 and node.id == str(sim.world.node("pod").id)
    assert tpu.get_node("nope") is None
    with pytest.raises(NotFoundError, match=f"no TPU named nope in {sim.project}/{sim.zone}"):
        tpu.require_node("nope")


def test_list_follows_pages_one_call_each(sim: Simulator) -> None:
    for i in range(20):
        sim.create_node(f"n{i:02d}")
    sim.world.reset_calls()
    nodes = adapter(sim, page_size=7).list_nodes()
    assert [n.name for n in nodes] == [f"n{i:02d}" for i in range(20)]
    assert sim.world.call_count("ListNodes") == 3


def test_create_follow_delete(sim: Simulator) -> None:
    tpu = adapter(sim)
    spec = {
        "acceleratorType": "v4-16",  # JSON names and proto names both work
        "runtime_version": "tpu-ubuntu2204-base",
        "schedulingConfig": {"spot": True},
        "labels": {"tpuwatch-job": "run1"},
        "metadata": {"startup-script": "#!/bin/sh\necho hi\n"},
    }
    op = tpu.create_node("fresh", spec)
    assert op.startswith(f"projects/{sim.project}/locations/{sim.zone}/operations/")
    status = tpu.get_operation(op)
    assert status.name == op
    sim.world.wait_operation(op)
    done = tpu.get_operation(op)
    assert done.done and done.error_code == 0
    node = tpu.get_node("fresh")
    assert node is not None and node.state == "READY" and node.spot and len(node.workers) == 2
    assert node.metadata_keys == ("startup-script",)
    op = tpu.delete_node("fresh")
    sim.world.wait_operation(op)
    assert tpu.get_operation(op).done and tpu.get_node("fresh") is None
    with pytest.raises(NotFoundError):
        tpu.delete_node("fresh")


def test_create_errors_are_not_retried(sim: Simulator) -> None:
    tpu = adapter(sim)
    spec = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}
    with pytest.raises(UsageError, match="tpu.spec"):
        tpu.create_node("x", {**spec, "acceleratorTypo": "v4-8"})
    sim.world.quota()
    sim.world.reset_calls()
    with pytest.raises(ApiError) as err:
        tpu.create_node("x", spec)
    assert err.value.code == "RESOURCE_EXHAUSTED" and err.value.exit_code == EXIT_CLOUD
    assert "Quota limit" in err.value.message
    assert sim.world.call_count("CreateNode") == 1
    sim.world.clear_errors()
    sim.world.api_errors(1.0, ["UNAVAILABLE"], methods=["CreateNode"], duration=None)
    sim.world.reset_calls()
    with pytest.raises(ApiError) as err:
        tpu.create_node("x", spec)
    assert err.value.code == "UNAVAILABLE" and sim.world.call_count("CreateNode") == FAST.max_attempts


def test_permission_denied_names_permission_once(sim: Simulator) -> None:
    sim.world.deny(methods=["ListNodes"])
    sim.world.reset_calls()
    with pytest.raises(ApiError) as err:
        adapter(sim).list_nodes()
    assert err.value.permission == "tpu.nodes.list" and "missing permission tpu.nodes.list" in err.value.message
    assert sim.world.call_count("ListNodes") == 1


def test_full_messages_for_spec_capture(sim: Simulator) -> None:
    sim.create_node("pod", "v4-8", metadata={"startup-script": "echo hi"})
    tpu = adapter(sim)
    msg = tpu.get_node_message("pod")
    assert msg is not None and msg.metadata["startup-script"] == "echo hi"
    assert tpu.get_node_message("nope") is None
    assert tpu.get_queued_resource("nope") is None
    spec = NodeSpec(accelerator_type="v4-8")
    sim.world.create_queued_resource(sim.project, sim.zone, "qr1", "qnode", spec, False, "")
    qr = tpu.get_queued_resource("qr1")
    assert qr is not None and qr.name.endswith("/queuedResources/qr1")


def test_set_labels_replaces_the_labels_only_through_update_node(sim: Simulator) -> None:
    sim.create_node("pod", "v4-8", labels={"team": "x"}, metadata={"k": "v"})
    tpu = adapter(sim)
    sim.world.reset_calls()
    op = tpu.set_labels("pod", {"team": "x", "tpuwatch-job": "run1"})
    assert sim.world.call_count("v2.Tpu/UpdateNode") == 1
    sim.world.wait_operation(op)
    status = tpu.get_operation(op)
    assert status.done and status.error_code == 0
    node = tpu.get_node("pod")
    assert node is not None and node.labels == {"team": "x", "tpuwatch-job": "run1"}
    assert sim.world.node("pod").spec.metadata == {"k": "v"}  # not in the mask: untouched
    op = tpu.update_node("pod", {"metadata": {"k": "w"}, "labels": {}}, ["metadata"])
    sim.world.wait_operation(op)
    rec = sim.world.node("pod")
    assert rec.spec.metadata == {"k": "w"} and rec.spec.labels == {"team": "x", "tpuwatch-job": "run1"}


def test_update_node_errors(sim: Simulator) -> None:
    tpu = adapter(sim)
    with pytest.raises(NotFoundError, match=f"no TPU named gone in {sim.project}/{sim.zone} to update"):
        tpu.set_labels("gone", {"a": "b"})
    sim.create_node("spot", "v4-8", spot=True)
    with pytest.raises(ApiError) as err:
        tpu.set_labels("spot", {"Bad Key": "x"})
    assert err.value.code == "INVALID_ARGUMENT" and "Invalid label" in err.value.message
    sim.world.preempt("spot")
    with pytest.raises(ApiError) as err:
        tpu.set_labels("spot", {"a": "b"})
    assert err.value.code == "INVALID_ARGUMENT"
    assert "update is not supported while in state PREEMPTED" in err.value.message
    with pytest.raises(UsageError, match="update_node"):
        tpu.update_node("spot", {"labels": {}}, [])


def test_create_with_v2alpha1_only_fields_goes_through_v2alpha1(sim: Simulator) -> None:
    tpu = adapter(sim)
    spec = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "autocheckpointEnabled": True,
            "bootDiskConfig": {"enableConfidentialCompute": True}}
    sim.world.reset_calls()
    op = tpu.create_node("alpha", spec)
    assert sim.world.call_count("v2alpha1.Tpu/CreateNode") == 1 and sim.world.call_count("v2.Tpu/CreateNode") == 0
    sim.world.wait_operation(op)
    assert tpu.get_operation(op).error_code == 0
    msg = tpu.get_node_message("alpha")
    assert msg is not None and msg.autocheckpoint_enabled and msg.boot_disk_config.enable_confidential_compute
    # a plain spec still goes through v2; a field neither version has is a usage error
    tpu.create_node("plain", {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"})
    assert sim.world.call_count("v2.Tpu/CreateNode") == 1
    with pytest.raises(UsageError, match="tpu.spec: .*nosuchField"):
        tpu.create_node("bad", {**spec, "nosuchField": 1})


def test_queued_resource_create_follow_and_force_delete(sim: Simulator) -> None:
    tpu = adapter(sim)
    full = tpu.queued_resource_name("qr1")
    assert full == f"projects/{sim.project}/locations/{sim.zone}/queuedResources/qr1"
    assert tpu.queued_resource_name(full) == full
    assert tpu.queued_resource_name("qr1", "us-east5-a").endswith("/locations/us-east5-a/queuedResources/qr1")
    parent = f"projects/{sim.project}/locations/{sim.zone}"
    body = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": "qnode",
                                  "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]},
            "spot": {}}
    op = tpu.create_queued_resource("qr1", body)
    assert tpu.get_operation(op).done
    sim.world.wait_for(lambda w: w.get_queued_resource(sim.project, sim.zone, "qr1").state == "ACTIVE", 20)
    qr = tpu.get_queued_resource("qr1")
    assert qr is not None and qr.state.state.name == "ACTIVE" and "spot" in qr
    node = tpu.get_node("qnode")
    assert node is not None and node.spot
    op = tpu.delete_queued_resource("qr1", force=True)
    sim.world.wait_operation(op, timeout=20)
    assert tpu.get_queued_resource("qr1") is None and tpu.get_node("qnode") is None
    with pytest.raises(NotFoundError, match="no queued resource"):
        tpu.delete_queued_resource("qr1")

    # v2alpha1-only node fields: the queued resource goes through v2alpha1 as well
    alpha = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": "anode",
                                   "node": {"acceleratorType": "v4-8", "runtimeVersion": "x",
                                            "autocheckpointEnabled": True}}]}}
    sim.world.reset_calls()
    tpu.create_queued_resource("qr2", alpha)
    assert sim.world.call_count("v2alpha1.Tpu/CreateQueuedResource") == 1
    sim.world.wait_for(lambda w: w.has_node("anode") and w.node("anode").state == "READY", 20)
    msg = tpu.get_node_message("anode")
    assert msg is not None and msg.autocheckpoint_enabled


def test_the_api_fills_cidr_block_in_and_a_create_that_sends_it_back_is_refused(sim: Simulator) -> None:
    sim.create_node("pod", "v4-8")
    tpu = adapter(sim)
    raw = tpu.get_node_message("pod")
    assert raw is not None and raw.cidr_block  # filled in by the API, never asked for
    spec = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "cidrBlock": raw.cidr_block}
    with pytest.raises(ApiError, match="conflicts with subnetwork") as refused:
        tpu.create_node("again", spec)
    assert refused.value.code == "INVALID_ARGUMENT"
    spec.pop("cidrBlock")
    assert tpu.create_node("again", spec)


@pytest.mark.parametrize("code", ["PERMISSION_DENIED", "NOT_FOUND", "INVALID_ARGUMENT", "UNIMPLEMENTED",
                                  "FAILED_PRECONDITION"])
def test_every_refusal_to_start_a_maintenance_is_a_refusal_and_a_passing_error_is_not(sim: Simulator,
                                                                                      code: str) -> None:
    from e2e_helpers import create_through_queued_resource

    from tpuwatch.cloud.tpu.lifecycle import Lifecycle
    from tpuwatch.errors import MaintenanceRefused

    create_through_queued_resource(sim, "qr", "v6e-16", {}, spot=False)
    sim.create_node("plain", "v6e-8")
    tpu = adapter(sim)
    for name, life in (("pod", Lifecycle(tpu, "qr")), ("plain", Lifecycle(tpu))):
        sim.world.upcoming_maintenance(name, starts_in=7 * 86400)
        sim.inject("refuse-maintenance", node=name, code=code)
        node = tpu.require_node(name)
        with pytest.raises(MaintenanceRefused) as refused:
            life.start_maintenance(node)
        assert refused.value.code == code
        # UNAVAILABLE (after the adapter's retries) is no refusal: an API failure, for a later tick.
        sim.inject("refuse-maintenance", node=name, code="none")
        sim.inject("api-errors", rate=1.0, codes=["UNAVAILABLE"], methods=["PerformMaintenance"])
        with pytest.raises(ApiError) as failed:
            life.start_maintenance(node)
        assert failed.value.code == "UNAVAILABLE"
        sim.inject("clear-errors")
