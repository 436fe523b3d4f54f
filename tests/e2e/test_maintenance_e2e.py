"""End to end: a maintenance announced on the workers' metadata servers, real ssh, the toy trainer.

The relay beside each attempt passes the ~60 s notice to the job as SIGTERM; the trainer saves
the step it reached and exits 0 (as Orbax's save-on-preemption does); tpuwatch classifies the
end as a disruption (not done, not charged), holds the launch until the node has gone down and
come back, and resumes from the checkpoint saved at the notice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import STEPS as STEPS_60
from e2e_helpers import Job, finish

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200  # 8 s of training at 0.04 s a step
HELD = 20  # a job that must meet a notice holds at this step until the notice has reached it


def test_a_maintenance_notice_costs_no_finished_step_and_no_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Speed 20: the 60 s notice lasts 3 s of real time, so the probe can see the exit 0 before
    # the host stops, however busy the machine; the node is back 5 s after it stops.
    with Simulator(root=tmp_path / "sim", speed=20, workers=True) as sim:
        for key, value in sim.env.items():
            monkeypatch.setenv(key, value)
        # Only the fresh-start checkpoint (step 0) and the last one are periodic: any other
        # checkpoint was saved because of the notice. The job holds at step HELD until the
        # notice's checkpoint is there, so it meets the notice running however fast or slow the
        # machine, and the resumed attempt does not train for the notice's sake.
        job = Job(sim, tmp_path, f"--save-on-term 1 --ckpt-every {10 * STEPS_60}", steps=STEPS_60, hold_at=HELD)
        proc = job.watch()
        job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
        job.wait(lambda: job.steps_done() == [0], what="the fresh start's checkpoint")
        sim.inject("maintenance", node="pod", notice="60s", heal_after="100s")
        job.wait(lambda: [s for s in job.steps_done() if s not in (0, STEPS_60)] != [], what="the notice's checkpoint")
        job.release()
        rc, out = finish(proc, timeout=120)
        assert rc == 0, out
        attempts = job.history()["attempts"]
        assert len(attempts) == 2, attempts
        first, second = attempts
        # Saved at the notice: the step the job had reached, not a periodic checkpoint.
        saved = [s for s in job.steps_done() if s not in (0, STEPS_60)]
        assert len(saved) == 1 and saved[0] > 0, job.steps_done()
        assert second["start_step"] == saved[0], attempts
        assert first["end_step"] == saved[0], attempts
        # Worker 0 exited 0 after the notice: a disruption, neither done nor charged.
        assert (first["outcome"], first["charged"]) == ("disruption", False), first
        assert "notice of maintenance (TERMINATE_ON_HOST_MAINTENANCE)" in first["reason"], first
        assert not second["charged"] and job.steps_done()[-1] == STEPS_60
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []


def test_a_notice_through_upcoming_maintenance_alone_reaches_the_job_without_directory_queries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A TPU VM's last-minute notice is upcoming-maintenance turning ONGOING (maintenance-event stays
    # NONE), and here its metadata server also fails every directory query: the relay watches the
    # keys one by one and still passes the notice on. Speed 20: the window opens 10 s after the
    # announcement, the 100 s notice lasts 5 s, the node is back 5 s after it stops.
    with Simulator(root=tmp_path / "sim", speed=20, workers=True) as sim:
        for key, value in sim.env.items():
            monkeypatch.setenv(key, value)
        # The job holds at step HELD until the notice's checkpoint is there (see above).
        job = Job(sim, tmp_path, f"--save-on-term 1 --ckpt-every {10 * STEPS_60}", steps=STEPS_60, hold_at=HELD)
        sim.inject("metadata-directories-fail", node="pod")
        proc = job.watch()
        job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
        job.wait(lambda: job.steps_done() == [0], what="the fresh start's checkpoint")
        sim.inject("upcoming-maintenance", node="pod", starts_in="200s", can_reschedule=False, notice="100s",
                   notice_via="upcoming-maintenance", heal_after="100s")
        job.wait(lambda: [s for s in job.steps_done() if s not in (0, STEPS_60)] != [], what="the notice's checkpoint")
        job.release()
        rc, out = finish(proc, timeout=120)
        assert rc == 0, out
        first, second = job.history()["attempts"][:2]
        assert (first["outcome"], first["charged"]) == ("disruption", False), first
        assert "notice of maintenance (upcoming-maintenance ONGOING)" in first["reason"], first
        saved = [s for s in job.steps_done() if s not in (0, STEPS_60)]
        assert len(saved) == 1 and second["start_step"] == saved[0] == first["end_step"], job.steps_done()
        key = sim.node_key("pod")
        for w in range(4):
            log = (sim.hosts.worker_home(key, w) / ".tpuwatch" / "pod" / "attempt-1.log").read_text()
            assert "one by one" in log and "says MAINTENANCE_ONGOING" in log, log
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []


@pytest.mark.parametrize("poll", ["default", "8s"])
def test_a_reschedulable_maintenance_starts_early_at_a_checkpoint_boundary(
        sim: Simulator, tmp_path: Path, poll: str) -> None:
    # v6e 2x4 and larger (and any v4, v5p) may start maintenance by hand; the window opens in 7 simulated days
    # (about 17 min of real time), long after the job would have finished without it.
    # With an 8 s poll the 1 s maintenance is over between two ticks: the node's health description
    # (its maintenance time) is what says it went down and came back (the job trains long enough
    # for the notice to be seen a poll late).
    sim.world.delays["simulated_maintenance_heal"] = 600.0  # 1 s at speed 600
    steps = 100 if poll == "default" else 600
    job = Job(sim, tmp_path, steps=steps, accelerator="v6e-16", **({} if poll == "default" else {"poll_interval": poll}))
    proc = job.watch()
    job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
    job.wait(lambda: bool(job.steps_done()), what="a first checkpoint")
    announced_at = job.steps_done()[-1]
    sim.inject("upcoming-maintenance", node="pod", starts_in="7d", heal_after="10m")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"]) == ("disruption", False), first
    assert "maintenance started early by tpuwatch (checkpoint step" in first["reason"], first
    # It waited for a checkpoint newer than the one at the notice and resumed from it (or from
    # a newer one, saved while the stop reached the workers).
    assert first["end_step"] > announced_at and second["start_step"] >= first["end_step"], hist["attempts"]
    started = [e for e in hist["events"] if e["kind"] == "maintenance_started"]
    assert len(started) == 1 and started[0]["data"]["operation"], hist["events"]
    kinds = [e["kind"] for e in hist["events"]]
    assert kinds.index("start_maintenance") < kinds.index("maintenance_started")  # journaled before the call
    assert sim.world.node("pod").upcoming is None  # done, before its window
    assert not any(a["charged"] for a in hist["attempts"]) and job.steps_done()[-1] == steps


def test_a_refused_early_start_falls_back_to_the_notice_and_is_noted_once(
        sim: Simulator, tmp_path: Path) -> None:
    # v3 does not offer starting maintenance by hand: UNIMPLEMENTED.
    job = Job(sim, tmp_path, steps=100, accelerator="v3-32")
    proc = job.watch()
    job.wait(lambda: bool(job.steps_done()), what="a first checkpoint")
    sim.inject("upcoming-maintenance", node="pod", starts_in="7d")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    refusals = [e for e in hist["events"] if "could not be started early" in e["reason"]]
    assert len(refusals) == 1 and "UNIMPLEMENTED" in refusals[0]["reason"], hist["events"]
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"]) == ("disruption", False)
    assert second["start_step"] >= first["end_step"] and len(hist["attempts"]) == 2, hist["attempts"]
    assert sim.world.node("pod").upcoming is not None  # still announced: it comes in its window


def test_a_queued_resources_maintenance_starts_early_naming_its_node_by_its_short_name(
        sim: Simulator, tmp_path: Path) -> None:
    # performMaintenanceQueuedResource takes the node's short name (gcloud --node-names=node-a);
    # the simulator refuses a full resource name (INVALID_ARGUMENT).
    sim.world.delays["simulated_maintenance_heal"] = 600.0  # 1 s at speed 600
    job = Job(sim, tmp_path, steps=100, accelerator="v6e-16", queued="qr")
    proc = job.watch()
    job.wait(lambda: bool(job.steps_done()), what="a first checkpoint")
    sim.inject("upcoming-maintenance", node="pod", starts_in="7d")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    started = [e for e in hist["events"] if e["kind"] == "maintenance_started"]
    assert len(started) == 1 and "queued resource qr's node pod" in started[0]["reason"], hist["events"]
    assert not [e for e in hist["events"] if "could not be started early" in e["reason"]], hist["events"]
    assert sim.world.node("pod").upcoming is None  # done, before its window


@pytest.mark.parametrize("code, queued", [("PERMISSION_DENIED", "qr"), ("NOT_FOUND", "qr"),
                                          ("INVALID_ARGUMENT", "qr"), ("PERMISSION_DENIED", "")])
def test_any_refusal_of_an_early_start_falls_back_to_the_notice_and_never_ends_the_watch(
        sim: Simulator, tmp_path: Path, code: str, queued: str) -> None:
    # Google does not say which code a refusal carries: every code that says the same request
    # would fail again is a refusal, noted once, and the watch goes on for more ticks than the
    # cloud API may fail in a row (10) to the job's end: the job holds at step 60 until the
    # simulator has counted more node reads than that after the refused call.
    # Through the node's queued resource (performMaintenanceQueuedResource), or the node's own call.
    job = Job(sim, tmp_path, steps=100, accelerator="v6e-16", queued=queued, hold_at=60)
    sim.inject("refuse-maintenance", node="pod", code=code)
    proc = job.watch()
    job.wait(lambda: bool(job.steps_done()), what="a first checkpoint")
    sim.inject("upcoming-maintenance", node="pod", starts_in="7d")

    def asked() -> int:
        return sim.world.call_count("PerformMaintenance") + sim.world.call_count("PerformMaintenanceQueuedResource")

    job.wait(lambda: asked() > 0, what="the call to start the maintenance early")
    reads = sim.world.call_count("GetNode")
    # a steady tick reads the node once; the relaunch's ticks may read it twice
    job.wait(lambda: sim.world.call_count("GetNode") > reads + 15, what="a dozen ticks after the refusal")
    assert proc.poll() is None, "the watch ended"
    job.release()
    rc, out = finish(proc, timeout=180)
    assert rc == 0, out
    assert "cloud API failed" not in out, out
    hist = job.history()
    refusals = [e for e in hist["events"] if "could not be started early" in e["reason"]]
    assert len(refusals) == 1 and code in refusals[0]["reason"], hist["events"]
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"]) == ("disruption", False)
    assert second["start_step"] >= first["end_step"] and len(hist["attempts"]) == 2, hist["attempts"]
    assert second["outcome"] == "success", hist["attempts"]
    assert sim.world.node("pod").upcoming is not None  # still announced: it comes in its window


def test_a_guest_sigterm_before_the_preemption_shows_is_not_the_jobs_end(sim: Simulator, tmp_path: Path) -> None:
    # The guest's shutdown TERM reaches the trainer before the metadata notice and before the API
    # says PREEMPTED (3 s of real time later at speed 600): it saves step 11 and exits 0 on a node
    # the API still shows READY. That is not the job's end: the look after it sees the preemption,
    # the node is recreated and the job resumes from step 11 to its last step.
    job = Job(sim, tmp_path, "--save-on-term 1", accelerator="v4-16", spot=True, recreatable=True, hold_at=10)
    proc = job.watch()
    job.wait(lambda: job.steps_done() == [0, 10], what="the checkpoint at the held step")
    sim.inject("preempt", node="pod", term_first="30m")
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    hist = job.history()
    first, second = hist["attempts"][:2]
    assert (first["outcome"], first["charged"], first["end_step"]) == ("disruption", False, 11), first
    assert "SIGTERM from outside tpuwatch on worker" in first["reason"], first
    assert any("SIGTERM tpuwatch did not send" in e["reason"] for e in hist["events"]), hist["events"]
    assert second["start_step"] == 11 and not second["charged"], second
    assert job.steps_done()[-1] == STEPS_60 and sim.world.call_count("CreateNode") == 1
