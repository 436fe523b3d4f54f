"""The policy with environment checks, beyond the four precheck_* rows of
test_policy_table.py: failing checks are evidence against the node, passing ones change nothing."""

from __future__ import annotations

from dataclasses import replace

from policy_support import (
    CFG,
    absent,
    at,
    ckpt,
    exited,
    idle,
    kinds,
    obs,
    pre,
    run_mem,
    running,
    tick,
)

from tpuwatch.policy import Budgets, Launch, Phase, Repair


def test_a_job_that_fails_while_every_check_passes_is_charged() -> None:
    # periodic checks while it ran were green
    d = tick(obs(probes=running(1), checkpoint=ckpt(150), precheck=pre(context="running", t=400)), run_mem(), now=400)
    assert d.row == "running" and d.memory.attempt.evidence == ()
    d = tick(obs(probes=exited({1: 1}), checkpoint=ckpt(150), jitter=0.0), d.memory, now=500)
    assert d.row == "failure" and d.ended[0].charged and d.memory.budgets.restarts == 1


def test_a_failing_periodic_check_is_evidence_so_the_end_is_not_charged() -> None:
    o = obs(probes=running(1), checkpoint=ckpt(150), precheck=pre(("disk", 1, False), context="running", t=400))
    d = tick(o, run_mem(), now=400)
    assert d.row == "running"  # a failing check never stops a live attempt
    assert [e.what for e in d.memory.attempt.evidence] == ["environment check disk failed on worker 1"]
    # repeated checks keep one entry per failing item
    d = tick(o, d.memory, now=450)
    assert len(d.memory.attempt.evidence) == 1 and d.memory.attempt.evidence[0].time == at(450)
    end = tick(obs(probes=exited({1: 1}), checkpoint=ckpt(150)), d.memory, now=500)
    assert end.row == "disruption"
    assert (end.ended[0].outcome, end.ended[0].charged, end.memory.budgets.restarts) == ("disruption", False, 0)
    assert "environment check disk failed on worker 1" in end.ended[0].reason


def test_checks_of_another_node_are_not_evidence() -> None:
    o = obs(probes=running(1), precheck=pre(("disk", 1, False), context="running", node_id="old"))
    assert tick(o, run_mem(), now=400).memory.attempt.evidence == ()


def test_a_launch_left_no_trace_while_the_checks_fail_ends_uncharged() -> None:
    unseen = run_mem(seen=False, start=0)
    o = obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 0, False)))
    d = tick(o, unseen, now=30)
    assert d.row == "disruption" and not d.ended[0].charged and d.memory.phase is Phase.IDLE
    assert "environment checks failed" in d.ended[0].reason
    # fixable: cleaned up first, the attempt stays where it was
    d = tick(replace(o, precheck=pre(("libtpu_lock", 0, True))), unseen, now=30)
    assert d.row == "precheck_fix" and replace(d.memory, marks=unseen.marks) == unseen  # but when it checked
    # green: the same attempt is launched again, as without checks
    d = tick(replace(o, precheck=pre()), unseen, now=30)
    assert d.row == "launch_unseen" and isinstance(d.actions[0], Launch) and d.actions[0].attempt == 1


def test_an_unreachable_worker_during_the_checks_launches_nothing() -> None:
    d = tick(obs(probes=absent(), precheck=pre(unreachable=(1,))), idle(), now=5)
    assert d.row == "workers_unreachable" and kinds(d) == ["wait"] and d.memory.phase is Phase.IDLE


def test_no_checks_run_means_the_policy_decides_as_before() -> None:
    d = tick(obs(probes=absent(), checkpoint=ckpt(100)), idle(), now=5)
    assert d.row == "launch"
    # a running-context report is never taken for the launch-time checks
    d = tick(obs(probes=absent(), precheck=pre(("disk", 0, False), context="running")), idle(), now=5)
    assert d.row == "launch"


def test_a_recreated_node_starts_with_a_clean_slate() -> None:
    o = obs(probes=absent(), precheck=pre(("devices", 1, False)))
    d = tick(o, idle(repair=Repair(env_failing_since=at(0))), now=600)
    assert d.row == "precheck_recreate" and d.memory.repair.env_failing_since is None
    # the recreate budget applies as for any recreate
    spent = tick(o, idle(repair=Repair(env_failing_since=at(0)), budgets=Budgets(recreates=2)), now=600)
    assert spent.row == "recreate_budget_spent" and spent.memory.phase is Phase.FAILED


def test_the_dashboard_shows_one_line_per_failing_item_with_worker_and_value() -> None:
    from rich.console import Console

    from tpuwatch.tick import TickReport
    from tpuwatch.ui.dashboard import dashboard

    o = obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 1, False), ("disk", 0, False), t=100))
    d = tick(o, idle(), now=100)
    console = Console(width=80, record=True)
    console.print(dashboard(TickReport(at(130), o.node, o.probes, o.checkpoint, (), d, precheck=o.precheck),
                            "job", CFG, [], None, at(130)))
    text = console.export_text()
    assert "FAIL w0 disk: bad disk, need good disk" in text
    assert "FAIL w1 devices: bad devices, need good devices" in text and "checked 30s ago" in text
    console = Console(width=80, record=True)
    console.print(dashboard(TickReport(at(130), o.node, o.probes, o.checkpoint, (), d, precheck=pre(t=100)),
                            "job", CFG, [], None, at(130)))
    assert "passed on 2 worker(s), 30s ago" in console.export_text()
