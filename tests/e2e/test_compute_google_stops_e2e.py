"""End to end on Compute Engine: Google's own stops, told from a person's. A Spot VM whose
termination action is DELETE, deleted by Google as its preemption, and a flex-start VM deleted at
the end of its run, are made again from the saved spec (a disruption, uncharged) under `watch` and
under cron `check` alike.

Each test reads its outcome from the journal (`history --json`), the trainer's checkpoints and the
simulated world (instance ids, the calls it counted).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import STEPS, finish, job_memory
from test_compute_e2e import CeJob, ids, wait, writes

from tpuwatch.cloud.logs import rfc3339_ns
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def check(job: CeJob) -> dict[str, Any]:
    """One cron tick: `tpuwatch check --json`, a fresh process; never "needs a person" (exit 1)."""
    r = cli_process.run(["check", "-c", str(job.cfg), "--json"], job.env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def checks_until(job: CeJob, done: Any, what: str, timeout: float = 120) -> list[str]:
    rows: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        report = check(job)
        rows.append(report["row"])
        if done(report):
            return rows
        assert time.monotonic() < deadline, f"timed out waiting for {what}; rows: {rows}"
        time.sleep(0.2)


SPOT_DELETE = {"labels": {"tpuwatch-job": "vm"},
               "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}}


def assert_waited_then_made_again(rows: list[str]) -> None:
    """The ticks after the VM went: waiting for the audit log's word (its entry may be read a
    tick late), then made again, never "a person deleted it"."""
    assert "google_deleted" in rows, rows
    first = rows.index("google_deleted")
    assert set(rows[:first]) <= {"google_delete_wait"} and rows.count("google_deleted") == 1, rows


def assert_made_again_once(job: CeJob, sim: Simulator, before: dict[str, int]) -> None:
    """Google deleted the VM and tpuwatch made it again: one insert, no delete of its own, the
    first attempt a disruption (uncharged), the job resumed from a checkpoint and finished."""
    history = job.history()
    first, second = history["attempts"][:2]
    assert first["outcome"] == "disruption" and first["charged"] is False, history["attempts"]
    assert second["start_step"] is not None and second["start_step"] >= 10, second
    assert "google_deleted" in json.dumps(history), history
    assert ids(sim)["vm"] != before["vm"]
    assert writes(sim) == ["compute.v1.Instances/Insert"], writes(sim)
    assert job.steps_done()[-1] == STEPS


def test_a_spot_vm_deleted_by_its_preemption_is_made_again_under_watch(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body=SPOT_DELETE)
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.preempt_instance("vm")  # compute.instances.preempted, STOPPING to DELETED, then gone
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0 and "never recreates a node a person deleted" not in out, out
    assert_made_again_once(job, sim, before)


def test_a_spot_vm_deleted_by_its_preemption_is_made_again_under_cron_check(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body=SPOT_DELETE)
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    checks_until(job, lambda r: len(job.steps_done()) >= 2, "two checkpoints")
    sim.world.preempt_instance("vm")
    sim.world.wait_for(lambda w: not w.instances(), 10, "the preempted VM gone")  # the next tick finds it gone
    job.release()
    rows = checks_until(job, lambda r: r["phase"] == "done", "the job done", timeout=180)
    assert_waited_then_made_again(rows)
    assert_made_again_once(job, sim, before)


def add_flex_start_vm(sim: Simulator) -> int:
    """A flex-start VM "vm" whose `terminationTime` is 2 s from now (ns since the epoch, returned),
    its termination action held by the simulator until `end_run` (it runs on past that time, as
    for the moments Google's action lags): the run ends once the job has saved its checkpoints,
    never at a wall-clock time the job races."""
    ends = time.time_ns() + 2_000_000_000
    sim.world.hold_run_end("vm")
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": {
        "provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE", "terminationTime": rfc3339_ns(ends)}})
    return ends


def end_run(sim: Simulator, ends: int) -> None:
    """Google's end of the VM's run (deleted, no audit entry), once its terminationTime is past:
    tpuwatch tells it from a person's deletion by that time alone, and drops it from the spec it
    inserts again from (an insert with a terminationTime gone by is refused)."""
    time.sleep(max(0.0, (ends - time.time_ns()) / 1e9) + 0.01)  # as a rule long past by now
    assert "vm" in ids(sim)  # still running: its end waited for this call
    sim.world.end_run_duration("vm")


def test_a_flex_start_vm_whose_run_ended_is_made_again_under_cron_check(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    ends = add_flex_start_vm(sim)
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    checks_until(job, lambda r: len(job.steps_done()) >= 2, "two checkpoints")
    end_run(sim, ends)
    sim.world.wait_for(lambda w: not w.instances(), 30, "the flex-start VM gone at the end of its run")
    job.release()
    rows = checks_until(job, lambda r: r["phase"] == "done", "the job done", timeout=180)
    assert_waited_then_made_again(rows)
    assert_made_again_once(job, sim, before)
    assert "its run ended at" in json.dumps(job.history())  # told by its terminationTime gone by, nothing else


def test_a_flex_start_vm_whose_run_ended_is_made_again_under_watch(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    ends = add_flex_start_vm(sim)
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    end_run(sim, ends)
    wait(lambda: ids(sim).get("vm", 0) not in (0, before["vm"]), "the VM made again", proc, timeout=60)
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    assert_made_again_once(job, sim, before)


def test_a_standard_vm_a_host_error_stopped_without_automatic_restart_is_started_again_not_recreated(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": {"automaticRestart": False}})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.host_error("vm")  # TERMINATED with compute.instances.hostError; Compute Engine will not restart it
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    assert ids(sim) == before and writes(sim) == [], writes(sim)  # the same VM: nothing deleted or inserted
    assert sim.world.calls["compute.v1.Instances/Start"] == 1, sim.world.calls
    assert "google_stopped_start" in json.dumps(job.history())
    assert job.steps_done()[-1] == STEPS


def test_under_cron_check_a_host_error_stop_is_started_once_and_dry_run_only_says_it(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": {"automaticRestart": False}})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    checks_until(job, lambda r: len(job.steps_done()) >= 2, "two checkpoints")
    sim.world.host_error("vm")
    job.release()

    def dry() -> dict[str, Any]:
        r = cli_process.run(["check", "-c", str(job.cfg), "--dry-run", "--json"], job.env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    deadline = time.monotonic() + 60
    while (said := dry())["row"] != "google_stopped_start":  # until the audit entry is read
        assert time.monotonic() < deadline and said["row"] in ("person_stopped", "running"), said["row"]
    assert any(d.startswith("would start_node") for d in said["done"]), said["done"]
    assert sim.world.calls["compute.v1.Instances/Start"] == 0  # a dry run only says it
    rows = checks_until(job, lambda r: r["phase"] == "done", "the job done", timeout=180)
    assert rows.count("google_stopped_start") == 1 and "repair_timeout" not in rows, rows
    assert sim.world.calls["compute.v1.Instances/Start"] == 1  # once, journaled before the call
    job.assert_resumed_uncharged("")
    assert ids(sim) == before and writes(sim) == [] and job.steps_done()[-1] == STEPS


def test_a_vm_a_person_stopped_is_left_alone_never_started(sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}, "scheduling": {"automaticRestart": False}})
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    checks_until(job, lambda r: len(job.steps_done()) >= 1, "a checkpoint")
    sim.world.stop_instance(sim.project, sim.zone, "vm")  # instances.stop: a person's, no system event
    sim.world.wait_instance("vm", "TERMINATED")
    rows = [check(job)["row"] for _ in range(4)]  # each reads the audit log (a stop first seen: every 2 s)
    time.sleep(2.1)
    rows.append(check(job)["row"])
    assert set(rows[1:]) == {"person_stopped"}, rows
    assert sim.world.calls["compute.v1.Instances/Start"] == 0 and writes(sim) == [], writes(sim)


@pytest.mark.parametrize("case", ["spot_stop_instance", "spot_mig_doing_nothing", "mig_repaired_by_google"])
def test_under_cron_check_each_stop_keeps_the_job_to_its_last_step_with_no_needless_write(
        case: str, sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """The cron twins of the watch tests of Google's stops (tests/e2e/test_compute_e2e.py): a Spot
    instance preempted with termination action STOP (deleted and made again), a Spot MIG that does
    nothing on failure (one recreateInstances, the MIG kept), a 4-VM MIG whose autoheal recreates
    the slice (no write at all). Each `check` is a fresh process."""
    w = sim.world
    if case == "spot_stop_instance":
        w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"},
                                   "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
        kind, name = "instance", "vm"
    else:
        mig = w.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"},
                        spot=case == "spot_mig_doing_nothing",
                        on_failure="DO_NOTHING" if case == "spot_mig_doing_nothing" else "")
        kind, name = "mig", "slice"
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, kind, name, hold_at=10)
    if kind == "instance":
        job.capture_spec()
    # a tick has seen the attempt running (not only launched) before the slice goes
    checks_until(job, lambda r: r["row"] == "running" and len(job.steps_done()) >= 2, "the job running")
    if case == "spot_stop_instance":
        w.preempt_instance("vm")
        expected = ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"]
    elif case == "spot_mig_doing_nothing":
        w.preempt_instance(sorted(mig.members)[0])
        expected = ["compute.v1.InstanceGroupManagers/RecreateInstances"]
    else:
        w.autoheal("slice", sorted(mig.members)[3])  # the whole slice recreated by its MIG
        # released only once the old VMs are gone: the held job must not finish on them first
        w.wait_for(lambda ww: all(before.get(r.name) not in (None, r.id) for r in ww.instances())
                   and len(ww.instances()) == len(before), 60, "the MIG's remake")
        expected = []
    job.release()
    rows = checks_until(job, lambda r: r["phase"] == "done", "the job done", timeout=240)
    assert not {"node_missing", "person_stopped", "someone_deleting"} & set(rows), rows
    job.assert_resumed_uncharged("")
    assert job.steps_done()[-1] == STEPS
    assert writes(sim) == expected, writes(sim)
    after = ids(sim)
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)  # every VM made again, once


def test_under_cron_check_a_spot_vm_with_delete_a_person_deletes_is_never_inserted_on_the_sighting(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A person's instances.delete of the job's Spot VM with termination action DELETE looks like
    its preemption (stopping, then gone) but the system-event log says nothing: seen going, then
    gone, it waits for Google's word (google_delete_wait) and is not inserted again meanwhile
    (past the wait it stops for a person: tests/policy/test_policy_google.py)."""
    sim.world.add_instance("vm", body=SPOT_DELETE)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    checks_until(job, lambda r: r["row"] == "running" and len(job.steps_done()) >= 2, "the job running")
    sim.world.delays["delete"] = 1e9  # the person's delete stays STOPPING until removed below
    sim.world.delete_instance(sim.project, sim.zone, "vm")  # a person's: no system event
    assert check(job)["row"] == "google_deleting"  # seen going, as a preemption would be
    sim.world.remove_instance("vm")

    def log_read_since_gone(report: dict[str, Any]) -> bool:  # the tick read the audit log after it found it gone
        assert report["row"] == "google_delete_wait", report["summary"]
        m = job_memory(tmp_path / "state", "vm")
        return (m is not None and m.google.missing_since is not None and m.marks.audit_read_at is not None
                and m.marks.audit_read_at > m.google.missing_since)

    checks_until(job, log_read_since_gone, "the audit log read with the VM gone", timeout=60)
    mem = job_memory(tmp_path / "state", "vm")
    assert mem is not None and mem.google.deleted == "", mem.google
    assert writes(sim) == [] and "vm" not in ids(sim), writes(sim)


SPOT_STOP = {"labels": {"tpuwatch-job": "vm"},
             "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}}


def test_under_cron_check_a_spot_vm_with_stop_a_person_deletes_is_waited_for_then_stops_for_a_person(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A person's instances.delete of the job's Spot VM with termination action STOP: STOPPING until
    it is gone, as Google's preemption is until TERMINATED. While it stops nothing is sent to it (no
    delete beside the person's, no insert); once gone, with no word from Google, the job stops for
    a person (node_missing): the VM is never made again."""
    sim.world.add_instance("vm", body=SPOT_STOP)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    checks_until(job, lambda r: r["row"] == "running" and len(job.steps_done()) >= 2, "the job running")
    sim.world.delays["delete"] = 1e9  # the person's delete stays STOPPING until removed below
    sim.world.delete_instance(sim.project, sim.zone, "vm")  # a person's: no system event
    rows = [check(job)["row"] for _ in range(3)]
    assert set(rows) == {"spot_stopping"}, rows
    assert writes(sim) == [] and sim.world.instance("vm").status == "STOPPING", writes(sim)
    sim.world.remove_instance("vm")
    r = cli_process.run(["check", "-c", str(job.cfg), "--json"], job.env, timeout=120)
    assert r.returncode == 1 and json.loads(r.stdout)["row"] == "node_missing", r.stdout + r.stderr
    assert writes(sim) == [] and "vm" not in ids(sim), writes(sim)


def test_under_cron_check_a_spot_vm_with_stop_is_made_again_only_once_its_preemption_ends_terminated(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Google's preemption of a Spot VM with termination action STOP shows STOPPING before
    TERMINATED: waited for while it stops (nothing sent to it), then deleted and made again."""
    sim.world.add_instance("vm", body=SPOT_STOP)
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    checks_until(job, lambda r: r["row"] == "running" and len(job.steps_done()) >= 2, "the job running")
    sim.world.preempt_instance("vm", stopping=1e9)  # STOPPING until end_stopping below
    assert [check(job)["row"] for _ in range(2)] == ["spot_stopping"] * 2
    assert writes(sim) == [], writes(sim)
    sim.world.end_stopping("vm")
    job.release()
    rows = checks_until(job, lambda r: r["phase"] == "done", "the job done", timeout=240)
    assert "dead_node" in rows and "node_missing" not in rows, rows
    assert writes(sim) == ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"], writes(sim)
    assert ids(sim)["vm"] != before["vm"] and job.steps_done()[-1] == STEPS
    job.assert_resumed_uncharged("")


def test_under_cron_check_a_spot_vm_stuck_stopping_is_said_then_left_to_a_person_past_operation_timeout(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A Spot VM (termination action STOP) whose preemption never ends (STOPPING on and on): the
    wait is said once it has lasted half of recovery.operation_timeout (row `spot_stopping_long`,
    its journal event the `stopping_long` alert, naming the VM), and past operation_timeout a
    person is asked (exit 1); nothing is ever sent to it."""
    from tpuwatch.journal import Journal

    sim.world.add_instance("vm", body=SPOT_STOP)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10, operation_timeout="6s")
    job.capture_spec()
    checks_until(job, lambda r: r["row"] == "running" and len(job.steps_done()) >= 2, "the job running")
    sim.world.preempt_instance("vm", stopping=1e9)  # STOPPING until the test ends
    rows = checks_until(job, lambda r: r["row"] == "spot_stopping_long", "the stop said to last long", timeout=40)
    assert rows[-2] == "spot_stopping", rows
    deadline = time.monotonic() + 120
    while True:  # each `check` a fresh process, as cron runs it; the last one asks for a person
        r = cli_process.run(["check", "-c", str(job.cfg), "--json"], job.env, timeout=120)
        if r.returncode != 0:
            break
        assert json.loads(r.stdout)["row"] == "spot_stopping_long", r.stdout
        assert time.monotonic() < deadline, "timed out waiting for the stop's time limit"
        time.sleep(0.2)
    assert r.returncode == 1 and json.loads(r.stdout)["row"] == "spot_stopping_timeout", r.stdout + r.stderr
    assert "Spot VM vm has been stopping for" in r.stdout and "recovery.operation_timeout" in r.stdout
    assert writes(sim) == [] and sim.world.instance("vm").status == "STOPPING", writes(sim)
    with Journal.open(tmp_path / "state", "vm", "vm", readonly=True) as journal:
        said = [e for e in journal.events() if e.kind == "wait" and e.data.get("reason") == "a Spot VM stopping for long"]
    assert len(said) == 1 and "vm has been stopping for" in said[0].reason, said
