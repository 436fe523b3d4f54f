"""A toy training job for simulated workers: `python -m tpuwatch.sim.trainer`.

It runs on every worker (worker id from `TPUWATCH_WORKER_ID`, else the simulated host's), makes steps, and worker 0 writes
checkpoints in the local Orbax layout (tpuwatch/checkpoints.py): everything goes into
`<dir>/<step>.orbax-checkpoint-tmp-<counter>/`, `commit_success.txt` is written last, then the
directory is renamed to `<dir>/<step>/`. A kill at any instant leaves either a complete checkpoint
or a temporary directory, never a half-written `<dir>/<step>/`.

Faults (crash with an exit code, segfault, hang, crash once) are set by flags or by `TRAINER_*`
environment variables, so a scenario can inject them without editing the job's command.

This module knows nothing of tpuwatch or the simulator's other parts, and imports only the
standard library: it must start in well under 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

TMP_MARK = ".orbax-checkpoint-tmp-"
COMMIT_FILE = "commit_success.txt"
METADATA_FILE = "_CHECKPOINT_METADATA"
STATE_FILE = Path("state") / "data.json"

# flag dest -> environment variable that supplies its default
ENV = {
    "steps": "TRAINER_STEPS",
    "step_time": "TRAINER_STEP_TIME",
    "ckpt_dir": "TRAINER_CKPT_DIR",
    "ckpt_every": "TRAINER_CKPT_EVERY",
    "ckpt_write_time": "TRAINER_CKPT_WRITE_TIME",
    "resume": "TRAINER_RESUME",
    "crash_at": "TRAINER_CRASH_AT",
    "exit_code": "TRAINER_EXIT_CODE",
    "crash_once": "TRAINER_CRASH_ONCE",
    "segfault_at": "TRAINER_SEGFAULT_AT",
    "hang_at": "TRAINER_HANG_AT",
    "fault_worker": "TRAINER_FAULT_WORKER",
    "save_on_term": "TRAINER_SAVE_ON_TERM",
    "ignore_term": "TRAINER_IGNORE_TERM",
    "hold_at": "TRAINER_HOLD_AT",
    "hold_until": "TRAINER_HOLD_UNTIL",
    "megascale_hang_threshold": "TRAINER_MEGASCALE_HANG_THRESHOLD",
}
# What Megascale (libtpu's multislice runtime) does when a collective over the data-center network
# makes no progress for --megascale_graph_hang_threshold (5m by default): it logs the hang
# (MaxText's Megascale hang playbook; the MXLA debugging workflow guide gives the line), and with
# --megascale_error_reporter_abort_on_hang=true (AXLearn's multislice flags) the processes abort.
ABORT_ON_HANG = "--megascale_error_reporter_abort_on_hang=true"


class TrainerError(Exception):
    """Bad arguments or an unusable checkpoint: one line on stderr, exit 2."""


def _steps(text: str) -> frozenset[int]:
    """A comma list of steps ("" = none); argparse applies it to the default too."""
    return frozenset(int(part) for part in text.split(",") if part.strip())


def _env_default(dest: str, kind: type, fallback: object) -> object:
    raw = os.environ.get(ENV[dest])
    if raw is None or raw == "":
        return fallback
    try:
        return kind(raw)
    except ValueError:
        raise TrainerError(f"{ENV[dest]}={raw!r} is not a valid {kind.__name__}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tpuwatch.sim.trainer",
        description="Toy training job for the tpuwatch simulator. "
        "Every option can also be set by its TRAINER_* environment variable.",
    )
    p.add_argument("--steps", type=int, default=_env_default("steps", int, 100),
                   help="total steps to reach (TRAINER_STEPS)")
    p.add_argument("--step-time", type=float, default=_env_default("step_time", float, 0.05),
                   help="seconds per step (TRAINER_STEP_TIME)")
    p.add_argument("--ckpt-dir", default=_env_default("ckpt_dir", str, ""),
                   help="checkpoint directory, absolute; empty = no checkpoints (TRAINER_CKPT_DIR)")
    p.add_argument("--ckpt-every", type=int, default=_env_default("ckpt_every", int, 10),
                   help="save every K steps, and at the last step (TRAINER_CKPT_EVERY)")
    p.add_argument("--ckpt-write-time", type=float,
                   default=_env_default("ckpt_write_time", float, 0.0),
                   help="seconds a save takes before it commits (TRAINER_CKPT_WRITE_TIME)")
    # An empty --resume is a fresh start; without the flag TPUWATCH_CHECKPOINT (set by
    # tpuwatch's launcher) is used, so `python -m tpuwatch.sim.trainer` alone resumes.
    p.add_argument("--resume", default=_env_default(
        "resume", str, os.environ.get("TPUWATCH_CHECKPOINT", "")),
        help="complete checkpoint to resume from; empty = fresh start "
        "(TRAINER_RESUME, then TPUWATCH_CHECKPOINT)")
    p.add_argument("--crash-at", type=int, default=_env_default("crash_at", int, None),
                   help="exit with --exit-code on reaching this step (TRAINER_CRASH_AT)")
    p.add_argument("--exit-code", type=int, default=_env_default("exit_code", int, 1),
                   help="exit code for --crash-at (TRAINER_EXIT_CODE)")
    p.add_argument("--crash-once", default=_env_default("crash_once", str, ""),
                   help="faults fire only if this file does not exist, and create it "
                   "(a transient fault) (TRAINER_CRASH_ONCE)")
    p.add_argument("--segfault-at", type=int, default=_env_default("segfault_at", int, None),
                   help="die by SIGSEGV on reaching this step (TRAINER_SEGFAULT_AT)")
    p.add_argument("--hang-at", type=int, default=_env_default("hang_at", int, None),
                   help="stop making progress on reaching this step (TRAINER_HANG_AT)")
    p.add_argument("--hold-at", type=_steps, default=_env_default("hold_at", str, ""),
                   help="comma list of steps: on reaching one (after its checkpoint), make no progress "
                   "until the file <--hold-until>/<step> exists: a job stalled on its input, for as "
                   "long as a test needs (TRAINER_HOLD_AT)")
    p.add_argument("--hold-until", default=_env_default("hold_until", str, ""),
                   help="the directory whose file <step> ends the hold at that step (TRAINER_HOLD_UNTIL)")
    p.add_argument("--megascale-hang-threshold", type=float,
                   default=_env_default("megascale_hang_threshold", float, 300.0),
                   help="a multislice job (MEGASCALE_NUM_SLICES > 1) that hangs logs Megascale's hang line after "
                   "this many seconds, and aborts when LIBTPU_INIT_ARGS has " + ABORT_ON_HANG +
                   " (TRAINER_MEGASCALE_HANG_THRESHOLD)")
    p.add_argument("--fault-worker", type=int, default=_env_default("fault_worker", int, None),
                   help="only this worker has the faults; default all (TRAINER_FAULT_WORKER)")
    p.add_argument("--vm-paths", action="store_true",
                   help="--ckpt-dir and --resume are paths on the TPU VM: on a simulated worker they "
                   "are under its $TPUWATCH_HOST_ROOT")
    p.add_argument("--ignore-term", type=int, choices=(0, 1), default=_env_default("ignore_term", int, 0),
                   help="1: ignore SIGTERM, as a process stuck in a cross-slice collective may; only KILL ends it "
                   "(TRAINER_IGNORE_TERM)")
    p.add_argument("--save-on-term", type=int, choices=(0, 1), default=_env_default("save_on_term", int, 0),
                   help="1: on SIGTERM finish the step, save a checkpoint and exit 0, as a JAX loop with "
                   "Orbax's save-on-preemption does; 0: exit 143 at once (TRAINER_SAVE_ON_TERM)")
    args = p.parse_args(argv)
    if args.vm_paths:
        root = os.environ.get("TPUWATCH_HOST_ROOT", "")
        args.ckpt_dir = root + args.ckpt_dir if args.ckpt_dir else ""
        args.resume = root + args.resume if args.resume else ""
    if args.steps < 0:
        raise TrainerError(f"--steps must be >= 0, not {args.steps}")
    if args.ckpt_every <= 0:
        raise TrainerError(f"--ckpt-every must be > 0, not {args.ckpt_every}")
    if bool(args.hold_at) != bool(args.hold_until):
        raise TrainerError("--hold-at and --hold-until go together")
    if args.ckpt_dir and not os.path.isabs(args.ckpt_dir):
        raise TrainerError(f"--ckpt-dir must be an absolute path, not {args.ckpt_dir!r}")
    return args


def is_complete(path: Path) -> bool:
    """A step directory that finished committing (renamed, with commit_success.txt)."""
    return (
        path.is_dir()
        and TMP_MARK not in path.name
        and (path / COMMIT_FILE).is_file()
        and (path / STATE_FILE).is_file()
    )


def read_step(path: Path) -> int:
    """The step stored in a complete checkpoint."""
    if not is_complete(path):
        raise TrainerError(f"--resume {str(path)!r} is not a complete checkpoint "
                           f"(needs {COMMIT_FILE} and {STATE_FILE})")
    try:
        data = json.loads((path / STATE_FILE).read_text())
        return int(data["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainerError(f"--resume {str(path)!r}: cannot read the step from {STATE_FILE}: {e}")


def _tmp_dir(ckpt_dir: Path, step: int) -> Path:
    # Orbax 0.5.11-0.11.19 names the temporary directory with a counter; take the first free
    # one, atomically, so a leftover from a killed save is never reused.
    n = 0
    while True:
        tmp = ckpt_dir / f"{step}{TMP_MARK}{n}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            n += 1


def save(ckpt_dir: Path, step: int, write_time: float, started_from: int) -> Path | None:
    """Write checkpoint `step`; returns its final path, or None when it already exists."""
    final = ckpt_dir / str(step)
    if final.exists():
        return None
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_dir(ckpt_dir, step)
    now_ns = time.time_ns()
    (tmp / METADATA_FILE).write_text(json.dumps({
        "item_handlers": {"state": "orbax.checkpoint._src.handlers.json_checkpoint_handler"},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": now_ns,
        "commit_timestamp_nsecs": None,
        "custom_metadata": {},
    }))
    (tmp / "state").mkdir()
    state = {
        "step": step,
        "started_from": started_from,
        "attempt": os.environ.get("TPUWATCH_ATTEMPT", ""),
        "payload": {"loss": round(10.0 / (1 + step), 6), "weights": [step * 0.5, -step * 0.25]},
    }
    (tmp / STATE_FILE).write_text(json.dumps(state))
    if write_time > 0:
        time.sleep(write_time)  # a slow save: a kill here leaves an incomplete temporary dir
    meta = json.loads((tmp / METADATA_FILE).read_text())
    meta["commit_timestamp_nsecs"] = time.time_ns()
    (tmp / METADATA_FILE).write_text(json.dumps(meta))
    (tmp / COMMIT_FILE).write_text(f"Checkpoint commit was successful to {final}\n")
    os.rename(tmp, final)
    return final


def _fault_armed(crash_once: str) -> bool:
    """True when the fault should fire now; with --crash-once, only the first time."""
    if not crash_once:
        return True
    try:
        fd = os.open(crash_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"crashed once, pid {os.getpid()}\n".encode())
    os.close(fd)
    return True


def _hold(args: argparse.Namespace, worker: int, step: int) -> None:
    """At a --hold-at step, wait for <--hold-until>/<step> (every worker: the job stalls as one)."""
    go = os.path.join(args.hold_until, str(step))
    if step not in args.hold_at or os.path.exists(go):
        return
    print(f"worker {worker}: holding at step {step} until {go} exists", flush=True)
    while not os.path.exists(go) and not _term["asked"]:
        time.sleep(0.02)


def _faults(args: argparse.Namespace, worker: int, step: int) -> None:
    """Fire the fault set for `step`, if any (may not return)."""
    if args.fault_worker is not None and args.fault_worker != worker:
        return
    hits = [at for at in (args.crash_at, args.segfault_at, args.hang_at) if at == step]
    if not hits or not _fault_armed(args.crash_once):
        return
    if args.segfault_at == step:
        print(f"worker {worker}: segfault at step {step}", flush=True)
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
    if args.crash_at == step:
        print(f"worker {worker}: crash at step {step} with exit code {args.exit_code}",
              file=sys.stderr, flush=True)
        sys.exit(args.exit_code)
    if args.hang_at == step:
        _term["hung"] = True
        print(f"worker {worker}: hanging at step {step}", flush=True)
        if _num_slices() > 1:
            _megascale_hang(args.megascale_hang_threshold, step)
        while True:
            _sleep(3600)


def _num_slices() -> int:
    """MEGASCALE_NUM_SLICES as JAX finds it (jax/_src/clusters/cloud_tpu_cluster.py): the
    environment, else the `tpu-env` metadata of a multislice queued resource's TPU VM."""
    raw = os.environ.get("MEGASCALE_NUM_SLICES", "")
    host = os.environ.get("GCE_METADATA_HOST", "")
    if not raw and host:
        # imported here: only a hang on a multislice job asks, and urllib.request was about half
        # of every trainer's start-up CPU (the suite starts a thousand or so)
        import urllib.request

        url = f"http://{host}/computeMetadata/v1/instance/attributes/tpu-env"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Metadata-Flavor": "Google"}),
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError:
            text = ""
        m = re.search(r"^MEGASCALE_NUM_SLICES:\s*'?(\d+)'?\s*$", text, re.M)
        raw = m.group(1) if m else ""
    return int(raw) if raw.isdigit() else 1


def _megascale_hang(threshold: float, step: int) -> None:
    """Megascale's word on a multislice hang, after its threshold; an abort when the flags ask."""
    _sleep(threshold)
    stamp = time.strftime("%m%d %H:%M:%S", time.gmtime())
    print(f"E{stamp} Megascale hang detected: Timed out waiting for 1 graphs to complete at launch_id {step}. "
          f"Already completed: {step}. StepGloballyInProgress: true. Timeout: {threshold:g}s", file=sys.stderr, flush=True)
    if ABORT_ON_HANG in os.environ.get("LIBTPU_INIT_ARGS", "").split():
        os.abort()


_term = {"save": False, "asked": False, "hung": False}

# CPython runs a signal's handler between bytecodes: a SIGTERM that lands after the last check and
# before a sleep's system call starts is handled only when the sleep ends (2 hung trainers in 5,000
# SIGTERMs sent the moment one said it hangs). Short sleeps bound that to a slice.
SLEEP_SLICE = 0.05


def _sleep(seconds: float) -> None:
    """time.sleep(seconds), in slices a SIGTERM cannot be lost in for longer than one."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, SLEEP_SLICE))


def _on_term(signum: int, frame: FrameType | None) -> None:
    if _term["save"] and not _term["hung"]:
        _term["asked"] = True  # the loop saves at the end of this step, then exits
        return
    # A real job told to stop exits at once with 128+TERM; no cleanup, like a killed save.
    sys.stdout.flush()
    os._exit(128 + signal.SIGTERM)


def train(args: argparse.Namespace) -> int:
    # tpuwatch exports TPUWATCH_WORKER_ID; a command started another way (gcloud ssh, the docs'
    # loop) still knows its worker from the simulated host, as a real job knows its TPU worker id.
    worker = int(os.environ.get("TPUWATCH_WORKER_ID") or os.environ.get("TPUWATCH_SIM_WORKER_ID") or 0)
    # One process of the whole job saves: the first worker of the first slice (as JAX's process 0).
    primary = worker == 0 and int(os.environ.get("TPUWATCH_SLICE_ID") or 0) == 0
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
    step = read_step(Path(args.resume)) if args.resume else 0
    started_from = step
    _term["save"] = bool(args.save_on_term)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    how = f"resumed from {args.resume} at step {step}" if args.resume else "fresh start"
    print(f"worker {worker}: {how}, training to step {args.steps}", flush=True)
    t0 = time.monotonic()
    _faults(args, worker, step)
    if ckpt_dir is not None and primary and not args.resume:
        save(ckpt_dir, step, args.ckpt_write_time, started_from)
    _hold(args, worker, step)
    while step < args.steps:
        time.sleep(args.step_time)
        step += 1
        if _term["asked"]:
            # Orbax's save-on-preemption: one agreed step, saved, then the loop ends normally.
            final = save(ckpt_dir, step, args.ckpt_write_time, started_from) \
                if ckpt_dir is not None and primary else None
            print(f"worker {worker}: SIGTERM: {'saved ' + str(final) if final else 'no save'} at step {step}, "
                  "exiting", flush=True)
            return 0
        _faults(args, worker, step)
        if step % args.ckpt_every == 0 or step == args.steps:
            rate = (step - started_from) / max(time.monotonic() - t0, 1e-9)
            if ckpt_dir is not None and primary:
                final = save(ckpt_dir, step, args.ckpt_write_time, started_from)
                what = f"saved {final}" if final else "checkpoint exists, kept"
                print(f"worker {worker}: step {step}: {what} ({rate:.1f} steps/s)", flush=True)
            else:
                print(f"worker {worker}: step {step} ({rate:.1f} steps/s)", flush=True)
        _hold(args, worker, step)
    print(f"worker {worker}: done at step {step}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    try:
        return train(parse_args(argv))
    except TrainerError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
