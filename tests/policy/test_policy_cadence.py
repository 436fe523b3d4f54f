"""hang_timeout = "auto" by log cadence (policy/cadence.py, row `log_silent`), tick by tick in
virtual time: a job's silences are learned once past its first checkpoint, and a silence far
longer than any it has shown, with no checkpoint either, stops it. Its start (first compile,
first save) is never judged by its logs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from policy_support import CFG, at, node, tick

from tpuwatch.model import Checkpoint, NodeSnapshot, WorkerProbe
from tpuwatch.policy import Memory, Observation, Phase
from tpuwatch.policy.cadence import LOG_FLOOR, SHORT, learn, silent_limit
from tpuwatch.policy.state import Memory as Mem

MIN = 60.0
AUTO = replace(CFG, hang_auto=True, poll_interval=30.0, stable_run=100 * 3600.0, min_uptime=60.0)


@dataclass
class Job:
    """A job's output and checkpoints over virtual time (seconds from its launch at 0)."""

    every: float = MIN  # it logs a line this often...
    silent: tuple[tuple[float, float], ...] = ()  # ...except in these (from, to) stretches
    hang_at: float | None = None  # silent for ever from here
    saves: tuple[tuple[float, int], ...] = ()  # (when complete, step)

    def last_write(self, t: float) -> float:
        cands = [k * self.every for k in range(int(t // self.every) + 1)] + [b for _, b in self.silent if b <= t]
        ok = [c for c in cands if not any(a < c < b for a, b in self.silent)
              and (self.hang_at is None or c <= self.hang_at)]
        return max(ok)

    def checkpoint(self, t: float) -> Checkpoint:
        done = [(w, s) for w, s in self.saves if w <= t and (self.hang_at is None or w <= self.hang_at)]
        w, step = done[-1] if done else (None, 100)
        return Checkpoint(path=f"/ckpt/{step}", step=step, layout="orbax", time=at(w) if w is not None else None)


def run(job: Job, until: float, mem: Memory | None = None, start: float = 0.0) -> tuple[str, float, Memory]:
    """Tick every poll from `start` until `until` or the first decision that is not `running`."""
    m = mem if mem is not None else Mem.initial("us-central2-b")
    m = replace(m, phase=Phase.RUNNING,
                attempt=replace(m.attempt, number=m.attempt.number + 1, start=at(start), node_id="n1",
                                start_step=100, seen=True, evidence=()),
                boot=replace(m.boot, node_seen="n1"))
    t = start
    while t <= until:
        age = int(t - job.last_write(t - start) - start)
        probes = tuple(WorkerProbe(w, "running", attempt=m.attempt.number, log_age=age) for w in range(2))
        ck = job.checkpoint(t - start)
        if ck.time is not None:
            ck = replace(ck, time=at(start + (ck.time - at(0)).total_seconds()))
        d = tick(Observation(node=_node(), probes=probes, checkpoint=ck), m, now=t, cfg=AUTO)
        if d.row != "running":
            return d.row, t, d.memory
        m = d.memory
        t += AUTO.poll_interval
    return "running", t, m


def _node() -> NodeSnapshot:
    return node()


def test_a_job_silent_for_20_minutes_in_its_first_compile_is_not_stopped() -> None:
    # a minute of start-up output, 20 minutes of silent compile, then a line a minute, a checkpoint at 30m
    job = Job(silent=((MIN, 21 * MIN),), saves=((30 * MIN, 200),))
    row, _, m = run(job, until=40 * MIN)
    assert row == "running"
    # ... and not on its next attempt either, though the job's cadence is known by then
    assert m.hang.log_gap == SHORT  # a minute, learned as the shortest silence that could move the limit
    row, _, _ = run(job, until=40 * MIN, mem=m, start=50 * MIN)
    assert row == "running"


def test_a_job_that_logs_every_minute_is_stopped_within_10_minutes_of_silence() -> None:
    # its first checkpoint interval seen (30m to 60m), it hangs at 80m
    job = Job(silent=((MIN, 21 * MIN),), saves=((30 * MIN, 200), (60 * MIN, 300)), hang_at=80 * MIN)
    row, t, m = run(job, until=5 * 3600)
    assert row == "log_silent"
    assert LOG_FLOOR <= t - 80 * MIN <= LOG_FLOOR + AUTO.poll_interval
    end = m.budgets.last_end
    assert end is not None and end.charged and "and no output for 10m" in end.reason


def test_a_long_save_the_job_has_shown_before_is_not_stopped() -> None:
    # saves every 30 minutes, each 15 minutes of silence; the first one ends the attempt's start
    saves = tuple((k * 30 * MIN + 15 * MIN, 100 + k) for k in range(1, 6))
    silent = ((MIN, 10 * MIN),) + tuple((k * 30 * MIN, k * 30 * MIN + 15 * MIN) for k in range(1, 6))
    row, _, m = run(Job(silent=silent, saves=saves), until=3 * 3600)
    assert row == "running"
    assert 15 * MIN <= m.hang.log_gap <= 15 * MIN + AUTO.poll_interval
    # that job hanging is stopped all the same, after 3x its longest silence
    row, t, _ = run(Job(silent=silent, saves=saves, hang_at=2 * 3600 + 20 * MIN), until=6 * 3600)
    assert row == "log_silent" and 45 * MIN <= t - (2 * 3600 + 20 * MIN) <= 46 * MIN + AUTO.poll_interval


def test_a_job_that_logs_in_bursts_every_15_minutes_is_not_stopped_at_its_first_long_silence() -> None:
    # nothing is judged before a whole checkpoint interval has shown every kind of silence once
    job = Job(every=15 * MIN, saves=tuple((k * 30 * MIN + 5 * MIN, 100 + k) for k in range(1, 12)))
    row, _, m = run(job, until=5 * 3600)
    assert row == "running" and 14 * MIN <= m.hang.log_gap <= 15 * MIN + AUTO.poll_interval


def test_a_job_that_never_logs_after_its_start_is_judged_by_its_checkpoints_only() -> None:
    job = Job(every=10 * 3600.0, saves=((30 * MIN, 200), (60 * MIN, 300)))
    row, _, m = run(job, until=4 * 3600)
    assert row == "running" and m.hang.log_gap == 0.0 and silent_limit(m) == 0.0


def test_a_fixed_hang_timeout_does_not_judge_the_logs() -> None:
    fixed = replace(AUTO, hang_auto=False, hang_timeout=0.0)
    m = replace(Mem.initial("z"), phase=Phase.RUNNING,
                attempt=replace(Mem.initial("z").attempt, number=1, start=at(0), node_id="n1",
                                start_step=100, seen=True),
                boot=replace(Mem.initial("z").boot, node_seen="n1"),
                hang=replace(Mem.initial("z").hang, log_gap=MIN, log_last=at(0), progress_step=200,
                             progress_at=at(60), progress_time=at(60)))
    probes = tuple(WorkerProbe(w, "running", attempt=1, log_age=3600) for w in range(2))
    ck = Checkpoint("/ckpt/200", 200, "orbax", at(60))
    assert tick(Observation(node=_node(), probes=probes, checkpoint=ck), m, now=3600, cfg=fixed).row == "running"


def test_learning_a_silence_counts_at_most_what_the_ticks_saw_plus_one_poll() -> None:
    m = replace(Mem.initial("z"), hang=replace(Mem.initial("z").hang, log_last=at(0), log_peak=20.0))
    # the watcher was away for an hour: the job wrote at 3600; it had been seen silent 20 s
    later = learn(m, 5.0, at(3605), at(0), warm=True, poll=30.0)
    assert (later.hang.log_gap, later.hang.log_last, later.hang.log_peak) == (SHORT, at(3600), 5.0)
    longer = learn(replace(m,
                           hang=replace(m.hang, log_peak=900.0)), 5.0, at(3605), at(0), warm=True, poll=30.0)
    assert longer.hang.log_gap == 930.0
    # during the attempt's start nothing is learned
    assert learn(m, 5.0, at(3605), at(0), warm=False, poll=30.0).hang.log_gap == 0.0
    # the same write seen again: only the silence grows
    again = learn(later, 35.0, at(3635), at(0), warm=True, poll=30.0)
    assert (again.hang.log_last, again.hang.log_peak, again.hang.log_gap) == (at(3600), 35.0, SHORT)
    # no age known: nothing changes
    assert learn(again, None, at(3700), at(0), warm=True, poll=30.0) is again


def test_the_limit_is_three_times_the_longest_silence_and_never_under_ten_minutes() -> None:
    m = replace(Mem.initial("z"), hang=replace(Mem.initial("z").hang, ckpt_gap=30 * MIN))
    assert silent_limit(m) == 0.0
    assert silent_limit(replace(m,
                                hang=replace(m.hang, log_gap=MIN,
                                             ckpt_gap=0.0))) == 0.0  # no checkpoint interval seen yet
    assert silent_limit(replace(m, hang=replace(m.hang, log_gap=MIN))) == LOG_FLOOR
    assert silent_limit(replace(m, hang=replace(m.hang, log_gap=15 * MIN))) == 45 * MIN


def test_run_helpers_are_consistent() -> None:
    job = Job(silent=((MIN, 21 * MIN),))
    assert job.last_write(30 * MIN + 5) == 30 * MIN and job.last_write(10 * MIN) == MIN
    assert Job(hang_at=50 * MIN).last_write(80 * MIN) == 50 * MIN
    assert Job(saves=((10 * MIN, 200), (90 * MIN, 300)), hang_at=50 * MIN).checkpoint(100 * MIN).step == 200
