"""Chaos: `tpuwatch watch` SIGKILLed at seeded moments of launch, delete, create and queued
phases, and started again, while the simulator plays maintenance, recreation and stockout.

The invariants are read from the world, never from tpuwatch's words: exactly one node at the
end, the job done from the right checkpoint (each attempt resumed from the newest complete
checkpoint present at its launch), never two trainers on a worker nor two attempts alive at
once (sampled every 100 ms all along), and a journal that opens and passes SQLite's check
after every kill. The three scenarios run at once on one simulator, each on its own node (the
stockouts in a zone of their own). TPUWATCH_CHAOS_SEED changes the kill moments; the kill
points are printed (pytest -s) for docs/reliability.md.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from chaos.harness import KillPoint, Watched

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("TPUWATCH_CHAOS_SEED", "9"))
# kill points each scenario must land in its phase (>= 50 in all)
LAUNCH_KILLS = 16
DELETE_KILLS = 10
CREATE_KILLS = 10
QUEUED_KILLS = 14
TOTALS: Counter[str] = Counter()
QUEUED_ZONE = "us-central2-c"  # its stockouts must not stop the other scenario's creates


def test_kills_in_launch_delete_create_and_queued_phases(tmp_path: Path) -> None:
    """The three scenarios at once on one simulator (they only wait on their own nodes)."""
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim:
        sim.world.delays.update(delete=600.0, create=600.0)  # 1 s each: room for kills inside them
        scenarios = (launch_kills, recreate_kills, queued_kills)
        with ThreadPoolExecutor(len(scenarios)) as pool:
            futures = [pool.submit(fn, sim, tmp_path / fn.__name__) for fn in scenarios]
            errors = [f.exception() for f in futures]
        print(f"\nchaos kill points survived (seed {SEED}): {dict(TOTALS)}, total {sum(TOTALS.values())}")
        for err in errors:
            if err is not None:
                raise err
        assert sim.world.scheduler_errors == [], "a simulator step raised"
        assert sim.world.host_errors == [], "an effect on the simulated hosts failed"
    phases = ("launch", "delete", "create", "queued")
    assert sum(TOTALS[p] for p in phases) >= 50, TOTALS


def counted(kills: list[KillPoint], phase: str) -> int:
    return sum(1 for k in kills if k.phase == phase)


def report(job: Watched) -> None:
    by = Counter(k.phase for k in job.kills)
    TOTALS.update(by)
    print(f"\n{job.name}: {len(job.kills)} kills {dict(by)}, watcher started {job.starts} times, "
          f"{job.sampler.samples} process samples, max trainers per worker {job.sampler.max_per_worker}, "
          f"max attempts alive {job.sampler.max_attempts}")
    print("  " + ", ".join(f"{k.phase}@{k.delay:.2f}s" for k in job.kills))


def usable(job: Watched) -> bool:
    node = job.node()
    return node is not None and node.state == "READY" and node.health == "HEALTHY"


def finish_at(job: Watched, extra: int) -> None:
    """From now on the job ends `extra` steps past its newest checkpoint: rewrite the config and
    restart the watcher on it (a kill of a running job, counted as such)."""
    job.set_steps((job.steps_done() or [0])[-1] + extra)
    job.kill(job.started_at)


def launch_kills(sim: Simulator, tmp_path: Path) -> None:
    """Healed maintenance, again and again; kills while the watcher relaunches the job."""
    job = Watched(sim, tmp_path, "chaos-launch", seed=SEED * 101 + 1)
    try:
        job.start()
        job.running_with_progress()
        cycles = 0
        final = False
        while True:
            if counted(job.kills, "launch") >= LAUNCH_KILLS and not final:
                finish_at(job, 150)  # the next relaunch runs to the end
                final = True
            # As in real life, the watcher is up and looking when the maintenance comes: it sees
            # the node unhealthy (maintenance no watcher ever saw is the audit log's to report).
            job.wait(lambda: time.monotonic() - job.started_at > 1.2, what="the watcher up")
            sim.inject("maintenance", node=job.name, heal_after=600)  # 1 s
            job.wait(lambda: not usable(job), what="maintenance to start")
            since = job.wait(lambda: usable(job), what="the node to heal")
            workers = job.node().n_workers
            for _ in range(3):  # while the relaunch has not reached every worker
                if job.kill_unless(since, 0.0, 0.9, lambda w=workers: job.workers_running() == w) is None:
                    break
                since = job.started_at
            cycles += 1
            if final:
                break
            job.running_with_progress()
        rc = job.finish()
        report(job)
        result = job.assert_invariants(rc)
        assert counted(job.kills, "launch") >= LAUNCH_KILLS, job.kills
        attempts = result["attempts"]
        charged = [(a["attempt"], a.get("exit_code"), a.get("reason")) for a in attempts if a["charged"]]
        assert not charged, charged  # maintenance is never charged
        assert len(attempts) >= cycles, (cycles, attempts)
    finally:
        job.close()


def recreate_kills(sim: Simulator, tmp_path: Path) -> None:
    """Maintenance that never heals, again and again; kills while deleting and creating."""
    job = Watched(sim, tmp_path, "chaos-recreate", seed=SEED * 101 + 2, recreatable=True,
                  repair_timeout="0.5s")
    try:
        job.start()
        job.running_with_progress()
        cycles = 0
        while True:
            final = counted(job.kills, "delete") >= DELETE_KILLS and counted(job.kills, "create") >= CREATE_KILLS
            old = job.node().id
            sim.inject("maintenance", node=job.name, stuck="REPAIRING")
            if final:
                finish_at(job, 150)  # once the maintenance has killed the attempt, as in queued_kills
            since = job.wait(lambda: job.node() is None or job.node().state == "DELETING", timeout=30,
                             what="the delete to start")

            def replaced(old: int = old) -> bool:
                node = job.node()
                return node is not None and node.id != old and node.state == "READY"

            for _ in range(job.rng.choice((2, 3))):  # while deleting
                job.kill_after(since, 0.1, 0.6)
                since = job.started_at
            def creating(old: int = old) -> bool:
                node = job.node()
                return job.journal_phase() == "creating" or (node is not None and node.id != old)

            since = job.wait(creating, timeout=30, what="the create to start")
            for _ in range(job.rng.choice((2, 3))):  # while creating (and booting)
                if replaced():
                    break
                job.kill_after(since, 0.1, 0.6)
                since = job.started_at
            job.wait(replaced, timeout=30, what="the new node")
            cycles += 1
            if final:
                break
            job.running_with_progress()
        rc = job.finish()
        report(job)
        result = job.assert_invariants(rc)
        assert counted(job.kills, "delete") >= DELETE_KILLS and counted(job.kills, "create") >= CREATE_KILLS
        # One accepted create per recreate: a kill between a create call and its journal line
        # makes the next watcher ask again, and that repeat is answered ALREADY_EXISTS.
        ops = sim.world.list_operations(f"projects/{sim.project}/locations/{sim.zone}")
        creates = [o for o in ops if o.verb == "create" and o.target.endswith(f"/nodes/{job.name}")]
        assert len(creates) == cycles, (cycles, [(o.name, o.done, o.error) for o in creates])
        assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
    finally:
        job.close()


def queued_kills(sim: Simulator, tmp_path: Path) -> None:
    """Preemption into a stockout of its own zone, again and again; kills while queued."""
    job = Watched(sim, tmp_path, "chaos-queued", seed=SEED * 101 + 3, recreatable=True, spot=True,
                  queue_timeout="1h", zone=QUEUED_ZONE)
    try:
        job.start()
        job.running_with_progress()
        while True:
            final = counted(job.kills, "queued") >= QUEUED_KILLS
            stockout = 5.0 + job.rng.random()  # real seconds
            sim.inject("stockout", zone=QUEUED_ZONE, duration=f"{stockout * sim.speed:.0f}s")
            over = time.monotonic() + stockout
            sim.inject("preempt", node=job.name, zone=QUEUED_ZONE)
            if final:
                # The end is set once the preemption has killed the attempt (the inject returns
                # then): set before, it raced the trainer, which on a busy machine wrote
                # checkpoints past it while the simulator's kill was still scanning /proc.
                finish_at(job, 150)
            while time.monotonic() < over - 0.5:
                # each kill lands a seeded moment after the journal says queued (a watcher saw the
                # create fail and waits to retry it)
                since = job.wait(lambda over=over: job.journal_phase() == "queued" or time.monotonic() > over,
                                 timeout=20, what="queued")
                if time.monotonic() > over - 0.5:
                    break
                job.kill_after(since, 0.05, 0.6)
            job.wait(lambda: usable(job), timeout=30, what="the node back after the stockout")
            if final:
                break
            job.running_with_progress()
        rc = job.finish()
        report(job)
        result = job.assert_invariants(rc)
        assert counted(job.kills, "queued") >= QUEUED_KILLS
        assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
    finally:
        job.close()


# kill points a multislice job that limps must survive in each stage (>= 20 in all)
LIMP_KILLS = 12
GROW_KILLS = 10


def test_kills_while_a_multislice_job_limps_and_grows_back(tmp_path: Path) -> None:
    """Four slices created one by one, job.min_slices 3. A seeded slice goes into maintenance
    again and again, healed once the job runs on the 3 slices left: the watcher is killed between
    the loss and the relaunch on the 3 ("limp"), and between the slice's return and the relaunch
    on all 4 ("grow").
    Never two trainers on a worker, never two attempts alive at once (sampled all along), every
    attempt resumed from the newest complete checkpoint, nothing charged."""
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim:
        job = Watched(sim, tmp_path, "chaos-limp", seed=SEED * 101 + 4, accelerator="v4-8", slices=4, min_slices=3)
        try:
            job.start()
            job.running_with_progress()
            cycles, final = 0, False
            while True:
                if counted(job.kills, "limp") >= LIMP_KILLS and counted(job.kills, "grow") >= GROW_KILLS:
                    # the attempt running now (to 100,000 steps) goes on until this last cycle's
                    # limp (killed nowhere: its kills are counted): the end lies well past that
                    finish_at(job, 400)
                    final = True
                job.wait(lambda: time.monotonic() - job.started_at > 1.2, what="the watcher up")
                lost = job.rng.choice(job.names)
                before = newest_attempt(job)
                sim.inject("maintenance", node=lost, stuck="REPAIRING")  # down until the test heals it
                since = job.wait(lambda lost=lost: not job.usable(lost), what=f"{lost} down")
                for _ in range(0 if final else 2):
                    if not kill_in_stage(job, since, 0.0, 0.8, "limp", lambda b=before: runs_newer(job, b, 3)):
                        break
                    since = job.started_at
                # the world's word that the job limped: a newer attempt on the 3 slices left
                job.wait(lambda b=before: runs_newer(job, b, 3), what="the limp")
                before = newest_attempt(job)
                sim.inject("heal", node=lost)
                since = job.wait(lambda lost=lost: job.usable(lost), what=f"{lost} back")
                for _ in range(0 if final else 2):
                    if not kill_in_stage(job, since, 0.0, 1.0, "grow", lambda b=before: runs_newer(job, b, 4)):
                        break
                    since = job.started_at
                cycles += 1
                if final:
                    break
                job.running_with_progress()
            rc = job.finish()
            report(job)
            result = job.assert_invariants(rc)
            assert counted(job.kills, "limp") >= LIMP_KILLS and counted(job.kills, "grow") >= GROW_KILLS, job.kills
            assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
            # a limp and a grow per cycle, each a new attempt
            assert len(result["attempts"]) >= 2 * cycles + 1, (cycles, result["attempts"])
        finally:
            job.close()
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0


# kill points a multislice job with spares must survive: between a slice's loss and the relaunch
# on a spare (>= 20), and while a preempted node swapped out is made again as a spare
SWAP_KILLS = 20
REMAKE_KILLS = 6


def test_kills_while_a_multislice_job_swaps_lost_slices_for_spares(tmp_path: Path) -> None:
    """Four Spot slices created one by one and two Spot spares, with [tpu.spec] to make a dead
    spare again. A seeded node the job runs on is lost again and again, in turn to a stuck
    maintenance (healed once the job runs on a spare) and to a preemption (the node then deleted
    and created again in the background, as a spare). The watcher is killed between the loss and
    the relaunch on the spare ("swap"), and while the preempted node is made again ("remake").
    Never two trainers on a worker, never two attempts alive at once, every attempt resumed from
    the newest complete checkpoint, nothing charged, and each preempted node deleted and created
    exactly once."""
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim:
        job = Watched(sim, tmp_path, "chaos-swap", seed=SEED * 101 + 5, accelerator="v4-8", slices=4, spares=2,
                      spot=True, recreatable=True)
        try:
            job.start()
            job.running_with_progress()
            cycles, preempted, final = 0, 0, False
            while True:
                if counted(job.kills, "swap") >= SWAP_KILLS and counted(job.kills, "remake") >= REMAKE_KILLS:
                    finish_at(job, 400)  # the last cycle's swap is killed nowhere; the end lies past it
                    final = True
                job.wait(lambda: time.monotonic() - job.started_at > 1.2, what="the watcher up")
                before = newest_attempt(job)
                lost = job.rng.choice(sorted(nodes_on(job, before)))
                preempt = cycles % 2 == 1
                old = job.node(lost).id
                if preempt:
                    sim.inject("preempt", node=lost)
                    preempted += 1
                else:
                    sim.inject("maintenance", node=lost, stuck="REPAIRING")  # down until the test heals it
                since = job.wait(lambda lost=lost: not job.usable(lost), what=f"{lost} down")
                for _ in range(0 if final else 2):
                    if not kill_in_stage(job, since, 0.0, 0.8, "swap", lambda b=before: runs_newer(job, b, 4)):
                        break
                    since = job.started_at
                # the world's word that the job moved: a newer attempt on 4 nodes, none of them the lost one
                job.wait(lambda b=before: runs_newer(job, b, 4), what="the swap")
                assert lost not in nodes_on(job, before + 1), (lost, job.sampler.trainers())
                if preempt:
                    since = time.monotonic()
                    for _ in range(0 if final else 2):
                        if not kill_in_stage(job, since, 0.0, 1.0, "remake",
                                             lambda lost=lost, old=old: remade(job, lost, old)):
                            break
                        since = job.started_at
                    job.wait(lambda lost=lost, old=old: remade(job, lost, old), timeout=60, what=f"{lost} made again")
                else:
                    sim.inject("heal", node=lost)
                    job.wait(lambda lost=lost: job.usable(lost), what=f"{lost} back")
                cycles += 1
                if final:
                    break
                job.running_with_progress()
            rc = job.finish()
            report(job)
            result = job.assert_invariants(rc)
            assert counted(job.kills, "swap") >= SWAP_KILLS and counted(job.kills, "remake") >= REMAKE_KILLS, job.kills
            assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
            assert len(result["attempts"]) >= cycles + 1, (cycles, result["attempts"])
        finally:
            job.close()
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # a preempted node made again once, whatever the kills: never twice, and nothing else
        assert sim.world.call_count("DeleteNode") == preempted and sim.world.call_count("CreateNode") == preempted


def nodes_on(job: Watched, attempt: int) -> set[str]:
    """The nodes on which a trainer of an attempt at least `attempt` runs (a worker's marker is
    "<instance>/<project>/<zone>/<node>/<index>")."""
    return {w.split("/")[-2] for w, procs in job.sampler.trainers().items() if any(a >= attempt for _, a in procs)}


def remade(job: Watched, name: str, old: str) -> bool:
    """Node `name` exists again, another node than `old`, READY and HEALTHY."""
    node = job.node(name)
    return node is not None and node.id != old and node.state == "READY" and node.health == "HEALTHY"


def newest_attempt(job: Watched) -> int:
    return max((a for procs in job.sampler.trainers().values() for _, a in procs), default=0)


def runs_newer(job: Watched, attempt: int, workers: int) -> bool:
    """An attempt newer than `attempt` runs on `workers` workers."""
    found = job.sampler.trainers()
    return sum(1 for procs in found.values() if any(a > attempt for _, a in procs)) >= workers


def kill_in_stage(job: Watched, since: float, lo: float, hi: float, stage: str, done: Callable[[], bool]) -> bool:
    """Kill at a seeded moment lo..hi s after `since`, counted in `stage`, unless the relaunch it
    is about is `done` first; False then (no kill)."""
    return job.kill_unless(since, lo, hi, done, stage) is not None
