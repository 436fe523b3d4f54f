"""Ending a local client's process group (workers/proc.py), on real local processes: the
clients are ours (ssh, gcloud), so there is no simulator boundary to reach here."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tpuwatch.workers import proc


def _client(script: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"  # its traps are set
    return p


def _group_gone(pgid: int, within: float = 30.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_end_group_returns_at_once_and_kills_a_group_that_ignores_term_after_the_grace() -> None:
    # Each group ignores TERM, a child included: only the later KILL can end it. With a wait per
    # client (kill_group), each call would return only after its client was KILLed.
    stubborn = [_client("trap '' TERM; sleep 60 & echo ready; wait") for _ in range(3)]
    polite = _client("trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done")
    for p in [*stubborn, polite]:
        proc.end_group(p)
    assert [p.poll() for p in stubborn] == [None, None, None]  # every call returned, the groups live on
    assert polite.wait(timeout=30) == 7  # the TERM was sent at once
    for p in stubborn:
        assert p.wait(timeout=30) == -signal.SIGKILL
        assert _group_gone(p.pid)  # its background child went with it
