"""The lock a spare pool's claims are made under (policy/pool.py): an flock of
`pool.<name>.lock` in the state dir, held across the read of the spare, its label write and the
wait for that write to land.

The TPU API applies a label write when its operation ends, so a read next to the write alone
would let a second job see the spare still idle and claim it too. flock locks belong to an open
file, so the jobs of one watcher (threads of one process) exclude each other as watchers sharing
the state dir do. Watchers on other machines (other state dirs) are not excluded: for them only
the read next to the write stands, and docs/multislice.md says so.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tpuwatch.errors import CloudError
from tpuwatch.model import NodeSnapshot

LOCK_WAIT = 120.0  # seconds a claim waits for another's to end
LAND_WAIT = 60.0  # seconds a claim waits for its label to land
LOOK_EVERY = 0.5  # seconds between reads while it waits


@contextmanager
def held(state_dir: Path, pool: str) -> Iterator[None]:
    """Hold spare pool `pool`'s lock in `state_dir` (CloudError when it stays taken: the tick
    decides again next time)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"pool.{pool}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CloudError(f"spare pool {pool}'s lock {path} stayed taken for {LOCK_WAIT:g} s "
                                     "(another claim is slow); not claimed this time") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the flock


def _record(state_dir: Path, pool: str) -> Path:
    return state_dir / f"pool.{pool}.remaking"


def remaking(state_dir: Path, pool: str) -> tuple[str, ...]:
    """The spares of pool `pool` tpuwatch deleted to make again and has not made yet, as the
    state dir's record `pool.<name>.remaking` says (every keeper reads it: the job that deleted
    one may end, or stop being the keeper, before its create). () when there is none."""
    try:
        names = json.loads(_record(state_dir, pool).read_text())
    except (OSError, ValueError):
        return ()
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def record(state_dir: Path, pool: str, names: tuple[str, ...]) -> None:
    """Write the pool's record of spares deleted to make again (replaced whole, so a kill -9
    leaves the old record or the new one)."""
    path = _record(state_dir, pool)
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    # private as the state dir's other files (the journal, the locks)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(list(names)))
    os.replace(tmp, path)


def wait_for(read: Callable[[], NodeSnapshot | None], job: str, sleep: Callable[[float], None]) -> bool:
    """Whether the node `read` returns is labelled job `job`'s within LAND_WAIT seconds."""
    deadline = time.monotonic() + LAND_WAIT
    while True:
        node = read()
        if node is not None and node.owned_by(job):
            return True
        if node is None or node.owner not in (None, job) or time.monotonic() >= deadline:
            return False
        sleep(LOOK_EVERY)


# The keeper locks this process holds: (state dir, pool) -> [its open file, the job, when it last
# asked]. A keeper that stops asking (its job no longer watched) is replaced by the next job of the
# pool in this process after KEEPER_IDLE seconds; the flock itself is released when the process ends.
KEEPER_IDLE = 60.0
_keepers: dict[tuple[str, str], list[object]] = {}
_keepers_lock = threading.Lock()


def keeper(state_dir: Path, pool: str, job: str) -> bool:
    """Whether job `job` is spare pool `pool`'s keeper, the one job that makes its dead idle spares
    again: it holds `pool.<name>.keeper` in the state dir (an flock, never waited for), shared by
    the jobs of this process and of every watcher of that state dir. False when the state dir
    cannot be used (no keeper then: said by the docs, never a crash)."""
    key = (str(state_dir), pool)
    now = time.monotonic()
    with _keepers_lock:
        held = _keepers.get(key)
        if held is not None:
            if held[1] == job or now - float(held[2]) >= KEEPER_IDLE:  # type: ignore[arg-type]
                held[1], held[2] = job, now
                return True
            return False
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(state_dir / f"pool.{pool}.keeper", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # another watcher keeps the pool
            return False
        _keepers[key] = [fd, job, now]
        return True
