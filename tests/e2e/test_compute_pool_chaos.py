"""Chaos: two Compute Engine jobs of one spare pool of instances, each under its own `tpuwatch watch`
(one state dir), SIGKILLed at seeded moments while a job claims the pool's spare, swaps onto it,
and returns its own instance inserted again to the pool; then started again.

As tests/e2e/test_spare_pool_chaos.py, on instances: jobs cepool-a and cepool-b (one Spot instance
each, with the [tpu.compute_spec] `tpuwatch init` captures) name pool
v7 ([pool] api = "compute"), whose one spare instance sp-0 is idle. Cycle after cycle the instance
one job trains on is preempted (and not inserted again, for a stockout, until the job runs on the
pool's idle spare): the job claims the idle spare (instances.setLabels, with the fingerprint of a
get beside it) and swaps onto it, then its own instance, inserted again, goes to the pool. The
loser's watcher is killed while it claims and swaps ("claim"), the other's meanwhile
("bystander"), and the loser's again while its instance is made again and returned ("return").
The invariants come from the world (tests/chaos/harness.py): never two trainers on one VM, of one
job or of both, never two attempts of a job alive at once, every attempt resumed from its newest
complete checkpoint, nothing charged, both jobs done, no binding lost (each job holds one
instance, the pool one idle spare), each preempted instance inserted once. Termination action STOP
(tpuwatch deletes each preempted instance, once) and DELETE (Google does; the audit log's word about
the instance a job runs on, its own or the pool's it claimed, says so).
TPUWATCH_CHAOS_SEED changes the moments.
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
CYCLES = 4  # the last two (one per job) killed nowhere: the jobs end past them
POOL = "v7"


class PooledInstance(OneInstance):
    """A job on Spot instance `name` of spare pool v7; its watcher is started with the pool's file,
    its journal in the state dir both jobs share (so the pool's locks exclude the two watchers)."""

    def __init__(self, sim: Simulator, tmp: Path, name: str, **kw: Any) -> None:
        super().__init__(sim, tmp, name, **kw)
        self.state_dir = tmp / "state"
        self.env["TPUWATCH_STATE_DIR"] = str(self.state_dir)
        self.also = [tmp / f"pool-{POOL}.toml"]

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        super().set_steps(steps, hold_at)
        text = self.cfg.read_text().replace("[tpu]\n", f"[tpu]\nspare_pool = \"{POOL}\"\n", 1)
        tmp = self.cfg.with_suffix(".pool")
        tmp.write_text(text)
        tmp.replace(self.cfg)


def idle(sim: Simulator) -> list[str]:
    """The pool's idle spare instances RUNNING now: its label and no job's."""
    return sorted(r.name for r in sim.world.instances() if r.status == "RUNNING"
                  and dict(r.labels) == {"tpuwatch-pool": POOL})


@pytest.mark.parametrize("action", ["STOP", "DELETE"])
def test_kills_while_compute_jobs_of_one_pool_claim_its_spare_and_return_their_own_instance(
        tmp_path: Path, action: str) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim, RestFace(sim.world) as rest:
        # room for kills inside them: a delete and an insert about 0.5 s each
        sim.world.delays.update(delete=300.0, create=300.0, stop=300.0)
        sim.world.add_instance("sp-0", body={"labels": {"tpuwatch-pool": POOL}, "scheduling": {
            "provisioningModel": "SPOT", "instanceTerminationAction": action}})
        (tmp_path / f"pool-{POOL}.toml").write_text(
            f'[pool]\nname = "{POOL}"\nzone = "{sim.zone}"\napi = "compute"\nspares = ["sp-0"]\n')
        a = PooledInstance(sim, tmp_path, "cepool-a", compute_url=rest.url, seed=SEED * 41 + 1, action=action)
        b = PooledInstance(sim, tmp_path, "cepool-b", compute_url=rest.url, seed=SEED * 41 + 2, action=action)
        shared = Shared((a, b))  # type: ignore[arg-type]  # Shared reads only the samplers
        preempted: Counter[str] = Counter()
        try:
            for job in (a, b):
                job.capture_spec()
                job.start()
            for cycle in range(CYCLES):
                final = cycle >= CYCLES - 2
                loser, other = (a, b) if cycle % 2 == 0 else (b, a)
                for job in (a, b):
                    if job.proc is not None and job.proc.poll() is None:  # one done: its watcher ended
                        job.running_with_progress()
                loser.wait(lambda: len(idle(sim)) == 1, what="one idle spare in the pool")
                [spare] = idle(sim)
                [lost] = loser.on()
                old = vm_id(sim, lost)
                before = loser.newest()
                # the loser ends a little past its relaunch of this cycle, held until its own node is back
                # (set right before the loss, so that the attempt running until then is short of the hold)
                end = loser.hold_end() if final else 0
                sim.world.stockout()  # the lost instance is not inserted again before the claim
                sim.world.preempt_instance(lost)
                preempted[lost] += 1
                since = time.monotonic()
                moved = lambda n0=before, s=spare, j=loser: j.runs_newer(n0) and j.on() == {s}  # noqa: E731
                if not final:
                    kill_in(loser, since, 0.0, 0.8, "claim", moved)  # type: ignore[arg-type]
                    kill_in(other, since, 0.0, 0.8, "bystander", moved)  # type: ignore[arg-type]
                loser.wait(moved, timeout=60, what=f"{loser.name}'s next attempt on pool spare {spare}")
                assert labels(sim, spare) == {"tpuwatch-job": loser.name, "tpuwatch-pool": POOL}, labels(sim, spare)
                sim.inject("clear-errors")
                since = time.monotonic()
                back = lambda n=lost, o=old: idle(sim) == [n] and vm_id(sim, n) not in (None, o)  # noqa: E731
                if not final:
                    kill_in(loser, since, 0.0, 1.5, "return", back)  # type: ignore[arg-type]
                loser.wait(back, timeout=90, what=f"{lost} inserted again and returned to the pool")
                assert loser.on() == {spare}  # the job stays where it runs
                if final:
                    loser.release(end - 100)
            rcs = [a.finish(120), b.finish(120)]
            results = [job.assert_invariants(rc) for job, rc in zip((a, b), rcs, strict=True)]
        finally:
            shared.stop()
            a.close()
            b.close()
        kills = Counter(k.phase for job in (a, b) for k in job.kills)
        print(f"\ncompute spare pool chaos (seed {SEED}): kills {dict(kills)}; {shared.samples} samples of both jobs; "
              f"{[(k.phase, k.delay, k.journal_phase) for job in (a, b) for k in job.kills]}")
        assert shared.seen == [], shared.seen[:5]
        assert shared.samples > 50
        for result in results:
            assert not any(x["charged"] for x in result["attempts"]), result["attempts"]
        assert kills["claim"] + kills["bystander"] + kills["return"] >= 2 * (CYCLES - 2), kills
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # no binding lost: each job holds one instance, the pool has its one idle spare, and each
        # preempted instance was inserted once (and deleted once by tpuwatch with STOP), whatever the kills
        owners = Counter(dict(r.labels).get("tpuwatch-job", "") for r in sim.world.instances())
        assert owners == Counter({"cepool-a": 1, "cepool-b": 1, "": 1}), owners
        assert all(dict(r.labels).get("tpuwatch-pool") == POOL for r in sim.world.instances()
                   if dict(r.labels).get("tpuwatch-job", "") == "")
        by = done_ops(sim.world.list_compute_operations(sim.project, f"zones/{sim.zone}"))
        assert by["delete"] == (preempted if action == "STOP" else Counter()), (by, preempted)
        assert by["insert"] == preempted, (by, preempted)
        assert sorted(r.name for r in sim.world.instances()) == ["cepool-a", "cepool-b", "sp-0"]
