"""End to end: a job moved off a node that is still READY launches elsewhere only once it has
stopped there. A stop there that fails (the node's SSH server refuses, its API still READY and
HEALTHY) holds the launch, tick after tick, instead of starting a second attempt beside the one
that may still run there; once the node answers again, the stop is done and the job launches.

A job on node `pod` with a spare `sp-0`; a maintenance announced for `pod` that cannot be started
early moves the job onto the spare at its next checkpoint (row `early_swap`), `pod` staying
READY. The SSH fault must land between the move and its stop: nothing outside the watcher can
hit that moment, so an in-process watcher runs with a wrapper of its real workers port that
injects the simulator's fault just before the first stop after `arm()` (the stop then fails
through the real ssh client against the real fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import tick_until, trainer, trainer_env, write_config

from tpuwatch.errors import UsageError
from tpuwatch.journal import Journal
from tpuwatch.model import NodeSnapshot
from tpuwatch.policy.alerts import Where, from_event
from tpuwatch.policy.owed import STOP_FAILED_WAIT
from tpuwatch.ports import Workers
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler, TickReport
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow


class RefusedAtFirstStop:
    """The real workers port, except that its first stop after `arm()` finds `pod`'s SSH server
    refusing connections: the simulator's fault, injected right then."""

    def __init__(self, workers: Workers, sim: Simulator) -> None:
        self.workers = workers
        self.sim = sim
        self.armed = False

    def arm(self) -> None:
        self.armed = True

    def stop(self, node: NodeSnapshot, workers: Sequence[int] | None = None, *, wait: bool = True) -> Any:
        if self.armed:
            self.armed = False
            self.sim.inject("ssh", node="pod", worker=0, mode="refuse")
        return self.workers.stop(node, workers, wait=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.workers, name)


def test_a_launch_waits_for_the_stop_on_the_node_it_left_while_that_stop_fails_then_goes(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pod", "sp-0"):
        sim.create_node(name, "v4-8", labels={"tpuwatch-job": "pod"})
    ck, go = sim.bucket / "ck", tmp_path / "go"
    go.mkdir()
    command = trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1", steps=100_000)
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, command, ck, tpu={"spares": ["sp-0"]})
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    for k, v in sim.env.items():
        monkeypatch.setenv(k, v)
    jb = load_job(cfg)
    ports = real_ports(jb)
    workers = RefusedAtFirstStop(ports.workers, sim)
    ports = replace(ports, workers=workers)

    def trainer_on(name: str) -> int | None:
        """The attempt of the job's trainer running on `name`'s worker, if one runs there."""
        try:
            pids = sim.hosts.pids(sim.node_key(name), 0)
        except UsageError:
            return None
        return next((int(e["TPUWATCH_ATTEMPT"]) for pid in pids if (e := trainer_env(pid, "pod")) is not None), None)

    seen: list[tuple[int | None, int | None]] = []

    def sampled(report: TickReport) -> TickReport:
        """`report`, with the trainers on both nodes sampled after its tick."""
        seen.append((trainer_on("pod"), trainer_on("sp-0")))
        return report

    with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
        rec = Reconciler(jb.cfg, jb.pcfg, ports, journal)
        tick_until(rec, lambda r: r.decision.row == "running" and trainer_on("pod") == 1, "attempt 1 on pod")
        sim.inject("upcoming-maintenance", node="pod", starts_in="7d", can_reschedule=False)
        tick_until(rec, lambda r: r.decision.row == "early_wait", "the move off pod waiting for a checkpoint")
        workers.arm()
        (go / "100").touch()  # the job trains on: its next checkpoint is the moment to move
        held = tick_until(rec, lambda r: sampled(r).decision.row == "owed_stop_failed", "the launch held")
        assert any(d.row == "early_swap" for d in held.earlier), [d.row for d in held.earlier]
        assert "may still run there" in held.decision.summary, held.decision.summary
        # the older attempt runs on where the stop failed, and nothing was started beside it
        assert (trainer_on("pod"), trainer_on("sp-0")) == (1, None)
        again = sampled(rec.tick())  # tried again, failed again: still held
        assert again.decision.row == "owed_stop_failed" and trainer_on("sp-0") is None, again.decision.summary
        assert any("did not stop workers" in line or "w0:" in line for line in again.done), again.done
        sim.inject("ssh", node="pod", worker=0, mode="serve")
        tick_until(rec, lambda r: sampled(r).decision.row in ("launch", "running") and trainer_on("sp-0") == 2,
                   "attempt 2 on sp-0")
        assert trainer_on("pod") is None
        attempts = journal.attempts()
        # the hold journaled once (its wait, as the row changed): alert stop_failed
        held_events = [e for e in journal.events() if e.kind == "wait" and e.data.get("reason") == STOP_FAILED_WAIT]
        alert = from_event(Where("pod", "pod", "z"), held_events[0].id, "wait", held_events[0].time,
                           held_events[0].reason, held_events[0].data) if len(held_events) == 1 else None
    # never two attempts alive at once, on either node
    assert not [s for s in seen if None not in s], seen
    assert [(a.number, a.outcome, a.charged) for a in attempts] == [(1, "disruption", False), (2, None, None)]
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
    assert alert is not None and alert.kind == "stop_failed" and "the job moved off pod" in alert.text, held_events
