"""Chaos: two jobs of one spare pool, each under its own `tpuwatch watch` (one state dir), SIGKILLed
at seeded moments while a job claims a spare of the pool, swaps onto it, and returns its own node
made again to the pool; then started again.

Jobs pool-a and pool-b (one Spot v4-8 node each, with a [tpu.spec]) name pool v4, whose one spare
sp-0 is idle. Cycle after cycle the node one job trains on is preempted (and not made again, for a
stockout, until the job runs on the pool's idle spare): the job claims the idle spare and swaps onto
it, then its own node, made again, goes to the pool, the spare the next loss takes. The loser's
watcher is killed while it claims and swaps ("claim"), the other's meanwhile ("bystander"), and the
loser's again while its node is made again and returned ("return"). The invariants come from the
world (tests/chaos/harness.py): never two trainers on one worker, of one job or of both, never two
attempts of a job alive at once, every attempt resumed from its newest complete checkpoint, nothing
charged, both jobs done, no binding lost (each job holds one node, the pool one idle spare), each
preempted node deleted once. TPUWATCH_CHAOS_SEED changes the moments.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chaos.harness import Watched
from test_priorities_chaos import Shared, kill_in, labels

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("TPUWATCH_CHAOS_SEED", "9"))
CYCLES = 4  # the last two (one per job) killed nowhere: the jobs end past them
POOL = "v4"


class Pooled(Watched):
    """A watched job of spare pool v4; its watcher is started with the pool's file, its journal
    in the state dir both jobs share (so the pool's locks exclude the two watchers)."""

    def __init__(self, sim: Simulator, tmp: Path, name: str, **kw: Any) -> None:
        super().__init__(sim, tmp, name, **kw)
        self.state_dir = tmp / "state"
        self.env["TPUWATCH_STATE_DIR"] = str(self.state_dir)
        self.also = [tmp / "pool-v4.toml"]

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        super().set_steps(steps, hold_at)
        text = self.cfg.read_text().replace("[tpu]\n", f"[tpu]\nspare_pool = \"{POOL}\"\n", 1)
        tmp = self.cfg.with_suffix(".pool")
        tmp.write_text(text)
        tmp.replace(self.cfg)

    def on(self) -> set[str]:
        """The nodes a trainer of the job runs on now (a worker's marker ends "<node>/<index>")."""
        return {w.split("/")[-2] for w in self.sampler.trainers()}

    def newest(self) -> int:
        return max((a for procs in self.sampler.trainers().values() for _, a in procs), default=0)

    def runs_newer(self, attempt: int) -> bool:
        return any(a > attempt for procs in self.sampler.trainers().values() for _, a in procs)


def idle(sim: Simulator) -> list[str]:
    """The pool's idle spares READY now: its label and no job's."""
    return sorted(n.name for n in sim.world.nodes() if n.state == "READY" and dict(n.spec.labels) == {
        "tpuwatch-pool": POOL})


def test_kills_while_jobs_of_one_pool_claim_its_spare_and_return_their_own_node(tmp_path: Path) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim:
        sim.create_node("sp-0", "v4-8", labels={"tpuwatch-pool": POOL}, spot=True)
        (tmp_path / "pool-v4.toml").write_text(f'[pool]\nname = "{POOL}"\nzone = "{sim.zone}"\nspares = ["sp-0"]\n')
        a = Pooled(sim, tmp_path, "pool-a", seed=SEED * 37 + 1, accelerator="v4-8", spot=True, recreatable=True)
        b = Pooled(sim, tmp_path, "pool-b", seed=SEED * 37 + 2, accelerator="v4-8", spot=True, recreatable=True)
        shared = Shared((a, b))  # type: ignore[arg-type]
        preempted = 0
        try:
            a.start()
            b.start()
            for cycle in range(CYCLES):
                final = cycle >= CYCLES - 2
                loser, other = (a, b) if cycle % 2 == 0 else (b, a)
                for job in (a, b):
                    if job.proc is not None and job.proc.poll() is None:  # one done: its watcher ended
                        job.running_with_progress()
                loser.wait(lambda: len(idle(sim)) == 1, what="one idle spare in the pool")
                [spare] = idle(sim)
                lost = next(iter(loser.on()))
                old = next(n for n in sim.world.nodes() if n.name == lost).id
                before = loser.newest()
                # the loser ends a little past its relaunch of this cycle, held until its own node is back
                # (set right before the loss, so that the attempt running until then is short of the hold)
                end = loser.hold_end() if final else 0
                sim.world.stockout()  # the lost node is not made again before the claim: the claim is met
                sim.inject("preempt", node=lost)
                preempted += 1
                since = time.monotonic()
                moved = lambda n0=before, s=spare, j=loser: j.runs_newer(n0) and s in j.on()  # noqa: E731
                if not final:
                    kill_in(loser, since, 0.0, 0.8, "claim", moved)
                    kill_in(other, since, 0.0, 0.8, "bystander", moved)
                loser.wait(moved, timeout=60, what=f"{loser.name}'s next attempt on pool spare {spare}")
                assert labels(sim, spare) == {"tpuwatch-job": loser.name, "tpuwatch-pool": POOL}, labels(sim, spare)
                sim.inject("clear-errors")
                since = time.monotonic()
                back = lambda n=lost, o=old: idle(sim) == [n] and next(  # noqa: E731
                    x for x in sim.world.nodes() if x.name == n).id != o
                if not final:
                    kill_in(loser, since, 0.0, 1.0, "return", back)
                loser.wait(back, timeout=90, what=f"{lost} made again and returned to the pool")
                assert spare in loser.on()  # the job stays where it runs
                if final:
                    loser.release(end - 100)
            rcs = [a.finish(120), b.finish(120)]
            results = [job.assert_invariants(rc) for job, rc in zip((a, b), rcs, strict=True)]
        finally:
            shared.stop()
            a.close()
            b.close()
        kills = Counter(k.phase for job in (a, b) for k in job.kills)
        print(f"\nspare pool chaos (seed {SEED}): kills {dict(kills)}; {shared.samples} samples of both jobs; "
              f"{[(k.phase, k.delay, k.journal_phase) for job in (a, b) for k in job.kills]}")
        assert shared.seen == [], shared.seen[:5]
        assert shared.samples > 50
        for result in results:
            assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        assert kills["claim"] + kills["bystander"] + kills["return"] >= 2 * (CYCLES - 2), kills
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # no binding lost: each job holds one node, the pool has its one idle spare, and each
        # preempted node was deleted once to be made again, whatever the kills
        owners = Counter(dict(n.spec.labels).get("tpuwatch-job", "") for n in sim.world.nodes())
        assert owners == Counter({"pool-a": 1, "pool-b": 1, "": 1}), owners
        assert all(dict(n.spec.labels).get("tpuwatch-pool") == POOL for n in sim.world.nodes()
                   if n.name == "sp-0" or dict(n.spec.labels).get("tpuwatch-job", "") == "")
        assert sim.world.call_count("DeleteNode") == preempted
        assert sorted(n.name for n in sim.world.nodes()) == ["pool-a", "pool-b", "sp-0"]
