"""Chaos: two jobs with priorities, each under its own `tpuwatch watch`, SIGKILLed at seeded
moments of a take-over and a hand-back, and started again.

Job chaos-hi (priority 500) and job chaos-lo (priority 100), one Spot v4-8 node each, both with a
[tpu.spec]. Again and again the node chaos-hi trains on is preempted (and not made again, for a
stockout, until chaos-hi runs elsewhere): chaos-lo lends it the node it trains on, and is handed
the preempted node once made again. The lender's watcher is killed
while it gives ("give"), the taker's while it asks and takes ("take"), and both while the node is
made again and handed back ("hand_back"). The invariants are read from the world (tests/chaos/
harness.py): never two trainers on one worker, of one job or of both, never two attempts of a
job alive at once, every attempt resumed from its job's newest complete checkpoint, nothing
charged, both jobs done, each preempted node deleted once and made again, and a journal
that opens and passes SQLite's check after every kill. TPUWATCH_CHAOS_SEED changes the moments.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chaos.harness import Watched

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("TPUWATCH_CHAOS_SEED", "9"))
CYCLES = 4  # the last one killed nowhere: the jobs end past it


class Prio(Watched):
    """A watched job with a [job] priority."""

    def __init__(self, *args: Any, priority: int, **kw: Any) -> None:
        self.priority = priority
        super().__init__(*args, **kw)

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        super().set_steps(steps, hold_at)
        text = self.cfg.read_text().replace("[job]\n", f"[job]\npriority = {self.priority}\n", 1)
        tmp = self.cfg.with_suffix(".prio")
        tmp.write_text(text)
        tmp.replace(self.cfg)

    def on(self) -> set[str]:
        """The nodes a trainer of the job runs on now (a worker's marker ends "<node>/<index>")."""
        return {w.split("/")[-2] for w in self.sampler.trainers()}

    def newest(self) -> int:
        return max((a for procs in self.sampler.trainers().values() for _, a in procs), default=0)

    def runs_newer(self, attempt: int) -> bool:
        return any(a > attempt for procs in self.sampler.trainers().values() for _, a in procs)


class Shared:
    """Samples both jobs all along: any moment a worker runs trainers of both."""

    def __init__(self, jobs: tuple[Prio, Prio]) -> None:
        self.jobs = jobs
        self.seen: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            a, b = (set(j.sampler.trainers()) for j in self.jobs)
            if a & b:
                self.seen.append(f"workers {sorted(a & b)} run trainers of both jobs")
            self.samples += 1
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def kill_in(job: Prio, since: float, lo: float, hi: float, stage: str, done: Any) -> None:
    """Kill `job`'s watcher at a seeded moment lo..hi s after `since`, counted in `stage`, unless
    what the stage leads to is `done` first (no kill then: one after it is no kill point)."""
    job.kill_unless(since, lo, hi, done, stage)


def labels(sim: Simulator, name: str) -> dict[str, str]:
    node = next((n for n in sim.world.nodes() if n.name == name), None)
    return dict(node.spec.labels) if node is not None else {}


def test_kills_while_a_higher_priority_job_takes_a_node_and_hands_its_own_back(tmp_path: Path) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim:
        hi = Prio(sim, tmp_path, "chaos-hi", seed=SEED * 31 + 1, accelerator="v4-8", spot=True, recreatable=True,
                  priority=500)
        lo = Prio(sim, tmp_path, "chaos-lo", seed=SEED * 31 + 2, accelerator="v4-8", spot=True, recreatable=True,
                  priority=100)
        shared = Shared((hi, lo))
        preempted = 0
        try:
            hi.start()
            lo.start()
            for cycle in range(CYCLES):
                final = cycle == CYCLES - 1
                hi.running_with_progress()
                lo.running_with_progress()
                lent = next(iter(lo.on()))
                hi.wait(lambda lent=lent: labels(sim, lent).get("tpuwatch-priority") == "100",
                        what=f"{lent} labelled with chaos-lo's priority")
                taken_from = next(iter(hi.on()))
                old = next(n for n in sim.world.nodes() if n.name == taken_from).id
                h_before, l_before = hi.newest(), lo.newest()
                # the jobs end a little past this cycle's relaunches: chaos-hi, which would hand the node
                # it took back as it ends, held until chaos-lo is back (set right before the loss, so
                # that the attempt running until then is still short of the hold)
                end = hi.hold_end() if final else 0
                sim.world.stockout()  # the preempted node is not made again before the take: the take is met
                sim.inject("preempt", node=taken_from)
                preempted += 1
                since = time.monotonic()
                moved = lambda b=h_before, lent=lent: hi.runs_newer(b) and lent in hi.on()  # noqa: E731
                if not final:
                    kill_in(lo, since, 0.0, 1.2, "give", moved)
                    kill_in(hi, since, 0.0, 1.5, "take", moved)
                hi.wait(moved, timeout=60, what=f"chaos-hi's next attempt on {lent}")
                assert labels(sim, lent)["tpuwatch-job"] == "chaos-hi", labels(sim, lent)
                if final:  # chaos-lo, stopped now (it gave), ends a little past its next attempt
                    lo.set_steps((lo.steps_done() or [0])[-1] + 300)
                    lo.kill(lo.started_at)
                sim.inject("clear-errors")
                since = time.monotonic()
                back = lambda b=l_before, n=taken_from, o=old: (  # noqa: E731
                    lo.runs_newer(b) and n in lo.on()
                    and next((x for x in sim.world.nodes() if x.name == n), None) is not None
                    and next(x for x in sim.world.nodes() if x.name == n).id != o)
                if not final:
                    kill_in(hi, since, 0.0, 1.5, "hand_back", back)
                    kill_in(lo, since, 0.0, 1.5, "hand_back", back)
                lo.wait(back, timeout=90, what=f"chaos-lo's next attempt on {taken_from} made again")
                assert labels(sim, taken_from)["tpuwatch-job"] == "chaos-lo", labels(sim, taken_from)
                if final:
                    hi.release(end - 100)
            rcs = [hi.finish(120), lo.finish(120)]
            results = [job.assert_invariants(rc) for job, rc in zip((hi, lo), rcs, strict=True)]
        finally:
            shared.stop()
            hi.close()
            lo.close()
        kills = Counter(k.phase for job in (hi, lo) for k in job.kills)
        print(f"\npriorities chaos (seed {SEED}): kills {dict(kills)}; {shared.samples} samples of both jobs")
        assert shared.seen == [], shared.seen[:5]
        assert shared.samples > 50
        for result in results:
            assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        assert kills["give"] + kills["take"] + kills["hand_back"] >= 2 * (CYCLES - 1), kills
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # each preempted node deleted once to be made again, whatever the kills: never twice (its
        # creates are refused for a stockout until the take, then one of them makes it)
        assert sim.world.call_count("DeleteNode") == preempted
        assert sorted(n.name for n in sim.world.nodes()) == ["chaos-hi", "chaos-lo"]
