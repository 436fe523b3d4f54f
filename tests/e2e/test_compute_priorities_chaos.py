"""Chaos: two Compute Engine jobs with priorities, each under its own `tpuwatch watch`, SIGKILLed at
seeded moments of a take-over and a hand-back, and started again.

As tests/e2e/test_priorities_chaos.py, on instances: job cepr-hi (priority 500) and job cepr-lo
(priority 100), one Spot instance each (termination action STOP: tpuwatch deletes and inserts the
preempted instance; DELETE: Google deletes it, and on the audit log's word tpuwatch inserts it,
whichever job's it was), both with the [tpu.compute_spec] `tpuwatch init` captures. Again and again the instance cepr-hi trains on is preempted (and not
inserted again, for a stockout, until cepr-hi runs elsewhere): cepr-lo lends it the instance it
trains on (its labels written by instances.setLabels with the fingerprint of a get beside it), and
is handed the preempted instance once inserted again. The lender's watcher is killed while it
gives ("give"), the taker's while it asks and takes ("take"), and both while the instance is made
again and handed back ("hand_back"). The invariants are read from the world (tests/chaos/
harness.py): never two trainers on one VM, of one job or of both, never two attempts of a job alive
at once, every attempt resumed from its job's newest complete checkpoint, nothing charged, both
jobs done, each preempted instance inserted once (and, with STOP, deleted once). TPUWATCH_CHAOS_SEED changes the
moments.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_compute_chaos import OneInstance, done_ops, labels, vm_id
from test_priorities_chaos import Shared, kill_in

from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("TPUWATCH_CHAOS_SEED", "9"))
CYCLES = 3  # the last one killed nowhere: the jobs end past it


class PrioInstance(OneInstance):
    """A job of [job] `priority` on Spot instance `name` (termination action `action`), no spares."""

    def __init__(self, *args: Any, priority: int, **kw: Any) -> None:
        self.priority = priority
        super().__init__(*args, **kw)

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        super().set_steps(steps, hold_at)
        text = self.cfg.read_text().replace("[job]\n", f"[job]\npriority = {self.priority}\n", 1)
        tmp = self.cfg.with_suffix(".prio")
        tmp.write_text(text)
        tmp.replace(self.cfg)


@pytest.mark.parametrize("action", ["STOP", "DELETE"])
def test_kills_while_a_higher_priority_instance_job_takes_an_instance_and_hands_its_own_back(
        tmp_path: Path, action: str) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim, RestFace(sim.world) as rest:
        # room for kills inside them: a delete and an insert about 0.5 s each
        sim.world.delays.update(delete=300.0, create=300.0, stop=300.0)
        hi = PrioInstance(sim, tmp_path, "cepr-hi", compute_url=rest.url, seed=SEED * 37 + 1, priority=500,
                          action=action)
        lo = PrioInstance(sim, tmp_path, "cepr-lo", compute_url=rest.url, seed=SEED * 37 + 2, priority=100,
                          action=action)
        shared = Shared((hi, lo))  # type: ignore[arg-type]  # Shared reads only the samplers
        preempted: Counter[str] = Counter()
        try:
            for job in (hi, lo):
                job.capture_spec()
                job.start()
            for cycle in range(CYCLES):
                final = cycle == CYCLES - 1
                hi.running_with_progress()
                lo.running_with_progress()
                [lent] = lo.on()
                hi.wait(lambda lent=lent: labels(sim, lent).get("tpuwatch-priority") == "100",
                        what=f"{lent} labelled with cepr-lo's priority")
                [taken_from] = hi.on()
                old = vm_id(sim, taken_from)
                h_before, l_before = hi.newest(), lo.newest()
                # the jobs end a little past this cycle's relaunches: cepr-hi, which would hand the instance
                # it took back as it ends, held until cepr-lo is back (set right before the loss, so
                # that the attempt running until then is still short of the hold)
                end = hi.hold_end() if final else 0
                sim.world.stockout()  # the preempted instance is not inserted again before the take
                sim.world.preempt_instance(taken_from)
                preempted[taken_from] += 1
                since = time.monotonic()
                moved = lambda b=h_before, lent=lent: hi.runs_newer(b) and hi.on() == {lent}  # noqa: E731
                if not final:
                    kill_in(lo, since, 0.0, 1.2, "give", moved)  # type: ignore[arg-type]
                    kill_in(hi, since, 0.0, 1.5, "take", moved)  # type: ignore[arg-type]
                hi.wait(moved, timeout=60, what=f"cepr-hi's next attempt on {lent}")
                assert labels(sim, lent)["tpuwatch-job"] == "cepr-hi", labels(sim, lent)
                if final:  # cepr-lo, stopped now (it gave), ends a little past its next attempt
                    lo.set_steps((lo.steps_done() or [0])[-1] + 300)
                    lo.kill(lo.started_at)
                sim.inject("clear-errors")
                since = time.monotonic()
                back = lambda b=l_before, n=taken_from, o=old: (  # noqa: E731
                    lo.runs_newer(b) and lo.on() == {n} and vm_id(sim, n) not in (None, o))
                if not final:
                    kill_in(hi, since, 0.0, 1.5, "hand_back", back)  # type: ignore[arg-type]
                    kill_in(lo, since, 0.0, 1.5, "hand_back", back)  # type: ignore[arg-type]
                lo.wait(back, timeout=90, what=f"cepr-lo's next attempt on {taken_from} inserted again")
                assert labels(sim, taken_from)["tpuwatch-job"] == "cepr-lo", labels(sim, taken_from)
                if final:
                    hi.release(end - 100)
            rcs = [hi.finish(120), lo.finish(120)]
            results = [job.assert_invariants(rc) for job, rc in zip((hi, lo), rcs, strict=True)]
        finally:
            shared.stop()
            hi.close()
            lo.close()
        kills = Counter(k.phase for job in (hi, lo) for k in job.kills)
        print(f"\ncompute priorities chaos (seed {SEED}): kills {dict(kills)}; {shared.samples} samples of both jobs")
        assert shared.seen == [], shared.seen[:5]
        assert shared.samples > 50
        for result in results:
            assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        assert kills["give"] + kills["take"] + kills["hand_back"] >= 2 * (CYCLES - 1), kills
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # each preempted instance inserted once (deleted once by tpuwatch with STOP), whatever the kills (its inserts are
        # refused for a stockout until the take, then one of them makes it)
        by = done_ops(sim.world.list_compute_operations(sim.project, f"zones/{sim.zone}"))
        assert by["delete"] == (preempted if action == "STOP" else Counter()), (by, preempted)
        assert by["insert"] == preempted, (by, preempted)
        assert sorted(r.name for r in sim.world.instances()) == ["cepr-hi", "cepr-lo"]
