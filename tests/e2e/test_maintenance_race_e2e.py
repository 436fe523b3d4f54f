"""End to end: a maintenance is never charged, whichever moment of a tick it lands in and however
slow the watcher is.

A tick reads the node, then probes the workers. On a busy machine a maintenance can begin
between the two: the tick sees the job gone from a node it read as READY+HEALTHY. And a watcher
paused long enough (a loaded machine, a laptop asleep, SIGSTOP) finds the node already healed,
the health description ("The TPU had a maintenance event at ...") its only trace. In both tests
the audit log's entries become readable only after the test is over (`log_latency`, as real
entries can take minutes), so it cannot be what explains the end.

Each ordering is made to happen, not waited for by luck: the first test holds an in-process
watcher right after its node read (a wrapper of the real TPU adapter runs the maintenance there:
nothing outside the watcher can stop it at that point); the second SIGSTOPs a `tpuwatch watch`
process wherever it is, runs the maintenance to its heal, and lets it go on.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Job, finish, tick_until

from tpuwatch.journal import Journal
from tpuwatch.model import NodeSnapshot
from tpuwatch.ports import TpuApi
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow

LATE_LOG = 36_000.0  # simulated seconds (60 s real) before an audit entry can be read


def healed(world: Any) -> bool:
    n = world.node("pod")
    return n.state == "READY" and n.health == "HEALTHY" and "maintenance event" in n.health_description


class HeldAfterNodeRead:
    """The real TPU adapter, except that the node read after `arm()` returns the node as it was
    read, and only then runs `during` (the maintenance, to its heal) before the tick goes on."""

    def __init__(self, api: TpuApi, during: Any) -> None:
        self.api = api
        self.during = during
        self.armed = False

    def arm(self) -> None:
        self.armed = True

    def get_node(self, name: str) -> NodeSnapshot | None:
        node = self.api.get_node(name)
        if self.armed:
            self.armed = False
            self.during()
        return node

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def test_a_maintenance_between_the_node_read_and_the_probe_is_not_charged(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim.world.log_latency = LATE_LOG
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-16")
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    jb = load_job(job.cfg)

    def maintenance() -> None:
        sim.inject("maintenance", node="pod", heal_after=600)  # 1 s
        sim.world.wait_for(healed, timeout=30, what="the node healed")

    held: dict[str, HeldAfterNodeRead] = {}
    ports = real_ports(jb)
    real_tpu = ports.tpu_for
    ports = replace(ports, tpu_for=lambda zone: held.setdefault(zone, HeldAfterNodeRead(real_tpu(zone), maintenance)))
    with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
        rec = Reconciler(jb.cfg, jb.pcfg, ports, journal)
        tick_until(rec, lambda r: r.decision.row == "running" and r.checkpoint is not None,
                   "attempt 1 running with a checkpoint")
        held[jb.pcfg.zones[0]].arm()
        report = rec.tick()
        # The ordering happened: the node as read was healthy, and the probe found the job gone.
        assert report.node is not None and report.node.usable and report.node.maintenance_time is None
        assert report.probes and not any(p.state == "running" for p in report.probes), report.probes
        assert report.events == ()  # the audit log has nothing to say yet
        # Charged at once so that the relaunch need not wait, but open to the next node reads.
        assert report.memory.budgets.confirm_by is not None, report.decision.summary
        after = tick_until(rec, lambda r: any(e.attempt == 1 and not e.charged for e in r.decision.ended),
                           "the end re-classified")
        ended = [e for e in after.decision.ended if e.attempt == 1]
        assert [e.outcome for e in ended] == ["disruption"], after.decision.summary
        assert "maintenance event" in ended[0].reason
        attempts = journal.attempts()
        assert [(a.number, a.outcome, a.charged) for a in attempts][:1] == [(1, "disruption", False)]
        assert not any(a.charged for a in attempts), attempts
        assert after.memory.budgets.restarts == 0


def test_a_watcher_paused_through_a_whole_maintenance_does_not_charge_it(
        sim: Simulator, tmp_path: Path) -> None:
    sim.world.log_latency = LATE_LOG
    job = Job(sim, tmp_path, steps=150, accelerator="v4-16")
    proc = job.watch()
    try:
        job.wait(lambda: len(job.job_processes()) == 2 and len(job.steps_done()) >= 2,
                 what="the job running with two checkpoints")
        proc.send_signal(signal.SIGSTOP)  # wherever it is: between ticks, mid-read, mid-probe
        sim.inject("maintenance", node="pod", heal_after=600)
        sim.world.wait_for(healed, timeout=30, what="the node healed")
        job.wait(lambda: len(job.job_processes()) == 0, what="the job gone")
    finally:
        proc.send_signal(signal.SIGCONT)
    rc, out = finish(proc)
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert attempts[0]["outcome"] == "disruption", attempts
    assert not any(a["charged"] for a in attempts), attempts
    assert attempts[-1]["outcome"] == "success" and job.steps_done()[-1] == 150
