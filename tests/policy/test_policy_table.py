"""One test per row of the recovery table (tpuwatch.policy.ROWS), each named test_row_<id>."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import test_policy_pool as pool
import test_policy_priority as prio
from policy_support import (
    CFG,
    LIMPS,
    NAME,
    ZONES,
    absent,
    at,
    ckpt,
    event,
    exited,
    idle,
    kinds,
    last_end,
    limp_look,
    limp_part,
    node,
    obs,
    op,
    pre,
    probe,
    run_mem,
    running,
    tick,
)

from tpuwatch.model import (
    AuditEvent,
    CheckItem,
    NodeSnapshot,
    PrecheckReport,
    QueuedStatus,
    UpcomingMaintenance,
    WorkerProbe,
    combine_slices,
)
from tpuwatch.policy import (
    ROWS,
    Attempt,
    Boot,
    Budgets,
    CreateNode,
    Decision,
    DeleteNode,
    Fail,
    FollowOperation,
    HangLearning,
    ImpossibleObservation,
    Launch,
    Limp,
    Maintenance,
    Memory,
    NeedsPerson,
    Phase,
    PolicyConfig,
    Recreate,
    Repair,
    StartMaintenance,
    StopWorkers,
    Wait,
    decide,
)


def test_every_row_has_a_test() -> None:
    here = sys.modules[__name__]
    missing = [r.id for r in ROWS if not hasattr(here, f"test_row_{r.id}")]
    assert missing == []


def test_row_launch() -> None:
    d = tick(obs(probes=absent(), checkpoint=ckpt(100)), idle(), now=5)
    assert d.row == "launch"
    assert d.actions == (Launch(1, ckpt(100), d.actions[0].reason),)  # type: ignore[union-attr]
    m = d.memory
    assert (m.phase, m.attempt.number, m.attempt.start, m.attempt.start_step, m.attempt.node_id) == (
        Phase.RUNNING, 1, at(5), 100, "n1")
    assert d.exit_code == 0


def test_row_running() -> None:
    m = run_mem()
    d = tick(obs(probes=running(1), checkpoint=ckpt(200)), m, now=300)
    assert d.row == "running"
    assert d.actions == ()
    # the new checkpoint is remembered (hang detection), nothing else changes
    assert d.memory == replace(m,
                               hang=replace(m.hang, progress_step=200, progress_at=at(300),
                                            progress_time=at(300), ckpt_first=300.0))
    # and a tick that sees nothing new leaves the memory as it was
    again = tick(obs(probes=running(1), checkpoint=ckpt(200)), d.memory, now=330)
    assert again.row == "running" and again.memory == d.memory
    assert "attempt 1 running on 2 worker(s)" in d.summary and "step 200" in d.summary


def test_row_success() -> None:
    d = tick(obs(probes=exited({0: 0}), checkpoint=ckpt(900)), run_mem(), now=3000)
    assert d.row == "success"
    assert kinds(d) == ["stop", "done"]
    assert d.memory.phase is Phase.DONE and d.terminal and d.exit_code == 0
    assert d.ended[0].outcome == "success" and d.ended[0].end_step == 900


def test_row_disruption() -> None:
    o = obs(probes=exited({1: 1}), events=(event("terminate", at(400), "MAINTENANCE"),), checkpoint=ckpt(150))
    d = tick(o, run_mem(), now=500)
    assert d.row == "disruption"
    assert kinds(d) == ["stop"]
    m = d.memory
    assert (m.phase, m.budgets.restarts, m.budgets.disruptions, m.budgets.backoff_until) == (Phase.IDLE, 0,
                                                                                             1, None)
    end = d.ended[0]
    assert (end.outcome, end.charged, end.exit_code) == ("disruption", False, 1)
    assert "tpu.nodes.terminate" in end.reason and "MAINTENANCE" in end.reason


def _noticed(codes: dict[int, int], notice: str = "TERMINATE_ON_HOST_MAINTENANCE") -> tuple[WorkerProbe, ...]:
    """Workers that exited with `codes` after the relay passed a metadata notice to the job."""
    return tuple(replace(p, notice=notice) for p in exited(codes))


def test_row_notice_end() -> None:
    # Worker 0 exited 0 after the notice (a job that saves on SIGTERM and ends its loop): not done.
    d = tick(obs(probes=_noticed({0: 0, 1: 0}), checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "notice_end" and kinds(d) == ["stop"]
    m = d.memory
    assert (m.phase, m.budgets.restarts, m.budgets.disruptions) == (Phase.IDLE, 0, 1)
    assert m.maintenance.notice_hold is not None and m.maintenance.notice_hold > at(500)
    end = d.ended[0]
    assert (end.outcome, end.charged, end.exit_code) == ("disruption", False, 0)
    assert "notice of maintenance (TERMINATE_ON_HOST_MAINTENANCE) on worker 0" in end.reason, end.reason
    # the same exit with no notice is the job's success
    assert tick(obs(probes=exited({0: 0, 1: 0}), checkpoint=ckpt(150)), run_mem(), now=500).row == "success"


def test_notice_from_a_preemption_ends_a_crash_uncharged_too() -> None:
    d = tick(obs(probes=_noticed({1: 1}, "PREEMPTED"), checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "notice_end" and not d.ended[0].charged
    assert "preemption (preempted TRUE) on worker 0" in d.ended[0].reason


def test_a_notice_for_an_older_attempt_is_no_evidence() -> None:
    probes = tuple(replace(p, notice="PREEMPTED") for p in exited({0: 0, 1: 0}, attempt=1))
    d = tick(obs(probes=probes, checkpoint=ckpt(150)), run_mem(attempt=2), now=500)
    assert d.row != "notice_end" and not any("notice" in e.what for e in d.memory.attempt.evidence)


def test_a_compute_engine_vm_pending_stop_is_a_notice_not_a_fault() -> None:
    # A Spot VM with a preemption notice duration: the API shows shutdownDetails PENDING_STOP
    # while the VM runs. The attempt goes on (the relay tells the job), and its end is a notice's.
    pending = node(pending_stop=True)
    d = tick(obs(pending, probes=running(1), checkpoint=ckpt(150)), run_mem(), now=400)
    assert d.row == "running" and d.actions == ()
    assert any("PENDING_STOP" in e.what for e in d.memory.attempt.evidence)
    end = tick(obs(pending, probes=exited({0: 0, 1: 0}), checkpoint=ckpt(160)), d.memory, now=410)
    assert end.row == "notice_end" and not end.terminal and not end.ended[0].charged
    assert "shutdownDetails PENDING_STOP" in end.ended[0].reason, end.ended[0].reason


def test_row_pending_stop_hold() -> None:
    # no attempt running and the VM gracefully shutting down (its preemption notice): nothing is
    # launched there; once it stops for good it is a preempted node like any other
    d = tick(obs(node(pending_stop=True), probes=absent(), checkpoint=ckpt(150)), idle(), now=500)
    assert d.row == "pending_stop_hold" and kinds(d) == ["wait"]
    gone = tick(obs(node(state="PREEMPTED"), probes=None), d.memory, now=530)
    assert gone.row != "pending_stop_hold" and "delete" in kinds(gone), gone.row


def test_row_notice_hold() -> None:
    ended = tick(obs(probes=_noticed({0: 0, 1: 0}), checkpoint=ckpt(150)), run_mem(), now=500).memory
    d = tick(obs(probes=absent(), checkpoint=ckpt(150)), ended, now=510)
    assert d.row == "notice_hold" and kinds(d) == ["wait"]
    # the node went down (maintenance) and came back: launch from the checkpoint at once
    down = tick(obs(node(health="UNHEALTHY_MAINTENANCE"), probes=None), d.memory, now=520)
    assert down.row == "repair_wait"
    back = tick(obs(probes=absent(), checkpoint=ckpt(150)), down.memory, now=530)
    assert back.row == "launch" and back.memory.attempt.number == 2 and back.memory.attempt.start_step == 150
    # it never went down: the hold ends on its own
    assert ended.maintenance.notice_hold is not None
    late = (ended.maintenance.notice_hold - at(0)).total_seconds() + 1
    assert tick(obs(probes=absent(), checkpoint=ckpt(150)), ended, now=late).row == "launch"
    # another node (recreated): no hold
    assert tick(obs(node(id="n2"), probes=absent(), checkpoint=ckpt(150)), ended, now=510).row == "launch"


def _announced(can_reschedule: bool = True, start: float = 7 * 86400, status: str = "PENDING",
               owned: bool = True) -> NodeSnapshot:
    """Node n1 with a SCHEDULED maintenance whose window opens at at(start)."""
    um = UpcomingMaintenance("SCHEDULED", status, can_reschedule, at(start), at(start + 3600), at(start))
    return replace(node(owned=owned), upcoming_maintenance=um)


def test_row_early_wait() -> None:
    d = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "early_wait" and kinds(d) == ["wait"] and not d.ended
    assert (d.memory.maintenance.early_window, d.memory.maintenance.early_step) == (at(7 * 86400), 150)
    # the job's checkpoint interval is not known yet: look again in a poll
    assert d.actions[0].until == at(500 + CFG.poll_interval)  # type: ignore[union-attr]
    again = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(150)), d.memory, now=600)
    assert again.row == "early_wait" and again.memory.maintenance.early_step == 150  # the step at first sight is kept
    # the window is near: no later than 10 min before it
    near = tick(obs(_announced(start=1000), probes=running(1), checkpoint=ckpt(150)), run_mem(), now=390)
    assert near.actions[0].until == at(400)  # type: ignore[union-attr]


def test_early_wait_looks_often_only_when_the_checkpoint_is_nearly_due() -> None:
    """Checkpoint 150 saved at 300 s, every 1800 s: due at 2100 s. The stop must follow the
    save within a small share of the interval, not within a poll."""
    mem = run_mem(hang=HangLearning(ckpt_gap=1800.0, progress_step=150, progress_time=at(300),
                                    progress_at=at(300)))
    saved = replace(ckpt(150), time=at(300))
    early = tick(obs(_announced(), probes=running(1), checkpoint=saved), mem, now=500)
    assert early.row == "early_wait"
    assert early.actions[0].until == at(300 + 0.9 * 1800)  # type: ignore[union-attr]  # the last tenth
    close = tick(obs(_announced(), probes=running(1), checkpoint=saved), early.memory, now=2000)
    step = (close.actions[0].until - at(2000)).total_seconds()  # type: ignore[union-attr]
    assert step == 0.001 * 1800 < CFG.poll_interval
    late = tick(obs(_announced(), probes=running(1), checkpoint=saved), close.memory, now=2200)
    assert (late.actions[0].until - at(2200)).total_seconds() == step  # type: ignore[union-attr]
    landed = tick(obs(_announced(), probes=running(1), checkpoint=replace(ckpt(160), time=at(2130))),
                  late.memory, now=2200 + step)
    assert landed.row == "early_start"
    # a short interval: never more often than every second (each tick probes every worker over SSH)
    short = run_mem(hang=HangLearning(ckpt_gap=5.0, progress_step=150, progress_time=at(300), progress_at=at(300)))
    fast = tick(obs(_announced(), probes=running(1), checkpoint=saved), short, now=304.9)
    assert fast.actions[0].until == at(305.9)  # type: ignore[union-attr]


def test_row_early_start() -> None:
    waiting = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(150)), run_mem(), now=500).memory
    d = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(160)), waiting, now=700)
    assert d.row == "early_start" and kinds(d) == ["stop", "start_maintenance"]
    # the job saves on SIGTERM before its host goes down: the maintenance waits for the stop
    assert isinstance(d.actions[0], StopWorkers) and d.actions[0].wait
    end = d.ended[0]
    assert (end.outcome, end.charged, end.end_step) == ("disruption", False, 160)
    assert "maintenance started early by tpuwatch (checkpoint step 160 saved after the maintenance notice)" \
        in end.reason, end.reason
    m = d.memory
    assert (m.phase, m.budgets.restarts) == (Phase.IDLE, 0) and m.maintenance.notice_hold is not None
    # no launch while the node is about to go down; after it went down and came back, from step 160
    assert tick(obs(_announced(), probes=absent(), checkpoint=ckpt(160)), m, now=710).row == "notice_hold"
    down = tick(obs(_announced(status="ONGOING"), probes=None), m, now=720)
    down = tick(obs(node(health="UNHEALTHY_MAINTENANCE"), probes=None), down.memory, now=730)
    back = tick(obs(probes=absent(), checkpoint=ckpt(160)), down.memory, now=900)
    assert back.row == "launch" and back.memory.attempt.start_step == 160
    # a maintenance shorter than a poll, over between two ticks: the node's maintenance time says so
    done = replace(node(), maintenance_time=at(705))
    quick = tick(obs(done, probes=absent(), checkpoint=ckpt(160)), m, now=730)
    assert quick.row == "launch" and quick.memory.attempt.start_step == 160
    # a maintenance event from before the attempt explains nothing: still held
    old = replace(node(), maintenance_time=at(-5))
    assert tick(obs(old, probes=absent(), checkpoint=ckpt(160)), m, now=730).row == "notice_hold"


def test_early_start_at_the_margin_when_no_checkpoint_lands() -> None:
    waiting = tick(obs(_announced(start=5000), probes=running(1), checkpoint=ckpt(150)), run_mem(), now=500).memory
    d = tick(obs(_announced(start=5000), probes=running(1), checkpoint=ckpt(150)), waiting, now=4400)
    assert d.row == "early_start" and "no new checkpoint 10m00s before the window" in d.summary, d.summary


@pytest.mark.parametrize(("n", "start_early", "why"), [
    (_announced(can_reschedule=False), True, "cannot be rescheduled"),
    (_announced(status="ONGOING"), True, "already under way"),
    (_announced(owned=False), True, "not tpuwatch's node"),
    (_announced(), False, "maintenance.start_early = false"),
])
def test_no_early_start(n: NodeSnapshot, start_early: bool, why: str) -> None:
    d = tick(obs(n, probes=running(1), checkpoint=ckpt(160)),
             run_mem(maintenance=Maintenance(early_step=150, early_window=at(7 * 86400))),
             now=700, cfg=replace(CFG, start_early=start_early))
    assert d.row == "running", why


def test_row_early_refused() -> None:
    waiting = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(150)), run_mem(), now=500).memory
    started = tick(obs(_announced(), probes=running(1), checkpoint=ckpt(160)), waiting, now=700)
    refused = decide(obs(_announced(), probes=running(1), checkpoint=ckpt(160),
                         maintenance_refused="UNIMPLEMENTED: not supported for v4-32"), started.memory, CFG, at(700))
    assert refused.row == "early_refused" and "UNIMPLEMENTED" in refused.summary
    m = refused.memory
    assert m.maintenance.early_refused == at(7 * 86400) and m.maintenance.notice_hold is None
    relaunch = tick(obs(_announced(), probes=absent(), checkpoint=ckpt(160)), m, now=710)
    assert relaunch.row == "launch" and relaunch.memory.attempt.start_step == 160
    # noted once: the same window is not tried again; the job runs on until the notice
    running_again = tick(obs(_announced(), probes=running(2), checkpoint=ckpt(170)),
                         relaunch.memory, now=800)
    assert running_again.row == "running"


def test_row_spare_maintenance() -> None:
    # the job runs on pod; its idle spare "sp" has a maintenance that may start early: started now,
    # once (not again while the API still shows it PENDING), never on a spare not the job's, nor
    # with maintenance.start_early off; a refusal is said and the job runs on
    one = replace(CFG, slices=(NAME,), spares=("sp",), recreatable=False)
    sp = replace(node(), name="sp", id="n2", upcoming_maintenance=_announced().upcoming_maintenance)
    seen = obs(probes=running(1), checkpoint=ckpt(150), spares=(("sp", sp),))
    d = tick(seen, run_mem(), now=100, cfg=one)
    [start] = [a for a in d.actions if isinstance(a, StartMaintenance)]
    assert d.row == "spare_maintenance" and (start.name, start.idle) == ("sp", True), (d.row, kinds(d))
    assert d.memory.phase is Phase.RUNNING and d.ended == () and "idle spare of job" in start.reason
    again = tick(seen, d.memory, now=110, cfg=one)
    assert again.row == "running" and not any(isinstance(a, StartMaintenance) for a in again.actions)
    for cfg, spare in ((replace(one, start_early=False), sp), (one, replace(sp, labels={"tpuwatch-job": "other"})),
                       (replace(one, queued_resource="qr"), sp)):
        other = tick(replace(seen, spares=(("sp", spare),)), run_mem(), now=100, cfg=cfg)
        assert not any(isinstance(a, StartMaintenance) for a in other.actions), (other.row, kinds(other))
    refused = decide(replace(seen, maintenance_refused="FAILED_PRECONDITION: not now", maintenance_refused_idle="sp"),
                     d.memory, one, at(100))
    assert refused.row == "spare_maintenance" and "could not be started early" in refused.summary
    assert refused.memory == d.memory and refused.memory.phase is Phase.RUNNING
    # done with once it is no longer announced
    assert tick(replace(seen, spares=(("sp", replace(sp, upcoming_maintenance=None)),)), d.memory, now=120,
                cfg=one).memory.maintenance.idle_started == ()


def test_row_failure() -> None:
    d = tick(obs(probes=exited({1: 139}), checkpoint=ckpt(150), jitter=0.0), run_mem(), now=500)
    assert d.row == "failure"
    assert kinds(d) == ["stop", "wait"]
    m = d.memory
    assert (m.phase, m.budgets.restarts, m.budgets.backoff_level) == (Phase.BACKOFF, 1, 1)
    assert m.budgets.backoff_until == at(500)  # the first charged restart since a stable run: at once
    assert "relaunching now" in d.summary
    assert d.ended[0].charged and "exit code 139 (SIGSEGV)" in d.ended[0].reason
    again = tick(obs(probes=exited({1: 139}, attempt=2), checkpoint=ckpt(150), jitter=0.0),
                 run_mem(attempt=2, start=510, budgets=Budgets(restarts=1, backoff_level=1)), now=600)
    assert (again.row, again.memory.budgets.restarts, again.memory.budgets.backoff_level) == ("failure", 2, 2)
    assert again.memory.budgets.backoff_until == at(605)  # the second in a row: base 10s, jitter 0 -> half of it


def test_row_failed_start() -> None:
    d = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(100)), run_mem(), now=20)
    assert d.row == "failed_start"
    assert d.memory.phase is Phase.BACKOFF and d.memory.budgets.restarts == 1
    assert d.ended[0].outcome == "failed_start" and "min_uptime" in d.ended[0].reason
    assert d.memory.budgets.no_progress == 1  # no newer checkpoint than step 100


def test_row_fail_fast() -> None:
    d = tick(obs(probes=exited({1: 42}), checkpoint=ckpt(500)), run_mem(), now=5000)
    assert d.row == "fail_fast"
    assert kinds(d) == ["stop", "fail"]
    assert d.memory.phase is Phase.FAILED and d.exit_code == 1 and d.terminal
    assert "exit code 42" in d.memory.reason and "fail_fast_exit_codes" in d.memory.reason


def test_row_no_progress() -> None:
    d = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(100)), run_mem(budgets=Budgets(no_progress=2)), now=500)
    assert d.row == "no_progress"
    assert d.memory.phase is Phase.FAILED and d.exit_code == 1
    fail = d.actions[-1]
    assert isinstance(fail, Fail)
    assert "3 attempts in a row" in fail.reason and "step 100" in fail.reason
    assert "exit code 1" in fail.reason and "deterministic bug" in fail.reason


def test_row_budget_spent() -> None:
    d = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(300)), run_mem(budgets=Budgets(restarts=2)), now=500)
    assert d.row == "budget_spent"
    assert d.memory.phase is Phase.FAILED and d.memory.budgets.restarts == 2 and d.exit_code == 1
    fail = d.actions[-1]
    assert isinstance(fail, Fail)
    assert "restart budget spent" in fail.reason and "max_restarts = 2" in fail.reason
    assert fail.evidence and "exit code 1" in fail.evidence[0]


@pytest.mark.parametrize("state,health", [
    ("REPAIRING", "HEALTHY"), ("RESTARTING", ""), ("UNKNOWN", "UNHEALTHY_MAINTENANCE"),
    ("READY", "UNHEALTHY_MAINTENANCE"), ("READY", "TIMEOUT"),
])
def test_row_repair_wait(state: str, health: str) -> None:
    d = tick(obs(node(state, health)), idle(), now=100)
    assert d.row == "repair_wait"
    assert d.memory.phase is Phase.WAITING_NODE and d.memory.repair.unhealthy_since == at(100)
    assert d.actions == (Wait(at(700), d.actions[0].reason),)  # type: ignore[union-attr]
    # first sight is kept: a later tick waits for the same deadline
    d2 = tick(obs(node(state, health)), d.memory, now=400)
    assert d2.row == "repair_wait" and d2.memory.repair.unhealthy_since == at(100)


@pytest.mark.parametrize("health", ["", "HEALTH_UNSPECIFIED"])
def test_row_failed_repair(health: str) -> None:
    # UNKNOWN with no health: waited for FAILED_REPAIR_GRACE (5 min) from its first sight, not
    # repair_timeout (10 min here) from the node's first trouble
    m = idle(phase=Phase.WAITING_NODE, repair=Repair(unhealthy_since=at(0)))
    d = tick(obs(node("UNKNOWN", health)), m, now=200)
    assert d.row == "repair_wait" and d.memory.repair.unknown_since == at(200) and d.memory.repair.unhealthy_since == at(0)
    assert d.actions == (Wait(at(500), d.actions[0].reason),)  # type: ignore[union-attr]
    assert "after a failed repair" in d.summary
    still = tick(obs(node("UNKNOWN", health)), d.memory, now=499)
    assert still.row == "repair_wait" and kinds(still) == ["wait"]
    gone = tick(obs(node("UNKNOWN", health)), still.memory, now=500)
    assert gone.row == "failed_repair" and kinds(gone) == ["delete"]
    assert (gone.memory.phase, gone.memory.budgets.recreates) == (Phase.DELETING, 1)
    assert "failed repair" in gone.summary and "5m" in gone.summary
    # REPAIRING again between the two: the grace starts over at the next UNKNOWN
    back = tick(obs(node("REPAIRING")), d.memory, now=300)
    assert back.row == "repair_wait" and back.memory.repair.unknown_since is None
    # repair_timeout shorter than the grace bounds it
    short = tick(obs(node("UNKNOWN", health)), d.memory, now=320, cfg=replace(CFG, repair_timeout=100.0))
    assert short.row == "failed_repair"
    # never under a live attempt: every worker still runs it
    live = tick(obs(node("UNKNOWN", health), probes=running(1)),
                run_mem(repair=Repair(unknown_since=at(0))), now=900)
    assert live.row == "unhealthy_running" and kinds(live) == []
    # not owned: a person's, as for any recreate
    theirs = tick(obs(node("UNKNOWN", health, owned=False)), d.memory, now=500)
    assert theirs.row == "not_owned"


def test_failed_repair_of_one_slice() -> None:
    # one slice past a failed repair, the other READY: the job's node is UNKNOWN too
    cfg = replace(CFG, slices=("s0", "s1"))
    ms = combine_slices(NAME, [replace(node(), name="s0"), replace(node("UNKNOWN", "HEALTH_UNSPECIFIED"), name="s1")])
    assert ms is not None and ms.state == "UNKNOWN"
    d = tick(obs(ms), idle(phase=Phase.WAITING_NODE,
                           repair=Repair(unknown_since=at(0), unhealthy_since=at(0))), now=300, cfg=cfg)
    assert d.row == "failed_repair"


def test_row_repair_timeout() -> None:
    m = idle(phase=Phase.WAITING_NODE, repair=Repair(unhealthy_since=at(0)))
    d = tick(obs(node("REPAIRING")), m, now=600)
    assert d.row == "repair_timeout"
    assert d.actions == (DeleteNode(NAME, ZONES[0], d.actions[0].reason),)  # type: ignore[union-attr]
    assert (d.memory.phase, d.memory.budgets.recreates, d.memory.pending_kind) == (Phase.DELETING, 1, "delete")


def test_row_mig_repair_wait() -> None:
    # past repair_timeout while the MIG still makes its VMs again: no recreateInstances of them
    m = idle(phase=Phase.WAITING_NODE, repair=Repair(unhealthy_since=at(0)))
    acting = node("REPAIRING", repairs_itself=True, repair_under_way="MIG acting on slice-a: RECREATING")
    d = tick(obs(acting), m, now=600)
    assert d.row == "mig_repair_wait" and kinds(d) == ["wait"] and d.memory.phase is Phase.WAITING_NODE
    assert "slice-a: RECREATING" in d.summary and d.memory.budgets.recreates == 0
    later = tick(obs(acting), d.memory, now=6000)
    assert later.row == "mig_repair_wait" and later.memory.repair.unhealthy_since == at(0)
    # the MIG's repair is over and the slice still not READY: recreated
    idle_mig = tick(obs(node("REPAIRING", repairs_itself=True)), later.memory, now=6001)
    assert idle_mig.row == "repair_timeout" and kinds(idle_mig) == ["delete"]


def test_a_mig_only_settling_is_waited_for_up_to_repair_timeout_from_its_first_sight_so() -> None:
    # not stable with every VM running and none with an action: the end of the MIG's own repair,
    # read across calls, seconds long; one that lasts repair_timeout is no repair, and is recreated
    m = idle(phase=Phase.WAITING_NODE, repair=Repair(unhealthy_since=at(0)))
    settling = node("REPAIRING", repairs_itself=True, repair_under_way="MIG not stable, every instance running: "
                    "the MIG settling", repair_settling=True)
    d = tick(obs(settling), m, now=3000)
    assert d.row == "mig_repair_wait" and d.memory.repair.settling_since == at(3000), d.summary
    still = tick(obs(settling), d.memory, now=3000 + 599)
    assert still.row == "mig_repair_wait"
    over = tick(obs(settling), still.memory, now=3600)
    assert over.row == "repair_timeout" and kinds(over) == ["delete"], over.summary
    assert "not stable for 10m00s" in over.summary
    # stable again, then settling once more: a new first sight
    healed = tick(obs(node()), over.memory, now=3601)
    assert healed.memory.repair.settling_since is None


@pytest.mark.parametrize("state", ["PREEMPTED", "TERMINATED"])
def test_a_dead_vm_in_a_mig_that_repairs_by_itself_is_waited_for(state: str) -> None:
    # a Spot VM of a MIG with defaultActionOnFailure REPAIR: Google recreates it (same name)
    d = tick(obs(node(state, repairs_itself=True), probes=None), run_mem(), now=500)
    assert d.row == "repair_wait" and kinds(d) == ["wait"], d.summary
    assert d.ended[0].outcome == "disruption" and d.memory.budgets.restarts == 0
    assert "its MIG repairs it by itself" in d.summary
    timed_out = tick(obs(node(state, repairs_itself=True)), d.memory, now=1100)
    assert timed_out.row == "repair_timeout" and kinds(timed_out) == ["delete"]


@pytest.mark.parametrize("state", ["PREEMPTED", "TERMINATED"])
def test_row_dead_node(state: str) -> None:
    d = tick(obs(node(state), probes=None), run_mem(), now=500)
    assert d.row == "dead_node"
    assert kinds(d) == ["delete"]  # no stop: the workers are gone with the node
    assert d.ended[0].outcome == "disruption" and d.memory.budgets.restarts == 0 and d.memory.budgets.disruptions == 1
    assert d.memory.phase is Phase.DELETING and d.memory.recreate.deleting_node_id == "n1"


def test_row_spot_stopping() -> None:
    # a Compute Engine Spot VM (action STOP) stopping: a preemption ends TERMINATED, a person's
    # instances.delete gone; nothing sent to it until then
    stopping = node("PREEMPTED", spot=True, kind="instance", stopping=True)
    d = tick(obs(stopping, probes=None), run_mem(), now=500)
    assert d.row == "spot_stopping" and kinds(d) == ["wait"] and d.exit_code == 0, d.summary
    assert d.ended[0].outcome == "disruption" and d.memory.phase is Phase.WAITING_NODE
    again = tick(obs(stopping, probes=None), d.memory, now=700)
    assert again.row == "spot_stopping" and kinds(again) == ["wait"]
    gone = tick(obs(missing=True), again.memory, now=910)  # a person's delete: never made again
    assert gone.row == "node_missing" and gone.exit_code == 1 and "create" not in kinds(gone)
    terminated = tick(obs(node("PREEMPTED", spot=True, kind="instance"), probes=None), again.memory, now=910)
    assert terminated.row == "dead_node" and kinds(terminated) == ["delete"]


def test_row_spot_stopping_long() -> None:
    # Google's stop of a Spot VM ends in seconds: one stopping 5 min (since first seen down) is said,
    # naming the VM and how long, as a wait of its own (its journal event is alert stopping_long);
    # still nothing sent to it, and it ends as a short stop does
    from tpuwatch.policy.alerts import Where, from_event
    from tpuwatch.policy.values import action_dict

    stopping = node("PREEMPTED", spot=True, kind="instance", stopping=True)
    d = tick(obs(stopping, probes=None), run_mem(), now=500)
    long = tick(obs(stopping, probes=None), d.memory, now=500 + 300)
    assert long.row == "spot_stopping_long" and kinds(long) == ["wait"] and long.exit_code == 0, long.summary
    assert "pod has been stopping for 5m" in long.summary and long.memory.phase is Phase.WAITING_NODE
    [wait] = long.actions
    alert = from_event(Where("job", "pod", "z"), 7, "wait", at(800), long.summary, action_dict(wait))
    assert alert is not None and alert.kind == "stopping_long" and "pod has been stopping for 5m" in alert.text
    # half of a short recovery.operation_timeout comes first
    short = tick(obs(stopping, probes=None), d.memory, now=500 + 61, cfg=replace(CFG, operation_timeout=120.0))
    assert short.row == "spot_stopping_long", short.summary
    terminated = tick(obs(node("PREEMPTED", spot=True, kind="instance"), probes=None), long.memory, now=810)
    assert terminated.row == "dead_node" and kinds(terminated) == ["delete"]


def test_row_spot_stopping_timeout() -> None:
    # still stopping after recovery.operation_timeout: a person is asked, naming the VM and how
    # long; nothing sent to it (a person's instances.delete looks the same)
    stopping = node("PREEMPTED", spot=True, kind="instance", stopping=True)
    d = tick(obs(stopping, probes=None), run_mem(), now=500)
    d = tick(obs(stopping, probes=None), d.memory, now=500 + 3599)
    assert d.row == "spot_stopping_long"
    stuck = tick(obs(stopping, probes=None), d.memory, now=500 + 3600)
    assert stuck.row == "spot_stopping_timeout" and kinds(stuck) == ["needs_person"] and stuck.exit_code == 1
    assert "Spot VM pod has been stopping for 1h" in stuck.summary and "recovery.operation_timeout" in stuck.summary
    assert stuck.memory.phase is Phase.HALTED


def test_row_not_owned() -> None:
    d = tick(obs(node("PREEMPTED", owned=False)), idle(), now=10)
    assert d.row == "not_owned"
    assert kinds(d) == ["needs_person"] and d.exit_code == 1
    assert "not owned: will not delete pod (label tpuwatch-job=job missing); pass --adopt" in d.summary
    assert d.memory.phase is Phase.HALTED and d.memory.budgets.recreates == 0
    adopted = tick(obs(node("PREEMPTED", owned=False), adopt=True), idle(), now=10)
    assert adopted.row == "dead_node" and kinds(adopted) == ["delete"]


def test_row_not_recreatable() -> None:
    """Slices created one by one ([tpu] names, no queued resource): none is ever deleted; a
    multislice queued resource is recreated as a whole."""
    separate = replace(CFG, slices=("np-0", "np-1"), recreatable=False)
    d = tick(obs(node("PREEMPTED")), idle(), now=10, cfg=separate)
    assert d.row == "not_recreatable"
    assert kinds(d) == ["needs_person"] and d.exit_code == 1 and d.memory.phase is Phase.HALTED
    assert "created one by one" in d.summary and d.memory.budgets.recreates == 0
    missing = tick(obs(missing=True, recreate_missing=True), idle(), now=10, cfg=separate)
    assert missing.row == "not_recreatable" and kinds(missing) == ["needs_person"]
    whole = tick(obs(node("PREEMPTED")), idle(), now=10, cfg=replace(separate, recreatable=True))
    assert whole.row == "dead_node" and kinds(whole) == ["delete"]


def test_row_limp() -> None:
    """More cases (the floor, a person's stop, no min_slices): tests/policy/test_policy_limp.py."""
    mem = run_mem(step=100)
    down = tuple(WorkerProbe(w, "unreachable") if w in (4, 5) else WorkerProbe(w, "running", attempt=1, pid=w)
                 for w in range(8))
    d = tick(limp_look({"s2": "REPAIRING"}, mem, probes=down), mem, now=600, cfg=LIMPS)
    assert d.row == "limp" and d.memory.limp.out == ("s2",) and d.memory.phase is Phase.IDLE
    assert [(e.outcome, e.charged) for e in d.ended] == [("disruption", False)]


def test_row_swap() -> None:
    """More cases (the spare's fitness, several lost slices, a slice left out): tests/policy/test_policy_spares.py."""
    mem = run_mem(step=100)
    down = tuple(WorkerProbe(w, "unreachable") if w in (4, 5) else WorkerProbe(w, "running", attempt=1, pid=w)
                 for w in range(8))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=down), mem, now=600,
             cfg=replace(LIMPS, min_slices=0, spares=("x0",)))
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),) and d.memory.phase is Phase.IDLE
    assert [(e.outcome, e.charged) for e in d.ended] == [("disruption", False)]


def test_row_spare_remake() -> None:
    """More cases (the create spaced out, never a spare not the job's): tests/policy/test_policy_spares.py."""
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=running(1, workers=8)), mem, now=600,
             cfg=replace(LIMPS, min_slices=0, spares=("x0",), spares_remade=True))
    assert d.row == "spare_remake" and kinds(d) == ["remake_spare"] and d.memory.limp.remaking == ("s2",)


def test_row_spare_gone() -> None:
    """More cases: tests/policy/test_policy_spares.py."""
    mem = run_mem(step=100, limp=Limp(deletes=("x0",), vanished=("x0",), vanished_since=(at(0),)))
    d = tick(limp_look({}, mem, spares=("x0",), parts={"x0": None}, probes=running(1, workers=8)), mem, now=181,
             cfg=replace(LIMPS, min_slices=0, spares=("x0",), spares_remade=True))
    assert d.row == "spare_gone" and d.memory.limp.vanished == () and "remake_spare" not in kinds(d)


def test_row_spare_bad() -> None:
    """More cases: tests/policy/test_policy_spares.py."""
    mem = replace(run_mem(step=100), phase=Phase.IDLE, limp=Limp(swapped=(("s2", "x0"),)))
    looked = limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=tuple(WorkerProbe(w, "absent") for w in range(8)),
                       precheck=pre(("devices", 5, False), workers=8))
    d = tick(looked, mem, now=600, cfg=replace(LIMPS, min_slices=0, spares=("x0",)))
    assert d.row == "spare_bad" and d.memory.limp.swapped == () and d.memory.limp.bad == ("x0@id-x0",)


def test_row_spare_wait() -> None:
    """More cases: tests/policy/test_policy_spares.py."""
    mem = run_mem(step=100, limp=Limp(remaking=("x0",)))
    down = tuple(WorkerProbe(w, "unreachable") if w in (4, 5) else WorkerProbe(w, "running", attempt=1, pid=w)
                 for w in range(8))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": None}, probes=down), mem, now=600,
             cfg=replace(LIMPS, min_slices=0, spares=("x0",), spares_remade=True))
    assert d.row == "spare_wait" and d.memory.phase is Phase.WAITING_NODE and not d.memory.budgets.restarts


def test_row_early_swap() -> None:
    """More cases (a maintenance that may not start early, no spare): tests/policy/test_policy_spares.py."""
    um = UpcomingMaintenance("SCHEDULED", "PENDING", True, at(7 * 86400), at(7 * 86400 + 3600), at(7 * 86400))
    cfg = replace(LIMPS, min_slices=0, spares=("x0",))
    mem = run_mem(step=100)
    seen = limp_look({}, mem, spares=("x0",), parts={"s1": replace(limp_part("s1"), upcoming_maintenance=um)},
                     probes=running(1, workers=8), checkpoint=ckpt(150))
    waiting = tick(seen, mem, now=500, cfg=cfg)
    d = tick(replace(seen, checkpoint=ckpt(160)), waiting.memory, now=700, cfg=cfg)
    assert d.row == "early_swap" and kinds(d) == ["stop", "start_maintenance"] and d.memory.limp.swapped == (("s1", "x0"),)


def test_row_grow_wait() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    d = tick(limp_look({}, mem, probes=running(1, workers=6), checkpoint=ckpt(300)), mem, now=900, cfg=LIMPS)
    assert d.row == "grow_wait" and d.memory.limp.back_step == 300 and d.memory.phase is Phase.RUNNING


def test_row_grow() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    waiting = tick(limp_look({}, mem, probes=running(1, workers=6), checkpoint=ckpt(300)), mem, now=900, cfg=LIMPS)
    d = tick(limp_look({}, waiting.memory, probes=running(1, workers=6), checkpoint=ckpt(400)), waiting.memory,
             now=960, cfg=LIMPS)
    assert d.row == "grow" and d.memory.limp.out == () and d.memory.phase is Phase.IDLE
    assert [(e.outcome, e.charged) for e in d.ended] == [("disruption", False)]


def test_row_recreate_budget_spent() -> None:
    d = tick(obs(node("TERMINATED")), idle(budgets=Budgets(recreates=2)), now=10)
    assert d.row == "recreate_budget_spent"
    assert kinds(d) == ["fail"] and d.memory.phase is Phase.FAILED and d.exit_code == 1
    assert "max_recreates = 2" in d.memory.reason


def test_row_node_missing() -> None:
    d = tick(obs(missing=True), run_mem(), now=500)
    assert d.row == "node_missing"
    assert kinds(d) == ["needs_person"] and d.exit_code == 1
    assert d.memory.phase is Phase.HALTED and "--recreate-missing" in d.summary
    assert d.ended[0].outcome == "disruption"
    # not sticky: once the node is back, the job resumes
    back = tick(obs(probes=absent(), checkpoint=ckpt(100)), d.memory, now=600)
    assert back.row == "launch" and back.memory.attempt.number == 2


def test_row_recreate_missing() -> None:
    d = tick(obs(missing=True, recreate_missing=True), idle(), now=5)
    assert d.row == "recreate_missing"
    assert d.actions == (CreateNode(NAME, ZONES[0], d.actions[0].reason, {"attempt": "1"}),)  # type: ignore[union-attr]
    assert (d.memory.phase, d.memory.budgets.recreates, d.memory.pending_kind) == (Phase.CREATING, 1, "create")


def test_row_recreate_asked() -> None:
    """A person's recreate (`tpuwatch recreate`) takes the policy's own path, not charged."""
    d = tick(obs(node(), recreate_asked=True), idle(), now=5)
    assert d.row == "recreate_asked" and kinds(d) == ["delete"]
    assert (d.memory.phase, d.memory.budgets.recreates, d.memory.recreate.deleting_node_id) == (Phase.DELETING, 0, "n1")
    assert "not charged" in d.summary
    spent = tick(obs(node(), recreate_asked=True), idle(budgets=Budgets(recreates=3)), now=5)
    assert spent.row == "recreate_asked" and kinds(spent) == ["delete"]  # the budget bounds tpuwatch's own tries
    # a running attempt ends first, as a disruption: stopped, not charged
    ran = tick(obs(node(), probes=running(1), recreate_asked=True), run_mem(), now=500)
    assert ran.row == "recreate_asked" and kinds(ran) == ["stop", "delete"]
    assert ran.ended[0].outcome == "disruption" and not ran.ended[0].charged
    # a missing node is created; a node not owned or deleted by someone else is refused
    gone = tick(obs(missing=True, recreate_asked=True), idle(), now=5)
    assert gone.row == "recreate_asked" and kinds(gone) == ["create"] and gone.memory.phase is Phase.CREATING
    # ... unless a request the service gave up on still holds its name: that goes first
    held = tick(obs(missing=True, queued=QueuedStatus(QR_NAME, "FAILED"), recreate_asked=True), idle(), now=5)
    assert held.row == "recreate_asked" and kinds(held) == ["delete"] and held.memory.phase is Phase.DELETING
    assert tick(obs(node(owned=False), recreate_asked=True), idle(), now=5).row == "not_owned"
    assert tick(obs(node(state="DELETING"), recreate_asked=True), idle(), now=5).row == "someone_deleting"
    # an operation in flight is followed, not started again
    following = tick(obs(node(state="DELETING"), recreate_asked=True), d.memory, now=6)
    assert following.row == "deleting" and kinds(following) == ["follow"]
    # the same decision without the ask: a healthy idle node is launched on
    assert tick(obs(node()), idle(), now=5).row != "recreate_asked"


def _google_deletes(now: float, **kw: object) -> Memory:
    """Memory after a sighting of an owned VM that Google deletes itself (a Spot VM with DELETE)."""
    return decide(obs(node(spot=True, google_deletes=True, **kw)), idle(), CFG, at(now)).memory  # type: ignore[arg-type]


def test_row_google_deleted() -> None:
    preempted = AuditEvent(time=at(6), kind="terminate", node=NAME, worker="0", method="compute.instances.preempted",
                           reason="", insert_id="p", resource_name=f"projects/p/zones/z/instances/{NAME}")
    d = tick(obs(missing=True, events=(preempted,)), _google_deletes(5), now=7)
    assert d.row == "google_deleted"
    assert d.actions == (CreateNode(NAME, ZONES[0], d.actions[0].reason, {"attempt": "1"}),)  # type: ignore[union-attr]
    assert (d.memory.phase, d.memory.budgets.recreates, d.memory.budgets.restarts) == (Phase.CREATING, 1, 0)


def test_row_google_deleting() -> None:
    d = tick(obs(node(state="DELETING", spot=True, google_deletes=True, google_deleting="shutdownDetails")),
             _google_deletes(5), now=7)
    assert d.row == "google_deleting" and d.exit_code == 0
    assert [a.kind for a in d.actions] == ["wait"] and d.memory.phase is Phase.WAITING_NODE


def test_row_google_delete_wait() -> None:
    d = tick(obs(missing=True), _google_deletes(5), now=7)
    assert d.row == "google_delete_wait" and d.exit_code == 0
    assert d.actions == (Wait(at(7 + 180), "node missing"),)
    assert tick(obs(missing=True), d.memory, now=7 + 180).row == "node_missing"


def _host_error(t: float) -> AuditEvent:
    return AuditEvent(time=at(t), kind="terminate", node=NAME, worker="0", method="compute.instances.hostError",
                      reason="", insert_id=f"h{t}", resource_name=f"projects/p/zones/z/instances/{NAME}")


def test_row_google_stopped_start() -> None:
    d = tick(obs(node(state="STOPPED", auto_restart=False), events=(_host_error(4),)), idle(), now=5)
    assert d.row == "google_stopped_start" and d.exit_code == 0
    assert [a.kind for a in d.actions] == ["start_node", "wait"] and d.memory.phase is Phase.WAITING_NODE
    again = tick(obs(node(state="STOPPED", auto_restart=False)), d.memory, now=6)
    assert again.row == "google_stopped_wait" and "start_node" not in [a.kind for a in again.actions]  # once
    late = tick(obs(node(state="STOPPED", auto_restart=False)), again.memory, now=5 + CFG.repair_timeout)
    assert late.row == "repair_timeout" and [a.kind for a in late.actions] == ["delete"]


def test_row_google_stopped_wait() -> None:
    d = tick(obs(node(state="STOPPED"), events=(_host_error(4),)), idle(), now=5)  # automaticRestart: Google's
    assert d.row == "google_stopped_wait" and d.actions == (Wait(at(5 + CFG.repair_timeout), d.actions[0].reason),)
    mine = tick(obs(node(state="STOPPED", auto_restart=False, owned=False), events=(_host_error(4),)), idle(), now=5)
    assert mine.row == "google_stopped_wait"  # not the job's: never started by tpuwatch


QR_NAME = "projects/p/locations/us-central2-b/queuedResources/pod-qr"


@pytest.mark.parametrize("state", ["SUSPENDING", "SUSPENDED", "FAILED"])
def test_row_queued_preempted(state: str) -> None:
    taken = QueuedStatus(QR_NAME, state)
    # The node is being deleted by the service while the job runs: a disruption, not a halt.
    d = tick(obs(node("DELETING"), probes=None, queued=taken), run_mem(), now=500)
    assert d.row == "queued_preempted" and d.exit_code == 0
    assert kinds(d) == ["delete"] and d.memory.phase is Phase.DELETING and d.memory.budgets.recreates == 1
    assert d.ended[0].outcome == "disruption" and d.memory.budgets.restarts == 0
    assert f"pod-qr is {state}" in d.summary and "not charged" in d.summary
    # Already gone (a cron tick came late): the request alone is deleted, then followed to its end.
    gone = tick(obs(missing=True, queued=taken), run_mem(), now=500)
    assert gone.row == "queued_preempted" and kinds(gone) == ["delete"] and gone.memory.recreate.deleting_node_id == ""
    follow = tick(obs(missing=True, queued=QueuedStatus(QR_NAME, "DELETING")),
                  replace(gone.memory, recreate=replace(gone.memory.recreate, pending_op="op-1")), now=510)
    assert follow.row == "deleting" and kinds(follow) == ["follow"]
    after = tick(obs(missing=True, queued=QueuedStatus(QR_NAME, ""), operation=op("op-1")),
                 replace(gone.memory, recreate=replace(gone.memory.recreate, pending_op="op-1")), now=520)
    assert after.row == "create_after_delete" and kinds(after) == ["create"]
    # A request a person deleted (none left) keeps the node a person's business.
    person = tick(obs(missing=True, queued=QueuedStatus(QR_NAME, "")), run_mem(), now=500)
    assert person.row == "node_missing" and person.exit_code == 1
    # While the request still stands (ACTIVE), a deleting node is someone else's doing.
    active = tick(obs(node("DELETING"), queued=QueuedStatus(QR_NAME, "ACTIVE")), idle(), now=5)
    assert active.row == "someone_deleting"


def test_a_flex_start_resize_request_taken_back_is_told_as_compute_engines_by_its_kind() -> None:
    # what the request is comes from its kind, not from the shape of its name
    taken = QueuedStatus("slice-tpuwatch-1", "SUSPENDED", kind="resize_request")
    d = tick(obs(missing=True, queued=taken), run_mem(), now=500)
    assert d.row == "queued_preempted" and "not charged" in d.summary
    assert "Compute Engine took" in d.summary and "resize request slice-tpuwatch-1 is SUSPENDED" in d.summary
    assert "queued resource" not in d.summary


def test_a_queued_resource_given_up_while_its_create_is_followed_is_queued() -> None:
    creating = replace(idle(), phase=Phase.CREATING, zone=ZONES[0],
                       recreate=replace(idle().recreate, pending_op="op-9"))
    d = tick(obs(missing=True, operation=op("op-9"), queued=QueuedStatus(QR_NAME, "FAILED", 8, "Quota limit hit")),
             creating, now=50)
    assert d.row == "no_capacity" and d.memory.phase is Phase.QUEUED
    assert "queued resource pod-qr FAILED: Quota limit hit" in d.summary


def test_row_someone_deleting() -> None:
    d = tick(obs(node("DELETING")), idle(), now=5)
    assert d.row == "someone_deleting"
    assert kinds(d) == ["needs_person"] and d.memory.phase is Phase.HALTED and d.exit_code == 1


@pytest.mark.parametrize("state", ["STOPPED", "STOPPING", "HIDDEN"])
def test_row_person_stopped(state: str) -> None:
    d = tick(obs(node(state)), run_mem(), now=500)
    assert d.row == "person_stopped"
    assert kinds(d) == ["wait"] and d.exit_code == 0
    assert d.memory.phase is Phase.PAUSED and "a person stopped it" in d.summary
    assert d.ended[0].outcome == "disruption" and d.memory.budgets.restarts == 0
    # long after repair_timeout it is still left alone
    later = tick(obs(node(state)), d.memory, now=50_000)
    assert later.row == "person_stopped" and "delete" not in kinds(later)


def test_row_unknown_state() -> None:
    d = tick(obs(node("UNKNOWN_ENUM_99")), idle(), now=0)
    assert d.row == "unknown_state" and d.memory.phase is Phase.WAITING_NODE
    late = tick(obs(node("UNKNOWN_ENUM_99")), d.memory, now=600)
    assert late.row == "unknown_state"
    assert kinds(late) == ["needs_person"] and late.memory.phase is Phase.HALTED


def test_row_unhealthy_running() -> None:
    d = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=running(1)), run_mem(), now=100)
    assert d.row == "unhealthy_running"
    assert d.actions == () and d.memory.phase is Phase.RUNNING
    assert any("UNHEALTHY_MAINTENANCE" in e.what for e in d.memory.attempt.evidence)
    # far past repair_timeout, a live attempt is still not killed
    later = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=running(1)), d.memory, now=5000)
    assert later.row == "unhealthy_running" and later.actions == ()


def _deleting(pending: str | None = "op-del") -> object:
    return idle(phase=Phase.DELETING,
                recreate=Recreate(pending_op=pending, deleting_node_id="n1"),
                budgets=Budgets(recreates=1))


def test_row_deleting() -> None:
    d = tick(obs(node("DELETING"), operation=op("op-del", done=False)), _deleting(), now=5)  # type: ignore[arg-type]
    assert d.row == "deleting"
    assert d.actions == (FollowOperation("op-del", "delete", d.actions[0].reason),)  # type: ignore[union-attr]


def test_a_node_replaced_during_the_delete_gets_a_repair_clock_of_its_own() -> None:
    """A node of a new id while tpuwatch deletes the old one (a MIG making its instances again):
    it is followed as a new node, and a repair of it is timed from now, not from the old node's
    repair, else the next tick would find repair_timeout spent and recreate it again at once."""
    old = replace(_deleting(), repair=Repair(unhealthy_since=at(0), unknown_since=at(0)))  # type: ignore[type-var]
    d = tick(obs(replace(node("REPAIRING"), id="n2")), old, now=5000)
    assert d.row == "deleting" and d.memory.phase is Phase.IDLE and d.actions[0].kind == "wait"  # type: ignore[union-attr]
    assert d.memory.repair.unhealthy_since is None and d.memory.repair.unknown_since is None
    after = tick(obs(replace(node("REPAIRING"), id="n2")), d.memory, now=5010)
    assert "delete" not in kinds(after), after.summary


def test_row_delete_resume() -> None:
    d = tick(obs(node("PREEMPTED")), _deleting(pending=None), now=5)  # type: ignore[arg-type]
    assert d.row == "delete_resume" and kinds(d) == ["delete"]
    assert d.memory.budgets.recreates == 1  # the same recreate, not a new one


def test_a_spot_vm_stopping_after_a_delete_journaled_but_not_recorded_is_followed_not_waited_for() -> None:
    # the watcher killed between its delete's journal line and the operation's record: a VM
    # stopping may be that delete's doing, followed to its end and made again (never `spot_stopping`,
    # which would take the VM gone for a person's deletion); TERMINATED, the delete never started
    stopping = node("PREEMPTED", spot=True, kind="instance", stopping=True)
    d = tick(obs(stopping), _deleting(pending=None), now=5)  # type: ignore[arg-type]
    assert d.row == "deleting" and d.memory.phase is Phase.DELETING and "delete" not in kinds(d), d.summary
    gone = tick(obs(missing=True), d.memory, now=10)
    assert gone.row == "create_after_delete" and kinds(gone)[-1] == "create"
    again = tick(obs(replace(stopping, stopping=False)), _deleting(pending=None), now=5)  # type: ignore[arg-type]
    assert again.row == "delete_resume" and kinds(again) == ["delete"]


def test_row_delete_failed() -> None:
    d = tick(obs(node("PREEMPTED"), operation=op("op-del", code=7, message="denied")), _deleting(), now=5)  # type: ignore[arg-type]
    assert d.row == "delete_failed" and d.memory.phase is Phase.FAILED and "denied" in d.summary


def test_row_operation_timeout() -> None:
    # CFG.operation_timeout is the default hour; the operations were journaled at at(0)
    late_del = replace(op("op-del", done=False), started=at(0))
    d = tick(obs(node("DELETING"), operation=late_del), _deleting(), now=3599)  # type: ignore[arg-type]
    assert d.row == "deleting" and d.memory.phase is Phase.DELETING
    d = tick(obs(node("DELETING"), operation=late_del), _deleting(), now=3600)  # type: ignore[arg-type]
    assert d.row == "operation_timeout" and d.memory.phase is Phase.FAILED and d.exit_code == 1
    assert "op-del" in d.summary and "recovery.operation_timeout" in d.summary
    assert not any(isinstance(a, (DeleteNode, CreateNode)) for a in d.actions)
    late_create = replace(op("op-c", done=False), started=at(0))
    c = tick(obs(missing=True, operation=late_create), _creating(), now=7200)  # type: ignore[arg-type]
    assert c.row == "operation_timeout" and "the create of node" in c.summary
    unknown_age = op("op-c", done=False)  # no journal row: never timed out on a guess
    assert tick(obs(missing=True, operation=unknown_age), _creating(), now=10**6).row == "creating"  # type: ignore[arg-type]


def test_row_create_after_delete() -> None:
    d = tick(obs(missing=True, operation=op("op-del")), _deleting(), now=5)  # type: ignore[arg-type]
    assert d.row == "create_after_delete"
    assert d.actions == (CreateNode(NAME, ZONES[0], d.actions[0].reason, {"attempt": "1"}),)  # type: ignore[union-attr]
    assert d.operation_done == "op-del"
    assert (d.memory.phase, d.memory.recreate.pending_op, d.memory.pending_kind) == (Phase.CREATING, None,
                                                                                     "create")


def _creating(pending: str | None = "op-c", zone_try: int = 0) -> object:
    return idle(phase=Phase.CREATING, zone=ZONES[zone_try],
                recreate=Recreate(pending_op=pending, zone_try=zone_try),
                budgets=Budgets(recreates=1))


def test_row_creating() -> None:
    d = tick(obs(missing=True, operation=op("op-c", done=False)), _creating(), now=5)  # type: ignore[arg-type]
    assert d.row == "creating"
    assert d.actions == (FollowOperation("op-c", "create", d.actions[0].reason),)  # type: ignore[union-attr]


def test_row_create_resume() -> None:
    d = tick(obs(missing=True), _creating(pending=None), now=5)  # type: ignore[arg-type]
    assert d.row == "create_resume" and kinds(d) == ["create"]


def test_a_node_still_creating_whose_operation_was_never_journaled_is_waited_for_not_judged() -> None:
    # A watcher killed between its create call and the journal's record of the operation: the
    # next one finds the node CREATING and no operation. It waits for it (never repair_timeout,
    # which would delete it mid-create), until recovery.operation_timeout has passed.
    creating = node("CREATING", id="n2")
    d = tick(obs(creating), _creating(pending=None), now=5)  # type: ignore[arg-type]
    assert d.row == "creating" and d.memory.phase is Phase.CREATING and kinds(d) == ["wait"]
    d = tick(obs(creating), _creating(pending=None), now=int(CFG.operation_timeout) + 1)  # type: ignore[arg-type]
    assert d.row == "created" and d.memory.phase is Phase.IDLE


def test_row_created() -> None:
    d = tick(obs(node("CREATING", id="n2"), operation=op("op-c")), _creating(), now=5)  # type: ignore[arg-type]
    assert d.row == "created" and d.memory.phase is Phase.IDLE and d.operation_done == "op-c"
    assert d.memory.pending_kind == "" and d.memory.recreate.pending_op is None
    # ALREADY_EXISTS from tpuwatch's own create is success
    exists = tick(obs(node(id="n2"), operation=op("op-c", code=6, message="exists"), create_failure="exists"),
                  _creating(), now=5)  # type: ignore[arg-type]
    assert exists.row == "created" and exists.memory.phase is Phase.IDLE


def test_row_create_failed() -> None:
    o = obs(missing=True, operation=op("op-c", code=3, message="bad accelerator"), create_failure="fatal")
    d = tick(o, _creating(), now=5)  # type: ignore[arg-type]
    assert d.row == "create_failed" and d.memory.phase is Phase.FAILED and "bad accelerator" in d.summary


def test_row_no_capacity() -> None:
    o = obs(missing=True, operation=op("op-c", code=8, message="There is no more capacity in the zone"),
            create_failure="queueable", jitter=0.0)
    d = tick(o, _creating(), now=100)  # type: ignore[arg-type]
    assert d.row == "no_capacity" and kinds(d) == ["wait"]
    m = d.memory
    assert (m.phase, m.recreate.queued_since, m.recreate.queue_tries, m.recreate.retry_at) == (Phase.QUEUED,
                                                                                               at(100), 1, at(105))
    assert m.pending_kind == "" and d.exit_code == 0


def _queued(since: float, retry: float, zone_try: int = 0) -> object:
    return idle(phase=Phase.QUEUED, zone=ZONES[zone_try],
                recreate=Recreate(queued_since=at(since), retry_at=at(retry), queue_tries=3, zone_try=zone_try),
                budgets=Budgets(recreates=1))


def test_row_queued() -> None:
    d = tick(obs(missing=True), _queued(0, 100), now=50)  # type: ignore[arg-type]
    assert d.row == "queued" and d.actions == (Wait(at(100), d.actions[0].reason),)  # type: ignore[union-attr]


def test_row_queue_retry() -> None:
    same = tick(obs(missing=True), _queued(0, 100), now=100)  # type: ignore[arg-type]
    assert same.row == "queue_retry"
    assert same.actions == (CreateNode(NAME, ZONES[0], same.actions[0].reason, {"attempt": "1"}),)  # type: ignore[union-attr]
    assert same.memory.recreate.queue_tries == 3  # the backoff keeps growing in this zone
    moved = tick(obs(missing=True), _queued(0, 3600), now=3600)  # type: ignore[arg-type]
    assert moved.row == "queue_retry"
    assert moved.actions == (CreateNode(NAME, ZONES[1], moved.actions[0].reason, {"attempt": "1"}),)  # type: ignore[union-attr]
    assert (moved.memory.zone, moved.memory.recreate.zone_try,
            moved.memory.recreate.queue_tries) == (ZONES[1], 1, 0)


def test_row_queue_exhausted() -> None:
    d = tick(obs(missing=True), _queued(0, 3600, zone_try=1), now=3600)  # type: ignore[arg-type]
    assert d.row == "queue_exhausted" and d.memory.phase is Phase.FAILED
    assert ZONES[0] in d.summary and ZONES[1] in d.summary


def test_row_backoff() -> None:
    m = idle(phase=Phase.BACKOFF,
             attempt=Attempt(number=1),
             budgets=Budgets(restarts=1, backoff_until=at(200), last_end=last_end()))
    d = tick(obs(probes=absent()), m, now=150)
    assert d.row == "backoff" and d.actions == (Wait(at(200), d.actions[0].reason),)  # type: ignore[union-attr]
    after = tick(obs(probes=absent()), m, now=200)
    assert after.row == "launch" and after.memory.attempt.number == 2


def test_row_probe_failed() -> None:
    d = tick(obs(probes=None), run_mem(), now=100)
    assert d.row == "probe_failed" and kinds(d) == ["wait"] and d.memory == run_mem()


def test_row_workers_unreachable() -> None:
    all_gone = (probe(0, "unreachable", None), probe(1, "unreachable", None))
    d = tick(obs(probes=all_gone), run_mem(), now=100)
    assert d.row == "workers_unreachable" and kinds(d) == ["wait"] and d.ended == ()
    # nor is anything launched while a worker cannot be cleaned up
    d2 = tick(obs(probes=(probe(0, "absent", None), probe(1, "unreachable", None))), idle(), now=100)
    assert d2.row == "workers_unreachable" and "launch" not in kinds(d2)


def test_row_owed_stop_failed() -> None:
    # the job moved off node "old" (still READY, the job's) and the stop owed there failed in this
    # tick: no launch on its node, nothing charged, the stop tried again next tick
    one = replace(CFG, slices=(NAME,), spares=("old",), recreatable=False)
    mem = replace(idle(), limp=Limp(unstopped=("old",)))
    old = replace(node(), name="old", id="n2")
    seen = obs(probes=(probe(0, "absent", None), probe(1, "absent", None)), spares=(("old", old),))
    d = tick(replace(seen, owed_stop_failed=("old",)), mem, now=100, cfg=one)
    assert d.row == "owed_stop_failed" and kinds(d) == ["wait"] and d.memory.phase is Phase.IDLE, (d.row, kinds(d))
    # its journal event (the wait, as the row changes) is alert stop_failed
    from tpuwatch.policy.alerts import Where, from_event
    from tpuwatch.policy.values import action_dict

    [wait] = d.actions
    alert = from_event(Where("job", "pod", "z"), 7, "wait", at(100), d.summary, action_dict(wait))
    assert alert is not None and alert.kind == "stop_failed" and "the job moved off old" in alert.text, alert
    nxt = tick(seen, d.memory, now=110, cfg=one)
    assert nxt.stop_first and kinds(nxt)[:1] == ["stop"] and "launch" in kinds(nxt), (nxt.row, kinds(nxt))


def _refused(worker: int) -> WorkerProbe:
    return WorkerProbe(worker, "unreachable", detail="login refused: worker 1 of pod refused the login as 'alice' "
                       "with /k (Permission denied (publickey).); check ssh.user", login_refused=True)


def test_row_keys_not_there_yet() -> None:
    probes = (probe(0, "absent", None), _refused(1))
    # 60 s after the node's create time (T0): keys not there yet; nothing launched, not halted
    d = tick(obs(probes=probes), idle(), now=60)
    assert d.row == "keys_not_there_yet" and kinds(d) == ["wait"] and d.exit_code == 0
    assert "keys not there yet" in d.summary and d.memory.phase is Phase.IDLE
    # a heal long after the create: the maintenance time in health_description is the boot
    healed = replace(node(), maintenance_time=at(10_000))
    assert tick(obs(healed, probes=probes), idle(), now=10_100).row == "keys_not_there_yet"
    # a boot the policy saw: the node was not usable on the last tick, and is now
    down = tick(obs(node(health="UNHEALTHY_MAINTENANCE")), idle(), now=20_000).memory
    assert down.boot.node_down and down.boot.node_seen == "n1"
    up = tick(obs(probes=probes), down, now=20_050)
    assert up.row == "keys_not_there_yet" and up.memory.boot.booted_at == at(20_050)
    # a node id other than the one it knew (recreated by someone else): a boot too
    d = tick(obs(node(id="n2"), probes=probes), idle(), now=30_000)
    assert d.row == "keys_not_there_yet" and d.memory.boot.booted_at == at(30_000)
    # the first node it ever sees is no boot of its own: its create time counts
    first = tick(obs(probes=probes), idle(boot=Boot(node_seen="")), now=30_000)
    assert first.memory.boot.booted_at is None and first.row == "login_refused"
    # a launched attempt no worker shows yet, refused within the grace: waits as well
    d = tick(obs(probes=probes), run_mem(start=30, seen=False), now=90)
    assert d.row == "keys_not_there_yet" and d.ended == () and "launch" not in kinds(d)


def test_row_login_refused() -> None:
    probes = (probe(0, "absent", None), _refused(1))
    d = tick(obs(probes=probes), idle(), now=301)  # login_grace is 300 s after the create (T0)
    assert d.row == "login_refused" and d.exit_code == 1 and d.memory.phase is Phase.HALTED
    (action,) = d.actions
    assert isinstance(action, NeedsPerson)
    assert "'alice'" in action.reason and "/k" in action.reason and "check ssh.user" in action.reason
    assert "ssh.login_grace" in action.reason
    # once it logs in, the job goes on (launch)
    again = tick(obs(probes=absent()), d.memory, now=400)
    assert again.row == "launch"
    # a launched attempt that never showed up, past the grace: the same stop
    d = tick(obs(probes=probes), run_mem(start=30, seen=False), now=1000)
    assert d.row == "login_refused" and d.exit_code == 1
    # ssh.login_grace = 0: no wait at all
    assert tick(obs(probes=probes), idle(), now=1, cfg=replace(CFG, login_grace=0.0)).row == "login_refused"


def test_row_unreachable_grace() -> None:
    probes = (probe(0, "running", 1), probe(1, "unreachable", None))
    d = tick(obs(probes=probes), run_mem(), now=100)
    assert d.row == "unreachable_grace" and d.memory.attempt.unreachable_since == at(100) and d.ended == ()
    still = tick(obs(probes=probes), d.memory, now=129)
    assert still.row == "unreachable_grace"
    ended = tick(obs(probes=probes, checkpoint=ckpt(120)), still.memory, now=130)
    assert ended.row == "failure" and kinds(ended) == ["stop", "wait"]
    assert "unreachable" in ended.ended[0].reason
    # the worker answering again clears the clock
    back = tick(obs(probes=running(1)), d.memory, now=110)
    assert back.row == "running" and back.memory.attempt.unreachable_since is None


def test_row_end_confirm() -> None:
    # worker 0's process vanished (no exit code) on a node this tick saw READY+HEALTHY, and a
    # charge would spend the restart budget (max_restarts 2)
    vanished = (probe(0, "absent", 1), probe(1, "running", 1))
    d = tick(obs(probes=vanished, checkpoint=ckpt(150)), run_mem(budgets=Budgets(restarts=2)), now=500)
    assert d.row == "end_confirm" and kinds(d) == ["wait"] and d.ended == ()
    assert d.memory.phase is Phase.RUNNING and d.memory.attempt.end_seen == at(500) and d.memory.budgets.restarts == 2
    assert "nothing charged yet" in d.summary
    # the next tick still sees nothing that explains it: charged then, its run time to the sighting
    again = tick(obs(probes=vanished, checkpoint=ckpt(150), jitter=0.0), d.memory, now=510)
    assert again.row == "budget_spent" and again.ended[0].charged
    assert again.ended[0].end == at(510) and "after 8m20s" in again.ended[0].reason
    # the no-progress limit (3) waits the same way: two ends in a row added no checkpoint
    streak = tick(obs(probes=vanished, checkpoint=ckpt(100)), run_mem(budgets=Budgets(no_progress=2)), now=500)
    assert streak.row == "end_confirm"
    # a charge that leaves the job running is made at once, open to a refund for a minute
    first = tick(obs(probes=vanished, checkpoint=ckpt(150)), run_mem(), now=500)
    assert first.row == "failure" and first.ended[0].charged and first.memory.budgets.confirm_by == at(560)
    # an exit code of the job's own is charged at once and closed
    own = tick(obs(probes=exited({0: 1}), checkpoint=ckpt(150)), run_mem(), now=500)
    assert own.row == "failure" and own.ended[0].charged and own.memory.budgets.confirm_by is None


def _termed(codes: dict[int, int]) -> tuple[WorkerProbe, ...]:
    """Workers that exited with `codes` after a SIGTERM neither tpuwatch nor the relay sent."""
    return tuple(replace(p, foreign_term=True) for p in exited(codes))


def test_row_term_confirm() -> None:
    # The guest's TERM reached the job before the notice and before the API's STOPPING: the job
    # saved and exited 0. Neither done nor charged on first sight.
    d = tick(obs(probes=_termed({0: 0, 1: 0}), checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "term_confirm" and kinds(d) == ["wait"] and d.ended == ()
    assert d.memory.phase is Phase.RUNNING and d.memory.attempt.end_seen == at(500)
    assert "SIGTERM tpuwatch did not send" in d.summary
    assert d.deadline == at(510)  # the node and the audit log are read again 10 s after the sighting
    # a look before then that shows nothing still waits, for the same deadline
    early = tick(obs(probes=_termed({0: 0, 1: 0}), checkpoint=ckpt(150)), d.memory, now=505)
    assert early.row == "term_confirm" and early.memory.attempt.end_seen == at(500) and early.deadline == at(510)
    # a look then shows the VM preempted: a disruption, not done, not charged
    gone = tick(obs(node(state="PREEMPTED", health="HEALTH_UNSPECIFIED"), probes=None, checkpoint=ckpt(150)), d.memory, now=502)
    assert gone.ended[0].outcome == "disruption" and not gone.ended[0].charged and not gone.terminal
    assert "after a SIGTERM from outside tpuwatch on worker 0" in gone.ended[0].reason, gone.ended[0].reason
    assert gone.memory.budgets.restarts == 0 and gone.memory.budgets.disruptions == 1
    # ... or a preemption's audit entry on a node still READY: a disruption as well
    audit = tick(obs(probes=_termed({0: 0, 1: 0}), checkpoint=ckpt(150),
                     events=(event("terminate", at(501), "PREEMPTED"),)), d.memory, now=510)
    assert audit.row == "disruption" and audit.ended[0].outcome == "disruption" and not audit.terminal
    # the look at the deadline shows nothing: judged as today, exit 0 = done
    done = tick(obs(probes=_termed({0: 0, 1: 0}), checkpoint=ckpt(150)), d.memory, now=510)
    assert done.row == "success" and done.terminal
    # any exit code waits the same way, and is charged as usual when nothing shows
    crash = tick(obs(probes=_termed({0: 143, 1: 143}), checkpoint=ckpt(150)), run_mem(), now=500)
    assert crash.row == "term_confirm" and crash.ended == ()
    charged = tick(obs(probes=_termed({0: 143, 1: 143}), checkpoint=ckpt(150), jitter=0.0), crash.memory, now=510)
    assert charged.row == "failure" and charged.ended[0].charged
    assert charged.memory.budgets.confirm_by == at(570)  # no code of its own: open to a refund for a minute
    # evidence already there on first sight: ended at once, a disruption even with exit 0
    now = tick(obs(probes=_termed({0: 0, 1: 0}), checkpoint=ckpt(150),
                   events=(event("terminate", at(499), "PREEMPTED"),)), run_mem(), now=500)
    assert now.row == "disruption" and now.ended[0].outcome == "disruption"
    # without the SIGTERM, that exit 0 is the job's success at once (the audit entry does not outrank it)
    plain = tick(obs(probes=exited({0: 0, 1: 0}), checkpoint=ckpt(150),
                     events=(event("terminate", at(499), "PREEMPTED"),)), run_mem(), now=500)
    assert plain.row == "success"


def test_a_sigterm_from_outside_for_an_older_attempt_is_no_evidence() -> None:
    probes = tuple(replace(p, foreign_term=True) for p in exited({0: 0, 1: 0}, attempt=1))
    d = tick(obs(probes=probes, checkpoint=ckpt(150)), run_mem(attempt=2), now=500)
    assert d.row != "term_confirm" and not any("SIGTERM" in e.what for e in d.memory.attempt.evidence)


def test_row_stale_workers() -> None:
    m = idle(phase=Phase.BACKOFF,
             attempt=Attempt(number=2),
             budgets=Budgets(restarts=1, backoff_until=at(0), last_end=last_end(attempt=2)))
    d = tick(obs(probes=(probe(0, "exited", 2, 1), probe(1, "running", 2))), m, now=100)
    assert d.row == "stale_workers" and kinds(d) == ["stop"]
    assert isinstance(d.actions[0], StopWorkers) and d.actions[0].wait  # the launch after it needs them gone


def test_row_adopt_running() -> None:
    d = tick(obs(probes=running(4), checkpoint=ckpt(70)), idle(attempt=Attempt(number=3)), now=100)
    assert d.row == "adopt_running" and d.actions == ()
    m = d.memory
    assert (m.phase, m.attempt.number, m.attempt.seen, m.attempt.start_step) == (Phase.RUNNING, 4, True, 70)


def test_row_survived() -> None:
    m = idle(attempt=Attempt(number=1),
             budgets=Budgets(disruptions=1, last_end=last_end(outcome="disruption", charged=False, start=10)))
    d = tick(obs(probes=running(1)), m, now=900)
    assert d.row == "survived" and d.actions == ()
    assert (d.memory.phase, d.memory.attempt.number, d.memory.attempt.start) == (Phase.RUNNING, 1, at(10))


def test_row_launch_unseen() -> None:
    m = run_mem(seen=False)
    d = tick(obs(probes=absent(), checkpoint=ckpt(100)), m, now=30)
    assert d.row == "launch_unseen"
    assert d.actions == (Launch(1, ckpt(100), d.actions[0].reason),)  # type: ignore[union-attr]
    assert d.memory.attempt.launch_tries == 1 and d.memory.budgets.restarts == 0
    tried = replace(m, attempt=replace(m.attempt, launch_tries=3))
    spent = tick(obs(probes=absent(), checkpoint=ckpt(100)), tried, now=30)
    assert spent.row == "failed_start" and spent.memory.budgets.restarts == 1
    assert "never started" in spent.ended[0].reason


def test_row_launch_partial() -> None:
    """Attempt 2 runs on worker 0; worker 1 still shows attempt 1 (killed by a maintenance): the
    watcher that launched 2 died between the workers. Not an end of attempt 2, never charged."""
    m = run_mem(attempt=2, start=10, seen=False)
    cut = (probe(0, "running", attempt=2), probe(1, "absent", attempt=1))
    d = tick(obs(probes=cut, checkpoint=ckpt(100)), m, now=30)
    assert d.row == "launch_partial" and d.ended == ()
    assert d.actions == (Launch(2, ckpt(100), d.actions[0].reason),)  # type: ignore[union-attr]
    assert "never reached workers 1" in d.actions[0].reason  # type: ignore[union-attr]
    assert (d.memory.attempt.launch_tries, d.memory.budgets.restarts, d.memory.attempt.start) == (1, 0, at(10))
    # once every worker runs it, it is followed as usual
    assert tick(obs(probes=running(2), checkpoint=ckpt(100)), d.memory, now=31).row == "running"
    # the running worker saved since (it would resume from another step), or tries spent: ended uncharged
    for later in (tick(obs(probes=cut, checkpoint=ckpt(110)), m, now=30),
                  tick(obs(probes=cut, checkpoint=ckpt(100)), replace(m,
                                                                      attempt=replace(m.attempt, launch_tries=3)), now=30)):
        assert later.ended and not later.ended[0].charged and later.memory.budgets.restarts == 0, later.ended
        assert "never reached workers 1" in later.ended[0].reason
        assert any(isinstance(a, StopWorkers) for a in later.actions)
    # a worker of the attempt that ended is the attempt's end, as before
    crashed = (probe(0, "exited", attempt=2, code=139), probe(1, "absent", attempt=1))
    assert tick(obs(probes=crashed, checkpoint=ckpt(100)), m, now=30).row != "launch_partial"



def test_launch_partial_waits_for_every_worker_and_never_starts_beside_an_older_attempt() -> None:
    """The rest of a cut-short launch is sent only when every worker answers and none of those
    missing it still runs an older attempt; otherwise it waits (unreachable, up to
    unreachable_grace) or ends uncharged, so the job never sticks."""
    m = run_mem(attempt=2, start=10, seen=False)
    lost = (probe(0, "running", attempt=2), probe(1, "absent", attempt=1), probe(2, "unreachable", attempt=None))
    d = tick(obs(probes=lost, checkpoint=ckpt(100)), m, now=30)
    assert d.row == "unreachable_grace" and not any(isinstance(a, Launch) for a in d.actions), d.summary
    assert d.ended == () and d.memory.attempt.unreachable_since == at(30) and not d.memory.attempt.seen
    # back in time: the rest is launched
    back = (probe(0, "running", attempt=2), probe(1, "absent", attempt=1), probe(2, "absent", attempt=1))
    resumed = tick(obs(probes=back, checkpoint=ckpt(100)), d.memory, now=40)
    assert resumed.row == "launch_partial" and resumed.memory.attempt.unreachable_since is None
    # unreachable past unreachable_grace: ended uncharged, never launched
    gone = tick(obs(probes=lost, checkpoint=ckpt(100)), d.memory, now=30 + CFG.unreachable_grace)
    assert gone.ended and not gone.ended[0].charged and gone.memory.budgets.restarts == 0, gone.ended
    assert not any(isinstance(a, Launch) for a in gone.actions)
    # a worker that lacks attempt 2 still runs attempt 1: ended uncharged, its end stops every worker
    older = (probe(0, "running", attempt=2), probe(1, "running", attempt=1))
    e = tick(obs(probes=older, checkpoint=ckpt(100)), m, now=30)
    assert e.ended and not e.ended[0].charged and e.memory.budgets.restarts == 0, e.ended
    assert "still run an older attempt" in e.ended[0].reason
    assert any(isinstance(a, StopWorkers) for a in e.actions)
    assert not any(isinstance(a, Launch) for a in e.actions)

def test_row_terminal() -> None:
    done = idle(phase=Phase.DONE, reason="attempt 3: worker 0 exited 0")
    d = tick(obs(node("PREEMPTED")), done, now=5)
    assert d.row == "terminal" and d.actions == () and d.exit_code == 0 and d.memory == done
    failed = idle(phase=Phase.FAILED, reason="restart budget spent")
    f = tick(obs(probes=absent()), failed, now=5)
    assert f.row == "terminal" and f.actions == () and f.exit_code == 1 and "restart budget spent" in f.summary
    # a worker left running (the tick that ended the job was killed before its stop) is stopped
    left = tick(obs(probes=(probe(0, "exited", 3, 42), probe(1, "running", 3))), failed, now=5)
    assert left.row == "terminal" and kinds(left) == ["stop"] and left.memory == failed


# --- impossible observations name the phase and the evidence ---------------------------------


def test_impossible_newer_attempt_on_a_worker() -> None:
    with pytest.raises(ImpossibleObservation) as exc:
        tick(obs(probes=running(7)), run_mem(attempt=2), now=10)
    assert "phase running" in str(exc.value) and "attempt 7" in str(exc.value)


def test_impossible_operation_without_pending() -> None:
    with pytest.raises(ImpossibleObservation) as exc:
        tick(obs(operation=op("op-x")), idle(), now=10)
    assert "phase idle" in str(exc.value) and "op-x" in str(exc.value)


def test_impossible_other_node_and_jitter() -> None:
    with pytest.raises(ImpossibleObservation, match="watches 'pod'"):
        tick(obs(replace(node(), name="other")), idle(), now=10)
    with pytest.raises(ImpossibleObservation, match="jitter"):
        tick(obs(jitter=1.0), idle(), now=10)
    with pytest.raises(ImpossibleObservation, match="two probes"):
        tick(obs(probes=(probe(0, "absent"), probe(0, "absent"))), idle(), now=10)


def test_failed_create_must_be_classified() -> None:
    with pytest.raises(ImpossibleObservation, match="create_failure"):
        tick(obs(missing=True, operation=op("op-c", code=8)), _creating(), now=5)  # type: ignore[arg-type]


def test_stop_comes_before_the_end_of_the_job() -> None:
    """The tick carries actions out in order: the other workers are stopped, then done is marked."""
    d = tick(obs(probes=exited({0: 0}, workers=4)), run_mem(), now=3000)
    assert isinstance(d.actions[0], StopWorkers) and kinds(d) == ["stop", "done"]
    assert not d.actions[0].wait  # nothing after it needs the job gone: a slow stop holds up nothing


def test_not_owned_message_names_the_label_it_has() -> None:
    n = replace(node("PREEMPTED"), labels={"tpuwatch-job": "job-2"})
    d = tick(obs(n), idle(), now=5)
    assert d.row == "not_owned"
    person = d.actions[0]
    assert isinstance(person, NeedsPerson) and person.evidence == ("it has tpuwatch-job=job-2",)


# -- environment checks: tpuwatch.workers.precheck results in Observation.precheck ----------


def test_row_precheck_fix() -> None:
    o = obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("libtpu_lock", 1, True)))
    d = tick(o, idle(), now=5)
    assert d.row == "precheck_fix"
    assert kinds(d) == ["stop"] and "w1 libtpu_lock" in d.actions[0].reason  # type: ignore[union-attr]
    assert d.memory.phase is Phase.IDLE and d.memory.budgets.restarts == 0 and d.exit_code == 0
    # the tick cleaned up and checked again: all green now, so it launches
    again = tick(replace(o, precheck=pre(), precheck_fixed=True), idle(), now=5)
    assert again.row == "launch" and kinds(again) == ["launch"]
    # still failing after the cleanup: not fixable after all, so it waits like any bad node
    stuck = tick(replace(o, precheck_fixed=True), idle(), now=5)
    assert stuck.row == "precheck_wait"


def test_row_precheck_wait() -> None:
    o = obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 1, False)))
    d = tick(o, idle(budgets=Budgets(restarts=1)), now=100)
    assert d.row == "precheck_wait"
    assert kinds(d) == ["wait"] and d.actions[0].until == at(700)  # type: ignore[union-attr]
    m = d.memory
    assert (m.phase, m.repair.env_failing_since, m.budgets.restarts,
            m.attempt.number) == (Phase.WAITING_NODE, at(100), 1, 0)
    assert "w1 devices: bad devices" in d.summary and d.exit_code == 0
    # the node is usable, so the next tick tries again: the wait counts from the first failure
    d2 = tick(o, m, now=400)
    assert d2.row == "precheck_wait" and d2.memory.repair.env_failing_since == at(100)
    # fixed by someone: launch, and the failure is forgotten
    d3 = tick(replace(o, precheck=pre()), d2.memory, now=500)
    assert d3.row == "launch" and d3.memory.repair.env_failing_since is None and d3.memory.budgets.restarts == 1


def test_row_precheck_recreate() -> None:
    o = obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("disk", 0, False)))
    d = tick(o, idle(phase=Phase.WAITING_NODE, repair=Repair(env_failing_since=at(0))), now=600)
    assert d.row == "precheck_recreate"
    assert kinds(d) == ["delete"]
    m = d.memory
    assert (m.phase, m.budgets.recreates, m.budgets.restarts,
            m.repair.env_failing_since) == (Phase.DELETING, 1, 0, None)
    assert "w0 disk" in d.actions[0].reason and "repair_timeout" in d.actions[0].reason  # type: ignore[union-attr]


def test_row_precheck_needs_person() -> None:
    o = obs(node(owned=False), probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 1, False)))
    d = tick(o, idle(repair=Repair(env_failing_since=at(0))), now=700)
    assert d.row == "precheck_needs_person"
    assert d.memory.phase is Phase.HALTED and d.exit_code == 1
    person = d.actions[-1]
    assert isinstance(person, NeedsPerson)
    assert person.evidence == ("w1 devices: bad devices, need good devices",)
    assert "--adopt" in person.reason
    # --adopt lets tpuwatch isolate the node instead
    assert tick(replace(o, adopt=True), idle(repair=Repair(env_failing_since=at(0))),
                now=700).row == "precheck_recreate"


def test_row_hung() -> None:
    from policy_support import CFG

    cfg = replace(CFG, hang_timeout=3600.0)
    m = run_mem(start=0.0, step=100)
    assert tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=3599, cfg=cfg).row == "running"
    d = tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=3600, cfg=cfg)
    assert d.row == "hung" and kinds(d) == ["stop", "wait"]
    end = d.ended[0]
    assert end.charged and end.outcome == "failure" and "hung: no new checkpoint for 1h00m" in end.reason
    assert (d.memory.phase, d.memory.budgets.restarts, d.memory.budgets.no_progress) == (Phase.BACKOFF, 1, 1)
    # off by default: the same attempt is followed for ever
    assert tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=10 * 86400).row == "running"


def test_row_autorepair_wait() -> None:
    """A slice of an ACTIVE multislice request missing or being created, then the others
    restarting: Google's autorepair, waited for up to the longer of repair_timeout (600 s here)
    and queue_timeout (3600 s); a slice merely REPAIRING keeps repair_timeout."""
    multi = replace(CFG, slices=("np-0", "np-1"), recreatable=True)
    active = QueuedStatus(QR_NAME, "ACTIVE")

    def slices(*states: tuple[str, str]) -> NodeSnapshot:
        from tpuwatch.model import combine_slices
        parts = [None if s == "MISSING" else replace(node(s), name=f"np-{i}", id=ident)
                 for i, (s, ident) in enumerate(states)]
        combined = combine_slices(NAME, parts)
        assert combined is not None
        return combined

    gone = slices(("READY", "a"), ("MISSING", "b"))
    first = tick(obs(gone, queued=active), idle(attempt=Attempt(node_id="a+b")), now=0, cfg=multi)
    assert first.row == "autorepair_wait" and kinds(first) == ["wait"], first.summary
    assert "slice np-1 of queued resource" in first.summary and "autorepair" in first.summary
    later = tick(obs(slices(("READY", "a"), ("CREATING", "c")), queued=active), first.memory, now=3000, cfg=multi)
    assert later.row == "autorepair_wait", later.summary  # past repair_timeout, within queue_timeout
    # the new slice is back and the service restarts the other: still the repair
    restart = tick(obs(slices(("RESTARTING", "a"), ("READY", "c")), queued=active), later.memory, now=3300, cfg=multi)
    assert restart.row == "autorepair_wait" and "np-0 RESTARTING" in restart.summary, restart.summary
    over = tick(obs(gone, queued=active), later.memory, now=3700, cfg=multi)
    assert over.row == "repair_timeout" and kinds(over) == ["delete"], over.summary
    # the same request given up by the service: recreated at once, not waited for
    ended = tick(obs(gone, queued=QueuedStatus(QR_NAME, "SUSPENDED")), idle(), now=0, cfg=multi)
    assert ended.row != "autorepair_wait"
    # a slice that exists and is REPAIRING: Google repairs it in place, repair_timeout holds
    repairing = slices(("READY", "a"), ("REPAIRING", "b"))
    wait = tick(obs(repairing, queued=active), idle(attempt=Attempt(node_id="a+b")), now=0, cfg=multi)
    assert wait.row == "repair_wait"
    assert tick(obs(repairing, queued=active), wait.memory, now=700, cfg=multi).row == "repair_timeout"
    # a restart with no slice replaced (a heal in place): repair_timeout too
    healed = slices(("RESTARTING", "a"), ("READY", "b"))
    assert tick(obs(healed, queued=active), idle(attempt=Attempt(node_id="a+b")), now=0,
                cfg=multi).row == "repair_wait"


def test_a_vanished_slice_ends_the_attempt_on_the_others() -> None:
    """A slice of the job gone (MISSING) while the other slices' workers still run the attempt:
    the job cannot train without it (its collectives wait on the missing slice's hosts), so the
    attempt ends at once, a disruption, instead of being followed as `unhealthy_running`."""
    from tpuwatch.model import combine_slices
    multi = replace(CFG, slices=("np-0", "np-1"), recreatable=True)
    gone = combine_slices(NAME, [replace(node("READY"), name="np-0", id="a"), None])
    mem = run_mem()
    on_both = replace(mem, attempt=replace(mem.attempt, node_id="a+b"))
    assert gone is not None and gone.state == "MISSING"
    d = tick(obs(gone, queued=QueuedStatus(QR_NAME, "ACTIVE"), probes=running(1)),
             on_both, now=100, cfg=multi)
    assert d.row == "autorepair_wait" and kinds(d)[0] == "stop", d.summary
    assert len(d.ended) == 1 and d.ended[0].outcome == "disruption" and not d.ended[0].charged
    # a slice that is there but not healthy, its workers still running: still followed
    sick = combine_slices(NAME, [replace(node("READY"), name="np-0", id="a"),
                                 replace(node("READY", "UNHEALTHY_MAINTENANCE"), name="np-1", id="b")])
    assert sick is not None
    live = tick(obs(sick, probes=running(1)), on_both, now=100, cfg=multi)
    assert live.row == "unhealthy_running" and live.actions == ()


MEGASCALE = ("E0926 17:26:32 Megascale hang detected: Timed out waiting for 4 graphs to complete at launch_id 13650. "
             "Already completed: 100. StepGloballyInProgress: true. Timeout: 1m")


def test_row_log_hang() -> None:
    probes = (WorkerProbe(0, "running", attempt=1), WorkerProbe(1, "running", attempt=1, log_match=MEGASCALE))
    d = tick(obs(probes=probes, checkpoint=ckpt(100)), run_mem(start=0.0, step=100), now=900)
    assert d.row == "log_hang" and kinds(d) == ["stop", "wait"]
    end = d.ended[0]
    assert (end.outcome, end.charged) == ("failure", True)
    assert "hung: the runtime says so (megascale_hang in worker 1's log: E0926" in end.reason
    # a multislice job's slices hang when another slice went away: that disruption is what ended it
    d = tick(obs(probes=probes, checkpoint=ckpt(100), events=(event("terminate", at(800)),)),
             run_mem(start=0.0, step=100), now=900)
    assert d.row == "log_hang" and not d.ended[0].charged and d.ended[0].outcome == "disruption"
    assert "megascale_hang in worker 1's log" in d.ended[0].reason


def test_row_log_crash() -> None:
    line = ("F0926 17:26:32 client.h:77] Terminating process because the JAX distributed service detected fatal "
            "errors. This most likely indicates that another task died")
    probes = (WorkerProbe(0, "running", attempt=1, log_match=line), WorkerProbe(1, "exited", attempt=1, exit_code=137))
    d = tick(obs(probes=probes, checkpoint=ckpt(100)), run_mem(start=0.0, step=100), now=900)
    assert d.row == "log_crash" and kinds(d) == ["stop", "wait"]
    assert d.ended[0].charged and "jax_peer_died in worker 0's log" in d.ended[0].reason
    # evidence of a disruption still excuses it
    o = obs(probes=probes, checkpoint=ckpt(100), events=(event("terminate", at(850)),))
    d = tick(o, run_mem(start=0.0, step=100), now=900)
    assert d.row == "log_crash" and not d.ended[0].charged and d.memory.phase is Phase.IDLE


def test_row_log_dirty_host() -> None:
    line = ("RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: "
            "open(/dev/vfio/0): Device or resource busy: Device or resource busy; Couldn't open iommu group /dev/vfio/0")
    probes = (WorkerProbe(0, "exited", attempt=1, exit_code=1, log_match=line), WorkerProbe(1, "running", attempt=1))
    d = tick(obs(probes=probes, checkpoint=ckpt(100)), run_mem(start=0.0, step=100), now=20)
    assert d.row == "log_dirty_host" and kinds(d) == ["stop"]
    end = d.ended[0]
    assert not end.charged and "dirty host: tpu_busy in worker 0's log" in end.reason
    assert d.memory.phase is Phase.IDLE and d.memory.budgets.restarts == 0
    # the next attempt ends the same way: the cleanup did not help, so it is charged
    again = tuple(replace(p, attempt=2) for p in probes)
    m = run_mem(attempt=2, start=30.0, step=100, budgets=Budgets(last_end=end))
    d = tick(obs(probes=again, checkpoint=ckpt(100)), m, now=50)
    assert d.row == "log_dirty_host" and d.ended[0].charged and d.ended[0].outcome == "failed_start"
    assert "dirty host again" in d.ended[0].reason


def test_row_log_silent() -> None:
    from policy_support import CFG

    cfg = replace(CFG, hang_auto=True, stable_run=10 * 3600.0)
    # past its first checkpoint (step 200 at 20m); the job has shown a checkpoint interval, and
    # silences of a minute at most
    m = run_mem(start=0.0, step=100,
                hang=HangLearning(log_gap=60.0, ckpt_gap=1200.0, progress_step=200, progress_at=at(1200),
                                  progress_time=at(1200), log_last=at(1500), log_peak=0.0))

    def silent_for(age: float) -> tuple[WorkerProbe, ...]:
        return tuple(WorkerProbe(w, "running", attempt=1, log_age=age) for w in range(2))

    assert tick(obs(probes=silent_for(599), checkpoint=ckpt(200)), m, now=1500 + 599, cfg=cfg).row == "running"
    d = tick(obs(probes=silent_for(600), checkpoint=ckpt(200)), m, now=2100, cfg=cfg)
    assert d.row == "log_silent" and kinds(d) == ["stop", "wait"]
    assert d.ended[0].charged and "no output for 10m00s" in d.ended[0].reason


# -- a bad host (policy/faulty.py) ------------------------------------------------------------

DIRTY_LINE = ("RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: "
              "open(/dev/vfio/0): Device or resource busy")


def _dirty(attempt: int, worker: int = 1) -> tuple[WorkerProbe, ...]:
    """Attempt `attempt` ended on `worker` with a dirty-host signature; the other worker still runs it."""
    return tuple(WorkerProbe(w, "exited", attempt=attempt, exit_code=1, log_match=DIRTY_LINE) if w == worker
                 else WorkerProbe(w, "running", attempt=attempt) for w in range(2))


def _dirty_attempts(count: int, cfg: object = CFG, n: NodeSnapshot | None = None, worker: int = 1) -> list:
    """`count` attempts in a row, each ending dirty on `worker` right after its launch: the decisions
    that ended them (each attempt is launched 100 s after the end before it)."""
    m, now, ends = idle(), 0.0, []
    for k in range(1, count + 1):
        launch = decide(obs(n, probes=absent(), checkpoint=ckpt(100)), m, cfg, at(now))  # type: ignore[arg-type]
        assert launch.row == "launch", launch.summary
        d = decide(obs(n, probes=_dirty(k, worker), checkpoint=ckpt(100)), launch.memory, cfg, at(now + 10))  # type: ignore[arg-type]
        ends.append(d)
        m, now = d.memory, now + 1000
    return ends


def test_row_faulty_host() -> None:
    cfg = replace(CFG, report_faulty_hosts=True, max_restarts=10)
    ends = _dirty_attempts(3, cfg)
    assert [d.row for d in ends] == ["log_dirty_host", "log_dirty_host", "faulty_host"]
    d = ends[-1]
    assert kinds(d) == ["stop", "report_host", "wait"] and d.ended[0].charged
    (report,) = [a for a in d.actions if a.kind == "report_host"]
    assert report.worker == 1 and "3 attempts in a row" in report.description  # type: ignore[union-attr]
    h = d.memory.host
    assert (h.worker, h.streak, h.incident) == (1, 3, "n1/w1@" + at(0).isoformat()) and h.reported_at == at(2010)
    # the next dirty end on the same boot of the node reports nothing again (one incident)
    launch = tick(obs(probes=absent(), checkpoint=ckpt(100)), replace(d.memory, host=replace(h, hold_until=None)), 3000)
    again = tick(obs(probes=_dirty(4), checkpoint=ckpt(200)), launch.memory, 3010, cfg=cfg)
    assert again.row == "log_dirty_host" and "report_host" not in kinds(again)
    # a dry run decides the same and keeps the memory
    dry = decide(obs(probes=_dirty(3), checkpoint=ckpt(100), dry_run=True), ends[1].memory, cfg, at(2010))
    assert dry.memory == ends[1].memory


def test_a_dirty_streak_on_another_worker_starts_again() -> None:
    cfg = replace(CFG, report_faulty_hosts=True)
    ends = _dirty_attempts(2, cfg, worker=1)
    launch = tick(obs(probes=absent(), checkpoint=ckpt(100)), ends[-1].memory, 2000)
    d = decide(obs(probes=_dirty(3, worker=0), checkpoint=ckpt(100)), launch.memory, cfg, at(2010))
    assert d.row == "log_dirty_host" and d.memory.host.streak == 1 and d.memory.host.worker == 0


def test_row_faulty_host_told() -> None:
    d = _dirty_attempts(3)[-1]  # report_faulty_hosts off
    assert d.row == "faulty_host_told" and "report_host" not in kinds(d)
    assert "host of worker 1 looks faulty" in d.summary and "report-host-as-faulty" in d.summary
    assert d.memory.host.incident and d.memory.host.hold_until is None and d.exit_code == 0
    # on for the job, but the node is not its own: told, not reported
    cfg = replace(CFG, report_faulty_hosts=True)
    foreign = _dirty_attempts(3, cfg, node(owned=False))[-1]
    assert foreign.row == "faulty_host_told" and "ownership label" in foreign.summary


def test_row_faulty_host_hold() -> None:
    cfg = replace(CFG, report_faulty_hosts=True)
    m = _dirty_attempts(3, cfg)[-1].memory
    d = tick(obs(probes=absent(), checkpoint=ckpt(100)), m, 2100, cfg=cfg)
    assert d.row == "faulty_host_hold" and kinds(d) == ["wait"]
    # the VM goes down for its repair and comes back: launch there again
    down = tick(obs(node(state="REPAIRING"), probes=None, checkpoint=ckpt(100)), d.memory, 2200, cfg=cfg)
    assert down.row == "repair_wait"
    up = tick(obs(probes=absent(), checkpoint=ckpt(100)), down.memory, 2300, cfg=cfg)
    assert up.row == "launch", up.summary
    # or it never goes down: launch once the hold is over
    late = tick(obs(probes=absent(), checkpoint=ckpt(100)), m, 2010 + 20 * 60, cfg=cfg)
    assert late.row == "launch"


def test_row_faulty_host_refused() -> None:
    cfg = replace(CFG, report_faulty_hosts=True)
    d = _dirty_attempts(3, cfg)[-1]
    refused = decide(obs(probes=absent(), checkpoint=ckpt(100),
                         host_report_refused="INVALID_ARGUMENT: Instance 'pod' is not reservation-bound"),
                     d.memory, cfg, at(2010))
    assert refused.row == "faulty_host_refused" and "not reservation-bound" in refused.summary
    assert "delete and create the VM again" in refused.summary
    m = refused.memory
    assert m.host.hold_until is None and m.host.incident == d.memory.host.incident  # never tried again
    assert tick(obs(probes=absent(), checkpoint=ckpt(100)), m, 2100, cfg=cfg).row == "launch"


def _missing_devices(rounds: int, cfg: PolicyConfig = CFG, n: NodeSnapshot | None = None,
                     check: str = "devices", m: Memory | None = None, start: float = 100.0) -> list[Decision]:
    """`rounds` launch-time check rounds, a poll apart, each failing `check` on worker 1: their decisions."""
    m, out = m or idle(), []
    for k in range(rounds):
        t = start + 30 * k
        d = tick(obs(n, probes=absent(), checkpoint=ckpt(100), precheck=pre((check, 1, False), t=t)), m, t, cfg=cfg)
        out.append(d)
        m = d.memory
    return out


def test_row_faulty_host_from_environment_checks() -> None:
    """Launch-time checks that keep finding one worker's TPU devices missing point at its host:
    reported once, then no launch there until it has been repaired."""
    cfg = replace(CFG, report_faulty_hosts=True)
    ds = _missing_devices(4, cfg)
    assert [d.row for d in ds] == ["precheck_wait", "precheck_wait", "faulty_host", "faulty_host_hold"]
    d = ds[2]
    assert kinds(d) == ["report_host", "wait"] and not d.ended and d.exit_code == 0
    (report,) = [a for a in d.actions if a.kind == "report_host"]
    assert report.worker == 1 and "3 environment checks in a row" in report.description  # type: ignore[union-attr]
    assert "w1 devices: bad devices" in report.description  # type: ignore[union-attr]
    m = d.memory
    assert (m.phase, m.repair.env_failing_since, m.budgets.restarts) == (Phase.WAITING_NODE, at(100), 0)
    assert (m.host.incident, m.host.suspect, m.host.reported_at) == ("n1/w1@" + at(0).isoformat(), 1, at(160))
    # the next round holds (the repair is coming), and reports nothing again
    assert ds[3].row == "faulty_host_hold" and "report_host" not in kinds(ds[3])
    # a round is counted once, however often the tick decides with it
    again = tick(obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 1, False), t=130)),
                 ds[1].memory, 131, cfg=cfg)
    assert again.row == "precheck_wait" and again.memory.host.checks_failed == 2
    # the VM goes down for its repair and comes back with its devices: launch there
    down = tick(obs(node(state="REPAIRING"), probes=None, checkpoint=ckpt(100)), m, 300, cfg=cfg)
    assert down.row == "repair_wait"
    up = tick(obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(t=400)), down.memory, 400, cfg=cfg)
    assert up.row == "launch", up.summary


def test_a_repair_that_does_not_help_is_recreated_at_repair_timeout() -> None:
    """The report comes first; repair_timeout still counts from the first failing check, so a host
    that comes back from its repair with the devices still missing is recreated then."""
    cfg = replace(CFG, report_faulty_hosts=True)
    m = _missing_devices(3, cfg)[-1].memory
    down = tick(obs(node(state="REPAIRING"), probes=None, checkpoint=ckpt(100)), m, 300, cfg=cfg)
    back = _missing_devices(1, cfg, m=down.memory, start=500)[-1]
    assert back.row == "precheck_wait" and back.memory.host.checks_failed == 1  # a new boot: a new streak
    late = _missing_devices(1, cfg, m=back.memory, start=700)[-1]
    assert late.row == "precheck_recreate" and kinds(late) == ["delete"]


def test_row_faulty_host_told_from_environment_checks() -> None:
    ds = _missing_devices(5)  # report_faulty_hosts off
    assert [d.row for d in ds] == ["precheck_wait", "precheck_wait", "faulty_host_told", "precheck_wait",
                                   "precheck_wait"]
    told = ds[2]
    assert kinds(told) == ["wait"] and "host of worker 1 looks faulty" in told.summary
    assert "report-host-as-faulty" in told.summary and told.memory.phase is Phase.WAITING_NODE
    # told once; past repair_timeout the node is recreated as before
    late = _missing_devices(1, m=ds[-1].memory, start=700)[-1]
    assert late.row == "precheck_recreate"


def test_software_check_failures_do_not_point_at_the_host() -> None:
    cfg = replace(CFG, report_faulty_hosts=True)
    ds = _missing_devices(5, cfg, check="disk")
    assert {d.row for d in ds} == {"precheck_wait"} and ds[-1].memory.host.checks_failed == 0
    # nor does a devices check the worker did not answer (no value measured)
    m = idle()
    for t in (100, 130, 160, 190):
        silent = PrecheckReport(at(t), "launch", "n1", (CheckItem("devices", 1, "fail", detail="no answer from the worker"),))
        d = tick(obs(probes=absent(), checkpoint=ckpt(100), precheck=silent), m, t, cfg=cfg)
        m = d.memory
        assert d.row == "precheck_wait"
    # nor every worker of the slice missing its devices at once (the image or its driver, not one host)
    m = idle()
    for t in (100, 130, 160, 190):
        d = tick(obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("devices", 0, False), ("devices", 1, False),
                                                                         t=t)), m, t, cfg=cfg)
        m = d.memory
        assert d.row == "precheck_wait" and m.host.checks_failed == 0
    # a round that finds the devices breaks the streak
    ds = _missing_devices(2, cfg)
    ok = tick(obs(probes=absent(), checkpoint=ckpt(100), precheck=pre(("disk", 1, False), t=160)), ds[-1].memory,
              160, cfg=cfg)
    more = _missing_devices(2, cfg, m=ok.memory, start=190)
    assert [d.row for d in more] == ["precheck_wait", "precheck_wait"]


def test_row_take_wait() -> None:
    """More cases (what is never asked for, no priority): tests/policy/test_policy_priority.py."""
    mem = run_mem(step=100)
    zone = (prio.part("hpod", "hi", "PREEMPTED"), prio.LOW)
    d = tick(prio.look(prio.HI, mem, zone, probes=prio.DOWN), mem, now=600, cfg=prio.HI)
    assert d.row == "take_wait" and [r.name for r in prio.relabels(d)] == ["lpod"]


def test_row_give() -> None:
    """More cases: tests/policy/test_policy_priority.py."""
    mem = run_mem(step=100)
    wanted = prio.part("lpod", "lo", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500")
    d = tick(prio.look(prio.LO, mem, (wanted,), probes=running(1)), mem, now=600, cfg=prio.LO)
    assert d.row == "give" and d.memory.limp.giving == (("lpod", "hi"),) and not d.ended[0].charged


def test_row_take() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE)
    zone = (prio.part("lpod", "hi", tpuwatch_lent_by="lo"),)
    d = tick(prio.look(prio.HI, mem, zone), mem, now=700, cfg=prio.HI)
    assert d.row == "take" and d.memory.limp.took == (("lpod", "lo"),)


def test_row_lent_back() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(swapped=(("lpod", ""),), lent=(("lpod", "hi"),)))
    zone = (prio.part("hpod", "lo", tpuwatch_returned_by="hi"),)
    d = tick(prio.look(prio.LO, mem, zone), mem, now=700, cfg=prio.LO)
    assert d.row == "lent_back" and d.memory.limp.swapped == (("lpod", "hpod"),)


def test_row_lent_wait() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(swapped=(("lpod", ""),), lent=(("lpod", "hi"),)))
    d = tick(prio.look(prio.LO, mem, (prio.part("lpod", "hi", tpuwatch_lent_by="lo"),)), mem, now=700, cfg=prio.LO)
    assert d.row == "lent_wait" and d.memory.phase is Phase.WAITING_NODE and d.exit_code == 0


def test_row_hand_back() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("hpod", "lpod"),), took=(("lpod", "lo"),)))
    zone = (prio.part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500"), prio.part("hpod", "hi"))
    d = tick(prio.look(prio.HI, mem, zone, probes=running(1)), mem, now=900, cfg=prio.HI)
    assert d.row == "hand_back" and [r.name for r in prio.relabels(d)] == ["hpod"]


def test_row_pool_claim() -> None:
    """More cases (what is never claimed, no pool, a multislice job): tests/policy/test_policy_pool.py."""
    mem = run_mem(step=100)
    zone = (pool.part("apod", "a", "PREEMPTED"), pool.part("sp-0", None, pool="v5p"))
    d = tick(pool.look(pool.A, mem, zone, probes=pool.DOWN), mem, now=600, cfg=pool.A)
    assert d.row == "pool_claim" and [(r.name, r.pool) for r in pool.relabels(d)] == [("sp-0", "v5p")]


def test_row_pool_return() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("apod", "sp-0"),)))
    zone = (pool.part("sp-0", "a", pool="v5p"), pool.part("apod", "a"))
    d = tick(pool.look(pool.A, mem, zone, probes=running(1)), mem, now=900, cfg=pool.A)
    assert d.row == "pool_return" and [(r.name, r.drop) for r in pool.relabels(d)] == [("apod", ("tpuwatch-job",))]


def test_row_priority_label() -> None:
    mem = run_mem(step=100)
    d = tick(prio.look(prio.HI, mem, (prio.part("hpod", "hi"),), probes=running(1)), mem, now=300, cfg=prio.HI)
    assert d.row == "priority_label" and [r.put for r in prio.relabels(d)] == [(("tpuwatch-priority", "500"),)]
