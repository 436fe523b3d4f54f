"""End to end: a multislice job with a hot spare ([tpu] spares) swaps a lost slice for it at
once, the spare keeping the lost slice's slice id, with no delete or create; the node swapped
out, back, is the spare from then on; a spare a person deleted or relabelled is never used.

Four slices np-0..np-3 and a spare sp-0 (one worker each) created one by one. The job's trainer
holds at step 100 until the test lets it go, so each stage meets a running job however slow the
machine. Outcomes come from the simulated world, the trainers' own environment, the checkpoints
and the journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_process
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
POOL = (*SLICES, "sp-0", "sp-1")
STEPS = 200
SPEC = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base", "spot": True}


def spared_job(sim: Simulator, tmp_path: Path, *, spot: tuple[str, ...] = (), spec: dict[str, object] | None = None,
               spares: tuple[str, ...] = ("sp-0",)) -> tuple[Path, dict[str, str], Path]:
    """The 4 slices and the spare READY with booted workers (`spot` made a Spot node, to be
    preempted); the job's config over them (with `spec` as its [tpu.spec]); the directory whose
    file `100` lets the trainer past step 100."""
    for name in (*SLICES, *spares):
        sim.create_node(name, "v4-8", labels={"tpuwatch-job": "ms"}, spot=name in spot)
    ck = sim.bucket / "ck"
    go = tmp_path / "go"
    go.mkdir()
    command = "SLICES_SAID={num_slices} " + trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1",
                                                    steps=STEPS)
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, command, ck, tpu={"names": list(SLICES), "spares": list(spares)},
                       name="ms", spec=spec)
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    return cfg, env, go


def on_attempt(sim: Simulator, attempt: int) -> dict[str, dict[str, str]]:
    """node -> the environment of the job's trainer of `attempt` running on its worker."""
    out: dict[str, dict[str, str]] = {}
    for name in POOL:
        try:
            pids = sim.hosts.pids(sim.node_key(name), 0)
        except UsageError:  # its host is not booted (yet, or any more)
            continue
        for pid in pids:
            if (env := trainer_env(pid, "ms")) is not None and env["TPUWATCH_ATTEMPT"] == str(attempt):
                out[name] = env
    return out






def attempts(cfg: Path, env: dict[str, str]) -> list[dict[str, object]]:
    out = cli_process.run(["history", "-c", str(cfg), "--json"], env, timeout=60).stdout
    return list(json.loads(out)["attempts"])


def test_a_preempted_slice_is_swapped_for_the_spare_in_its_place_with_no_delete_or_create(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = spared_job(sim, tmp_path, spot=("np-1",))
    proc = watch_process(cfg, env)
    before = ""
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4 and len(checkpoint_steps(sim.bucket / "ck")) >= 2, proc, "attempt 1 on the 4 slices")
        assert sorted(on_attempt(sim, 1)) == list(SLICES)
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: len(on_attempt(sim, 2)) == 4, proc, "attempt 2 on the spare and the 3 left")
        swapped = on_attempt(sim, 2)
        assert sorted(swapped) == ["np-0", "np-2", "np-3", "sp-0"]
        coordinator = TpuAdapter(sim.project, sim.zone).require_node("np-0").workers[0].internal_ip
        for i, name in enumerate(("np-0", "sp-0", "np-2", "np-3")):  # the spare takes np-1's slice id
            e = swapped[name]
            assert (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"], e["SLICES_SAID"]) == (str(i), "4", "4"), e
            assert (e["MEGASCALE_SLICE_ID"], e["MEGASCALE_NUM_SLICES"], e["MEGASCALE_COORDINATOR_ADDRESS"]) == (
                str(i), "4", coordinator), e
        resumed = {int(e["TPUWATCH_STEP"]) for e in swapped.values()}
        mem = job_memory(tmp_path / "state", "ms")
        assert mem is not None and mem.limp.swapped == (("np-1", "sp-0"),) and mem.limp.out == ()
        shown = json.loads(cli_process.run(["status", "-c", str(cfg), "--json"], env, timeout=60).stdout)
        assert [n["name"] for n in shown["nodes"]] == [*SLICES, "sp-0"]  # every slice, and the spare
        assert "on spares: np-1 -> sp-0" in shown["nodes"][0]["job"]["job"], shown["nodes"][0]["job"]
        # a precheck outside the watch checks the nodes the job runs on now: the spare, not np-1
        pre = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "precheck", "-c", str(cfg), "--json"],
                             env=env, text=True, capture_output=True, timeout=120)
        ids = [str(sim.world.node(n).id) for n in ("np-0", "sp-0", "np-2", "np-3")]
        assert pre.returncode == 0 and json.loads(pre.stdout)["node_id"] == "+".join(ids), (pre.stdout, pre.stderr)
        # a config edit that drops the spare the job runs on: the job stays there (a new watcher
        # reads the node it is bound to), not taken for a slice gone missing
        proc.kill()
        before = proc.communicate()[0]
        cfg.write_text(cfg.read_text().replace('spares = ["sp-0"]', "spares = []"))
        # a real process, as a person's: one forked within milliseconds of the kill may find the
        # job's lock still held (tests/chaos/harness.py waits for it)
        tick = json.loads(subprocess.run([sys.executable, "-m", "tpuwatch.cli", "check", "-c", str(cfg), "--json"],
                                         env=env, text=True, capture_output=True, timeout=120).stdout)
        assert tick["row"] == "running", tick
        assert sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3", "sp-0"] and not on_attempt(sim, 3)
        proc = watch_process(cfg, env)
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert checkpoint_steps(sim.bucket / "ck")[-1] == STEPS
    assert "slice 1 (np-1) on sp-0 instead of np-1 (PREEMPTED)" in before, before
    done = attempts(cfg, env)
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    # the relaunch resumed from what the stopped job saved on its SIGTERM
    assert resumed == {done[1]["start_step"]} and done[1]["start_step"] > done[0]["end_step"], done  # type: ignore[operator]
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0


def test_the_slice_swapped_out_is_the_spare_once_back_and_stands_in_for_the_next_loss(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = spared_job(sim, tmp_path)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        sim.inject("maintenance", node="np-2", stuck="REPAIRING")
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-1", "np-3", "sp-0"], proc, "attempt 2 on the spare")
        sim.inject("heal", node="np-2")  # np-2 back: it is the job's spare now; nothing moves
        sim.inject("maintenance", node="np-0", stuck="REPAIRING")
        wait_while_watched(lambda: sorted(on_attempt(sim, 3)) == ["np-1", "np-2", "np-3", "sp-0"], proc, "attempt 3 on np-2")
        ids = {n: e["TPUWATCH_SLICE_ID"] for n, e in on_attempt(sim, 3).items()}
        assert ids == {"np-2": "0", "np-1": "1", "sp-0": "2", "np-3": "3"}, ids
        mem = job_memory(tmp_path / "state", "ms")
        assert mem is not None and dict(mem.limp.swapped) == {"np-0": "np-2", "np-2": "sp-0"}
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)] == [
        ("disruption", False), ("disruption", False), ("success", False)]
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
    # the report's account: two swaps, and the wait np-2's heal would have cost spared (np-0 not back yet)
    spares = json.loads(cli_process.run(["report", "-c", str(cfg), "--json"], env, timeout=60).stdout)["spares"]
    assert spares["count"] == 1 and spares["swaps"] == 2 and spares["waits_spared_seconds"] > 0, spares


def test_a_preempted_slice_swapped_out_is_deleted_and_created_again_as_the_spare_while_the_job_runs(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = spared_job(sim, tmp_path, spot=("np-1",),
                              spec=SPEC)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        old = sim.world.node("np-1").id
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3", "sp-0"], proc, "attempt 2 on the spare")
        # np-1 is made again in the background, as the job's spare; the job is not stopped for it
        wait_while_watched(lambda: sim.world.has_node("np-1") and sim.world.node("np-1").id != old
             and sim.world.node("np-1").state == "READY", proc, "np-1 made again", timeout=120)
        assert sim.world.node("np-1").spec.labels.get("tpuwatch-job") == "ms"
        assert len(on_attempt(sim, 2)) == 4 and not on_attempt(sim, 3)
        # the next loss is swapped for it
        sim.inject("maintenance", node="np-3", stuck="REPAIRING")
        wait_while_watched(lambda: sorted(on_attempt(sim, 3)) == ["np-0", "np-1", "np-2", "sp-0"], proc, "attempt 3 on the new np-1")
        assert on_attempt(sim, 3)["np-1"]["TPUWATCH_SLICE_ID"] == "3"
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "deleting spare np-1" in out and "creating spare np-1" in out, out
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)] == [
        ("disruption", False), ("disruption", False), ("success", False)]
    # one delete and one create, both of the spare: none on the job's path
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 1


def test_a_second_loss_while_the_spare_is_made_again_through_a_stockout_waits_for_it_and_resumes(
        sim: Simulator, tmp_path: Path) -> None:
    """np-1 is preempted and swapped for sp-0; a stockout holds np-1's create back; np-2 is
    preempted then: no spare is free, and the job waits (not a stop for a person), np-2 made again
    too; once the stockout ends the job resumes on whichever comes first, and finishes."""
    cfg, env, go = spared_job(sim, tmp_path, spot=("np-1", "np-2"), spec=SPEC)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        sim.inject("stockout")
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3", "sp-0"], proc, "attempt 2 on the spare")
        wait_while_watched(lambda: sim.world.call_count("CreateNode") >= 1, proc, "np-1's first create (refused: no capacity)")
        sim.inject("preempt", node="np-2")
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "ms")) is not None and m.phase.value == "waiting_node"
             and "np-2" in m.limp.remaking, proc, "the job waiting, np-2 being made again")
        assert proc.poll() is None and not on_attempt(sim, 3)
        sim.inject("clear-errors")
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "no spare free: waiting for" in out and "needs a person" not in out, out
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)][:2] == [("disruption", False)] * 2
    assert sim.world.call_count("DeleteNode") == 2
    assert all(sim.world.node(n).state == "READY" for n in ("np-1", "np-2"))


def test_an_announced_maintenance_moves_the_job_onto_the_spare_at_a_checkpoint_losing_no_step(
        sim: Simulator, tmp_path: Path) -> None:
    """A maintenance announced for np-1 a week away: at the job's next complete checkpoint the job
    moves onto sp-0 in np-1's place and np-1's maintenance starts at once, idle; no step lost,
    nothing charged, and no wait for the maintenance."""
    sim.world.delays["simulated_maintenance_heal"] = 600.0
    cfg, env, go = spared_job(sim, tmp_path)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        sim.inject("upcoming-maintenance", node="np-1", starts_in="7d", heal_after="10m")
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "ms")) is not None and m.maintenance.early_window is not None, proc,
             "the watcher waiting for the next checkpoint")
        (go / "100").touch()  # the job trains on: its next checkpoint is the moment
        wait_while_watched(lambda: sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3", "sp-0"], proc, "attempt 2 on the spare")
        assert on_attempt(sim, 2)["sp-0"]["TPUWATCH_SLICE_ID"] == "1"
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    done = attempts(cfg, env)
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    assert "onto a spare ahead of a maintenance" in str(done[0]["reason"]), done
    assert done[1]["start_step"] >= done[0]["end_step"], done  # no step lost
    assert "maintenance of np-1" in out and "starts now on np-1, idle" in out, out
    assert sim.world.node("np-1").upcoming is None  # started by tpuwatch, before its window
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0


def test_an_idle_spares_announced_maintenance_is_started_at_once_and_the_job_runs_on_untouched(
        sim: Simulator, tmp_path: Path) -> None:
    """Maintenances announced for the idle spares sp-0 and sp-1 a week away, that may start early:
    tpuwatch starts each now, once, while nothing runs there (not at its window, when the job
    may run there); sp-1's start is refused: said, and not asked again. The job on its 4 slices
    is not stopped for them."""
    sim.world.delays["simulated_maintenance_heal"] = 600.0
    cfg, env, go = spared_job(sim, tmp_path, spares=("sp-0", "sp-1"))
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        sim.inject("refuse-maintenance", node="sp-1", code="FAILED_PRECONDITION")
        for spare in ("sp-0", "sp-1"):
            sim.inject("upcoming-maintenance", node=spare, starts_in="7d", heal_after="10m")
        wait_while_watched(lambda: (n := sim.world.node("sp-0")).state == "READY" and n.health == "HEALTHY"
                           and n.upcoming is None and sim.world.call_count("PerformMaintenance") == 2, proc,
                           "sp-0 back from its maintenance, sp-1's refused", timeout=120)
        assert sorted(on_attempt(sim, 1)) == list(SLICES)  # the job runs on, untouched
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "sp-0, an idle spare of job ms, has a scheduled maintenance announced" in out, out
    assert "the maintenance of idle spare sp-1 could not be started early (FAILED_PRECONDITION" in out, out
    assert sim.world.call_count("PerformMaintenance") == 2  # each asked once, the refused one too
    assert sim.world.node("sp-1").upcoming is not None  # left to its window
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)] == [("success", False)]


def test_a_spare_whose_launch_checks_fail_is_skipped_for_the_next_one(sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = spared_job(sim, tmp_path, spot=("np-1",), spares=("sp-0", "sp-1"))
    sim.inject("device-missing", node="sp-0", worker=0)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: len(on_attempt(sim, 1)) == 4, proc, "attempt 1 on the 4 slices")
        sim.inject("preempt", node="np-1")
        wait_while_watched(lambda: len(on_attempt(sim, 2)) == 4, proc, "attempt 2")
        assert sorted(on_attempt(sim, 2)) == ["np-0", "np-2", "np-3", "sp-1"]  # never on sp-0
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "launch-time checks fail on spare sp-0 (slice 1, np-1)" in out, out
    assert "slice 1 (np-1) on sp-1 instead of" in out, out
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)] == [("disruption", False), ("success", False)]
    mem = job_memory(tmp_path / "state", "ms")
    assert mem is not None and mem.limp.swapped == (("np-1", "sp-1"),) and len(mem.limp.bad) == 1, mem.limp
    assert mem.limp.bad[0].startswith("sp-0@") and mem.budgets.restarts == 0


def test_a_spare_a_person_deleted_or_relabelled_is_never_used_nor_remade_and_said(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env, go = spared_job(sim, tmp_path, spot=("sp-0",),
                              spec=SPEC)
    (go / "100").touch()
    tpu = TpuAdapter(sim.project, sim.zone)
    tpu.set_labels("sp-0", {"tpuwatch-job": "someone-else"})
    sim.inject("maintenance", node="np-2", stuck="REPAIRING")

    def check() -> dict[str, object]:
        run = cli_process.run(["check", "-c", str(cfg), "--json"], env, timeout=120)
        return dict(json.loads(run.stdout))

    report = check()
    assert report["spares"] == {"swapped": {}, "idle": [
        {"name": "sp-0", "state": "READY", "health": "HEALTHY",
         "unfit": "not owned by job ms (its ownership label says someone-else)"}]}, report["spares"]
    assert report["row"] != "swap", report
    sim.inject("preempt", node="sp-0")  # another job's node, dead: never deleted to be made again
    assert check()["row"] not in ("swap", "spare_remake")
    tpu.delete_node("sp-0")  # a person deletes it: never created again
    sim.world.wait_for(lambda w: not w.has_node("sp-0"), timeout=30)
    for _ in range(2):
        again = check()
        assert again["spares"] == {"swapped": {}, "idle": [{"name": "sp-0", "state": "MISSING", "health": "",
                                                            "unfit": "missing"}]}, again
    assert sim.world.call_count("CreateNode") == 0 and sim.world.call_count("DeleteNode") == 1  # the person's


def test_a_job_on_one_node_is_swapped_onto_its_spare_and_its_node_made_again_as_the_spare(
        sim: Simulator, tmp_path: Path) -> None:
    """A job on one node ("pod") with a spare: a pool of one slot. The preempted node is swapped
    for the spare at once (the job on it as on one node: no MEGASCALE_*), and made again as the
    spare in the background."""
    for name in ("pod", "sp-0"):
        sim.create_node(name, "v4-8", labels={"tpuwatch-job": "ms"}, spot=True)
    ck = sim.bucket / "ck"
    go = tmp_path / "go"
    go.mkdir()
    command = trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1", steps=STEPS)
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, command, ck, tpu={"spares": ["sp-0"]}, name="pod", spec=SPEC)
    cfg.write_text(cfg.read_text().replace("[job]", '[job]\nname = "ms"', 1))  # the job "ms", as the labels say
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}

    def trainers_on(name: str, attempt: int) -> dict[str, str] | None:
        try:
            pids = sim.hosts.pids(sim.node_key(name), 0)
        except UsageError:
            return None
        return next((e for pid in pids if (e := trainer_env(pid, "ms")) is not None
                     and e["TPUWATCH_ATTEMPT"] == str(attempt)), None)

    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: trainers_on("pod", 1) is not None, proc, "attempt 1 on pod")
        old = sim.world.node("pod").id
        sim.inject("preempt", node="pod")
        wait_while_watched(lambda: trainers_on("sp-0", 2) is not None, proc, "attempt 2 on the spare")
        e = trainers_on("sp-0", 2)
        assert e is not None and (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"]) == ("0", "1"), e
        assert not [k for k in e if k.startswith("MEGASCALE_")], e  # one node: no multislice to join
        wait_while_watched(lambda: sim.world.has_node("pod") and sim.world.node("pod").id != old
             and sim.world.node("pod").state == "READY", proc, "pod made again", timeout=120)
        assert trainers_on("sp-0", 2) is not None and trainers_on("pod", 3) is None  # the job was not moved back
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "slice 0 (pod) on sp-0 instead of pod (PREEMPTED)" in out, out
    assert [(a["outcome"], a["charged"]) for a in attempts(cfg, env)] == [("disruption", False), ("success", False)]
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 1


def test_a_job_on_one_node_a_person_deleted_stops_for_a_person_not_swapped_onto_its_spare(
        sim: Simulator, tmp_path: Path) -> None:
    """A person deletes the node of a job on one node with a spare (perhaps to stop the job): no
    word says Google or tpuwatch did, so the job stops for a person (`node_missing`, exit 1) as
    without spares; nothing runs on the spare, nothing is made again."""
    for name in ("pod", "sp-0"):
        sim.create_node(name, "v4-8", labels={"tpuwatch-job": "ms"})
    ck = sim.bucket / "ck"
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, trainer(ck, "", steps=STEPS), ck, tpu={"spares": ["sp-0"]},
                       name="pod", spec=SPEC)
    cfg.write_text(cfg.read_text().replace("[job]", '[job]\nname = "ms"', 1))  # the job "ms", as the labels say
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    TpuAdapter(sim.project, sim.zone).delete_node("pod")
    sim.world.wait_for(lambda w: not w.has_node("pod"), timeout=30)
    run = cli_process.run(["check", "-c", str(cfg), "--json"], env, timeout=120)
    report = json.loads(run.stdout)
    assert run.returncode == 1 and report["row"] == "node_missing", (run.returncode, report)
    assert report["spares"]["swapped"] == {}, report["spares"]
    with pytest.raises(UsageError):
        sim.hosts.pids(sim.node_key("pod"), 0)
    assert not [p for p in sim.hosts.pids(sim.node_key("sp-0"), 0) if trainer_env(p, "ms") is not None]
    assert sim.world.call_count("CreateNode") == 0 and sim.world.call_count("DeleteNode") == 1  # the person's
