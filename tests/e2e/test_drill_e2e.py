"""End to end: `tpuwatch drill` on the simulator (v2alpha1 simulateMaintenanceEvent), real ssh.

The recovery is followed by the drill itself when nobody watches the job, or by a running
`watch`; outcomes are read from the drill's JSON and the journal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Job

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


def drill(job: Job, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    r = job.cli("drill", "-c", str(job.cfg), *args, timeout=120)
    data = json.loads(r.stdout) if r.returncode in (0, 1) and r.stdout.startswith("{") else None
    return r.returncode, data, r.stderr


def started(job: Job) -> None:
    job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")


def test_a_drill_with_nobody_watching_runs_the_ticks_itself(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100000)
    assert json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)["row"] == "launch"
    started(job)
    code, out, err = drill(job, "--yes", "--json", "--worker", "2")
    assert code == 0 and out is not None, err
    assert out["followed_by"].startswith("this drill") and out["ok"] is True
    assert out["detected_after"] is not None and out["ran_again_after"] >= out["detected_after"]
    assert out["attempt"] == 2 and out["from_checkpoint"] >= out["checkpoint_at_fault"] >= 10
    assert out["ran_again_after"] <= out["repair_timeout"]
    attempts = job.history()["attempts"]
    assert (attempts[0]["outcome"], attempts[0]["charged"]) == ("disruption", False), attempts
    entries = [e for e in sim.world.audit_entries() if e.resource_name.endswith("/workers/2")]
    assert entries, "the simulated event was on worker 2"


def test_a_drill_while_watch_runs_reads_the_journal(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100000)
    proc = job.watch()
    try:
        started(job)
        code, out, err = drill(job, "--yes", "--json")
        assert code == 0 and out is not None, err
        assert out["followed_by"] == "the running watch" and out["attempt"] == 2 and out["ok"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_drill_refuses_what_it_must_not_touch(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100000)
    code, _, err = drill(job, "--yes")
    assert code == 1 and "is not running" in err, err  # no journal yet: nothing to time
    assert json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)["row"] == "launch"
    started(job)
    code, _, err = drill(job)  # no terminal to confirm on
    assert code == 2 and "pass --yes" in err, err
    code, _, err = drill(job, "--yes", "--worker", "9")
    assert code == 2 and "--worker" in err and "0..3" in err, err
    assert sim.world.node("pod").health == "HEALTHY" and len(job.job_processes()) == 4  # untouched
    sim.world.remove_node("pod")
    code, _, err = drill(job, "--yes")
    assert code == 1 and "no TPU named pod" in err, err


def test_a_drill_never_touches_a_node_it_does_not_own(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100000, labels={"tpuwatch-job": "someone-else"})
    code, _, err = drill(job, "--yes")
    assert code == 2 and "not this job's" in err and "someone-else" in err, err
    assert sim.world.node("pod").health == "HEALTHY" and not sim.world.audit_entries()
