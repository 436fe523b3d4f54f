#!/usr/bin/env python3
"""Limping in real time: from a slice lost to training again on the slices left, and from its
return to training on all of them again.

    python scripts/bench_limp.py                        # 4 slices, min_slices 3, 30 s poll, once
    python scripts/bench_limp.py --repeat 3 --json
    python scripts/bench_limp.py --poll 5 --outage 30

Each run starts a fresh simulator (tpuwatch.sim.Simulator: the TPU API over gRPC, SSH workers on
loopback, the toy trainer) with `--slices` single-host slices created one by one, runs
`tpuwatch watch` on a job over them with `[job] min_slices`, waits until it trains steadily, puts
one slice (not the first) into maintenance for `--outage` real seconds and measures, from the
world (the trainers' processes, read from /proc every 20 ms, and the checkpoints):
- limping: from the fault until a newer attempt's trainer runs on every slice left;
- steps lost: the newest complete checkpoint before the fault against the step the limped attempt
  resumed from (its TPUWATCH_STEP);
- grown: from the slice's return (READY+HEALTHY in the simulator) until a newer attempt runs on
  every slice; this includes the wait for the job's next complete checkpoint (--ckpt-every
  steps of --step-time), the grow's purpose.
The poll is tpuwatch's recovery.poll_interval in real seconds; only the maintenance's length
comes from the simulator.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from tpuwatch.sim.simulator import Simulator

SCAN_EVERY = 0.02


@dataclass(frozen=True)
class Result:
    run: int
    limping: float  # s from the fault to a newer attempt on every slice left
    steps_lost: int
    grown: float  # s from the slice back to a newer attempt on every slice
    ckpt_interval: float  # s between two of the job's checkpoints


def trainers(job: str) -> dict[str, tuple[int, int]]:
    """Worker marker -> (attempt, resumed step) of the job's live trainer processes."""
    out: dict[str, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"tpuwatch.sim.trainer" not in argv or not argv[0].rsplit(b"/", 1)[-1].startswith(b"python"):
                continue
            env = dict(i.split("=", 1) for i in Path(f"/proc/{entry}/environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in i)
        except OSError:
            continue
        if env.get("TPUWATCH_JOB") == job:
            out[env.get("TPUWATCH_SIM_WORKER", entry)] = (int(env.get("TPUWATCH_ATTEMPT") or 0),
                                                          int(env.get("TPUWATCH_STEP") or -1))
    return out


def until(pred: object, timeout: float, what: str) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(SCAN_EVERY)
    raise RuntimeError(f"timed out waiting for {what}")


def newer_on(job: str, attempt: int, workers: int) -> bool:
    return sum(1 for a, _ in trainers(job).values() if a > attempt) >= workers


def one_run(args: argparse.Namespace, n: int, root: Path) -> Result:
    names = [f"np-{i}" for i in range(args.slices)]
    job = "limp"
    with Simulator(root=root / "sim", speed=args.speed, seed=args.seed + n) as sim:
        for name in names:
            sim.create_node(name, "v4-8", labels={"tpuwatch-job": job})
        ck = sim.bucket / "ck"
        command = (f"python3 -m tpuwatch.sim.trainer --steps 100000000 --step-time {args.step_time} "
                   f"--ckpt-every {args.ckpt_every} --ckpt-dir {ck} --resume {{checkpoint}}")
        cfg = root / "tpuwatch.toml"
        cfg.write_text("\n".join([
            "[tpu]", f'name = "{job}"', f"names = {json.dumps(names)}",
            "[job]", f"command = {json.dumps(command)}", f"checkpoint_dir = {json.dumps(str(ck))}",
            f"min_slices = {args.min_slices}",
            "[recovery]", f'poll_interval = "{args.poll}s"', 'min_uptime = "2s"',
            "[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
            f"port = {sim.ssh_port}", "internal_ip = true"]) + "\n")
        env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(root / "state")}
        log = open(root / "watch.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(cfg)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            def steps() -> list[int]:
                return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.exists() else []

            until(lambda: len(trainers(job)) == args.slices and len(steps()) >= 2, 600, "the job running")
            before = max(a for a, _ in trainers(job).values())
            saved = steps()[-1]
            t0 = time.monotonic()
            sim.inject("maintenance", node=names[1], heal_after=args.outage * args.speed)
            t_limp = until(lambda: newer_on(job, before, args.slices - 1), args.outage + 3 * args.poll + 60,
                           "the job on the slices left")
            resumed = max(s for a, s in trainers(job).values() if a > before)
            limped = max(a for a, _ in trainers(job).values())
            t_back = until(lambda: sim.world.node(names[1]).state == "READY"
                           and sim.world.node(names[1]).health == "HEALTHY", args.outage + 120, "the slice back")
            t_grown = until(lambda: newer_on(job, limped, args.slices), 3 * args.poll + 120, "the job on every slice")
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
    return Result(n, round(t_limp - t0, 2), max(0, saved - resumed), round(t_grown - t_back, 2),
                  round(args.ckpt_every * args.step_time, 2))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--min-slices", type=int, default=3)
    p.add_argument("--poll", type=float, default=30.0, help="recovery.poll_interval, real seconds")
    p.add_argument("--outage", type=float, default=90.0, help="real seconds the lost slice stays down")
    p.add_argument("--speed", type=float, default=60.0)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not 1 <= args.min_slices < args.slices:
        p.error("--min-slices must be at least 1 and fewer than --slices")
    if args.poll <= 0 or args.outage <= 0 or args.repeat < 1:
        p.error("--poll and --outage must be positive, --repeat at least 1")
    if args.outage <= 2 * args.poll:
        p.error("--outage must be longer than two --poll: a slice back before the watcher looks is no limp")
    results = []
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-limp-") as tmp:
            results.append(one_run(args, n, Path(tmp)))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    print(f"{args.slices} slices, min_slices {args.min_slices}, poll {args.poll:g} s, outage {args.outage:g} s, "
          f"a checkpoint every {results[0].ckpt_interval:g} s")
    print(f"{'run':>3} {'lost -> limping':>16} {'steps lost':>11} {'back -> grown':>14}")
    for r in results:
        print(f"{r.run:>3} {r.limping:>15.1f}s {r.steps_lost:>11} {r.grown:>13.1f}s")
    if len(results) > 1:
        print(f"median {statistics.median(r.limping for r in results):>12.1f}s "
              f"{statistics.median(r.steps_lost for r in results):>11.0f} "
              f"{statistics.median(r.grown for r in results):>13.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
