"""End to end: a maintenance announced on the workers' metadata servers, real ssh, the toy trainer.

The relay beside each attempt passes the ~60 s notice to the job as SIGTERM; the trainer saves
the step it reached and exits 0 (as Orbax's save-on-preemption does); tpuwatch classifies the
end as a disruption (not done, not charged), holds the launch until the node has gone down and
come back, and resumes from the checkpoint saved at the notice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Job, finish

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200  # 8 s of training at 0.04 s a step


def test_a_maintenance_notice_costs_no_finished_step_and_no_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Speed 20: the 60 s notice lasts 3 s of real time, so the probe can see the exit 0 before
    # the host stops, however busy the machine; the node is back 5 s after it stops.
    with Simulator(root=tmp_path / "sim", speed=20, workers=True) as sim:
        for key, value in sim.env.items():
            monkeypatch.setenv(key, value)
        # Only the fresh-start checkpoint (step 0) and the last one are periodic: any other
        # checkpoint was saved because of the notice.
        job = Job(sim, tmp_path, f"--save-on-term 1 --ckpt-every {10 * STEPS}", steps=STEPS)
        proc = job.watch()
        job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
        job.wait(lambda: job.steps_done() == [0], what="the fresh start's checkpoint")
        sim.inject("maintenance", node="pod", notice="60s", heal_after="100s")
        rc, out = finish(proc, timeout=120)
        assert rc == 0, out
        attempts = job.history()["attempts"]
        assert len(attempts) == 2, attempts
        first, second = attempts
        # Saved at the notice: the step the job had reached, not a periodic checkpoint.
        saved = [s for s in job.steps_done() if s not in (0, STEPS)]
        assert len(saved) == 1 and saved[0] > 0, job.steps_done()
        assert second["start_step"] == saved[0], attempts
        assert first["end_step"] == saved[0], attempts
        # Worker 0 exited 0 after the notice: a disruption, neither done nor charged.
        assert (first["outcome"], first["charged"]) == ("disruption", False), first
        assert "notice of maintenance (TERMINATE_ON_HOST_MAINTENANCE)" in first["reason"], first
        assert not second["charged"] and job.steps_done()[-1] == STEPS
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
