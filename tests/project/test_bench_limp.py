"""tpuwatch limping in the goodput benchmark: `[job] min_slices` over a BenchWorld whose job runs
an attempt on the slices the tick hands it (lab/), against the fixed-slice tpuwatch and the bounds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lab import BenchWorld, Fault, Params, Sim, Trace, make_tools, run_tool, tpuwatch_config
from lab.job import way_params
from lab.tools import Tool

# A slice in a long repair is waited for rather than its request made again (repair_timeout):
# what limping is for
CONFIG = tpuwatch_config(repair_timeout="6h")
POLL = float(CONFIG.recovery["poll_interval"])
P = Params(days=0.5, slices=2)
LOST = 2 * 3600.0 + 600.0  # slice 1 goes down (a maintenance that heals after 4 h)
TRACE = Trace(1, P.horizon, (Fault(LOST, "maintenance", heal_after=4 * 3600.0, slice=1),), ())


def tpuwatch(limp_floor: int | None) -> Tool:
    return next(t for t in make_tools(CONFIG, CONFIG, slices=P.slices, limp_floor=limp_floor) if t.key == "tpuwatch")


def test_tpuwatch_limps_on_the_slice_left_while_the_other_heals_for_hours_then_grows_back() -> None:
    limp, fixed = run_tool(tpuwatch(1), TRACE, P), run_tool(tpuwatch(None), TRACE, P)
    assert limp.error == "" and fixed.error == ""
    assert limp.label == "tpuwatch (defaults, min_slices 1)"
    # on both, then on slice 0 alone from its newest checkpoint, then on both again once slice 1 is back
    assert limp.attempt_slices == [2, 1, 2] and fixed.attempt_slices == [2, 2]
    # without slice 1 (UNHEALTHY_MAINTENANCE at the limp) from the loss to the first checkpoint after its heal
    (hours,) = limp.limp_hours.values()
    assert list(limp.limp_hours) == ["UNHEALTHY"] and 4.0 < hours < 4.0 + 1.2 and fixed.limp_hours == {}
    assert limp.rows.get("limp") == 1 and limp.rows.get("grow") == 1 and limp.rows.get("grow_wait", 0) >= 1
    # relaunched on the slice left at the tick after the loss (a poll at most, with its jitter)
    (to_launch,) = limp.resume["maintenance"]
    assert to_launch <= 1.5 * POLL
    # half a step a step for 4 h is worth more than waiting for the slice
    assert limp.goodput > fixed.goodput + 0.05


def test_a_preempted_slice_is_made_again_in_the_background_while_tpuwatch_limps_then_grown_onto() -> None:
    # A job that limps runs on slices made one by one with [tpu.spec] (no queued resource): the
    # preempted slice is deleted and created again while the job trains on the other
    trace = Trace(1, P.horizon, (Fault(LOST, "preemption", slice=1),), ())
    limp = run_tool(tpuwatch(1), trace, P)
    assert limp.error == "" and limp.attempt_slices == [2, 1, 2]
    assert limp.rows.get("spare_remake") == 2 and limp.rows.get("grow") == 1  # a delete, then a create
    assert list(limp.limp_hours) == ["PREEMPTED"] and limp.limp_hours["PREEMPTED"] < 1.0
    w = BenchWorld(Sim(), way_params(P, limp_floor=1), [])
    assert w.queued == "" and w.p.made_alone


def test_googles_autorepair_ends_an_attempt_limping_without_the_new_slice() -> None:
    # Multislice autorepair restarts the request's other slices once the new one is READY: those a
    # job limps on too, so their attempt ends (its processes killed) though it never ran there
    w = BenchWorld(Sim(), way_params(Params(days=1, slices=2, limp_queued=True), limp_floor=1), [])
    assert w.queued == "ACTIVE"
    assert w.launch(1) is not None
    w.sim.run(3600.0)
    assert w.maintenance_event("stuck", None, "REPAIRING", s=1)  # replaced by Google
    assert w.stop_job([0])
    limping = w.launch(2, slices=[0])
    assert limping is not None and limping.p.step_time == w.p.step_time * 2
    w.sim.run(w.sim.now + w.p.autorepair_after + w.p.create_time + 1)
    node = w.slices[0].node
    assert node is not None and node.state == "RESTARTING" and limping.ended
    w.sim.run(w.sim.now + w.p.multislice_restart)
    assert w.usable(0) and w.usable(1)


def test_the_script_runs_tpuwatch_limping_against_the_limping_bound(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--days", "0.25", "--seeds", "3-3", "--slices", "2", "--limp-floor", "1",
                        "--tools", "ideal,tpuwatch", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {t["tool"]: t for t in out["tools"]}
    assert list(rows) == ["ideal", "ideal-limp", "tpuwatch"]
    assert rows["tpuwatch"]["label"] == "tpuwatch (defaults, min_slices 1)"
    assert "slice_lost_to_launch" in rows["tpuwatch"]
    (way,) = out["ways"]
    assert way["tool"] == "ideal-limp" and 0 < way["tpuwatch_of_it_mean"] <= 1.0
