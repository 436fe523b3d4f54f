"""The journal: private files, memory round trip, transactions, the writer lock, refusing
files it cannot trust (newer, corrupt, another TPU's) without touching them, a full disk, and
recording the policy's decisions."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from policy_support import (
    CFG,
    absent,
    at,
    ckpt,
    event,
    exited,
    node,
    obs,
    op,
    run_mem,
    running,
    tick,
)

from tpuwatch.errors import NotFoundError
from tpuwatch.journal import CACHE_KIB, SCHEMA_VERSION, Busy, Journal, JournalError, journal_path
from tpuwatch.policy import (
    Attempt,
    AttemptEnd,
    Boot,
    Budgets,
    Evidence,
    HangLearning,
    Maintenance,
    Marks,
    Memory,
    Phase,
    Recreate,
    Repair,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _open(state: Path, tpu: str = "pod", **kw: object) -> Journal:
    return Journal.open(state, "job", tpu, **kw)  # type: ignore[arg-type]


def _snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_journal_is_private(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    with _open(state) as j:
        assert j.path == journal_path(state, "job") == state / "job.db"
    assert _mode(state) == 0o700
    assert _mode(state / "job.db") == 0o600
    assert _mode(state / "job.lock") == 0o600


def test_group_writable_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o770)
    with pytest.raises(JournalError) as exc:
        _open(state)
    assert exc.value.exit_code == 2
    assert str(state) in str(exc.value) and "chmod go-w" in str(exc.value)
    assert not (state / "job.db").exists()


def _rich_memory() -> Memory:
    """A memory with every kind of field filled: times, evidence, a last end, an operation."""
    sick = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=exited({}, attempt=1),
                    events=(event("terminate", at(90), "MAINTENANCE"),)), run_mem(), now=100)
    ended = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=exited({1: 1})), sick.memory, now=120)
    return replace(ended.memory,
                   budgets=replace(ended.memory.budgets, restarts=1, recreates=1, backoff_until=at(130)),
                   recreate=replace(ended.memory.recreate, pending_op="op-1"),
                   attempt=replace(ended.memory.attempt, evidence=sick.memory.attempt.evidence))


def test_memory_round_trip(tmp_path: Path) -> None:
    mem = _rich_memory()
    assert mem.attempt.evidence and mem.budgets.last_end is not None and mem.repair.unhealthy_since is not None
    with _open(tmp_path) as j:
        assert j.load_memory() is None
        with j.transaction():
            j.save_memory(mem)
    with _open(tmp_path) as j:
        assert j.load_memory() == mem


def test_the_same_saved_memory_is_parsed_once_and_a_changed_one_again(tmp_path: Path) -> None:
    # A tick reads the memory, then reads it again to journal its decision against: the second
    # read of the same row takes no parse. Another writer's change (here a reader beside it
    # sees the writer's) is read anew.
    with _open(tmp_path, wait=False) as writer:
        with writer.transaction():
            writer.save_memory(run_mem())
        with Journal.open(tmp_path, "job", None, readonly=True) as reader:
            first = reader.load_memory()
            assert first == run_mem() and reader.load_memory() is first
            changed = replace(run_mem(), phase=Phase.FAILED, reason="x")
            with writer.transaction():
                writer.save_memory(changed)
            again = reader.load_memory()
            assert again == changed and again is not first and reader.load_memory() is again


def test_a_journal_that_kept_memory_flat_loads_into_the_records(tmp_path: Path) -> None:
    """fixtures/memory-v1-flat.db: a journal of job "flat" on TPU "pod", written by a tpuwatch
    that kept every field of memory at the top level (memory version 1), every field set."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    shutil.copy(FIXTURES / "memory-v1-flat.db", state / "flat.db")
    os.chmod(state / "flat.db", 0o600)
    t0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)

    def t(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    end = AttemptEnd(attempt=3, start=t(0), end=t(3600), node_id="n-1", start_step=400, end_step=900,
                     outcome="failure", charged=True, exit_code=1,
                     reason="attempt 3: worker 0 exited with code 1", streak_added=False)
    expected = Memory(
        phase=Phase.BACKOFF, reason="", zone="us-central2-b",
        attempt=Attempt(number=3, start=t(0), node_id="n-1", start_step=400, seen=True, launch_tries=1,
                        evidence=(Evidence(t(100), "audit tpu.nodes.terminate"),
                                  Evidence(t(200), "node state REPAIRING")),
                        unreachable_since=t(3000), end_seen=t(3500)),
        budgets=Budgets(restarts=2, disruptions=4, recreates=1, no_progress=1, backoff_level=2,
                        backoff_until=t(3700), last_end=end, confirm_by=t(3660)),
        maintenance=Maintenance(notice_hold=t(3900), early_window=t(7200), early_step=800, early_refused=t(7300)),
        repair=Repair(unhealthy_since=t(10), unknown_since=t(20), env_failing_since=t(50)),
        recreate=Recreate(zone_try=1, pending_op="op-7", deleting_node_id="n-0", queued_since=t(30),
                          queue_tries=3, retry_at=t(40)),
        hang=HangLearning(progress_step=900, progress_at=t(3400), progress_time=t(3390), ckpt_gap=1800.0,
                          ckpt_first=600.5, log_bytes=123456, log_at=t(3450), log_last=t(3460), log_peak=95.0,
                          log_gap=120.0),
        boot=Boot(node_seen="n-1", node_down=True, booted_at=t(5)),
    )
    with Journal.open(state, "flat", "pod") as j:
        assert j.load_memory() == expected
        # saved again, it is written in records and reads back the same
        with j.transaction():
            j.save_memory(expected)
        assert j.load_memory() == expected
    saved = json.loads(sqlite3.connect(state / "flat.db").execute("SELECT data FROM memory").fetchone()[0])
    assert saved["version"] == 3 and saved["budgets"]["restarts"] == 2 and "restarts" not in saved


def test_a_journal_that_kept_times_as_cursors_loads_them_into_memory(tmp_path: Path) -> None:
    """fixtures/memory-v2-cursors.db: a journal of job "cursors" on TPU "pod", written by a
    tpuwatch that saved memory version 2 and kept the times its decisions read outside it: when
    the audit log was last read and the environment checks last ran (`cursors`), the checkpoint
    warning, and the start of the delete in flight (`operations`), beside its bookmarks."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    shutil.copy(FIXTURES / "memory-v2-cursors.db", state / "cursors.db")
    os.chmod(state / "cursors.db", 0o600)
    t0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)

    def t(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    op = "projects/p/locations/us-central2-b/operations/op-del-2"
    expected = Memory(
        phase=Phase.DELETING, zone="us-central2-b",
        attempt=Attempt(number=2, start=t(0), node_id="n-1", start_step=100, seen=True),
        budgets=Budgets(restarts=1, recreates=1),
        recreate=Recreate(pending_op=op, op_started=t(3000), deleting_node_id="n-1"),
        # the checkpoint warning's time is left unset: that tpuwatch journaled no event for it
        marks=Marks(audit_read_at=t(3500), precheck_at=t(3200)),
    )
    with Journal.open(state, "cursors", None, readonly=True) as j:  # `status` reads it as it is
        assert j.load_memory() == expected
    with Journal.open(state, "cursors", "pod") as j:
        assert j.load_memory() == expected
        # the bookmarks stay where they were, each behind its method
        assert j.audit_cursor() == "1763625600000000000/seen" and j.alert_bookmark() == 1
        assert j.api_calls() == {("tpu", "get"): 7} and j.api_calls(errors=True) == {}
        assert (j.login() or {}).get("user") == "alice"
        assert (j.precheck_report() or {}).get("node_id") == "n-1"
        with j.transaction():
            j.save_memory(expected)
        assert j.load_memory() == expected
    db = sqlite3.connect(state / "cursors.db")
    saved = json.loads(db.execute("SELECT data FROM memory").fetchone()[0])
    assert saved["version"] == 3 and saved["marks"]["audit_read_at"] == t(3500).isoformat()
    assert saved["recreate"]["op_started"] == t(3000).isoformat()
    names = {n for (n,) in db.execute("SELECT name FROM cursors")}
    assert names == {"audit", "notify_event", "metrics_api_requests", "metrics_api_errors", "ssh_login",
                     "precheck_last"}


@pytest.mark.parametrize(("data", "field"), [
    ({"version": 2, "attempt": {"number": -1}}, "'attempt.number'"),
    ({"version": 2, "attempt": 3}, "'attempt'"),
    ({"version": 2, "budgets": {"last_end": {"attempt": 1}}}, "'budgets.last_end.start' is missing"),
    ({"version": 2, "hang": {"ckpt_gap": 1.0, "gap": 2.0}}, "unknown field 'hang.gap'"),
    ({"version": 1, "start": "2026-11-20T08:00:00+00:00"}, "unknown field 'start'"),  # only in version 2's records
    ({"version": 1, "attempt_start": "not a time"}, "'attempt.start'"),
])
def test_saved_memory_that_does_not_fit_its_records_is_refused_naming_the_field(data: dict[str, object],
                                                                                field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        Memory.from_dict(data)


def test_transaction_is_all_or_nothing(tmp_path: Path) -> None:
    before = run_mem()
    with _open(tmp_path) as j:
        with j.transaction():
            j.save_memory(before)
            j.set_audit_cursor("c1")
        with pytest.raises(ZeroDivisionError), j.transaction():
            j.save_memory(replace(before, phase=Phase.FAILED, reason="x"))
            j.set_audit_cursor("c2")
            j.add_event(at(1), "launch", "half a tick")
            j.start_attempt(2, at(1), "n1", 100)
            1 / 0  # noqa: B018 - the tick dies mid-transaction
        assert j.load_memory() == before and j.audit_cursor() == "c1"
        assert j.events() == [] and j.attempts() == []
    with _open(tmp_path) as j:
        assert j.load_memory() == before and j.audit_cursor() == "c1"


def test_writes_outside_a_transaction_are_refused(tmp_path: Path) -> None:
    with _open(tmp_path) as j, pytest.raises(RuntimeError, match="transaction"):
        j.save_memory(run_mem())


def test_second_opener_gets_busy(tmp_path: Path) -> None:
    with _open(tmp_path, wait=False):
        with pytest.raises(Busy) as exc:
            _open(tmp_path, wait=False)
        assert exc.value.exit_code == 0
        assert str(exc.value) == f"another tpuwatch (pid {os.getpid()}) is working on job; nothing to do"
        # another process, as a second `tpuwatch check` from cron would be
        code = (
            "import sys\n"
            "from tpuwatch.journal import Journal, Busy\n"
            "try:\n"
            f"    Journal.open({str(tmp_path)!r}, 'job', 'pod', wait=False)\n"
            "except Busy as e:\n"
            "    print(e); sys.exit(e.exit_code)\n"
            "sys.exit(9)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "is working on job" in proc.stdout
    with _open(tmp_path, wait=False) as j:  # released on close
        assert j.load_memory() is None


def test_newer_version_is_refused_and_left_alone(tmp_path: Path) -> None:
    with _open(tmp_path):
        pass
    path = tmp_path / "job.db"
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    before = _snapshot(path)
    with pytest.raises(JournalError) as exc:
        _open(tmp_path)
    assert exc.value.exit_code == 2
    assert str(path) in str(exc.value) and "newer tpuwatch" in str(exc.value)
    assert _snapshot(path) == before


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is a text file, not a journal\n" * 40)


def _broken_pages(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO events (time, kind, reason) VALUES ('t', 'k', ?)", ("x" * 9000,))
    data = bytearray(path.read_bytes())
    page = 4096
    data[page:page * 3] = b"\xff" * (page * 2)  # the root pages of the first tables
    path.write_bytes(bytes(data))


def _other_app(path: Path) -> None:
    path.unlink()
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")


@pytest.mark.parametrize("damage", [_garbage, _broken_pages, _other_app])
def test_corrupt_journal_is_refused_and_never_overwritten(tmp_path: Path, damage: object) -> None:
    with _open(tmp_path) as j, j.transaction():
        j.save_memory(run_mem())
    path = tmp_path / "job.db"
    damage(path)  # type: ignore[operator]
    before = _snapshot(path)
    with pytest.raises(JournalError) as exc:
        _open(tmp_path)
    message = str(exc.value)
    assert exc.value.exit_code == 1
    assert str(path) in message and "will not overwrite it" in message
    assert _snapshot(path) == before
    with pytest.raises(JournalError):
        Journal.open(tmp_path, "job", None, readonly=True)
    assert _snapshot(path) == before


def test_journal_of_another_tpu_is_refused_and_left_alone(tmp_path: Path) -> None:
    with _open(tmp_path, tpu="pod-a") as j, j.transaction():
        j.save_memory(run_mem())
    path = tmp_path / "job.db"
    before = _snapshot(path)
    with pytest.raises(JournalError) as exc:
        _open(tmp_path, tpu="pod-b")
    assert exc.value.exit_code == 2
    assert "belongs to TPU 'pod-a', not 'pod-b'" in str(exc.value) and "job.name" in str(exc.value)
    assert _snapshot(path) == before


def test_interrupted_creation_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "job.db").touch(mode=0o600)  # killed after creating the file, before the schema
    # a reader meanwhile (`status` as `watch` starts): no journal yet, not a corrupt one
    with pytest.raises(NotFoundError, match="being created"):
        Journal.open(tmp_path, "job", None, readonly=True)
    assert (tmp_path / "job.db").stat().st_size == 0
    with _open(tmp_path) as j:
        assert j.load_memory() is None
        with j.transaction():
            j.save_memory(run_mem())
    with _open(tmp_path) as j:
        assert j.load_memory() == run_mem()


def test_full_disk_is_a_clear_error_and_corrupts_nothing(tmp_path: Path) -> None:
    mem = run_mem()
    with _open(tmp_path) as j:
        with j.transaction():
            j.save_memory(mem)
        pages = j.connection.execute("PRAGMA page_count").fetchone()[0]
        j.connection.execute(f"PRAGMA max_page_count = {pages}")  # no room to grow: SQLITE_FULL
        with pytest.raises(JournalError) as exc, j.transaction():
            j.save_memory(replace(mem, phase=Phase.FAILED, reason="x"))
            for i in range(50):
                j.add_event(at(i), "launch", "y" * 4000)
        assert "disk is full" in str(exc.value) and str(j.path) in str(exc.value)
        assert "unchanged" in str(exc.value)
    with _open(tmp_path) as j:
        assert j.load_memory() == mem and j.events() == []
        assert j.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_readonly_open_reads_beside_a_writer(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        Journal.open(tmp_path, "job", None, readonly=True)
    with _open(tmp_path, wait=False) as writer:
        with writer.transaction():
            writer.save_memory(run_mem())
        with Journal.open(tmp_path, "job", None, readonly=True) as reader:
            assert reader.tpu_name == "pod" and reader.load_memory() == run_mem()
            with pytest.raises(RuntimeError), reader.transaction():
                pass


def test_every_connection_has_a_small_page_cache(tmp_path: Path) -> None:
    """SQLite's default cache (2 MB) would fill from the integrity check at open and stay, per
    job: a watcher of many jobs holds one connection each."""
    def cache(j: Journal) -> int:
        return int(j.connection.execute("PRAGMA cache_size").fetchone()[0])

    with _open(tmp_path, wait=False) as writer:
        companion = writer.companion()
        try:
            with Journal.open(tmp_path, "job", None, readonly=True) as reader:
                assert cache(writer) == cache(companion) == cache(reader) == -CACHE_KIB
        finally:
            companion.close()


def test_cursor_spec_and_operations(tmp_path: Path) -> None:
    with _open(tmp_path) as j:
        assert j.audit_cursor() is None and j.load_spec() is None
        with j.transaction():
            j.set_audit_cursor("2025-03-01T12:00:00Z/abc")
            j.save_spec({"accelerator_type": "v4-32", "labels": {"tpuwatch-job": "job"}})
            j.add_operation("op-1", "delete", "us-central2-b", at(0))
            j.add_operation("op-2", "create", "us-central2-b", at(5))
            j.finish_operation("op-1", at(3))
        assert j.audit_cursor() == "2025-03-01T12:00:00Z/abc"
        assert j.load_spec() == {"accelerator_type": "v4-32", "labels": {"tpuwatch-job": "job"}}
        assert [o.name for o in j.operations()] == ["op-1", "op-2"]
        assert [o.name for o in j.operations(pending_only=True)] == ["op-2"]
        assert j.operations()[0].finished == at(3)


# --- recording decisions -------------------------------------------------------------------------


def test_record_a_launch_a_failure_and_a_late_refund(tmp_path: Path) -> None:
    with _open(tmp_path) as j:
        launch = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0)
        j.record(at(0), launch)
        [row] = j.attempts()
        assert (row.number, row.start, row.node_id, row.start_step, row.outcome) == (1, at(0), "n1", 100, None)
        failed = tick(obs(probes=exited({1: 139}), checkpoint=ckpt(100)), launch.memory, now=500)
        j.record(at(500), failed)
        [row] = j.attempts()
        assert (row.outcome, row.charged, row.exit_code, row.end) == ("failure", True, 139, at(500))
        late = tick(obs(probes=absent(), events=(event("terminate", at(480)),), checkpoint=ckpt(100)),
                    failed.memory, now=505)
        j.record(at(505), late)
        first, second = j.attempts()
        assert (first.number, first.outcome, first.charged) == (1, "disruption", False)
        assert (second.number, second.outcome, second.start) == (2, None, at(505))  # no backoff any more
        assert j.load_memory() == late.memory
        kinds = [e.kind for e in j.events() if e.kind != "phase"]
        assert kinds == ["launch", "attempt_end", "stop", "wait", "attempt_end", "launch"]
        launched = next(e for e in j.events() if e.kind == "launch")
        assert launched.data["attempt"] == 1 and launched.data["checkpoint"]["step"] == 100
        # each change of phase, for `tpuwatch report` (what the memory alone forgets)
        moves = [(e.time, e.data["from"], e.data["to"]) for e in j.events() if e.kind == "phase"]
        assert moves == [(at(0), None, "running"), (at(500), "running", "backoff"), (at(505), "backoff", "running")]


def test_a_new_checkpoint_of_the_running_attempt_is_recorded_once_with_its_time(tmp_path: Path) -> None:
    saved = replace(ckpt(120), time=at(290))
    with _open(tmp_path) as j:
        launch = tick(obs(probes=absent(), checkpoint=ckpt(100)), Memory.initial("us-central2-b"), now=0)
        j.record(at(0), launch)
        first = tick(obs(probes=running(1), checkpoint=ckpt(100)), launch.memory, now=100)
        j.record(at(100), first)
        seen = tick(obs(probes=running(1), checkpoint=saved), first.memory, now=300)
        j.record(at(300), seen)
        j.record(at(330), tick(obs(probes=running(1), checkpoint=saved), seen.memory, now=330))
        marks = [(e.time, e.data) for e in j.events() if e.kind == "checkpoint"]
        assert marks == [(at(300), {"attempt": 1, "step": 120, "time": at(290).isoformat()})]


def test_repeated_waits_are_recorded_once(tmp_path: Path) -> None:
    waiting = tick(obs(node("REPAIRING")), Memory.initial("us-central2-b"), now=0)
    with _open(tmp_path) as j:
        j.record(at(0), waiting)
        again = tick(obs(node("REPAIRING")), waiting.memory, now=30)
        j.record(at(30), again)
        j.record(at(60), tick(obs(node("REPAIRING")), again.memory, now=60))
        events = j.events()
        assert [e.kind for e in events] == ["phase", "wait"] and "waiting for it to heal" in events[1].reason
        assert j.load_memory() == again.memory


def test_record_operation_follows_it_to_its_end(tmp_path: Path) -> None:
    dead = tick(obs(node("PREEMPTED")), Memory.initial("us-central2-b"), now=0)
    assert dead.memory.phase is Phase.DELETING
    with _open(tmp_path) as j:
        j.record(at(0), dead)
        mem = j.record_operation(at(1), dead.memory, "op-del-1", "delete", "us-central2-b")
        assert mem.recreate.pending_op == "op-del-1" and j.load_memory() == mem
        assert [o.name for o in j.operations(pending_only=True)] == ["op-del-1"]
        status = op("op-del-1")
        gone = tick(obs(missing=True, operation=status), mem, now=60)
        j.record(at(60), gone, operation=status)
        assert j.operations(pending_only=True) == []
        assert j.load_memory() == gone.memory and gone.memory.phase is Phase.CREATING


def test_config_is_not_needed_to_read_the_history(tmp_path: Path) -> None:
    """`history` reads by job name alone."""
    with _open(tmp_path) as j:
        j.record(at(0), tick(obs(probes=absent()), Memory.initial(CFG.zones[0]), now=0))
    with Journal.open(tmp_path, "job", None, readonly=True) as r:
        assert [e.kind for e in r.events(limit=1)] == ["launch"]
        assert r.events(since=at(1)) == []


def test_jobs_starting_together_all_create_the_state_dir(tmp_path: Path) -> None:
    # A watcher of several jobs opens their journals from as many threads at once.
    import threading

    from tpuwatch.journal import Journal

    for round_ in range(20):
        state = tmp_path / f"r{round_}" / "state"
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def open_one(i: int, state: Path = state, barrier: threading.Barrier = barrier,
                     errors: list[BaseException] = errors) -> None:
            barrier.wait()
            try:
                Journal.open(state, f"job{i}", f"pod{i}", wait=False).close()
            except BaseException as exc:  # noqa: BLE001 (collected for the assertion)
                errors.append(exc)

        threads = [threading.Thread(target=open_one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [], errors
