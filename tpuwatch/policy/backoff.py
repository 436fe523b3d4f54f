"""Backoff between charged restarts and between create retries: capped exponential with jitter.

Pure arithmetic. The jitter is a number in [0, 1) that the caller drew; nothing here is random
and nothing reads a clock.
"""

from __future__ import annotations


def backoff_delay(level: int, base: float, cap: float, jitter: float) -> float:
    """Seconds before retry number `level` (1 = first): base * 2**(level-1), capped, then jittered.

    The jitter keeps the wait in [d/2, d] ("equal jitter"): retries of many jobs spread out, and
    the wait never exceeds the cap nor drops below half of it once the cap is reached.
    """
    if level < 1:
        return 0.0
    full = min(cap, base * 2.0 ** min(level - 1, 60))
    return full * (0.5 + 0.5 * jitter)


def restart_delay(level: int, base: float, cap: float, jitter: float) -> float:
    """Seconds before charged restart number `level` since the last stable run: the first at once,
    then `base`, doubling, capped.

    A lone crash after a good run (a bad node, a transient fault) costs only the time to notice it;
    a crash loop still backs off from its second restart on, and is still counted.
    """
    return backoff_delay(level - 1, base, cap, jitter)


def next_level(level: int, ran_for: float, stable_run: float) -> int:
    """The backoff level after a charged end: back to 1 after a run of at least `stable_run`."""
    return 1 if ran_for >= stable_run else level + 1
