"""End to end: a person's recreate, `tpuwatch check --recreate` (`Flags.recreate`, row
`recreate_asked`), takes the policy's own delete -> create path: the running attempt ends as a
disruption (stopped, not charged), the owned node is deleted and created again, and the job
resumes on the new node with no budget spent. The watcher runs in process with the real adapters,
SSH and simulator; the recreate is asked through the real command line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Job, tick_until, wait_for

from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow


def test_a_recreate_asked_of_the_tick_is_the_policys_delete_create_not_charged(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-16", recreatable=True)
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    jb = load_job(job.cfg)
    ports = real_ports(jb)
    old_id = sim.world.node("pod").id
    try:
        with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
            watch = Reconciler(jb.cfg, jb.pcfg, ports, journal)
            tick_until(watch, lambda r: r.decision.row == "running", "attempt 1 running")
            # a watcher holds the job: the request is refused, said, and nothing is deleted
            busy = job.cli("check", "-c", str(job.cfg), "--recreate")
            assert busy.returncode == 1 and "recreate not asked" in busy.stderr, busy.stderr
            assert sim.world.call_count("DeleteNode") == 0
        out = job.cli("check", "-c", str(job.cfg), "--recreate", "--json")
        asked = json.loads(out.stdout)
        assert out.returncode == 0 and asked["row"] == "recreate_asked", (out.stdout, out.stderr)
        assert [a["kind"] for a in asked["actions"]] == ["stop", "delete"], asked["actions"]
        assert sim.world.call_count("DeleteNode") == 1
        # while the delete is in flight, a second ask starts nothing more and says so
        again = job.cli("check", "-c", str(job.cfg), "--recreate")
        assert again.returncode == 1 and "recreate not started" in again.stdout, again.stdout
        assert sim.world.call_count("DeleteNode") == 1
        with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
            first = journal.attempts()[0]
            assert (first.outcome, first.charged) == ("disruption", False), first
            watch = Reconciler(jb.cfg, jb.pcfg, ports, journal)
            back = tick_until(watch, lambda r: r.decision.row == "running" and r.node is not None
                              and r.node.id != old_id, "the job running on the new node", timeout=120)
            assert back.memory.attempt.number == 2
            assert (back.memory.budgets.recreates, back.memory.budgets.restarts) == (0, 0)
    finally:
        ports.workers.close()
    assert sim.world.node("pod").id != old_id and sim.world.call_count("CreateNode") == 1


def running_job(sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Job, Any, Any]:
    """A recreatable job on a v4-16, attempt 1 running under the watcher's ticks; (the job, its
    loaded config, its real ports: the caller closes their workers)."""
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-16", recreatable=True)
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    jb = load_job(job.cfg)
    ports = real_ports(jb)
    try:
        with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
            tick_until(Reconciler(jb.cfg, jb.pcfg, ports, journal), lambda r: r.decision.row == "running",
                       "attempt 1 running")
    except BaseException:
        ports.workers.close()
        raise
    return job, jb, ports


def test_tpuwatch_recreate_stops_the_attempt_uncharged_and_leaves_a_stocked_out_create_queued_for_the_watcher(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tpuwatch recreate` is the same path, ticked by the command itself: with no quota in the
    zone it ends with exit 1, the old node deleted and the create queued in the journal (not a
    failed job); a second recreate starts nothing beside it; the watcher's next ticks create the
    node once quota is back, and the job resumes with no budget spent."""
    job, jb, ports = running_job(sim, tmp_path, monkeypatch)
    old_id = sim.world.node("pod").id
    try:
        sim.world.quota(sim.zone)
        out = job.cli("recreate", "pod", "-c", str(job.cfg), "--yes")
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert "could not create pod: no capacity or quota" in out.stderr and "stays queued" in out.stderr, out.stderr
        assert "stopped the job on 2/2 workers" in out.stdout, out.stdout
        assert sim.world.call_count("DeleteNode") == 1 and not sim.world.has_node("pod")
        again = job.cli("recreate", "pod", "-c", str(job.cfg), "--yes")
        assert again.returncode == 1 and "already recreating it: its create is queued" in again.stderr, again.stderr
        assert sim.world.call_count("DeleteNode") == 1
        sim.world.clear_errors()
        with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
            first = journal.attempts()[0]
            assert (first.outcome, first.charged) == ("disruption", False), first
            assert journal.load_memory().phase.value == "queued"  # type: ignore[union-attr]
            assert any(e.kind == "recreate" and e.reason.startswith("deleting pod") for e in journal.events())
            back = tick_until(Reconciler(jb.cfg, jb.pcfg, ports, journal),
                              lambda r: r.decision.row == "running" and r.node is not None and r.node.id != old_id,
                              "the job running on the new node", timeout=120)
            assert back.memory.attempt.number == 2
            assert (back.memory.budgets.recreates, back.memory.budgets.restarts) == (0, 0)
    finally:
        ports.workers.close()


@pytest.mark.parametrize("kill_after", ["DeleteNode", "CreateNode"])
def test_tpuwatch_recreate_killed_mid_way_is_carried_on_by_the_watcher_with_one_node(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_after: str) -> None:
    """Every step is journaled before it is taken: a `tpuwatch recreate` killed after its delete or
    create call leaves the journal saying so; a second recreate refuses to act beside it, and the
    watcher's ticks finish it with one create and the job resumed, nothing charged."""
    sim.world.delays.update(delete=1200.0, create=1200.0)  # 2 s each: room to kill inside them
    job, jb, ports = running_job(sim, tmp_path, monkeypatch)
    old_id = sim.world.node("pod").id
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "recreate", "pod", "-c", str(job.cfg), "--yes"],
                                env=job.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        wait_for(lambda: sim.world.call_count(kill_after) >= 1, timeout=60, what=f"the recreate's {kill_after}")
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, out  # killed mid-way, not finished
        again = job.cli("recreate", "pod", "-c", str(job.cfg), "--yes")
        assert again.returncode == 1 and "already recreating it" in again.stderr, again.stderr
        with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
            back = tick_until(Reconciler(jb.cfg, jb.pcfg, ports, journal),
                              lambda r: r.decision.row == "running" and r.node is not None and r.node.id != old_id,
                              "the job running on the new node", timeout=120)
            assert back.memory.attempt.number == 2
            assert (back.memory.budgets.recreates, back.memory.budgets.restarts) == (0, 0)
            first = journal.attempts()[0]
            assert (first.outcome, first.charged) == ("disruption", False), first
    finally:
        ports.workers.close()
    creates = [o for o in sim.world.list_operations(f"projects/{sim.project}/locations/{sim.zone}")
               if o.verb == "create"]
    assert len(creates) == 1, "never two creates"
    assert [n.name for n in sim.world.list_nodes(sim.project, sim.zone)] == ["pod"]
