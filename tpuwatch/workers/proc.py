"""Run a local client (ssh, gcloud) in a process group of its own, and end the whole group.

`subprocess.run(timeout=...)` kills only the child it started: gcloud's ssh child, or the
ProxyCommand that ssh started, lives on and keeps its connection (and the worker's session)
open. Here the client leads a new session, and a timeout (or `kill_group`) signals every
process of that group: TERM, a short grace, then KILL. `end_group` does the same without
waiting, for clients that another thread reaps (a follow channel's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

KILL_GRACE = 2.0  # seconds between TERM and KILL for the group


@dataclass(frozen=True)
class Finished:
    """How a client ended: its exit status (None when it timed out or could not start)."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


def kill_group(proc: subprocess.Popen[bytes], grace: float = KILL_GRACE) -> None:
    """TERM the process group `proc` leads, KILL it after `grace`; reap `proc`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(proc.pid):
            time.sleep(0.02)
        if not _group_alive(proc.pid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process group `proc` leads and return at once; one shared thread KILLs what
    is left of the group after KILL_GRACE. The caller's thread that runs `proc` reaps it.

    Closing a pod's follow channels so costs one grace in all instead of one wait per client:
    256 channels ended one after the other held the watcher for seconds after a maintenance.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    _LATER.add(proc)


class _KillLater:
    """Process groups to KILL at their deadline if they are still there, by one daemon thread
    that lives while any is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # (deadline, group leader), deadlines in order
        self._due: deque[tuple[float, subprocess.Popen[bytes]]] = deque()
        self._thread: threading.Thread | None = None

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._cond:
            self._due.append((time.monotonic() + KILL_GRACE, proc))  # one grace: in order
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="tpuwatch-kill-later")
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._due:
                    self._thread = None
                    return
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                _, proc = self._due.popleft()
            if proc.poll() is None or _group_alive(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)


_LATER = _KillLater()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(argv: Sequence[str], stdin: bytes, timeout: float) -> Finished:
    """Run `argv` with `stdin` in a new session; on timeout end its whole group.

    OSError (no such program) propagates, as from subprocess.run.
    """
    # Own session: a Ctrl-C meant for tpuwatch must not kill a launch half-way, and the
    # group is what a timeout ends.
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        # the pipes close once every process of the group is gone
        out, err = _drain(proc)
        return Finished(None, out, err, timed_out=True)
    except BaseException:
        kill_group(proc)
        raise
    # The client ended; a child it left in its group (ssh's ProxyCommand) goes with it.
    if _group_alive(proc.pid):
        kill_group(proc, grace=0.2)
    return Finished(proc.returncode, out, err)


def _drain(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    try:
        return proc.communicate(timeout=KILL_GRACE)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return b"", b""
