"""End to end: a job on a Compute Engine instance with hot spare instances ([tpu] spares with
api = "compute"): a pool of one slot, as a TPU API job on one node with spares. Against the
simulator's Compute Engine REST face with the real `google-cloud-compute` client and real ssh.

Outcomes come from the simulated world (instance ids, the calls it served, in order), the
trainers' own environment, the checkpoints and the journal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import cli_process
import pytest
import tomli_w
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

from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SPOT = {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}
WRITES = ("Delete", "Insert", "Start", "Stop", "RecreateInstances", "PerformMaintenance")


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def spared(sim: Simulator, rest: RestFace, tmp: Path, spares: list[str], *, spec: bool = True) -> tuple[Path, dict[str, str], Path]:
    """The job "vm" on instance vm with `spares`, its trainer held at step 100 until the test
    lets it go; with `spec`, the [tpu.compute_spec] `tpuwatch init vm` captures."""
    cfg, env, go = held_compute_job(sim, rest.url, tmp, "vm", {"instance": "vm", "spares": spares})
    if spec:
        init = cli_process.run(["init", "vm", "-o", str(tmp / "init.toml"), "--json"], env)
        assert init.returncode == 0, init.stderr
        with cfg.open("a") as f:
            f.write(tomli_w.dumps({"tpu": {"compute_spec": json.loads(init.stdout)["spec"]}}))
    return cfg, env, go


def on(sim: Simulator, name: str, attempt: int) -> dict[str, str] | None:
    """The environment of the job's trainer of `attempt` on instance `name`, or None."""
    return trainer_on_instance(sim, name, "vm", attempt)


def writes(sim: Simulator) -> list[str]:
    """The Compute Engine calls that changed something, once each call, sorted."""
    return compute_writes(sim, WRITES)


tool = cli_json


def test_a_preempted_spot_instance_is_swapped_for_the_spare_and_inserted_again_as_the_spare(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": SPOT})
    cfg, env, go = spared(sim, rest, tmp_path, [f"zones/{sim.zone}/instances/sp"])  # a form a user would guess
    old, spare = sim.world.instance("vm").id, sim.world.instance("sp").id
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on vm, with checkpoints")
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare")
        e = on(sim, "sp", 2)
        assert e is not None and (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"]) == ("0", "1"), e
        assert not [k for k in e if k.startswith("MEGASCALE_")], e
        resumed = int(e["TPUWATCH_STEP"])
        wait_while_watched(lambda: any(r.name == "vm" and r.id != old and r.status == "RUNNING"
                                       for r in sim.world.instances())
                           and (m := job_memory(tmp_path / "state", "vm")) is not None and not m.limp.remaking,
                           proc, "vm inserted again, and seen so", timeout=120)
        mem = job_memory(tmp_path / "state", "vm")
        assert mem is not None and mem.limp.swapped == (("vm", "sp"),), mem.limp
        assert on(sim, "sp", 2) is not None and on(sim, "vm", 3) is None  # not moved back
        shown = tool(cfg, env, "status")
        assert [(n["name"], n["kind"]) for n in shown["nodes"]] == [("vm", "instance"), ("sp", "instance")], shown
        assert "on spares: vm -> sp" in shown["nodes"][0]["job"]["job"], shown["nodes"][0]["job"]
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "slice 0 (vm) on sp instead of vm (PREEMPTED)" in out, out
    # nothing deleted nor inserted on the job's path: the relaunch on the spare came first
    assert out.index("launched attempt 2") < out.index("deleting spare vm"), out
    assert "deleting it to create it again from [tpu.compute_spec.instance]" in out, out
    assert writes(sim) == ["Instances/Delete", "Instances/Insert"], sim.world.calls
    vm = sim.world.instance("vm")
    assert sim.world.instance("sp").id == spare  # the spare the job ran on was never touched
    assert vm.labels["tpuwatch-job"] == "vm" and vm.provisioning_model == "SPOT" and vm.machine_type == \
        sim.world.instance("sp").machine_type
    assert vm.metadata["tpuwatch-launch"] == "false"  # a spare's startup script never starts the job at boot
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    assert done[1]["start_step"] == resumed and resumed >= 10, done


def test_a_spare_of_another_machine_type_or_not_owned_is_never_used_and_said(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": SPOT})
    sim.world.add_instance("sp-big", "tpu7x-standard-8t", body={"labels": {"tpuwatch-job": "vm"}})
    sim.world.add_instance("sp-other", body={"labels": {"tpuwatch-job": "someone-else"}})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp-big", "sp-other"], spec=False)
    (go / "100").touch()
    report = tool(cfg, env, "check")
    machine = sim.world.instance("vm").machine_type
    assert report["spares"] == {"swapped": {}, "idle": [
        {"name": "sp-big", "state": "READY", "health": "HEALTHY",
         "unfit": f"a tpu7x-standard-8t, not the job's {machine}"},
        {"name": "sp-other", "state": "READY", "health": "HEALTHY",
         "unfit": "not owned by job vm (its ownership label says someone-else)"}]}, report["spares"]
    sim.world.preempt_instance("vm")
    sim.world.wait_instance("vm", "TERMINATED", timeout=30)
    for _ in range(2):
        again = tool(cfg, env, "check")
        assert again["row"] not in ("swap", "spare_remake"), again
        assert again["spares"]["swapped"] == {}, again
    assert on(sim, "sp-big", 2) is None and on(sim, "sp-other", 2) is None
    assert writes(sim) == [], sim.world.calls


def test_a_spot_instance_google_deletes_at_its_preemption_is_swapped_for_the_spare_and_inserted_again(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Termination action DELETE: Google deletes the preempted VM itself. The job moves to the
    spare, and the VM Google deleted is inserted again as the spare."""
    deletes = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": deletes})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    old = sim.world.instance("vm").id
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on vm, with checkpoints")
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare")
        wait_while_watched(lambda: any(r.name == "vm" and r.id != old and r.status == "RUNNING"
                                       for r in sim.world.instances())
                           and (m := job_memory(tmp_path / "state", "vm")) is not None and not m.limp.remaking,
                           proc, "vm inserted again, and seen so", timeout=120)
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "slice 0 (vm) on sp instead of vm" in out, out
    assert writes(sim) == ["Instances/Insert"], sim.world.calls  # Google deleted it; tpuwatch inserts it again
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done


def test_a_spot_instance_google_deletes_with_no_spare_free_is_waited_for_and_inserted_again(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Termination action DELETE and no spare free (the spare is labelled another job's): the VM
    Google deleted is journaled to be inserted again once the audit log says so, the job waits for
    it (row spare_wait), and resumes there. It stopped for a person (the rows never recreate a
    pool's node)."""
    deletes = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": deletes})
    sim.world.add_instance("sp", body={"labels": {"tpuwatch-job": "other"}, "scheduling": deletes})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    old = sim.world.instance("vm").id
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on vm, with checkpoints")
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "vm", 2) is not None, proc, "attempt 2 on vm, inserted again", timeout=120)
        assert sim.world.instance("vm").id != old
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "waiting for vm to be made again" in out, out
    assert writes(sim) == ["Instances/Insert"], sim.world.calls  # Google deleted it; tpuwatch inserts it again
    assert sim.world.instance("sp").labels == {"tpuwatch-job": "other"}
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done


def test_a_spare_google_deleted_while_no_watcher_looked_is_swapped_away_from_on_the_audit_logs_word(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """The job runs on spare sp (its VM vm preempted, deleted by Google and inserted again) when sp
    is preempted too while its watcher is down: the next watcher finds sp gone, and the audit
    log's entry on sp's preemption (sp is the slot's VM now) is Google's word for it: the job moves
    back onto vm at once, not held 3 min and stopped as for a person's deletion."""
    deletes = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": deletes})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    old = sim.world.instance("vm").id
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on vm, with checkpoints")
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare")
        wait_while_watched(lambda: any(r.name == "vm" and r.id != old and r.status == "RUNNING"
                                       for r in sim.world.instances())
                           and (m := job_memory(tmp_path / "state", "vm")) is not None and not m.limp.remaking,
                           proc, "vm inserted again, and seen so", timeout=120)
        proc.kill()  # the watcher down (a crash, a reboot of the machine it runs on)
        proc.wait()
        sim.world.preempt_instance("sp")
        sim.world.wait_for(lambda w: not any(r.name == "sp" for r in w.instances()), timeout=30)
        proc = watch_process(cfg, env)
        wait_while_watched(lambda: on(sim, "vm", 3) is not None, proc, "attempt 3 on vm, made again", timeout=60)
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "slice 0 (vm) on vm instead of sp" in out, out
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False)] * 2 + [("success", False)], done


def test_a_spare_insert_that_meets_a_stockout_is_tried_again_until_it_is_served(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """The preempted VM, swapped out, is deleted and inserted again while the zone has no capacity:
    each insert's operation ends ZONE_RESOURCE_POOL_EXHAUSTED and the VM is gone again; tpuwatch
    inserts it again (backoff) until the stockout ends, while the job runs on the spare."""
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": SPOT})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    insert = "compute.v1.Instances/Insert"
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and len(checkpoint_steps(sim.bucket / "ck")) >= 2,
                           proc, "attempt 1 on vm, with checkpoints")
        sim.world.stockout()
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare")
        wait_while_watched(lambda: sim.world.calls[insert] >= 3, proc, "three inserts that came to nothing")
        assert not [r for r in sim.world.instances() if r.name == "vm" and r.status == "RUNNING"]
        assert on(sim, "sp", 2) is not None
        mem = job_memory(tmp_path / "state", "vm")
        assert mem is not None and mem.limp.remaking == ("vm",) and mem.limp.remake_tries >= 3, mem.limp
        sim.world.clear_errors()
        wait_while_watched(lambda: any(r.name == "vm" and r.status == "RUNNING" for r in sim.world.instances())
                           and (m := job_memory(tmp_path / "state", "vm")) is not None and not m.limp.remaking,
                           proc, "vm inserted once the stockout ended", timeout=120)
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert sim.world.calls["compute.v1.Instances/Delete"] == 1, sim.world.calls  # deleted once, inserted until served
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done


def test_a_spare_instance_whose_launch_checks_fail_is_skipped_for_the_next_one(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    for name in ("vm", "sp-bad", "sp-ok"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": SPOT})
    sim.world.bad_host("sp-bad", "device-missing")  # a chip's device file is gone on that spare
    cfg, env, go = spared(sim, rest, tmp_path, ["sp-bad", "sp-ok"], spec=False)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None, proc, "attempt 1 on vm")
        sim.world.preempt_instance("vm")
        wait_while_watched(lambda: on(sim, "sp-ok", 2) is not None, proc, "attempt 2 on the good spare")
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "launch-time checks fail on spare sp-bad (slice 0, vm)" in out, out
    assert "slice 0 (vm) on sp-ok instead of" in out, out
    assert on(sim, "sp-bad", 2) is None and not sim.hosts.pids(f"{sim.project}/{sim.zone}/instances/sp-bad", 0)
    mem = job_memory(tmp_path / "state", "vm")
    assert mem is not None and mem.limp.swapped == (("vm", "sp-ok"),) and mem.limp.bad[0].startswith("sp-bad@")
    assert writes(sim) == [], sim.world.calls


def test_an_announced_maintenance_moves_the_job_onto_the_spare_instance_and_starts_it_idle(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A maintenance announced for vm a week away (upcomingMaintenance): at the job's next complete
    checkpoint the job moves onto the spare, and vm's maintenance starts at once, idle
    (instances.performMaintenance on vm, never on the spare the job runs on)."""
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"], spec=False)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None, proc, "attempt 1 on vm")
        sim.world.schedule_instance_maintenance("vm", starts_in=7 * 86400.0, heal_after=600.0)
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "vm")) is not None
                           and m.maintenance.early_window is not None, proc, "the watcher waiting for a checkpoint")
        (go / "100").touch()  # the job trains on: its next checkpoint is the moment
        wait_while_watched(lambda: on(sim, "sp", 2) is not None, proc, "attempt 2 on the spare")
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    done = tool(cfg, env, "history")["attempts"]
    assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    assert "onto a spare ahead of a maintenance" in str(done[0]["reason"]), done
    assert done[1]["start_step"] >= done[0]["end_step"], done  # no step lost
    assert "started the maintenance of instance vm" in out, out
    assert sim.world.calls["compute.v1.Instances/PerformMaintenance"] == 1 and sim.world.instance("sp").status == \
        "RUNNING", sim.world.calls
    assert writes(sim) == ["Instances/PerformMaintenance"], sim.world.calls


def test_an_idle_spare_instances_announced_maintenance_is_started_at_once_and_the_job_runs_on(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A maintenance announced for the idle spare instance a week away: tpuwatch starts it now,
    once (instances.performMaintenance on sp, never on vm the job runs on); the job runs on."""
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"], spec=False)
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None, proc, "attempt 1 on vm")
        sim.world.schedule_instance_maintenance("sp", starts_in=7 * 86400.0, heal_after=600.0)
        wait_while_watched(lambda: sim.world.calls.get("compute.v1.Instances/PerformMaintenance", 0) == 1, proc,
                           "the maintenance of sp started")
        assert on(sim, "vm", 1) is not None  # the job runs on, untouched
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert "started the maintenance of instance sp" in out, out
    assert [(a["outcome"], a["charged"]) for a in tool(cfg, env, "history")["attempts"]] == [("success", False)]
    assert writes(sim) == ["Instances/PerformMaintenance"], sim.world.calls


def test_a_spare_google_may_delete_that_a_person_deletes_is_never_inserted_again(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """An idle Spot spare with termination action DELETE that a person deletes goes as one Google
    preempts (stopping, then gone), but the audit log says nothing of it: it waits for Google's
    word, and is never inserted again meanwhile."""
    deletes = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": deletes})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None and (m := job_memory(tmp_path / "state", "vm"))
                           is not None and m.limp.deletes == ("sp",), proc, "attempt 1 on vm, the spare seen")
        sim.world.delete_instance(sim.project, sim.zone, "sp")  # a person's instances.delete
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "vm")) is not None
                           and m.limp.vanished == ("sp",), proc, "the spare seen gone, Google's word waited for")
        assert writes(sim) == [], sim.world.calls  # no insert (the person's delete is the world's, not a call)
        assert (m := job_memory(tmp_path / "state", "vm")) is not None and m.limp.remaking == ()
        (go / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert writes(sim) == [], sim.world.calls
    assert not any(r.name == "sp" for r in sim.world.instances())


def test_a_persons_delete_of_the_jobs_spot_vm_is_never_swapped_away_from(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A person's instances.delete of the job's Spot VM (termination action STOP) stops it as
    Google's preemption does, but ends with it gone, not TERMINATED. With a spare free the job
    waits while it stops (no swap: `spot_stopping`), and once it is gone with no word from Google
    stops for a person (`node_missing`): nothing deleted, inserted, nor run on the spare."""
    for name in ("vm", "sp"):
        sim.world.add_instance(name, body={"labels": {"tpuwatch-job": "vm"}, "scheduling": SPOT})
    cfg, env, go = spared(sim, rest, tmp_path, ["sp"])
    spare = sim.world.instance("sp").id
    proc = watch_process(cfg, env)
    try:
        wait_while_watched(lambda: on(sim, "vm", 1) is not None, proc, "attempt 1 on vm")
        sim.world.delays["delete"] = 1e9  # the person's delete stays STOPPING until removed below
        sim.world.delete_instance(sim.project, sim.zone, "vm")  # a person's: no system event
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "vm")) is not None
                           and "Spot VM stopping" in m.reason, proc, "the VM seen stopping")
        mem = job_memory(tmp_path / "state", "vm")
        assert mem is not None and mem.limp.swapped == () and writes(sim) == [], (mem.limp, sim.world.calls)
        sim.world.remove_instance("vm")
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1 and "never recreates a node a person deleted" in out, out
    assert writes(sim) == [] and on(sim, "sp", 2) is None, sim.world.calls
    assert sim.world.instance("sp").id == spare and not any(r.name == "vm" for r in sim.world.instances())


@pytest.mark.parametrize(("custom", "spares"), [("vm.corp.example", "sp.corp.example"), ("trainer.corp.example", "")])
def test_a_spare_is_inserted_with_a_hostname_of_its_own_never_the_jobs_vms(
        sim: Simulator, rest: RestFace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, custom: str,
        spares: str) -> None:
    """The job's VM has a custom hostname, which `init` captures: a spare made from that spec
    takes its own name in its place (or the default, its own name, when the hostname is not the
    VM's name), never the job's VM's; the job's VM made again keeps its own."""
    from tpuwatch.cloud.compute.adapter import ComputeAdapter
    from tpuwatch.config import load_config
    from tpuwatch.recreate import start_spare_create

    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "hostname": custom})
    cfg, env, _ = spared(sim, rest, tmp_path, ["sp"])
    assert sim.world.instance("vm").hostname == custom
    monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", env["TPUWATCH_COMPUTE_EMULATOR"])
    config = load_config(cfg)
    assert config.tpu["compute_spec"]["instance"]["hostname"] == custom  # as init saw it
    start_spare_create(ComputeAdapter(sim.project, sim.zone, "instance"), config, "sp", sim.zone)
    sim.world.wait_for(lambda w: any(r.name == "sp" for r in w.instances()), timeout=30)
    assert sim.world.instance("sp").hostname == spares
    assert sim.world.instance("vm").hostname == custom
