"""The demo's summary arithmetic, on journal rows and checkpoint times laid out by hand.

What `tpuwatch demo` prints is checked end to end in test_demo.py; here each definition is
pinned down: detect, resume, steps lost, charged, recovered, goodput, and what the summary says
when a disruption was not recovered.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

from rich.console import Console

from tpuwatch.demo.story import FAST, Played, story
from tpuwatch.demo.summary import Summary, render, step_at, summarize
from tpuwatch.journal import AttemptRow, JournalEvent

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
ACTS = story(FAST)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(n: int, start: float, end: float | None, start_step: int | None, charged: bool = False,
            outcome: str = "disruption") -> AttemptRow:
    return AttemptRow(n, at(start), None if end is None else at(end), "1", start_step, None,
                      outcome if end is not None else None, charged if end is not None else None, None, "")


def ev(i: int, t: float, kind: str = "wait", **data: object) -> JournalEvent:
    return JournalEvent(i, at(t), kind, kind, dict(data))


def ckpts(*pairs: tuple[int, float]) -> dict[int, datetime]:
    return {s: at(t) for s, t in pairs}


def text(renderable: object) -> str:
    console = Console(width=80, file=io.StringIO(), color_system=None)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_step_at_a_fault_is_the_last_checkpoint_plus_the_steps_since() -> None:
    c = ckpts((10, 1.0), (20, 1.3))
    assert step_at(at(1.3 + 5 * FAST.step_time + 0.001), c, FAST) == 25
    assert step_at(at(9.0), c, FAST) == 29  # never a whole interval: that would have saved
    assert step_at(at(0.5), c, FAST) is None


def test_a_recovered_disruption_and_a_charged_crash() -> None:
    maint, crash = ACTS[0], ACTS[3]
    played = [Played(maint, at(1.6), mark=1), Played(crash, at(6.0), mark=3, step=85)]
    events = [ev(1, 0.0, "launch"), ev(2, 2.2, "attempt_end", attempt=1), ev(3, 4.0, "launch"),
              ev(4, 5.9, "attempt_end", attempt=2), ev(5, 6.5, "launch"), ev(6, 8.0, "done")]
    attempts = [attempt(1, 0.0, 2.2, None), attempt(2, 4.0, 5.9, 20, charged=True, outcome="failure"),
                attempt(3, 6.5, 8.0, 80, outcome="success")]
    c = ckpts((10, 1.0), (20, 1.5), (80, 5.5), (90, 7.0), (105, 8.0))
    # The tick stamped 5.9 (it began before the crash at 6.0) finished acting at 6.1.
    s = summarize(played, [a.title for a in ACTS[:1]] + [crash.title], events, attempts, c, FAST,
                  done=True, how_it_ended="job done", tick_end={at(2.2): at(2.4), at(5.9): at(6.1)})
    m, k = s.outcomes
    assert (m.recovered, m.charged, m.steps_lost) == (True, 0, 3)  # at 20 + 0.1 s / 0.03 s, back to 20
    assert abs(m.detect - 0.8) < 1e-6 and abs(m.resume - 2.4) < 1e-6  # type: ignore[operator]
    assert (k.recovered, k.charged, k.steps_lost) == (True, 1, 5)  # crashed at 85, resumed from 80
    assert abs(k.detect - 0.1) < 1e-6 and abs(k.resume - 0.5) < 1e-6  # type: ignore[operator]
    assert s.ok and s.final_step == 105 == FAST.steps
    assert s.goodput is not None and abs(s.goodput - 105 * FAST.step_time / 8.0) < 1e-9
    out = text(render(s))
    assert "recovered" in out and "NOT" not in out
    assert "result: ok: 2/2 disruptions recovered, final step 105/105" in out


def test_the_summary_says_which_disruption_was_not_recovered() -> None:
    stuck, preempt = ACTS[1], ACTS[2]
    played = [Played(stuck, at(2.0), mark=1)]
    events = [ev(1, 0.0, "launch"), ev(2, 2.1, "attempt_end", attempt=1), ev(3, 5.0, "fail")]
    attempts = [attempt(1, 0.0, 2.1, None)]
    s = summarize(played, [stuck.title, preempt.title], events, attempts, ckpts((10, 1.0)), FAST,
                  done=False, how_it_ended="job failed: recreate budget spent")
    assert not s.ok
    assert [o.recovered for o in s.outcomes] == [False, False]
    out = " ".join(text(render(s)).split())
    assert f"not recovered: {stuck.title}: the job was never relaunched" in out
    assert f"not recovered: {preempt.title}: never happened" in out
    assert "the run ended: job failed: recreate budget spent" in out
    assert "result: FAILED: 0/2 disruptions recovered, final step 10/105" in out


LIMP = story(FAST, limp=True)
LIMP_STEPS = 100


def limp_run(grew: bool = True) -> tuple[list[Played], list[JournalEvent], list[AttemptRow], dict[int, datetime]]:
    """The limping story by hand: demo-1 lost at 1.6 s, the job relaunched on 3 in the tick
    stamped 1.7 (done acting at 2.0), demo-1 back at 4.0, the grow at checkpoint 60 (saved at
    4.9) in the tick stamped 4.8 (done acting at 5.4), the job done at 8.0."""
    lost, back = LIMP
    played = [Played(lost, at(1.6), mark=1), Played(back, at(4.0), mark=4)]
    events = [ev(1, 0.0, "launch"), ev(2, 1.7, "attempt_end", attempt=1),
              ev(3, 1.7, "slices", out=["demo-1"], in_use=3, of=4), ev(4, 1.7, "launch"),
              ev(5, 4.2, "wait")]
    attempts = [attempt(1, 0.0, 1.7, None), attempt(2, 1.7, 4.8 if grew else None, 20)]
    if grew:
        events += [ev(6, 4.8, "attempt_end", attempt=2), ev(7, 4.8, "slices", out=[], in_use=4, of=4),
                   ev(8, 4.8, "launch"), ev(9, 8.0, "done")]
        attempts.append(attempt(3, 4.8, 8.0, 60, outcome="success"))
    c = ckpts((10, 1.0), (20, 1.3), (30, 2.6), (40, 3.5), (50, 4.4), (60, 4.9))
    if grew:
        c.update(ckpts((70, 6.0), (80, 6.5), (90, 7.2), (100, 8.0)))
    return played, events, attempts, c


def test_the_limp_says_what_it_cost_and_gave() -> None:
    played, events, attempts, c = limp_run()
    s = summarize(played, [a.title for a in LIMP], events, attempts, c, FAST, done=True, how_it_ended="job done",
                  tick_end={at(1.7): at(2.0), at(4.2): at(4.3), at(4.8): at(5.4)}, steps=LIMP_STEPS, limp=True)
    lost, back = s.outcomes
    # lost at 1.6 (step 20 + 0.3 s / 0.03 s, capped at 29), relaunched from 20 by the tick's end
    assert (lost.recovered, lost.charged, lost.steps_lost) == (True, 0, 9)
    assert abs(lost.detect - 0.4) < 1e-6 and abs(lost.resume - 0.4) < 1e-6  # type: ignore[operator]
    # back at 4.0: seen by the tick done at 4.3; on all 4 by 5.4; the steps past checkpoint 60
    # count from the stop (stamped 4.8: none yet), not from the return
    assert (back.recovered, back.charged, back.steps_lost) == (True, 0, 0)
    assert abs(back.detect - 0.3) < 1e-6 and abs(back.resume - 1.4) < 1e-6  # type: ignore[operator]
    lp = s.limp
    assert lp is not None and not lp.why
    assert (lp.in_use, lp.of, lp.grow_step) == (3, 4, 60)
    assert abs(lp.seconds - 3.1) < 1e-6 and abs(lp.training - 3.1 * 3 / 4) < 1e-6
    assert lp.grow_cost is not None and abs(lp.grow_cost - 0.5) < 1e-6  # checkpoint 60 at 4.9, launched at 5.4
    assert s.ok and s.total_steps == LIMP_STEPS and s.charged == 0
    out = " ".join(text(render(s)).split())
    assert "limped 3.1s on 3 of 4 slices: the equal of 2.3s of training at full size" in out, out
    assert "growing back onto all 4 at checkpoint step 60 cost 500ms" in out, out
    assert "result: ok: 2/2 disruptions recovered, final step 100/100" in out, out
    assert "four disruptions" not in out


def test_a_limp_that_never_grew_back_is_not_ok() -> None:
    played, events, attempts, c = limp_run(grew=False)
    s = summarize(played, [a.title for a in LIMP], events, attempts, c, FAST, done=False,
                  how_it_ended="the demo's deadline (60s) passed", steps=LIMP_STEPS, limp=True)
    assert s.limp is not None and s.limp.why == "the job never grew back onto all its slices"
    assert s.limp.grow_step is None and abs(s.limp.seconds - (4.2 - 1.7)) < 1e-6  # limping until the journal's end
    assert not s.ok and [o.recovered for o in s.outcomes] == [True, False]
    out = " ".join(text(render(s)).split())
    assert "not recovered: the limp: the job never grew back onto all its slices" in out, out
    assert "not recovered: slice back: grow to 4: the job was never relaunched" in out, out


def test_the_four_disruption_story_has_no_limp_line() -> None:
    maint = ACTS[0]
    s = summarize([Played(maint, at(1.6), mark=1)], [maint.title], [ev(1, 0.0, "launch"), ev(2, 8.0, "done")],
                  [attempt(1, 0.0, 2.2, None), attempt(2, 4.0, 8.0, 20, outcome="success")],
                  ckpts((10, 1.0), (20, 1.5), (105, 8.0)), FAST, done=True, how_it_ended="job done")
    assert s.limp is None and s.ok
    out = " ".join(text(render(s)).split())
    assert "limped" not in out and "packs four disruptions into a minute" in out


SPARE = story(FAST, spare=True)
SLOTS = ("demo-0", "demo-1", "demo-2", "demo-3")


def spare_run(remade: bool = True) -> tuple[list[Played], list[JournalEvent], list[AttemptRow], dict[int, datetime]]:
    """The spare's story by hand: demo-1 preempted at 1.6 s; the tick stamped 1.7 (done acting at
    2.0) swaps demo-4 into its place and relaunches from checkpoint 20; demo-1 deleted in the tick
    stamped 2.5 (done at 2.6) and created in the one stamped 3.0 (done at 3.1); the tick stamped
    3.4 (done at 3.5) says it can stand in again, 1.7 s after the swap; the job done at 8.0."""
    played = [Played(SPARE[0], at(1.6), mark=1)]
    events = [ev(1, 0.0, "launch"), ev(2, 1.7, "attempt_end", attempt=1),
              ev(3, 1.7, "slices", out=[], in_use=4, of=4, on=["demo-0", "demo-4", "demo-2", "demo-3"],
                 spares=["demo-1"]),
              ev(4, 1.7, "launch"), ev(5, 2.5, "spare_remade", node="demo-1", create=False)]
    if remade:
        events += [ev(6, 3.0, "spare_remade", node="demo-1", create=True),
                   ev(8, 3.4, "spare_back", node="demo-1", seconds=1.7)]
    events.append(ev(7, 8.0, "done"))
    attempts = [attempt(1, 0.0, 1.7, None), attempt(2, 1.7, 8.0, 20, outcome="success")]
    c = ckpts((10, 1.0), (20, 1.3), (30, 2.6), (60, 4.9), (100, 8.0))
    return played, events, attempts, c


def spare_summary(events: list[JournalEvent], remade: bool = True,
                  swapped: tuple[tuple[str, str], ...] = (("demo-1", "demo-4"),)) -> Summary:
    played, _, attempts, c = spare_run(remade)
    return summarize(played, [a.title for a in SPARE], events, attempts, c, FAST, done=True, how_it_ended="job done",
                     tick_end={at(1.7): at(2.0), at(2.5): at(2.6), at(3.0): at(3.1), at(3.4): at(3.5)}, steps=100,
                     swapped=swapped, slots=SLOTS)


def test_the_swap_says_what_the_spare_did_and_that_the_lost_slice_was_made_again() -> None:
    s = spare_summary(spare_run()[1])
    [loss] = s.outcomes
    # preempted at 1.6 (step 20 + 0.3 s / 0.03 s, capped at 29), relaunched on the spare from 20 by 2.0
    assert (loss.recovered, loss.charged, loss.steps_lost) == (True, 0, 9)
    assert abs(loss.resume - 0.4) < 1e-6  # type: ignore[operator]
    sw = s.swap
    assert sw is not None and not sw.why and s.limp is None
    assert (sw.lost, sw.spare, sw.slice_id, sw.job_path) == ("demo-1", "demo-4", 1, ())
    # from the loss: the swap's tick done at 2.0, the delete's at 2.6, the create's at 3.1, back at 3.5
    assert [round(t, 6) for t in (sw.swapped, sw.deleted, sw.created, sw.ready)] == [0.4, 1.0, 1.5, 1.9]  # type: ignore[arg-type]
    assert sw.spared == 1.7
    assert s.ok and s.charged == 0
    out = " ".join(text(render(s)).split())
    assert ("demo-1 was lost: 400ms after the loss tpuwatch had swapped spare demo-4 into its place (slice 1) and "
            "the job trained again there from its newest complete checkpoint, 400ms after the loss: 9 steps lost "
            "(those since that checkpoint), nothing charged to max_restarts. It did not wait for demo-1") in out, out
    assert ("was deleted 1.0s after the loss and created again from [tpu.spec] 1.5s after it, in the background while "
            "the job trained; it could stand in again 1.9s after the loss, the job's spare from then on (the swap "
            "spared the job 1.7s of waiting for it).") in out, out
    assert ("The job waited for no delete or create: tpuwatch deleted and created no slice it ran on, only demo-1 "
            "once idle, to make it again.") in out, out
    assert "result: ok: 1/1 disruptions recovered, final step 100/100" in out, out
    assert "limped" not in out and "packs a slice's loss and its remake into seconds" in out, out


def test_a_swap_whose_lost_slice_was_never_made_again_or_that_touched_the_job_is_not_ok() -> None:
    s = spare_summary(spare_run(remade=False)[1], remade=False)
    assert s.swap is not None and s.swap.why == "demo-1 was never created again" and not s.ok
    out = " ".join(text(render(s)).split())
    assert "not recovered: the swap: demo-1 was never created again" in out, out
    assert "created again from [tpu.spec]" not in out and "result: FAILED" in out, out

    never_back = [e for e in spare_run()[1] if e.kind != "spare_back"]
    s = spare_summary(never_back)
    assert s.swap is not None and s.swap.why == "demo-1 never could stand in for a slice again" and not s.ok

    touched = [*spare_run()[1], ev(9, 4.0, "delete", reason="deleting demo-0")]
    s = spare_summary(touched)
    assert s.swap is not None and s.swap.job_path and not s.ok
    out = " ".join(text(render(s)).split())
    assert "not recovered: the swap: tpuwatch deleted or created a slice the job ran on" in out, out
    assert "waited for no delete" not in out, out

    s = spare_summary(spare_run()[1], swapped=())
    assert s.swap is not None and s.swap.why == "no spare was swapped in" and not s.ok
    assert "not recovered: the swap: no spare was swapped in" in " ".join(text(render(s)).split())


def test_a_swap_in_a_tick_stamped_just_before_the_loss_counts_to_that_tick_s_end() -> None:
    # the tick that saw demo-1 preempted began (and stamped its events) at 1.55, before the loss
    # at 1.6, and finished acting at 2.0
    played, events, attempts, c = spare_run()
    early = [JournalEvent(e.id, at(1.55), e.kind, e.reason, e.data) if e.time == at(1.7) else e for e in events]
    s = summarize(played, [a.title for a in SPARE], early, [attempt(1, 0.0, 1.55, None),
                                                            attempt(2, 1.55, 8.0, 20, outcome="success")],
                  c, FAST, done=True, how_it_ended="job done", tick_end={at(1.55): at(2.0)}, steps=100,
                  swapped=(("demo-1", "demo-4"),), slots=SLOTS)
    assert s.swap is not None and s.swap.swapped is not None and abs(s.swap.swapped - 0.4) < 1e-6, s.swap
    assert s.ok
