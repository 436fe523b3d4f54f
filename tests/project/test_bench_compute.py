"""The goodput benchmark's Compute Engine model (lab.compute): tpuwatch's real tick
and policy over a TPU7x-shaped Spot MIG whose state reaches it through the product's own
`cloud.compute` mapping of compute_v1 messages."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path

import pytest

from lab import Fault, Params, Trace, TraceConfig, make_trace, run_all, run_tool
from lab.clock import Sim
from lab.compute import BenchCompute, MigModel, compute_config, compute_tools
from lab.tools import Run, Tool
from lab.world import BenchWorld, Meter
from tpuwatch.errors import UsageError

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

CONFIG = compute_config()
P = Params(days=1)
HOUR = 3600.0


def tools(*keys: str) -> list[Tool]:
    return [t for t in compute_tools(CONFIG, CONFIG, "spot") if t.key in keys]


def test_a_spot_preemption_is_recreated_through_a_stockout_and_tpuwatch_beats_the_bash_loop() -> None:
    # preempted at hour 6, with no capacity for the next 40 minutes: only a recreate cures it
    trace = Trace(0, P.horizon, (Fault(6 * HOUR, "preemption"),), ((6 * HOUR, 6 * HOUR + 2400.0),))
    report = run_all(tools("ideal", "tpuwatch", "bash"), trace, P)
    r = {x.key: x for x in report.results}
    assert not r["tpuwatch"].error
    assert r["tpuwatch"].memory is not None and r["tpuwatch"].memory["recreates"] >= 1
    assert math.isfinite(r["tpuwatch"].resume["preemption"][0])  # resumed after the MIG made the slice again
    assert math.isinf(r["bash"].resume["preemption"][0])  # a stopped Spot VM is never restarted
    assert r["tpuwatch"].goodput > r["bash"].goodput
    assert r["tpuwatch"].goodput >= 0.97 * r["ideal"].goodput


def test_a_host_error_is_left_to_google_and_the_job_resumes_without_a_recreate() -> None:
    trace = Trace(0, P.horizon, (Fault(6 * HOUR, "maintenance", heal_after=600.0),), ())
    report = run_all(tools("tpuwatch"), trace, P)
    r = report.results[0]
    assert not r.error and r.memory is not None and r.memory["recreates"] == 0
    assert r.resume["maintenance"][0] < 900.0


def test_a_mig_making_its_slice_again_through_a_stockout_is_still_the_jobs() -> None:
    # what the product's mapping makes of a MIG retrying its creates with no instance yet
    sim = Sim()
    world = BenchWorld(sim, P, [(0.0, HOUR)])
    mig = MigModel(Run(sim, world, Meter(), random.Random(0)), "spot")
    api = BenchCompute(mig, Meter(), "bench")
    before = api.get_node("llm-pod")
    assert before is not None and before.state == "READY" and before.owner == "bench"
    mig.recreate()
    sim.run(600.0)  # deleted, then a create refused for want of capacity
    node = api.get_node("llm-pod")
    assert node is not None and node.state == "REPAIRING" and not node.workers
    assert node.owner == "bench"  # from the instance template: not a person's MIG
    assert node.id and node.id != before.id  # the delete's end is seen
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in node.health_description


def test_fast_forward_gives_the_figures_of_every_tick() -> None:
    # half a day at six times the rates of the three days this once ran: as many faults for a
    # sixth of the every-tick run's ticks (the run that costs the most)
    p = Params(days=0.5)
    trace = make_trace(3, p.days, p.workers, TraceConfig(maintenance=180, stuck=60, preemptions=120, crashes=60))
    fast, every = (run_tool(compute_tools(CONFIG, CONFIG, "spot", skip)[2], trace, p) for skip in (True, False))
    assert fast.real_ticks < every.real_ticks == every.ticks
    assert (fast.goodput, fast.attempts, fast.meter, fast.rows) == (every.goodput, every.attempts, every.meter,
                                                                    every.rows)


def test_script_api_compute(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # one day: the output's shape and a clean run are checked, not figures that need a long one
    assert mod.main(["--api", "compute", "--days", "1", "--json", "--tools", "ideal,tpuwatch,bash"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["tool"] for t in out["tools"]] == ["ideal", "tpuwatch", "bash"]
    assert not out["tools"][1]["error"]
    with pytest.raises(UsageError) as err:
        mod.main(["--api", "compute", "--slices", "2"])
    assert err.value.exit_code == 2 and "--api compute" in str(err.value)
