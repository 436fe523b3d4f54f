"""What a watcher killed at a bad moment leaves behind, and how the next one must read it.

Pure policy tests of cases the chaos runs (test_chaos.py) found: each reproduces, with the
policy's own values, the journal and worker state a SIGKILL left, and checks the next tick.
"""

from __future__ import annotations

from policy_support import at, ckpt, event, obs, probe, run_mem, tick

from tpuwatch.policy import Launch


def test_an_attempt_killed_by_a_reboot_before_any_tick_saw_it_is_a_disruption_not_a_failed_start() -> None:
    """Watcher A launched attempt 1 and was killed; the host rebooted (maintenance) before any
    watcher looked. The workers show attempt 1 with no exit code and no process ("absent"). The
    attempt did start: it is ended and classified by the evidence, never relaunched under the
    same number (which the workers refuse as "ran") nor charged as "never started"."""
    m = run_mem(seen=False, start=0)
    gone = tuple(probe(w, "absent", attempt=1) for w in range(2))
    o = obs(probes=gone, checkpoint=ckpt(130), events=(event("restart", at(40)),))
    d = tick(o, m, now=60)
    assert not any(isinstance(a, Launch) for a in d.actions), d
    assert d.row == "disruption", (d.row, d.summary)
    end = d.ended[0]
    assert end.outcome == "disruption" and not end.charged and end.end_step == 130
    assert "never started" not in end.reason
    assert d.memory.budgets.restarts == 0


def test_an_attempt_that_left_no_trace_at_all_is_still_relaunched() -> None:
    """No attempt file on any worker: the launch never reached them; relaunch the same number."""
    m = run_mem(seen=False, start=0)
    none = tuple(probe(w, "absent", attempt=None) for w in range(2))
    d = tick(obs(probes=none, checkpoint=ckpt(100)), m, now=5)
    assert d.row == "launch_unseen" and isinstance(d.actions[0], Launch) and d.actions[0].attempt == 1
