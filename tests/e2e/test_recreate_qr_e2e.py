"""End to end: `tpuwatch watch` recreates a TPU that came from a queued resource through it.

A spot node made by queued resource "pod-qr" is preempted: the watcher deletes the queued
resource (force, which takes the node with it), creates it again with the same tier and node
spec, follows it until the node is READY, and resumes the job. Outcomes are read from the
simulator's world (queued resources, nodes, API call counters) and the journal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

QR = "pod-qr"


def queued_resources(sim: Simulator) -> list[str]:
    return [q.name for q in sim.world.list_queued_resources(sim.project, "-")]


def nodes(sim: Simulator) -> list[str]:
    return [n.name for n in sim.world.list_nodes(sim.project, "-")]


def test_a_preempted_spot_node_from_a_queued_resource_is_recreated_through_it(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, queued=QR, hold_at=10)
    old = sim.world.node("pod")
    assert old.queued_resource.endswith(f"/queuedResources/{QR}")
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("preempt", node="pod")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod")
    assert node.id != old.id and node.state == "READY" and node.spec.spot
    assert node.queued_resource == old.queued_resource, "the new node did not come from the queued resource"
    qr = sim.world.get_queued_resource(sim.project, sim.zone, QR)
    assert qr.state == "ACTIVE" and qr.spot and qr.create_ns > 0
    assert queued_resources(sim) == [QR] and nodes(sim) == ["pod"]
    # Deleted through the queued resource with force, created again through it; never a plain node.
    assert sim.world.call_count("DeleteQueuedResource") == 1 and sim.world.call_count("DeleteNode") == 0
    assert sim.world.call_count("CreateQueuedResource") == 1 and sim.world.call_count("CreateNode") == 0
    attempts = job.history()["attempts"]
    assert attempts[0]["outcome"] == "disruption" and not any(a["charged"] for a in attempts), attempts
    assert attempts[-1]["node_id"] == str(node.id)
    assert attempts[-1]["start_step"] is not None and attempts[-1]["start_step"] >= 10
    assert job.steps_done()[-1] == STEPS


def test_a_queued_resource_that_fails_is_deleted_queued_and_created_again(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, queued=QR, hold_at=10)
    old = sim.world.node("pod")
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    # Quota runs out until the test has seen a new request accepted, then FAILED, and queued.
    sim.inject("quota", zone=sim.zone, duration="6h")
    sim.inject("preempt", node="pod")
    job.release()
    job.wait(lambda: any(e["reason"].startswith("out of quota in") for e in job.history()["events"]),
             timeout=90, what="a request failed for quota, queued")
    sim.world.clear_errors()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod")
    assert node.id != old.id and node.state == "READY" and node.queued_resource == old.queued_resource
    assert queued_resources(sim) == [QR] and nodes(sim) == ["pod"]
    assert sim.world.get_queued_resource(sim.project, sim.zone, QR).state == "ACTIVE"
    creates = sim.world.call_count("CreateQueuedResource")
    # Every failed request was deleted before the next create (else: ALREADY_EXISTS, exit 1).
    assert creates >= 2 and sim.world.call_count("DeleteQueuedResource") == creates
    assert sim.world.call_count("CreateNode") == 0
    # The policy was shown the failed request as a failed create and queued it.
    queued = [e["reason"] for e in job.history()["events"] if e["reason"].startswith("out of quota in")]
    assert any(f"queued resource {QR} FAILED: Quota limit" in r for r in queued), queued
    assert job.steps_done()[-1] == STEPS


def test_a_spot_node_the_service_takes_back_through_its_queued_resource_recovers(
        sim: Simulator, tmp_path: Path) -> None:
    """Google preempts a spot node made through a queued resource by deleting the node: the
    request goes SUSPENDING, then SUSPENDED, and the node is gone before any watcher looks.
    From cron (`check`), the next tick must see a disruption, not "a person deleted the node"."""
    # a long job, so it is still training when the service takes the node back however slow the box
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-16", spot=True, recreatable=True, queued=QR)
    old = sim.world.node("pod")
    assert job.cli("check", "-c", str(job.cfg)).returncode == 0
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    assert job.cli("check", "-c", str(job.cfg)).returncode == 0
    sim.inject("preempt", node="pod")
    sim.world.wait_for(lambda w: w.get_queued_resource(sim.project, sim.zone, QR).state == "SUSPENDED"
                       and not w.has_node("pod"), timeout=60)
    rows: list[str] = []  # the row of each cron tick until the job runs again on a new node
    deadline = time.monotonic() + 120
    while not rows or rows[-1] not in ("running", "launch"):
        assert time.monotonic() < deadline, f"not running again after 120 s; rows: {rows}"
        r = job.cli("check", "-c", str(job.cfg), "--json")
        assert r.returncode == 0, r.stdout + r.stderr  # never "needs a person" (exit 1)
        rows.append(json.loads(r.stdout)["row"])
    assert rows[0] == "queued_preempted", rows
    # The request is deleted and followed to its end before the create: no refused create.
    assert "no_capacity" not in rows, rows
    node = sim.world.node("pod")
    assert node.id != old.id and node.queued_resource == old.queued_resource
    assert sim.world.get_queued_resource(sim.project, sim.zone, QR).state == "ACTIVE"
    assert sim.world.call_count("DeleteQueuedResource") == 1 and sim.world.call_count("CreateQueuedResource") == 1
    assert sim.world.call_count("CreateNode") == 0 and sim.world.call_count("DeleteNode") == 0
    job.wait(lambda: any(a.start_step for a in job.attempts_journaled()[1:]), what="the relaunch journaled")
    attempts = job.history()["attempts"]
    assert attempts[0]["outcome"] == "disruption" and not any(a["charged"] for a in attempts), attempts
    assert attempts[1]["node_id"] == str(node.id) and attempts[1]["start_step"] >= 10  # from its checkpoint


def test_a_queued_resource_a_person_deleted_stays_a_needs_person_stop(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, queued=QR)
    assert job.cli("check", "-c", str(job.cfg)).returncode == 0
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.world.delete_queued_resource(sim.project, sim.zone, QR, force=True)
    sim.world.wait_for(lambda w: not w.has_node("pod") and not w.list_queued_resources(sim.project, "-"),
                       timeout=60)
    r = job.cli("check", "-c", str(job.cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tpuwatch never recreates a node a person deleted" in r.stdout + r.stderr
    assert sim.world.call_count("CreateQueuedResource") == 0  # tpuwatch created nothing
