"""The spare pool's locks (cloud/poollock.py): a claim's flock excludes every other claim of the
pool from the state dir, threads of one watcher included; one job at a time is the pool's keeper."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tpuwatch.cloud import poollock
from tpuwatch.model import NodeSnapshot


def test_a_claim_waits_for_another_claim_of_the_pool_in_another_thread(tmp_path: Path) -> None:
    order: list[str] = []
    inside = threading.Event()
    leave = threading.Event()

    def first() -> None:
        with poollock.held(tmp_path, "v5p"):
            order.append("first in")
            inside.set()
            leave.wait(10)
            order.append("first out")

    def second() -> None:
        inside.wait(10)
        with poollock.held(tmp_path, "v5p"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    inside.wait(10)
    # the second is held off for as long as the first holds the lock, however long
    for _ in range(20):
        assert order == ["first in"]
        time.sleep(0.01)
    with poollock.held(tmp_path, "other"):  # another pool's claims are not held off
        pass
    leave.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]


def test_one_job_at_a_time_keeps_the_pool(tmp_path: Path) -> None:
    assert poollock.keeper(tmp_path, "kp", "a") and poollock.keeper(tmp_path, "kp", "a")
    assert not poollock.keeper(tmp_path, "kp", "b")
    assert poollock.keeper(tmp_path, "kp2", "b")  # another pool: its own keeper


def node(owner: str | None) -> NodeSnapshot:
    return NodeSnapshot(name="sp-0", project="p", zone="z", id="1", create_time=None, state="READY", health="HEALTHY",
                        health_description="", maintenance_time=None,
                        labels={"tpuwatch-pool": "v5p", **({"tpuwatch-job": owner} if owner else {})})


def test_a_claim_waits_for_its_label_to_land_and_says_when_another_job_s_did() -> None:
    slept: list[float] = []
    reads = iter([node(None), node(None), node("a")])
    assert poollock.wait_for(lambda: next(reads), "a", slept.append) and len(slept) == 2
    assert not poollock.wait_for(lambda: node("b"), "a", slept.append) and len(slept) == 2  # no wait: b's
    assert not poollock.wait_for(lambda: None, "a", slept.append)  # gone


def test_the_pools_record_of_spares_deleted_to_make_again_is_read_by_any_keeper_and_replaced_whole(
        tmp_path: Path) -> None:
    assert poollock.remaking(tmp_path, "v5p") == ()
    poollock.record(tmp_path, "v5p", ("sp-0", "sp-1"))
    assert poollock.remaking(tmp_path, "v5p") == ("sp-0", "sp-1")
    assert poollock.remaking(tmp_path, "other") == ()  # one record per pool
    poollock.record(tmp_path, "v5p", ("sp-1",))
    assert poollock.remaking(tmp_path, "v5p") == ("sp-1",)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.v5p.remaking"]  # no temporary file left
    assert (tmp_path / "pool.v5p.remaking").stat().st_mode & 0o777 == 0o600  # private as the journal
    (tmp_path / "pool.v5p.remaking").write_text("{not json")
    assert poollock.remaking(tmp_path, "v5p") == ()  # a torn or edited record: none, never a crash
