"""Backoff between charged restarts: capped exponential with jitter, reset after a stable run."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from policy_support import CFG, absent, at, ckpt, exited, obs, run_mem, tick

from tpuwatch.policy import Phase, backoff_delay, next_level, restart_delay


def test_doubles_then_caps() -> None:
    full = [backoff_delay(n, 10.0, 80.0, jitter=0.999999) for n in range(1, 7)]
    assert [round(d) for d in full] == [10, 20, 40, 80, 80, 80]
    half = [backoff_delay(n, 10.0, 80.0, jitter=0.0) for n in range(1, 7)]
    assert half == [5.0, 10.0, 20.0, 40.0, 40.0, 40.0]
    assert backoff_delay(0, 10.0, 80.0, 0.5) == 0.0


@given(level=st.integers(1, 10_000), base=st.floats(0, 1e4), extra=st.floats(0, 1e5),
       jitter=st.floats(0, 1, exclude_max=True))
def test_never_above_the_cap_nor_below_half_the_step(level: int, base: float, extra: float, jitter: float) -> None:
    cap = base + extra
    d = backoff_delay(level, base, cap, jitter)
    full = min(cap, base * 2.0 ** min(level - 1, 60))
    assert full / 2 <= d <= cap


def test_the_first_restart_since_a_stable_run_is_at_once_then_the_backoff_doubles() -> None:
    assert [restart_delay(n, 10.0, 80.0, jitter=0.999999) for n in range(1, 4)] == [0.0, *(
        backoff_delay(n, 10.0, 80.0, jitter=0.999999) for n in range(1, 3))]
    assert restart_delay(1, 10.0, 80.0, jitter=0.5) == 0.0


def test_next_level_resets_after_a_stable_run() -> None:
    assert next_level(4, ran_for=999.0, stable_run=1000.0) == 5
    assert next_level(4, ran_for=1000.0, stable_run=1000.0) == 1


def _fail_and_relaunch(mem: object, now: float, ran: float) -> tuple[object, float]:
    """Attempt fails `ran` seconds after it started; returns the memory after the relaunch."""
    end = now + ran
    d = tick(obs(probes=exited({0: 1}, attempt=mem.attempt.number), checkpoint=ckpt(int(end)),
                 jitter=0.999999),  # type: ignore[attr-defined]
             mem, now=end, cfg=replace(CFG, max_restarts=50))  # type: ignore[arg-type]
    assert d.memory.phase is Phase.BACKOFF
    wait = (d.memory.budgets.backoff_until - at(end)).total_seconds()  # type: ignore[operator]
    start = end + wait
    relaunched = tick(obs(probes=absent(), checkpoint=ckpt(int(end))), d.memory, now=start,
                      cfg=replace(CFG, max_restarts=50))
    assert relaunched.row == "launch"
    return relaunched.memory, wait


def test_waits_grow_to_the_cap_and_reset_after_a_stable_run() -> None:
    mem: object = run_mem(start=0, step=0)
    now = 0.0
    waits = []
    for _ in range(6):
        mem, wait = _fail_and_relaunch(mem, now, ran=100.0)
        now = (mem.attempt.start - at(0)).total_seconds()  # type: ignore[attr-defined]
        waits.append(round(wait))
    assert waits == [0, 10, 20, 40, 80, 80]  # a lone crash is relaunched at once; a loop backs off
    mem, wait = _fail_and_relaunch(mem, now, ran=1000.0)  # ran stable_run: back to the first step
    assert wait == 0
    assert mem.budgets.backoff_level == 1  # type: ignore[attr-defined]
