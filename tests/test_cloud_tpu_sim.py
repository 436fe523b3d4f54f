"""TpuAdapter against the simulator: reads, pages, create/delete/operations, errors, retries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.cloud.errors import ApiError
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.cloud.tpu import TpuAdapter
from tpuwatch.errors import EXIT_CLOUD, NotFoundError, UsageError
from tpuwatch.sim.simulator import Simulator
from tpuwatch.sim.world import NodeSpec

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
