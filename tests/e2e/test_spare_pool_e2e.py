"""End to end: a watcher-wide spare pool ([pool] file, [tpu] spare_pool) shared by two jobs of
one `tpuwatch watch`.

Jobs `a` and `b` (Spot nodes `a` and `b`, v4-8, one worker each, with a [tpu.spec]) name pool
`v4`, whose one spare `sp-0` is idle (labelled `tpuwatch-pool=v4`, no job's). `a` is preempted:
it claims `sp-0` and trains there, no delete or create on its path; its own node, made again
from its spec, goes to the pool. Then `b` is preempted and takes that node. Never two trainers
on one node. Each trainer holds at step 100 until the test lets it go, so each stage meets
running jobs however slow the machine. Outcomes come from the simulated world (labels,
processes), the checkpoints and the journals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import Overlap, checkpoint_steps, node_trainers, trainer, write_config
from test_priorities_e2e import Lines, history, labels

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200
SPEC = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}
NODES = ("a", "b", "sp-0")


def job(sim: Simulator, tmp: Path, name: str) -> tuple[Path, Path]:
    """Spot node `name` READY, labelled job `name`'s; the job's config (of pool v4), and the
    directory whose file `100` lets its trainer past step 100."""
    sim.create_node(name, "v4-8", labels={"tpuwatch-job": name}, spot=True)
    ck = sim.bucket / name
    go = tmp / f"go-{name}"
    go.mkdir()
    cfg = write_config(tmp / f"{name}.toml", sim, trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1",
                                                          steps=STEPS), ck, name=name, spec=SPEC,
                       tpu={"spare_pool": "v4"})
    return cfg, go


def trainers(sim: Simulator, node: str) -> list[dict[str, str]]:
    return node_trainers(sim, node, ("a", "b"))


def on(sim: Simulator, node: str, who: str, attempt: int) -> bool:
    return any(e["TPUWATCH_JOB"] == who and e["TPUWATCH_ATTEMPT"] == str(attempt) for e in trainers(sim, node))


def node_id(sim: Simulator, node: str) -> str:
    got = TpuAdapter(sim.project, sim.zone).get_node(node)
    return got.id if got is not None else ""


def state(sim: Simulator, node: str) -> str:
    got = TpuAdapter(sim.project, sim.zone).get_node(node)
    return got.state if got is not None else "MISSING"


def claims(tmp: Path, job: str) -> list[str]:
    with Journal.open(tmp / "state", job, job, readonly=True) as journal:
        return [e.reason for e in journal.events() if e.kind == "pool_claim"]


def test_two_jobs_share_one_pool_spare_and_a_returned_node_serves_the_next_loss(sim: Simulator,
                                                                                tmp_path: Path) -> None:
    a, go_a = job(sim, tmp_path, "a")
    b, go_b = job(sim, tmp_path, "b")
    sim.create_node("sp-0", "v4-8", labels={"tpuwatch-pool": "v4"})
    pool = tmp_path / "pool-v4.toml"
    pool.write_text(f'[pool]\nname = "v4"\nzone = "{sim.zone}"\naccelerator_type = "v4-8"\nspares = ["sp-0"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(a), "-c", str(b), "-c",
                             str(pool), "--json"],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lines = Lines(proc)  # its JSON read as it comes: a full pipe would stall the watcher
    overlap = Overlap(sim, NODES, ("a", "b"))
    try:
        lines.wait(lambda: on(sim, "a", "a", 1) and on(sim, "b", "b", 1) and len(checkpoint_steps(sim.bucket / "a")) >= 2,
                   "both jobs training")
        spare_id = TpuAdapter(sim.project, sim.zone).get_node("sp-0").id  # type: ignore[union-attr]
        deletes = sim.world.call_count("DeleteNode")
        sim.world.stockout()  # a's own node is not made again until the test lifts it: a stage to look at
        sim.inject("preempt", node="a")
        lines.wait(lambda: on(sim, "sp-0", "a", 2), "job a's attempt 2 on pool spare sp-0")
        assert labels(sim, "sp-0") == {"tpuwatch-job": "a", "tpuwatch-pool": "v4"}
        # nothing deleted or created on a's path: sp-0 is the node it was, at most a's own node deleted
        assert TpuAdapter(sim.project, sim.zone).get_node("sp-0").id == spare_id  # type: ignore[union-attr]
        assert sim.world.call_count("DeleteNode") <= deletes + 1
        assert on(sim, "b", "b", 1)  # b untouched
        sim.inject("clear-errors")
        lines.wait(lambda: labels(sim, "a") == {"tpuwatch-pool": "v4"}, "node a made again and returned to the pool",
                   150)
        assert on(sim, "sp-0", "a", 2)  # a stays where it runs
        sim.inject("preempt", node="b")
        lines.wait(lambda: on(sim, "a", "b", 2), "job b's attempt 2 on node a, returned to the pool", 150)
        assert labels(sim, "a") == {"tpuwatch-job": "b", "tpuwatch-pool": "v4"}
        # b's own node, made again, goes to the pool; TERMINATED there, idle, the pool's keeper makes it again
        lines.wait(lambda: labels(sim, "b") == {"tpuwatch-pool": "v4"}, "node b made again and returned to the pool",
                   150)
        idle_id = node_id(sim, "b")
        sim.inject("terminate", node="b")  # made again from a plain spec: not a Spot node any more
        lines.wait(lambda: node_id(sim, "b") not in ("", idle_id) and state(sim, "b") == "READY",
                   "idle pool spare b made again by the pool's keeper", 150)
        assert labels(sim, "b") == {"tpuwatch-pool": "v4"}
        (go_a / "100").touch()
        (go_b / "100").touch()
        rc, out = lines.finish(150)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    for cfg, name in ((a, "a"), (b, "b")):
        assert checkpoint_steps(sim.bucket / name)[-1] == STEPS
        done = history(cfg, env)
        assert [(x["outcome"], x["charged"]) for x in done] == [("disruption", False), ("success", False)], done
    # the journals say each claim; the JSON shows the pool and who holds what
    assert any("claimed sp-0 from spare pool v4" in e for e in claims(tmp_path, "a"))
    assert any("claimed a from spare pool v4" in e for e in claims(tmp_path, "b"))
    ticks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    held = [{n["name"]: n["held_by"] for n in t["spare_pool"]["nodes"]} for t in ticks if t.get("spare_pool")]
    assert {"sp-0": "a", "a": None} in held and {"sp-0": "a", "a": "b"} in held, held[-3:]
    assert any(t.get("job") == "a" and t.get("row") == "pool_return" for t in ticks)
    assert any(t.get("row") == "spare_remake" and "an idle spare of pool v4" in t.get("summary", "") for t in ticks)


def test_a_watcher_killed_once_its_claim_landed_swaps_onto_the_spare_at_its_next_start(sim: Simulator,
                                                                                      tmp_path: Path) -> None:
    a, go_a = job(sim, tmp_path, "a")
    b, go_b = job(sim, tmp_path, "b")
    sim.create_node("sp-0", "v4-8", labels={"tpuwatch-pool": "v4"})
    pool = tmp_path / "pool-v4.toml"
    pool.write_text(f'[pool]\nname = "v4"\nzone = "{sim.zone}"\nspares = ["sp-0"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    args = [sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(a), "-c", str(b), "-c", str(pool), "--json"]
    proc = subprocess.Popen(args, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    lines = Lines(proc)
    overlap = Overlap(sim, NODES, ("a", "b"))
    try:
        lines.wait(lambda: on(sim, "a", "a", 1) and on(sim, "b", "b", 1), "both jobs training")
        sim.world.stockout()  # a's own node stays gone: only the spare can take it
        sim.inject("preempt", node="a")
        lines.wait(lambda: labels(sim, "sp-0").get("tpuwatch-job") == "a", "sp-0 labelled job a's")
        proc.kill()  # kill -9 between the claim and the launch there (or just after it)
        proc.wait(10)
        proc = subprocess.Popen(args, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        lines = Lines(proc)
        lines.wait(lambda: on(sim, "sp-0", "a", 2), "job a's attempt 2 on sp-0 after the restart")
        assert labels(sim, "sp-0") == {"tpuwatch-job": "a", "tpuwatch-pool": "v4"} and on(sim, "b", "b", 1)
        sim.inject("clear-errors")
        (go_a / "100").touch()
        (go_b / "100").touch()
        rc, out = lines.finish(150)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    assert [(x["outcome"], x["charged"]) for x in history(a, env)] == [("disruption", False), ("success", False)]
    assert [x["outcome"] for x in history(b, env)] == ["success"]


def test_two_jobs_losing_their_nodes_together_never_both_claim_the_one_spare(sim: Simulator, tmp_path: Path) -> None:
    a, go_a = job(sim, tmp_path, "a")
    b, go_b = job(sim, tmp_path, "b")
    sim.create_node("sp-0", "v4-8", labels={"tpuwatch-pool": "v4"})
    pool = tmp_path / "pool-v4.toml"
    pool.write_text(f'[pool]\nname = "v4"\nzone = "{sim.zone}"\nspares = ["sp-0"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(a), "-c", str(b), "-c",
                             str(pool), "--json"], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lines = Lines(proc)
    overlap = Overlap(sim, NODES, ("a", "b"))
    try:
        lines.wait(lambda: on(sim, "a", "a", 1) and on(sim, "b", "b", 1), "both jobs training")
        sim.inject("preempt", node="a")
        sim.inject("preempt", node="b")
        # one job on the spare; the other on its own node made again, or on the winner's, returned
        lines.wait(lambda: any(on(sim, "sp-0", w, 2) and any(on(sim, n, x, 2) for n in ("a", "b"))
                               for w, x in (("a", "b"), ("b", "a"))), "each job's attempt 2", 150)
        winner = labels(sim, "sp-0")["tpuwatch-job"]
        loser = "b" if winner == "a" else "a"
        (go_a / "100").touch()
        (go_b / "100").touch()
        rc, out = lines.finish(150)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    # the loser's claim, if it made one, was refused next to the write: the spare was the winner's
    assert not any(e.startswith("claimed sp-0") for e in claims(tmp_path, loser))
    assert any(e.startswith("claimed sp-0") for e in claims(tmp_path, winner))


def test_a_spare_its_keeper_deleted_to_make_again_is_made_by_the_next_keeper_once_that_job_is_gone(
        sim: Simulator, tmp_path: Path) -> None:
    a, go_a = job(sim, tmp_path, "a")
    b, go_b = job(sim, tmp_path, "b")
    for spare in ("sp-0", "sp-1"):
        sim.create_node(spare, "v4-8", labels={"tpuwatch-pool": "v4"})
    pool = tmp_path / "pool-v4.toml"
    pool.write_text(f'[pool]\nname = "v4"\nzone = "{sim.zone}"\nspares = ["sp-0", "sp-1"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}

    def watch(cfg: Path) -> tuple[subprocess.Popen[str], Lines]:
        proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(cfg), "-c", str(pool),
                                 "--json"], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        return proc, Lines(proc)

    proc, lines = watch(a)  # job a alone: the pool's keeper
    try:
        lines.wait(lambda: on(sim, "a", "a", 1), "job a training")
        sim.world.stockout()  # the keeper's create of sp-0 comes to nothing while the test looks
        sim.inject("terminate", node="sp-0")
        lines.wait(lambda: state(sim, "sp-0") == "MISSING", "idle TERMINATED sp-0 deleted by keeper a to make again")
        proc.kill()  # job a's watching ends (its config gone) before sp-0 is created again
        proc.wait(10)
        TpuAdapter(sim.project, sim.zone).delete_node("sp-1")  # a person's deletion: never made again
        sim.inject("clear-errors")
        (go_a / "100").touch()
        proc, lines = watch(b)  # job b alone: the pool's new keeper
        lines.wait(lambda: on(sim, "b", "b", 1) and state(sim, "sp-0") == "READY", "sp-0 made again by keeper b", 150)
        assert labels(sim, "sp-0") == {"tpuwatch-pool": "v4"}  # idle, the pool's
        assert state(sim, "sp-1") in ("DELETING", "MISSING")
        (go_b / "100").touch()
        rc, out = lines.finish(150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert state(sim, "sp-1") == "MISSING" and labels(sim, "sp-0") == {"tpuwatch-pool": "v4"}
    assert any(t.get("job") == "b" and t.get("row") == "spare_remake" and "creating it" in t.get("summary", "")
               for t in (json.loads(x) for x in out.splitlines() if x.startswith("{")))


def test_a_claimed_spare_whose_checks_fail_goes_back_to_the_pool_marked_bad_and_is_made_again(
        sim: Simulator, tmp_path: Path) -> None:
    a, go_a = job(sim, tmp_path, "a")
    for spare in ("sp-0", "sp-1"):
        sim.create_node(spare, "v4-8", labels={"tpuwatch-pool": "v4"})
    sim.inject("device-missing", node="sp-0", worker=0)  # sp-0, the first by name, fails the launch-time checks
    bad_id = node_id(sim, "sp-0")
    pool = tmp_path / "pool-v4.toml"
    pool.write_text(f'[pool]\nname = "v4"\nzone = "{sim.zone}"\nspares = ["sp-0", "sp-1"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(a), "-c", str(pool), "--json"],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    lines = Lines(proc)
    try:
        lines.wait(lambda: on(sim, "a", "a", 1), "job a training")
        sim.world.stockout()  # a's own node is not made again meanwhile: only the pool can serve
        sim.inject("preempt", node="a")
        lines.wait(lambda: bool(trainers(sim, "sp-1")), "job a on pool spare sp-1, sp-0 having failed its checks")
        assert labels(sim, "sp-1") == {"tpuwatch-job": "a", "tpuwatch-pool": "v4"}
        assert trainers(sim, "sp-0") == []
        sim.inject("clear-errors")
        # back in the pool marked bad, then deleted and created again by the keeper (job a): a new
        # node, idle, unmarked
        lines.wait(lambda: node_id(sim, "sp-0") not in ("", bad_id) and state(sim, "sp-0") == "READY",
                   "sp-0 made again by the pool's keeper", 150)
        assert labels(sim, "sp-0") == {"tpuwatch-pool": "v4"}
        (go_a / "100").touch()
        rc, out = lines.finish(150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert "launch-time checks fail on spare sp-0" in out, out[-4000:]
    assert [(x["outcome"], x["charged"]) for x in history(a, env)] == [("disruption", False), ("success", False)]
    with Journal.open(tmp_path / "state", "a", "a", readonly=True) as journal:
        marked = [e for e in journal.events() if e.kind == "relabel" and e.data.get("node") == "sp-0"]
    assert marked and marked[0].data["labels"] == {"tpuwatch-pool": "v4", "tpuwatch-pool-bad": "a"}, marked
