"""The goodput benchmark's engine, its tpuwatch driver (the real tick over in-memory ports) and
its baseline models (lab/)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from lab import (
    Fault,
    Params,
    Trace,
    TraceConfig,
    as_json,
    make_tools,
    make_trace,
    run_all,
    run_tool,
    tpuwatch_config,
)
from lab.tools import Tool, tpuwatch_tool
from lab.trace import ANNOUNCED, make_bug_trace
from tpuwatch.config import Config, validate
from tpuwatch.policy import PolicyConfig
from tpuwatch.policy.nodes import FAILED_REPAIR_GRACE

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

CONFIG = tpuwatch_config()
CFG = PolicyConfig.from_config(CONFIG)
TUNED = tpuwatch_config(hang_timeout="1h")
TOOLS = {t.key: t for t in make_tools(CONFIG, TUNED)}


def tpuwatch_config_with(**maintenance: Any) -> Config:
    """The benchmark's config with [maintenance] keys changed."""
    values = {**CONFIG.values, "maintenance": {**CONFIG.values["maintenance"], **maintenance}}
    return Config(values=values, path=None)


def tool(key: str) -> Tool:
    return TOOLS[key]


def test_same_seed_same_figures_and_other_seed_other_trace() -> None:
    # half a day at six times the default rates: the faults of three days, a sixth of the ticks
    p = Params(days=0.5)
    tc = TraceConfig(maintenance=48, stuck=12, preemptions=24, stockouts=12, crashes=24, hangs=12)
    a = run_all(list(TOOLS.values()), make_trace(3, p.days, p.workers, tc), p)
    b = run_all(list(TOOLS.values()), make_trace(3, p.days, p.workers, tc), p)
    ja, jb = as_json(a), as_json(b)
    ja.pop("seconds"), jb.pop("seconds")
    assert ja == jb
    assert make_trace(3, 30, 4) == make_trace(3, 30, 4)
    assert make_trace(3, 30, 4).faults != make_trace(4, 30, 4).faults


@pytest.mark.parametrize("heal_after", [600.0, 617.0])
def test_tpuwatch_stops_on_the_deterministic_bug_within_no_progress_limit(heal_after: float) -> None:
    p = Params(days=2)
    # 600 s: the node's restart entry carries the relaunch's own second, which must not excuse it
    trace = make_bug_trace(p.days, heal_after=heal_after)
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == ""
    assert r.memory is not None and r.memory["phase"] == "failed"
    assert r.rows.get("no_progress") == 1
    assert r.bad_launches == CFG.no_progress_limit
    assert r.bug_seen_day is not None and r.stopped_day is not None
    # stopped within a few minutes of the first failing launch: backoffs of 10-20 s plus polls
    assert (r.stopped_day - r.bug_seen_day) * 86400 < CFG.no_progress_limit * (p.bug_exit_after + 2 * CFG.poll_interval)
    assert r.bug_waste_vm_hours is not None and r.bug_waste_vm_hours < 0.5


def test_bash_loop_never_stops_on_the_bug() -> None:
    p = Params(days=2)
    trace = make_bug_trace(p.days, heal_after=617.0)
    r = run_tool(tool("bash"), trace, p)
    assert r.stopped_day is None
    assert r.bug_seen_day is not None
    hours = (p.days - r.bug_seen_day) * 24
    # it relaunches the bug about once a minute (exit after 60 s, gcloud start-up, sleep 1)
    assert r.bad_launches > 0.9 * hours * 3600 / (p.bug_exit_after + p.gcloud_overhead + 1 + 1)
    assert r.bug_waste_vm_hours == pytest.approx(hours * p.workers, rel=1e-6)
    assert r.productive_steps == r.steps_run - r.steps_lost


def test_a_healed_maintenance_is_not_charged() -> None:
    p = Params(days=1)
    t = 6 * 3600.0 + 11.0
    trace = Trace(1, p.horizon, (Fault(t, "maintenance", heal_after=700.0),), ())
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == ""
    assert r.memory is not None
    assert (r.memory["restarts"], r.memory["disruptions"], r.memory["recreates"]) == (0, 1, 0)
    assert r.memory["phase"] == "running" and r.memory["attempt"] == 2
    n, median, _, never = r.resume_stats("maintenance")
    assert (n, never) == (1, 0)
    assert median is not None and 700.0 <= median <= 700.0 + CFG.poll_interval
    assert r.rows.get("repair_wait", 0) > 0 and "failure" not in r.rows


def test_a_crash_wakes_the_loop_at_once_as_the_products_follow_channels_do() -> None:
    """The bench's workers follow the attempt's end (Workers.follow_ends) as SshWorkers does: a
    worker's exit ends the wait between ticks, so the relaunch comes within seconds, not a poll."""
    p = Params(days=1)
    trace = Trace(1, p.horizon, (Fault(6 * 3600.0 + 11.0, "crash", worker=2),), ())
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == ""
    n, median, _, never = r.resume_stats("crash")
    assert (n, never) == (1, 0)
    assert median is not None and median < CFG.poll_interval / 6


def test_goodput_never_beats_the_ideal_bound() -> None:
    # a day and a half at four times the rates of the six days this once ran: as many faults, a
    # quarter of the ticks
    p = Params(days=1.5)
    dense = TraceConfig(maintenance=160, stuck=40, preemptions=80, stockouts=40, crashes=80, hangs=40)
    for seed in (0, 1):
        report = run_all(list(TOOLS.values()), make_trace(seed, p.days, p.workers, dense), p)
        ideal = report.ideal
        assert ideal is not None and 0 < ideal.goodput < 1
        for r in report.results:
            assert r.error == "", (seed, r.key, r.error)
            assert r.goodput <= ideal.goodput + 1e-9, (seed, r.key, r.goodput, ideal.goodput)
            assert r.steps_lost >= 0 and r.productive_steps <= p.total_steps


def test_a_job_that_finishes_ends_every_tool() -> None:
    p = Params(days=1, steps=9000)  # 5 h of steps and saves, no faults
    report = run_all(list(TOOLS.values()), Trace(2, p.horizon, (), ()), p)
    for r in report.results:
        assert r.productive_steps == 9000, r.key
        assert r.stop_reason in ("job done", "done (success): attempt 1: worker 0 exited 0"), (r.key, r.stop_reason)
        assert r.wall_hours < 6 and r.goodput > 0.9
    assert min(r.wall_hours for r in report.results) == report.ideal.wall_hours  # type: ignore[union-attr]


def test_one_quiet_node_costs_one_tpu_call_per_poll_and_one_log_read_a_minute() -> None:
    """The real tick's cadence: the node every poll, the audit log once per observe.AUDIT_INTERVAL."""
    p = Params(days=1)
    r = run_tool(tool("tpuwatch"), Trace(5, p.horizon, (), ()), p)
    assert r.tpu_per_hour == pytest.approx(3600 / CFG.poll_interval, rel=0.01)
    assert r.log_per_hour == pytest.approx(60, rel=0.01)
    assert r.ticks == pytest.approx(p.horizon / CFG.poll_interval, abs=2)
    assert set(r.rows) == {"launch", "running"}


def test_the_benchmark_config_keeps_the_product_defaults() -> None:
    minimal = {"tpu": {"name": "llm-pod"}, "job": {"command": "x"}}
    assert dict(CONFIG.recovery) == validate(minimal)["recovery"]
    assert TUNED.recovery["hang_timeout"] == 3600.0 and CONFIG.recovery["hang_timeout"] == "auto"


def test_fast_forward_gives_the_figures_of_every_tick() -> None:
    """Skipping idle ticks replays measured periods: the same world, decisions and API counts."""
    # Half a day at four times the rates of the two days this once ran: the same number of faults
    # (what the replay must get right) for a quarter of the ticks of the every-tick runs, which
    # cost the most.
    p = Params(days=0.5)
    dense = TraceConfig(maintenance=240, stuck=60, preemptions=120, stockouts=60, crashes=120, hangs=180, bug_at=None)
    trace = make_trace(11, p.days, p.workers, dense)
    for cfg in (CONFIG, TUNED):
        fast = run_tool(tpuwatch_tool("t", "t", cfg, ""), trace, p)
        slow = run_tool(tpuwatch_tool("t", "t", cfg, "", skip_idle=False), trace, p)
        assert fast.error == slow.error == ""
        assert (fast.goodput, fast.meter, fast.rows, fast.ticks, fast.resume, fast.memory, fast.port_probes) == (
            slow.goodput, slow.meter, slow.rows, slow.ticks, slow.resume, slow.memory, slow.port_probes)
        # and it does skip (each jump ends where "auto" hang detection records the logs' growth,
        # every 10 minutes, so about one tick in four or five still runs on this dense trace)
        assert fast.real_ticks < slow.real_ticks / 2 and slow.real_ticks == slow.ticks


def test_hang_timeout_stops_a_hung_job_and_resumes_it() -> None:
    p = Params(days=1)
    t = 5 * 3600.0 + 600.0  # 10 min after a checkpoint (every 1830 s from 120 s)
    trace = Trace(8, p.horizon, (Fault(t, "hang"),), ())
    r = run_tool(tool("tpuwatch-30d"), trace, p)
    assert r.error == "" and r.rows.get("hung") == 1
    assert r.memory is not None and r.memory["restarts"] == 1 and r.memory["phase"] == "running"
    _, median, _, never = r.resume_stats("hang")
    last_ckpt = 120.0 + (t - 120.0) // 1830.0 * 1830.0
    assert never == 0 and median is not None
    assert last_ckpt + 3600.0 - t <= median <= last_ckpt + 3600.0 - t + CFG.poll_interval + CFG.backoff_base + 10
    # the defaults ("auto") stop it sooner: the job logs a line a minute, and 10 minutes of silence
    # (with no checkpoint either) is far longer than any it has shown
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == "" and r.rows.get("log_silent") == 1 and "hung" not in r.rows
    _, median, _, never = r.resume_stats("hang")
    assert never == 0 and median is not None
    assert 600.0 - p.log_every <= median <= 600.0 + CFG.poll_interval + CFG.backoff_base + 10
    # with hang detection off, nothing notices, and the job never runs again
    assert run_tool(tpuwatch_tool("t", "t", tpuwatch_config(hang_timeout="0s"), ""), trace, p).resume_stats("hang")[3] == 1


def test_preemption_with_stockout_waits_for_capacity() -> None:
    p = Params(days=1)
    t = 4 * 3600.0
    trace = Trace(6, p.horizon, (Fault(t, "preemption"),), ((t, t + 3000.0),))
    for key in ("ideal", "tpuwatch", "levanter", "skypilot"):
        r = run_tool(tool(key), trace, p)
        n, median, _, never = r.resume_stats("preemption")
        assert (n, never) == (1, 0), key
        assert median is not None and median >= 3000.0 + p.create_time, key
    # tpunicorn tries the create once, meets the stockout, and never creates again
    r = run_tool(tool("tpunicorn"), trace, p)
    assert r.resume_stats("preemption")[3] == 1


@pytest.mark.parametrize("stuck", ["REPAIRING", "UNKNOWN"])
def test_stuck_maintenance_is_recreated_after_repair_timeout(stuck: str) -> None:
    p = Params(days=1)
    t = 3 * 3600.0 + 7.0
    trace = Trace(7, p.horizon, (Fault(t, "stuck", stuck=stuck),), ())
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.memory is not None and r.memory["recreates"] == 1 and r.memory["restarts"] == 0
    _, median, _, _ = r.resume_stats("stuck")
    # UNKNOWN (no health) after a failed repair: recreated FAILED_REPAIR_GRACE after it shows
    waited = CFG.repair_timeout if stuck == "REPAIRING" else p.unknown_after + FAILED_REPAIR_GRACE
    floor = waited + p.delete_time + p.create_time
    assert median is not None and floor <= median <= floor + 3 * CFG.poll_interval
    # retry.sh sees UNHEALTHY_MAINTENANCE in its first 30 s poll and recreates at once;
    # tpunicorn recreates only PREEMPTED nodes, so the job never runs again
    quick = run_tool(tool("retry.sh"), trace, p).resume_stats("stuck")[1]
    assert quick is not None and quick < p.delete_time + p.create_time + 60
    assert math.isinf(run_tool(tool("tpunicorn"), trace, p).resume_stats("stuck")[1] or 0.0)


def test_script_json(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_goodput.py"
    spec = importlib.util.spec_from_file_location("bench_goodput", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # one day: what is checked is the output's shape, which the length of the run does not change
    assert mod.main(["--days", "1", "--seed", "2", "--json", "--tools", "ideal,tpuwatch,bash"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["tool"] for t in out["tools"]] == ["ideal", "tpuwatch", "bash"]
    assert out["params"]["days"] == 1 and out["trace"]["seed"] == 2
    assert {"goodput", "resume", "steps_lost", "bug_waste_tpu_vm_hours", "tpu_api_calls_per_hour"} <= set(out["tools"][1])
    assert [b["tool"] for b in out["permanent_bug"]] == ["ideal", "tpuwatch", "bash"]
    with pytest.raises(SystemExit):
        mod.main(["--bug-at", "2"])


def test_trace_counts_scale_with_days() -> None:
    tc = TraceConfig()
    t = make_trace(9, 60, 4, tc)
    assert t.count("maintenance") == 16 and t.count("stuck") == 4 and t.count("bug") == 1
    assert all(0 < f.time < t.horizon for f in t.faults)
    assert make_trace(9, 30, 4, TraceConfig(bug_at=None, hangs=0)).count("bug") == 0


# -- announced maintenance (trace kinds "scheduled", "unscheduled", "notice") ------------------

INTERVAL = Params().ckpt_every * Params().step_time + Params().ckpt_save  # 1830 s


def _announced_trace(p: Params, kind: str, lead: float) -> Trace:
    """One announced maintenance at 6 h + 1500 s (17 min after a checkpoint), healing in 10 min."""
    return Trace(1, p.horizon, (Fault(6 * 3600.0 + 1500.0, kind, heal_after=600.0, lead=lead),), ())


def test_announced_maintenance_off_leaves_the_trace_as_it_was() -> None:
    """The flags are drawn after everything else: off, the default trace (and its figures) stay."""
    plain = make_trace(0, 30, 4)
    both = make_trace(0, 30, 4, TraceConfig(scheduled=4, unscheduled=2, notice_only=2))
    assert [f for f in both.faults if f.kind not in ANNOUNCED] == list(plain.faults)
    assert (both.count("scheduled"), both.count("unscheduled"), both.count("notice")) == (4, 2, 2)
    assert make_trace(0, 30, 4, TraceConfig(scheduled=0.0)) == plain
    assert "announced_maintenance" not in as_json(run_all([tool("ideal")], Trace(1, 86400.0, (), ()),
                                                          Params(days=1)))["tools"][0]


@pytest.mark.parametrize(("kind", "lead"), [("scheduled", 7 * 86400.0), ("unscheduled", 3600.0)])
def test_a_reschedulable_maintenance_is_started_at_the_next_checkpoint(kind: str, lead: float) -> None:
    p = Params(days=1)
    trace = _announced_trace(p, kind, lead)
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == "" and r.rows.get("early_start") == 1 and "notice_end" not in r.rows
    assert r.memory is not None and (r.memory["restarts"], r.memory["disruptions"]) == (0, 1)
    ((k, lost, how),) = r.announced
    assert (k, how) == (kind, "early")
    assert lost * p.step_time < 0.01 * INTERVAL  # the target: under 1 % of a checkpoint interval
    # the reactive bound loses the 17 minutes since the checkpoint; tpuwatch beats it
    ideal = run_tool(tool("ideal"), trace, p)
    ((_, ideal_lost, ideal_how),) = ideal.announced
    assert ideal_how == "down" and ideal_lost * p.step_time > 900
    assert r.goodput > ideal.goodput


def test_the_termination_notice_reaches_a_job_that_saves_on_sigterm() -> None:
    p = Params(days=1)
    trace = _announced_trace(p, "notice", 0.0)
    r = run_tool(tool("tpuwatch"), trace, p)
    assert r.error == "" and r.rows.get("notice_end") == 1 and "early_start" not in r.rows
    assert r.memory is not None and r.memory["restarts"] == 0  # its exit 0 is neither done nor charged
    ((_, lost, how),) = r.announced
    assert how == "notice" and lost * p.step_time < 60  # the target: under 60 s of work
    assert r.goodput > run_tool(tool("ideal"), trace, p).goodput
    # a job that does not save on the signal dies of it: the checkpoint's age is lost, as reactively
    dies = run_tool(tool("tpuwatch"), trace, replace(p, save_on_term=False))
    assert dies.announced[0][1] * p.step_time > 900
    # and without a relay (notify_signal = "") nothing reaches the job
    silent = run_tool(tpuwatch_tool("t", "t", tpuwatch_config_with(notify_signal=""), ""), trace, p)
    assert silent.announced[0][2] == "down" and silent.announced[0][1] * p.step_time > 900


@pytest.mark.parametrize("kind", ["scheduled", "notice"])
def test_the_baselines_and_the_bound_do_not_act_on_announcements(kind: str) -> None:
    """For every tool but tpuwatch an announced maintenance is the same as an unannounced one."""
    p = Params(days=1)
    announced = _announced_trace(p, kind, 86400.0)
    plain = Trace(1, p.horizon, (Fault(6 * 3600.0 + 1500.0, "maintenance", heal_after=600.0),), ())
    for key in ("ideal", "bash", "retry.sh", "tpunicorn", "levanter", "skypilot"):
        a, b = run_tool(tool(key), announced, p), run_tool(tool(key), plain, p)
        assert (a.goodput, a.steps_lost, a.meter) == (b.goodput, b.steps_lost, b.meter), key
        assert [how for _, _, how in a.announced] == ["down"], key


def test_fast_forward_gives_the_figures_of_every_tick_with_announced_maintenance() -> None:
    # half a day at four times the rates of two days: as many faults, a quarter of the every-tick
    # run's ticks
    p = Params(days=0.5)
    dense = TraceConfig(maintenance=120, crashes=60, hangs=60, bug_at=None, scheduled=180, unscheduled=180,
                        notice_only=180, unscheduled_lead=7200.0)
    trace = make_trace(12, p.days, p.workers, dense)
    fast = run_tool(tpuwatch_tool("t", "t", CONFIG, ""), trace, p)
    slow = run_tool(tpuwatch_tool("t", "t", CONFIG, "", skip_idle=False), trace, p)
    assert fast.error == slow.error == ""
    assert fast.rows.get("early_start") and fast.rows.get("notice_end")
    assert (fast.goodput, fast.meter, fast.rows, fast.ticks, fast.announced, fast.memory) == (
        slow.goodput, slow.meter, slow.rows, slow.ticks, slow.announced, slow.memory)
