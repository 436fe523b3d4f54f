"""The issue's end-to-end scenarios, at the policy level: tick by tick, observations in, actions out.

(The same scenarios run against the simulator with real ssh in the tick's tests; these pin the
decisions themselves and run in milliseconds.)
"""

from __future__ import annotations

from dataclasses import replace

from policy_support import (
    absent,
    at,
    ckpt,
    event,
    exited,
    kinds,
    node,
    obs,
    probe,
    running,
    tick,
)

from tpuwatch.policy import Launch, Memory, Phase


def test_maintenance_that_heals_resumes_from_the_last_checkpoint_uncharged() -> None:
    m = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory
    m = tick(obs(probes=running(1), checkpoint=ckpt(300)), m, now=600).memory
    # maintenance: the node goes unhealthy, the workers are killed, the audit log says why
    sick = node("READY", "UNHEALTHY_MAINTENANCE")
    d = tick(obs(sick, probes=(probe(0, "absent", None), probe(1, "unreachable", None)),
                 events=(event("terminate", at(650)),),
                 checkpoint=ckpt(300)), m, now=660)
    assert d.ended[0].outcome == "disruption" and d.memory.phase is Phase.WAITING_NODE
    d = tick(obs(node("REPAIRING"), checkpoint=ckpt(300)), d.memory, now=900)
    assert d.row == "repair_wait"
    d = tick(obs(probes=absent(), checkpoint=ckpt(300)), d.memory, now=1200)
    assert d.row == "launch"
    launch = d.actions[0]
    assert isinstance(launch, Launch) and launch.attempt == 2 and launch.checkpoint == ckpt(300)
    assert (d.memory.budgets.restarts, d.memory.budgets.disruptions) == (0, 1)


def test_a_bug_at_start_stops_after_no_progress_limit_attempts() -> None:
    m = Memory.initial("us-central2-b")
    now, launches, d = 0.0, 0, None
    for _ in range(20):
        d = tick(obs(probes=absent() if m.phase is not Phase.RUNNING else exited({0: 1, 1: 1},
                                                                                 attempt=m.attempt.number),
                     checkpoint=ckpt(100)), m, now=now)
        launches += kinds(d).count("launch")
        m = d.memory
        if d.terminal:
            break
        now += 100  # past every backoff
    assert d is not None and d.terminal and d.exit_code == 1 and d.row == "no_progress"
    assert launches == 3  # no_progress_limit
    assert "exit code 1" in d.summary


def test_a_segfault_mid_run_is_relaunched_and_charged_once() -> None:
    m = tick(obs(probes=running(1), checkpoint=ckpt(100)),
             tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory,
             now=60).memory
    d = tick(obs(probes=exited({1: 139}), checkpoint=ckpt(400)), m, now=3000)
    assert d.row == "failure" and kinds(d) == ["stop", "wait"] and d.memory.budgets.restarts == 1
    d = tick(obs(probes=(probe(0, "exited", 1, 143), probe(1, "exited", 1, 139)), checkpoint=ckpt(400)),
             d.memory, now=3100)
    assert d.row == "launch" and d.memory.attempt.number == 2 and d.memory.budgets.restarts == 1


def test_one_worker_killed_stops_all_and_relaunches_all() -> None:
    m = tick(obs(probes=absent(4), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory
    killed = tuple(probe(w, "running", 1) for w in (0, 1, 3)) + (probe(2, "exited", 1, 137),)
    killed = tuple(sorted(killed, key=lambda p: p.worker))
    # SIGKILL is also how a host going away ends a job: charged at once, and relaunched at once,
    # the charge open to the node reads of the next minute
    d = tick(obs(probes=killed, checkpoint=ckpt(200)), m, now=500)
    assert kinds(d)[0] == "stop" and d.memory.phase is Phase.BACKOFF and d.memory.budgets.backoff_until == at(500)
    assert d.ended[0].end == at(500) and "exit code 137 (SIGKILL) after 8m20s" in d.ended[0].reason
    assert d.ended[0].charged and d.memory.budgets.confirm_by == at(560)
    stopped = tuple(probe(w, "exited", 1, 143 if w != 2 else 137) for w in range(4))
    d = tick(obs(probes=stopped, checkpoint=ckpt(200)), d.memory, now=501)
    assert d.row == "launch" and d.memory.attempt.number == 2 and d.memory.budgets.restarts == 1


def test_a_restart_entry_of_the_heal_the_attempt_launched_on_does_not_excuse_its_failure() -> None:
    """The bench found it: the restart entry is stamped when the node comes back, which is when
    tpuwatch relaunches; it must not count as a disruption of the attempt launched on it."""
    m = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory
    assert m.phase is Phase.RUNNING and m.attempt.start == at(0)
    # The restart entry, stamped the very second the attempt launched, arrives one poll later.
    m = tick(obs(probes=running(1), events=(event("restart", at(0)),), checkpoint=ckpt(100)), m, now=10).memory
    d = tick(obs(probes=exited({0: 1, 1: 1}), checkpoint=ckpt(100)), m, now=70)
    assert d.ended[0].outcome in ("failure", "failed_start") and d.ended[0].charged, d.ended
    assert d.memory.budgets.restarts == 1 and d.memory.budgets.no_progress == 1


def test_a_restart_entry_after_the_launch_still_excuses_the_end() -> None:
    m = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory
    m = tick(obs(probes=running(1), checkpoint=ckpt(200)), m, now=300).memory
    d = tick(obs(probes=exited({0: 1, 1: 1}), events=(event("restart", at(290)),), checkpoint=ckpt(200)),
             m, now=310)
    assert d.ended[0].outcome == "disruption" and not d.ended[0].charged


def test_budgets_count_trouble_since_the_last_stable_run() -> None:
    """A month-long job: a run of stable_run (1000 s here) resets the restart and recreate budgets."""
    m = Memory.initial("us-central2-b")
    m = tick(obs(probes=absent(), checkpoint=ckpt(100)), m, now=0).memory
    m = tick(obs(probes=running(1), checkpoint=ckpt(200)), m, now=500).memory
    m = replace(m, budgets=replace(m.budgets, restarts=2, recreates=2))  # both budgets spent so far
    d = tick(obs(probes=exited({0: 139, 1: 0}), checkpoint=ckpt(900)), m, now=1500)  # ran 1500 s >= 1000
    assert d.ended[0].charged and not d.terminal, d.summary
    assert d.memory.budgets.restarts == 1 and d.memory.budgets.recreates == 0
    # Without the stable run the same end spends the budget and fails the job.
    m2 = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0).memory
    m2 = replace(m2, budgets=replace(m2.budgets, restarts=2))
    d2 = tick(obs(probes=exited({0: 139, 1: 0}), checkpoint=ckpt(150)), m2, now=500)
    assert d2.terminal and d2.row == "budget_spent", d2.summary
