"""How an attempt's end is classified: success, each kind of disruption evidence, failure,
failed start, fail-fast, the no-progress streak; and a late terminate event refunding a charge."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_support import (
    CFG,
    absent,
    at,
    ckpt,
    event,
    exited,
    idle,
    last_end,
    node,
    obs,
    ongoing,
    probe,
    run_mem,
    running,
    symptom,
    tick,
)

from tpuwatch.policy import (
    Attempt,
    AttemptFacts,
    Budgets,
    Evidence,
    Outcome,
    Phase,
    classify,
    describe_exit,
)
from tpuwatch.policy.classify import naming_code


def facts(codes: dict[int, int | None], evidence: tuple[Evidence, ...] = (), ran: float = 500.0) -> AttemptFacts:
    return AttemptFacts(start=at(0), end=at(ran), exit_codes=codes, primary=0, evidence=evidence)


def verdict(codes: dict[int, int | None], evidence: tuple[Evidence, ...] = (), ran: float = 500.0) -> Outcome:
    return classify(facts(codes, evidence, ran), min_uptime=60, fail_fast=frozenset({42}), window=1800).outcome


# --- classify() itself -------------------------------------------------------------------------


def test_success_is_worker_0_exit_0_even_amid_disruption() -> None:
    assert verdict({0: 0, 1: 143}) is Outcome.SUCCESS
    assert verdict({0: 0}, (Evidence(at(100), "audit tpu.nodes.terminate"),)) is Outcome.SUCCESS


def test_disruption_beats_fail_fast_and_failure() -> None:
    sign = (Evidence(at(5), "node health TIMEOUT"),)
    assert verdict({1: 42}, sign) is Outcome.DISRUPTION
    assert verdict({1: 1}, sign, ran=10) is Outcome.DISRUPTION


def test_fail_fast_beats_failed_start() -> None:
    assert verdict({1: 42}, ran=5) is Outcome.FAIL_FAST


def test_failed_start_and_failure_split_at_min_uptime() -> None:
    assert verdict({0: 1}, ran=59) is Outcome.FAILED_START
    assert verdict({0: 1}, ran=60) is Outcome.FAILURE


def test_evidence_outside_the_window_does_not_excuse() -> None:
    before_start = (Evidence(at(-1), "audit tpu.nodes.terminate"),)
    assert verdict({0: 1}, before_start) is Outcome.FAILURE
    long_ago = (Evidence(at(100), "audit tpu.nodes.terminate"),)
    assert verdict({0: 1}, long_ago, ran=100 + 1801) is Outcome.FAILURE
    assert verdict({0: 1}, long_ago, ran=100 + 1800) is Outcome.DISRUPTION


def test_naming_code_prefers_the_worker_that_failed_first() -> None:
    # worker 0 was killed by tpuwatch's own stop (143) after worker 1 crashed (139)
    assert naming_code({0: 143, 1: 139}) == (1, 139)
    assert naming_code({0: 143, 1: None}) == (0, 143)
    assert naming_code({0: None}) == (0, None)
    assert naming_code({0: 0}) == (None, None)


def test_describe_exit() -> None:
    assert describe_exit(139) == "exit code 139 (SIGSEGV)"
    assert describe_exit(-9) == "exit code -9 (SIGKILL)"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(None) == "no exit code"


# --- each kind of disruption evidence, through decide() ----------------------------------------


def _ends_as(d: object) -> tuple[str, bool, int]:
    end = d.ended[0]  # type: ignore[attr-defined]
    return end.outcome, end.charged, d.memory.budgets.restarts  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["terminate", "restart"])
def test_audit_event_in_the_attempt_is_a_disruption(kind: str) -> None:
    d = tick(obs(probes=exited({0: 1}), events=(event(kind, at(450)),)), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)


def test_audit_event_seen_on_an_earlier_tick_still_counts() -> None:
    first = tick(obs(probes=running(1), events=(event("terminate", at(450)),)), run_mem(), now=460)
    assert first.row == "running" and first.memory.attempt.evidence
    d = tick(obs(probes=exited({1: 134})), first.memory, now=500)
    assert _ends_as(d) == ("disruption", False, 0)


def test_audit_event_about_another_node_is_ignored() -> None:
    other = replace(event("terminate", at(450)), node="other-pod")
    d = tick(obs(probes=exited({0: 1}), events=(other,)), run_mem(), now=500)
    assert _ends_as(d) == ("failure", True, 1)


def test_health_change_during_the_attempt() -> None:
    sick = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=running(1)), run_mem(), now=300)
    healed = tick(obs(probes=exited({0: 1})), sick.memory, now=400)
    assert _ends_as(healed) == ("disruption", False, 0)


def test_node_id_change() -> None:
    d = tick(obs(node(id="n2"), probes=absent()), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)
    assert "node id changed from n1 to n2" in d.ended[0].reason


@pytest.mark.parametrize("state", ["PREEMPTED", "TERMINATED"])
def test_preempted_or_terminated(state: str) -> None:
    d = tick(obs(node(state), probes=None), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)


def test_symptom_in_the_window() -> None:
    d = tick(obs(node(symptoms=(symptom(at(480)),)), probes=exited({1: 1})), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)
    old = tick(obs(node(symptoms=(symptom(at(-50)),)), probes=exited({1: 1})), run_mem(), now=500)
    assert _ends_as(old) == ("failure", True, 1)


def test_maintenance_ongoing() -> None:
    d = tick(obs(node(upcoming_maintenance=ongoing()), probes=exited({1: 1})), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)


def test_worker_unreachable_while_the_node_is_unhealthy() -> None:
    probes = (probe(0, "running", 1), probe(1, "unreachable", None))
    d = tick(obs(node("READY", "TIMEOUT"), probes=probes), run_mem(), now=500)
    assert _ends_as(d) == ("disruption", False, 0)
    assert d.row == "repair_wait" and d.memory.phase is Phase.WAITING_NODE
    assert d.actions[0].kind == "stop"  # READY: the survivors are stopped before the relaunch


# --- charged ends ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [139, 1, 255, 3])
def test_every_code_not_fail_fast_is_charged_the_same(code: int) -> None:
    d = tick(obs(probes=exited({1: code}), checkpoint=ckpt(200), jitter=0.3),
             run_mem(budgets=Budgets(backoff_level=1)), now=500)
    assert _ends_as(d) == ("failure", True, 1)
    assert d.memory.budgets.backoff_until == at(500 + 10 * 0.65)


def test_failed_start_is_charged() -> None:
    d = tick(obs(probes=exited({0: 2}), checkpoint=ckpt(100)), run_mem(), now=59)
    assert _ends_as(d) == ("failed_start", True, 1)


def test_fail_fast_stops_at_once_even_with_budget_left() -> None:
    d = tick(obs(probes=exited({0: 42})), run_mem(budgets=Budgets(restarts=0)), now=5)
    assert d.memory.phase is Phase.FAILED and d.ended[0].outcome == "fail_fast"


def test_no_progress_streak_counts_resets_and_stops() -> None:
    cfg = replace(CFG, max_restarts=100)
    mem = run_mem(step=100)
    streaks = []
    now = 0.0
    for _ in range(3):
        now += 500
        d = tick(obs(probes=exited({0: 1}, attempt=mem.attempt.number), checkpoint=ckpt(100)), mem, now=now,
                 cfg=cfg)
        streaks.append(d.memory.budgets.no_progress)
        if d.memory.phase is Phase.FAILED:
            break
        now = (d.memory.budgets.backoff_until - at(0)).total_seconds()  # type: ignore[operator]
        mem = tick(obs(probes=absent(), checkpoint=ckpt(100)), d.memory, now=now, cfg=cfg).memory
    assert streaks == [1, 2, 3]
    assert d.row == "no_progress" and "exit code 1" in d.summary
    # a newer checkpoint resets the streak
    progressed = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(150)),
                      run_mem(budgets=Budgets(no_progress=2)), now=500)
    assert progressed.memory.budgets.no_progress == 0 and progressed.memory.phase is Phase.BACKOFF
    # a disruption neither adds to it nor resets it
    disrupted = tick(obs(probes=exited({0: 1}), events=(event("terminate", at(400)),), checkpoint=ckpt(100)),
                     run_mem(budgets=Budgets(no_progress=2)), now=500)
    assert disrupted.memory.budgets.no_progress == 2 and disrupted.memory.phase is Phase.IDLE


def test_no_checkpoint_at_all_is_no_progress() -> None:
    d = tick(obs(probes=exited({0: 1}), checkpoint=None), run_mem(step=None), now=500)
    assert d.memory.budgets.no_progress == 1
    d2 = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(10)), run_mem(step=None), now=500)
    assert d2.memory.budgets.no_progress == 0


# --- late evidence --------------------------------------------------------------------------------


def test_late_terminate_event_refunds_the_charge() -> None:
    charged = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(100)), run_mem(), now=500)
    assert charged.memory.budgets.restarts == 1 and charged.memory.budgets.no_progress == 1
    assert charged.memory.phase is Phase.BACKOFF
    # the audit log delivers the terminate event that explains it a tick later
    late = tick(obs(probes=absent(), events=(event("terminate", at(490)),), checkpoint=ckpt(100)),
                charged.memory, now=505)
    m = late.memory
    assert (m.budgets.restarts, m.budgets.no_progress, m.budgets.disruptions,
            m.budgets.backoff_until) == (0, 0, 1, None)
    assert late.ended[0].outcome == "disruption" and not late.ended[0].charged
    assert late.row == "launch"  # no backoff any more
    assert "refunded" in late.summary
    # and it is refunded once only
    again = tick(obs(probes=running(2), events=(event("restart", at(495)),)), late.memory, now=510)
    assert again.memory.budgets.restarts == 0 and again.memory.budgets.disruptions == 1


def test_event_outside_the_last_attempt_refunds_nothing() -> None:
    m = idle(phase=Phase.BACKOFF,
             attempt=Attempt(number=1),
             budgets=Budgets(restarts=1, backoff_until=at(600), last_end=last_end(end=500)))
    d = tick(obs(probes=absent(), events=(event("terminate", at(550)),)), m, now=560)
    assert d.memory.budgets.restarts == 1 and d.row == "backoff"
