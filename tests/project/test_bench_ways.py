"""The goodput benchmark's ideal bounds past fixed slices (lab.tools.ideal_ways): hot spares and
limping on fewer slices, against the fixed-slice bound (lab.tools.ideal), and their flags."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from lab import Fault, Params, Trace, make_trace, run_tool
from lab.bounds import ideal, ideal_ways
from lab.tools import Tool, way_tools
from tpuwatch.errors import UsageError

FIXED = Tool("ideal", "ideal bound", lambda run: [ideal(run)], "")


def ways(spares: int = 0, limp_floor: int | None = None) -> Tool:
    return Tool("ways", "ways", lambda run: [ideal_ways(run)], "", spares=spares, limp_floor=limp_floor)


@pytest.mark.parametrize("slices", [1, 4, 8])
def test_with_no_spare_and_no_limping_the_bound_is_the_fixed_one(slices: int) -> None:
    p = Params(slices=slices)
    for seed in range(5):
        trace = make_trace(seed, p.days, p.workers, None, slices, spares=1)  # the spare's faults unseen
        fixed = run_tool(FIXED, trace, p)
        plain = run_tool(ways(), trace, p)
        assert (plain.goodput, plain.attempts, plain.steps_run) == (fixed.goodput, fixed.attempts, fixed.steps_run)
        # a floor of every slice never limps; the world counts in 1/slices of a step all the same
        floor_n = run_tool(ways(limp_floor=slices), trace, p)
        assert floor_n.goodput == pytest.approx(fixed.goodput, abs=1e-12)
        assert floor_n.attempts == fixed.attempts


@pytest.mark.parametrize("slices", [1, 8])
def test_a_spare_never_lowers_the_bound(slices: int) -> None:
    p = Params(slices=slices)
    gain = []
    for seed in range(20):
        trace = make_trace(seed, p.days, p.workers, None, slices, spares=1)
        fixed, spare = run_tool(FIXED, trace, p).goodput, run_tool(ways(spares=1), trace, p).goodput
        assert spare >= fixed, seed
        gain.append(spare / fixed)
    assert sum(gain) / len(gain) > 1.0 + 0.005 * (slices > 1)


@pytest.mark.parametrize("slices", [4, 8])
def test_limping_never_lowers_the_bound(slices: int) -> None:
    p = Params(slices=slices)
    gain = []
    for seed in range(20):
        trace = make_trace(seed, p.days, p.workers, None, slices)
        fixed, limp = run_tool(FIXED, trace, p).goodput, run_tool(ways(limp_floor=slices - 1), trace, p).goodput
        assert limp >= fixed, seed
        gain.append(limp / fixed)
    assert sum(gain) / len(gain) > 1.005


def test_the_spares_faults_leave_the_jobs_as_they_were() -> None:
    for slices in (1, 4):
        plain = make_trace(7, 30, 4, None, slices)
        spared = make_trace(7, 30, 4, None, slices, spares=2)
        assert tuple(f for f in spared.faults if f.slice < slices) == plain.faults
        assert spared.stockouts == plain.stockouts  # a spare's preemption brings no stockout of its own
        assert {f.slice for f in spared.faults} >= {slices, slices + 1}  # the spares have faults too


# One day, one slice: the job starts at 0 (120 s start-up, then cycles of 900 steps of 2 s and a
# 30 s save, 1830 s). Preempted at T = 4380 s: step 2100, newest checkpoint 1800 (at 3780 s).
DAY = 86400.0
T = 4380.0


def by_hand(launch: float, ckpt: int = 1800) -> float:
    """Goodput of a relaunch at `launch` from `ckpt` left to run to the end of the day."""
    cycles, rest = divmod(DAY - launch - 120.0, 1830.0)
    return (ckpt + int(cycles) * 900 + min(900, int(rest // 2))) * 2.0 / DAY


def test_one_preemption_by_hand() -> None:
    p = Params(days=1)
    trace = Trace(0, DAY, (Fault(T, "preemption"),), (), spares=1)
    # fixed: delete 90 s and create 300 s, relaunch at 4770 s: 1800 + 44 x 900 + 495 = 41,895 steps
    assert run_tool(FIXED, trace, p).goodput == pytest.approx(41_895 * 2 / DAY) == pytest.approx(by_hand(T + 390))
    # a spare: relaunched on it at once: 1800 + 44 x 900 + 690 = 42,090 steps
    r = run_tool(ways(spares=1), trace, p)
    assert r.goodput == pytest.approx(42_090 * 2 / DAY) == pytest.approx(by_hand(T))
    assert r.resume["preemption"] == [0.0]


def test_a_preempted_spare_is_recreated_and_used_once_ready() -> None:
    p = Params(days=1)
    # the spare (role 1) is preempted 380 s before the job's slice: it is READY again at 4390 s
    trace = Trace(0, DAY, (Fault(T - 380, "preemption", slice=1), Fault(T, "preemption")), (), spares=1)
    r = run_tool(ways(spares=1), trace, p)
    assert r.goodput == pytest.approx(42_085 * 2 / DAY) == pytest.approx(by_hand(T + 10))
    assert r.resume["preemption"] == [pytest.approx(10.0)]  # the spare's own preemption stopped nothing


def test_limping_through_a_stockout_by_hand() -> None:
    """Two slices, floor 1: slice 1 preempted at T into a 2 h stockout (back at T + 7500 s)."""
    p = Params(days=1, slices=2)
    trace = Trace(0, DAY, (Fault(T, "preemption", slice=1),), ((T, T + 7200.0),))
    # fixed: relaunched at T + 7500: 1800 + 40 x 900 + 600 = 38,400 steps
    assert run_tool(FIXED, trace, p).goodput == pytest.approx(38_400 * 2 / DAY)
    # limping: on slice 0 from T (checkpoint 1800), 5 cycles of 900 steps at half a step each by
    # T + 120 + 5 x 1830 = T + 9270, the first checkpoint after slice 1 is back; then on both from
    # 1800 + 2250 = 4050 steps: 39 cycles and 629.5 steps (1259 half steps) by the end of the day
    r = run_tool(ways(limp_floor=1), trace, p)
    assert r.goodput == pytest.approx((4050 + 39 * 900 + 629.5) * 2 / DAY, abs=1 / DAY)
    assert r.productive_steps == 39_779  # whole steps: 79,559 halves
    assert r.attempts == 3  # both, limping on one, both again


def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("argv", "words"), [
    (["--spares", "-1"], "--spares"),
    (["--limp-floor", "1"], "--slices 2 or more"),
    (["--slices", "4", "--limp-floor", "0"], "--limp-floor"),
    (["--slices", "4", "--limp-floor", "5"], "1 to --slices (4)"),
    (["--api", "compute", "--spares", "1"], "--api compute"),
])
def test_the_flags_are_checked(argv: list[str], words: str) -> None:
    with pytest.raises(UsageError, match=re.escape(words)) as err:
        bench().main(argv)
    assert err.value.exit_code == 2


def test_the_script_shows_each_ways_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench().main(["--days", "2", "--seed", "1", "--slices", "2", "--spares", "1", "--limp-floor", "1",
                         "--tools", "ideal", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["tool"] for t in out["tools"]] == ["ideal", "ideal-spares", "ideal-limp", "ideal-both"]
    assert [w["tool"] for w in out["ways"]] == ["ideal-spares", "ideal-limp", "ideal-both"]
    assert all(w["of_fixed_ideal"] >= 1.0 for w in out["ways"])
    assert [b["tool"] for b in out["permanent_bug"]] == ["ideal"]  # the ways' bounds are about faults
    assert [t.key for t in way_tools(1)] == ["ideal-spares"] and way_tools() == []
