#!/usr/bin/env python3
"""Work lost to one announced maintenance, in real time on the simulator with real ssh.

    python scripts/bench_maintenance.py                     # every mode, 3 events each, a table
    python scripts/bench_maintenance.py --modes early --repeat 5 --json

Each event starts a fresh simulator (the TPU API over gRPC, SSH workers on loopback, the toy
trainer with Orbax-layout checkpoints), runs `tpuwatch watch` until the job trains steadily, then
announces one maintenance and measures the work lost: from the commit of the checkpoint the job
resumed from to the moment its last trainer process ended (read from /proc every 20 ms), in
seconds and as a share of the checkpoint interval. Modes:

- reactive: what tpuwatch did before: no relay signal (`notify_signal = ""`), no early start;
  the maintenance (with Compute Engine's ~60 s notice) kills the job, which resumes from its
  newest periodic checkpoint: on average half an interval lost;
- notice: the ~60 s notice is relayed to the job as SIGTERM and the trainer saves at once
  (`--save-on-term 1`, as Orbax's save-on-preemption), no early start;
- early: `start_early` on a v6e-16 (manual maintenance is offered there): tpuwatch starts the
  maintenance right after the next checkpoint.

Durations are real; the simulator's own delays run at --speed. The early mode's loss is the
time from a checkpoint's commit to tpuwatch's stop: in the last tenth of the checkpoint interval
tpuwatch looks every 0.1 % of it (1 s at least, the poll at most), so the loss is about half of
that look's spacing plus one tick and one SSH stop, whatever the interval: its share shrinks as
checkpoints get further apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tpuwatch.sim.simulator import Simulator

MODES = ("reactive", "notice", "early")
JOB = "pod"


def trainer_pids(sim: Simulator) -> set[int]:
    marker = f"TPUWATCH_SIM_WORKER={sim.hosts.instance}/{sim.node_key(JOB)}/".encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if (b"tpuwatch.sim.trainer" in argv and argv[0].rsplit(b"/", 1)[-1].startswith(b"python")
                and marker in env and b"TPUWATCH_JOB=pod" in env):
            out.add(int(entry))
    return out


def commit_time(ck: Path, step: int) -> float:
    """When checkpoint `step` was committed (its Orbax metadata's commit timestamp)."""
    meta = json.loads((ck / str(step) / "_CHECKPOINT_METADATA").read_text())
    return float(meta["commit_timestamp_nsecs"]) / 1e9


def wait(pred: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def one(mode: str, args: argparse.Namespace, root: Path, seed: int) -> dict[str, Any]:
    interval = args.ckpt_every * args.step_time
    with Simulator(root=root / "sim", speed=args.speed, seed=seed, workers=True) as sim:
        sim.world.delays["simulated_maintenance_heal"] = args.heal
        sim.create_node(JOB, "v6e-16" if mode == "early" else "v4-32", labels={"tpuwatch-job": JOB})
        ck = sim.bucket / "ck"
        save = " --save-on-term 1" if mode == "notice" else ""
        command = (f"python3 -m tpuwatch.sim.trainer --steps 10000000 --step-time {args.step_time} "
                   f"--ckpt-every {args.ckpt_every} --ckpt-dir {shlex.quote(str(ck))} --resume {{checkpoint}}{save}")
        cfg = root / "tpuwatch.toml"
        cfg.write_text("\n".join([
            "[tpu]", f'name = "{JOB}"', "[job]", f"command = {json.dumps(command)}",
            f"checkpoint_dir = {json.dumps(str(ck))}",
            "[recovery]", f'poll_interval = "{args.poll}s"', 'stop_grace = "2s"', 'repair_timeout = "5m"',
            'min_uptime = "0.5s"',
            "[maintenance]", f"start_early = {'true' if mode == 'early' else 'false'}",
            f'notify_signal = "{"" if mode == "reactive" else "SIGTERM"}"',
            "[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
            f"port = {sim.ssh_port}", "internal_ip = true"]) + "\n")
        env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(root / "state")}
        with open(root / "watch.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(cfg), "--json"],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait(lambda: len(trainer_pids(sim)) == 4, 60, "the job on every worker")
            # steady: a few checkpoints, then the event at a random point of an interval
            # (two give tpuwatch the interval the job keeps; waits scale with it, for long intervals)
            wait(lambda: ck.exists() and sum(p.name.isdigit() for p in ck.iterdir()) >= 3, 60 + 3 * interval,
                 "checkpoints")
            time.sleep((seed * 0.37 % 1.0) * interval)
            first = trainer_pids(sim)
            if mode == "early":
                sim.inject("upcoming-maintenance", node=JOB, starts_in="7d", heal_after=f"{args.heal}s")
            else:
                sim.inject("maintenance", node=JOB, notice="60s", heal_after=f"{args.heal}s")
            wait(lambda: not (trainer_pids(sim) & first), 120 + 2 * interval, "the job to stop")
            stopped = time.time()
            wait(lambda: len(trainer_pids(sim) - first) == 4, 120, "the job to run again")
            hist: dict[str, Any] = {"attempts": []}

            def two_attempts() -> bool:
                out = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(cfg), "--json"],
                                     env=env, capture_output=True, text=True)
                hist.update(json.loads(out.stdout) if out.returncode == 0 else {})
                return len(hist["attempts"]) >= 2 and hist["attempts"][1]["start_step"] is not None

            wait(two_attempts, 60, "the journal's second attempt")
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
        first_end, second = hist["attempts"][0], hist["attempts"][1]
        resumed = int(second["start_step"])
        lost = max(0.0, stopped - commit_time(ck, resumed))
        return {"mode": mode, "seed": seed, "resumed_step": resumed, "lost_seconds": round(lost, 3),
                "lost_share": round(lost / interval, 3), "charged": bool(first_end["charged"]),
                "outcome": first_end["outcome"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--repeat", type=int, default=3, help="events per mode")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds per training step")
    ap.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--poll", type=float, default=0.5, help="tpuwatch's poll_interval, seconds")
    ap.add_argument("--speed", type=float, default=60.0, help="simulated seconds per real second")
    ap.add_argument("--heal", type=float, default=120.0, help="simulated repair time of the maintenance")
    ap.add_argument("--json", action="store_true", help="one JSON object per event, then the summary")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or args.repeat < 1 or args.step_time <= 0 or args.ckpt_every < 1 or args.poll <= 0 or args.speed <= 0:
        ap.error(f"bad value: modes must be from {', '.join(MODES)}, every number positive")
    rows = []
    for mode in modes:
        for seed in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="bench-maint-") as tmp:
                row = one(mode, args, Path(tmp), seed + 1)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    interval = args.ckpt_every * args.step_time
    print(f"checkpoint interval {interval:g} s, poll {args.poll:g} s, {args.repeat} event(s) per mode")
    print(f"{'mode':<9} {'lost (mean)':>11} {'max':>7} {'share of interval':>18} {'charged':>8}")
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        lost = [r["lost_seconds"] for r in mine]
        print(f"{mode:<9} {statistics.mean(lost):>10.2f}s {max(lost):>6.2f}s "
              f"{statistics.mean(r['lost_share'] for r in mine):>17.1%} {sum(r['charged'] for r in mine):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
