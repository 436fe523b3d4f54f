"""The goodput benchmark over several slices (Multislice): the engine's one-job-over-N-slices
model, the ideal bound over N slices and the "one tpuwatch per slice" baseline (lab/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lab import (
    BenchWorld,
    Fault,
    Params,
    Sim,
    Trace,
    TraceConfig,
    make_tools,
    make_trace,
    run_tool,
    tpuwatch_config,
)
from lab.tools import Tool, per_slice_tool, tpuwatch_tool
from lab.trace import make_bug_trace
from tpuwatch.config import Config
from tpuwatch.errors import UsageError

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

CONFIG = tpuwatch_config()


def tools(slices: int) -> dict[str, Tool]:
    return {t.key: t for t in make_tools(CONFIG, CONFIG, slices=slices)}


def two_slices() -> BenchWorld:
    return BenchWorld(Sim(), Params(days=1, slices=2), [])


def test_one_slice_disrupted_ends_the_attempt_on_every_slice() -> None:
    w = two_slices()
    a = w.launch(1)
    assert a is not None and [pr.slice for pr in a.procs] == [0, 1]
    w.sim.run(3 * 3600.0)
    step = w.step_now()
    assert step > 0 and w._running()
    w.preempt(1)
    assert a.frozen == w.sim.now and not w._running()
    # slice 1's processes are gone; slice 0's live on, hung in their collectives: no progress, no checkpoint
    assert [s for _, s, _, _ in w.probe_slice(1)] == ["unreachable"] * w.p.workers
    assert [s for _, s, _, _ in w.probe_slice(0)] == ["running"] * w.p.workers
    ck = w.checkpoint()
    w.sim.run(6 * 3600.0)
    assert w.step_now() == step and w.checkpoint() == ck and not a.ended
    # slice 1 comes back and is relaunched alone: it joins no one
    w.delete_node(1)
    w.sim.run(w.sim.now + w.p.delete_time)
    w.create_node(1)
    w.sim.run(w.sim.now + w.p.create_time)
    assert w.usable() and w.launch_slice(1, 2) is not None
    assert w.attempt is a and w.live() is a
    assert w.launch_slice(0, 2) is None  # slice 0 still runs the old processes (the worker lock)
    # until slice 0's old processes are stopped and it is relaunched too: then the job trains again
    assert w.stop_job([0]) and a.ended
    b = w.launch_slice(0, 2)
    assert b is not None and w.attempt is not a and w.attempt is not None and w.attempt.s0 == ck[0]
    w.sim.run(w.sim.now + 3600.0)
    assert w.step_now() > ck[0]


def test_a_crash_on_one_slice_leaves_the_others_hung() -> None:
    w = two_slices()
    a = w.launch(1)
    assert a is not None
    w.sim.run(3600.0)
    assert w.crash(2, s=1)
    w.sim.run(w.sim.now + w.p.peer_timeout + 1)
    assert a.procs[1].ended and a.procs[1].exits[2] == 139 and set(a.procs[1].exits.values()) == {139, 134}
    assert not a.procs[0].ended and not a.ended and not w._running()
    assert a.exits[w.p.workers + 2] == 139  # the attempt's workers are numbered globally


def test_one_slice_trace_is_the_single_slice_trace_and_each_slice_has_its_own_faults() -> None:
    one = make_trace(0, 30, 4)
    assert make_trace(0, 30, 4, slices=1) == one
    four = make_trace(0, 30, 4, slices=4)
    assert tuple(f for f in four.faults if f.slice == 0) == one.faults
    assert set(one.stockouts) <= set(four.stockouts)
    for s in (1, 2, 3):
        mine = [f for f in four.faults if f.slice == s]
        assert mine and not any(f.kind == "bug" for f in mine)
        assert [f.time for f in mine] != [f.time for f in one.faults if f.kind != "bug"]


def test_the_ideal_bound_over_two_slices_beats_every_tool_on_a_short_trace() -> None:
    # half a day at six times the default rates: the faults of three days, a sixth of the ticks
    p = Params(days=0.5, slices=2)
    tc = TraceConfig(maintenance=48, stuck=12, preemptions=24, stockouts=12, crashes=24, hangs=12)
    trace = make_trace(5, p.days, p.workers, tc, slices=2)
    assert trace.count("preemption") + trace.count("maintenance") >= 2
    results = {k: run_tool(t, trace, p) for k, t in tools(2).items()}
    ideal = results.pop("ideal")
    assert 0 < ideal.goodput < 1 and results
    for key, r in results.items():
        assert r.error == "", (key, r.error)
        assert r.goodput <= ideal.goodput + 1e-9, (key, r.goodput, ideal.goodput)


PREEMPTED_SLICE = (Fault(6 * 3600.0 + 11.0, "preemption", slice=1),)


def test_tpuwatch_recreates_the_multislice_request_as_a_whole_and_relaunches_every_slice() -> None:
    p = Params(days=1, slices=2)
    trace = Trace(1, p.horizon, PREEMPTED_SLICE, ((6 * 3600.0, 7 * 3600.0),))
    r = run_tool(tools(2)["tpuwatch"], trace, p)
    assert r.error == "" and r.memory is not None and r.memory["phase"] == "running"
    assert r.rows.get("dead_node") == 1 and r.rows.get("create_after_delete") == 1
    assert r.attempts == 2 and len(r.relaunch) == 1
    # the request waited out the stockout, then both slices came back together and ran at once
    n, median, _, never = r.resume_stats("preemption")
    assert (n, never) == (1, 0) and median is not None
    assert 3600.0 < median < 3600.0 + p.create_time + 3 * p.startup
    assert r.relaunch[0] <= 2 * CONFIG.recovery["poll_interval"]


def test_one_watcher_per_slice_loses_more_than_tpuwatch_when_one_slice_is_preempted() -> None:
    p = Params(days=1, slices=2)
    trace = Trace(1, p.horizon, PREEMPTED_SLICE, ())
    coordinated = run_tool(tools(2)["tpuwatch"], trace, p)
    per = run_tool(per_slice_tool(CONFIG), trace, p)
    assert coordinated.error == per.error == ""
    # slice 0's watcher keeps its blocked processes until its hang detection fires (their logs
    # silent for 10 minutes: log_silent), long after slice 1 is back
    assert per.rows.get("log_silent") == 1
    assert per.goodput < coordinated.goodput
    assert per.relaunch[0] > 2 * CONFIG.recovery["poll_interval"] >= coordinated.relaunch[0]
    # each watcher counts its own calls: one node read a poll each, as the one watcher reads both
    assert 0.9 < per.tpu_per_hour / coordinated.tpu_per_hour < 1.1
    assert per.log_per_hour == 2 * coordinated.log_per_hour


def test_one_watcher_per_slice_waits_for_its_hang_detection_after_a_preemption() -> None:
    p = Params(days=1, slices=2)
    trace = Trace(1, p.horizon, PREEMPTED_SLICE, ())
    ideal = run_tool(tools(2)["ideal"], trace, p)
    per = run_tool(per_slice_tool(CONFIG), trace, p)
    assert per.error == "" and ideal.relaunch and per.relaunch
    # the preempted slice is recreated and relaunched by its own watcher, but slice 0's watcher
    # sees its processes running until its hang detection stops them: 10 minutes of silence
    assert per.relaunch[0] > 2 * CONFIG.recovery["poll_interval"] >= ideal.relaunch[0]
    assert per.goodput < ideal.goodput


def test_one_watcher_per_slice_of_a_one_slice_job_is_tpuwatch() -> None:
    p = Params(days=2)
    trace = Trace(1, p.horizon, (Fault(6 * 3600.0 + 11.0, "preemption"), Fault(20 * 3600.0, "crash")), ())
    single = run_tool(tools(1)["tpuwatch"], trace, p)
    per = run_tool(per_slice_tool(CONFIG), trace, p)
    assert per.error == "" and per.goodput == single.goodput and per.attempts == single.attempts


def test_the_bug_is_counted_and_stopped_over_two_slices() -> None:
    p = Params(days=2, slices=2)
    trace = make_bug_trace(p.days)
    coordinated = run_tool(tools(2)["tpuwatch"], trace, p)
    per = run_tool(per_slice_tool(CONFIG), trace, p)
    # one launch over both slices a try, then failed; the per-slice watchers launch their own slice
    assert coordinated.bad_launches == CONFIG.recovery["no_progress_limit"] and coordinated.stopped_day is not None
    assert per.bad_launches >= 2 and per.stopped_day is not None
    assert coordinated.bug_waste_vm_hours is not None and per.bug_waste_vm_hours is not None


def test_script_slices(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--days", "1", "--slices", "2", "--json", "--tools", "ideal,tpuwatch"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"]["slices"] == 2 and [t["tool"] for t in out["tools"]] == ["ideal", "tpuwatch"]
    assert out["trace"]["counts"] == {k: make_trace(0, 1, 4, slices=2).count(k) for k in out["trace"]["counts"]}
    assert {"disruptions", "median_s", "p95_s"} <= set(out["tools"][1]["relaunch"])
    for bad in (["--slices", "0"], ["--slices", "2", "--tools", "bash"], ["--slices", "2", "--scheduled", "1"]):
        with pytest.raises(UsageError) as err:
            mod.main(bad)
        assert err.value.exit_code == 2 and "--" in str(err.value)


def test_script_sweep_over_slices_has_the_bound_without_foresight_and_each_kind_s_cost(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # a week at three times the default rates over 2 slices: maintenance on the slices for sure
    argv = ["--days", "7", "--slices", "2", "--maintenance", "24", "--seeds", "0-1", "--json",
            "--tools", "ideal,ideal-reactive,tpuwatch"]
    assert mod.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {t["tool"]: t for t in out["tools"]}
    assert list(rows) == ["ideal", "ideal-reactive", "tpuwatch"]
    ideal, reactive, tw = rows["ideal"], rows["ideal-reactive"], rows["tpuwatch"]
    # waiting out repairs (30 min) never beats the oracle, and on some trace loses to it
    assert all(r <= i + 1e-9 for r, i in zip(reactive["per_seed"], ideal["per_seed"], strict=True))
    assert reactive["goodput_mean"] < ideal["goodput_mean"]
    # each kind's time to the next launch, per seed and summed less the bound's
    for row in (ideal, reactive, tw):
        assert len(row["resume_s_per_seed"]) == 2 and "maintenance" in row["resume_s_per_seed"][0]
    over = tw["resume_s_over_ideal"]
    for kind, s in over.items():
        assert abs(s - sum(d[kind] - i[kind] for d, i in zip(tw["resume_s_per_seed"], ideal["resume_s_per_seed"],
                                                              strict=True))) <= 2
    assert over["maintenance"] > 0 and "resume_s_over_ideal" not in ideal


def test_fast_forward_beside_other_watchers_gives_the_figures_of_every_tick() -> None:
    # half a day at eight times the rates of the four days this once ran: as many faults (each
    # watcher's recoveries, what the replay must get right) for an eighth of the every-tick ticks
    p = Params(days=0.5, slices=2)
    trace = make_trace(3, p.days, p.workers, TraceConfig(maintenance=240, preemptions=120, crashes=120, hangs=64),
                       slices=2)
    fast, every = (run_tool(per_slice_tool(CONFIG, skip), trace, p) for skip in (True, False))
    assert fast.real_ticks < every.real_ticks == every.ticks
    assert (fast.goodput, fast.attempts, fast.steps_lost, fast.meter, fast.ticks, fast.rows) == \
        (every.goodput, every.attempts, every.steps_lost, every.meter, every.ticks, every.rows)
    assert fast.relaunch == pytest.approx(every.relaunch)


def test_a_multislice_hang_ends_when_megascale_says_so() -> None:
    # Megascale logs the hang after its threshold (5 min by default) and, with the flags tpuwatch
    # appends to LIBTPU_INIT_ARGS, the processes abort: the follow channels wake the watcher at once
    p = Params(days=1, slices=2)
    trace = Trace(1, p.horizon, (Fault(5 * 3600.0 + 600.0, "hang", slice=1),), ())
    r = run_tool(tools(2)["tpuwatch"], trace, p)
    assert r.error == "" and r.rows.get("log_hang") == 1 and "hung" not in r.rows
    n, median, _, never = r.resume_stats("hang")
    assert (n, never) == (1, 0) and median is not None
    assert p.megascale_threshold <= median <= p.megascale_threshold + CONFIG.recovery["poll_interval"]
    # without the flags the processes stay stuck: the line in the logs is read at the next tick
    quiet = Config(values={**CONFIG.values, "job": {**CONFIG.job, "megascale_abort_on_hang": False}}, path=None)
    r = run_tool(tpuwatch_tool("t", "t", quiet, ""), trace, p)
    assert r.error == "" and r.rows.get("log_hang") == 1
    _, median, _, _ = r.resume_stats("hang")
    assert median is not None and p.megascale_threshold <= median <= p.megascale_threshold + 2 * CONFIG.recovery["poll_interval"] + 1


def test_a_slice_that_fails_for_good_is_replaced_by_googles_autorepair_and_tpuwatch_waits_for_it() -> None:
    # Multislice autorepair: the slice's node goes at once while the request stays ACTIVE; a new
    # one is created (after autorepair_after, then create_time), then the other slices restart
    w = two_slices()
    a = w.launch(1)
    assert a is not None
    w.sim.run(3600.0)
    old = w.slices[1].node
    assert old is not None and w.maintenance_event("stuck", None, "REPAIRING", s=1)
    assert w.slices[1].node is None and w.queued == "ACTIVE" and a.frozen == w.sim.now
    assert [r.kind for r in w.audit] == ["terminate"]
    w.sim.run(w.sim.now + w.p.autorepair_after + w.p.create_time + 1)
    new = w.slices[1].node
    assert new is not None and new.id != old.id and new.state == "READY"
    assert w.slices[0].node is not None and w.slices[0].node.state == "RESTARTING" and not w.usable()
    w.sim.run(w.sim.now + w.p.multislice_restart)
    assert w.usable() and [r.kind for r in w.audit] == ["terminate", "restart", "restart"]
    # tpuwatch waits for it (row autorepair_wait) rather than recreating the request after
    # repair_timeout, and relaunches every slice once all are back
    p = Params(days=1, slices=2)
    trace = Trace(1, p.horizon, (Fault(5 * 3600.0 + 600.0, "stuck", slice=1),), ())
    r = run_tool(tools(2)["tpuwatch"], trace, p)
    assert r.error == "" and r.rows.get("autorepair_wait", 0) >= 1
    assert "repair_timeout" not in r.rows and "create_after_delete" not in r.rows
    n, median, _, never = r.resume_stats("stuck")
    assert (n, never) == (1, 0) and median is not None
    back = p.autorepair_after + p.create_time + p.multislice_restart
    assert back <= median <= back + 2 * CONFIG.recovery["poll_interval"]
