"""The job's journal: one SQLite file per job, `<state_dir>/<job>.db`, with one writer at a time.

It holds what a tick cannot observe again: the policy's Memory (every input of a decision that
cannot be observed again, times included), the events and attempts (the job's history), the
cloud operations tpuwatch started, the saved spec, and in `cursors` only bookmarks, each behind a
method of its own: the audit-log cursor, the alert and metrics bookmarks, the SSH login, and the
last environment-check report (for `status`).

Rules of this module:
- Writes happen only inside `with journal.transaction():` (one per tick); an exception inside
  it leaves the journal exactly as it was. Writing outside a transaction is a bug and raises.
- One writer: `Journal.open` takes a `flock` on `<state_dir>/<job>.lock`. With `wait=False` a
  held lock raises `Busy`, which `check` reports as exit 0 "another tpuwatch is working on <job>".
- A file tpuwatch cannot trust is refused, named, and never written: not a SQLite file, failing
  SQLite's integrity check, from a newer schema, or belonging to another TPU.
- Private by default: the state dir is created 0700 and refused when group or others may write
  to it; the journal and lock files are 0600.
- It uses the stdlib only (sqlite3, fcntl), takes every time from its caller, and knows nothing
  of the cloud or SSH. It knows the policy's values because it records them.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tpuwatch import __version__
from tpuwatch.errors import EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE, NotFoundError, TpuwatchError
from tpuwatch.model import OperationStatus
from tpuwatch.policy import (
    AttemptEnd,
    Decision,
    Launch,
    Marks,
    Memory,
    action_dict,
    operation_started,
)

SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
# Actions repeated tick after tick while nothing changes: recorded only when the row changes.
_QUIET_ACTIONS = frozenset({"wait", "follow", "needs_person"})
# Housekeeping that goes with the decision's other actions: their events say enough.
_UNNOTED_ACTIONS = frozenset({"clear_queued"})
# SQLite's page cache per connection, KiB. Its default (2 MB) fills as the integrity check at
# open reads the whole file, and stays: a watcher of many jobs holds one connection per job.
# A tick reads a few pages, which the OS keeps cached anyway.
CACHE_KIB = 64
# Times a tpuwatch that saved memory version 2 kept in `cursors`; they are in Memory.marks now.
_V2_TIMES = ("audit_read_at", "precheck_at", "checkpoint_warning")

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL, kind TEXT NOT NULL, reason TEXT NOT NULL, data TEXT NOT NULL DEFAULT '{}');
CREATE INDEX events_time ON events (time);
CREATE TABLE attempts (
    number INTEGER PRIMARY KEY, start TEXT NOT NULL, end TEXT, node_id TEXT NOT NULL DEFAULT '',
    start_step INTEGER, end_step INTEGER, outcome TEXT, charged INTEGER, exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '');
CREATE TABLE memory (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
CREATE TABLE cursors (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE operations (
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, zone TEXT NOT NULL, started TEXT NOT NULL,
    finished TEXT, error_code INTEGER, error_message TEXT);
CREATE TABLE spec (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
"""
# Tables added since schema 1 was fixed: created when a writer opens the journal, so older
# journals gain them and older tpuwatch versions (which ignore unknown tables) still read them.
_ADDED = """
CREATE TABLE IF NOT EXISTS deliveries (
    key TEXT PRIMARY KEY, target INTEGER NOT NULL, kind TEXT NOT NULL, time TEXT NOT NULL,
    text TEXT NOT NULL, data TEXT NOT NULL DEFAULT '{}', tries INTEGER NOT NULL DEFAULT 0,
    next_try TEXT, sent TEXT, gave_up TEXT, last_error TEXT NOT NULL DEFAULT '');
"""


class JournalError(TpuwatchError):
    """The journal cannot be used; the message names the file and what to do (exit 1 or 2)."""


class Busy(TpuwatchError):
    """Another tpuwatch holds the job's lock. Not a failure: exit 0."""

    exit_code = EXIT_OK


@dataclass(frozen=True)
class JournalEvent:
    id: int
    time: datetime
    kind: str
    reason: str
    data: dict[str, Any]


@dataclass(frozen=True)
class AttemptRow:
    number: int
    start: datetime
    end: datetime | None
    node_id: str
    start_step: int | None
    end_step: int | None
    outcome: str | None  # None while the attempt has not ended
    charged: bool | None
    exit_code: int | None
    reason: str


@dataclass(frozen=True)
class DeliveryRow:
    """One alert to one [[notify]] target (by its position), written before it is sent.

    `key` is the idempotency key (derived from the journal event it reports), so deriving the
    same alert twice adds nothing. Never holds the URL: the target is its position in the config.
    """

    key: str
    target: int
    kind: str
    time: datetime
    text: str
    data: dict[str, Any]
    tries: int
    next_try: datetime | None
    sent: datetime | None
    gave_up: datetime | None
    last_error: str


@dataclass(frozen=True)
class OperationRow:
    name: str
    kind: str
    zone: str
    started: datetime
    finished: datetime | None
    error_code: int | None
    error_message: str | None


def journal_path(state_dir: Path, job: str) -> Path:
    return Path(state_dir) / f"{job}.db"


def _utc(t: datetime) -> str:
    if t.tzinfo is None:
        raise ValueError("journal: times must carry a time zone")
    return t.astimezone(timezone.utc).isoformat()


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _old_time(text: Any) -> datetime | None:
    """A time an older tpuwatch saved as text; None when it is not one (it only paced a cadence)."""
    try:
        t = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return t if t is not None and t.tzinfo is not None else None


class Journal:
    """An open journal. Use `Journal.open(...)` as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path, job: str, tpu_name: str,
                 lock_fd: int | None, readonly: bool) -> None:
        self._conn = conn
        self.path = path
        self.job = job
        self.tpu_name = tpu_name
        self._lock_fd = lock_fd
        self.readonly = readonly
        self._depth = 0  # transaction nesting
        # The memory row's text and what it parsed to: a tick reads the memory once itself and
        # once more to journal its decision against; parsing it (field by field, by type) was
        # the largest part of an idle tick's CPU. Memory is immutable, and a version 3 text
        # always parses to the same value, so the same text is not parsed twice.
        self._parsed: tuple[str, Memory] | None = None

    # -- opening and closing ------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, job: str, tpu_name: str | None, *, wait: bool = True,
             readonly: bool = False) -> Journal:
        """Open (or create) the journal of `job` for TPU `tpu_name`.

        Writers take the job's lock first: `wait=False` raises Busy when another process holds
        it. `readonly=True` takes no lock, creates nothing, and raises NotFoundError when there
        is no journal; `tpu_name` None skips the TPU check (reading by job name only).
        """
        state_dir = Path(state_dir)
        path = journal_path(state_dir, job)
        if readonly:
            try:
                found_file = path.exists()
            except OSError as exc:
                raise JournalError(f"state dir {str(state_dir)[:200]!r} cannot be used: {exc.strerror or exc}; "
                                   "set TPUWATCH_STATE_DIR to a directory", exit_code=EXIT_USAGE) from None
            if not found_file:
                raise NotFoundError(f"no journal for job {job!r} at {path}")
            conn = _connect(path, readonly=True)
            try:
                if _is_empty(conn, path):  # a writer is creating it (or was killed before its tables)
                    raise NotFoundError(f"no journal for job {job!r} at {path} yet (being created)")
                found = _validate(conn, path, job, tpu_name)
            except BaseException:
                conn.close()
                raise
            return cls(conn, path, job, found, None, readonly=True)
        if tpu_name is None:
            raise ValueError("Journal.open: a writer must name the TPU")
        _private_dir(state_dir)
        lock_fd = _lock(state_dir / f"{job}.lock", job, wait)
        try:
            if path.is_symlink():
                raise JournalError(f"journal {path} is a symbolic link; tpuwatch will not write through it",
                                   exit_code=EXIT_USAGE)
            fresh = not path.exists()
            if fresh:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            elif stat.S_IMODE(path.stat().st_mode) & 0o077:
                os.chmod(path, 0o600)
            conn = _connect(path, readonly=False)
            try:
                if fresh or _is_empty(conn, path):
                    _create(conn, path, job, tpu_name)
                _validate(conn, path, job, tpu_name)
                _add_tables(conn, path)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(conn, path, job, tpu_name, lock_fd, readonly=False)

    def close(self) -> None:
        """Close the database and release the lock (safe to call twice)."""
        self._conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def companion(self) -> Journal:
        """Another connection to this journal, for a thread of the process that holds its lock
        (an SQLite connection serves the thread that made it): open it in that thread, close it
        there. It takes no lock of its own; writes wait for the other connection's transaction."""
        if self.readonly:
            raise RuntimeError("journal opened read-only")
        return Journal(_connect(self.path, readonly=False), self.path, self.job, self.tpu_name, None,
                       readonly=False)

    @property
    def connection(self) -> sqlite3.Connection:
        """The SQLite connection, for diagnostics and tests; write through the methods."""
        return self._conn

    # -- transactions ---------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Journal]:
        """All writes of one tick: committed together, or not at all. Nested uses join the outer."""
        if self.readonly:
            raise RuntimeError("journal opened read-only")
        if self._depth:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        self._depth = 1
        try:
            yield self
        except BaseException:
            self._depth = 0
            self._rollback()
            raise
        self._depth = 0
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise self._error(exc) from None

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite may already have rolled back (a full disk does); nothing was written

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        if not self._depth:
            raise RuntimeError("journal writes must happen inside `with journal.transaction():`")
        try:
            self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> JournalError:
        text = str(exc)
        if "full" in text:
            return JournalError(
                f"journal {self.path}: the disk is full; this tick was not recorded and the journal is "
                f"unchanged. Free space in {self.path.parent} and run again")
        if "readonly" in text or "read-only" in text:
            return JournalError(f"journal {self.path} is read-only ({text}); tpuwatch needs to write it")
        if "locked" in text or "busy" in text:
            return JournalError(f"journal {self.path} is locked by another program ({text}); run again")
        return JournalError(f"journal {self.path}: {text}")

    # -- memory ---------------------------------------------------------------------------------

    def load_memory(self) -> Memory | None:
        """The policy memory saved by the last tick, or None for a new job."""
        rows = self._read("SELECT data FROM memory WHERE id = 1")
        if not rows:
            return None
        text = rows[0][0]
        if self._parsed is not None and self._parsed[0] == text:
            return self._parsed[1]
        try:
            data = json.loads(text)
            mem = Memory.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise _corrupt(self.path, f"saved memory unreadable: {exc}") from None
        if data.get("version") in (1, 2):  # completed from other tables, which may change: not kept
            return self._v2_times(mem)
        self._parsed = (text, mem)
        return mem

    def _v2_times(self, mem: Memory) -> Memory:
        """Memory saved before version 3, with the times that tpuwatch kept in other tables: the
        audit log's last read and the environment checks' last run (`cursors`), and the start of
        the operation in flight (`operations`)."""
        kept = dict(self._read("SELECT name, value FROM cursors WHERE name IN ('audit_read_at', 'precheck_at')"))
        # The checkpoint warning's time is not carried over: that tpuwatch journaled no event for
        # it, so the next tick that warns journals one (and its alert, and `status` shows it).
        marks = Marks(audit_read_at=_old_time(kept.get("audit_read_at")), precheck_at=_old_time(kept.get("precheck_at")))
        started = next((r.started for r in self.operations(pending_only=True) if r.name == mem.recreate.pending_op),
                       None) if mem.recreate.pending_op else None
        return replace(mem, marks=marks, recreate=replace(mem.recreate, op_started=started))

    def save_memory(self, mem: Memory) -> None:
        self._write("INSERT INTO memory (id, data) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                    (json.dumps(mem.to_dict(), sort_keys=True),))
        # saved with version 3, the times an older tpuwatch kept as cursors are in the memory
        self._write(f"DELETE FROM cursors WHERE name IN ({', '.join('?' * len(_V2_TIMES))})", _V2_TIMES)

    # -- events ---------------------------------------------------------------------------------

    def add_event(self, time: datetime, kind: str, reason: str, data: Mapping[str, Any] | None = None) -> None:
        self._write("INSERT INTO events (time, kind, reason, data) VALUES (?, ?, ?, ?)",
                    (_utc(time), kind, reason, json.dumps(dict(data or {}), sort_keys=True, default=str)))

    def events(self, since: datetime | None = None, limit: int | None = None) -> list[JournalEvent]:
        """Events oldest first; `limit` keeps the newest ones."""
        sql = "SELECT id, time, kind, reason, data FROM events"
        params: tuple[Any, ...] = ()
        if since is not None:
            sql += " WHERE time >= ?"
            params = (_utc(since),)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        rows = self._read(sql, params)
        return [JournalEvent(i, datetime.fromisoformat(t), k, r, json.loads(d)) for i, t, k, r, d in reversed(rows)]

    def last_event(self, kind: str) -> JournalEvent | None:
        """The newest event of `kind`, or None."""
        rows = self._read("SELECT id, time, kind, reason, data FROM events WHERE kind = ? ORDER BY id DESC LIMIT 1",
                          (kind,))
        return next((JournalEvent(i, datetime.fromisoformat(t), k, r, json.loads(d)) for i, t, k, r, d in rows), None)

    def events_after(self, event_id: int) -> list[JournalEvent]:
        """Events with an id above `event_id`, oldest first."""
        rows = self._read("SELECT id, time, kind, reason, data FROM events WHERE id > ? ORDER BY id", (event_id,))
        return [JournalEvent(i, datetime.fromisoformat(t), k, r, json.loads(d)) for i, t, k, r, d in rows]

    # -- attempts -------------------------------------------------------------------------------

    def start_attempt(self, number: int, start: datetime, node_id: str, start_step: int | None) -> None:
        """Record a launch; launching the same number again restarts its row."""
        self._write(
            "INSERT INTO attempts (number, start, node_id, start_step) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (number) DO UPDATE SET start = excluded.start, node_id = excluded.node_id, "
            "start_step = excluded.start_step, end = NULL, end_step = NULL, outcome = NULL, charged = NULL, "
            "exit_code = NULL, reason = ''",
            (number, _utc(start), node_id, start_step),
        )

    def end_attempt(self, end: AttemptEnd) -> None:
        """Record (or re-classify) how an attempt ended."""
        self._write(
            "INSERT INTO attempts (number, start, end, node_id, start_step, end_step, outcome, charged, exit_code, reason) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (number) DO UPDATE SET end = excluded.end, "
            "end_step = excluded.end_step, outcome = excluded.outcome, charged = excluded.charged, "
            "exit_code = excluded.exit_code, reason = excluded.reason",
            (end.attempt, _utc(end.start), _utc(end.end), end.node_id, end.start_step, end.end_step, end.outcome,
             int(end.charged), end.exit_code, end.reason),
        )

    def attempts(self) -> list[AttemptRow]:
        rows = self._read("SELECT number, start, end, node_id, start_step, end_step, outcome, charged, exit_code, "
                          "reason FROM attempts ORDER BY number")
        return [
            AttemptRow(n, datetime.fromisoformat(s), _time(e), node, ss, es, o, None if c is None else bool(c), x, r)
            for n, s, e, node, ss, es, o, c, x, r in rows
        ]

    # -- bookmarks (the `cursors` table): never an input of a decision ----------------------------

    def _cursor(self, name: str) -> str | None:
        rows = self._read("SELECT value FROM cursors WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def _set_cursor(self, name: str, value: str | None) -> None:
        self._write("INSERT INTO cursors (name, value) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))

    def audit_cursor(self) -> str | None:
        """The audit-log reader's opaque bookmark (cloud/logs.py), or None before the first read."""
        return self._cursor("audit")

    def set_audit_cursor(self, cursor: str | None) -> None:
        self._set_cursor("audit", cursor)

    def alert_bookmark(self) -> int | None:
        """The id of the last journal event alerts were derived from ([[notify]]), or None before any."""
        text = self._cursor("notify_event")
        try:
            return int(text) if text is not None else None
        except ValueError:
            return 0

    def set_alert_bookmark(self, event_id: int) -> None:
        self._set_cursor("notify_event", str(event_id))

    def api_calls(self, errors: bool = False) -> dict[tuple[str, str], int]:
        """API requests (or their errors) of earlier runs, per (api, method), for `check --metrics-file`."""
        text = self._cursor("metrics_api_errors" if errors else "metrics_api_requests")
        try:
            return {(str(a), str(m)): int(n) for a, m, n in json.loads(text)} if text else {}
        except (ValueError, TypeError):
            return {}

    def set_api_calls(self, counts: Mapping[tuple[str, str], int], errors: bool = False) -> None:
        self._set_cursor("metrics_api_errors" if errors else "metrics_api_requests",
                         json.dumps(sorted([a, m, n] for (a, m), n in counts.items())))

    def precheck_report(self) -> dict[str, Any] | None:
        """The last environment-check report, as saved (workers/precheck.py), for `status`; None when none."""
        text = self._cursor("precheck_last")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def set_precheck_report(self, report: Mapping[str, Any]) -> None:
        self._set_cursor("precheck_last", json.dumps(dict(report), sort_keys=True))

    # -- the SSH login -------------------------------------------------------------------------

    def login(self) -> dict[str, Any] | None:
        """The user the watcher last logged in as ({"node_id", "user", "home", "via"}), or None."""
        text = self._cursor("ssh_login")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def set_login(self, data: Mapping[str, Any]) -> None:
        self._set_cursor("ssh_login", json.dumps(dict(data), sort_keys=True))

    # -- cloud operations -----------------------------------------------------------------------

    def add_operation(self, name: str, kind: str, zone: str, started: datetime) -> None:
        self._write("INSERT OR REPLACE INTO operations (name, kind, zone, started) VALUES (?, ?, ?, ?)",
                    (name, kind, zone, _utc(started)))

    def finish_operation(self, name: str, finished: datetime, error_code: int = 0, error_message: str = "") -> None:
        self._write("UPDATE operations SET finished = ?, error_code = ?, error_message = ? WHERE name = ?",
                    (_utc(finished), error_code, error_message, name))

    def operations(self, pending_only: bool = False) -> list[OperationRow]:
        sql = "SELECT name, kind, zone, started, finished, error_code, error_message FROM operations"
        if pending_only:
            sql += " WHERE finished IS NULL"
        rows = self._read(sql + " ORDER BY started, name")
        return [OperationRow(n, k, z, datetime.fromisoformat(s), _time(f), c, m) for n, k, z, s, f, c, m in rows]

    # -- alert deliveries ([[notify]]) ------------------------------------------------------------

    def add_delivery(self, key: str, target: int, kind: str, time: datetime, text: str,
                     data: Mapping[str, Any] | None = None) -> bool:
        """Record an alert to send (write-ahead); False when `key` was recorded before."""
        before = self._conn.total_changes
        self._write("INSERT OR IGNORE INTO deliveries (key, target, kind, time, text, data) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, target, kind, _utc(time), text, json.dumps(dict(data or {}), sort_keys=True, default=str)))
        return self._conn.total_changes > before

    def deliveries(self, pending_only: bool = False) -> list[DeliveryRow]:
        """Deliveries oldest first; `pending_only`: neither sent nor given up."""
        sql = ("SELECT key, target, kind, time, text, data, tries, next_try, sent, gave_up, last_error "
               "FROM deliveries")
        if pending_only:
            sql += " WHERE sent IS NULL AND gave_up IS NULL"
        rows = self._read(sql + " ORDER BY time, key")
        return [DeliveryRow(k, t, kind, datetime.fromisoformat(tm), text, json.loads(d), n, _time(nt), _time(s),
                            _time(g), e) for k, t, kind, tm, text, d, n, nt, s, g, e in rows]

    def delivery_tried(self, key: str, tries: int, *, sent: datetime | None = None, gave_up: datetime | None = None,
                       next_try: datetime | None = None, error: str = "") -> None:
        """Record what sending `key` came to: sent, given up, or to be tried again at `next_try`."""
        self._write("UPDATE deliveries SET tries = ?, sent = ?, gave_up = ?, next_try = ?, last_error = ? "
                    "WHERE key = ?",
                    (tries, _utc(sent) if sent else None, _utc(gave_up) if gave_up else None,
                     _utc(next_try) if next_try else None, error[:500], key))

    # -- saved spec -----------------------------------------------------------------------------

    def save_spec(self, spec: Mapping[str, Any]) -> None:
        self._write("INSERT INTO spec (id, data) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                    (json.dumps(dict(spec), sort_keys=True),))

    def load_spec(self) -> dict[str, Any] | None:
        rows = self._read("SELECT data FROM spec WHERE id = 1")
        if not rows:
            return None
        data = json.loads(rows[0][0])
        if not isinstance(data, dict):
            raise _corrupt(self.path, "saved spec is not an object")
        return data

    # -- what a tick does -----------------------------------------------------------------------

    def record(self, now: datetime, decision: Decision, operation: OperationStatus | None = None) -> None:
        """Journal one decision in one transaction: its memory, attempts, and events.

        Call it before carrying the actions out (write-ahead), so a process killed mid-action
        resumes from what it meant to do. `operation` is the status the tick observed, used to
        record how a finished operation ended.
        """
        with self.transaction():
            previous = self._read("SELECT value FROM meta WHERE key = 'last_row'")
            row_changed = not previous or previous[0][0] != decision.row
            before = self.load_memory()
            self.save_memory(decision.memory)
            self._note_progress(now, before, decision)
            noted = False
            for end in decision.ended:
                self.end_attempt(end)
                self.add_event(now, "attempt_end", end.reason, {
                    "attempt": end.attempt, "outcome": end.outcome, "charged": end.charged,
                    "exit_code": end.exit_code, "start_step": end.start_step, "end_step": end.end_step})
                noted = True
            for action in decision.actions:
                if isinstance(action, Launch):
                    self.start_attempt(action.attempt, now, decision.memory.attempt.node_id,
                                       decision.memory.attempt.start_step)
                if action.kind in _UNNOTED_ACTIONS:
                    continue
                if action.kind not in _QUIET_ACTIONS:
                    self.add_event(now, action.kind, action.reason, action_dict(action))
                    noted = True
                elif row_changed:  # the summary says what is being waited for, and why
                    self.add_event(now, action.kind, decision.summary, action_dict(action))
                    noted = True
            if decision.operation_done:
                op = operation if operation is not None and operation.name == decision.operation_done else None
                self.finish_operation(decision.operation_done, now, op.error_code if op else 0,
                                      op.error_message if op else "")
            if not noted and row_changed:
                self.add_event(now, "status", decision.summary, {"row": decision.row,
                                                                 "phase": decision.memory.phase.value})
            self._write("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_row', ?)", (decision.row,))

    def _note_progress(self, now: datetime, before: Memory | None, decision: Decision) -> None:
        """A `phase` event when the phase changes and a `checkpoint` event when the running
        attempt shows a newer checkpoint: what `tpuwatch report` needs to say where time went,
        since neither can be observed again later. And a `checkpoint_stale` event when the
        policy's warning that no checkpoint is being saved starts to stand (its alert)."""
        mem = decision.memory
        if decision.checkpoint_warning and (before is None or before.marks.checkpoint_warned is None):
            self.add_event(now, "checkpoint_stale", decision.checkpoint_warning, {"attempt": mem.attempt.number})
        old = before.phase.value if before is not None else None
        if old != mem.phase.value:
            self.add_event(now, "phase", f"{old or 'start'} -> {mem.phase.value}",
                           {"from": old, "to": mem.phase.value, "row": decision.row})
        seen = (mem.hang.progress_step, mem.hang.progress_time)
        if mem.hang.progress_step is not None and mem.hang.progress_time is not None and (
                before is None or (before.hang.progress_step, before.hang.progress_time) != seen):
            self.add_event(now, "checkpoint",
                           f"attempt {mem.attempt.number} saved checkpoint step {mem.hang.progress_step}",
                           {"attempt": mem.attempt.number, "step": mem.hang.progress_step,
                            "time": mem.hang.progress_time.isoformat()})

    def record_operation(self, now: datetime, memory: Memory, name: str, kind: str, zone: str) -> Memory:
        """After DeleteNode/CreateNode returned operation `name`: journal it; the memory to carry on."""
        mem = operation_started(memory, name, now)
        with self.transaction():
            self.save_memory(mem)
            if name:
                self.add_operation(name, kind, zone, now)
        return mem


# ---------------------------------------------------------------------------------------------
# opening helpers


def _private_dir(state_dir: Path) -> None:
    """Create the state dir 0700, or check an existing one is a directory only its owner may write."""
    try:
        _private_dir_checks(state_dir)
    except JournalError:
        raise
    except OSError as exc:  # a name too long, a file where a directory should be, ...
        raise JournalError(f"state dir {str(state_dir)[:200]!r} cannot be used: {exc.strerror or exc}; set "
                           "TPUWATCH_STATE_DIR to a directory you can write", exit_code=EXIT_USAGE) from None


def _private_dir_checks(state_dir: Path) -> None:
    if not state_dir.exists():
        try:
            # exist_ok: jobs (threads of one watcher, or watchers) starting together all create it
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(state_dir, 0o700)
        except OSError as exc:
            raise JournalError(f"cannot create state dir {state_dir}: {exc.strerror}; set TPUWATCH_STATE_DIR "
                               "to a directory you can write", exit_code=EXIT_USAGE) from None
    if not state_dir.is_dir():
        raise JournalError(f"state dir {state_dir} is not a directory; set TPUWATCH_STATE_DIR to a directory",
                           exit_code=EXIT_USAGE)
    st = state_dir.stat()
    if st.st_uid != os.getuid():
        raise JournalError(f"state dir {state_dir} belongs to another user (uid {st.st_uid}); set "
                           "TPUWATCH_STATE_DIR to a directory of your own", exit_code=EXIT_USAGE)
    if st.st_mode & 0o022:
        raise JournalError(
            f"state dir {state_dir} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod go-w {state_dir}` or set TPUWATCH_STATE_DIR to a private directory",
            exit_code=EXIT_USAGE)


def _lock(lock_path: Path, job: str, wait: bool) -> int:
    """The job's writer lock, held until the returned descriptor is closed."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalError(f"cannot open lock file {lock_path}: {exc.strerror}", exit_code=EXIT_USAGE) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise Busy(f"another tpuwatch{who} is working on {job}; nothing to do") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the pid is only a hint for the Busy message (a full disk must not stop here)
    return fd


def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """Connect without ever creating the file; refuse what is not a SQLite database."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise JournalError(f"cannot read journal {path}: {exc.strerror}") from None
    if head and head != SQLITE_MAGIC:
        raise _corrupt(path, "not a SQLite database")
    # A writer killed mid-transaction leaves a hot rollback journal (<db>-journal). SQLite rolls
    # it back on the next read, but only through a connection allowed to write; a read-only
    # connection fails with "attempt to write a readonly database". So a reader that may write
    # the file opens it read-write (it still never writes data: Journal refuses writes).
    hot = readonly and os.path.exists(f"{path}-journal") and os.access(path, os.W_OK)
    mode = "ro" if readonly and not hot else "rw"
    try:
        # fsencode: a path that is not UTF-8 (surrogate-escaped) reaches SQLite as its own bytes
        conn = sqlite3.connect(f"file:{quote(os.fsencode(path))}?mode={mode}", uri=True, isolation_level=None,
                               timeout=5.0)
    except sqlite3.Error as exc:
        raise _corrupt(path, str(exc)) from None
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")  # negative: KiB, not pages
    return conn


def _is_empty(conn: sqlite3.Connection, path: Path) -> bool:
    """True for a database with no tables: a journal whose creation was interrupted."""
    try:
        return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    except sqlite3.DatabaseError as exc:
        raise _corrupt(path, str(exc)) from None


def _create(conn: sqlite3.Connection, path: Path, job: str, tpu_name: str) -> None:
    meta = [("schema_version", str(SCHEMA_VERSION)), ("tpu_name", tpu_name), ("job", job),
            ("created_by", f"tpuwatch {__version__}")]
    _ddl(conn, path, _SCHEMA, meta, what="create")


def _add_tables(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables of _ADDED a journal lacks (nothing is written when it has them)."""
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'deliveries'").fetchone():
            return
    except sqlite3.Error as exc:
        raise JournalError(f"cannot update journal {path}: {exc}") from None
    _ddl(conn, path, _ADDED, [], what="update")


def _ddl(conn: sqlite3.Connection, path: Path, statements: str, meta: list[tuple[str, str]], *, what: str) -> None:
    """Run `statements` (and insert `meta`) in one transaction; JournalError naming the file."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements.split(";"):
            if statement.strip():
                conn.execute(statement)
        if meta:
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if "full" in str(exc):
            raise JournalError(f"cannot {what} journal {path}: the disk is full. Free space in {path.parent} "
                               "and run again") from None
        raise JournalError(f"cannot {what} journal {path}: {exc}") from None


def _validate(conn: sqlite3.Connection, path: Path, job: str, tpu_name: str | None) -> str:
    """Check integrity, schema version and owner TPU; the TPU name the journal belongs to."""
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise _corrupt(path, f"integrity check: {check[0] if check else 'no answer'}")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise _corrupt(path, "a SQLite file, but not a tpuwatch journal (no meta table)")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        if "readonly" in str(exc):  # a hot journal this reader may not roll back: not corruption
            raise JournalError(
                f"journal {path} holds a write left unfinished by a tpuwatch that was killed; it is rolled "
                "back by the next `tpuwatch check` or `watch` (or by anyone allowed to write the file)",
                exit_code=EXIT_JOB_FAILED) from None
        raise _corrupt(path, str(exc)) from None
    try:
        version = int(meta.get("schema_version", ""))
    except ValueError:
        raise _corrupt(path, f"schema version {meta.get('schema_version')!r}") from None
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"journal {path} was written by a newer tpuwatch ({meta.get('created_by', '?')}, schema {version}; "
            f"this tpuwatch {__version__} reads schema {SCHEMA_VERSION}). Upgrade tpuwatch; the file is left as it is",
            exit_code=EXIT_USAGE)
    missing = {"events", "attempts", "memory", "cursors", "operations", "spec"} - tables
    if missing:
        raise _corrupt(path, f"missing table {sorted(missing)[0]}")
    owner = meta.get("tpu_name", "")
    if tpu_name is not None and owner != tpu_name:
        raise JournalError(
            f"journal {path} belongs to TPU {owner!r}, not {tpu_name!r}: two TPUs share the job name {job!r}. "
            f"Give this one its own job.name in the config (or move the file away if TPU {owner!r} is gone)",
            exit_code=EXIT_USAGE)
    return owner


def _corrupt(path: Path, detail: str) -> JournalError:
    return JournalError(
        f"journal {path} is corrupt or not a tpuwatch journal ({detail}). tpuwatch will not overwrite it: "
        "move it away to start a new journal (budgets and history start over), or restore it from a backup",
        exit_code=EXIT_JOB_FAILED)
