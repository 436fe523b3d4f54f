#!/usr/bin/env python3
"""How long `tpuwatch report` takes on a long job's journal, and how big its HTML is.

    python scripts/bench_report.py                   # 730 attempts: a year of 12-hour attempts
    python scripts/bench_report.py --attempts 50 --json

Writes a synthetic journal into a real journal file (tpuwatch.journal.Journal) in a temporary
state dir: each attempt saves a checkpoint every 30 minutes for 12 hours, runs 10 minutes past
its last one and is ended by a preemption; the node then heals for 20 minutes (a third of the
time it is recreated instead, 40 minutes). Then runs the real CLI, `tpuwatch report -c ... --json`
and `--html`, as cold processes, median of --runs, and prints the times, the HTML's size and the
goodput it found (the answer by construction: 12 h / (12 h 10 m + the wait) per attempt, less
the start-up estimate, which is 0 here: the first checkpoint comes at the job's pace).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tpuwatch.journal import Journal
from tpuwatch.policy import AttemptEnd

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def write_journal(state: Path, attempts: int) -> float:
    """The synthetic journal; the goodput it holds by construction."""
    t, step, productive = 0.0, 0, 0.0
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    with Journal.open(state, "bench", "bench") as j, j.transaction():
        j.add_event(at(0), "phase", "start -> running", {"from": None, "to": "running", "row": "launch"})
        for n in range(1, attempts + 1):
            start, s0 = t, step
            j.start_attempt(n, at(t), "node", s0 or None)
            for _ in range(24):
                t += 1800
                step += 100
                j.add_event(at(t), "checkpoint", f"attempt {n} saved checkpoint step {step}",
                            {"attempt": n, "step": step, "time": at(t).isoformat()})
            productive += t - start
            t += 600
            j.end_attempt(AttemptEnd(n, at(start), at(t), "node", s0 or None, step, "disruption", False, 143,
                                     f"attempt {n}: worker 0 exit code 143 (SIGTERM), ended by a disruption "
                                     f"(node state PREEMPTED at {at(t).isoformat()})"))
            recreate = n % 3 == 0
            j.add_event(at(t), "phase", "running -> ...", {"to": "deleting" if recreate else "waiting_node"})
            t += 2400 if recreate else 1200
            j.add_event(at(t), "phase", "... -> running", {"to": "running"})
        j.add_event(at(t), "phase", "running -> done", {"to": "done"})
        j.add_event(at(t), "done", "job done")
    return productive / t


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(argv, env=env, text=True, capture_output=True, check=True)
    return time.perf_counter() - start, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=730)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        expected = write_journal(state, args.attempts)
        cfg = Path(tmp) / "tpuwatch.toml"
        cfg.write_text('[tpu]\nname = "bench"\nzone = "us-central2-b"\n[job]\ncommand = "true"\n')
        env = {**os.environ, "TPUWATCH_STATE_DIR": str(state)}
        base = [sys.executable, "-m", "tpuwatch.cli", "report", "-c", str(cfg)]
        runs = [timed([*base, "--json"], env) for _ in range(args.runs)]
        found = json.loads(runs[0][1])
        html = Path(tmp) / "report.html"
        html_runs = [timed([*base, "--html", str(html)], env)[0] for _ in range(args.runs)]
        result = {
            "attempts": args.attempts,
            "events": len(Journal.open(state, "bench", None, readonly=True).events()),
            "report_json_seconds": round(statistics.median(r[0] for r in runs), 3),
            "report_html_seconds": round(statistics.median(html_runs), 3),
            "html_bytes": html.stat().st_size,
            "goodput": found["goodput"],
            "goodput_by_construction": round(expected, 6),
        }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:<26} {v}")
    return 0 if abs(result["goodput"] - expected) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
