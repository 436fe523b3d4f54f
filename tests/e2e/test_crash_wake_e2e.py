"""End to end: a crash is noticed the moment it happens, not at the next poll.

`tpuwatch watch` with a one-hour poll_interval, the simulator's workers over real ssh, and the
toy trainer set to segfault once on worker 0. Only the follow channels (workers/ends.py) can
end the wait between ticks: without them the watcher would sleep until its next poll (10
minutes after a launch, an hour while running) and the test would time out. A trainer killed
by SIGKILL (no exit code of its own) is relaunched as soon: no second look at the node is
waited for first (a sixth of the poll, 10 minutes here).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


def test_a_segfault_wakes_a_watcher_polling_hourly_and_the_job_is_relaunched(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    job = Job(sim, tmp_path, f"--segfault-at 25 --fault-worker 0 --crash-once {marker}", poll_interval="1h")
    rc, out = finish(job.watch(), timeout=120)
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert len(attempts) == 2, attempts
    assert attempts[0]["exit_code"] == 139 and attempts[0]["charged"], attempts
    assert attempts[1]["start_step"] is not None and attempts[1]["start_step"] >= 10, attempts
    assert job.steps_done()[-1] == STEPS
    assert marker.exists()


def test_a_trainer_killed_by_sigkill_is_relaunched_at_once_and_charged(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100_000, poll_interval="1h")
    proc = job.watch()
    try:
        job.wait(lambda: len(job.job_processes()) == 4 and len(job.steps_done()) >= 2,
                 what="the job running on 4 workers with two checkpoints")
        before = {pid for pids in job.job_processes().values() for pid in pids}
        for pid in job.job_processes()[3]:
            os.kill(pid, signal.SIGKILL)  # as the OOM killer does
        job.wait(lambda: len(job.job_processes()) == 4 and not before & {
            pid for pids in job.job_processes().values() for pid in pids}, what="attempt 2 running on every worker")
    finally:
        proc.terminate()
    finish(proc)
    attempts = job.history()["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["exit_code"] == 137 and attempts[0]["charged"], attempts
