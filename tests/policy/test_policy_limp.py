"""Limping (policy/limp.py): a multislice job with job.min_slices runs on the slices left when
one is lost, and grows back onto it at its next complete checkpoint; a job that never said it
can limp is never limped, and never below its floor."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_support import LIMP_SLICES as SLICES
from policy_support import LIMPS, NAME, ckpt, kinds, limp_look, limp_part, run_mem, tick

from tpuwatch.model import WorkerProbe, bound_view
from tpuwatch.policy import (
    ImpossibleObservation,
    Limp,
    Memory,
    Observation,
    Phase,
    RemakeSpare,
    StopWorkers,
    Wait,
)


def running_on(workers: int, attempt: int = 1) -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(w, "running", attempt=attempt, pid=100 + w) for w in range(workers))


def probes_with_slice_down(down: int, attempt: int = 1) -> tuple[WorkerProbe, ...]:
    """8 workers (4 slices x 2): those of slice `down` unreachable, the others running."""
    return tuple(WorkerProbe(w, "unreachable") if w // 2 == down else WorkerProbe(w, "running", attempt=attempt, pid=w)
                 for w in range(8))


def test_a_lost_slice_ends_the_attempt_uncharged_and_the_job_limps_on_the_slices_left() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "REPAIRING"}, mem, probes=probes_with_slice_down(2), checkpoint=ckpt(200)), mem, 600,
             cfg=LIMPS)
    assert d.row == "limp"
    assert d.memory.limp.out == ("s2",) and d.memory.limp.since is not None
    assert d.memory.phase is Phase.IDLE  # the attempt ended, to relaunch on the slices left
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged
    assert d.memory.budgets.restarts == 0
    stop = [a for a in d.actions if isinstance(a, StopWorkers)]
    assert stop and stop[0].wait  # the next look must find the old attempt gone
    assert "limping on 3 of 4 slices" in d.summary and "s2 left out" in d.summary


def test_after_the_limp_the_slices_left_are_launched_on_with_their_own_count() -> None:
    mem = replace(run_mem(step=100), phase=Phase.IDLE, limp=Limp(out=("s2",)))
    seen = limp_look({"s2": "REPAIRING"}, mem, probes=tuple(WorkerProbe(w, "absent") for w in range(6)),
                checkpoint=ckpt(200))
    assert seen.node is not None and len(seen.node.slices) == 3 and seen.node.slices_out == ("s2",)
    d = tick(seen, mem, 601, cfg=LIMPS)
    assert d.row == "launch" and kinds(d) == ["launch"]
    assert d.memory.attempt.start_step == 200


def test_a_job_that_never_said_it_can_limp_stops_and_waits_for_every_slice() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "REPAIRING"}, mem, probes=probes_with_slice_down(2)), mem, 600,
             cfg=replace(LIMPS, min_slices=0))
    assert d.row != "limp" and d.memory.limp.out == ()
    assert d.memory.phase is Phase.WAITING_NODE


def test_never_below_the_floor() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s1": "REPAIRING", "s2": "PREEMPTED"}, mem, probes=probes_with_slice_down(2)), mem, 600,
             cfg=LIMPS)
    assert d.row != "limp" and d.memory.limp.out == ()
    two = replace(LIMPS, min_slices=2)
    d2 = tick(limp_look({"s1": "REPAIRING", "s2": "PREEMPTED"}, mem, probes=probes_with_slice_down(2)), mem, 600, cfg=two)
    assert d2.row == "limp" and d2.memory.limp.out == ("s1", "s2")


def test_a_slice_that_restarts_is_waited_for_not_limped_around() -> None:
    """Google restarts a multislice request's other slices once a lost one is back: minutes, less
    than a relaunch on fewer slices and the grow back would cost."""
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "RESTARTING"}, mem, probes=probes_with_slice_down(2)), mem, 600, cfg=LIMPS)
    assert d.row != "limp" and d.memory.limp.out == () and d.memory.phase is Phase.WAITING_NODE


def test_a_slice_a_person_stopped_pauses_the_job_and_is_not_limped_around() -> None:
    mem = run_mem(step=100)
    d = tick(limp_look({"s2": "STOPPED"}, mem, probes=probes_with_slice_down(2)), mem, 600, cfg=LIMPS)
    assert d.row != "limp" and d.memory.phase is Phase.PAUSED


def test_a_slice_back_is_grown_onto_at_the_next_complete_checkpoint_not_before() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",), since=None))
    # the slice is back while the job trains on 3 slices at step 300: wait for a newer checkpoint
    first = tick(limp_look({}, mem, probes=running_on(6), checkpoint=ckpt(300)), mem, 900, cfg=LIMPS)
    assert first.row == "grow_wait" and first.memory.limp.back_step == 300
    assert first.memory.phase is Phase.RUNNING and "s2 back" in first.summary
    # not steady: the loop looks every sixth of a poll for that checkpoint
    assert [a.until for a in first.actions if isinstance(a, Wait)] == [None] and not first.steady
    same = tick(limp_look({}, first.memory, probes=running_on(6), checkpoint=ckpt(300)), first.memory, 920, cfg=LIMPS)
    assert same.row == "grow_wait" and same.memory.limp.out == ("s2",)
    grown = tick(limp_look({}, same.memory, probes=running_on(6), checkpoint=ckpt(400)), same.memory, 940, cfg=LIMPS)
    assert grown.row == "grow" and grown.memory.limp == Limp()
    [end] = grown.ended
    assert end.outcome == "disruption" and not end.charged and end.end_step == 400
    assert [a for a in grown.actions if isinstance(a, StopWorkers)][0].wait
    assert grown.memory.phase is Phase.IDLE


def test_a_slice_back_and_down_again_before_the_checkpoint_is_not_grown_onto() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    back = tick(limp_look({}, mem, probes=running_on(6), checkpoint=ckpt(300)), mem, 900, cfg=LIMPS)
    down = tick(limp_look({"s2": "REPAIRING"}, back.memory, probes=running_on(6), checkpoint=ckpt(400)), back.memory, 960,
                cfg=LIMPS)
    assert down.row == "running" and down.memory.limp.out == ("s2",) and down.memory.limp.back_since is None


def test_with_no_attempt_running_a_slice_back_is_taken_back_at_once() -> None:
    mem = replace(run_mem(step=200), phase=Phase.IDLE, limp=Limp(out=("s2",)))
    d = tick(limp_look({}, mem, probes=tuple(WorkerProbe(w, "absent") for w in range(6))), mem, 900, cfg=LIMPS)
    assert d.row == "grow" and d.memory.limp.out == () and not d.ended


def test_a_slice_dropped_from_tpu_names_is_no_longer_left_out() -> None:
    mem = replace(run_mem(step=200), phase=Phase.IDLE, limp=Limp(out=("old",)))
    parts = [limp_part(s) for s in SLICES[:3]]
    cfg = replace(LIMPS, slices=SLICES[:3], min_slices=2)
    view, left = bound_view(NAME, SLICES[:3], dict(zip(SLICES[:3], parts, strict=True)), mem.limp.out)
    d = tick(Observation(node=view, left_out=left, probes=tuple(WorkerProbe(w, "absent") for w in range(6))), mem,
             900, cfg=cfg)
    assert d.row == "grow" and d.memory.limp.out == () and "no longer in tpu.names" in d.summary


def test_an_observation_of_other_slices_than_the_memory_runs_on_is_refused() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    full = limp_look({}, run_mem())  # all 4 slices, as if nothing were left out
    with pytest.raises(ImpossibleObservation, match="left out"):
        tick(full, mem, 900, cfg=LIMPS)


def test_limp_memory_survives_the_journal_round_trip() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2", "s3"), since=None, back_step=300))
    assert Memory.from_dict(mem.to_dict()) == mem



def test_an_attempt_launched_on_every_slice_is_not_followed_on_the_slices_left() -> None:
    """A watcher killed after the limp was journaled and before its stop: the next one finds
    attempt 1 still running on the 3 slices left. It was launched on 4 and waits in its
    collectives for the lost one: stopped, never followed as if it had survived."""
    mem = run_mem(step=100)
    full = limp_look({"s2": "REPAIRING"}, mem, probes=tuple(
        WorkerProbe(w, "unreachable") if w // 2 == 2 else WorkerProbe(w, "running", attempt=1, pid=w) for w in range(8)))
    limped = tick(full, mem, 600, cfg=LIMPS)
    after = limped.memory
    d = tick(limp_look({"s2": "REPAIRING"}, after, probes=running_on(6), checkpoint=ckpt(200)), after, 601, cfg=LIMPS)
    assert d.row == "stale_workers" and kinds(d) == ["stop"]


def test_a_dead_slice_of_a_queued_resource_is_limped_around_until_the_next_checkpoint_then_recreated() -> None:
    """A preempted slice of a multislice queued resource never comes back by itself, and the
    request can only be made again as a whole: the job trains on the 3 left until its next
    checkpoint, then the slice is taken back and the rows recreate the request (dead_node), not
    limp around it again."""
    qr = replace(LIMPS, recreatable=True, queued_resource="ms")
    mem = run_mem(step=100)
    limped = tick(limp_look({"s2": "PREEMPTED"}, mem, probes=probes_with_slice_down(2)), mem, 600, cfg=qr)
    assert limped.row == "limp" and limped.memory.limp.out == ("s2",)
    running = replace(limped.memory, phase=Phase.RUNNING,
                      attempt=replace(limped.memory.attempt, number=2, start=limped.memory.attempt.start, seen=True,
                                      start_step=200))
    waiting = tick(limp_look({"s2": "PREEMPTED"}, running, probes=running_on(6, attempt=2), checkpoint=ckpt(200)),
                   running, 700, cfg=qr)
    assert waiting.row == "grow_wait" and "s2" in waiting.summary
    taken = tick(limp_look({"s2": "PREEMPTED"}, waiting.memory, probes=running_on(6, attempt=2), checkpoint=ckpt(300)),
                 waiting.memory, 760, cfg=qr)
    assert taken.row == "grow" and taken.memory.limp.out == () and taken.memory.limp.recreate == ("s2",)
    assert "will not come back by itself" in taken.summary
    # the tick looks at all 4 slices again: the dead one is recreated with the request, not left out again
    after = taken.memory
    d = tick(limp_look({"s2": "PREEMPTED"}, after, probes=probes_with_slice_down(2, attempt=2)), after, 761, cfg=qr)
    assert d.row == "dead_node" and kinds(d) == ["delete"]
    # slices created one by one cannot be made again: the job limps on
    one_by_one = tick(limp_look({"s2": "PREEMPTED"}, waiting.memory, probes=running_on(6, attempt=2),
                                checkpoint=ckpt(300)), waiting.memory, 760, cfg=LIMPS)
    assert one_by_one.row == "running" and one_by_one.memory.limp.out == ("s2",)


ALONE = replace(LIMPS, slices_remade=True)  # slices made one by one, with [tpu.spec] to make one again


def test_a_dead_slice_left_out_of_slices_made_one_by_one_is_made_again_in_the_background_then_grown_onto() -> None:
    """A preempted slice made alone never comes back by itself: while the job limps on the 3
    left, it is journaled as one tpuwatch makes again, deleted, created again from [tpu.spec]
    (the job trains on throughout), and grown onto at the checkpoint after it is READY."""
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    on3 = running_on(6)
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, probes=on3, checkpoint=ckpt(300)), mem, 900, cfg=ALONE)
    assert d.row == "spare_remake" and d.memory.limp.remaking == ("s2",) and not d.ended
    assert d.memory.phase is Phase.RUNNING and [(a.name, a.create) for a in d.actions
                                                if isinstance(a, RemakeSpare)] == [("s2", False)]
    assert "grows back onto it" in d.summary
    going = tick(limp_look({"s2": "DELETING"}, d.memory, probes=on3, checkpoint=ckpt(300)), d.memory, 930, cfg=ALONE)
    assert going.row == "running" and going.memory.limp.remaking == ("s2",)
    gone = limp_look({}, going.memory, parts={"s2": None}, probes=on3, checkpoint=ckpt(300))
    create = tick(gone, going.memory, 960, cfg=ALONE)
    assert create.row == "spare_remake" and [(a.name, a.create) for a in create.actions
                                             if isinstance(a, RemakeSpare)] == [("s2", True)]
    coming = tick(limp_look({"s2": "CREATING"}, create.memory, probes=on3, checkpoint=ckpt(300)), create.memory, 990,
                  cfg=ALONE)
    assert coming.row == "running" and coming.memory.limp.out == ("s2",)
    back = tick(limp_look({}, coming.memory, probes=on3, checkpoint=ckpt(300)), coming.memory, 1300, cfg=ALONE)
    assert back.row == "grow_wait" and back.memory.limp.remaking == ()
    grown = tick(limp_look({}, back.memory, probes=on3, checkpoint=ckpt(400)), back.memory, 1320, cfg=ALONE)
    assert grown.row == "grow" and grown.memory.limp.out == ()
    # without [tpu.spec] (or over a queued resource's slices) such a slice is never deleted
    plain = tick(limp_look({"s2": "PREEMPTED"}, mem, probes=on3, checkpoint=ckpt(300)), mem, 900, cfg=LIMPS)
    assert plain.row == "running" and not [a for a in plain.actions if isinstance(a, RemakeSpare)]


def test_a_slice_left_out_under_repair_is_made_again_only_past_repair_timeout_and_never_when_not_the_jobs() -> None:
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    on3 = running_on(6)
    first = tick(limp_look({"s2": "REPAIRING"}, mem, probes=on3, checkpoint=ckpt(300)), mem, 900, cfg=ALONE)
    assert first.row == "running" and first.memory.limp.down == ("s2",)
    late = 900 + ALONE.repair_timeout
    d = tick(limp_look({"s2": "REPAIRING"}, first.memory, probes=on3, checkpoint=ckpt(300)), first.memory, late,
             cfg=ALONE)
    assert d.row == "spare_remake" and d.memory.limp.remaking == ("s2",)
    theirs = replace(limp_part("s2", "PREEMPTED"), labels={"tpuwatch-job": "other"})
    other = tick(limp_look({}, mem, parts={"s2": theirs}, probes=on3, checkpoint=ckpt(300)), mem, 900, cfg=ALONE)
    assert other.row == "running" and other.memory.limp.remaking == ()


def test_slices_made_one_by_one_lost_below_the_floor_are_made_again_and_waited_for_not_a_person() -> None:
    mem = run_mem(step=100)
    down = tuple(WorkerProbe(w, "unreachable") if w // 2 in (1, 2) else WorkerProbe(w, "running", attempt=1, pid=w)
                 for w in range(8))
    seen = limp_look({"s1": "PREEMPTED", "s2": "PREEMPTED"}, mem, probes=down)
    d = tick(seen, mem, 600, cfg=ALONE)
    assert d.row == "spare_wait" and d.memory.phase is Phase.WAITING_NODE and "to be made again" in d.summary
    later = tick(replace(seen, probes=tuple(WorkerProbe(w, "absent") for w in range(8))), d.memory, 601, cfg=ALONE)
    assert later.row == "spare_remake" and [a.name for a in later.actions if isinstance(a, RemakeSpare)] == ["s1"]
    assert tick(seen, mem, 600, cfg=LIMPS).row == "not_recreatable"


def test_a_slice_back_soon_after_the_limp_is_grown_onto_at_once_before_any_checkpoint() -> None:
    """The limped attempt (started at 900 from step 200) has saved nothing and is younger than
    1/4 (one of 4 slices left out) of the job's 2000 s checkpoint interval: growing back now
    discards less than limping on to its first checkpoint would lose."""
    from tpuwatch.policy import HangLearning

    mem = run_mem(attempt=2, start=900, step=200, limp=Limp(out=("s2",)), hang=HangLearning(ckpt_gap=2000.0))
    on3 = running_on(6, attempt=2)
    soon = tick(limp_look({}, mem, probes=on3, checkpoint=ckpt(200)), mem, 900 + 120, cfg=LIMPS)
    assert soon.row == "grow" and soon.memory.limp.out == () and soon.memory.phase is Phase.IDLE
    [end] = soon.ended
    assert end.outcome == "disruption" and not end.charged
    # later than a quarter of the interval, or once it saved a checkpoint: at its next checkpoint
    late = tick(limp_look({}, mem, probes=on3, checkpoint=ckpt(200)), mem, 900 + 600, cfg=LIMPS)
    assert late.row == "grow_wait" and late.memory.limp.out == ("s2",)
    saved = tick(limp_look({}, mem, probes=on3, checkpoint=ckpt(300)), mem, 900 + 120, cfg=LIMPS)
    assert saved.row == "grow_wait"
    # nothing learned of the interval yet: at its next checkpoint, as before
    fresh = replace(mem, hang=HangLearning())
    assert tick(limp_look({}, fresh, probes=on3, checkpoint=ckpt(200)), fresh, 900 + 120, cfg=LIMPS).row == "grow_wait"


def test_a_slice_a_person_deleted_is_not_limped_around_the_job_stops_for_a_person() -> None:
    """Slices made one by one: a slice gone with no word from Google or tpuwatch was deleted by a
    person, perhaps to stop the job. The job stops for a person (as a swap would), never limps on
    without it, and it is never made again."""
    mem = run_mem(step=100)
    seen = limp_look({}, mem, parts={"s2": None}, probes=probes_with_slice_down(2), checkpoint=ckpt(200))
    d = tick(seen, mem, 600, cfg=LIMPS)
    assert d.row == "node_missing" and d.exit_code == 1, d.summary
    assert "slice 2 (s2) on s2 is missing" in d.summary and "nor limps around" in d.summary, d.summary
    assert d.memory.limp.out == () and not {"create", "delete", "remake_spare"} & set(kinds(d))
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged  # the person decides; nothing charged
    # [tpu.spec] there to make slices again: still never created, nor limped around
    spec = tick(seen, mem, 600, cfg=replace(LIMPS, slices_remade=True))
    assert spec.row == "node_missing" and not {"create", "remake_spare"} & set(kinds(spec))


def test_a_slice_tpuwatch_or_google_removed_is_limped_around_as_before() -> None:
    # one tpuwatch deleted to make again (Limp.remaking): its own doing, limped around
    mem = replace(run_mem(step=100), limp=Limp(remaking=("s2",)))
    seen = limp_look({}, mem, parts={"s2": None}, probes=probes_with_slice_down(2), checkpoint=ckpt(200))
    assert tick(seen, mem, 600, cfg=LIMPS).row == "limp"
    # a slice of a multislice queued resource: Google's autorepair makes it again
    queued = replace(LIMPS, queued_resource="qr")
    mem = run_mem(step=100)
    seen = limp_look({}, mem, parts={"s2": None}, probes=probes_with_slice_down(2), checkpoint=ckpt(200))
    assert tick(seen, mem, 600, cfg=queued).row == "limp"


def test_a_slice_left_out_that_a_person_deletes_while_the_job_limps_stops_the_job_for_a_person() -> None:
    """s2 was left out (preempted, no [tpu.spec] to make it again); a person then deletes it: the
    limped attempt ends and the job stops for a person rather than limp on for good without it.
    One tpuwatch deleted to make again (Limp.remaking) is limped around as before."""
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    gone = limp_look({}, mem, parts={"s2": None}, probes=running_on(6), checkpoint=ckpt(300))
    d = tick(gone, mem, 900, cfg=LIMPS)
    assert d.row == "node_missing" and d.exit_code == 1, d.summary
    assert "slice 2 (s2) on s2 is missing" in d.summary and not {"create", "remake_spare"} & set(kinds(d))
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged
    remade = replace(mem, limp=Limp(out=("s2",), remaking=("s2",)))
    seen = limp_look({}, remade, parts={"s2": None}, probes=running_on(6), checkpoint=ckpt(300))
    assert tick(seen, remade, 900, cfg=LIMPS).row != "node_missing"
