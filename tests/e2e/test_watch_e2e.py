"""End to end: `tpuwatch watch` and `tpuwatch check` against the simulator, real ssh, the toy trainer.

Each test plays one recovery scenario and reads the outcome from the journal (`history
--json`), the trainer's checkpoints and the workers' processes, never from tpuwatch's own words
alone.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


def test_healed_maintenance_resumes_from_the_last_complete_checkpoint_uncharged(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, hold_at=10)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("maintenance", node="pod", heal_after=1800)  # 3 s at speed 600
    job.release()
    rc, out = finish(proc)
    assert rc == 0, out
    hist = job.history()
    attempts = hist["attempts"]
    assert len(attempts) >= 2, out
    first, second = attempts[0], attempts[1]
    assert first["outcome"] == "disruption" and first["charged"] is False, attempts
    # The relaunch resumed from a complete checkpoint saved by the first attempt.
    assert second["start_step"] is not None and second["start_step"] >= 10
    assert job.steps_done()[-1] == STEPS
    assert not any(a["charged"] for a in attempts), attempts
    assert "terminate" in out, out  # the audit log's terminate entry was read and shown


def test_a_bug_that_exits_1_at_start_stops_after_no_progress_limit_attempts(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, "--crash-at 0 --exit-code 1", no_progress_limit=3, max_restarts=10)
    rc, out = finish(job.watch())
    assert rc == 1, out
    attempts = job.history()["attempts"]
    assert len(attempts) == 3, attempts
    assert all(a["charged"] and a["exit_code"] == 1 for a in attempts), attempts
    assert "exit" in out and "1" in out
    fail = [e for e in job.history()["events"] if e["kind"] == "fail"]
    assert fail and "exit code 1" in fail[-1]["reason"] or "exit 1" in fail[-1]["reason"], fail


def test_a_segfault_mid_run_is_relaunched_and_charged_once(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    job = Job(sim, tmp_path, f"--segfault-at 25 --fault-worker 0 --crash-once {marker}")
    rc, out = finish(job.watch())
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert len(attempts) == 2, attempts
    assert attempts[0]["charged"] is True and attempts[0]["outcome"] in ("failure", "failed_start"), attempts
    assert attempts[1]["start_step"] == 20  # the last complete checkpoint before the crash
    assert job.steps_done()[-1] == STEPS


def test_one_worker_killed_stops_all_and_relaunches_all(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=80, hold_at=79)  # until the test has seen attempt 2 on every worker
    proc = job.watch()
    job.wait(lambda: len(job.job_processes()) == 4 and len(job.steps_done()) >= 1, what="4 workers running")
    before = job.job_processes()
    sim.inject("kill-worker", node="pod", worker=2)
    job.wait(lambda: len(job.attempts_journaled()) >= 2, what="attempt 2")
    job.wait(lambda: len(job.job_processes()) == 4, what="relaunch on all 4")
    after = job.job_processes()
    # Every worker runs a new process: the survivors of attempt 1 were stopped, not left behind.
    assert all(set(after[w]).isdisjoint(before[w]) for w in range(4)), (before, after)
    job.release()
    rc, out = finish(proc)
    assert rc == 0, out
    assert job.steps_done()[-1] == 80


def test_repeated_check_calls_reach_the_same_end_as_watch(sim: Simulator, tmp_path: Path) -> None:
    """Cron: one tick per call. A healed maintenance mid-run; the job finishes, uncharged."""
    job = Job(sim, tmp_path, hold_at=10)  # until the maintenance has hit it
    outputs = []
    injected = False
    end = time.monotonic() + 90
    while time.monotonic() < end:
        r = job.cli("check", "-c", str(job.cfg))
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 0, outputs[-1]
        if not injected and len(job.steps_done()) >= 2:
            sim.inject("maintenance", node="pod", heal_after=1800)
            job.release()
            injected = True
        if "job done" in r.stdout or r.stdout.count("| done |"):
            break
        time.sleep(0.2)
    assert injected
    attempts = job.history()["attempts"]
    assert job.steps_done()[-1] == STEPS, "\n".join(outputs[-5:])
    assert len(attempts) >= 2 and not any(a["charged"] for a in attempts), attempts


def test_kill_9_of_watch_mid_recovery_then_restart_gives_no_duplicate_launch(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=80, hold_at=10)
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("maintenance", node="pod", heal_after=1200)  # 2 s
    job.release()
    job.wait(lambda: sim.world.node("pod").health != "HEALTHY", what="maintenance under way")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc = job.watch()
    max_seen = 0

    def running_once() -> bool:
        nonlocal max_seen
        procs = job.job_processes()
        max_seen = max([max_seen, *[len(v) for v in procs.values()]])
        return len(procs) == 4

    job.wait(running_once, timeout=60, what="relaunch after restart")
    for _ in range(20):  # and it stays one copy per worker
        running_once()
        time.sleep(0.1)
    # Never two copies of the trainer on a worker.
    assert max_seen == 1, max_seen
    rc, out = finish(proc)
    assert rc == 0, out
    numbers = [a["attempt"] for a in job.history()["attempts"]]
    assert numbers == sorted(set(numbers)), numbers
    assert job.steps_done()[-1] == 80


def test_a_node_under_maintenance_gets_no_ssh_beyond_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the API still says READY (health UNHEALTHY_MAINTENANCE) the workers refuse SSH: the
    tick's probe learns that, and the stop that goes with the disruption is not tried (it would
    fail the same way); the relaunch cleans up instead. A slow simulator (speed 10) keeps the node
    READY for 6 s of the maintenance so that a tick lands there."""
    with Simulator(root=tmp_path / "sim", speed=10, workers=True) as slow:
        for key, value in slow.env.items():
            monkeypatch.setenv(key, value)
        job = Job(slow, tmp_path, steps=100000)
        first = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
        assert first["row"] == "launch", first
        job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
        slow.inject("maintenance", node="pod", heal_after=600)  # READY+UNHEALTHY for 60 sim s = 6 s
        job.wait(lambda: slow.world.node("pod").health != "HEALTHY", what="maintenance under way")
        down = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
        assert (down["node"]["state"], down["node"]["health"]) == ("READY", "UNHEALTHY_MAINTENANCE"), down
        assert {w["state"] for w in down["workers"]} == {"unreachable"}, down["workers"]
        assert down["phase"] == "waiting_node" and not down["budgets"]["restarts"], down
        assert any("did not stop workers: none answered this tick's probe" in d for d in down["done"]), down["done"]


def test_a_local_checkpoint_dir_is_read_on_worker_0_and_a_healed_maintenance_resumes_from_it(
        sim: Simulator, tmp_path: Path) -> None:
    # A single-host TPU whose job saves on the VM's own disk (for a simulated worker: under its
    # $TPUWATCH_HOST_ROOT). That path does not exist on the watcher's machine.
    vm_dir = "/tpuwatch-test-vm-disk/ck"
    assert not Path(vm_dir).exists()
    job = Job(sim, tmp_path, accelerator="v4-8", hold_at=10)
    text = job.cfg.read_text().replace(str(job.ck), vm_dir)
    job.cfg.write_text(text.replace("tpuwatch.sim.trainer ", "tpuwatch.sim.trainer --vm-paths ", 1))
    job.ck = sim.hosts.host_root(sim.node_key("pod"), 0) / vm_dir.lstrip("/")
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints on worker 0")
    sim.inject("maintenance", node="pod", heal_after=1800)  # 3 s at speed 600
    job.release()
    rc, out = finish(proc)
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert len(attempts) >= 2 and not any(a["charged"] for a in attempts), attempts
    # The relaunch resumed from a checkpoint that exists only on worker 0.
    assert attempts[1]["start_step"] is not None and attempts[1]["start_step"] >= 10, attempts
    assert job.steps_done()[-1] == STEPS


def test_upcoming_maintenance_entries_about_the_worker_vms_reach_check_and_events(
        sim: Simulator, tmp_path: Path) -> None:
    # Google writes upcoming maintenance as Compute Engine entries about each worker VM
    # (projects/P/zones/Z/instances/t1v-n-<hex>-w-<i>), not about nodes/<name>.
    job = Job(sim, tmp_path)
    sim.inject("upcoming-maintenance", node="pod", starts_in="7d")
    n_workers = sim.world.node("pod").n_workers
    entries = [e for e in sim.world.audit_entries() if e.method == "compute.instances.upcomingMaintenance"]
    assert len(entries) == n_workers and all("/instances/t1v-n-" in e.resource_name for e in entries)
    out = job.cli("check", "-c", str(job.cfg), "--json", timeout=120)
    assert out.returncode in (0, 1), out.stderr
    seen = [e for e in json.loads(out.stdout)["events"] if e["kind"] == "upcoming_maintenance"]
    assert sorted(e["worker"] for e in seen) == [str(w) for w in range(n_workers)], out.stdout
    ev = job.cli("events", "pod", "--zone", sim.zone, "--json", timeout=120)
    assert ev.returncode == 0, ev.stderr
    kinds = [e["kind"] for e in json.loads(ev.stdout)["events"]]
    assert kinds.count("upcoming_maintenance") == n_workers, ev.stdout
    st = job.cli("status", "pod", "--zone", sim.zone, "--json", timeout=120)
    assert st.returncode == 0, st.stderr
    kinds = [e["kind"] for e in json.loads(st.stdout)["nodes"][0]["events"]]
    assert kinds.count("upcoming_maintenance") == n_workers, st.stdout
