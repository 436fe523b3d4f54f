"""tpuwatch with a hot spare in the goodput benchmark: `[tpu] spares` over a BenchWorld whose
nodes are all made alone, the job launched on whichever nodes the tick's view names (lab/),
against the fixed-slice tpuwatch and the spare's bound."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lab import Fault, Params, Trace, make_tools, run_tool, tpuwatch_config
from lab.tools import Tool

CONFIG = tpuwatch_config()
POLL = float(CONFIG.recovery["poll_interval"])
P = Params(days=0.5, slices=2)
LOST = 2 * 3600.0 + 600.0  # slot 1 is preempted, into a 2 h stockout
AGAIN = LOST + 3 * 3600.0  # the node in slot 1 then (the spare) is preempted in turn
STOCKOUT = ((LOST, LOST + 2 * 3600.0),)
TRACE = Trace(1, P.horizon, (Fault(LOST, "preemption", slice=1), Fault(AGAIN, "preemption", slice=1)), STOCKOUT,
              spares=1)


def tpuwatch(spares: int) -> Tool:
    return next(t for t in make_tools(CONFIG, CONFIG, slices=P.slices, spares=spares) if t.key == "tpuwatch")


def test_tpuwatch_swaps_a_preempted_slice_for_its_spare_within_a_poll_and_makes_the_lost_one_again() -> None:
    spare, fixed = run_tool(tpuwatch(1), TRACE, P), run_tool(tpuwatch(0), TRACE, P)
    assert spare.error == "" and fixed.error == ""
    assert spare.label == "tpuwatch (defaults, 1 spare)"
    # on its own two nodes; on the spare in slot 1's place; then, the spare preempted in turn (the
    # trace's faults strike roles: slot 1 is the spare's now), on llm-pod-1, made again meanwhile
    assert spare.attempt_nodes == [("llm-pod-0", "llm-pod-1"), ("llm-pod-0", "llm-pod-2"),
                                   ("llm-pod-0", "llm-pod-1")]
    assert spare.rows.get("swap") == 2
    # each preempted node deleted and created again in the background (the first through the stockout)
    assert spare.rows.get("spare_remake", 0) >= 4
    # relaunched on the spare at the tick after each loss (a poll at most, with its jitter)
    assert len(spare.resume["preemption"]) == 2 and max(spare.resume["preemption"]) <= 1.5 * POLL
    # the fixed-slice tpuwatch makes its multislice request again, the first time behind the stockout
    assert fixed.rows.get("swap") is None and fixed.resume["preemption"][0] > 2 * 3600.0
    assert spare.goodput > fixed.goodput + 0.1


def test_the_script_runs_tpuwatch_with_its_spare_against_the_spares_bound(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--days", "1", "--seed", "3", "--slices", "2", "--spares", "1", "--tools", "ideal,tpuwatch",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (tw,) = [t for t in out["tools"] if t["tool"] == "tpuwatch"]
    assert tw["label"] == "tpuwatch (defaults, 1 spare)" and tw["error"] == ""
    (way,) = out["ways"]
    assert way["tool"] == "ideal-spares" and way["of_it"]["tpuwatch"] is not None
    assert [b["tool"] for b in out["permanent_bug"]] == ["ideal", "tpuwatch"]


def test_fast_forward_with_a_spare_gives_the_figures_of_every_tick() -> None:
    """Skipping idle ticks beside a spare (its create tried again through the stockout on the
    policy's own schedule, the swaps) replays them exactly: the same world, decisions and API counts."""
    (cfg,) = (t for t in make_tools(CONFIG, CONFIG, slices=P.slices, spares=1, skip_idle=False) if t.key == "tpuwatch")
    fast, slow = run_tool(tpuwatch(1), TRACE, P), run_tool(cfg, TRACE, P)
    assert fast.error == slow.error == ""
    assert (fast.goodput, fast.meter, fast.rows, fast.ticks, fast.attempt_nodes, fast.resume) == (
        slow.goodput, slow.meter, slow.rows, slow.ticks, slow.attempt_nodes, slow.resume)
    assert fast.real_ticks < slow.real_ticks / 2 and slow.real_ticks == slow.ticks
