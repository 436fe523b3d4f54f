"""ZoneNodes against the simulator: the jobs of one zone share one ListNodes per poll."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.cloud.tpu.zonenodes import Due, JobNodes, ZoneNodes
from tpuwatch.errors import CloudError
from tpuwatch.sim.simulator import Simulator

FAST = RetryPolicy(multiplier=0.005, max_wait=0.05, max_attempts=2)


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    with Simulator(root=tmp_path / "sim", speed=600, seed=3, workers=False) as s:
        for k, v in s.env.items():
            monkeypatch.setenv(k, v)
        yield s


def zone(sim: Simulator, clock: list[float] | None = None) -> ZoneNodes:
    tpu = TpuAdapter(sim.project, sim.zone, retry=FAST)
    return ZoneNodes(tpu) if clock is None else ZoneNodes(tpu, clock=lambda: clock[0])


def test_jobs_due_together_share_one_list_and_no_get(sim: Simulator) -> None:
    for name in ("ja", "jb", "jc"):
        sim.create_node(name, "v4-8")
    now = [100.0]
    z = zone(sim, now)
    due = Due(100.0)
    views = [JobNodes(z, due, slack=0.5) for _ in range(3)]
    now[0] = 102.0  # the ticks got their slots a while after they were due: the first lists
    found = [v.get_node(n) for v, n in zip(views, ("ja", "jb", "jc"), strict=True)]
    assert [n.name for n in found if n is not None] == ["ja", "jb", "jc"]
    assert sim.world.call_count("ListNodes") == 1 and sim.world.call_count("/GetNode") == 0
    # The next poll: due after the listing began (less the slack) -> one new list for all.
    now[0] = due.at = 130.0
    assert views[0].get_node("ja") is not None and views[1].get_node("jb") is not None
    assert sim.world.call_count("ListNodes") == 2 and z.lists == 2


def test_a_listed_node_holds_what_a_get_returns(sim: Simulator) -> None:
    # ListNodes returns whole Node messages: health, its text and the upcoming maintenance too.
    sim.create_node("ja", "v4-8")
    sim.inject("upcoming-maintenance", node="ja", starts_in="1h")
    sim.inject("maintenance", node="ja", stuck="UNHEALTHY_MAINTENANCE")
    listed = zone(sim).get_node("ja")
    got = TpuAdapter(sim.project, sim.zone, retry=FAST).get_node("ja")
    assert listed is not None and got is not None
    assert listed == got
    assert listed.health == "UNHEALTHY_MAINTENANCE"


def test_a_node_missing_from_the_listing_is_confirmed_with_a_get(sim: Simulator) -> None:
    sim.create_node("ja", "v4-8")
    z = zone(sim)
    assert z.get_node("gone") is None
    assert (sim.world.call_count("ListNodes"), sim.world.call_count("/GetNode")) == (1, 1)
    assert z.gets == 1


def test_jobs_asking_while_a_list_is_under_way_wait_for_it(sim: Simulator) -> None:
    for i in range(6):
        sim.create_node(f"j{i}", "v4-8")
    sim.inject("slow-api", methods="ListNodes", latency="300s", jitter=0.0)  # 0.5 s at speed 600
    z = zone(sim)
    start = time.monotonic()
    out: dict[str, object] = {}

    def ask(name: str) -> None:
        out[name] = z.get_node(name, not_before=start)

    threads = [threading.Thread(target=ask, args=(f"j{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(out[f"j{i}"] is not None for i in range(6))
    assert sim.world.call_count("ListNodes") == 1


def test_every_job_waiting_on_a_failed_list_sees_its_error(sim: Simulator) -> None:
    sim.create_node("ja", "v4-8")
    sim.inject("api-errors", methods=["ListNodes"], rate=1.0, codes=["PERMISSION_DENIED"])
    z = zone(sim)
    with pytest.raises(CloudError):
        z.get_node("ja")
    sim.world.clear_errors()
    assert z.get_node("ja") is not None  # a failed list is not kept
