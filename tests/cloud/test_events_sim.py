"""`tpuwatch events` and the audit-log reader against the simulator's Logging API."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli_env, run

from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.sim.simulator import Simulator

FAST = RetryPolicy(multiplier=0.005, max_wait=0.05)


@pytest.fixture
def log_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    with Simulator(root=tmp_path / "sim", speed=600, seed=11, workers=False) as sim:
        for k, v in sim.env.items():
            monkeypatch.setenv(k, v)  # for the adapter used directly
        yield sim




def events_json(args: list[str], env: Mapping[str, str | None]) -> dict[str, Any]:
    code, out, err = run(["events", *args, "--json"], env)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def heal_cycle(sim: Simulator, node: str, **kw: Any) -> None:
    sim.world.maintenance(node, heal_after=60, **kw)
    sim.world.wait_node(node, "READY", health="HEALTHY")


def test_healed_maintenance_timeline(log_sim: Simulator, tmp_path: Path) -> None:
    log_sim.create_node("pod", "v4-16")
    log_sim.create_node("pod2")  # a name "nodes/pod" is a prefix of
    heal_cycle(log_sim, "pod", reason="HOST_ERROR")
    heal_cycle(log_sim, "pod2", reason="NOT_MINE")
    heal_cycle(log_sim, "pod", worker=1, reason="HW_FAULT")
    env = cli_env(log_sim, tmp_path)
    data = events_json(["pod"], env)
    got = [(e["kind"], e["worker"], e["reason"]) for e in data["events"]]
    assert got == [("terminate", None, "HOST_ERROR"), ("restart", None, ""),
                   ("terminate", "1", "HW_FAULT"), ("restart", "1", "")]
    times = [e["time"] for e in data["events"]]
    assert times == sorted(times)
    code, out, _ = run(["events", "pod"], env)
    assert code == 0
    assert out.index("HOST_ERROR") < out.index("HW_FAULT") and "NOT_MINE" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_announced_window_is_shown_with_whether_it_may_start_early_and_the_plan(
        log_sim: Simulator, tmp_path: Path) -> None:
    log_sim.create_node("pod", "v4-16", labels={"tpuwatch-job": "pod"})
    log_sim.world.upcoming_maintenance("pod", starts_in=3 * 86400.0 * 600, kind="SCHEDULED", can_reschedule=True)
    env = cli_env(log_sim, tmp_path)
    data = events_json(["pod", "--zone", log_sim.zone], env)
    um = data["upcoming_maintenance"]
    assert (um["type"], um["status"], um["can_start_early"]) == ("SCHEDULED", "PENDING", True), data
    assert "starts it after the job's next checkpoint" in um["plan"] and data["upcoming_error"] is None
    # one Compute Engine entry per worker VM of the v4-16, as the real log has them
    assert [(e["kind"], e["worker"]) for e in data["events"]] == [("upcoming_maintenance", "0"),
                                                                   ("upcoming_maintenance", "1")], data["events"]
    code, out, _ = run(["events", "pod", "--zone", log_sim.zone], env)
    assert code == 0
    first = out.splitlines()[0]
    assert first.startswith("upcoming  SCHEDULED PENDING in 2d23h") or first.startswith(
        "upcoming  SCHEDULED PENDING in 3d"), out  # relative, then the local time
    assert "may be started early; tpuwatch starts it after the job's next checkpoint" in " ".join(out.split())
    # without the zone the node is not read (the timeline alone)
    assert events_json(["pod"], {**env, "CLOUDSDK_COMPUTE_ZONE": None})["upcoming_maintenance"] is None


def test_no_duplicates_or_gaps_across_pages_and_polls(log_sim: Simulator) -> None:
    for n in ("a", "ab", "b"):
        log_sim.create_node(n)
    reader = AuditLogReader(log_sim.project, page_size=1, retry=FAST)
    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    cursor: str | None = reader.cursor_at(start)
    seen: list[str] = []
    for i in range(3):
        heal_cycle(log_sim, "a", reason=f"R{i}")
        heal_cycle(log_sim, "ab")  # matched by the filter's substring, dropped on re-check
        events, cursor = reader.read(["a", "b"], cursor)
        seen += [e.insert_id for e in events]
        assert all(e.node == "a" for e in events)
        assert [e.reason for e in events] == [f"R{i}", ""]
        again, cursor = reader.read(["a", "b"], cursor)
        assert again == []  # the overlap re-reads, the cursor drops them
    expected = [e.insert_id for e in log_sim.world.audit_entries() if e.node == "a"]
    assert seen == expected and len(set(seen)) == 6
    assert [e.insert_id for e in reader.since(["a"], start)] == expected


def test_one_query_per_read_covers_every_node(log_sim: Simulator) -> None:
    names = [f"n{i}" for i in range(10)]
    for n in names:
        log_sim.create_node(n)
    for n in names[:4]:
        heal_cycle(log_sim, n)
    reader = AuditLogReader(log_sim.project, retry=FAST)
    log_sim.world.reset_calls()
    events, cursor = reader.read(names, None)
    assert sorted({e.node for e in events}) == names[:4] and len(events) == 8
    assert log_sim.world.call_count("ListLogEntries") == 1
    reader.read(names, cursor)
    assert log_sim.world.call_count("ListLogEntries") == 2


def test_unavailable_rate_does_not_change_output(log_sim: Simulator, tmp_path: Path) -> None:
    log_sim.create_node("pod")
    for i in range(3):
        heal_cycle(log_sim, "pod", reason=f"R{i}")
    env = cli_env(log_sim, tmp_path)
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    clean = events_json(["pod", "--since", since], env)
    log_sim.world.api_errors(0.3, ["UNAVAILABLE", "RESOURCE_EXHAUSTED"])
    log_sim.world.reset_calls()
    for _ in range(16):  # the TPU reads (instance names) draw from the same seeded error sequence
        assert events_json(["pod", "--since", since], env) == clean
    assert log_sim.world.injected["google.logging.v2.LoggingServiceV2/ListLogEntries"] > 0


def test_permission_denied_exits_3_at_once(log_sim: Simulator, tmp_path: Path) -> None:
    log_sim.world.deny(methods=["ListLogEntries"])
    log_sim.world.reset_calls()
    code, _, err = run(["events", "pod"], cli_env(log_sim, tmp_path))
    assert code == 3 and "logging.logEntries.list" in err and "Traceback" not in err
    assert log_sim.world.call_count("ListLogEntries") == 1


def test_since_forms(log_sim: Simulator, tmp_path: Path) -> None:
    log_sim.create_node("pod")
    heal_cycle(log_sim, "pod")
    env = cli_env(log_sim, tmp_path)
    assert len(events_json(["pod", "--since", "7d"], env)["events"]) == 2
    later = (datetime.now(timezone.utc) + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    assert events_json(["pod", "--since", later], env)["events"] == []
    code, out, _ = run(["events", "pod", "--since", later], env)
    assert code == 0 and "no maintenance events for pod" in out
    for bad in ("yesterday", "24", "2024-05-01", "2024-02-30T00:00:00Z", "-5h"):
        code, _, err = run(["events", "pod", "--since", bad], env)
        assert code == 2 and "--since" in err, bad


def test_no_project_exits_2(log_sim: Simulator, tmp_path: Path) -> None:
    code, _, err = run(["events", "pod"], cli_env(log_sim, tmp_path, CLOUDSDK_CORE_PROJECT=None))
    assert code == 2 and "gcloud config set project" in err
