"""The shared audit-log reader (tpuwatch.cloud.auditcache) against the simulator's Logging API.

Query counts are the simulator's (sim.world.calls); time passing for `max_age` is an injected
clock, never a sleep.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuwatch.cloud.auditcache import SharedAuditLog, cache_path
from tpuwatch.cloud.logs import AuditLogReader, decode_cursor
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import CloudError
from tpuwatch.journal import journal_path
from tpuwatch.sim.simulator import Simulator

FAST = RetryPolicy(multiplier=0.005, max_wait=0.05, max_attempts=2)
OTHER_ZONE = "us-east5-b"


class Clock:
    """Wall time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


def shared(sim: Simulator, state: Path, clock: Clock | None = None, **kw: object) -> SharedAuditLog:
    return SharedAuditLog(sim.project, state, zone=sim.zone, retry=FAST, now=clock or Clock(), **kw)  # type: ignore[arg-type]


def queries(sim: Simulator) -> int:
    return sim.world.call_count("ListLogEntries")


def ids(sim: Simulator, node: str, zone: str | None = None) -> list[str]:
    """insert ids of every entry about `node` (in the simulator's default zone), oldest first."""
    return [e.insert_id for e in sim.world.audit_entries() if e.node == node and e.zone == (zone or sim.zone)]


def announce(sim: Simulator, node: str, zone: str | None = None) -> None:
    """One audit entry about `node`, and nothing else happens."""
    sim.world.system_event(node, "tpu.nodes.restart", zone=zone)


def test_many_readers_share_one_query_and_get_only_their_node(sim_api: Simulator, tmp_path: Path) -> None:
    names = [f"w{i}" for i in range(20)]  # "nodes/w1" is a prefix of "nodes/w10" .. "nodes/w19"
    for n in names:
        sim_api.create_node(n)
    sim_api.create_node("w1", zone=OTHER_ZONE)  # same name, another zone of the project
    for i, n in enumerate(names):
        for _ in range(1 + i % 2):
            announce(sim_api, n)
    announce(sim_api, "w1", zone=OTHER_ZONE)
    sim_api.world.maintenance("w10", reason="HOST_ERROR", stuck="UNHEALTHY_MAINTENANCE")  # no restart entry
    clock = Clock()
    readers = [shared(sim_api, tmp_path / "state", clock) for _ in names]
    sim_api.world.reset_calls()
    cursors: dict[str, str | None] = {}
    for r, n in zip(readers, names, strict=True):
        events, cursors[n] = r.read([n], None)
        assert {e.node for e in events} == {n}
        assert [e.insert_id for e in events] == ids(sim_api, n)
        assert all(e.resource_name.split("/")[3] == sim_api.zone for e in events)
    assert queries(sim_api) == 1
    assert [r.queries for r in readers] == [1] + [0] * 19
    w10, _ = readers[10].read(["w10"], None)
    assert [(e.kind, e.reason) for e in w10][-1] == ("terminate", "HOST_ERROR")
    assert readers[10].read(["w10"], cursors["w10"])[0] == []  # nothing new since
    # the cache file is private and cannot be taken for a job's journal
    path = cache_path(tmp_path / "state", sim_api.project)
    assert path.stat().st_mode & 0o077 == 0
    assert path != journal_path(tmp_path / "state", f"audit-{sim_api.project}")
    # AuditLogReader (status, events) reads the same events for a node
    direct, _ = AuditLogReader(sim_api.project, zone=sim_api.zone, retry=FAST).read(["w1"], None)
    assert [e.insert_id for e in direct] == ids(sim_api, "w1")


def test_after_max_age_a_new_query(sim_api: Simulator, tmp_path: Path) -> None:
    for n in ("a", "b"):
        sim_api.create_node(n)
    clock = Clock()
    ra, rb = shared(sim_api, tmp_path, clock), shared(sim_api, tmp_path, clock)
    _, ca = ra.read(["a"], None)
    _, cb = rb.read(["b"], None)
    assert queries(sim_api) == 1
    # A first read (no cursor) that starts a little before the cache's coverage (its clock
    # was read a moment earlier) shares it too: its start is only "an hour or so ago".
    earlier = Clock()
    earlier.advance(-2)
    shared(sim_api, tmp_path, earlier).read(["b"], None)
    assert queries(sim_api) == 1
    announce(sim_api, "a")
    clock.advance(10)  # still fresh for another watcher: the new entry is not seen yet
    events, _ = shared(sim_api, tmp_path, clock).read(["a"], ca)
    assert events == [] and queries(sim_api) == 1
    clock.advance(6)  # 16 s after the query: stale
    events, ca = ra.read(["a"], ca)
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 2
    events, cb = rb.read(["b"], cb)  # b shares that second query
    assert events == [] and queries(sim_api) == 2
    fast = shared(sim_api, tmp_path, clock, max_age=timedelta(seconds=1))
    clock.advance(2)
    fast.read(["b"], cb)
    assert queries(sim_api) == 3


def test_cursor_older_than_the_cache_queries_from_it(sim_api: Simulator, tmp_path: Path) -> None:
    sim_api.create_node("a")
    sim_api.create_node("b")
    t0 = datetime.now(timezone.utc) - timedelta(minutes=5)
    announce(sim_api, "a")
    announce(sim_api, "b")
    late = Clock()
    late.advance(2 * 3600)  # a watcher whose first read starts 70 min before its "now": after the entries
    ahead = shared(sim_api, tmp_path, late)
    events, _ = ahead.read(["b"], None)
    assert events == [] and queries(sim_api) == 1
    behind = shared(sim_api, tmp_path, late)  # same clock: the cache is fresh, but does not cover t0
    events, cursor = behind.read(["a"], behind.cursor_at(t0))
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 2
    # now covered from t0: another job reading from t0 shares it
    events, _ = shared(sim_api, tmp_path, late).read(["b"], behind.cursor_at(t0))
    assert [e.insert_id for e in events] == ids(sim_api, "b") and queries(sim_api) == 2


def test_no_repeats_and_late_entries_are_found(sim_api: Simulator, tmp_path: Path) -> None:
    for n in ("a", "ab"):
        sim_api.create_node(n)
    clock = Clock()
    r = shared(sim_api, tmp_path, clock)
    other = shared(sim_api, tmp_path, clock)
    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    cursor: str | None = r.cursor_at(start)
    got: list[str] = []
    for _ in range(3):
        announce(sim_api, "a")
        announce(sim_api, "ab")  # matched by the shared query, never by "a"
        clock.advance(16)
        events, cursor = r.read(["a"], cursor)
        got += [e.insert_id for e in events]
        again, cursor = r.read(["a"], cursor)  # same cache
        assert again == []
        other.read(["ab"], None)
        clock.advance(16)
        again, cursor = r.read(["a"], cursor)  # a new query over the same overlap
        assert again == []
    assert got == ids(sim_api, "a") and len(set(got)) == 3
    # An entry that reaches the log late: timestamped now, readable only ~1 s later.
    sim_api.world.log_latency = 600.0  # simulated seconds: 1 s at the fixture's speed
    announce(sim_api, "a")
    entry = sim_api.world.audit_entries()[-1]
    clock.advance(16)
    events, cursor = r.read(["a"], cursor)
    assert events == []  # not readable yet
    state = decode_cursor(cursor)
    assert state is not None and state[0] > entry.time_ns  # the cursor has moved past its time
    while time.time_ns() < entry.receive_ns:
        time.sleep(0.05)
    clock.advance(16)
    events, cursor = r.read(["a"], cursor)
    assert [e.insert_id for e in events] == [entry.insert_id]
    clock.advance(16)
    events, cursor = r.read(["a"], cursor)
    assert events == []


def test_corrupt_cache_is_started_again(sim_api: Simulator, tmp_path: Path) -> None:
    sim_api.create_node("a")
    announce(sim_api, "a")
    path = cache_path(tmp_path, sim_api.project)
    path.write_bytes(b"this is not a database" * 100)
    path.chmod(0o600)
    warnings: list[str] = []
    r = shared(sim_api, tmp_path, on_warning=warnings.append)
    events, cursor = r.read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a")
    assert len(warnings) == 1 and "unreadable" in warnings[0] and str(path) in warnings[0]
    # started again: the next reader is answered from it
    events, _ = shared(sim_api, tmp_path).read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 1
    # a database of another version is not used either
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '0' WHERE key = 'version'")
    conn.close()
    again = shared(sim_api, tmp_path, on_warning=warnings.append)
    events, _ = again.read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 2
    assert len(warnings) == 2 and "version" in warnings[1]


def test_unusable_state_dir_falls_back_to_a_direct_query(sim_api: Simulator, tmp_path: Path) -> None:
    sim_api.create_node("a")
    announce(sim_api, "a")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    warnings: list[str] = []
    r = shared(sim_api, not_a_dir, on_warning=warnings.append)
    events, cursor = r.read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a")
    events, _ = r.read(["a"], cursor)
    assert events == [] and queries(sim_api) == 2
    assert len(warnings) == 1 and "queries the audit log itself" in warnings[0]
    # the tick takes the same warning once for its report
    assert r.take_warnings() == warnings and r.take_warnings() == []
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    events, _ = shared(sim_api, open_dir).read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a")
    assert not cache_path(open_dir, sim_api.project).exists()  # nothing written to a shared dir


def test_a_failed_query_is_shared_and_not_taken_for_a_read(sim_api: Simulator, tmp_path: Path) -> None:
    sim_api.create_node("a")
    sim_api.create_node("b")
    announce(sim_api, "a")
    clock = Clock()
    ra, rb = shared(sim_api, tmp_path, clock), shared(sim_api, tmp_path, clock)
    sim_api.world.deny(methods=["ListLogEntries"])
    with pytest.raises(CloudError) as first:
        ra.read(["a"], None)
    assert queries(sim_api) == 1
    with pytest.raises(CloudError) as second:  # within max_age: told, not queried again
        rb.read(["b"], None)
    assert queries(sim_api) == 1
    assert first.value.message in second.value.message and "failed" in second.value.message
    sim_api.world.clear_errors()
    clock.advance(16)
    events, _ = ra.read(["a"], None)  # the failure did not count as a read
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 2


SCRIPT = """
import json, os, sys, time
from datetime import timedelta
from tpuwatch.cloud.auditcache import SharedAuditLog
from tpuwatch.cloud.retry import RetryPolicy
project, zone, state, node, go = sys.argv[1:6]
r = SharedAuditLog(project, state, zone=zone, max_age=timedelta(minutes=10),
                   retry=RetryPolicy(multiplier=0.005, max_wait=0.05))
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
events, cursor = r.read([node], None)
print(json.dumps({"ids": [e.insert_id for e in events], "queries": r.queries, "warning": r.warning}), flush=True)
"""


def test_processes_reading_at_once_share_one_query(sim_api: Simulator, tmp_path: Path) -> None:
    names = [f"p{i}" for i in range(6)]
    for n in names:
        sim_api.create_node(n)
        announce(sim_api, n)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, sim_api.project, sim_api.zone, str(tmp_path / "state"),
                               n, str(go)], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
             for n in names]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        sim_api.world.reset_calls()
        go.touch()
        results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * len(procs)
    for n, res in zip(names, results, strict=True):
        assert res["ids"] == ids(sim_api, n)
    assert [res["warning"] for res in results] == [None] * len(names)
    assert queries(sim_api) == 1
    assert sorted(res["queries"] for res in results) == [0] * (len(names) - 1) + [1]


def test_quiet_jobs_stay_inside_the_cache(sim_api: Simulator, tmp_path: Path) -> None:
    # A job with no events keeps reading: its cursor follows the cache's query time, so its
    # start never falls behind what the cache keeps, and it goes on sharing the query.
    sim_api.create_node("a")
    sim_api.create_node("b")
    clock = Clock()
    kw = {"retention": timedelta(minutes=30), "initial_lookback": timedelta(minutes=5)}
    ra, rb = shared(sim_api, tmp_path, clock, **kw), shared(sim_api, tmp_path, clock, **kw)
    ca = cb = None
    for period in range(1, 6):
        _, ca = ra.read(["a"], ca)
        _, cb = rb.read(["b"], cb)
        assert queries(sim_api) == period
        clock.advance(10 * 60)
    assert ra.queries == 5 and rb.queries == 0


def test_a_reader_looking_again_soon_wants_a_fresher_cache(sim_api: Simulator, tmp_path: Path) -> None:
    # The tick reads again within seconds while something looks wrong: 2 s old at most then.
    sim_api.create_node("a")
    sim_api.create_node("b")
    clock = Clock()
    ra, rb = shared(sim_api, tmp_path, clock), shared(sim_api, tmp_path, clock)
    _, ca = ra.read(["a"], None)
    announce(sim_api, "a")
    clock.advance(5)
    _, cb = rb.read(["b"], None)  # its first read: 5 s is fresh enough
    assert queries(sim_api) == 1
    events, ca = ra.read(["a"], ca)  # again after 5 s: the cache is too old for that
    assert [e.insert_id for e in events] == ids(sim_api, "a") and queries(sim_api) == 2
    clock.advance(1)
    rb.read(["b"], cb)  # looking again too, but the cache is 1 s old
    assert queries(sim_api) == 2
    clock.advance(60)
    ra.read(["a"], ca)  # the steady cadence: a query (stale), but not an urgent one
    clock.advance(10)
    rb.read(["b"], cb)  # 70 s after its last read: 10 s old is fine
    assert queries(sim_api) == 3


def test_a_read_does_not_wait_long_for_another_watchers_query(sim_api: Simulator, tmp_path: Path) -> None:
    sim_api.create_node("a")
    r = shared(sim_api, tmp_path, lock_timeout=0.2)
    lock = cache_path(tmp_path, sim_api.project).with_suffix(".db.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another watcher, in the middle of its query
        with pytest.raises(CloudError, match="stayed locked"):
            r.read(["a"], None)
        assert queries(sim_api) == 0  # skipped, not queried on the side
    finally:
        os.close(fd)
    announce(sim_api, "a")
    events, _ = r.read(["a"], None)
    assert [e.insert_id for e in events] == ids(sim_api, "a")


def test_the_shared_query_takes_only_the_compute_engine_instances_its_readers_watch(
        sim_api: Simulator, tmp_path: Path) -> None:
    w = sim_api.world
    spot = {"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}}
    for n in ["vm", "vm-2", *(f"other-{i}" for i in range(30))]:  # a project full of Spot VMs
        w.add_instance(n, body=spot)
    for n in ["vm", *(f"other-{i}" for i in range(30))]:
        w.preempt_instance(n)
    sim_api.create_node("tpu")
    announce(sim_api, "tpu")
    clock = Clock()
    state = tmp_path / "state"
    reader = shared(sim_api, state, clock)
    sim_api.world.reset_calls()
    events, cursor = reader.read(["vm"], None, {"vm": ("vm", "0")})
    assert [(e.method, e.node) for e in events] == [("compute.instances.preempted", "vm")]
    with sqlite3.connect(cache_path(state, sim_api.project)) as conn:
        stored = sorted(r for (r,) in conn.execute("SELECT resource_name FROM entries"))
    assert stored == [f"projects/{sim_api.project}/locations/{sim_api.zone}/nodes/tpu",
                      f"projects/{sim_api.project}/zones/{sim_api.zone}/instances/vm"], stored  # not the 30 others'
    # another watcher's instance joins the query at once; then both read from the cache
    w.preempt_instance("vm-2")
    theirs, _ = shared(sim_api, state, clock).read(["vm-2"], None, {"vm-2": ("vm-2", "0")})
    assert [e.node for e in theirs] == ["vm-2"] and queries(sim_api) == 2
    tpu, _ = shared(sim_api, state, clock).read(["tpu"], None)  # a TPU node's reader: its entry, no query
    assert [e.node for e in tpu] == ["tpu"] and queries(sim_api) == 2
    again, _ = reader.read(["vm"], cursor, {"vm": ("vm", "0")})
    assert again == [] and queries(sim_api) == 2
