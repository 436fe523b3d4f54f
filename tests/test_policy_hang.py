"""Hang detection (recovery.hang_timeout): a job whose processes all live but that writes no
checkpoint is stopped and charged, tick by tick at the policy level."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from test_policy_support import CFG, absent, at, ckpt, exited, kinds, obs, run_mem, running, tick

from tpuwatch.config import validate
from tpuwatch.errors import ConfigError
from tpuwatch.model import Checkpoint
from tpuwatch.policy import Launch, Memory, Phase, PolicyConfig

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
    assert d.memory.phase is Phase.BACKOFF and d.memory.restarts == 1 and d.memory.no_progress == 1


def test_a_new_checkpoint_with_a_time_restarts_the_clock_from_that_time() -> None:
    m = run_mem(start=0.0, step=100)
    # a checkpoint written at 1h, first seen by a tick at 1h30m: measured from its own time
    d = tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), m, now=1.5 * HOUR, cfg=HANG)
    assert d.row == "running"
    assert tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), d.memory, now=3 * HOUR - 1, cfg=HANG).row == "running"
    d = tick(obs(probes=running(1), checkpoint=timed(200, HOUR)), d.memory, now=3 * HOUR, cfg=HANG)
    assert d.row == "hung"
    # it made progress before hanging: charged, but the no-progress streak is reset
    assert d.ended[0].charged and not d.ended[0].streak_added and d.memory.no_progress == 0


def test_a_checkpoint_without_a_time_counts_from_when_a_tick_first_saw_it() -> None:
    m = run_mem(start=0.0, step=100)
    d = tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=1.5 * HOUR, cfg=HANG)
    assert d.row == "running" and (d.memory.progress_step, d.memory.progress_at) == (200, at(1.5 * HOUR))
    # the memory survives the journal
    m = Memory.from_dict(d.memory.to_dict())
    assert tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=3.5 * HOUR - 1, cfg=HANG).row == "running"
    assert tick(obs(probes=running(1), checkpoint=timed(200, None)), m, now=3.5 * HOUR, cfg=HANG).row == "hung"


def test_progress_seen_in_an_earlier_attempt_does_not_count_for_this_one() -> None:
    m = run_mem(attempt=2, start=5 * HOUR, step=200, progress_step=300, progress_at=at(HOUR))
    d = tick(obs(probes=running(2), checkpoint=timed(300, None)), m, now=6 * HOUR, cfg=HANG)
    assert d.row == "running" and d.memory.progress_at == at(6 * HOUR)
    assert tick(obs(probes=running(2), checkpoint=timed(300, None)), d.memory, now=8 * HOUR, cfg=HANG).row == "hung"


def test_a_job_that_hangs_at_every_start_fails_after_no_progress_limit_attempts() -> None:
    m, now, launches, d = Memory.initial("us-central2-b"), 0.0, 0, None
    for _ in range(20):
        if m.phase is Phase.RUNNING:
            probes = running(m.attempt)
        else:  # stopped by the hung row (SIGTERM), or nothing launched yet
            probes = exited({0: 143, 1: 143}, attempt=m.attempt) if m.attempt else absent()
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
    raw = {"tpu": {"name": "pod", "zone": "us-central2-b"}, "job": {"command": "train"}}
    assert validate(raw)["recovery"]["hang_timeout"] == 0.0
    values = validate({**raw, "recovery": {"hang_timeout": "90m"}})
    assert values["recovery"]["hang_timeout"] == 5400.0
    from tpuwatch.config import Config

    assert PolicyConfig.from_config(Config(values=values)).hang_timeout == 5400.0
    with pytest.raises(ConfigError, match="recovery.hang_timeout"):
        validate({**raw, "recovery": {"hang_timeout": "soon"}})
