"""End to end: a node in UNKNOWN after a failed repair is recreated after a short grace, not after
repair_timeout.

The simulator's maintenance that never heals with `stuck="UNKNOWN"` goes UNHEALTHY_MAINTENANCE,
REPAIRING, then UNKNOWN with no health, the Cloud TPU API's state after a failed repair. The
watcher runs in process with the real adapters, SSH and simulator; only its clock is its own, so
that the test can step it over the grace (minutes) without waiting, while repair_timeout (an
hour) is nowhere near.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from e2e_helpers import Job, tick_until

from tpuwatch.journal import Journal
from tpuwatch.policy.nodes import FAILED_REPAIR_GRACE
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow


def test_a_node_unknown_after_a_failed_repair_is_recreated_after_the_grace(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-16", recreatable=True, repair_timeout="1h")
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    jb = load_job(job.cfg)
    ahead = [0.0]  # seconds the watcher's clock runs ahead of the wall clock

    def clock() -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=ahead[0])

    ports = replace(real_ports(jb), now=clock)
    old_id = sim.world.node("pod").id
    with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
        rec = Reconciler(jb.cfg, jb.pcfg, ports, journal)
        tick_until(rec, lambda r: r.decision.row == "running", "attempt 1 running")
        sim.inject("maintenance", node="pod", stuck="UNKNOWN")
        sim.world.wait_for(lambda w: w.node("pod").state == "UNKNOWN", timeout=30, what="the node in UNKNOWN")
        seen = tick_until(rec, lambda r: r.node is not None and r.node.state == "UNKNOWN", "a tick seeing UNKNOWN")
        assert seen.decision.row == "repair_wait" and seen.memory.repair.unknown_since is not None, seen.decision.summary
        assert seen.node is not None and seen.node.health == "HEALTH_UNSPECIFIED"
        # Within the grace nothing is deleted.
        ahead[0] = FAILED_REPAIR_GRACE - 30
        assert rec.tick().decision.row == "repair_wait"
        # Past it, far inside repair_timeout (1 h): recreated.
        ahead[0] = FAILED_REPAIR_GRACE + 1
        gone = rec.tick()
        assert gone.decision.row == "failed_repair", gone.decision.summary
        assert "failed repair" in gone.decision.summary
        back = tick_until(rec, lambda r: r.node is not None and r.node.id != old_id and r.node.usable,
                          "the node recreated and READY")
        assert back.memory.budgets.recreates == 1 and back.memory.budgets.restarts == 0
        tick_until(rec, lambda r: r.decision.row == "running", "the job running on the new node")
    assert sim.world.node("pod").id != old_id
