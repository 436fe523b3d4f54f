"""Hot spares (policy/spares.py): a multislice job with tpu.spares swaps a lost slice for a
READY+HEALTHY spare of its own at once, the spare keeping the lost slice's slice id; the node
swapped out is a spare from then on; a spare that is not the job's, of another shape, or not
READY+HEALTHY is never used."""

from __future__ import annotations

from dataclasses import replace

from policy_support import LIMP_SLICES as SLICES
from policy_support import LIMPS, ckpt, kinds, limp_look, limp_part, pre, run_mem, tick

from tpuwatch.model import WorkerProbe
from tpuwatch.policy import Limp, Memory, Phase, RemakeSpare, StopWorkers

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
    back = tick(limp_look({"s2": "CREATING"}, second.memory, spares=("x0",), probes=running_all()), second.memory,
                900, cfg=REMADE)
    assert back.memory.limp.remaking == () and back.memory.limp.remake_tries == 0


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
