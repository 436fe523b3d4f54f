"""The watch dashboard and the plain-line view, rendered from TickReports.

The reports are built from the real model and policy types (a node snapshot, worker probes, a
checkpoint, the policy's Memory and Decision); rendering is checked on a rich Console the size
of a terminal, so width, height and colour are what a person would see.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from tpuwatch.journal import JournalEvent
from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    NodeSnapshot,
    UpcomingMaintenance,
    WorkerEndpoint,
    WorkerProbe,
)
from tpuwatch.policy import Attempt, Boot, Budgets, Decision, Memory, Phase, PolicyConfig, Wait
from tpuwatch.tick import TickReport
from tpuwatch.ui.dashboard import (
    LineView,
    Progress,
    dashboard,
    short_path,
    state_line,
    worker_ranges,
    workers_line,
)
from tpuwatch.ui.tickview import tick_dict, tick_line

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
PCFG = PolicyConfig(job="llm", tpu_name="llm-pod", zones=("us-central2-b",))
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ llm (state|audit|did|warning|note): \S")


def node(state: str = "READY", health: str = "HEALTHY", workers: int = 4, desc: str = "") -> NodeSnapshot:
    return NodeSnapshot(
        name="llm-pod", project="p", zone="us-central2-b", id="111", create_time=T0, state=state,
        health=health, health_description=desc, maintenance_time=None,
        workers=tuple(WorkerEndpoint(i, f"10.0.0.{i}", "") for i in range(workers)),
    )


MISSING = node("DELETING")  # stands for "no node" in report()


def report(*, n: NodeSnapshot | None = None, phase: Phase = Phase.RUNNING, attempt: int = 3,
           probes: Sequence[WorkerProbe] | None = None, ck: Checkpoint | None = None,
           summary: str = "attempt 3 running on 4 worker(s)", at: datetime = T0, restarts: int = 1,
           events: Sequence[AuditEvent] = (), done: Sequence[str] = ()) -> TickReport:
    mem = Memory(phase=phase, zone="us-central2-b",
                 attempt=Attempt(number=attempt, start=T0 - timedelta(minutes=3, seconds=12)),
                 budgets=Budgets(restarts=restarts, disruptions=2))
    decision = Decision(actions=(Wait(None, "running"),), memory=mem, summary=summary,
                        exit_code=1 if phase is Phase.FAILED else 0, row="running")
    if probes is None:
        probes = [WorkerProbe(i, "running", attempt) for i in range(4)]
    snapshot = None if n is MISSING else (n if n is not None else node())
    return TickReport(at, snapshot, tuple(probes), ck, tuple(events), decision,
                      done=tuple(done))


def render(renderable: object, *, color: bool = False) -> str:
    console = Console(width=80, height=40, file=io.StringIO(), force_terminal=color,
                      color_system="standard" if color else None, legacy_windows=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def events(n: int) -> list[JournalEvent]:
    reason = "node REPAIRING for 31m, longer than recovery.repair_timeout (30m): deleting it " * 3
    return [JournalEvent(i, T0 + timedelta(seconds=i), "delete" if i % 2 else "attempt_end", reason,
                         {"attempt": 1, "charged": False}) for i in range(n)]


def test_the_dashboard_fits_80_columns_and_a_24_row_terminal_even_for_a_big_slice() -> None:
    ck = Checkpoint("gs://a-long-bucket-name/experiments/run-2024-05-01/checkpoints/12000", 12000,
                    "orbax", T0 - timedelta(seconds=95))
    probes = [WorkerProbe(i, "running", 3) for i in range(64)]
    probes[17] = WorkerProbe(17, "exited", 3, 139)
    probes[40] = WorkerProbe(40, "unreachable", None, detail="ssh: connect to host 10.0.0.40 port 22: "
                                                             "Connection timed out\nmore")
    r = report(n=node(workers=64, desc="The TPU had a maintenance event at 2024-05-01T11:00:00Z " * 3),
               probes=probes, ck=ck, summary="a very long decision summary " * 12)
    text = render(dashboard(r, "llm", PCFG, events(9), T0 + timedelta(seconds=30), T0, rate=12.34))
    lines = text.rstrip("\n").split("\n")
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    assert len(lines) <= 20, text  # room left on a 24-row terminal for the story/notes above it
    assert lines[0].startswith("╭─ tpuwatch · llm") and lines[0].endswith("╮") and len(lines[0]) == 80
    body = "\n".join(lines)
    assert "READY / HEALTHY" in body
    assert "attempt 3, up 3m12s" in body  # durations are human
    assert "step 12000, saved 1m35s ago, 12.3 steps/s" in body
    assert "0-16,18-39,41-63 running (attempt 3)" in body  # 64 workers in one line
    assert "17 exited 139" in body and "40 unreachable" in body
    assert "restarts 1/5" in body and "recreates 0/3" in body
    assert "next look in 30s" in body
    assert body.count("node REPAIRING for 31m") == 5  # the last five events, one line each


def test_an_announced_maintenance_shows_its_window_in_local_and_relative_time_and_the_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9, no daylight saving
    time.tzset()
    try:
        um = UpcomingMaintenance("SCHEDULED", "PENDING", True, T0 + timedelta(hours=3, minutes=5),
                                 T0 + timedelta(hours=4, minutes=5), T0 + timedelta(days=2))
        big = node(workers=64, desc="The TPU had a maintenance event at 2024-05-01T11:00:00Z " * 3)
        r = report(n=replace(big, upcoming_maintenance=um), summary="a very long decision summary " * 12)
        text = render(dashboard(r, "llm", PCFG, events(9), T0 + timedelta(seconds=30), T0))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 20 and all(len(line) <= 80 for line in lines), text
    body = " ".join(line.strip("│ ") for line in lines)
    # 15:05Z is 00:05 the next day in Tokyo
    assert "maint.     SCHEDULED PENDING in 3h05m: Thu 02 May 00:05 JST to 01:05 JST" in text, text
    assert "may be started early; starts it after the job's next checkpoint, then resumes the job from there; " \
           "not charged" in body, body
    # with maintenance.start_early = false: the notice goes to the job
    r = report(n=replace(node(), upcoming_maintenance=um))
    body = " ".join(line.strip("│ ") for line in render(dashboard(r, "llm", replace(PCFG, start_early=False), [],
                                                                  None, T0)).split("\n"))
    assert "may be started early; signals the job on the ~60 s notice (maintenance.notify_signal)" in body, body
    # cannot be started early once under way
    r = report(n=replace(node(), upcoming_maintenance=replace(um, status="ONGOING")))
    body = render(dashboard(r, "llm", PCFG, [], None, T0))
    assert "cannot be started early; waits for the node" in body


def test_each_colour_means_one_thing() -> None:
    ok = render(dashboard(report(), "llm", PCFG, [], None, T0), color=True)
    assert "\x1b[32mREADY" in ok and "\x1b[32mHEALTHY" in ok  # green: fine
    assert "\x1b[32mrunning" in ok
    repairing = render(dashboard(report(n=node("REPAIRING", "UNHEALTHY_MAINTENANCE"), phase=Phase.WAITING_NODE,
                                        probes=[]), "llm", PCFG, [], None, T0), color=True)
    assert "\x1b[33mREPAIRING" in repairing and "\x1b[33mwaiting for the node" in repairing  # yellow
    broken = render(dashboard(report(n=node("PREEMPTED", "HEALTH_UNSPECIFIED"), phase=Phase.FAILED,
                                     probes=[WorkerProbe(0, "exited", 3, 1)]), "llm", PCFG, [], None, T0),
                    color=True)
    assert "\x1b[31mPREEMPTED" in broken and "\x1b[31mfailed" in broken  # red: needs a person
    assert "\x1b[31mexited 1" in broken
    # A worker that finished cleanly is not an error.
    finished = render(dashboard(report(probes=[WorkerProbe(0, "exited", 3, 0)], phase=Phase.DONE), "llm", PCFG,
                                [], None, T0), color=True)
    assert "\x1b[32mexited 0" in finished


def test_progress_is_steps_per_second_over_the_checkpoints_of_the_running_attempt() -> None:
    p = Progress()
    start = T0
    resumed_from = Checkpoint("/c/100", 100, "orbax", T0 - timedelta(minutes=5))
    p.update(2, start, resumed_from, T0)
    assert p.rate() is None  # written before this attempt began: not its progress
    p.update(2, start, Checkpoint("/c/110", 110, "orbax", T0 + timedelta(seconds=10)), T0)
    assert p.rate() is None  # one checkpoint: no rate yet
    p.update(2, start, Checkpoint("/c/110", 110, "orbax", T0 + timedelta(seconds=10)), T0)  # seen again
    p.update(2, start, Checkpoint("/c/130", 130, "orbax", T0 + timedelta(seconds=20)), T0)
    assert p.rate() == 2.0
    p.update(3, start + timedelta(minutes=1), Checkpoint("/c/130", 130, "orbax", T0 + timedelta(seconds=20)), T0)
    assert p.rate() is None  # a new attempt starts over


def test_small_helpers() -> None:
    assert worker_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert worker_ranges([3]) == "3"
    assert short_path("/tmp/x/ckpt/60") == "/tmp/x/ckpt/60"
    assert short_path("gs://bucket/very/long/path/to/the/checkpoints/60") == "…/checkpoints/60"
    line = workers_line([WorkerProbe(0, "running", 2), WorkerProbe(1, "exited", 2, 139),
                         WorkerProbe(2, "running", 2), WorkerProbe(3, "absent")])
    assert line.plain == "0,2 running (attempt 2) · 1 exited 139 (attempt 2) · 3 absent"


def test_plain_lines_are_one_parseable_timestamped_line_per_change() -> None:
    out: list[str] = []
    view = LineView("llm", out=out.append, err=out.append)
    ck1 = Checkpoint("/c/10", 10, "orbax", T0 + timedelta(seconds=1))
    ck2 = Checkpoint("/c/20", 20, "orbax", T0 + timedelta(seconds=6))
    view.show(report(ck=ck1, at=T0 + timedelta(seconds=2), done=["launched attempt 3 on 4/4 workers"]), T0)
    n = len(out)
    view.show(report(ck=ck1, at=T0 + timedelta(seconds=3)), T0)  # a quiet tick: nothing new
    assert len(out) == n
    view.show(report(ck=ck2, at=T0 + timedelta(seconds=7)), T0)  # a new checkpoint is a change
    ev = AuditEvent(time=T0 + timedelta(seconds=8), kind="terminate", node="llm-pod", worker=None,
                    method="tpu.nodes.terminate", reason="MAINTENANCE", insert_id="x", resource_name="")
    view.show(report(n=node("READY", "UNHEALTHY_MAINTENANCE"), phase=Phase.WAITING_NODE, ck=ck2,
                     at=T0 + timedelta(seconds=9), events=[ev]), T0)
    view.note("disruption 1/4: maintenance")
    assert all(LINE.match(line) for line in out), out
    kinds = [line.split()[2] for line in out]
    assert kinds == ["state:", "did:", "state:", "audit:", "state:", "note:"], out
    assert out[0].startswith("2024-05-01T12:00:02Z llm state: node READY/HEALTHY | running | attempt 3 | step 10")
    assert "step 20 (1s old, 2.0 steps/s)" in out[2]  # progress from the two checkpoints seen
    assert "reason=MAINTENANCE" in out[3]


def test_state_line_without_a_checkpoint() -> None:
    assert state_line(report(n=MISSING, phase=Phase.HALTED, summary="node llm-pod is missing")) == (
        "node missing | halted | attempt 3: node llm-pod is missing")


def test_workers_whose_keys_are_not_there_yet_say_so() -> None:
    """Right after a boot the workers refuse the login until the keys arrive: the dashboard
    shows why they are unreachable and the policy's word for it, not a bare "unreachable"."""
    from tpuwatch.policy import Observation, decide

    detail = ("login refused: worker 0 of llm-pod (10.0.0.0) refused the login as 'alice' with "
              "/home/alice/.ssh/google_compute_engine (Permission denied (publickey).)")
    probes = [WorkerProbe(i, "unreachable", None, detail=detail.replace("worker 0", f"worker {i}"),
                          login_refused=True) for i in range(4)]
    d = decide(Observation(node=node(), probes=tuple(probes)), Memory(zone="us-central2-b",
                                                                      boot=Boot(node_seen="111")),
               PCFG, T0 + timedelta(seconds=40))
    assert d.row == "keys_not_there_yet"
    r = report(phase=Phase.IDLE, probes=probes, summary=d.summary, at=T0 + timedelta(seconds=40))
    body = render(dashboard(r, "llm", PCFG, [], T0 + timedelta(seconds=50), T0))
    assert body.count("unreachable: login refused") == 4, body
    assert "keys not there yet" in body, body


def test_the_plan_names_the_time_to_the_next_checkpoint_when_the_interval_is_known() -> None:
    from tpuwatch.policy.maintenance import maintenance_plan

    um = UpcomingMaintenance("SCHEDULED", "PENDING", True, T0 + timedelta(days=7), None, None)
    assert maintenance_plan(um, watched=True, next_checkpoint_in=720).startswith(
        "starts it after the job's next checkpoint (~12m00s)")
    assert "notify_signal" in maintenance_plan(replace(um, can_reschedule=False), watched=True, next_checkpoint_in=720)


def test_several_jobs_get_a_row_each_and_the_one_in_trouble_its_details() -> None:
    from pathlib import Path

    from tpuwatch.ui.jobs import JobState, fleet_view

    ck = Checkpoint("gs://b/ck/1200", 1200, "orbax", T0 - timedelta(minutes=4))
    ok = JobState(Path("a.toml"), "llm", "watching", report=report(ck=ck), last_event="launch: attempt 3")
    sick = report(phase=Phase.WAITING_NODE, summary="waiting for the node to heal",
                  n=node("READY", "UNHEALTHY_MAINTENANCE"))
    healing = JobState(Path("b.toml"), "vit", "watching", report=replace(sick, pcfg=PCFG))
    broken = JobState(Path("c.toml"), "c", "config_error", error="recovery.poll_interval: not a duration",
                      exit_code=2)
    out = render(fleet_view([ok, healing], T0))
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in ("llm", "vit")}
    assert "running" in rows["llm"] and "1200" in rows["llm"] and "4m" in rows["llm"] and "launch" in rows["llm"]
    assert "waiting for the node" in rows["vit"] and "READY maintenance" in rows["vit"]
    assert "waiting for the node to heal" in out  # vit's dashboard below the table
    out = render(fleet_view([ok, healing, broken], T0))
    assert "recovery.poll_interval: not a duration" in out  # the config error comes first
    assert "waiting for the node to heal" not in out
    assert "3 jobs, 1 without trouble" in out


def test_a_multislice_job_shows_each_slice_with_its_state_and_workers_in_the_dashboard_and_json() -> None:
    from tpuwatch.model import combine_slices

    def part(name: str, state: str, health: str, base: int) -> NodeSnapshot:
        return replace(node(state, health, workers=2), name=name, id=str(base),
                       workers=tuple(WorkerEndpoint(i, f"10.0.{base}.{i}", "") for i in range(2)))

    both = combine_slices("llm-pod", [part("np-0", "READY", "HEALTHY", 1), part("np-1", "REPAIRING", "", 2)])
    assert both is not None
    r = report(n=both, probes=[WorkerProbe(0, "running", 3), WorkerProbe(1, "running", 3),
                               WorkerProbe(2, "unreachable", detail="slice 1 (np-1) is REPAIRING"),
                               WorkerProbe(3, "unreachable", detail="slice 1 (np-1) is REPAIRING")])
    body = render(dashboard(r, "llm", PCFG, events(2), T0 + timedelta(seconds=30), T0))
    assert "np-0 READY/HEALTHY (2 workers) · np-1 REPAIRING/- (2 workers)" in body, body
    assert "llm-pod (us-central2-b) REPAIRING" in body  # the job's node: the worst of its slices
    data = tick_dict(r)
    assert [(s["name"], s["state"], s["workers"]) for s in data["node"]["slices"]] == [
        ("np-0", "READY", [0, 1]), ("np-1", "REPAIRING", [2, 3])]
    assert [w["slice"] for w in data["workers"]] == [0, 0, 1, 1]
    assert "(np-0 READY/HEALTHY, np-1 REPAIRING/-)" in tick_line(r)
    one = tick_dict(report())
    assert "slices" not in one["node"] and "slice" not in one["workers"][0]


def test_a_job_with_spares_shows_each_and_why_it_cannot_stand_in_in_the_dashboard() -> None:
    from tpuwatch.model import combine_slices

    def part(name: str, state: str = "READY", owner: str = "llm") -> NodeSnapshot:
        return replace(node(state, "HEALTHY" if state == "READY" else "", workers=1), name=name, id=name,
                       labels={"tpuwatch-job": owner})

    both = combine_slices("llm-pod", [part("np-0"), part("np-1")])
    assert both is not None
    r = replace(report(n=both, probes=[WorkerProbe(0, "running", 3), WorkerProbe(1, "running", 3)]),
                spares=(("sp-0", part("sp-0")), ("sp-1", part("sp-1", "REPAIRING")), ("sp-2", None),
                        ("sp-3", part("sp-3", owner="other"))))
    body = render(dashboard(r, "llm", replace(PCFG, job="llm"), events(2), T0 + timedelta(seconds=30), T0))
    line = next(ln for ln in body.splitlines() if "spares" in ln)
    assert "sp-0 ready · sp-1 REPAIRING · sp-2 missing" in line, body
    assert "sp-3 not owned by" in body, body  # (the line wraps)
    assert "spares" not in render(dashboard(report(), "llm", PCFG, events(2), T0, T0))  # a job without spares


def test_a_job_of_a_spare_pool_shows_who_holds_each_node_and_why_an_idle_one_cannot_be_claimed() -> None:
    pcfg = replace(PCFG, spare_pool="v5p")
    r = replace(report(), pool=(("sp-0", "llm", ""), ("sp-1", "", ""), ("sp-2", "", "PREEMPTED")), pcfg=pcfg)
    body = " ".join(render(dashboard(r, "llm", pcfg, events(2), T0 + timedelta(seconds=30), T0)).split())
    assert "pool v5p sp-0 held by llm · sp-1 idle · sp-2 idle, PREEMPTED" in body, body
    data = tick_dict(r)
    assert data["spare_pool"]["nodes"] == [{"name": "sp-0", "held_by": "llm", "unclaimable": None},
                                           {"name": "sp-1", "held_by": None, "unclaimable": None},
                                           {"name": "sp-2", "held_by": None, "unclaimable": "PREEMPTED"}]


def test_a_watcher_whose_output_is_not_a_terminal_does_not_import_rich() -> None:
    # systemd's and cron's watchers print lines: rich is ~40 ms of every start they would not use
    code = ("import sys, types; from tpuwatch.commands.watch import _view; "
            "view = _view(types.SimpleNamespace(name='pod'), None, live=False, as_json=False); "
            "print(type(view).__name__, sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LineView", "[]"], out.stdout
