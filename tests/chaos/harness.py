"""The kill-and-restart harness: a job on a (shared) simulator, watched by `tpuwatch watch`
processes that the test SIGKILLs at seeded moments and starts again.

`Watched` owns one node and one job on the simulator. A `Sampler` thread looks at the simulated
workers' processes all along and records any moment with two trainer processes on one worker or
two attempts alive at once. Every kill reads the journal right after the process died (it must
open and pass SQLite's check) and classifies the moment from the journal's phase and the
simulator's node: launch, delete, create, queued, or something else. `assert_invariants` checks
the end: exactly one node, the job done, every attempt resumed from the newest complete
checkpoint present when it was launched, and no sampled violation.

Nothing here knows tpuwatch's internals beyond what a user sees: the CLI, the journal file and
the simulated cloud.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import cli_process
from e2e_helpers import toml_value

from tpuwatch.errors import NotFoundError
from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator

MARKER = "TPUWATCH_SIM_WORKER"
RECOVERY: dict[str, object] = {
    "poll_interval": "0.3s", "stop_grace": "1s", "repair_timeout": "30s", "min_uptime": "0.3s",
    "backoff_base": "0.2s", "backoff_max": "1s", "max_recreates": 50, "max_restarts": 20,
}


@dataclass(frozen=True)
class KillPoint:
    phase: str  # launch, delete, create, queued, running, repair, start, other
    delay: float  # seconds after the phase began (or the watcher restarted) when it was killed
    journal_phase: str  # the journal's phase right after the kill ("" before the first tick)


@dataclass
class Violation:
    time: float
    what: str


@dataclass
class Sampler:
    """Samples the job's trainer processes on every worker of the simulator, all along."""

    sim: Simulator
    job: str
    interval: float = 0.1
    samples: int = 0
    max_per_worker: int = 0
    max_attempts: int = 0
    violations: list[Violation] = field(default_factory=list)
    running: dict[str, set[int]] = field(default_factory=dict)  # worker -> attempts seen last sample
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"sampler-{self.job}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def trainers(self) -> dict[str, list[tuple[int, int]]]:
        """worker ("<node>/<index>") -> [(pid, attempt)] of the job's live trainer processes."""
        out: dict[str, list[tuple[int, int]]] = {}
        # The workers' cgroups where there are (a trainer always starts inside: its shell entered
        # first), not a read of every process's environment on the machine many times a second.
        pids = self.sim.hosts.cgroup_pids()
        for pid in self.sim.hosts.pids() if pids is None else pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                # The trainer itself, not the bash wrapper whose argument is the command text.
                if not (argv and argv[0].rsplit(b"/", 1)[-1].startswith(b"python")
                        and b"tpuwatch.sim.trainer" in argv):
                    continue
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            vars_ = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
            if vars_.get("TPUWATCH_JOB") != self.job:
                continue
            out.setdefault(vars_.get(MARKER, "?"), []).append((pid, int(vars_.get("TPUWATCH_ATTEMPT", "0") or 0)))
        return out

    def sample(self) -> None:
        found = self.trainers()
        self.samples += 1
        attempts = {a for procs in found.values() for _, a in procs}
        self.running = {w: {a for _, a in procs} for w, procs in found.items()}
        for w, procs in found.items():
            self.max_per_worker = max(self.max_per_worker, len(procs))
            if len(procs) > 1:
                self.violations.append(Violation(time.time(), f"worker {w} runs {len(procs)} trainers: {procs}"))
        self.max_attempts = max(self.max_attempts, len(attempts))
        if len(attempts) > 1:
            self.violations.append(Violation(time.time(), f"attempts {sorted(attempts)} alive at once: {found}"))


class Watched:
    """One job on the simulator, watched by `tpuwatch watch` processes the test kills."""

    def __init__(self, sim: Simulator, tmp: Path, name: str, *, seed: int, accelerator: str = "v4-16",
                 steps: int = 100_000, spot: bool = False, recreatable: bool = False, slices: int = 0,
                 min_slices: int = 0, spares: int = 0,
                 env: dict[str, str] | None = None, job_env: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None, zone: str | None = None, command_prefix: str = "",
                 **recovery: object) -> None:
        self.sim = sim
        self.name = name
        self.accelerator = accelerator
        self.spot = spot
        self.recreatable = recreatable
        self.job_env = dict(job_env or {})
        self.command_prefix = command_prefix  # e.g. "NAME=value " before the trainer
        self.zone = zone  # None: the simulator's zone (from the environment)
        # a multislice job over slices <name>-0..N-1 created one by one, that may limp on min_slices
        self.names = [f"{name}-{i}" for i in range(slices)] if slices else [name]
        self.min_slices = min_slices
        # and its hot spares <name>-s0..M-1, made the same way
        self.spares = [f"{name}-s{i}" for i in range(spares)]
        self.recovery = {**RECOVERY, **recovery}
        self.ck = sim.bucket / name
        self.state_dir = tmp / f"state-{name}"
        self.cfg = tmp / f"{name}.toml"
        self.logs = tmp / f"logs-{name}"
        self.hold_dir = tmp / f"hold-{name}"
        self.also: list[Path] = []  # more config files the watcher is started with (a pool's)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.kills: list[KillPoint] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.starts = 0
        self.make_nodes({"tpuwatch-job": name} if labels is None else labels)
        self.env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(self.state_dir), **(env or {})}
        self.set_steps(steps)
        self.sampler = Sampler(sim, name)
        self.sampler.start()

    def make_nodes(self, labels: dict[str, str]) -> None:
        """The job's slices and spares, TPU nodes made one by one (a subclass makes others)."""
        for node in (*self.names, *self.spares):
            self.sim.create_node(node, self.accelerator, labels=labels, spot=self.spot, zone=self.zone)

    # -- config and processes -------------------------------------------------------------

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        """(Re)write the config; a watcher started after this runs trainers to `steps`, held at
        step `hold_at` (if given) until `release(hold_at)`."""
        self.steps = steps
        hold = f" --hold-at {hold_at} --hold-until {self.hold_dir}" if hold_at else ""
        command = (f"{self.command_prefix}python3 -m tpuwatch.sim.trainer --steps {steps} --step-time 0.02 --ckpt-every 10 "
                   f"--ckpt-dir {self.ck} --resume {{checkpoint}}{hold}")
        lines = ["[tpu]", f"name = {json.dumps(self.name)}"] + ([f"zone = {json.dumps(self.zone)}"] if self.zone else [])
        if len(self.names) > 1:
            lines.append(f"names = {toml_value(self.names)}")
        if self.spares:
            lines.append(f"spares = {toml_value(self.spares)}")
        if self.recreatable:
            lines += ["[tpu.spec]", f"accelerator_type = {json.dumps(self.accelerator)}",
                      'runtime_version = "tpu-ubuntu2204-base"', f"spot = {toml_value(self.spot)}"]
        lines += ["[job]", f"command = {json.dumps(command)}", f"checkpoint_dir = {json.dumps(str(self.ck))}"]
        if self.min_slices:
            lines.append(f"min_slices = {self.min_slices}")
        if self.job_env:
            lines += ["[job.env]", *[f"{k} = {json.dumps(v)}" for k, v in self.job_env.items()]]
        lines += ["[recovery]", *[f"{k} = {toml_value(v)}" for k, v in self.recovery.items()],
                  "[ssh]", f"user = {json.dumps(self.sim.ssh_user)}",
                  f"identity_file = {json.dumps(str(self.sim.ssh_key))}", f"port = {self.sim.ssh_port}",
                  "internal_ip = true", 'connect_timeout = "2s"',
                  # The environment prechecks have their own tests; here they would only add SSH
                  # round trips to every launch.
                  "[precheck]", "enabled = false"]
        tmp = self.cfg.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.cfg)

    def hold_end(self) -> int:
        """Ready the last cycle of a test, killed nowhere: the job's end step, its trainers held 100
        steps before it until `release(end - 100)`, so the job cannot end before the test's last
        stage is met; the watcher started again with that config. The attempt running meanwhile was
        launched before and does not hold: the end is set again until that attempt is still 300
        steps short of the hold once the watcher is up (on a busy machine it may not be), so that
        the relaunch after the next loss is too."""
        for _ in range(5):
            end = (self.steps_done() or [0])[-1] + 600
            self.set_steps(end, hold_at=end - 100)
            self.kill(self.started_at, "end")
            self.wait(lambda: time.monotonic() - self.started_at > 1.2, what="the watcher up")
            if (self.steps_done() or [0])[-1] < end - 400:
                return end
        raise AssertionError("the running attempt passed each end set before the watcher was up")

    def release(self, step: int) -> None:
        """Let trainers held at `step` (set_steps' `hold_at`) go on."""
        self.hold_dir.mkdir(exist_ok=True)
        (self.hold_dir / str(step)).touch()

    @staticmethod
    def cli_argv() -> list[str]:
        return [sys.executable, "-m", "tpuwatch.cli"]

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return cli_process.run(args, self.env, timeout=timeout)

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        log = open(self.logs / f"watch-{self.starts:03d}.log", "wb")  # noqa: SIM115 - closed by the child's end
        # A real subprocess, not one forked from tests/cli_process.py's warm server: started that
        # fast (no imports) right after the SIGKILL of the one before, a watcher has been seen to
        # find the job's lock still held and exit 1 ("another tpuwatch is working on"); the
        # test's kill points are timed for a watcher that starts as a user's does.
        configs = [arg for path in (self.cfg, *self.also) for arg in ("-c", str(path))]
        self.proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", *configs],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.started_at = time.monotonic()

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.iterdir()))

    def kill(self, since: float, phase: str = "") -> KillPoint:
        """SIGKILL the watcher now; check the journal; classify the moment (or call it `phase`);
        start a new watcher."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the watcher ended by itself (exit {self.proc.returncode}):\n"
                                 + self.output()[-3000:])
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        jphase = self.journal_phase()
        point = KillPoint(phase or self.classify(jphase), round(time.monotonic() - since, 3), jphase)
        self.kills.append(point)
        self.start()
        return point

    def kill_after(self, since: float, lo: float, hi: float, phase: str = "") -> KillPoint:
        """Kill at a seeded moment between lo and hi seconds after `since`."""
        delay = self.rng.uniform(lo, hi)
        time.sleep(max(0.0, since + delay - time.monotonic()))
        return self.kill(since, phase)

    def kill_unless(self, since: float, lo: float, hi: float, done: Callable[[], bool],
                    phase: str = "") -> KillPoint | None:
        """Kill at a seeded moment between lo and hi seconds after `since`, unless the act the kill
        is aimed before is `done` first (None then: no kill, no watcher started). A kill after
        the act is not a kill point of its phase, and its watcher start is only cost."""
        moment = since + self.rng.uniform(lo, hi)
        while not done():
            left = moment - time.monotonic()
            if left <= 0:
                return self.kill(since, phase)
            time.sleep(min(left, 0.02))
        return None

    def finish(self, timeout: float = 90) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("watch did not finish:\n" + self.output()[-4000:]) from None

    def close(self) -> None:
        self.sampler.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # -- what the world and the journal say ------------------------------------------------

    def node(self, name: str = "") -> Any:
        """The simulator's record of the node (or of slice `name`), or None when it does not exist."""
        for n in self.sim.world.nodes():
            if n.name == (name or self.name):
                return n
        return None

    def usable(self, name: str) -> bool:
        node = self.node(name)
        return node is not None and node.state == "READY" and node.health == "HEALTHY"

    def journal(self) -> Journal:
        return Journal.open(self.state_dir, self.name, self.name, readonly=True)

    def journal_phase(self) -> str:
        """The journal's phase; opening it at all is part of the test (readable after any kill)."""
        try:
            with self.journal() as j:
                mem = j.load_memory()
                j.attempts()
                j.events(limit=5)
                assert j.connection.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        except NotFoundError:
            return ""
        return "" if mem is None else mem.phase.value

    def workers_running(self) -> int:
        """Workers on which a trainer of the job runs now."""
        return len(self.sampler.trainers())

    def classify(self, jphase: str) -> str:
        if len(self.names) > 1:  # a multislice job: its scenario names the stages it kills in
            return "start" if jphase == "" else "other"
        node = self.node()
        if jphase == "queued":
            return "queued"
        if jphase == "deleting" or (node is not None and node.state == "DELETING"):
            return "delete"
        if jphase == "creating" or node is None or node.state == "CREATING":
            return "create"
        if jphase == "":
            return "start"
        usable = node.state == "READY" and node.health == "HEALTHY"
        if usable and jphase in ("idle", "running", "backoff", "waiting_node"):
            return "launch" if self.workers_running() < node.n_workers else "running"
        return "repair" if not usable else "other"

    def steps_done(self) -> list[int]:
        return sorted(int(p.name) for p in self.ck.iterdir() if p.name.isdigit()) if self.ck.exists() else []

    def wait(self, pred: Callable[[], bool], timeout: float = 30, what: str = "") -> float:
        """Wait until `pred()`; the monotonic time it became true."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return time.monotonic()
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the watcher ended (exit {self.proc.returncode}) while waiting for "
                                     f"{what}:\n" + self.output()[-3000:])
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}:\n" + self.output()[-3000:])

    def running_with_progress(self, timeout: float = 30) -> None:
        """Every worker runs the trainer and it has saved a checkpoint since this call."""
        before = (self.steps_done() or [0])[-1]
        nodes = [self.node(n) for n in self.names]
        assert all(n is not None for n in nodes)
        workers = sum(n.n_workers for n in nodes)
        self.wait(lambda: self.workers_running() == workers and (self.steps_done() or [0])[-1] > before,
                  timeout, "the job running with a new checkpoint")

    # -- the end ----------------------------------------------------------------------------

    def assert_invariants(self, rc: int) -> dict[str, Any]:
        out = self.output()
        assert rc == 0, out[-4000:]
        self.assert_nodes()
        self.sampler.sample()
        assert self.sampler.violations == [], self.sampler.violations[:5]
        assert self.sampler.max_per_worker <= 1 and self.sampler.max_attempts <= 1
        hist = self.cli("history", "-c", str(self.cfg), "--json")
        assert hist.returncode == 0, hist.stderr
        attempts = json.loads(hist.stdout)["attempts"]
        numbers = [a["attempt"] for a in attempts]
        assert numbers == sorted(set(numbers)), numbers
        assert attempts[-1]["outcome"] == "success", attempts[-1]
        assert self.steps_done()[-1] == self.steps, (self.steps, self.steps_done()[-5:], attempts[-3:])
        # Each attempt resumed from the newest complete checkpoint there was when it was launched:
        # every checkpoint newer than its start step was committed after its start.
        commits = {s: _commit_time(self.ck / str(s)) for s in self.steps_done()}
        for a in attempts:
            start = datetime.fromisoformat(a["start"]).timestamp()
            base = a["start_step"] if a["start_step"] is not None else -1
            older = [s for s, t in commits.items() if s > base and t < start - 0.05]
            assert not older, (f"attempt {a['attempt']} started at step {a['start_step']} although "
                               f"checkpoints {older} were complete before it", attempts)
        return {"attempts": attempts, "kills": self.kills}


    def assert_nodes(self) -> None:
        """At the end: each of the job's slices is one READY node (a subclass checks its own kind)."""
        for name in self.names:
            nodes = [n for n in self.sim.world.nodes() if n.name == name]
            assert len(nodes) == 1 and nodes[0].state == "READY", [(n.zone, n.state) for n in nodes]


def _commit_time(step_dir: Path) -> float:
    """When a checkpoint became complete: its rename (ctime) or its commit file, the later."""
    times = [step_dir.stat().st_ctime]
    commit = step_dir / "commit_success.txt"
    if commit.exists():
        times.append(commit.stat().st_mtime)
    return max(times)
