"""End to end: a job on a Compute Engine MIG with hot spare MIGs ([tpu] spares beside [tpu] mig):
a pool of one slot, the job's MIG or a spare MIG of its shape in its place. Against the
simulator's Compute Engine REST face with the real `google-cloud-compute` client and real ssh.

Outcomes come from the simulated world (instance ids, the calls it served), the trainers' own
environment, the checkpoints and the journal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import (
    checkpoint_steps,
    cli_json,
    compute_writes,
    finish,
    held_compute_job,
    job_memory,
    trainer_on_instance,
    wait_while_watched,
    watch_process,
)

from tpuwatch.errors import UsageError
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

OWNED = {"tpuwatch-job": "slice"}
# what a pool's MIG templates carry: the watcher starts the job, never a VM's boot (an idle
# spare, or the job's MIG recreated as one, would start the job on its own)
SET_UP_ONLY = {"tpuwatch-launch": "false"}
WRITES = ("Delete", "Insert", "Start", "Stop", "RecreateInstances", "PerformMaintenance", "Resize")


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def mig_job(sim: Simulator, rest: RestFace, tmp: Path, spares: list[str]) -> tuple[Path, dict[str, str], Path]:
    """The job "slice" on MIG slice with `spares`, its trainer held at step 100 until the test
    lets it go."""
    return held_compute_job(sim, rest.url, tmp, "slice", {"mig": "slice", "spares": spares})


def members(sim: Simulator, mig: str) -> list[str]:
    """The instances of MIG `mig`, zonal or regional (of the zone's region), by name."""
    try:
        return sorted(sim.world.mig(mig).members)
    except UsageError:
        return sorted(sim.world.mig(mig, region=sim.zone.rsplit("-", 1)[0]).members)


def on(sim: Simulator, mig: str, attempt: int) -> dict[str, str] | None:
    """The environment of the job's trainer of `attempt` on worker 0 of MIG `mig`, or None."""
    members_ = members(sim, mig)
    return trainer_on_instance(sim, members_[0], "slice", attempt) if members_ else None


def vm_ids(sim: Simulator, mig: str) -> dict[str, int]:
    names = set(members(sim, mig))
    return {r.name: r.id for r in sim.world.instances() if r.name in names}


def writes(sim: Simulator) -> list[str]:
    """The Compute Engine calls that changed something, once each call, sorted."""
    return compute_writes(sim, WRITES)


tool = cli_json


@pytest.mark.parametrize("regional", [False, True])
def test_a_preempted_mig_that_does_nothing_is_swapped_for_the_spare_mig_and_recreated_as_the_spare(
        sim: Simulator, rest: RestFace, tmp_path: Path, regional: bool) -> None:
    """DO_NOTHING: the MIG leaves its preempted Spot VM TERMINATED. The job relaunches on the
    spare MIG with no recreateInstances on its path; the job's MIG is then recreated in place (never
    deleted nor inserted) in the background, the job's spare from then on. `regional`: the spare
    is a regional MIG of the zone's region (its VMs in the job's zone), named by its URL."""
    region = sim.zone.rsplit("-", 1)[0]
    for name in ("slice", "sp"):
        sim.world.add_mig(name, "tpu7x-standard-4t", 2, spot=True, labels=OWNED, metadata=SET_UP_ONLY,
                          on_failure="DO_NOTHING", region=region if regional and name == "sp" else "")
    where = f"regions/{region}" if regional else f"zones/{sim.zone}"
    cfg, env, go = mig_job(sim, rest, tmp_path, [f"{where}/instanceGroupManagers/sp"])
    old, spare = vm_ids(sim, "slice"), vm_ids(sim, "sp")
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "slice", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on MIG slice, with checkpoints")
        sim.world.preempt_instance(sorted(old)[0])
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare MIG")
        # the old attempt was stopped on the VM of slice still running before the launch on sp
        # (the MIG is recreated only after it): never two attempts of the job at once
        assert trainer_on_instance(sim, sorted(old)[1], "slice", 1) is None
        e = on(sim, "sp", 2)
        assert e is not None and (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"]) == ("0", "1"), e
        resumed = int(e["TPUWATCH_STEP"])
        wait_while_watched(lambda: set(now := vm_ids(sim, "slice")) == set(old)
                           and all(now[n] != old[n] for n in old)
                           and all(r.status == "RUNNING" for r in sim.world.instances() if r.name in old)
                           and (m := job_memory(tmp_path / "state", "slice")) is not None and not m.limp.remaking
                           and not m.limp.away,
                           proc, "MIG slice recreated in place, and seen a spare", timeout=120)
        mem = job_memory(tmp_path / "state", "slice")
        assert mem is not None and mem.limp.swapped == (("slice", "sp"),), mem.limp
        assert on(sim, "sp", 2) is not None and on(sim, "slice", 3) is None  # not moved back
        shown = tool(cfg, env, "status")
        assert [(n["name"], n["kind"]) for n in shown["nodes"]] == [("slice", "mig"), ("sp", "mig")], shown
        assert "on spares: slice -> sp" in shown["nodes"][0]["job"]["job"], shown["nodes"][0]["job"]
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "slice 0 (slice) on sp instead of slice" in out, out
    # the stop went to the VM still running only (none to the preempted one), and before the launch
    stopped = out.index("stopped the job on 1/1 workers: attempt 1 ended")
    assert out.index("slice 0 (slice) on sp instead of slice") < stopped < out.index("launched attempt 2"), out
    # nothing recreated on the job's path: the relaunch on the spare came first
    assert out.index("launched attempt 2") < out.index("recreating spare slice"), out
    assert "recreating its instances (recreateInstances: the MIG, its template and workload policy stay)" in out, out
    assert writes(sim) == ["InstanceGroupManagers/RecreateInstances"], sim.world.calls  # the MIG stays
    assert vm_ids(sim, "sp") == spare  # the spare the job ran on was never touched
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    assert done[1]["start_step"] == resumed and resumed >= 10, done


def test_a_spare_mig_of_another_shape_not_owned_or_starting_the_job_at_boot_is_never_used_and_said(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim.world
    w.add_mig("slice", "tpu7x-standard-4t", 2, spot=True, labels=OWNED, metadata=SET_UP_ONLY, on_failure="DO_NOTHING")
    w.add_mig("sp-small", "tpu7x-standard-4t", 1, labels=OWNED, metadata=SET_UP_ONLY)
    w.add_mig("sp-big", "tpu7x-standard-8t", 1, labels=OWNED, metadata=SET_UP_ONLY)
    w.add_mig("sp-other", "tpu7x-standard-4t", 1, labels={"tpuwatch-job": "someone-else"}, metadata=SET_UP_ONLY)
    # its template starts the job at boot (resume-training.sh's metadata, no tpuwatch-launch = "false")
    w.add_mig("sp-boots", "tpu7x-standard-4t", 2, labels=OWNED, metadata={
        "tpuwatch-job": "slice", "tpuwatch-command": "python train.py", "tpuwatch-worker-script": "#!/bin/sh"})
    cfg, env, go = mig_job(sim, rest, tmp_path, ["sp-small", "sp-big", "sp-other", "sp-boots"])
    spares = {n: vm_ids(sim, n) for n in ("sp-small", "sp-big", "sp-other", "sp-boots")}
    (go / "100").touch()
    report = tool(cfg, env, "check")
    assert report["spares"] == {"swapped": {}, "idle": [
        {"name": "sp-small", "state": "READY", "health": "HEALTHY",
         "unfit": "a MIG of target size 1, not the job's 2"},
        {"name": "sp-big", "state": "READY", "health": "HEALTHY",
         "unfit": "a tpu7x-standard-8t, not the job's tpu7x-standard-4t"},
        {"name": "sp-other", "state": "READY", "health": "HEALTHY",
         "unfit": "not owned by job slice (its ownership label says someone-else)"},
        {"name": "sp-boots", "state": "READY", "health": "HEALTHY",
         "unfit": "its VMs start the job at boot (tpuwatch-command in its template's metadata without "
                  "tpuwatch-launch = \"false\"): an idle spare would run the job on its own"}]}, report["spares"]
    w.preempt_instance(sorted(w.mig("slice").members)[0])
    w.wait_instance(sorted(w.mig("slice").members)[0], "TERMINATED", timeout=30)
    for _ in range(2):
        again = tool(cfg, env, "check")
        # no spare fits: the job waits for its own MIG, recreated in place
        assert again["row"] in ("spare_remake", "spare_wait"), again
        assert again["spares"]["swapped"] == {}, again
    assert all(on(sim, n, 2) is None for n in spares)
    assert {n: vm_ids(sim, n) for n in spares} == spares  # never touched
    assert writes(sim) == ["InstanceGroupManagers/RecreateInstances"], sim.world.calls  # of the job's own MIG


def test_a_spare_mig_whose_launch_checks_fail_on_one_vm_is_skipped_for_the_next_one(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    for name in ("slice", "sp-bad", "sp-ok"):
        sim.world.add_mig(name, "tpu7x-standard-4t", 2, spot=True, labels=OWNED, metadata=SET_UP_ONLY,
                          on_failure="DO_NOTHING")
    bad = members(sim, "sp-bad")
    sim.world.bad_host(bad[1], "device-missing")  # a chip's device file is gone on worker 1 of that spare
    cfg, env, go = mig_job(sim, rest, tmp_path, ["sp-bad", "sp-ok"])
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "slice", 1) is not None, proc, "attempt 1 on MIG slice")
        sim.world.preempt_instance(members(sim, "slice")[0])
        wait_while_watched(lambda: on(sim, "sp-ok", 2) is not None, proc, "attempt 2 on the good spare MIG")
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "launch-time checks fail on spare sp-bad (slice 0, slice)" in out, out
    assert "slice 0 (slice) on sp-ok instead of" in out, out
    assert on(sim, "sp-bad", 2) is None
    assert not any(sim.hosts.pids(f"{sim.project}/{sim.zone}/instances/{n}", 0) for n in bad)  # nothing launched
    mem = job_memory(tmp_path / "state", "slice")
    assert mem is not None and mem.limp.swapped == (("slice", "sp-ok"),) and mem.limp.bad[0].startswith("sp-bad@")


def test_an_announced_maintenance_moves_the_job_onto_the_spare_mig_and_starts_it_on_the_idle_mig(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A maintenance announced for a VM of MIG slice a week away: at the job's next complete
    checkpoint the job moves onto spare MIG sp, and the maintenance starts at once on slice's VM,
    idle (performMaintenance there, never on the spare MIG the job runs on)."""
    for name in ("slice", "sp"):
        sim.world.add_mig(name, "tpu7x-standard-4t", 2, labels=OWNED, metadata=SET_UP_ONLY)
    cfg, env, go = mig_job(sim, rest, tmp_path, ["sp"])
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "slice", 1) is not None, proc, "attempt 1 on MIG slice")
        sim.world.schedule_instance_maintenance(members(sim, "slice")[1], starts_in=7 * 86400.0, heal_after=600.0)
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "slice")) is not None
                           and m.maintenance.early_window is not None, proc, "the watcher waiting for a checkpoint")
        (go / "100").touch()  # the job trains on: its next checkpoint is the moment
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare MIG")
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    assert done[1]["start_step"] >= done[0]["end_step"], done  # no step lost
    assert f"MIG slice (performMaintenance on {members(sim, 'slice')[1]})" in out, out
    assert sim.world.calls["compute.v1.Instances/PerformMaintenance"] == 1, sim.world.calls
    assert all(sim.world.instance(n).status == "RUNNING" for n in members(sim, "sp"))
    assert writes(sim) == ["Instances/PerformMaintenance"], sim.world.calls
