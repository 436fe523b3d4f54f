"""Run a local client (ssh, gcloud) in a process group of its own, and end the whole group.

`subprocess.run(timeout=...)` kills only the child it started: gcloud's ssh child, or the
ProxyCommand that ssh started, lives on and keeps its connection (and the worker's session)
open. Here the client leads a new session, and a timeout (or `kill_group`) signals every
process of that group: TERM, a short grace, then KILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
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
