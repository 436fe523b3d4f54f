"""tpuwatch.report: where wall time went, on hand-built journals whose answers are worked out by hand.

Times are seconds after T0. The pace the report learns is 20 s per step in every journal here
(checkpoints 10 steps and 200 s apart), so an attempt's start-up is the time to its first
checkpoint less 20 s for each step it made meanwhile.
"""

from __future__ import annotations

import ast
import importlib.util
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.journal import AttemptRow, JournalEvent
from tpuwatch.report import CATEGORIES, ML_GOODPUT_BUCKETS, compute

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=timezone.utc)
TERMINATE = ("attempt 1: worker 0 exit code 143 (SIGTERM), ended by a disruption (audit tpu.nodes.terminate "
             "(maintenance) at 2026-11-01T08:13:20+00:00)")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


class Journal:
    """Events and attempts as `Journal.events()` and `Journal.attempts()` return them."""

    def __init__(self) -> None:
        self.events: list[JournalEvent] = []
        self.attempts: list[AttemptRow] = []
        self.phase: str | None = None

    def event(self, s: float, kind: str, reason: str = "", **data: Any) -> None:
        self.events.append(JournalEvent(len(self.events) + 1, at(s), kind, reason, data))

    def to(self, s: float, phase: str) -> None:
        self.event(s, "phase", f"{self.phase} -> {phase}", **{"from": self.phase, "to": phase, "row": "x"})
        self.phase = phase

    def ckpt(self, s: float, attempt: int, step: int) -> None:
        self.event(s + 5, "checkpoint", f"step {step}", attempt=attempt, step=step, time=at(s).isoformat())

    def attempt(self, n: int, start: float, end: float | None, start_step: int | None, end_step: int | None,
                outcome: str | None, charged: bool | None = False, exit_code: int | None = None,
                reason: str = "") -> None:
        self.attempts.append(AttemptRow(n, at(start), None if end is None else at(end), "id1", start_step,
                                        end_step, outcome, charged, exit_code, reason))


def story() -> Journal:
    """A disruption the node does not heal from (recreated through a stockout), a segfault, done."""
    j = Journal()
    j.to(0, "idle")
    j.to(0, "running")
    j.attempt(1, 0, 800, None, 30, "disruption", reason=TERMINATE, exit_code=143)
    for s, step in ((300, 10), (500, 20), (700, 30)):
        j.ckpt(s, 1, step)
    j.to(800, "waiting_node")
    j.event(2000, "delete", "node REPAIRING for 20m: deleting it to create it again")
    j.to(2000, "deleting")
    j.event(2100, "create", "node pod is deleted; creating it")
    j.to(2100, "creating")
    j.to(2200, "queued")
    j.to(2600, "creating")
    j.to(2700, "idle")
    j.to(2750, "waiting_node")  # the new node is CREATING
    j.to(2900, "idle")
    j.to(2900, "running")
    j.attempt(2, 2900, 3400, 30, 50, "failure", True, 139,
              "attempt 2: worker 1 exit code 139 (SIGSEGV) after 8m20s with no disruption in sight")
    j.ckpt(3150, 2, 40)
    j.ckpt(3350, 2, 50)
    j.to(3400, "backoff")
    j.to(3460, "running")
    j.attempt(3, 3460, 3800, 50, 60, "success", reason="attempt 3: worker 0 exited 0")
    j.ckpt(3700, 3, 60)
    j.to(3800, "done")
    j.event(3800, "done", "job done")
    j.to(3900, "done")  # nothing after the end counts
    return j


def test_every_second_of_the_story_is_in_the_category_worked_out_by_hand() -> None:
    j = story()
    r = compute("pod", j.events, j.attempts, now=at(99999))
    assert r.state == "done" and r.start == T0 and r.end == at(3800) and r.wall == 3800
    assert r.step_seconds == pytest.approx(20.0)
    assert r.seconds() == pytest.approx({
        "productive": 600 + 400 + 300,  # 100..700, 2950..3350, 3500..3800
        "startup": 100 + 50 + 40,  # 300 - 10*20, 250 - 10*20, 240 - 10*20
        "lost": 100,  # attempt 1's step 30 at 700 to the terminate at 800
        "heal": 1200,  # 800..2000: REPAIRING, waited out to repair_timeout
        "recreate": 900,  # delete, create, queued 400 s, create, the new node's boot until 2900
        "hung": 0,
        "charged": 50 + 60,  # attempt 2 after step 50, then the backoff
        "person": 0,
    })
    assert sum(r.seconds().values()) == pytest.approx(r.wall)
    assert r.goodput == pytest.approx(1300 / 3800)
    assert r.attempts == 3


def test_the_top_causes_are_the_incidents_costliest_first() -> None:
    j = story()
    r = compute("pod", j.events, j.attempts, now=at(99999))
    got = [(c.what, c.at, c.seconds) for c in r.causes]
    assert got == [
        ("disruption: audit tpu.nodes.terminate (maintenance), node recreated", at(800), 100 + 1200 + 900 + 50),
        ("failure: exit code 139 (SIGSEGV)", at(3400), 50 + 60 + 40),
        ("before the first launch", T0, 100),
    ]
    assert r.causes[0].parts == pytest.approx(
        {"lost": 100, "heal": 1200, "recreate": 900, "startup": 50, **dict.fromkeys(
            ("productive", "hung", "charged", "person"), 0)})


def test_the_timeline_marks_checkpoints_ends_recreates_and_the_end() -> None:
    j = story()
    r = compute("pod", j.events, j.attempts, now=at(99999))
    kinds = [(m.kind, m.time) for m in r.marks if m.kind != "checkpoint"]
    assert kinds == [("disruption", at(800)), ("recreate", at(2000)), ("failure", at(3400)), ("end", at(3800))]
    assert [m.time for m in r.marks if m.kind == "checkpoint"] == [at(s) for s in (300, 500, 700, 3150, 3350, 3700)]
    spans = [(s.category, s.start, s.end) for s in r.spans]
    assert spans == sorted(spans, key=lambda s: s[1])
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:], strict=False)), "spans leave no hole and never overlap"


def test_since_keeps_only_the_window_and_goodput_is_over_it() -> None:
    j = story()
    now = at(5000)
    r = compute("pod", j.events, j.attempts, now=now, since=at(2900))
    assert r.start == at(2900) and r.wall == 900
    assert r.seconds()["productive"] == pytest.approx(400 + 300)
    assert r.seconds()["heal"] == 0 and r.seconds()["recreate"] == 0
    assert r.goodput == pytest.approx(700 / 900)
    assert r.attempts == 2
    assert all(m.time >= at(2900) for m in r.marks)


def test_a_hung_attempt_a_person_and_a_job_still_running() -> None:
    j = Journal()
    j.to(0, "running")
    j.attempt(1, 0, 2100, None, 20, "failure", True, None,
              "attempt 1: hung: no new checkpoint for 30m00s while every worker ran (recovery.hang_timeout 30m00s)")
    j.ckpt(200, 1, 10)
    j.ckpt(400, 1, 20)
    j.to(2100, "backoff")
    j.to(2110, "running")
    j.attempt(2, 2110, 2500, 20, None, "disruption", reason="attempt 2: the attempt ended, ended by a "
              "disruption (node state STOPPED at 2026-11-01T08:41:40+00:00)")
    j.to(2500, "paused")
    j.to(4500, "idle")
    j.to(4500, "running")
    j.attempt(3, 4500, None, 20, None, None, None)  # still running, no checkpoint yet
    r = compute("pod", j.events, j.attempts, now=at(5000))
    assert r.state == "running" and r.wall == 5000
    # pace 20 s/step: attempt 1's start-up is 200 - 10*20 = 0; attempts 2 and 3 saved nothing and
    # get the median start-up measured (0 s). Attempt 2's 390 s are lost (no checkpoint before the
    # stop); attempt 3 still runs: productive so far.
    assert r.seconds() == pytest.approx({
        "productive": 400 + 500, "startup": 0, "lost": 390, "heal": 0, "recreate": 0,
        "hung": 1700, "charged": 10, "person": 2000})
    assert [c.seconds for c in r.causes] == pytest.approx([390 + 2000, 1700 + 10])
    assert [c.what for c in r.causes] == ["disruption: node state STOPPED", "hung: no new checkpoint"]
    assert {m.kind for m in r.marks} >= {"hung", "disruption", "person"}


def test_a_failed_start_is_charged_whole() -> None:
    j = Journal()
    j.to(0, "running")
    j.attempt(1, 0, 600, None, 20, "disruption", reason=TERMINATE)
    j.ckpt(300, 1, 10)  # start-up 300 - 200 = 100
    j.ckpt(500, 1, 20)
    j.to(600, "idle")
    j.to(620, "running")
    j.attempt(2, 620, 700, 20, None, "failed_start", True, 1, "attempt 2: worker 0 exit code 1 after 1m20s, "
              "before recovery.min_uptime (2m00s): a failed start")
    j.to(700, "failed")
    r = compute("pod", j.events, j.attempts, now=at(9999))
    assert r.state == "failed" and r.end == at(700)
    secs = r.seconds()
    assert secs["startup"] == pytest.approx(100), "attempt 1's, measured"
    assert secs["lost"] == 100 and secs["heal"] == 20
    assert secs["charged"] == 80, "a failed start is the failure's time, all of it"
    assert [(c.what, c.seconds) for c in r.causes] == [
        ("disruption: audit tpu.nodes.terminate (maintenance)", 100 + 20), ("before the first launch", 100),
        ("failed start: exit code 1", 80)]


def test_a_journal_without_phase_or_checkpoint_records_still_adds_up() -> None:
    """A journal written before phases and checkpoints were recorded: attempts and end events only."""
    j = Journal()
    j.event(0, "launch", "launching attempt 1")
    j.attempt(1, 0, 1000, None, 50, "success", reason="attempt 1: worker 0 exited 0")
    j.event(1000, "done", "job done")
    r = compute("pod", j.events, j.attempts, now=at(5000))
    assert r.end == at(1000) and r.state == "done"
    assert r.seconds()["productive"] == 1000 and r.goodput == 1.0
    assert r.step_seconds is None and any("start-up not measured" in n for n in r.notes)


def test_an_empty_journal_is_a_report_of_nothing() -> None:
    r = compute("pod", [], [], now=T0)
    assert r.start is None and r.wall == 0 and r.goodput is None and r.spans == ()


def test_json_names_every_category_with_its_label() -> None:
    j = story()
    d = compute("pod", j.events, j.attempts, now=at(99999)).as_dict()
    assert [c["id"] for c in d["categories"]] == list(CATEGORIES)
    assert d["goodput"] == pytest.approx(1300 / 3800, abs=1e-6)
    assert d["top_causes"][0]["parts"] == {"lost": 100, "heal": 1200, "recreate": 900, "startup": 50}
    assert d["wall_seconds"] == 3800


# The enums of ml-goodput-measurement 0.2.3 (ml_goodput_measurement/src/goodput_utils.py), the
# version docs/report.md names; the library is not a dependency, so its names are written here.
ML_GOODPUT_0_2_3 = {"GoodputType.TOTAL"} | {f"BadputType.{n}" for n in (
    "TPU_INITIALIZATION", "TRAINING_PREP", "PROGRAM_STARTUP", "DATA_LOADING_SYNC", "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "CUSTOM_BADPUT_EVENTS", "OTHER", "ELASTIC_SLICE_DOWN",
    "ELASTIC_SCALE_UP", "ELASTIC_REINITIALIZATION")}


def test_json_maps_every_category_to_the_goodput_librarys_buckets() -> None:
    j = story()
    d = compute("pod", j.events, j.attempts, now=at(99999)).as_dict()
    assert {c["id"]: tuple(c["ml_goodput_buckets"]) for c in d["categories"]} == ML_GOODPUT_BUCKETS
    assert ML_GOODPUT_BUCKETS.keys() == CATEGORIES.keys()
    used = {b for bs in ML_GOODPUT_BUCKETS.values() for b in bs}
    assert used <= ML_GOODPUT_0_2_3, used - ML_GOODPUT_0_2_3
    # Productive time is the library's goodput, and nothing else is.
    assert [k for k, bs in ML_GOODPUT_BUCKETS.items() if "GoodputType.TOTAL" in bs] == ["productive"]
    assert ML_GOODPUT_BUCKETS["productive"] == ("GoodputType.TOTAL",)
    # The losses both name are mapped: disruption's wasted progress and recovery, start-up, restore.
    assert {"BadputType.WASTED_PROGRESS_FROM_DISRUPTION", "BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
            "BadputType.PROGRAM_STARTUP", "BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"} <= used


def test_the_goodput_librarys_names_are_its_own_where_it_is_installed() -> None:
    """Read from the library's source, not imported (its package pulls in Google Cloud clients)."""
    spec = importlib.util.find_spec("ml_goodput_measurement")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ml-goodput-measurement is not installed (not a dependency of tpuwatch)")
    source = Path(next(iter(spec.submodule_search_locations))) / "src" / "goodput_utils.py"
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in ("GoodputType", "BadputType"):
            names |= {f"{node.name}.{t.id}" for s in node.body if isinstance(s, ast.Assign)
                      for t in s.targets if isinstance(t, ast.Name)}
    assert "BadputType.WASTED_PROGRESS_FROM_DISRUPTION" in names, source
    assert {b for bs in ML_GOODPUT_BUCKETS.values() for b in bs} <= names


def test_a_checkpoint_seen_only_by_the_next_launch_is_placed_at_its_save_time() -> None:
    """No tick saw attempt 1's step 30 while it ran; the launch of attempt 2 records it, with the
    time it was saved (700): the work lost is still 800 - 700, not 0."""
    j = story()
    j.events = [e for e in j.events if not (e.kind == "checkpoint" and e.data["step"] == 30)]
    j.event(2900, "launch", "launching attempt 2", attempt=2,
            checkpoint={"path": "/ck/30", "step": 30, "layout": "orbax", "time": at(700).isoformat()})
    r = compute("pod", j.events, j.attempts, now=at(99999))
    assert r.seconds()["lost"] == pytest.approx(100)
    assert r.seconds()["productive"] == pytest.approx(1300)
    assert at(700) in [m.time for m in r.marks if m.kind == "checkpoint"]
    j.events = j.events[:-1]  # without it, the step is taken as saved at the attempt's end
    assert compute("pod", j.events, j.attempts, now=at(99999)).seconds()["lost"] == 0


def test_the_policy_s_own_attempt_ends_get_their_causes() -> None:
    """The reasons the policy writes (not hand-written ones): a hang, a segfault, a preemption."""
    from dataclasses import replace

    from policy_support import CFG, ckpt, exited, node, obs, run_mem, running, tick

    from tpuwatch.report import cause, hung

    def row(d: Any) -> AttemptRow:
        e = d.ended[0]
        return AttemptRow(e.attempt, e.start, e.end, e.node_id, e.start_step, e.end_step, e.outcome, e.charged,
                          e.exit_code, e.reason)

    m = run_mem(start=0.0, step=100)
    stuck = row(tick(obs(probes=running(1), checkpoint=ckpt(100)), m, now=7200,
                     cfg=replace(CFG, hang_timeout=7200.0, stable_run=36000.0)))
    assert hung(stuck) and cause(stuck) == "hung: no new checkpoint"
    crash = row(tick(obs(probes=exited({1: 139}), checkpoint=ckpt(100)), m, now=7200))
    assert not hung(crash) and cause(crash) == "failure: exit code 139 (SIGSEGV)"
    gone = row(tick(obs(node("PREEMPTED"), probes=None), m, now=7200))
    assert gone.outcome == "disruption" and cause(gone) == "disruption: node state PREEMPTED"


def test_an_attempt_the_runtime_called_hung_is_counted_as_hung() -> None:
    from tpuwatch.report import cause, hung

    def row(reason: str) -> AttemptRow:
        return AttemptRow(number=3, start=T0, end=T0, node_id="n", start_step=1, end_step=1,
                          outcome="failure", charged=True, exit_code=None, reason=reason)

    said = row("attempt 3: hung: the runtime says so (megascale_hang in worker 1's log: Megascale hang detected)")
    silent = row("attempt 3: hung: no new checkpoint for 10m00s and no output for 10m00s while every worker ran")
    assert hung(said) and cause(said) == "hung: the runtime says so"
    assert hung(silent) and cause(silent) == "hung: no new checkpoint"
    assert not hung(row("attempt 3: worker 0 exit code 1 after 2h with no disruption in sight"))


def test_a_job_that_limped_shows_its_hours_on_fewer_slices_and_the_training_they_stood_for() -> None:
    """Limped on 3 of 4 slices from 1000 s to 2200 s, on 2 of 4 from 2200 s to 2600 s, back on
    all 4 then: 1600 s limping, standing for 1200 * 3/4 + 400 * 2/4 = 1100 s at full size."""
    j = story()
    j.event(1000, "slices", "limping", out=["np-1"], in_use=3, of=4)
    j.event(2200, "slices", "limping", out=["np-1", "np-2"], in_use=2, of=4)
    j.event(2600, "slices", "growing back", out=[], in_use=4, of=4)
    report = compute("pod", j.events, j.attempts, now=at(4000))
    limping = report.as_dict()["limping"]
    assert limping["seconds"] == 1600 and limping["training_seconds"] == 1100
    assert [(s["slices"], s["of"]) for s in limping["stretches"]] == [(3, 4), (2, 4)]
    from tpuwatch.report import text

    assert "limping: 26m40s on fewer slices (down to 2 of 4), 2 time(s)" in text(report), text(report)
    # a window that starts inside a stretch keeps only its part of it
    assert compute("pod", j.events, j.attempts, now=at(4000), since=at(2400)).as_dict()["limping"]["seconds"] == 200
    assert compute("pod", story().events, story().attempts, now=at(4000)).as_dict()["limping"]["seconds"] == 0


def test_a_job_with_spares_shows_their_idle_time_its_swaps_and_the_waits_they_spared() -> None:
    """One spare of 4 chips all along; swaps at 1000 s and 3000 s; the first node swapped out
    could stand in again 900 s after its swap (its heal): the wait the swap spared the job."""
    from tpuwatch.report import chips, text

    j = story()
    j.event(1000, "slices", "swapped for a spare", out=[], in_use=4, of=4, row="swap")
    j.event(1900, "spare_back", "np-1 can stand in again", node="np-1", seconds=900.0)
    j.event(2000, "slices", "limping", out=["np-2"], in_use=3, of=4, row="limp")
    j.event(3000, "slices", "swapped for a spare", out=[], in_use=4, of=4, row="swap")
    report = compute("pod", j.events, j.attempts, now=at(4000), spares=1, spare_chips=4)
    wall = report.wall
    assert report.as_dict()["spares"] == {"count": 1, "idle_node_seconds": round(wall, 3),
                                          "idle_chip_hours": round(4 * wall / 3600, 3), "swaps": 2,
                                          "waits_spared_seconds": 900.0}
    assert "spares: 1 idle all along" in text(report) and "2 swap(s) onto them, which spared the job 15m00s" in text(
        report), text(report)
    assert compute("pod", j.events, j.attempts, now=at(4000)).as_dict()["spares"] is None  # no spares: no account
    assert (chips("v5p-16"), chips("v4-8"), chips("v5litepod-8"), chips("v6e-4"), chips("tpu9-8"), chips("")) == (
        8, 4, 8, 4, 0, 0)
