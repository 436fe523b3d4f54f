"""Hot spares (policy/spares.py): a multislice job with tpu.spares swaps a lost slice for a
READY+HEALTHY spare of its own at once, the spare keeping the lost slice's slice id; the node
swapped out is a spare from then on; a spare that is not the job's, of another shape, or not
READY+HEALTHY is never used."""

from __future__ import annotations

from dataclasses import replace

from policy_support import CFG, JOB, LIMPS, ckpt, kinds, limp_look, limp_part, pre, run_mem, tick
from policy_support import LIMP_SLICES as SLICES

from tpuwatch.model import AuditEvent, WorkerProbe, combine_slices
from tpuwatch.policy import Limp, Memory, Observation, Phase, RemakeSpare, StopWorkers
from tpuwatch.policy.spares import unfit
from tpuwatch.policy.state import GoogleStop

SPARES = replace(LIMPS, min_slices=0, spares=("x0",))


def probes_with_slice_down(down: int, attempt: int = 1) -> tuple[WorkerProbe, ...]:
    """8 workers (4 slices x 2): those of slice `down` unreachable, the others running."""
    return tuple(WorkerProbe(w, "unreachable") if w // 2 == down else WorkerProbe(w, "running", attempt=attempt, pid=w)
                 for w in range(8))


def absent(workers: int = 8) -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(w, "absent") for w in range(workers))


def test_a_lost_slice_is_swapped_for_the_spare_and_the_attempt_ends_uncharged() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=probes_with_slice_down(2),
                       checkpoint=ckpt(200)), mem, 600, cfg=SPARES)
    assert d.row == "swap"
    assert d.memory.limp.swapped == (("s2", "x0"),) and d.memory.limp.out == ()
    assert d.memory.phase is Phase.IDLE
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged and d.memory.budgets.restarts == 0
    stop = [a for a in d.actions if isinstance(a, StopWorkers)]
    assert stop and stop[0].wait
    assert not any(k in ("delete", "create") for k in kinds(d))
    assert "slice 2 (s2) on x0 instead of s2 (PREEMPTED)" in d.summary


def test_after_the_swap_the_job_launches_on_the_spare_in_the_lost_slices_place() -> None:
    mem = replace(run_mem(step=100), phase=Phase.IDLE, limp=Limp(swapped=(("s2", "x0"),)))
    seen = limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=absent(), checkpoint=ckpt(200))
    assert seen.node is not None and [p.name for p in seen.node.slices] == ["s0", "s1", "x0", "s3"]
    assert [n for n, _ in seen.spares] == ["s2"]  # the node swapped out is the pool's idle one now
    d = tick(seen, mem, 601, cfg=SPARES)
    assert d.row == "launch" and kinds(d) == ["launch"] and d.memory.attempt.start_step == 200


def test_the_node_swapped_out_is_a_spare_once_back_and_is_swapped_in_for_the_next_loss() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    d = tick(limp_look({"s0": "REPAIRING"}, mem, spares=("x0",), probes=probes_with_slice_down(0),
                       checkpoint=ckpt(200)), mem, 600, cfg=SPARES)
    assert d.row == "swap" and dict(d.memory.limp.swapped) == {"s0": "s2", "s2": "x0"}
    # and swapped back into its own slot, it is no swap any more
    later = replace(d.memory, phase=Phase.RUNNING)
    back = tick(limp_look({"x0": "REPAIRING"}, later, spares=("x0",), probes=probes_with_slice_down(2),
                          checkpoint=ckpt(300)), later, 900, cfg=SPARES)
    assert back.row == "swap" and back.memory.limp.swapped == (("s0", "s2"), ("s2", "s0"))


def test_a_spare_that_is_not_the_jobs_of_another_shape_or_not_ready_is_never_used() -> None:
    mem = run_mem(step=100)
    theirs = replace(limp_part("x0"), labels={"tpuwatch-job": "other"})
    bigger = replace(limp_part("x0"), accelerator_type="v5p-256")
    for spare in (theirs, bigger, limp_part("x0", "REPAIRING"), limp_part("x0", "READY", "UNHEALTHY_MAINTENANCE"),
                  None):
        d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": spare},
                           probes=probes_with_slice_down(2)), mem, 600, cfg=SPARES)
        assert d.row != "swap" and d.memory.limp.swapped == (), spare


def test_a_persons_stop_and_a_restart_are_not_swapped_around() -> None:
    mem = run_mem(step=100)
    for state in ("STOPPED", "RESTARTING"):
        d = tick(limp_look({"s2": state}, mem, spares=("x0",), probes=probes_with_slice_down(2)), mem, 600,
                 cfg=SPARES)
        assert d.row != "swap" and d.memory.limp.swapped == (), state


def test_two_lost_slices_and_one_spare_swap_one_and_limp_on_the_rest_when_allowed() -> None:
    cfg = replace(SPARES, min_slices=3)
    mem = run_mem(step=100)
    down = tuple(WorkerProbe(w, "unreachable") if w // 2 in (1, 2) else WorkerProbe(w, "running", attempt=1, pid=w)
                 for w in range(8))
    d = tick(limp_look({"s1": "PREEMPTED", "s2": "REPAIRING"}, mem, spares=("x0",), probes=down), mem, 600, cfg=cfg)
    assert d.row == "swap" and d.memory.limp.swapped == (("s1", "x0"),) and "no spare left for s2" in d.summary
    after: Memory = d.memory
    limped = tick(limp_look({"s1": "PREEMPTED", "s2": "REPAIRING"}, after, spares=("x0",), probes=absent(6)),
                  after, 601, cfg=cfg)
    assert limped.row == "limp" and limped.memory.limp.out == ("s2",)


def test_a_slice_left_out_gets_a_spare_that_comes_back_and_the_job_grows_onto_it_at_its_next_checkpoint() -> None:
    cfg = replace(SPARES, min_slices=3)
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    running = tuple(WorkerProbe(w, "running", attempt=1, pid=w) for w in range(6))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=running, checkpoint=ckpt(300)), mem, 900,
             cfg=cfg)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),) and d.memory.limp.out == ("s2",)
    assert not d.ended and d.memory.phase is Phase.RUNNING  # nothing stopped: it grows at the next checkpoint
    waiting = tick(limp_look({"s2": "PREEMPTED"}, d.memory, spares=("x0",), probes=running, checkpoint=ckpt(300)),
                   d.memory, 901, cfg=cfg)
    assert waiting.row == "grow_wait"
    grown = tick(limp_look({"s2": "PREEMPTED"}, waiting.memory, spares=("x0",), probes=running,
                           checkpoint=ckpt(400)), waiting.memory, 960, cfg=cfg)
    assert grown.row == "grow" and grown.memory.limp.out == () and grown.memory.limp.swapped == (("s2", "x0"),)


def test_a_job_without_spares_is_never_swapped() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, probes=probes_with_slice_down(2)), mem, 600,
             cfg=replace(SPARES, spares=()))
    assert d.row != "swap" and d.memory.limp.swapped == ()


def test_a_swap_survives_the_journal() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    assert Memory.from_dict(mem.to_dict()) == mem
    assert SLICES == ("s0", "s1", "s2", "s3")


REMADE = replace(SPARES, spares_remade=True)


def running_all() -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(w, "running", attempt=1, pid=w) for w in range(8))


def test_a_dead_idle_spare_is_deleted_then_created_again_with_the_creates_spaced_then_forgotten_once_back() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    seen = limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=running_all())
    d = tick(seen, mem, 600, cfg=REMADE)
    assert d.row == "spare_remake" and d.memory.limp.remaking == ("s2",) and d.memory.phase is Phase.RUNNING
    [act] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (act.name, act.create) == ("s2", False)
    # on its way out: nothing more to do
    going = tick(limp_look({"s2": "DELETING"}, d.memory, spares=("x0",), probes=running_all()), d.memory, 630,
                 cfg=REMADE)
    assert going.row == "running" and going.memory.limp.remaking == ("s2",)
    gone = limp_look({}, going.memory, spares=("x0",), parts={"s2": None}, probes=running_all())
    create = tick(gone, going.memory, 660, cfg=REMADE)
    assert create.row == "spare_remake" and [(a.name, a.create) for a in create.actions
                                             if isinstance(a, RemakeSpare)] == [("s2", True)]
    # the create came to nothing (a stockout): tried again as a queued create is (backoff_base
    # 10 s, doubling; jitter 0.5 keeps 3/4 of it)
    assert tick(gone, create.memory, 667, cfg=REMADE).row == "running"
    second = tick(gone, create.memory, 668, cfg=REMADE)
    assert second.row == "spare_remake" and second.memory.limp.remake_tries == 2
    assert tick(gone, second.memory, 682, cfg=REMADE).row == "running"
    assert tick(gone, second.memory, 684, cfg=REMADE).row == "spare_remake"
    coming = tick(limp_look({"s2": "CREATING"}, second.memory, spares=("x0",), probes=running_all()),
                  second.memory, 900, cfg=REMADE)
    assert coming.row == "running" and coming.memory.limp.remaking == ("s2",)  # made: not created again
    back = tick(limp_look({}, coming.memory, spares=("x0",), probes=running_all()), coming.memory, 960, cfg=REMADE)
    assert back.memory.limp.remaking == () and back.memory.limp.remake_tries == 0


def test_an_idle_spot_vm_still_stopping_is_not_deleted_until_terminated_and_one_a_person_deleted_never_made() -> None:
    """A Compute Engine Spot VM stopping reads PREEMPTED whether Google preempts it (it ends
    TERMINATED) or a person deletes it (it ends gone): nothing is deleted while it stops, so one a
    person deleted is never inserted again; once TERMINATED it is deleted to be made again, and
    not deleted a second time while that delete stops it."""
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    stopping = replace(limp_part("s2", "PREEMPTED"), kind="instance", stopping=True)
    seen = tick(limp_look({}, mem, spares=("x0",), parts={"s2": stopping}, probes=running_all()), mem, 600, cfg=REMADE)
    assert seen.row == "running" and not [a for a in seen.actions if isinstance(a, RemakeSpare)], seen.row
    assert seen.memory.limp.remaking == ()
    gone = limp_look({}, seen.memory, spares=("x0",), parts={"s2": None}, probes=running_all())
    for t in (610, 700, 2000):  # a person's delete: never made again
        later = tick(gone, seen.memory, t, cfg=REMADE)
        assert not [a for a in later.actions if isinstance(a, RemakeSpare)] and later.memory.limp.remaking == ()
    terminated = replace(stopping, stopping=False)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": terminated}, probes=running_all()), mem, 600, cfg=REMADE)
    assert d.row == "spare_remake" and [(a.name, a.create) for a in d.actions if isinstance(a, RemakeSpare)] == [
        ("s2", False)]
    # tpuwatch's delete under way stops it: not sent again past remake_at
    again = tick(limp_look({}, d.memory, spares=("x0",), parts={"s2": stopping}, probes=running_all()), d.memory,
                 900, cfg=REMADE)
    assert not [a for a in again.actions if isinstance(a, RemakeSpare)] and again.memory.limp.remaking == ("s2",)


def test_a_dead_idle_spare_mig_is_recreated_in_place_and_one_gone_since_is_dropped_never_inserted() -> None:
    """A pool of MIGs (tpu.mig) makes a dead spare again by recreating its instances (the MIG stays):
    the act is the same "delete" of the adapter, said as a recreate; a MIG gone while it was made
    again was deleted by a person, and is never inserted."""
    in_place = replace(REMADE, spares_in_place=True)
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=running_all()), mem, 600, cfg=in_place)
    assert d.row == "spare_remake" and d.memory.limp.remaking == ("s2",)
    [act] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (act.name, act.create) == ("s2", False)
    assert "recreating its instances (recreateInstances: the MIG, its template and workload policy stay)" in act.reason
    gone = limp_look({}, d.memory, spares=("x0",), parts={"s2": None}, probes=running_all())
    after = tick(gone, d.memory, 660, cfg=in_place)
    assert after.row == "running" and not [a for a in after.actions if isinstance(a, RemakeSpare)]
    assert after.memory.limp.remaking == () and after.memory.limp.remake_tries == 0


def test_an_idle_mig_whose_vms_start_the_job_at_boot_is_never_used_nor_recreated_and_said() -> None:
    """A MIG's VMs take their metadata from its template: one whose startup script would start the
    job at boot (no tpuwatch-launch = "false") would run it alone as an idle spare."""
    in_place = replace(REMADE, spares_in_place=True)
    mem = run_mem(step=100)
    booting = replace(limp_part("x0"), kind="mig", boots_job=True)
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": booting},
                       probes=probes_with_slice_down(2)), mem, 600, cfg=in_place)
    assert d.row != "swap" and d.memory.limp.swapped == ()
    assert "start the job at boot" in unfit(JOB, None, booting)
    dead = replace(booting, state="PREEMPTED")
    idle = tick(limp_look({}, mem, spares=("x0",), parts={"x0": dead}, probes=running_all()), mem, 600, cfg=in_place)
    assert idle.row == "running" and not [a for a in idle.actions if isinstance(a, RemakeSpare)]
    # set up only (tpuwatch-launch = "false"): swapped in
    ok = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": replace(booting, boots_job=False)},
                        probes=probes_with_slice_down(2)), mem, 600, cfg=in_place)
    assert ok.row == "swap"


def test_a_spare_is_never_deleted_when_not_the_jobs_one_slice_of_a_request_or_with_no_spec_to_make_it() -> None:
    mem = run_mem(step=100)
    for part, cfg in ((replace(limp_part("x0", "PREEMPTED"), labels={"tpuwatch-job": "other"}), REMADE),
                      (replace(limp_part("x0", "PREEMPTED"), multislice_request="projects/p/locations/z/qr/q"), REMADE),
                      (limp_part("x0", "PREEMPTED"), SPARES)):
        d = tick(limp_look({}, mem, spares=("x0",), parts={"x0": part}, probes=running_all()), mem, 600, cfg=cfg)
        assert d.row == "running" and not [a for a in d.actions if isinstance(a, RemakeSpare)], part


def test_a_spare_tpuwatch_did_not_delete_is_never_created() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"x0": None}, probes=running_all()), mem, 600, cfg=REMADE)
    assert d.row == "running" and not [a for a in d.actions if isinstance(a, RemakeSpare)]


def test_a_spare_whose_launch_checks_fail_is_not_used_again_and_another_is_swapped_in() -> None:
    cfg = replace(SPARES, spares=("x0", "x1"))
    mem = replace(run_mem(step=100), phase=Phase.IDLE, limp=Limp(swapped=(("s2", "x0"),)))
    looked = limp_look({"s2": "PREEMPTED"}, mem, spares=("x0", "x1"), probes=absent(),
                       precheck=pre(("devices", 4, False), workers=8, node_id="id-s0+id-s1+id-x0+id-s3"))
    d = tick(looked, mem, 600, cfg=cfg)  # worker 4 is slice 2's first: x0's
    assert d.row == "spare_bad" and d.memory.limp.swapped == () and d.memory.limp.bad == ("x0@id-x0",)
    assert not kinds(d) and not d.ended and "spare x0 (slice 2, s2)" in d.summary
    again = tick(limp_look({"s2": "PREEMPTED"}, d.memory, spares=("x0", "x1"), probes=absent()), d.memory, 601,
                 cfg=cfg)
    assert again.row == "swap" and again.memory.limp.swapped == (("s2", "x1"),)
    # the failing check of a slice of the job's own is waited for as before, not blamed on a spare
    own = tick(replace(looked, precheck=pre(("devices", 0, False), workers=8)), mem, 600, cfg=cfg)
    assert own.row == "precheck_wait"


def test_a_dead_slice_with_no_spare_free_waits_for_the_one_being_made_again_instead_of_a_person() -> None:
    """x0 (the spare) is being made again; s2 is preempted: no stop for a person (not_recreatable)
    but a wait, and s2 itself, owned and made alone, is made again meanwhile."""
    mem = run_mem(step=100, limp=Limp(remaking=("x0",)))
    seen = limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": None}, probes=probes_with_slice_down(2))
    d = tick(seen, mem, 600, cfg=REMADE)
    assert d.row == "spare_wait" and d.memory.phase is Phase.WAITING_NODE
    assert [(e.outcome, e.charged) for e in d.ended] == [("disruption", False)]
    assert "x0 on its way back" in d.summary and "s2 to be made again" in d.summary
    later = tick(replace(seen, probes=absent()), d.memory, 601, cfg=REMADE)
    assert later.row == "spare_remake" and later.memory.phase is Phase.WAITING_NODE
    assert {(a.name, a.create) for a in later.actions if isinstance(a, RemakeSpare)} in ({("x0", True)}, {("s2", False)})
    # without spares to wait for, the rows are as before: slices created one by one need a person
    alone = tick(limp_look({"s2": "PREEMPTED"}, run_mem(step=100), probes=probes_with_slice_down(2)),
                 run_mem(step=100), 600, cfg=replace(SPARES, spares=()))
    assert alone.row == "not_recreatable"


def test_the_jobs_own_dead_slice_made_again_is_launched_on() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(remaking=("s2",)))
    gone = limp_look({}, mem, spares=("x0",), parts={"x0": limp_part("x0", "PREEMPTED"), "s2": None},
                     probes=absent(6))
    create = tick(gone, mem, 600, cfg=REMADE)
    assert create.row == "spare_remake" and [(a.name, a.create) for a in create.actions
                                             if isinstance(a, RemakeSpare)] == [("s2", True)]
    back = limp_look({}, create.memory, spares=("x0",), parts={"x0": limp_part("x0", "PREEMPTED")}, probes=absent())
    d = tick(back, create.memory, 700, cfg=REMADE)
    assert d.row == "launch"
    ran = tick(replace(back, probes=tuple(WorkerProbe(w, "running", attempt=2, pid=w) for w in range(8))), d.memory,
               760, cfg=REMADE)
    # s2 made: no longer remade; the spare x0, dead, is next
    assert ran.row == "spare_remake" and ran.memory.limp.remaking == ("x0",)


def announced(mem: Memory, slice_name: str, *, can_reschedule: bool = True, spares: tuple[str, ...] = ("x0",),
              **kw: object) -> Observation:
    """What the tick sees with a SCHEDULED maintenance announced for `slice_name` a week away."""
    from policy_support import at

    from tpuwatch.model import UpcomingMaintenance

    um = UpcomingMaintenance("SCHEDULED", "PENDING", can_reschedule, at(7 * 86400), at(7 * 86400 + 3600),
                             at(7 * 86400))
    return limp_look({}, mem, spares=spares, parts={slice_name: replace(limp_part(slice_name),
                                                                         upcoming_maintenance=um)}, **kw)


def test_an_announced_maintenance_moves_the_job_onto_the_spare_at_its_next_checkpoint_and_starts_it_idle() -> None:
    mem = run_mem(step=100)
    waiting = tick(announced(mem, "s1", probes=running_all(), checkpoint=ckpt(150)), mem, 500, cfg=SPARES)
    assert waiting.row == "early_wait" and "moving the job off s1 onto spare x0 and starting it" in waiting.summary
    d = tick(announced(waiting.memory, "s1", probes=running_all(), checkpoint=ckpt(160)), waiting.memory, 700,
             cfg=SPARES)
    assert d.row == "early_swap" and kinds(d) == ["stop", "start_maintenance"]
    assert d.memory.limp.swapped == (("s1", "x0"),) and d.memory.maintenance.notice_hold is None
    [stop, start] = d.actions
    assert isinstance(stop, StopWorkers) and stop.wait and getattr(start, "name", "") == "s1"
    [end] = d.ended
    assert (end.outcome, end.charged, end.end_step) == ("disruption", False, 160)
    # a maintenance that may not start early: the job still moves, and the node's maintenance comes at its window
    fixed = tick(announced(waiting.memory, "s1", can_reschedule=False, probes=running_all(), checkpoint=ckpt(160)),
                 waiting.memory, 700, cfg=SPARES)
    assert fixed.row == "early_swap" and kinds(fixed) == ["stop"] and fixed.memory.limp.swapped == (("s1", "x0"),)
    # no spare: as before, the maintenance starts early on the job's node and the job waits for it
    alone = tick(announced(waiting.memory, "s1", spares=(), probes=running_all(), checkpoint=ckpt(160)),
                 waiting.memory, 700, cfg=replace(SPARES, spares=()))
    assert alone.row == "early_start"


def test_a_slice_repairing_past_repair_timeout_waits_for_a_spare_on_its_way_not_for_a_person() -> None:
    from policy_support import at

    from tpuwatch.policy import Repair

    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(remaking=("x0",)),
                  repair=Repair(unhealthy_since=at(0)))
    seen = limp_look({"s2": "REPAIRING"}, mem, spares=("x0",), parts={"x0": None}, probes=absent(6))
    within = tick(seen, mem, REMADE.repair_timeout - 1, cfg=REMADE)
    assert within.row not in ("spare_wait", "not_recreatable")  # the repair is waited for as always
    past = tick(seen, mem, REMADE.repair_timeout + 1, cfg=REMADE)
    assert past.row in ("spare_wait", "spare_remake") and past.memory.phase is Phase.WAITING_NODE, past.row
    nothing = tick(limp_look({"s2": "REPAIRING"}, replace(mem, limp=Limp()), spares=("x0",), probes=absent(6)),
                   replace(mem, limp=Limp()), REMADE.repair_timeout + 1, cfg=replace(REMADE, spares=("x0",)))
    assert nothing.row == "swap"  # x0 READY: swapped in at once


def test_an_idle_spare_under_repair_longer_than_repair_timeout_is_made_again() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    seen = limp_look({"s2": "REPAIRING"}, mem, spares=("x0",), probes=running_all())
    first = tick(seen, mem, 600, cfg=REMADE)
    assert first.row == "running" and first.memory.limp.down == ("s2",)  # noted, waited for
    later = tick(seen, first.memory, 600 + REMADE.repair_timeout - 1, cfg=REMADE)
    assert later.row == "running" and later.memory.limp.down_since == first.memory.limp.down_since
    past = tick(seen, later.memory, 600 + REMADE.repair_timeout, cfg=REMADE)
    assert past.row == "spare_remake" and past.memory.limp.remaking == ("s2",)
    assert [(a.name, a.create) for a in past.actions if isinstance(a, RemakeSpare)] == [("s2", False)]
    assert "under repair longer than recovery.repair_timeout" in past.summary
    healed = tick(limp_look({}, first.memory, spares=("x0",), probes=running_all()), first.memory, 700, cfg=REMADE)
    assert healed.memory.limp.down == ()  # back: forgotten


def test_the_jobs_own_slice_being_deleted_to_be_made_again_is_waited_for_not_taken_for_a_persons_delete() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(remaking=("s2",)))
    d = tick(limp_look({"s2": "DELETING"}, mem, spares=("x0",), parts={"x0": limp_part("x0", "PREEMPTED")},
                       probes=absent(6)), mem, 600, cfg=REMADE)
    assert d.row in ("spare_wait", "spare_remake") and "s2 to be made again" in d.summary, (d.row, d.summary)
    # a delete tpuwatch did not start, with nothing on its way: as before, a person's
    other = tick(limp_look({"s2": "DELETING"}, replace(mem, limp=Limp()), spares=("x0",),
                           parts={"x0": replace(limp_part("x0"), labels={})}, probes=absent(6)),
                 replace(mem, limp=Limp()), 600, cfg=REMADE)
    assert other.row == "someone_deleting"


def test_a_slice_past_a_failed_repair_with_no_spare_free_is_made_again_after_the_grace_not_halted() -> None:
    from policy_support import at

    from tpuwatch.policy import Repair
    from tpuwatch.policy.nodes import FAILED_REPAIR_GRACE

    unknown = replace(limp_part("s2", "UNKNOWN", ""), health="")
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, repair=Repair(unhealthy_since=at(0), unknown_since=at(0)))
    seen = limp_look({}, mem, spares=("x0",), parts={"s2": unknown, "x0": limp_part("x0", "REPAIRING")},
                     probes=absent(6))
    early = tick(seen, mem, FAILED_REPAIR_GRACE - 1, cfg=REMADE)
    assert early.row not in ("spare_wait", "spare_remake", "not_recreatable"), early.row
    d = tick(seen, mem, FAILED_REPAIR_GRACE + 1, cfg=REMADE)
    assert d.row in ("spare_wait", "spare_remake") and "s2 to be made again" in d.summary, (d.row, d.summary)


def preempted(name: str, t: float) -> AuditEvent:
    from policy_support import at

    return AuditEvent(time=at(t), kind="terminate", node=name, worker="0", method="compute.instances.preempted",
                      reason="", insert_id=f"{name}-{t}", resource_name=f"projects/p/zones/z/instances/{name}")


def test_a_node_google_deletes_itself_is_made_again_once_gone_with_the_audit_logs_word_for_it() -> None:
    """A Compute Engine VM whose termination action is DELETE: Google deletes it at its
    preemption. Swapped out so, or seen so idle, it is made again once gone and the audit log
    says Google preempted it (read while it went, or after), with no delete of tpuwatch's; one
    not the job's, or with no spec to make it from, is not."""
    mem = run_mem(step=100)
    deleting = replace(limp_part("s2", "DELETING"), google_deleting="a Spot VM with termination action DELETE is STOPPING",
                       google_deletes=True)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": deleting}, probes=probes_with_slice_down(2),
                       checkpoint=ckpt(200), events=(preempted("s2", 590),)), mem, 600, cfg=REMADE)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),) and d.memory.limp.said == ("s2",)
    assert d.memory.limp.remaking == () and not [a for a in d.actions if isinstance(a, RemakeSpare)]
    later = replace(d.memory, phase=Phase.RUNNING)
    going = tick(limp_look({}, later, spares=("x0",), parts={"s2": deleting}, probes=running_all()), later, 610,
                 cfg=REMADE)
    assert going.memory.limp.deletes == ("s2",) and not [a for a in going.actions if isinstance(a, RemakeSpare)]
    gone = tick(limp_look({}, going.memory, spares=("x0",), parts={"s2": None}, probes=running_all()), going.memory,
                630, cfg=REMADE)
    assert gone.row == "spare_remake" and [(a.name, a.create) for a in gone.actions
                                           if isinstance(a, RemakeSpare)] == [("s2", True)]
    # idle: never deleted by tpuwatch beside Google; gone, made again once the word comes
    idle = replace(deleting, name="x0")
    seen = tick(limp_look({}, mem, spares=("x0",), parts={"x0": idle}, probes=running_all()), mem, 600, cfg=REMADE)
    assert seen.memory.limp.deletes == ("x0",) and not [a for a in seen.actions if isinstance(a, RemakeSpare)]
    waits = tick(limp_look({}, seen.memory, spares=("x0",), parts={"x0": None}, probes=running_all()), seen.memory,
                 610, cfg=REMADE)
    assert waits.memory.limp.vanished == ("x0",) and not [a for a in waits.actions if isinstance(a, RemakeSpare)]
    word = tick(limp_look({}, waits.memory, spares=("x0",), parts={"x0": None}, probes=running_all(),
                          events=(preempted("x0", 598),)), waits.memory, 620, cfg=REMADE)
    assert [(a.name, a.create) for a in word.actions if isinstance(a, RemakeSpare)] == [("x0", True)]
    for part, cfg in ((replace(idle, labels={"tpuwatch-job": "other"}), REMADE), (idle, SPARES)):
        first = tick(limp_look({}, mem, spares=("x0",), parts={"x0": part}, probes=running_all()), mem, 600, cfg=cfg)
        d = tick(limp_look({}, first.memory, spares=("x0",), parts={"x0": None}, probes=running_all(),
                           events=(preempted("x0", 598),)), first.memory, 610, cfg=cfg)
        assert d.memory.limp.remaking == () and not [a for a in d.actions if isinstance(a, RemakeSpare)], part


def test_a_node_google_deletes_swapped_out_and_next_seen_gone_is_still_made_again_on_the_audit_logs_word() -> None:
    """The VM Google is deleting when the job swaps away from it is next read gone (the watcher
    killed after the swap, or slow to tick again): it is waited for as an idle one Google may
    delete, and made again once the audit log says Google preempted it, never forgotten."""
    mem = run_mem(step=100)
    deleting = replace(limp_part("s2", "DELETING"), google_deleting="a Spot VM with termination action DELETE is STOPPING",
                       google_deletes=True)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": deleting}, probes=probes_with_slice_down(2),
                       checkpoint=ckpt(200)), mem, 600, cfg=REMADE)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),) and d.memory.limp.deletes == ("s2",)
    later = replace(d.memory, phase=Phase.RUNNING)
    gone = limp_look({}, later, spares=("x0",), parts={"s2": None}, probes=running_all())
    waits = tick(gone, later, 610, cfg=REMADE)
    assert waits.memory.limp.vanished == ("s2",) and not [a for a in waits.actions if isinstance(a, RemakeSpare)]
    word = tick(limp_look({}, waits.memory, spares=("x0",), parts={"s2": None}, probes=running_all(),
                          events=(preempted("s2", 598),)), waits.memory, 620, cfg=REMADE)
    assert [(a.name, a.create) for a in word.actions if isinstance(a, RemakeSpare)] == [("s2", True)]
    # without a spec to make it from, nothing is waited for
    plain = tick(limp_look({}, mem, spares=("x0",), parts={"s2": deleting}, probes=probes_with_slice_down(2),
                           checkpoint=ckpt(200)), mem, 600, cfg=SPARES)
    assert plain.row == "swap" and plain.memory.limp.deletes == ()


def test_a_spare_google_may_delete_gone_with_no_word_from_google_is_dropped_never_made_again() -> None:
    """An idle Spot VM with termination action DELETE that a person deletes looks as one Google
    preempts (stopping, then gone), but the audit log says nothing of it: after 3 min it is
    dropped and said so (row `spare_gone`), never inserted again."""
    mem = run_mem(step=100)
    idle = replace(limp_part("x0", "DELETING"), google_deleting="a Spot VM with termination action DELETE is STOPPING",
                   google_deletes=True)
    seen = tick(limp_look({}, mem, spares=("x0",), parts={"x0": idle}, probes=running_all()), mem, 600, cfg=REMADE)
    gone = limp_look({}, mem, spares=("x0",), parts={"x0": None}, probes=running_all())
    waits = tick(gone, seen.memory, 610, cfg=REMADE)
    assert waits.memory.limp.vanished == ("x0",) and waits.row == "running", waits.row
    still = tick(gone, waits.memory, 610 + 170, cfg=REMADE)
    assert still.memory.limp.vanished == ("x0",)
    late = tick(gone, still.memory, 610 + 181, cfg=REMADE)
    assert late.row == "spare_gone" and "x0 gone with no word from Google" in late.summary
    assert late.memory.limp.vanished == () and late.memory.limp.remaking == ()
    assert not [a for a in late.actions if isinstance(a, RemakeSpare)]
    after = tick(gone, late.memory, 610 + 300, cfg=REMADE)
    assert after.row != "spare_remake" and after.memory.limp.remaking == ()


def test_a_pool_of_one_whose_vm_google_deleted_is_gone_swaps_once_google_says_so_and_makes_it_again() -> None:
    """A job on one Compute Engine VM (a pool of one slot, `pod`) whose VM, one Google deletes
    itself (termination action DELETE) and owned as last seen, is gone between two ticks: the job
    waits for the audit log's word, then moves to the spare and the VM is made again."""
    from policy_support import at

    one = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True)
    spare = replace(limp_part("sp"), labels={"tpuwatch-job": JOB})
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True))
    seen = Observation(node=None, spares=(("sp", spare),), checkpoint=ckpt(200))
    waiting = tick(seen, mem, 600, cfg=one)
    assert waiting.row == "google_delete_wait" and waiting.memory.limp.swapped == () and waiting.exit_code == 0
    [end] = waiting.ended  # the attempt on the VM gone ends while the word is waited for
    assert end.outcome == "disruption" and not end.charged
    word = AuditEvent(time=at(590), kind="terminate", node="pod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="p", resource_name="projects/p/zones/z/instances/pod")
    d = tick(replace(seen, events=(word,)), waiting.memory, 602, cfg=one)
    assert d.row == "swap" and d.memory.limp.swapped == (("pod", "sp"),) and d.memory.limp.remaking == ("pod",)
    assert "slice 0 (pod) on sp instead of pod (MISSING)" in d.summary
    later = replace(d.memory, phase=Phase.RUNNING)
    view = combine_slices("pod", [spare])
    again = tick(Observation(node=view, spares=(("pod", None),), probes=tuple(
        WorkerProbe(w, "running", attempt=1, pid=w) for w in range(2))), later, 630, cfg=one)
    assert [(a.name, a.create) for a in again.actions if isinstance(a, RemakeSpare)] == [("pod", True)]


def test_a_pool_of_one_whose_vm_google_deleted_is_gone_with_no_spare_free_waits_and_makes_it_again() -> None:
    """As above with the spare down (no spare free): the VM gone with Google's word is journaled to
    be made again that tick, and the attempt (read running until then: the watcher missed the
    stop) ends uncharged; the job waits for it (row `spare_wait`), never stopping for a person,
    and it is inserted once, the next tick, after a restart (the memory read back from its JSON)
    too."""
    import json

    from policy_support import at

    one = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True)
    down = replace(limp_part("sp", "REPAIRING"), labels={"tpuwatch-job": JOB})
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True))
    word = AuditEvent(time=at(590), kind="terminate", node="pod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="p", resource_name="projects/p/zones/z/instances/pod")
    seen = Observation(node=None, spares=(("sp", down),), checkpoint=ckpt(200))
    ends = tick(replace(seen, events=(word,)), mem, 600, cfg=one)
    assert ends.row == "spare_wait" and ends.exit_code == 0, (ends.row, ends.summary)
    assert ends.memory.limp.remaking == ("pod",) and "pod to be made again" in ends.summary
    [end] = ends.ended
    assert (end.attempt, end.outcome, end.charged) == (1, "disruption", False)
    d = tick(seen, ends.memory, 601, cfg=one)
    assert d.row == "spare_remake" and d.exit_code == 0, (d.row, d.summary)
    assert [(a.name, a.create) for a in d.actions if isinstance(a, RemakeSpare)] == [("pod", True)]
    restarted = Memory.from_dict(json.loads(json.dumps(d.memory.to_dict())))
    again = tick(seen, restarted, 602, cfg=one)
    assert again.row == "spare_wait" and again.memory.limp.remaking == ("pod",)
    assert not [a for a in again.actions if isinstance(a, RemakeSpare)]  # one insert under way


def test_a_spot_vm_still_stopping_is_not_swapped_away_from_until_terminated_and_never_once_gone() -> None:
    """A job on one Compute Engine Spot VM (action STOP, a pool of one slot `pod`) with a spare free:
    the VM stopping may be Google's preemption (ends TERMINATED) or a person's instances.delete (ends
    gone, perhaps to stop the job). It waits while it stops; TERMINATED, it swaps to the spare; gone
    with no word, it stops for a person, the spare unused. So for a slice of slices made one by one."""
    one = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True)
    spare = replace(limp_part("sp"), labels={"tpuwatch-job": JOB})
    vm = replace(limp_part("pod", "PREEMPTED"), kind="instance", spot=True, stopping=True)
    mem = run_mem(step=100)

    def seen(part: object) -> Observation:
        view = combine_slices("pod", [part]) if part is not None else None  # type: ignore[list-item]
        return Observation(node=view, spares=(("sp", spare),), checkpoint=ckpt(200))

    d = tick(seen(vm), mem, 600, cfg=one)
    assert d.row == "spot_stopping" and d.memory.limp.swapped == () and d.exit_code == 0, d.summary
    assert not [a for a in d.actions if isinstance(a, RemakeSpare)]
    gone = tick(seen(None), d.memory, 620, cfg=one)
    assert gone.row == "node_missing" and gone.memory.limp.swapped == () and gone.exit_code == 1
    terminated = tick(seen(replace(vm, stopping=False)), d.memory, 620, cfg=one)
    assert terminated.row == "swap" and terminated.memory.limp.swapped == (("pod", "sp"),)
    # a slice of slices made one by one, with a spare free
    stopping = replace(limp_part("s2", "PREEMPTED"), kind="instance", spot=True, stopping=True)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": stopping}, probes=probes_with_slice_down(2)), mem, 600,
             cfg=SPARES)
    assert d.row == "spot_stopping" and d.memory.limp.swapped == (), d.summary
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": replace(stopping, stopping=False)},
                       probes=probes_with_slice_down(2)), mem, 600, cfg=SPARES)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),)


def test_a_slice_stopping_as_tpuwatch_deletes_it_to_make_it_again_is_not_waited_for_as_a_spot_stop() -> None:
    """s2, lost while no spare was free, is being deleted by tpuwatch to be made again (`remaking`):
    its STOPPING is tpuwatch's own doing, so the job waits for it as for any spare on its way, and
    swaps onto a spare that is free, rather than wait to tell a preemption from a person's delete."""
    mem = replace(run_mem(step=100), limp=Limp(remaking=("s2",)))
    stopping = replace(limp_part("s2", "PREEMPTED"), kind="instance", spot=True, stopping=True)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": stopping, "x0": None}, probes=probes_with_slice_down(2)),
             mem, 600, cfg=REMADE)
    assert d.row == "spare_wait", d.summary
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": stopping}, probes=probes_with_slice_down(2)), mem, 600,
             cfg=REMADE)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),), d.summary


def test_a_node_a_person_deleted_is_never_swapped_away_from() -> None:
    """No word from Google (nor a delete of tpuwatch's): a person deleted the node, perhaps to stop
    the job. A pool of one stops for a person as it does without spares (`node_missing`), after
    the audit log's grace for a VM Google may delete; so does a job over slices made one by one
    with a slice gone; a slice of a multislice queued resource gone is Google's autorepair."""
    one = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True)
    spare = replace(limp_part("sp"), labels={"tpuwatch-job": JOB})
    seen = Observation(node=None, spares=(("sp", spare),), checkpoint=ckpt(200))
    tpu = tick(seen, run_mem(step=100), 600, cfg=one)  # a TPU node (Google never deletes one itself)
    assert tpu.row == "node_missing" and tpu.exit_code == 1 and tpu.memory.limp.swapped == ()
    [end] = tpu.ended
    assert not end.charged
    vm = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True))
    waiting = tick(seen, vm, 600, cfg=one)
    assert waiting.row == "google_delete_wait"
    late = tick(seen, waiting.memory, 600 + 181, cfg=one)
    assert late.row == "node_missing" and late.memory.limp.swapped == () and late.memory.limp.remaking == ()
    # bound to a spare that a person deleted: not swapped back onto the node it replaced
    onto = run_mem(step=100, limp=Limp(swapped=(("pod", "sp"),)))
    idle = replace(limp_part("pod"), labels={"tpuwatch-job": JOB})
    back = tick(Observation(node=None, spares=(("pod", idle),), checkpoint=ckpt(200)), onto, 600, cfg=one)
    assert back.row == "node_missing" and dict(back.memory.limp.swapped) == {"pod": "sp"}
    # a slice of slices made one by one
    mem = run_mem(step=100)
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": None}, probes=probes_with_slice_down(2),
                       checkpoint=ckpt(200)), mem, 600, cfg=SPARES)
    assert d.row == "node_missing" and d.exit_code == 1 and d.memory.limp.swapped == ()
    assert "slice 2 (s2) on s2" in d.summary
    assert [e.charged for e in d.ended] == [False]
    # a slice of a multislice queued resource: Google's autorepair
    request = replace(SPARES, queued_resource="qr")
    d = tick(limp_look({}, mem, spares=("x0",), parts={"s2": None}, probes=probes_with_slice_down(2),
                       checkpoint=ckpt(200)), mem, 600, cfg=request)
    assert d.row == "swap" and d.memory.limp.swapped == (("s2", "x0"),)


def test_a_slice_under_repair_is_not_deleted_while_creates_come_to_nothing_but_a_dead_one_is() -> None:
    """x0, deleted by tpuwatch, could not be created yet (a stockout): s2, repairing past
    repair_timeout with no spare free, is waited for, not deleted: it may still heal, and deleted
    it could come back only through a create the zone refuses. A preempted s2 never heals: deleted."""
    from policy_support import at

    from tpuwatch.policy import Repair

    refused = Limp(remaking=("x0",), remake_tries=3, remake_at=at(10_000))
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=refused, repair=Repair(unhealthy_since=at(0)))
    seen = limp_look({"s2": "REPAIRING"}, mem, spares=("x0",), parts={"x0": None}, probes=absent(6))
    d = tick(seen, mem, REMADE.repair_timeout + 60, cfg=REMADE)
    assert d.row == "spare_wait" and d.memory.phase is Phase.WAITING_NODE
    assert not [a for a in d.actions if isinstance(a, RemakeSpare)] and d.memory.limp.remaking == ("x0",)
    # before any create was refused, the same slice is deleted to be made again, as before
    fresh = replace(mem, limp=Limp(remaking=("x0",)))
    first = tick(replace(seen, probes=absent(6)), fresh, REMADE.repair_timeout + 60, cfg=REMADE)
    assert [(a.name, a.create) for a in first.actions if isinstance(a, RemakeSpare)] == [("x0", True)]
    dead = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": None}, probes=absent(6)), mem,
                REMADE.repair_timeout + 60, cfg=REMADE)
    assert dead.row == "spare_remake" and [(a.name, a.create) for a in dead.actions
                                           if isinstance(a, RemakeSpare)] == [("s2", False)]


def test_a_slice_left_out_that_a_person_deletes_is_not_swapped_for_a_spare() -> None:
    """s2 was left out while the job limped; a person then deletes it: with a spare free, the job
    stops for a person as without one, never runs the spare in s2's place. One tpuwatch deleted to
    make again (Limp.remaking) is swapped as before."""
    from policy_support import running

    limps = replace(SPARES, min_slices=3)
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    gone = limp_look({}, mem, spares=("x0",), parts={"s2": None}, probes=running(1, 6), checkpoint=ckpt(300))
    d = tick(gone, mem, 900, cfg=limps)
    assert d.row == "node_missing" and d.exit_code == 1, (d.row, d.summary)
    assert d.memory.limp.swapped == () and "slice 2 (s2) on s2 is missing" in d.summary
    remade = replace(mem, limp=Limp(out=("s2",), remaking=("s2",)))
    seen = limp_look({}, remade, spares=("x0",), parts={"s2": None}, probes=running(1, 6), checkpoint=ckpt(300))
    assert tick(seen, remade, 900, cfg=limps).row == "swap"


def test_an_idle_mig_journaled_to_be_recreated_whose_recreate_never_started_is_recreated_again() -> None:
    """The watcher killed between the journal line of a MIG's recreate in place and the
    recreateInstances call: the MIG, still PREEMPTED with nothing under way once `remake_at` is
    past, is recreated again; before then, and once the MIG is at work (REPAIRING), it is not."""
    from policy_support import at

    in_place = replace(REMADE, spares_in_place=True)
    mem = run_mem(step=100, limp=Limp(swapped=(("s2", "x0"),)))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), probes=running_all()), mem, 600, cfg=in_place)
    assert d.row == "spare_remake" and d.memory.limp.remaking == ("s2",) and d.memory.limp.remake_at is not None
    soon = tick(limp_look({"s2": "PREEMPTED"}, d.memory, spares=("x0",), probes=running_all()), d.memory, 601,
                cfg=in_place)
    assert not [a for a in soon.actions if isinstance(a, RemakeSpare)], soon.actions
    late = (d.memory.limp.remake_at - at(0)).total_seconds() + 1
    again = tick(limp_look({"s2": "PREEMPTED"}, d.memory, spares=("x0",), probes=running_all()), d.memory, late,
                 cfg=in_place)
    assert [(a.name, a.create) for a in again.actions if isinstance(a, RemakeSpare)] == [("s2", False)], again.summary
    busy = tick(limp_look({"s2": "REPAIRING"}, d.memory, spares=("x0",), probes=running_all()), d.memory, late,
                cfg=in_place)
    assert not [a for a in busy.actions if isinstance(a, RemakeSpare)], busy.actions


def test_a_swap_off_a_mig_one_vm_of_which_is_preempted_stops_the_attempt_on_its_vms_still_running() -> None:
    """A job on a MIG of 2 VMs (a pool of one slot) whose VM 0 is preempted: the MIG reads
    PREEMPTED, its VM 1 still RUNNING (and probed). The swap onto the spare MIG stops the old
    attempt there first (not blocked, waited for), and that stop goes to VM 1 only, not to the
    VM that is gone; so does the end of the attempt without a spare."""
    one = replace(CFG, slices=("pod",), recreatable=False, spares=("sp",), spares_remade=True, spares_in_place=True)
    mig = replace(limp_part("pod", "PREEMPTED"), kind="mig", target_size=2, labels={"tpuwatch-job": JOB},
                  worker_states=("PREEMPTED", "READY"))
    spare = replace(limp_part("sp"), kind="mig", target_size=2, labels={"tpuwatch-job": JOB})
    view = combine_slices("pod", [mig])
    assert view is not None and view.reachable and [w.index for w in view.reachable_workers] == [1]
    probes = (WorkerProbe(0, "unreachable", detail="its VM in slice 0 (pod) is PREEMPTED"),
              WorkerProbe(1, "running", attempt=1, pid=7))
    mem = run_mem(step=100)
    d = tick(Observation(node=view, spares=(("sp", spare),), probes=probes, checkpoint=ckpt(200)), mem, 600, cfg=one)
    assert d.row == "swap" and d.memory.limp.swapped == (("pod", "sp"),), (d.row, d.summary)
    [stop] = [a for a in d.actions if isinstance(a, StopWorkers)]
    assert stop.wait and not stop.blocked, stop
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged
    alone = tick(Observation(node=view, probes=probes, checkpoint=ckpt(200)), mem, 600,
                 cfg=replace(one, spares=(), spares_remade=False, spares_in_place=False))
    stops = [a for a in alone.actions if isinstance(a, StopWorkers)]
    assert alone.memory.phase is not Phase.RUNNING and stops and not stops[0].blocked, (alone.row, alone.summary)
