"""End to end on Compute Engine: acting before maintenance on a TPU7x MIG of 4 VMs, against the
simulator's Compute Engine REST face with the real `google-cloud-compute` client and real ssh.

- A reschedulable maintenance announced on the slice's instances is started early
  (`instances.performMaintenance`) right after the job's next checkpoint; the job resumes from
  that checkpoint, uncharged; the notice is shown by `status` as a TPU node's is.
- A refused early start falls back to the notice and never ends the watch.
- `tpuwatch drill` runs `instances.simulateMaintenanceEvent` on the worker's instance and times
  the recovery.

The trainer is held at steps 10 and 20 (`--hold-at`), so each fault meets it where the test says.
Outcomes are read from the journal, the trainer's checkpoints and the simulated world.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import STEPS, finish
from test_compute_e2e import CeJob, ids, wait, writes

from tpuwatch.errors import NotFoundError
from tpuwatch.journal import Journal
from tpuwatch.policy import Memory, Phase
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

PERFORM = "compute.v1.Instances/PerformMaintenance"
SIMULATE = "compute.v1.Instances/SimulateMaintenanceEvent"


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def slice_job(sim: Simulator, rest: RestFace, tmp: Path) -> tuple[list[str], CeJob]:
    """A TPU7x multi-host MIG of 4 VMs (2x2x4) owned by job "slice", whose trainer holds at
    steps 10 and 20 until released."""
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    job = CeJob(sim, rest, tmp, "mig", "slice", hold_at=10)
    job.cfg.write_text(job.cfg.read_text().replace("--hold-at 10 ", "--hold-at 10,20 "))
    return sorted(mig.members), job


def memory(job: CeJob) -> Memory | None:
    try:
        with Journal.open(Path(job.env["TPUWATCH_STATE_DIR"]), "slice", None, readonly=True) as j:
            return j.load_memory()
    except NotFoundError:
        return None


def cli(job: CeJob, *args: str) -> str:
    r = cli_process.run([*args, "-c", str(job.cfg)], job.env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def release(job: CeJob, step: int) -> None:
    (job.go / str(step)).touch()


def announce(sim: Simulator, names: list[str]) -> None:
    """Google announces a reschedulable maintenance on every VM of the slice, a week ahead."""
    for name in names:
        sim.world.schedule_instance_maintenance(name, starts_in=7 * 86400.0)


def test_a_maintenance_on_a_tpu7x_mig_starts_early_at_a_checkpoint_and_the_job_resumes_from_it(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    names, job = slice_job(sim, rest, tmp_path)
    before = ids(sim)
    proc = job.watch()
    wait(lambda: 10 in job.steps_done(), "the checkpoint at step 10", proc)
    announce(sim, names)
    # seen while the job holds at step 10: it waits for a checkpoint newer than that one
    wait(lambda: (m := memory(job)) is not None and m.maintenance.early_window is not None, "the notice seen", proc)
    # shown as for a TPU node: status (text and --json)
    node = json.loads(cli(job, "status", "--json"))["nodes"][0]
    um = node["upcoming_maintenance"]
    assert (um["type"], um["status"], um["can_start_early"]) == ("SCHEDULED", "PENDING", True), node
    assert "upcoming" in cli(job, "status"), "the text status shows the notice"
    release(job, 10)  # on to step 20, saved, held there: the maintenance starts
    wait(lambda: (m := memory(job)) is not None and m.attempt.number == 2 and m.phase is Phase.RUNNING
         and m.attempt.seen, "the job running again", proc, timeout=90)
    release(job, 20)
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"]) == ("disruption", False), first
    assert "maintenance started early by tpuwatch (checkpoint step 20" in first["reason"], first
    assert first["end_step"] == 20 and second["start_step"] == 20, hist["attempts"]  # resumed from it
    assert not any(a["charged"] for a in hist["attempts"]), (hist["attempts"], out)
    assert job.steps_done()[-1] == STEPS
    started = [e for e in hist["events"] if e["kind"] == "maintenance_started"]
    assert len(started) == 1 and started[0]["data"]["operation"], hist["events"]
    assert "MIG slice" in started[0]["reason"], started
    kinds = [e["kind"] for e in hist["events"]]
    assert kinds.index("start_maintenance") < kinds.index("maintenance_started")  # journaled before the call
    # One call took the whole slice (Google: every VM of the slice goes into maintenance).
    assert sim.world.calls[PERFORM] == 1, dict(sim.world.calls)
    assert all(sim.world.instance(n).upcoming is None for n in names)  # done, a week before its window
    assert ids(sim) == before and writes(sim) == [], writes(sim)  # restarted by Google, nothing deleted


def test_a_refused_early_start_on_compute_engine_falls_back_to_the_notice_and_the_watch_goes_on(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    names, job = slice_job(sim, rest, tmp_path)
    sim.inject("permission-denied", methods=[PERFORM])  # no compute.instances.performMaintenance
    proc = job.watch()
    wait(lambda: 10 in job.steps_done(), "the checkpoint at step 10", proc)
    announce(sim, names)
    wait(lambda: (m := memory(job)) is not None and m.maintenance.early_window is not None, "the notice seen", proc)
    release(job, 10)
    wait(lambda: (m := memory(job)) is not None and m.maintenance.early_refused is not None, "the refusal", proc, timeout=90)
    release(job, 20)
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    assert "cloud API failed" not in out, out
    hist = job.history()
    refusals = [e for e in hist["events"] if "could not be started early" in e["reason"]]
    assert len(refusals) == 1 and "PERMISSION_DENIED" in refusals[0]["reason"], hist["events"]
    assert "compute.instances.performMaintenance" in refusals[0]["reason"], refusals
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"]) == ("disruption", False), first
    assert second["start_step"] == first["end_step"] == 20 and len(hist["attempts"]) == 2, hist["attempts"]
    assert second["outcome"] == "success", hist["attempts"]
    assert sim.world.calls[PERFORM] == 1  # noted once for that window, not asked again
    assert all(sim.world.instance(n).upcoming is not None for n in names)  # still announced: it comes in its window


def test_google_refuses_to_start_a_maintenance_that_is_not_pending(
        sim: Simulator, rest: RestFace) -> None:
    from google.api_core import exceptions as gexc
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    sim.world.add_instance("vm")
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(),
                                        client_options=ClientOptions(api_endpoint=rest.url.rstrip("/")))
    with pytest.raises(gexc.BadRequest) as err:
        client.perform_maintenance_unary(project=sim.world.project, zone=sim.world.instance("vm").zone,
                                         instance="vm")
    assert "no pending maintenance" in str(err.value), err.value


def drill(job: CeJob, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    r = cli_process.run(["drill", "-c", str(job.cfg), *args], job.env, timeout=180)
    data = json.loads(r.stdout) if r.returncode in (0, 1) and r.stdout.startswith("{") else None
    return r.returncode, data, r.stderr


def test_a_drill_on_a_tpu7x_mig_simulates_a_maintenance_on_the_workers_instance(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    names, job = slice_job(sim, rest, tmp_path)
    before = ids(sim)
    proc = job.watch()
    try:
        wait(lambda: 10 in job.steps_done(), "the checkpoint at step 10", proc)
        release(job, 10)
        wait(lambda: 20 in job.steps_done(), "the checkpoint at step 20", proc)
        code, out, err = drill(job, "--yes", "--json", "--worker", "2")
        assert code == 0 and out is not None, err
        assert out["followed_by"] == "the running watch" and out["ok"] is True, out
        assert out["attempt"] == 2 and out["from_checkpoint"] == out["checkpoint_at_fault"] == 20, out
        assert sim.world.calls[SIMULATE] == 1, dict(sim.world.calls)
        entries = [e for e in sim.world.audit_entries() if e.resource_name.endswith(f"/instances/{names[2]}")]
        assert entries, "the simulated maintenance was on worker 2's instance"
        release(job, 20)
        rc, text = finish(proc, timeout=120)
        assert rc == 0, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    first = job.history()["attempts"][0]
    assert (first["outcome"], first["charged"]) == ("disruption", False), first
    assert ids(sim) == before and writes(sim) == [], writes(sim)


def spot_vm_job(sim: Simulator, rest: RestFace, tmp: Path, scheduling: dict[str, Any] | None = None) -> CeJob:
    """A Spot TPU VM owned by job "vm" with the spec `init` captured (so it can be inserted again),
    whose trainer saves on SIGTERM and holds at step 10 until released."""

    sim.world.add_instance("vm", body={
        "labels": {"tpuwatch-job": "vm"},
        "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP", **(scheduling or {})}})
    job = CeJob(sim, rest, tmp, "instance", "vm", hold_at=10)
    job.cfg.write_text(job.cfg.read_text().replace("--hold-at 10 ", "--save-on-term 1 --hold-at 10 "))
    job.capture_spec()
    return job


def test_a_guest_sigterm_before_the_spot_preemption_shows_is_not_the_jobs_end(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    # The guest's TERM reaches the trainer 3 s (real) before the API says TERMINATED: it saves step
    # 11 and exits 0 on a VM the API still shows RUNNING. Not the job's end: the VM is inserted
    # again and the job resumes from step 11 to its last step, nothing charged.
    job = spot_vm_job(sim, rest, tmp_path)
    before = ids(sim)
    proc = job.watch()
    wait(lambda: job.steps_done() == [0, 10], "the checkpoint at the held step", proc)
    sim.inject("preempt-instance", instance="vm", term_first="30m")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"], first["end_step"]) == ("disruption", False, 11), first
    assert "SIGTERM from outside tpuwatch on worker 0" in first["reason"], first
    assert second["start_step"] == 11 and not second["charged"], second
    assert job.steps_done()[-1] == STEPS and ids(sim)["vm"] != before["vm"]
    assert writes(sim) == ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"], writes(sim)


def test_a_spot_vms_preemption_notice_reaches_the_job_which_loses_no_step(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    # scheduling.preemptionNoticeDuration 30 min (3 s of real time at speed 600): instance/preempted
    # turns TRUE and the API shows shutdownDetails PENDING_STOP that long before the soft off. The
    # relay passes the notice to the job as SIGTERM; held at step 10, it saves step 11 and exits 0.
    # tpuwatch sees PENDING_STOP as a notice (the attempt is not ended for it), ends the attempt as a
    # disruption, inserts the VM again with the same notice duration and resumes from step 11.
    job = spot_vm_job(sim, rest, tmp_path, {"preemptionNoticeDuration": {"seconds": "1800"}})
    before = ids(sim)
    proc = job.watch()
    wait(lambda: job.steps_done() == [0, 10], "the checkpoint at the held step", proc)
    sim.inject("preempt-instance", instance="vm")  # the instance's own notice duration
    assert sim.world.instance("vm").pending_stop_ns  # PENDING_STOP while the VM runs
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"], first["end_step"]) == ("disruption", False, 11), first
    assert "notice of" in first["reason"], first
    assert second["start_step"] == 11 and not second["charged"], second  # not a step lost
    assert job.steps_done()[-1] == STEPS and ids(sim)["vm"] != before["vm"]
    assert writes(sim) == ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"], writes(sim)
    again = sim.world.instance("vm")
    assert again.preemption_notice == 1800.0 and again.provisioning_model == "SPOT"  # kept through the recreate
