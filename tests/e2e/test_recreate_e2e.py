"""End to end: `tpuwatch watch` deletes and recreates a TPU that will not heal.

The simulator serves the real create/delete operations; outcomes are read from the simulator's
world (node ids, labels, metadata, call counters), the workers' homes (startup script ran) and
the journal, not from tpuwatch's own output.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish, wait_for

from tpuwatch.errors import NotFoundError, UsageError
from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

FALLBACK = "us-central2-c"


def startup_script(tmp: Path) -> Path:
    path = tmp / "boot.sh"
    path.write_text("#!/bin/bash\necho booted > \"$HOME/booted-by-startup-script\"\n")
    return path


def node_id(sim: Simulator, zone: str | None = None) -> int:
    return sim.world.node("pod", zone=zone).id


def test_maintenance_that_never_heals_is_recreated_and_the_job_resumes(sim: Simulator, tmp_path: Path) -> None:
    script = startup_script(tmp_path)
    job = Job(sim, tmp_path, recreatable=True, repair_timeout="3s", tpu={"startup_script": str(script)}, hold_at=10)
    old = node_id(sim)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("maintenance", node="pod", stuck="REPAIRING")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod")
    assert node.id != old, "the node was not recreated"
    labels = dict(node.spec.labels)
    assert labels.get("team") == "ml" and labels.get("tpuwatch-job") == "pod", labels
    assert node.spec.metadata.get("owner-note") == "kept on recreate"
    assert node.spec.metadata.get("startup-script") == script.read_text()
    key = sim.node_key("pod")
    for w in range(node.n_workers):  # the startup script ran on every worker of the new node
        assert (sim.hosts.worker_home(key, w) / "booted-by-startup-script").read_text().strip() == "booted"
    attempts = job.history()["attempts"]
    assert len(attempts) >= 2 and not any(a["charged"] for a in attempts), attempts
    assert attempts[-1]["start_step"] is not None and attempts[-1]["start_step"] >= 10
    assert attempts[-1]["node_id"] == str(node.id)
    assert job.steps_done()[-1] == STEPS
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 1


def test_a_preempted_spot_node_is_deleted_recreated_and_resumed(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, hold_at=10)
    old = node_id(sim)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("preempt", node="pod")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod")
    assert node.id != old and node.state == "READY" and node.spec.spot
    attempts = job.history()["attempts"]
    assert attempts[0]["outcome"] == "disruption" and not any(a["charged"] for a in attempts), attempts
    assert job.steps_done()[-1] == STEPS


def test_a_stockout_longer_than_queue_timeout_moves_to_the_fallback_zone(sim: Simulator, tmp_path: Path) -> None:
    # Simulator speed 600: queue_timeout 12 s = 2 simulated hours. The stockout lasts 6 simulated
    # hours (36 s), longer than the queue with room to spare on a loaded machine, so the node can
    # only come from the fallback zone.
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, queue_timeout="12s",
              tpu={"fallback_zones": [FALLBACK]})
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("stockout", zone=sim.zone, duration="6h")
    sim.inject("preempt", node="pod")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod", zone=FALLBACK)
    assert node.state == "READY"
    total = sim.world.call_count("CreateNode")
    # Queued for 12 s with a capped backoff (0.2 s doubling to 1 s, jittered): a bounded number of
    # creates, not a tight loop; the count is reported for the note.
    print(f"CreateNode calls while queued and after: {total}")
    assert 2 <= total <= 25, total
    gets = sim.world.call_count("GetNode")
    print(f"GetNode calls over the run: {gets}")
    history = job.history()
    assert any("queued" in e["reason"] or e["kind"] == "create" for e in history["events"])
    assert job.steps_done()[-1] == STEPS
    with pytest.raises(Exception, match="no simulated node"):
        sim.world.node("pod")  # nothing left behind in the stocked-out zone


def test_a_node_deleted_by_hand_stops_with_exit_1_and_is_not_recreated(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, recreatable=True, steps=400)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("delete-node", node="pod")
    rc, out = finish(proc, timeout=60)
    assert rc == 1, out
    assert "deleted" in out.lower() or "missing" in out.lower(), out
    assert sim.world.call_count("CreateNode") == 0
    with pytest.raises(Exception, match="no simulated node"):
        sim.world.node("pod")


def test_kill_9_at_five_points_between_delete_and_create_leaves_exactly_one_node(
        sim: Simulator, tmp_path: Path) -> None:
    sim.world.delays.update(delete=1200.0, create=1200.0)  # 2 s each: room to kill inside them
    job = Job(sim, tmp_path, recreatable=True, repair_timeout="1s")
    old = node_id(sim)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("maintenance", node="pod", stuck="UNHEALTHY_MAINTENANCE")

    def state() -> str:
        try:
            return sim.world.node("pod").state
        except Exception:
            return "MISSING"

    def recreated() -> bool:
        return state() != "MISSING" and node_id(sim) != old

    # Each point is "at or after" its moment, so a short window the sampling misses still gets a
    # kill just past it rather than none.
    points = [
        ("delete called", lambda: sim.world.call_count("DeleteNode") >= 1),
        ("node deleting", lambda: state() in ("DELETING", "MISSING") or recreated()),
        ("node gone", lambda: state() == "MISSING" or recreated()),
        ("create called", lambda: sim.world.call_count("CreateNode") >= 1),
        ("node creating", lambda: state() == "CREATING" or recreated()),
    ]
    killed = []
    for what, reached in points:
        job.wait(reached, timeout=60, what=what)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed.append(what)
        proc = job.watch()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    assert killed == [p[0] for p in points]
    assert [n.name for n in sim.world.list_nodes(sim.project, sim.zone)] == ["pod"]
    assert node_id(sim) != old and state() == "READY"
    # Never two creates. A watcher killed between its create call and the journal's record of
    # the operation sends the create again on restart (write-ahead: the journal says a create is
    # ours), and the answer ALREADY_EXISTS is its success; only one create is ever started.
    creates = [o for o in sim.world.list_operations(f"projects/{sim.project}/locations/{sim.zone}")
               if o.verb == "create"]
    assert len(creates) == 1, "never two creates"
    assert sim.world.call_count("CreateNode") <= 2
    assert sim.world.call_count("DeleteNode") >= 1
    assert job.steps_done()[-1] == STEPS


def test_a_node_not_owned_is_never_deleted(sim: Simulator, tmp_path: Path) -> None:
    # Labelled for another job whose name merely starts with this one's.
    job = Job(sim, tmp_path, recreatable=True, repair_timeout="1s", labels={"tpuwatch-job": "pod-2"})
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("maintenance", node="pod", stuck="REPAIRING")
    rc, out = finish(proc, timeout=60)  # needs a person: watch returns 1 after repair_timeout
    assert rc == 1, out
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
    assert sim.world.node("pod").state == "REPAIRING"
    assert "--adopt" in out, out


def test_the_startup_script_resumes_the_job_at_boot_and_watch_follows_it(sim: Simulator, tmp_path: Path) -> None:
    """startup-scripts/resume-training.sh on the recreated node starts the next attempt from the
    newest checkpoint before the watcher reconnects; the watcher follows it, never a second copy."""
    script = Path(__file__).resolve().parents[2] / "startup-scripts" / "resume-training.sh"
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, steps=80,
              tpu={"startup_script": str(script)}, hold_at=10)
    proc = job.watch()
    # The watcher has read the checkpoint the job holds at (on the VM: only a probe reads it), so
    # its create tells the boot where to resume; a create that knows none only sets the node up.
    def seen_checkpoint() -> bool:
        try:
            with Journal.open(tmp_path / "state", "pod", "pod", readonly=True) as journal:
                return any(e.kind == "checkpoint" and e.data.get("step") == 10 for e in journal.events())
        except NotFoundError:  # no journal yet
            return False

    job.wait(seen_checkpoint, what="the watcher seeing checkpoint 10")
    old = sim.world.node("pod").id
    sim.inject("preempt", node="pod")
    job.release()
    # The watcher is paused from the moment the new node exists until its startup scripts have
    # ended, so the boot, not the watcher, starts attempt 2 (on a busy machine the watcher could
    # otherwise reach the workers first; the worker-side lock would then keep one copy).
    def recreated() -> bool:
        try:
            return sim.world.node("pod").id != old
        except UsageError:  # deleted, not made again yet
            return False

    wait_for(recreated, timeout=60, what="the new node")
    proc.send_signal(signal.SIGSTOP)
    try:
        key = sim.node_key("pod")
        node = sim.world.node("pod")
        def started_at_boot() -> bool:
            try:
                return all(sim.hosts.startup_status(key, w) is not None for w in range(node.n_workers))
            except UsageError:  # not booted yet
                return False

        job.wait(started_at_boot, what="the startup scripts ended")
    finally:
        proc.send_signal(signal.SIGCONT)
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    for w in range(node.n_workers):
        log = (sim.hosts.worker_home(key, w) / "startup-script.log").read_text()
        assert f"launched attempt 2 of pod on worker {w}" in log, log
    events = job.history()["events"]
    launches = [e for e in events if e["kind"] == "launch"]
    assert [e["data"].get("attempt") for e in launches] == [1], launches  # attempt 2 came from the boot
    attempts = job.history()["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2] and attempts[1]["outcome"] == "success", attempts
    assert job.steps_done()[-1] == 80


def test_a_reservation_shortfall_with_code_8_is_queued_and_named_a_reservation_shortfall(
        sim: Simulator, tmp_path: Path) -> None:
    # The create operation fails with code 8 and "Insufficient reserved capacity" (as users see
    # it) until the test has seen one refused, then the create goes through in the same zone.
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("reservation-shortfall", zone=sim.zone, duration="6h")
    sim.inject("preempt", node="pod")
    job.wait(lambda: any("Insufficient reserved capacity" in e["reason"] for e in job.history()["events"]),
             timeout=90, what="a create refused for a reservation shortfall")
    sim.world.clear_errors()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    assert sim.world.node("pod").state == "READY"
    assert sim.world.call_count("CreateNode") >= 2  # one refused at least, then the one that made it
    reasons = [e["reason"] for e in job.history()["events"]]
    queued = [r for r in reasons if "Insufficient reserved capacity" in r]
    assert queued and all(r.startswith("reservation shortfall") for r in queued), reasons
    assert job.steps_done()[-1] == STEPS


OTHER_REGION = "us-east5-a"


def with_subnetwork(job: Job, sim: Simulator, overrides: str = "") -> str:
    """Give the job's spec a subnetwork of the simulator's region; return it."""
    subnet = f"projects/{sim.project}/regions/{sim.zone.rsplit('-', 1)[0]}/subnetworks/tpu-net"
    text = job.cfg.read_text().replace("[tpu.spec]\n", f'[tpu.spec]\nsubnetwork = "{subnet}"\n', 1)
    job.cfg.write_text(text + overrides)
    return subnet


def test_a_fallback_zone_in_another_region_with_a_regional_subnetwork_stops_at_load_with_exit_2(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, recreatable=True, tpu={"zone": sim.zone, "fallback_zones": [OTHER_REGION]})
    with_subnetwork(job, sim)
    out = job.cli("watch", "-c", str(job.cfg), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "tpu.fallback_zones: us-east5-a" in out.stderr and "tpu.spec.subnetwork" in out.stderr, out.stderr
    assert f'[tpu.zone_overrides."{OTHER_REGION}"]' in out.stderr and "Traceback" not in out.stderr
    assert sim.world.call_count("GetNode") == 0 and job.steps_done() == []  # nothing was started


def test_with_a_zone_override_a_stocked_out_node_is_recreated_in_another_region_with_its_subnetwork(
        sim: Simulator, tmp_path: Path) -> None:
    east = f"projects/{sim.project}/regions/us-east5/subnetworks/tpu-net-east"
    job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, queue_timeout="12s",
              tpu={"zone": sim.zone, "fallback_zones": [OTHER_REGION]})
    with_subnetwork(job, sim, f'[tpu.zone_overrides."{OTHER_REGION}"]\nsubnetwork = "{east}"\n')
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
    sim.inject("stockout", zone=sim.zone, duration="6h")
    sim.inject("preempt", node="pod")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    node = sim.world.node("pod", zone=OTHER_REGION)
    assert node.state == "READY"
    # The simulator refuses, as Google does, a subnetwork of another region: this one is the override.
    assert json.loads(node.spec.spec_json)["networkConfig"]["subnetwork"] == east
    assert job.steps_done()[-1] == STEPS
