#!/usr/bin/env python3
"""How long `tpuwatch precheck` takes on a healthy simulated node (target: under 3 s for 4 workers).

    python scripts/bench_precheck.py                 # v4-32 (4 workers), 5 runs, a table
    python scripts/bench_precheck.py --type v4-128 --runs 3 --json

It starts the simulator (real OpenSSH to asyncssh workers on loopback), writes a config for one
node, and times the real CLI as a subprocess: `tpuwatch precheck -c ... --json` (process start,
config, one TPU API get, one SSH round trip per worker in parallel, the verdicts). It also
times the checks alone (`Prechecker.run` in this process), which is what every launch and every
`precheck.interval` costs the watcher. Not a test: timings depend on the machine.
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
from pathlib import Path

from tpuwatch.sim.simulator import Simulator


def config(sim: Simulator, path: Path) -> Path:
    lines = [
        "[tpu]", 'name = "bench"',
        "[job]", 'command = "python3 -m tpuwatch.sim.trainer --steps 10"',
        # sizes the simulated hosts (this machine's disk) surely have
        "[precheck]", 'min_disk = "100MB"', 'min_shm = "100MB"',
        "[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
        f"port = {sim.ssh_port}", "internal_ip = true",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="v4-32", help="accelerator type (v4-32 = 4 workers)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-precheck-") as tmp, \
            Simulator(root=Path(tmp) / "sim", speed=600, workers=True) as sim:
        sim.create_node("bench", args.type, labels={"tpuwatch-job": "bench"})
        cfg = config(sim, Path(tmp) / "tpuwatch.toml")
        env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(Path(tmp) / "state")}
        cli: list[float] = []
        items = workers = 0
        for _ in range(args.runs):
            start = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "precheck", "-c", str(cfg), "--json"],
                               env=env, capture_output=True, text=True, timeout=120)
            cli.append(time.monotonic() - start)
            if r.returncode != 0:
                print(r.stdout, r.stderr, file=sys.stderr)
                return 1
            out = json.loads(r.stdout)
            items = len(out["items"])
            workers = len({i["worker"] for i in out["items"]})
        # the checks alone, as the watcher runs them
        os.environ.update(sim.env)
        os.environ["TPUWATCH_STATE_DIR"] = str(Path(tmp) / "state")  # its own known_hosts, never the user's
        from tpuwatch.cloud.tpu.adapter import TpuAdapter
        from tpuwatch.config import load_config
        from tpuwatch.workers.precheck import Prechecker
        from tpuwatch.workers.sshworkers import SshWorkers

        c = load_config(cfg)
        node = TpuAdapter(sim.project, sim.zone).get_node("bench")
        assert node is not None
        checker = Prechecker.from_config(c, SshWorkers.from_config(c))
        alone: list[float] = []
        for _ in range(args.runs):
            start = time.monotonic()
            report = checker.run(node)
            alone.append(time.monotonic() - start)
            assert report.ok, report
    result = {
        "accelerator_type": args.type, "workers": workers, "items": items, "runs": args.runs,
        "cli_seconds": {"median": statistics.median(cli), "max": max(cli), "min": min(cli)},
        "checks_seconds": {"median": statistics.median(alone), "max": max(alone), "min": min(alone)},
        "cores": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"tpuwatch precheck on a healthy {args.type} ({workers} workers, {items} items), {args.runs} runs, "
              f"{os.cpu_count()} cores")
        print(f"  whole CLI (subprocess):   median {result['cli_seconds']['median']:.2f} s, "
              f"max {result['cli_seconds']['max']:.2f} s")
        print(f"  checks alone (watcher):   median {result['checks_seconds']['median']:.2f} s, "
              f"max {result['checks_seconds']['max']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
