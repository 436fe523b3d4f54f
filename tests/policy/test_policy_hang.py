"""Hang detection (recovery.hang_timeout): a job whose processes all live but that writes no
checkpoint is stopped and charged, tick by tick at the policy level."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from policy_support import CFG, absent, at, ckpt, exited, kinds, obs, run_mem, running, tick

from tpuwatch.config import validate
from tpuwatch.errors import ConfigError
from tpuwatch.model import Checkpoint, WorkerProbe
from tpuwatch.policy import HangLearning, Launch, Memory, Phase, PolicyConfig

HOUR = 3600.0
HANG = replace(CFG, hang_timeout=2 * HOUR, stable_run=10 * HOUR)


def timed(step: int, t: float | None) -> Checkpoint:
    """A checkpoint whose store gives its time (t seconds after T0), or none (t None)."""
    when: datetime | None = at(t) if t is not None else None
    return Checkpoint(path=f"/ckpt/{step}", step=step, layout="orbax", time=when)


def test_off_by_default_a_silent_job_runs_for_ever() -> None:
    assert CFG.hang_timeout == 0.0
    m = run_mem(start=0.0, step=100)
    for day in (1, 5, 30):
        d = tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=day * 86400)
        assert d.row == "running" and d.actions == ()


def test_no_checkpoint_since_the_start_for_hang_timeout_stops_and_charges() -> None:
    m = run_mem(start=0.0, step=100)
    d = tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=2 * HOUR - 1, cfg=HANG)
    assert d.row == "running"
    d = tick(obs(probes=running(1), checkpoint=ckpt(100)), d.memory, now=2 * HOUR, cfg=HANG)
    assert d.row == "hung" and kinds(d) == ["stop", "wait"]
    end = d.ended[0]
    assert (end.outcome, end.charged, end.exit_code, end.streak_added) == ("failure", True, None, True)
    assert "hung: no new checkpoint for 2h00m" in end.reason
    assert d.memory.phase is Phase.BACKOFF and d.memory.budgets.restarts == 1 and d.memory.budgets.no_progress == 1


def test_a_new_checkpoint_with_a_time_restarts_the_clock_from_that_time() -> None:
    m = run_mem(start=0.0, step=100)
    # a checkpoint written at 1h, first seen by a tick at 1h30m: measured from its own time
    d = tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), m, now=1.5 * HOUR, cfg=HANG)
    assert d.row == "running"
    assert tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), d.memory, now=3 * HOUR - 1, cfg=HANG).row == "running"
    d = tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), d.memory, now=3 * HOUR, cfg=HANG)
    assert d.row == "hung"
    # it made progress before hanging: charged, but the no-progress streak is reset
    assert d.ended[0].charged and not d.ended[0].streak_added and d.memory.budgets.no_progress == 0


def test_a_checkpoint_without_a_time_counts_from_when_a_tick_first_saw_it() -> None:
    m = run_mem(start=0.0, step=100)
    d = tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=1.5 * HOUR, cfg=HANG)
    assert d.row == "running" and (d.memory.hang.progress_step, d.memory.hang.progress_at) == (200, at(1.5 * HOUR))
    # the memory survives the journal
    m = Memory.from_dict(d.memory.to_dict())
    assert tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=3.5 * HOUR - 1, cfg=HANG).row == "running"
    assert tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=3.5 * HOUR, cfg=HANG).row == "hung"


def test_progress_seen_in_an_earlier_attempt_does_not_count_for_this_one() -> None:
    m = run_mem(attempt=2, start=5 * HOUR, step=200,
                hang=HangLearning(progress_step=300, progress_at=at(HOUR)))
    d = tick(obs(probes=running(2), checkpoint=timed(300, None)), m, now=6 * HOUR, cfg=HANG)
    assert d.row == "running" and d.memory.hang.progress_at == at(6 * HOUR)
    assert tick(obs(probes=running(2), checkpoint=timed(300, None)), d.memory, now=8 * HOUR, cfg=HANG).row == "hung"


def test_a_job_that_hangs_at_every_start_fails_after_no_progress_limit_attempts() -> None:
    m, now, launches, d = Memory.initial("us-central2-b"), 0.0, 0, None
    for _ in range(20):
        if m.phase is Phase.RUNNING:
            probes = running(m.attempt.number)
        else:  # stopped by the hung row (SIGTERM), or nothing launched yet
            probes = exited({0: 143, 1: 143}, attempt=m.attempt.number) if m.attempt.number else absent()
        d = tick(obs(probes=probes, checkpoint=ckpt(100)), m, now=now, cfg=HANG)
        launches += sum(isinstance(a, Launch) for a in d.actions)
        m = d.memory
        if d.terminal:
            break
        now += HANG.hang_timeout if m.phase is Phase.RUNNING else HOUR
    assert d is not None
    assert d.terminal and d.row == "no_progress", d.summary
    assert launches == HANG.no_progress_limit
    assert "hung: no new checkpoint" in d.summary


def test_not_hung_while_a_worker_is_not_running() -> None:
    """The hang rule is for a job whose every process lives; an exit is the exit's row."""
    m = run_mem(start=0.0, step=100)
    d = tick(obs(probes=exited({1: 139}), checkpoint=ckpt(100)), m, now=5 * HOUR, cfg=HANG)
    assert d.row == "failure" and "hung" not in d.ended[0].reason


def test_config_key() -> None:
    from tpuwatch.config import Config

    raw = {"tpu": {"name": "pod", "zone": "us-central2-b"}, "job": {"command": "train"}}
    assert validate(raw)["recovery"]["hang_timeout"] == "auto"  # the default
    default = PolicyConfig.from_config(Config(values=validate(raw)))
    assert default.hang_auto and default.hang_timeout == 0.0
    values = validate({**raw, "recovery": {"hang_timeout": "90m"}})
    assert values["recovery"]["hang_timeout"] == 5400.0
    fixed = PolicyConfig.from_config(Config(values=values))
    assert fixed.hang_timeout == 5400.0 and not fixed.hang_auto
    off = PolicyConfig.from_config(Config(values=validate({**raw, "recovery": {"hang_timeout": "0s"}})))
    assert off.hang_timeout == 0.0 and not off.hang_auto
    for bad in ("soon", "-5m", True, [1]):
        with pytest.raises(ConfigError, match=r'recovery.hang_timeout.*or "auto"'):
            validate({**raw, "recovery": {"hang_timeout": bad}})


# -- hang_timeout = "auto" ------------------------------------------------------------------

AUTO = replace(CFG, hang_auto=True, stable_run=100 * HOUR)
MIN = 60.0


def talking(attempt: int, log_bytes: int, workers: int = 2) -> tuple[WorkerProbe, ...]:
    """Every worker running `attempt`, their logs `log_bytes` long together."""
    per = [log_bytes // workers + (1 if w < log_bytes % workers else 0) for w in range(workers)]
    return tuple(WorkerProbe(w, "running", attempt=attempt, pid=100 + w, log_bytes=per[w]) for w in range(workers))


def learn(m: Memory, *, every: float, first: float, saves: int, poll: float = 30.0,
          cfg: PolicyConfig = AUTO) -> tuple[Memory, float]:
    """Tick a talking job that resumed from step 100 and saves after `first`, then every
    `every` seconds, `saves` times; returns the memory and the time of the last save."""
    now, t, step, last = 0.0, first, 100, 0.0
    while saves:
        now += poll
        if now >= t:
            step, last, t, saves = step + 10, t, t + every, saves - 1
        d = tick(obs(probes=talking(1, int(now)), checkpoint=timed(step, last) if step > 100 else ckpt(100)),
                 m, now=now, cfg=cfg)
        assert d.row == "running", d.summary
        m = d.memory
    return m, last


def test_auto_learns_the_checkpoint_interval_and_the_time_to_the_first_checkpoint() -> None:
    m, _ = learn(run_mem(start=0.0, step=100), every=40 * MIN, first=50 * MIN, saves=4)
    assert (m.hang.ckpt_first, m.hang.ckpt_gap) == (50 * MIN, 40 * MIN)
    # the memory survives the journal
    assert Memory.from_dict(m.to_dict()) == m


def test_auto_judges_nothing_before_it_knows_the_interval() -> None:
    # no checkpoint ever, the logs silent for days: "auto" does not know what normal is
    m = run_mem(start=0.0, step=100)
    for day in (1, 5, 30):
        d = tick(obs(probes=talking(1, 0), checkpoint=ckpt(100)), m, now=day * 86400, cfg=AUTO)
        assert d.row == "running" and d.actions == ()
        m = d.memory


def test_auto_stops_a_silent_job_after_three_intervals_without_a_checkpoint() -> None:
    m, last = learn(run_mem(start=0.0, step=100), every=40 * MIN, first=50 * MIN, saves=3)
    # it hangs right after that save: no checkpoint, no output (the log stays at its size)
    size = m.hang.log_bytes
    assert size is not None
    now = last + 30.0
    while True:
        d = tick(obs(probes=talking(1, size), checkpoint=timed(120, last)), m, now=now, cfg=AUTO)
        m = d.memory
        if d.row != "running":
            break
        now += 30.0
    assert d.row == "hung" and kinds(d) == ["stop", "wait"]
    # 3 x 40m after the last checkpoint, the logs having grown last just before it
    assert last + 120 * MIN <= now <= last + 121 * MIN
    reason = d.ended[0].reason
    assert "hung: no new checkpoint for 2h00m and no output for" in reason
    assert "auto: 3x the 40m00s checkpoint interval seen" in reason and d.ended[0].charged


def test_auto_never_stops_a_job_whose_logs_keep_growing() -> None:
    """A long evaluation: no checkpoint for hours, but the job prints."""
    m, last = learn(run_mem(start=0.0, step=100), every=40 * MIN, first=50 * MIN, saves=3)
    now = last
    for _ in range(24 * 60):  # a day of ticks, the log growing by a line each
        now += 60.0
        d = tick(obs(probes=talking(1, int(now)), checkpoint=timed(120, last)), m, now=now, cfg=AUTO)
        assert d.row == "running", d.summary
        m = d.memory


def test_auto_has_a_floor_and_from_a_launch_allows_the_time_to_the_first_checkpoint() -> None:
    # a job saving every 5 minutes: 3 x 5m = 15m, but never less than 30 minutes
    m, last = learn(run_mem(start=0.0, step=100), every=5 * MIN, first=20 * MIN, saves=4)
    assert m.hang.ckpt_gap == 5 * MIN and AUTO.hang_timeout == 0.0
    size = m.hang.log_bytes
    assert size is not None
    silent = obs(probes=talking(1, size), checkpoint=timed(130, last))
    assert tick(silent, m, now=last + 29 * MIN, cfg=AUTO).row == "running"
    assert tick(silent, m, now=last + 31 * MIN, cfg=AUTO).row == "hung"
    # the next attempt, launched at 10h from step 130, is given first-checkpoint + 2 intervals
    m2, _ = learn(run_mem(start=0.0, step=100), every=30 * MIN, first=70 * MIN, saves=2)
    m2 = replace(m2, attempt=replace(m2.attempt, number=2, start=at(10 * HOUR), start_step=130))
    d = tick(obs(probes=talking(2, 0), checkpoint=timed(130, None)), m2, now=10 * HOUR, cfg=AUTO)
    m2 = d.memory
    limit = 70 * MIN + 2 * 30 * MIN
    assert tick(obs(probes=talking(2, 0), checkpoint=timed(130, None)), m2, now=10 * HOUR + limit - 60,
                cfg=AUTO).row == "running"
    assert tick(obs(probes=talking(2, 0), checkpoint=timed(130, None)), m2, now=10 * HOUR + limit,
                cfg=AUTO).row == "hung"


def test_auto_without_log_sizes_judges_nothing() -> None:
    """A worker whose log size is unknown cannot show silence: no hang is declared."""
    m, last = learn(run_mem(start=0.0, step=100), every=40 * MIN, first=50 * MIN, saves=3)
    d = tick(obs(probes=running(1), checkpoint=timed(120, last)), m, now=last + 10 * HOUR, cfg=AUTO)
    assert d.row == "running"
