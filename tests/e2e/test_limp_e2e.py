"""End to end: a multislice job that can train on fewer slices (job.min_slices) limps on the
slices left when one is lost, and grows back onto it at its next complete checkpoint.

Four slices np-0..np-3 (one worker each) created one by one, job.min_slices = 3. The job's
trainer holds at step 100 until the test lets it go, so each stage meets a running job however
slow the machine. Outcomes come from the simulated world, the trainers' own environment, the
checkpoints and the journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import (
    checkpoint_steps,
    finish,
    job_memory,
    trainer,
    trainer_env,
    wait_while_watched,
    watch_process,
    write_config,
)

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.errors import UsageError
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


SLICES = ("np-0", "np-1", "np-2", "np-3")
STEPS = 200


def limping_job(sim: Simulator, tmp_path: Path, *, floor: int = 3, spot: tuple[str, ...] = (),
                spec: dict[str, object] | None = None) -> tuple[Path, dict[str, str], Path]:
    """The 4 slices READY with booted workers (`spot` made Spot nodes, to be preempted); a config
    for the job over them that may limp on `floor` (with `spec` as its [tpu.spec]); the directory
    whose file `100` lets the trainer past step 100."""
    for name in SLICES:
        sim.create_node(name, "v4-8", labels={"tpuwatch-job": "ms"}, spot=name in spot)
    ck = sim.bucket / "ck"
    go = tmp_path / "go"
    go.mkdir()
    # the trainer's environment shows what {num_slices} became
    # it saves on SIGTERM (Orbax's save on preemption): the relaunch must resume from that save
    command = "SLICES_SAID={num_slices} " + trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1",
                                                    steps=STEPS)
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, command, ck, tpu={"names": list(SLICES)}, name="ms", spec=spec)
    cfg.write_text(cfg.read_text().replace("[recovery]", f"min_slices = {floor}\n[recovery]"))
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    return cfg, env, go


def trainers(sim: Simulator) -> dict[str, dict[str, str]]:
    """slice node -> the environment of the job's trainer process running on its worker."""
    out: dict[str, dict[str, str]] = {}
    for name in SLICES:
        try:
            pids = sim.hosts.pids(sim.node_key(name), 0)
        except UsageError:  # its host is not booted (yet, or any more)
            continue
        for pid in pids:
            if (env := trainer_env(pid, "ms")) is not None:
                out[name] = env
    return out



def on_attempt(sim: Simulator, attempt: int) -> dict[str, dict[str, str]]:
    return {n: e for n, e in trainers(sim).items() if e["TPUWATCH_ATTEMPT"] == str(attempt)}





def test_a_lost_slice_limps_the_job_on_three_and_it_grows_back_to_four_at_the_next_checkpoint(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = limping_job(sim, tmp_path)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4 and len(checkpoint_steps(sim.bucket / "ck")) >= 2, proc, "attempt 1 on all 4 slices")
        assert {e["TPUWATCH_NUM_SLICES"] for e in on_attempt(sim, 1).values()} == {"4"}
        # np-1 goes into maintenance for good (until the test ends it): the job limps on the 3 left
        sim.inject("maintenance", node="np-1", stuck="REPAIRING")
        wait_while_watched(lambda: len(on_attempt(sim, 2)) == 3, proc, "attempt 2 on the 3 slices left")
        limped = on_attempt(sim, 2)
        resumed = {int(e["TPUWATCH_STEP"]) for e in limped.values()}
        assert sorted(limped) == ["np-0", "np-2", "np-3"]
        coordinator = TpuAdapter(sim.project, sim.zone).require_node("np-0").workers[0].internal_ip
        for i, name in enumerate(("np-0", "np-2", "np-3")):  # ids renumbered over the slices left
            e = limped[name]
            assert (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"]) == (str(i), "3"), e
            assert (e["MEGASCALE_SLICE_ID"], e["MEGASCALE_NUM_SLICES"], e["MEGASCALE_COORDINATOR_ADDRESS"]) == (
                str(i), "3", coordinator), e
            assert e["SLICES_SAID"] == "3", e  # {num_slices}
        mem = job_memory(tmp_path / "state", "ms")
        assert mem is not None and mem.limp.out == ("np-1",)
        # np-1 comes back while attempt 2 holds at step 100: the job waits for a newer checkpoint
        wait_while_watched(lambda: 100 in checkpoint_steps(sim.bucket / "ck"), proc, "attempt 2 at step 100")
        sim.inject("heal", node="np-1")
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "ms")) is not None and m.limp.back_since is not None, proc,
             "the watcher seeing np-1 back")
        assert len(on_attempt(sim, 2)) == 3 and not on_attempt(sim, 3)  # still limping: no checkpoint since
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert checkpoint_steps(sim.bucket / "ck")[-1] == STEPS
    assert "limping on 3 of 4 slices (job.min_slices 3), np-1 left out" in out, out
    assert "MEGASCALE_* set by tpuwatch for the 3 slices the job limps on (np-1 left out)" in out, out
    assert "growing back onto all 4 slices" in out, out
    attempts = json.loads(subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(cfg), "--json"],
                                         env=env, text=True, capture_output=True, timeout=60).stdout)["attempts"]
    assert [(a["outcome"], a["charged"]) for a in attempts] == [
        ("disruption", False), ("disruption", False), ("success", False)], attempts
    assert "slice np-1 lost" in attempts[0]["reason"] or "np-1" in attempts[0]["reason"], attempts
    # the grow came at the first checkpoint after step 100, not before it
    assert attempts[2]["start_step"] is not None and attempts[2]["start_step"] > 100, attempts
    # each relaunch resumed from what the stopped job saved on its SIGTERM, newer than the
    # checkpoint the stop was decided on
    assert resumed == {attempts[1]["start_step"]} and attempts[1]["start_step"] > attempts[0]["end_step"], attempts
    assert attempts[2]["start_step"] > attempts[1]["end_step"], attempts
    # Never a delete or a create: limping only moves the job.
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0


def test_a_multislice_queued_resource_limps_with_megascale_set_by_tpuwatch_and_grows_back_after_googles_restart(
        sim: Simulator, tmp_path: Path) -> None:
    """Two slices of one multislice queued resource, job.min_slices 1. Their tpu-env says 2
    slices: while the job limps on np-0, tpuwatch sets MEGASCALE_* itself (1 slice). When np-1 is
    back, Google restarts np-0 (its multislice restart), which ends the limped attempt; the job is
    launched on both again, joining by the runtime's tpu-env. Nothing is deleted or created."""
    sim.world.delays["multislice_restart"] = 1800.0  # np-0 restarts for a while once np-1 is back
    labels = {"tpuwatch-job": "ms"}
    from tpuwatch.sim.records import NodeSpec

    sim.world.queue_resource("ms", NodeSpec(accelerator_type="v4-8", labels=labels), node_count=2, node_prefix="np")
    pair = ("np-0", "np-1")
    sim.world.wait_for(lambda w: all(w.has_node(n) and w.node(n).state == "READY" for n in pair)
                       and w.get_queued_resource(sim.project, sim.zone, "ms").state == "ACTIVE", timeout=30)
    ck = sim.bucket / "ck"
    go = tmp_path / "go"
    go.mkdir()
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, trainer(ck, f"--hold-at 100 --hold-until {go}", steps=STEPS),
                       ck, tpu={"names": list(pair), "queued_resource": "ms"}, name="ms")
    cfg.write_text(cfg.read_text().replace("[recovery]", "min_slices = 1\n[recovery]"))
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 2 and len(checkpoint_steps(sim.bucket / "ck")) >= 2, proc, "attempt 1 on both slices")
        assert not [k for e in on_attempt(sim, 1).values() for k in e if k.startswith("MEGASCALE_")]
        sim.inject("maintenance", node="np-1", stuck="REPAIRING")
        wait_while_watched(lambda: len(on_attempt(sim, 2)) == 1, proc, "attempt 2 on np-0 alone")
        alone = on_attempt(sim, 2)["np-0"]
        coordinator = TpuAdapter(sim.project, sim.zone).require_node("np-0").workers[0].internal_ip
        assert (alone["MEGASCALE_NUM_SLICES"], alone["MEGASCALE_SLICE_ID"], alone["MEGASCALE_COORDINATOR_ADDRESS"],
                alone["TPUWATCH_NUM_SLICES"]) == ("1", "0", coordinator, "1"), alone
        sim.inject("heal", node="np-1")
        wait_while_watched(lambda: len(on_attempt(sim, 3)) == 2, proc, "attempt 3 on both slices after np-0's restart")
        both = on_attempt(sim, 3)
        assert not [k for e in both.values() for k in e if k.startswith("MEGASCALE_")], both  # the runtime's again
        assert {e["TPUWATCH_NUM_SLICES"] for e in both.values()} == {"2"}
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "limping on 1 of 2 slices (job.min_slices 1), np-1 left out" in out, out
    assert "MEGASCALE_* set by tpuwatch for the 1 slices the job limps on (np-1 left out)" in out, out
    mem = job_memory(tmp_path / "state", "ms")
    assert mem is not None and mem.limp.out == () and mem.budgets.restarts == 0
    assert sim.world.call_count("DeleteQueuedResource") == 0 and sim.world.call_count("CreateQueuedResource") == 0


def test_a_slice_lost_wakes_a_watcher_polling_hourly_and_the_job_limps_at_once(sim: Simulator, tmp_path: Path) -> None:
    """With a one-hour poll only the follow channels can end the wait: the lost slice's channel
    drops and its host's SSH port stays closed, which wakes the loop (without it the watcher
    would sleep until its next poll and the test would time out)."""
    cfg, env, _ = limping_job(sim, tmp_path)
    cfg.write_text(cfg.read_text().replace('poll_interval = "0.5s"', 'poll_interval = "1h"'))
    # the job holds at step 100 (its trainers alive, nothing to wake the loop) until the test ends
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4 and len(checkpoint_steps(sim.bucket / "ck")) >= 2, proc, "attempt 1 on all 4 slices")
        sim.inject("maintenance", node="np-2", stuck="REPAIRING")
        wait_while_watched(lambda: len(on_attempt(sim, 2)) == 3, proc, "attempt 2 on the 3 slices left", timeout=60)
        mem = job_memory(tmp_path / "state", "ms")
        assert mem is not None and mem.limp.out == ("np-2",)
    finally:
        proc.kill()
        proc.communicate(timeout=60)



def test_a_preempted_slice_left_out_is_made_again_in_the_background_and_the_job_grows_back_onto_it(
        sim: Simulator, tmp_path: Path) -> None:
    """Slices created one by one with [tpu.spec]: np-1, preempted, will not come back by itself.
    The job limps on the 3 left while np-1 is deleted and created again from [tpu.spec] (the
    limped attempt is not stopped for it), then grows back onto the new np-1 at its next
    checkpoint."""
    spec = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base", "spot": True}
    cfg, env, go = limping_job(sim, tmp_path, spot=("np-1",), spec=spec)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on all 4 slices")
        old = sim.world.node("np-1").id
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3"], proc,
                           "attempt 2 on the 3 slices left")
        wait_while_watched(lambda: sim.world.has_node("np-1") and sim.world.node("np-1").id != old
                           and sim.world.node("np-1").state == "READY", proc, "np-1 made again", timeout=120)
        assert sim.world.node("np-1").spec.labels.get("tpuwatch-job") == "ms"
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "ms")) is not None and m.limp.back_since is not None,
                           proc, "the watcher seeing np-1 back")
        # made again while the job limped: attempt 2 still trains on the 3, no checkpoint since
        assert len(on_attempt(sim, 2)) == 3 and not on_attempt(sim, 3)
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "limping on 3 of 4 slices (job.min_slices 3), np-1 left out" in out, out
    assert "np-1 is PREEMPTED and will not come back by itself" in out, out
    assert "growing back onto all 4 slices" in out, out
    attempts = json.loads(subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(cfg), "--json"],
                                         env=env, text=True, capture_output=True, timeout=60).stdout)["attempts"]
    assert [(a["outcome"], a["charged"]) for a in attempts] == [
        ("disruption", False), ("disruption", False), ("success", False)], attempts
    assert checkpoint_steps(sim.bucket / "ck")[-1] == STEPS
    # one delete and one create, both of np-1, off the job's path
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 1


def test_a_slice_a_person_deleted_is_not_limped_around_and_the_job_stops_for_a_person(
        sim: Simulator, tmp_path: Path) -> None:
    """Slices created one by one with [tpu.spec]: a person deletes np-1 (perhaps to stop the job).
    No word says Google or tpuwatch removed it, so the job does not limp on the 3 left: it stops
    for a person (`node_missing`, exit 1), and np-1 is never made again."""
    spec = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}
    cfg, env, _ = limping_job(sim, tmp_path, spec=spec)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on all 4 slices")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    TpuAdapter(sim.project, sim.zone).delete_node("np-1")  # a person's delete, found gone by the next look
    sim.world.wait_for(lambda w: not w.has_node("np-1"), timeout=30)
    run = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "check", "-c", str(cfg), "--json"], env=env, text=True,
                         capture_output=True, timeout=120)
    report = json.loads(run.stdout)
    assert run.returncode == 1 and report["row"] == "node_missing", (run.returncode, report)
    assert "slice 1 (np-1) on np-1 is missing" in report["summary"], report["summary"]
    mem = job_memory(tmp_path / "state", "ms")
    assert mem is not None and mem.limp.out == () and mem.limp.remaking == ()
    assert not on_attempt(sim, 2)  # never launched on the 3 left
    assert sim.world.call_count("CreateNode") == 0 and sim.world.call_count("DeleteNode") == 1  # the person's


def test_a_slice_left_out_that_a_person_deletes_while_the_job_limps_stops_the_job_for_a_person(
        sim: Simulator, tmp_path: Path) -> None:
    """Slices created one by one, no [tpu.spec]: np-1 is preempted and the job limps on the 3
    left; a person then deletes np-1. The job does not limp on for good without it: the watcher
    stops for a person (`node_missing`, exit 1) while the limped attempt still holds at step 100."""
    cfg, env, _ = limping_job(sim, tmp_path, spot=("np-1",))
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on all 4 slices")
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3"], proc,
                           "attempt 2 on the 3 slices left")
        TpuAdapter(sim.project, sim.zone).delete_node("np-1")  # a person's
        rc, out = finish(proc, timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1 and "slice 1 (np-1) on np-1 is missing" in out and "nor limps around" in out, out
    assert sim.world.call_count("CreateNode") == 0 and sim.world.call_count("DeleteNode") == 1  # the person's
