"""Smoke test of scripts/bench_outputs.py with tiny parameters: it runs as a user runs it and
prints its three figures (not a timing test: only that each was measured)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_outputs.py"


def test_bench_outputs_prints_its_three_figures() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--attempts", "5", "--events", "20", "--repeat", "3"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ("alerts, per tick", "metrics, per tick", "delivery, after_tick to webhook accepted"):
        assert re.search(rf"^{re.escape(what)}.*: +\d+\.\d+ ms$", r.stdout, re.M), r.stdout
