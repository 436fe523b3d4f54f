"""Smoke test of scripts/bench_worker_scripts.py: one run of each action on a fake host.

Not a timing test: only that every action ran and its processes were counted (a launch costs
more than a probe on any machine, and the listing's python3 more than the probe without it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_worker_scripts.py"
ACTIONS = ("heal: probe", "heal: launch", "heal: job + relay", "probe", "probe + listing", "probe, log grew",
           "channel probe", "precheck")


def test_bench_worker_scripts_measures_every_action() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--runs", "2"], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    ms = {}
    for line in r.stdout.splitlines()[1:]:
        name, _, value = line.strip().rpartition(" ")
        ms[name.strip()] = float(value)
    assert set(ms) == set(ACTIONS)
    assert ms["heal: launch"] > ms["heal: probe"] > 0 and ms["probe + listing"] > ms["probe"] > 0
