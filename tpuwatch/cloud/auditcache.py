"""The shared audit-log reader (ports.AuditLog): one Logging query per project per `max_age`.

Every `tpuwatch watch` reads the system-event audit log for its own node about once a minute,
and the Logging read quota is 60 requests/min/project by default (an increase can be
requested, but tpuwatch must work without one), so a few dozen watchers of one project would
be throttled. `SharedAuditLog` makes their reads share one
query: the TPU system events of the whole project are kept in a small SQLite file in the state
directory (`audit.<project>.db`, private like the journals), and a read is answered from it
while it is at most `max_age` old (15 s; 2 s for a reader that reads again within 30 s, as the
tick does while something looks wrong) and covers the read's start. Otherwise the reader that
comes first queries (from the older of its start and the last query's time less `overlap`, so
the cache stays contiguous and late entries are found) and stores what it got for the others.
However many watchers share the directory, the project sees at most one query per `max_age`
while all is quiet (4/min), one per `urgent_max_age` while some watcher looks hard (30/min),
and no more after a failed query (the others are told of it instead of querying too).

The file is touched only under an flock of `<file>.lock`, held for the cache's reads and writes
and across the one query (so waiters take its answer instead of querying too), never longer.
A cache that cannot be read is started again; a state dir that cannot be used falls back to a
direct query (AuditLogReader), with a warning once. Query errors are CloudError, as from
AuditLogReader.

The cursor is logs.py's, with the same meaning; one difference: a read answered up to a query
time T also moves the cursor's newest time to T, so the next read starts `overlap` before T,
not before the job's last event. (Without it a quiet job's start would stay at its first read
and fall out of the cache's retention, and every read of it would query again.) An entry that
reaches the log up to `overlap` late is still found.

The query names the Compute Engine instances its readers watch (table `scope`; a reader's
instances are those of its eager `instances` mapping): a reader whose instance is not in it, or
not from the read's start, queries at once with it added.

This module knows the cache file; the query, the entry shape and the matching of entries to
nodes are logs.py's. It knows nothing of the policy or of when the tick reads.
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

from tpuwatch.cloud.logs import (
    PAGE_SIZE,
    AuditLogReader,
    RawEntry,
    check_nodes,
    decode_cursor,
    encode_cursor,
    event_of,
    take_new,
    to_ns,
)
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import CloudError, TpuwatchError
from tpuwatch.journal import _private_dir
from tpuwatch.model import AuditEvent

CACHE_VERSION = "1"
_NS = 1_000_000_000
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE entries (ns INTEGER NOT NULL, insert_id TEXT NOT NULL, method TEXT NOT NULL, "
    "resource_name TEXT NOT NULL, worker_label TEXT, reason TEXT NOT NULL, PRIMARY KEY (ns, insert_id))",
)
# The Compute Engine instances the readers watch ("zones/Z/instances/N"), which the shared query
# names: the entries about one are stored from `since` on; one no reader has asked for in
# SCOPE_TTL leaves the query. Made where missing, so a cache written before it is kept.
_SCOPE_TABLE = ("CREATE TABLE IF NOT EXISTS scope (resource TEXT PRIMARY KEY, since INTEGER NOT NULL, "
                "wanted_at INTEGER NOT NULL)")
SCOPE_TTL = timedelta(hours=1)


def cache_path(state_dir: Path | str, project: str) -> Path:
    """The cache file of `project` in `state_dir`.

    The dot keeps it apart from the journals (`<job>.db`: job names have no dots).
    """
    return Path(state_dir) / f"audit.{re.sub(r'[^A-Za-z0-9_-]', '_', project)}.db"


class _Unusable(Exception):
    """The cache cannot be used at all (state dir, lock file): query directly instead."""


@dataclass(frozen=True)
class _Meta:
    covered_from: int | None  # every entry from here on, as visible at read_at, is stored
    read_at: int | None  # time (ns) taken just before the last successful query
    failed_at: int | None  # time of the last failed query
    failure: str


class SharedAuditLog:
    """ports.AuditLog for one project, sharing queries through a cache file in `state_dir`."""

    def __init__(
        self,
        project: str,
        state_dir: Path | str,
        *,
        zone: str | None = None,
        retry: RetryPolicy | None = None,
        page_size: int = PAGE_SIZE,
        overlap: timedelta = timedelta(minutes=10),
        initial_lookback: timedelta = timedelta(hours=1),
        max_age: timedelta = timedelta(seconds=15),
        urgent_max_age: timedelta = timedelta(seconds=2),
        urgent_within: timedelta = timedelta(seconds=30),
        retention: timedelta = timedelta(hours=24),
        lock_timeout: float = 20.0,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        on_warning: Callable[[str], None] | None = None,
        direct: AuditLogReader | None = None,
    ) -> None:
        self.project = project
        self.zone = zone
        self.state_dir = Path(state_dir)
        self.path = cache_path(self.state_dir, project)
        # The jobs of one watcher pass one reader per project and zone: one Logging client, not one each.
        self.direct = direct or AuditLogReader(project, zone=zone, retry=retry, page_size=page_size,
                                               overlap=overlap, initial_lookback=initial_lookback, now=now)
        self.overlap_ns = int(overlap.total_seconds() * _NS)
        self.initial_lookback = initial_lookback
        self.max_age_ns = int(max_age.total_seconds() * _NS)
        self.urgent_max_age_ns = int(urgent_max_age.total_seconds() * _NS)
        self.urgent_within_ns = int(urgent_within.total_seconds() * _NS)
        self._last_read_ns: int | None = None
        # Kept at least as far back as a first read starts, or first reads would never share.
        self.retention_ns = int(max(retention, initial_lookback + overlap + max_age).total_seconds() * _NS)
        self.lock_timeout = lock_timeout
        self.now = now
        self.on_warning = on_warning
        self.warning: str | None = None  # the last warning, also passed to on_warning once per kind
        self.queries = 0  # ListLogEntries queries this instance made (shared or direct)
        self._warned: set[str] = set()
        self._pending: list[str] = []  # warnings not yet taken by take_warnings()

    # -- the port ---------------------------------------------------------------------------------

    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        """Events about `nodes` not returned before under `cursor`, oldest first, and the new cursor.

        As AuditLogReader.read, but answered from the shared cache when it is fresh (the shared
        query holds every TPU node's entries and every TPU worker VM's).
        """
        names = check_nodes(nodes)
        wanted = self._scope_of(instances)
        now_ns = to_ns(self.now())
        # A read soon after this reader's last one is the tick looking again because something
        # looks wrong: it wants what the log holds now, so a cache older than urgent_max_age is
        # queried again (still one query for every reader in that time: <= 30/min at 2 s).
        urgent = self._last_read_ns is not None and 0 <= now_ns - self._last_read_ns < self.urgent_within_ns
        self._last_read_ns = now_ns
        max_age_ns = self.urgent_max_age_ns if urgent else self.max_age_ns
        state = decode_cursor(cursor)
        seen: set[tuple[int, str]]
        if state is None:
            high, seen = now_ns - int(self.initial_lookback.total_seconds() * _NS), set()
        else:
            high, seen = state
        if not names:
            return [], encode_cursor(high, seen)
        start = max(0, high - self.overlap_ns)
        try:
            rows, upto = self._rows_from(start, soft=state is None, max_age_ns=max_age_ns, wanted=wanted)
        except _Unusable as exc:
            self._warn("direct", f"shared audit-log cache {self.path} not used ({exc}); "
                                 "this watcher queries the audit log itself")
            self.queries += 1
            return self.direct.read(names, cursor, instances)
        found: list[tuple[int, AuditEvent]] = []
        for raw in rows:
            ev = event_of(raw, names, self.zone, instances)
            if ev is not None:
                found.append((raw.ns, ev))
        fresh, high, seen = take_new(found, high, seen, self.overlap_ns)
        if upto > high:
            # Everything up to `upto` (the query time) was in `found`: start the next read
            # `overlap` before it, as for an entry seen at that time.
            high = upto
            seen = {k for k in seen if k[0] >= high - self.overlap_ns}
        return fresh, encode_cursor(high, seen)

    def cursor_at(self, start_time: datetime) -> str:
        """A cursor whose first read returns events from `start_time` on (e.g. the job's start)."""
        return self.direct.cursor_at(start_time)

    def _scope_of(self, instances: Mapping[str, tuple[str, str]] | None) -> frozenset[str] | None:
        """The Compute Engine instances of a read, as the shared query names them; None when they
        cannot be named (no zone), so the query takes every instance's events. A lazy mapping
        (a TPU node's worker VMs, read on first use) is not read: the query's `instances/t1v-n-`
        clause covers those."""
        if not isinstance(instances, dict) or not instances:
            return frozenset()
        if not self.zone:
            return None
        return frozenset(f"zones/{self.zone}/instances/{n}" for n in instances if not n.startswith("t1v-n-"))

    # -- the cache ----------------------------------------------------------------------------------

    def _rows_from(self, start: int, soft: bool, max_age_ns: int,
                   wanted: frozenset[str] | None = frozenset()) -> tuple[list[RawEntry], int]:
        """Every stored entry from `start` on (querying first when needed), and the query time.

        `soft`: `start` is only `initial_lookback` before now (no cursor), so a cache that covers
        from up to `max_age` later is good enough: readers starting together share one query.
        """
        try:
            # exist_ok: two watchers starting together must not race to create it; the checks
            # (owner, mode) are the journal's.
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass  # reported by _private_dir
        try:
            _private_dir(self.state_dir)
        except TpuwatchError as exc:
            raise _Unusable(exc.message) from None
        fd = self._lock()
        try:
            for again in (False, True):
                conn: sqlite3.Connection | None = None
                try:
                    conn = self._open(reset=again)
                    return self._answer(conn, start, soft, max_age_ns, wanted)
                except sqlite3.DatabaseError as exc:
                    # Only before any query (after one, _answer keeps its result): start again.
                    if again:
                        raise _Unusable(f"it cannot be written: {exc}") from None
                    self._warn("reset", f"shared audit-log cache {self.path} was unreadable ({exc}); "
                                        "started it again")
                finally:
                    if conn is not None:
                        conn.close()
            raise AssertionError("unreachable")
        finally:
            os.close(fd)  # releases the flock

    def _lock(self) -> int:
        """The cache's flock, waited for at most lock_timeout seconds."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _Unusable(f"cannot open {lock_path}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    # Querying now would add to what is likely throttling; the tick reads next time.
                    raise CloudError(f"the shared audit-log cache {self.path} stayed locked for "
                                     f"{self.lock_timeout:g} s (another tpuwatch's query is slow); "
                                     "not read this time") from None
                time.sleep(0.02)
            except OSError as exc:  # e.g. ENOLCK on a file system without locks
                os.close(fd)
                raise _Unusable(f"cannot lock {lock_path}: {exc.strerror or exc}") from None

    def _open(self, reset: bool) -> sqlite3.Connection:
        """The cache database, created if missing; sqlite3.DatabaseError when it is not ours."""
        if self.path.is_symlink():
            raise _Unusable("it is a symbolic link")
        if reset:
            for p in (self.path, Path(f"{self.path}-journal")):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise _Unusable(f"cannot remove it: {exc.strerror or exc}") from None
        try:
            if not self.path.exists():
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except OSError as exc:
            raise _Unusable(f"cannot create it: {exc.strerror or exc}") from None
        conn = sqlite3.connect(f"file:{quote(os.fsencode(self.path))}?mode=rw", uri=True,
                               isolation_level=None, timeout=5.0)
        try:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                conn.execute("BEGIN IMMEDIATE")
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                 [("version", CACHE_VERSION), ("project", self.project)])
                conn.execute("COMMIT")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("version") != CACHE_VERSION or meta.get("project") != self.project:
                raise sqlite3.DatabaseError(f"not a version {CACHE_VERSION} audit cache of project {self.project}")
            conn.execute(_SCOPE_TABLE)
        except BaseException:
            conn.close()
            raise
        return conn

    def _meta(self, conn: sqlite3.Connection) -> _Meta:
        m = dict(conn.execute("SELECT key, value FROM meta").fetchall())

        def num(key: str) -> int | None:
            v = m.get(key)
            return int(v) if v is not None else None

        try:
            return _Meta(num("covered_from"), num("read_at"), num("failed_at"), str(m.get("failure") or ""))
        except ValueError as exc:
            raise sqlite3.DatabaseError(f"bad meta value: {exc}") from None

    def _answer(self, conn: sqlite3.Connection, start: int, soft: bool, max_age_ns: int,
                wanted: frozenset[str] | None = frozenset()) -> tuple[list[RawEntry], int]:
        now_ns = to_ns(self.now())
        meta = self._meta(conn)
        if soft and meta.covered_from is not None and 0 < meta.covered_from - start <= max_age_ns:
            start = meta.covered_from
        scope = {r: int(since) for r, since in conn.execute(
            "SELECT resource, since FROM scope WHERE wanted_at >= ?", (now_ns - int(SCOPE_TTL.total_seconds() * _NS),))}
        if wanted:
            conn.executemany("UPDATE scope SET wanted_at = ? WHERE resource = ?", [(now_ns, r) for r in wanted])
        # A read's instance not in the shared query yet, or not from this read's start: query now.
        need = (set() if wanted is None else {r for r in wanted if r not in scope or scope[r] > start})
        # abs(): a read_at up to max_age ahead is another clock's (or an earlier sample's) "now".
        if (meta.read_at is not None and meta.covered_from is not None and meta.covered_from <= start
                and abs(now_ns - meta.read_at) <= max_age_ns and not need and wanted is not None):
            return self._select(conn, start), meta.read_at
        if (meta.failed_at is not None and (meta.read_at is None or meta.failed_at > meta.read_at)
                and 0 <= now_ns - meta.failed_at <= max_age_ns):
            age = (now_ns - meta.failed_at) / _NS
            raise CloudError(f"{meta.failure} (the shared audit-log query failed {age:.0f} s ago; "
                             f"the next one is after {max_age_ns / _NS:g} s)")
        joined = None if meta.read_at is None or meta.covered_from is None else meta.read_at - self.overlap_ns
        if joined is not None and joined < now_ns - self.retention_ns:
            joined = None  # too old to keep: query what this read needs only
        q_start = start if joined is None else min(start, joined)
        q_scope = None if wanted is None else set(scope) | set(wanted)
        try:
            self.queries += 1
            rows = self.direct.query_raw(None, q_start, scope=q_scope)
        except CloudError as exc:
            try:
                conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                 [("failed_at", str(now_ns)), ("failure", exc.message)])
            except sqlite3.Error:
                pass  # the failure is raised all the same
            raise
        try:
            return self._store(conn, meta, q_start, joined, now_ns, rows, start, need), now_ns
        except sqlite3.Error as exc:
            self._warn("store", f"shared audit-log cache {self.path} not updated ({exc})")
            return [r for r in rows if r.ns >= start], now_ns

    def _store(self, conn: sqlite3.Connection, meta: _Meta, q_start: int, joined: int | None, now_ns: int,
               rows: list[RawEntry], start: int, need: set[str] | None = None) -> list[RawEntry]:
        """Merge a query from q_start made at now_ns; the entries from `start` on. The instances
        of `need` entered the query with it: stored from q_start on."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if joined is not None and meta.covered_from is not None and q_start <= joined:
                covered = min(meta.covered_from, q_start)
            else:
                conn.execute("DELETE FROM entries")  # not contiguous with what is stored
                conn.execute("UPDATE scope SET since = max(since, ?)", (q_start,))
                covered = q_start
            conn.executemany("INSERT INTO scope (resource, since, wanted_at) VALUES (?, ?, ?) ON CONFLICT(resource) "
                             "DO UPDATE SET since = min(since, excluded.since), wanted_at = excluded.wanted_at",
                             [(r, q_start, now_ns) for r in need or ()])
            conn.execute("DELETE FROM scope WHERE wanted_at < ?", (now_ns - int(SCOPE_TTL.total_seconds() * _NS),))
            conn.executemany(
                "INSERT OR IGNORE INTO entries (ns, insert_id, method, resource_name, worker_label, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.ns, r.insert_id, r.method, r.resource_name, r.worker_label, r.reason) for r in rows])
            answer = self._select(conn, start)
            cutoff = now_ns - self.retention_ns
            if covered < cutoff:
                conn.execute("DELETE FROM entries WHERE ns < ?", (cutoff,))
                covered = cutoff
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [("covered_from", str(covered)), ("read_at", str(now_ns)),
                              ("failed_at", None), ("failure", None)])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return answer

    @staticmethod
    def _select(conn: sqlite3.Connection, start: int) -> list[RawEntry]:
        cur = conn.execute("SELECT ns, insert_id, method, resource_name, worker_label, reason FROM entries "
                           "WHERE ns >= ? ORDER BY ns, rowid", (start,))
        return [RawEntry(int(ns), str(iid), str(m), str(res), w, str(reason)) for ns, iid, m, res, w, reason in cur]

    def take_warnings(self) -> list[str]:
        """The warnings (once per kind) since the last call: the tick reports them."""
        out, self._pending = self._pending, []
        return out

    def _warn(self, kind: str, text: str) -> None:
        self.warning = text
        if kind not in self._warned:
            self._warned.add(kind)
            self._pending.append(text)
            if self.on_warning is not None:
                self.on_warning(text)
