"""Stops owed on the nodes a job moved off (policy/owed.py): the move journals the stop it owes
there, its own stop settles it, and a watcher killed in between stops the job there before
anything else once it runs again."""

from __future__ import annotations

from dataclasses import replace

from policy_support import CFG, JOB, LIMPS, ckpt, kinds, limp_look, limp_part, run_mem, tick

from tpuwatch.model import NodeSnapshot, UpcomingMaintenance, WorkerProbe, combine_slices
from tpuwatch.policy import Launch, Limp, Memory, Observation, Phase, StopWorkers
from tpuwatch.policy.owed import stopped

ONE = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True, spares_in_place=True)
SPARES = replace(LIMPS, min_slices=0, spares=("x0",))
LABEL = {"tpuwatch-job": JOB}


def mig(name: str, *states: str) -> NodeSnapshot:
    """MIG `name` of two VMs in `states` (READY: running), the MIG reading as its worst VM."""
    worst = next((s for s in states if s != "READY"), "READY")
    return replace(limp_part(name, worst), kind="mig", target_size=2, labels=LABEL, worker_states=states)


def test_a_swap_off_a_mig_whose_vms_still_run_owes_a_stop_there_that_its_own_stop_settles() -> None:
    lost = mig("pod", "PREEMPTED", "READY")
    probes = (WorkerProbe(0, "unreachable"), WorkerProbe(1, "running", attempt=1, pid=7))
    mem = run_mem(step=100)
    d = tick(Observation(node=combine_slices("pod", [lost]), spares=(("sp", mig("sp", "READY", "READY")),),
                         probes=probes, checkpoint=ckpt(200)), mem, 600, cfg=ONE)
    assert d.row == "swap" and d.memory.limp.unstopped == ("pod",), (d.row, d.memory.limp)
    [stop] = [a for a in d.actions if isinstance(a, StopWorkers)]
    assert stop.node == "" and stop.settles == ("pod",) and stop.wait
    assert stopped(d.memory, stop.settles).limp.unstopped == ()


def killed_after_the_swap() -> Memory:
    """The journal of a watcher killed between the swap off MIG pod and its stop there."""
    return replace(run_mem(step=100), phase=Phase.IDLE,
                   limp=Limp(swapped=(("pod", "sp"),), away=("pod",), away_since=(run_mem().attempt.start,),
                             unstopped=("pod",)))


def after_the_kill(pod: NodeSnapshot | None) -> Observation:
    spare = mig("sp", "READY", "READY")
    return Observation(node=combine_slices("pod", [spare]), spares=(("pod", pod),),
                       probes=(WorkerProbe(0, "absent"), WorkerProbe(1, "absent")), checkpoint=ckpt(200))


def test_a_watcher_killed_before_the_swaps_stop_stops_the_older_attempt_on_the_mig_it_left_before_launching() -> None:
    mem = killed_after_the_swap()
    d = tick(after_the_kill(mig("pod", "PREEMPTED", "READY")), mem, 700, cfg=ONE)
    assert kinds(d)[0] == "stop" and any(isinstance(a, Launch) for a in d.actions), (d.row, kinds(d))
    first = d.actions[0]
    assert isinstance(first, StopWorkers) and (first.node, first.settles, first.wait) == ("pod", ("pod",), True)
    assert d.memory.limp.unstopped == ("pod",) and "first stopping the older attempt still on pod" in d.summary
    assert d.stop_first  # the tick does that stop alone first, then decides again
    # owed still while the job runs on the spare (its VM came back READY after it was dropped):
    # stopped again, not waited for, so a node slow to answer does not hold up the ticks that
    # follow the job
    on = replace(mem, phase=Phase.RUNNING, attempt=replace(mem.attempt, number=2))
    spare = mig("sp", "READY", "READY")
    follow = tick(Observation(node=combine_slices("pod", [spare]), spares=(("pod", mig("pod", "PREEMPTED", "READY")),),
                              probes=(WorkerProbe(0, "running", attempt=2, pid=8), WorkerProbe(1, "running", attempt=2,
                                                                                             pid=9)),
                              checkpoint=ckpt(200)), on, 800, cfg=ONE)
    again_stop = follow.actions[0]
    assert isinstance(again_stop, StopWorkers) and again_stop.node == "pod" and not again_stop.wait, kinds(follow)
    assert not any(isinstance(a, Launch) for a in follow.actions)
    # settled by the tick once done: the next decision stops nothing there
    done = stopped(d.memory, ("pod",))
    again = tick(after_the_kill(mig("pod", "PREEMPTED", "READY")), replace(done, phase=Phase.IDLE), 701,
                 cfg=ONE)
    assert not any(isinstance(a, StopWorkers) and a.node for a in again.actions), kinds(again)


def test_an_owed_stop_is_dropped_once_nothing_of_the_job_can_run_there() -> None:
    mem = killed_after_the_swap()
    for pod, why in ((mig("pod", "PREEMPTED", "PREEMPTED"), "no VM running"),
                     (replace(mig("pod", "PREEMPTED", "READY"), labels={"tpuwatch-job": "other"}), "another job's"),
                     (None, "gone")):
        d = tick(after_the_kill(pod), mem, 700, cfg=ONE)
        assert d.memory.limp.unstopped == (), why
        assert not any(isinstance(a, StopWorkers) and a.node for a in d.actions), (why, kinds(d))
    # nor is it owed on a node the job runs on again (its own probe and launch see to it)
    back = replace(mem, limp=replace(mem.limp, swapped=()))
    d = tick(Observation(node=combine_slices("pod", [mig("pod", "READY", "READY")]),
                         spares=(("sp", mig("sp", "READY", "READY")),), probes=(WorkerProbe(0, "absent"),
                                                                                WorkerProbe(1, "absent")),
                         checkpoint=ckpt(200)), back, 700, cfg=ONE)
    assert d.memory.limp.unstopped == () and not any(isinstance(a, StopWorkers) and a.node for a in d.actions)


def test_a_move_ahead_of_a_maintenance_owes_the_stop_on_the_whole_node_it_leaves() -> None:
    from policy_support import at

    um = UpcomingMaintenance("SCHEDULED", "PENDING", True, at(7 * 86400), at(7 * 86400 + 3600), at(7 * 86400))
    mem = run_mem(step=100)
    running = tuple(WorkerProbe(w, "running", attempt=1, pid=100 + w) for w in range(8))

    def look(m: Memory, step: int) -> Observation:
        return limp_look({}, m, spares=("x0",), parts={"s1": replace(limp_part("s1"), upcoming_maintenance=um)},
                         probes=running, checkpoint=ckpt(step))

    waiting = tick(look(mem, 150), mem, 500, cfg=SPARES)
    d = tick(look(waiting.memory, 160), waiting.memory, 700, cfg=SPARES)
    assert d.row == "early_swap" and d.memory.limp.unstopped == ("s1",), (d.row, d.memory.limp)
    stop = d.actions[0]
    assert isinstance(stop, StopWorkers) and stop.settles == ("s1",) and not stop.node
    # killed before that stop: s1 is whole and READY, the attempt may run on there; it is stopped
    # before the relaunch on x0
    killed = replace(d.memory, phase=Phase.IDLE)
    relaunch = tick(limp_look({}, killed, spares=("x0",), probes=tuple(WorkerProbe(w, "absent") for w in range(8)),
                              checkpoint=ckpt(160)), killed, 701, cfg=SPARES)
    first = relaunch.actions[0]
    assert isinstance(first, StopWorkers) and first.node == "s1", kinds(relaunch)
    assert any(isinstance(a, Launch) for a in relaunch.actions), (relaunch.row, kinds(relaunch))


def test_a_launch_waits_while_the_stop_owed_on_a_node_still_ready_fails_and_goes_once_it_is_done() -> None:
    # killed after the swap off MIG pod, whose one VM still runs: the tick tries the owed stop
    # first (stop_first) and it fails (ssh does not answer); the decision made again with that
    # launches nothing, stops nothing more this tick, and leaves the memory as it was (no attempt
    # started); the next tick tries the stop again first; once it is done the job launches
    mem = killed_after_the_swap()
    still = mig("pod", "PREEMPTED", "READY")
    first = tick(after_the_kill(still), mem, 700, cfg=ONE)
    assert first.stop_first and any(isinstance(a, Launch) for a in first.actions), (first.row, kinds(first))
    held = tick(replace(after_the_kill(still), owed_stop_failed=("pod",)), mem, 700, cfg=ONE)
    # (its preempted VM recreated in place meanwhile, as on any decision that launches nothing)
    assert "launch" not in kinds(held) and "stop" not in kinds(held) and not held.stop_first, (held.row, kinds(held))
    assert held.memory.phase is Phase.IDLE and held.memory.attempt == mem.attempt and held.ended == ()
    assert held.memory.limp.unstopped == ("pod",) and "may still run there" in held.summary
    again = tick(after_the_kill(still), held.memory, 710, cfg=ONE)
    assert again.stop_first and isinstance(again.actions[0], StopWorkers) and again.actions[0].node == "pod"
    launched = tick(after_the_kill(still), stopped(held.memory, ("pod",)), 710, cfg=ONE)  # again not journaled
    assert launched.row == "launch" and not launched.stop_first and kinds(launched) == ["launch"], kinds(launched)
    # a node no longer READY (or no longer the job's) owes nothing: the launch goes
    gone = tick(replace(after_the_kill(mig("pod", "PREEMPTED", "PREEMPTED")), owed_stop_failed=("pod",)), mem, 720,
                cfg=ONE)
    assert gone.row == "launch" and gone.memory.limp.unstopped == (), (gone.row, kinds(gone))


def test_a_maintenance_whose_early_start_a_kill_cut_off_is_started_once_the_node_moved_off_is_idle() -> None:
    # the move journaled, the watcher killed before its stop and before the start of s1's
    # maintenance: once the job runs on x0, s1 is an idle spare of the job's with that
    # maintenance still pending, and it is started then, while nothing runs there
    from policy_support import at

    from tpuwatch.policy import StartMaintenance

    um = UpcomingMaintenance("SCHEDULED", "PENDING", True, at(7 * 86400), at(7 * 86400 + 3600), at(7 * 86400))
    announced = {"s1": replace(limp_part("s1"), upcoming_maintenance=um)}
    mem = run_mem(step=100)
    running = tuple(WorkerProbe(w, "running", attempt=1, pid=100 + w) for w in range(8))
    waiting = tick(limp_look({}, mem, spares=("x0",), parts=announced, probes=running, checkpoint=ckpt(150)), mem, 500,
                   cfg=SPARES)
    d = tick(limp_look({}, waiting.memory, spares=("x0",), parts=announced, probes=running, checkpoint=ckpt(160)),
             waiting.memory, 700, cfg=SPARES)
    assert d.row == "early_swap" and any(isinstance(a, StartMaintenance) for a in d.actions), (d.row, kinds(d))
    killed = stopped(replace(d.memory, phase=Phase.IDLE), ("s1",))  # its stop done at the relaunch
    relaunch = tick(limp_look({}, killed, spares=("x0",), parts=announced,
                              probes=tuple(WorkerProbe(w, "absent") for w in range(8)), checkpoint=ckpt(160)),
                    killed, 701, cfg=SPARES)
    assert relaunch.row == "launch", (relaunch.row, kinds(relaunch))
    on = relaunch.memory
    now = tick(limp_look({}, on, spares=("x0",), parts=announced,
                         probes=tuple(WorkerProbe(w, "running", attempt=2, pid=200 + w) for w in range(8)),
                         checkpoint=ckpt(160)), on, 710, cfg=SPARES)
    assert now.row == "spare_maintenance", (now.row, kinds(now))
    assert [(a.name, a.idle) for a in now.actions if isinstance(a, StartMaintenance)] == [("s1", True)]
