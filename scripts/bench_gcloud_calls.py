#!/usr/bin/env python3
"""API calls per tick of the gcloud transport (ssh.transport = "gcloud"), counted in the simulator.

    python scripts/bench_gcloud_calls.py                 # v4-32 (4 workers), 6 ticks, a table
    python scripts/bench_gcloud_calls.py --workers 8 --ticks 10 --json-out calls.json

Against one simulator with its REST face and the real gcloud (a private CLOUDSDK_CONFIG), OS Login
on (the os-login fault: the workers know the user as `alice_example_com`), a job whose config has
`transport = "gcloud"` and no ssh.user:
1. what one `gcloud compute tpus tpu-vm ssh NODE --worker=W --command=true` costs in API calls,
   counted by the simulator's REST face (the calls gcloud makes; `RestFace.calls`);
2. `tpuwatch check` run --ticks times in a row (cron's way: a new process each tick), the job
   launched by the first: per tick, the calls gcloud made (REST face) and tpuwatch's own (the
   gRPC face: all calls less gcloud's), and how many gcloud processes ran;
3. the same ticks after the node is recreated (a new incarnation: gcloud runs once more).
Before this transport ran gcloud once per worker per SSH round, every probe cost (1) x workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tpuwatch.sim import gcloudcfg
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

OS_LOGIN_USER = "alice_example_com"
ACCELERATOR = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64", 16: "v4-128"}


def config(path: Path, sim: Simulator, ck: Path, accelerator: str) -> Path:
    lines = [
        "[tpu]", 'name = "pod"',
        "[tpu.spec]", f'accelerator_type = "{accelerator}"',
        'runtime_version = "tpu-ubuntu2204-base"', "spot = true",
        "[job]", f'command = "python3 -m tpuwatch.sim.trainer --steps 1000000 --step-time 0.05 --ckpt-every 100 '
        f'--ckpt-dir {ck} --resume {{checkpoint}}"', f'checkpoint_dir = "{ck}"',
        "[recovery]", 'poll_interval = "1s"', 'min_uptime = "0.5s"', 'backoff_base = "0.2s"',
        "[precheck]", "enabled = false",
        "[ssh]", 'transport = "gcloud"', f'identity_file = "{sim.ssh_key}"', f"port = {sim.ssh_port}",
        "internal_ip = true",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4, choices=sorted(ACCELERATOR))
    ap.add_argument("--ticks", type=int, default=6)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--quiet", action="store_true", help="only the table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-gcloud-") as tmp_s:
        tmp = Path(tmp_s)
        with Simulator(root=tmp / "sim", speed=600, workers=True) as sim, RestFace(sim.world) as rest:
            gc = gcloudcfg.write_config(tmp / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                                        home=tmp / "home", ssh_key=sim.ssh_key)
            env = {**os.environ, **sim.env, **gc.env, "TPUWATCH_STATE_DIR": str(tmp / "state")}
            sim.create_node("pod", ACCELERATOR[args.workers], spot=True, labels={"tpuwatch-job": "pod"})
            sim.world.os_login(OS_LOGIN_USER)
            cfg = config(tmp / "tpuwatch.toml", sim, sim.bucket / "ck", ACCELERATOR[args.workers])

            rest.calls.clear()
            one = subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", f"--zone={sim.zone}",
                                  "--worker=0", "--internal-ip", f"--ssh-key-file={sim.ssh_key}",
                                  f"--ssh-flag=-p {sim.ssh_port}", "--command=true", "--quiet"],
                                 env=env, capture_output=True, text=True, timeout=300)
            if one.returncode != 0:
                raise SystemExit(f"gcloud ssh failed: {one.stderr[-2000:]}")
            per_gcloud = dict(rest.calls)

            def tick() -> dict[str, Any]:
                before_all, before_rest = Counter(sim.world.calls), Counter(rest.calls)
                t0 = time.monotonic()
                r = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "check", "-c", str(cfg), "--json"],
                                   env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
                if r.returncode != 0:
                    raise SystemExit(f"check exited {r.returncode}: {r.stdout[-1000:]} {r.stderr[-2000:]}")
                gcloud_calls = Counter(rest.calls) - before_rest
                own = (Counter(sim.world.calls) - before_all) - gcloud_calls
                row = json.loads(r.stdout)
                return {"phase": row.get("phase"), "action": row.get("done"), "seconds": time.monotonic() - t0,
                        "gcloud_runs": gcloud_calls.get("google.cloud.tpu.v2.Tpu/GetGuestAttributes", 0),
                        "gcloud_calls": sum(gcloud_calls.values()), "tpuwatch_calls": sum(own.values()),
                        "gcloud_methods": dict(gcloud_calls), "tpuwatch_methods": dict(own)}

            rows = [tick() for _ in range(args.ticks)]
            old_id = sim.world.node("pod").id
            sim.world.preempt("pod")
            recreate: list[dict[str, Any]] = []
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                recreate.append(tick())
                if (sim.world.has_node("pod") and sim.world.node("pod").id != old_id
                        and recreate[-1]["phase"] == "running"):
                    break
            recreate += [tick() for _ in range(2)]

    cost = sum(per_gcloud.values())
    doc = {"workers": args.workers, "per_gcloud_ssh": per_gcloud, "per_gcloud_ssh_total": cost,
           "ticks": rows, "recreate": recreate,
           "old_per_probe": cost * args.workers}
    print(f"one `gcloud ... tpu-vm ssh --worker=0`: {cost} API calls ("
          + ", ".join(f"{m.rsplit('/', 1)[-1]} {n}" for m, n in sorted(per_gcloud.items())) + ")")
    print(f"{'tick':>4}  {'phase':<14} {'gcloud runs':>11} {'gcloud calls':>12} {'tpuwatch calls':>14}")
    for label, rs in (("", rows), ("r", recreate)):
        for i, r in enumerate(rs, 1):
            print(f"{label + str(i):>4}  {str(r['phase']):<14} {r['gcloud_runs']:>11} {r['gcloud_calls']:>12} "
                  f"{r['tpuwatch_calls']:>14}")
    steady = rows[1:]
    print(f"steady ticks: {sum(r['gcloud_calls'] for r in steady) / max(1, len(steady)):.1f} gcloud calls per tick; "
          f"one gcloud per worker per probe would cost {cost * args.workers} per probe")
    if args.json_out:
        args.json_out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
