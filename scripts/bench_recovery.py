#!/usr/bin/env python3
"""Recovery time in real time, end to end: tpuwatch against the bash retry loop, fault by fault.

    python scripts/bench_recovery.py                          # every fault, default settings, a table
    python scripts/bench_recovery.py --faults healed --repeat 3 --json
    python scripts/bench_recovery.py --poll 5 --outage 30 --baselines ssh
    python scripts/bench_recovery.py --faults sigkill --repeat 10 --baselines none   # kill -9, 10 times

Each run starts a fresh simulator (tpuwatch.sim.Simulator: the TPU API over gRPC, SSH workers on
loopback, the toy trainer), runs one contestant until the job trains steadily, injects one fault
and measures, from the fault:
- noticed: tpuwatch's first `watch --json` line after the fault whose policy row is no longer
  "running"; for a loop, its first new ssh attempt (the loop has seen its command end);
- running: the moment every worker runs the trainer again (every worker that lost its trainer
  process has a new one), read from /proc every 20 ms;
- ckpt: the first checkpoint completed after that;
- ssh: ssh client invocations (a counting `ssh` first in PATH, for every contestant alike),
  API: calls the simulator counted (sim.world.calls), TCP: tpuwatch's cheap port probes
  (`port_probes` of its JSON lines), all from the fault to "running" (or to giving up).

Contestants: `tpuwatch watch` at the given poll interval (its other settings at their defaults
but min_uptime, and repair_timeout in the never-heals runs; see --help); the bash loop of the TPU docs with plain ssh, one
loop per worker (`while ! ssh W "python3 -m tpuwatch.sim.trainer ..."; do sleep 1; done`); and
the docs' literal form, `while ! gcloud compute tpus tpu-vm ssh pod --worker=all --command ...;
do sleep 1; done`, with the real gcloud pointed at the simulator's REST face. The loops resume
from the newest checkpoint as a user's train.py would. Everything runs in real time: the loop
sleeps a real second, tpuwatch polls every --poll real seconds; only the cloud's own delays
(repair, delete, create) come from the simulator, at --speed. Their sum for a fault is its
floor, and `ratio` is running / floor.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tpuwatch.sim.simulator import Simulator

FAULTS = ("healed", "never-heals", "preempt", "crash", "sigkill", "kill")
FAULT_TEXT = {
    "healed": "maintenance that heals",
    "never-heals": "maintenance that never heals (recreate)",
    "preempt": "spot preemption + stockout",
    "crash": "transient crash (SIGSEGV, worker 0)",
    "sigkill": "trainer killed by SIGKILL (kill -9, last worker)",
    "kill": "worker killed (last worker)",
}
CONTESTANTS = ("tpuwatch", "ssh", "gcloud")
JOB = "pod"
RUNTIME = "tpu-ubuntu2204-base"
SCAN_EVERY = 0.02  # seconds between /proc scans while waiting for the job to run again
REAL_SSH = shutil.which("ssh") or "/usr/bin/ssh"
GCLOUD = shutil.which("gcloud") or "/usr/bin/gcloud"


# --- settings -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    faults: tuple[str, ...] = FAULTS
    contestants: tuple[str, ...] = CONTESTANTS
    speed: float = 60.0  # simulator speed: its repair/delete/create delays run this much faster
    poll: float = 30.0  # tpuwatch recovery.poll_interval, real seconds
    repair_timeout: float = 60.0  # tpuwatch recovery.repair_timeout in the never-heals runs, real seconds
    min_uptime: float = 2.0  # tpuwatch recovery.min_uptime: the bench's job has run longer
    outage: float = 120.0  # healed maintenance: real seconds until the node is healthy again
    stockout: float = 20.0  # preempt: real seconds the zone has no capacity from the fault
    accelerator: str = "v4-16"
    step_time: float = 0.05
    ckpt_every: int = 20
    give_up: float = 30.0  # a loop that has not recovered this long after the floor never will
    repeat: int = 1
    seed: int = 0
    extra_config: tuple[str, ...] = ()  # "section.key=value" for tpuwatch.toml

    def floor(self, fault: str, delays: dict[str, float], outage: float | None = None) -> float:
        """Real seconds the simulated cloud itself takes to give the job a usable node back."""
        s = self.speed
        if fault == "healed":
            return self.outage if outage is None else outage
        if fault == "never-heals":
            return self.repair_timeout + (delays["delete"] + delays["create"]) / s
        if fault == "preempt":
            return max(delays["delete"] / s, self.stockout) + delays["create"] / s
        return 0.0


# --- the simulated cloud and the job ------------------------------------------------------------

def ck_steps(ck: Path) -> set[int]:
    """Steps of the complete checkpoints in `ck` (the trainer renames a finished one to <step>)."""
    try:
        return {int(p.name) for p in ck.iterdir() if p.name.isdigit()}
    except OSError:
        return set()


def outage_of(st: Settings, seed: int) -> float:
    """This run's healed-maintenance length: --outage plus a seeded fraction of a second, so that
    the heal does not always fall at the same point of the loop's one-second rhythm."""
    return st.outage + random.Random(f"outage-{seed}").random()


class Cluster:
    """One simulator with one node, the shared checkpoint bucket and a counting `ssh` in PATH."""

    def __init__(self, st: Settings, root: Path, fault: str, seed: int) -> None:
        self.st = st
        self.outage = outage_of(st, seed)
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.sim = Simulator(root=root / "sim", speed=st.speed, seed=seed)
        self.sim.start()
        spot = fault == "preempt"
        self.sim.create_node(JOB, st.accelerator, labels={"tpuwatch-job": JOB}, spot=spot)
        self.spot = spot
        self.key = self.sim.node_key(JOB)
        self.n = self.sim.world.node(JOB).n_workers
        self.ck = self.sim.bucket / "ck"
        self.bin = root / "bin"
        self.bin.mkdir(exist_ok=True)
        self.ssh_log = root / "ssh.log"
        self.ssh_log.touch()
        wrapper = self.bin / "ssh"
        # bash's $EPOCHREALTIME: a timestamp per invocation without forking `date`.
        wrapper.write_text(f'#!/bin/bash\nprintf "%s\\n" "$EPOCHREALTIME" >> {shlex.quote(str(self.ssh_log))}\n'
                           f'exec {shlex.quote(REAL_SSH)} "$@"\n')
        wrapper.chmod(0o755)
        self.marker = f"TPUWATCH_SIM_WORKER={self.sim.hosts.instance}/{self.key}/".encode()

    def env(self) -> dict[str, str]:
        env = {**os.environ, **self.sim.env}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def trainer_args(self) -> str:
        return (f"python3 -m tpuwatch.sim.trainer --steps 10000000 --step-time {self.st.step_time} "
                f"--ckpt-every {self.st.ckpt_every} --ckpt-dir {shlex.quote(str(self.ck))}")

    def trainers(self) -> dict[int, set[int]]:
        """Live trainer processes per worker (the trainer itself, not a shell around it)."""
        out: dict[int, set[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if b"tpuwatch.sim.trainer" not in argv or not argv[0].rsplit(b"/", 1)[-1].startswith(b"python"):
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            at = env.find(self.marker)
            if at < 0:
                continue
            rest = env[at + len(self.marker):].split(b"\0", 1)[0]
            if rest.isdigit():
                out.setdefault(int(rest), set()).add(int(entry))
        return out

    def ssh_times(self) -> list[float]:
        try:
            return [float(x) for x in self.ssh_log.read_text().split()]
        except (OSError, ValueError):
            return []

    def handshakes(self) -> int:
        """SSH connections the node's workers accepted (with multiplexing, far fewer than ssh runs)."""
        try:
            return sum(self.sim.hosts.accepted(self.key, w) for w in range(self.n))
        except Exception:  # the node was deleted: its workers' counts went with it
            return 0

    def api_calls(self) -> int:
        with self.sim.world._lock:  # a consistent total while the server counts
            return sum(self.sim.world.calls.values())

    def node_id(self) -> int | None:
        try:
            n = self.sim.world.node(JOB)
        except Exception:
            return None
        return n.id if n.state == "READY" and n.health == "HEALTHY" else None

    def inject(self, fault: str) -> None:
        sim, st = self.sim, self.st
        if fault == "healed":
            sim.inject("maintenance", node=JOB, heal_after=self.outage * st.speed)
        elif fault == "never-heals":
            sim.inject("maintenance", node=JOB, stuck="REPAIRING")
        elif fault == "preempt":
            sim.world.stockout(sim.zone, duration=st.stockout * st.speed)
            sim.inject("preempt", node=JOB)
        elif fault == "crash":
            pids = self.trainers().get(0, set())
            if not pids:
                raise RuntimeError("no trainer on worker 0 to crash")
            for pid in pids:
                os.kill(pid, signal.SIGSEGV)
        elif fault == "sigkill":
            # As the OOM killer or a user's `kill -9` does: the trainer alone, with no exit code of
            # its own (the worker's wrapper reports 137); sshd and the follow channel live on.
            pids = self.trainers().get(self.n - 1, set())
            if not pids:
                raise RuntimeError(f"no trainer on worker {self.n - 1} to kill")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        elif fault == "kill":
            sim.inject("kill-worker", node=JOB, worker=self.n - 1)
        else:
            raise ValueError(fault)

    def close(self) -> None:
        self.sim.close()


# --- contestants --------------------------------------------------------------------------------

class Contestant:
    name = ""

    def __init__(self, cl: Cluster, work: Path, fault: str) -> None:
        self.cl = cl
        self.work = work
        self.fault = fault
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        raise NotImplementedError

    def noticed(self, wall0: float) -> float | None:
        """Wall-clock time at which this contestant first reacted to a fault at `wall0`."""
        later = [t for t in self.cl.ssh_times() if t > wall0]
        return min(later) if later else None

    def port_probes(self) -> int:
        return 0

    def output_tail(self, lines: int = 8) -> str:
        text = "".join(p.read_text(errors="replace") for p in sorted(self.work.glob("loop*.log")))
        return "\n".join(text.splitlines()[-lines:])

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
        with open(log, "w") as out:
            p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_config(path: Path, sim: Simulator, command: str, ck: Path, *, accelerator: str, spot: bool,
                 recovery: dict[str, object], extra: tuple[str, ...] = ()) -> Path:
    """A tpuwatch.toml for node `pod` of `sim` with [tpu.spec] so that it can be recreated."""
    sections: dict[str, dict[str, object]] = {
        "tpu": {"name": JOB},
        "tpu.spec": {"accelerator_type": accelerator, "runtime_version": RUNTIME, "spot": spot},
        "job": {"command": command, "checkpoint_dir": str(ck)},
        "recovery": dict(recovery),
        "ssh": {"user": sim.ssh_user or "", "identity_file": str(sim.ssh_key), "port": sim.ssh_port or 22,
                "internal_ip": True},
    }
    for item in extra:
        key, _, value = item.partition("=")
        section, _, name = key.rpartition(".")
        if not section or not name or not _:
            raise SystemExit(f"--config: expected section.key=value, got {item!r}")
        try:
            parsed: object = json.loads(value)
        except ValueError:
            parsed = value
        sections.setdefault(section, {})[name] = parsed
    return write_toml(path, sections)


def write_toml(path: Path, sections: dict[str, dict[str, object]]) -> Path:
    """`sections` as a TOML file at `path` (each section's keys, values of the simple kinds)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Tpuwatch(Contestant):
    name = "tpuwatch"

    def start(self) -> None:
        st = self.cl.st
        command = self.cl.trainer_args() + " --resume {checkpoint}"
        recovery: dict[str, object] = {"poll_interval": f"{st.poll:g}s", "min_uptime": f"{st.min_uptime:g}s"}
        if self.fault == "never-heals":
            # Elsewhere the shipped 30 minutes: a node that heals is waited for, as users want.
            recovery["repair_timeout"] = f"{st.repair_timeout:g}s"
        cfg = write_config(self.work / "tpuwatch.toml", self.cl.sim, command, self.cl.ck,
                           accelerator=st.accelerator, spot=self.cl.spot, recovery=recovery,
                           extra=st.extra_config)
        env = {**self.cl.env(), "TPUWATCH_STATE_DIR": str(self.work / "state")}
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.raw: list[str] = []
        p = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(cfg), "--json"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)
        self.procs.append(p)
        threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            self.raw.append(line)
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self.lines.append((time.time(), obj))

    def noticed(self, wall0: float) -> float | None:
        for _, obj in list(self.lines):
            try:
                t = datetime.fromisoformat(obj["time"]).timestamp()
            except (KeyError, ValueError):
                continue
            if t >= wall0 and obj.get("row") != "running":
                return t
        return None

    def port_probes(self) -> int:
        return max([int(obj.get("port_probes", 0)) for _, obj in list(self.lines)] or [0])

    def output_tail(self, lines: int = 8) -> str:
        return "".join(self.raw[-lines:])[-4000:]


class SshLoop(Contestant):
    """The docs' loop with plain ssh, one per worker (ssh reaches one host at a time)."""

    name = "ssh"

    def start(self) -> None:
        sim = self.cl.sim
        ck = shlex.quote(str(self.cl.ck))
        train = (f'last=$(ls {ck} 2>/dev/null | grep -E "^[0-9]+$" | sort -n | tail -1); '
                 f'{self.cl.trainer_args()} --resume "${{last:+{self.cl.ck}/$last}}"')
        ssh = (f"ssh -T -p {sim.ssh_port} -l {sim.ssh_user} -i {shlex.quote(str(sim.ssh_key))} -o BatchMode=yes "
               "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
        for w, ip in enumerate(sim.world.node(JOB).ips):
            loop = f"while ! {ssh} {ip} {shlex.quote(train)}; do sleep 1; done"
            self.spawn(["bash", "-c", loop], self.cl.env(), self.work / f"loop-{w}.log")
        self.script = loop


class GcloudLoop(Contestant):
    """The docs' loop, literally: gcloud compute tpus tpu-vm ssh --worker=all, against the REST face."""

    name = "gcloud"

    def start(self) -> None:
        from tpuwatch.sim import gcloudcfg
        from tpuwatch.sim.rest import RestFace

        sim = self.cl.sim
        self.rest = RestFace(sim.world).start()
        cfg = gcloudcfg.write_config(self.work / "gcloud", url=self.rest.url, project=sim.project, zone=sim.zone,
                                     home=self.work / "home", ssh_key=sim.ssh_key)
        env = {**self.cl.env(), **cfg.env}
        for k in ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE"):
            env.pop(k, None)  # gcloud reads them from its configuration, as for a user
        ck = self.cl.ck
        train = (f'last=$(ls {ck} 2>/dev/null | grep -E "^[0-9]+$" | sort -n | tail -1); '
                 f'{self.cl.trainer_args()} --resume "${{last:+{ck}/$last}}"')
        loop = (f"while ! gcloud compute tpus tpu-vm ssh {JOB} --zone={sim.zone} --worker=all "
                f"--ssh-flag='-p {sim.ssh_port}' --command {shlex.quote(train)}; do sleep 1; done")
        self.spawn(["bash", "-c", loop], env, self.work / "loop.log")

    def stop(self) -> None:
        super().stop()
        self.rest.close()


MAKERS: dict[str, Callable[[Cluster, Path, str], Contestant]] = {
    "tpuwatch": Tpuwatch, "ssh": SshLoop, "gcloud": GcloudLoop,
}


# --- one run ------------------------------------------------------------------------------------

@dataclass
class Result:
    fault: str
    contestant: str
    seed: int
    floor: float
    noticed: float | None = None  # seconds from the fault
    running: float | None = None
    ckpt: float | None = None
    recreated: float | None = None  # the node READY+HEALTHY with a new id
    ssh: int = 0
    api: int = 0
    tcp_probes: int = 0
    handshakes: int = -1  # SSH connections the workers accepted; -1: not counted (node replaced)
    window: float = 0.0  # seconds over which ssh/api/tcp were counted
    offset: float = 0.0  # seconds waited in steady state before the fault (tpuwatch: phase in its poll)
    api_methods: dict[str, int] = field(default_factory=dict)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.running is None or self.floor <= 0 else self.running / self.floor

    @property
    def after(self) -> float | None:
        """Seconds from the floor (the node usable again) to running again."""
        return None if self.running is None else self.running - self.floor


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def run_one(st: Settings, fault: str, who: str, seed: int, root: Path, log: Callable[[str], None]) -> Result:
    cl = Cluster(st, root, fault, seed)
    floor = st.floor(fault, cl.sim.world.delays, cl.outage)
    res = Result(fault, who, seed, round(floor, 3))
    c = MAKERS[who](cl, root, fault)
    try:
        c.start()
        try:
            wait_until(lambda: len(cl.trainers()) == cl.n and bool(ck_steps(cl.ck)), 90,
                       f"{who}: the job running on {cl.n} workers with a checkpoint")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; its output ends:\n{c.output_tail()}") from None
        if who == "tpuwatch":
            # Where the fault lands in tpuwatch's poll cycle decides how soon it notices: seeded.
            res.offset = round(random.Random(seed).uniform(0, st.poll), 3)
            time.sleep(res.offset)
            if len(cl.trainers()) != cl.n:
                raise RuntimeError("the job stopped before the fault")
        pre = cl.trainers()
        old_id = cl.node_id()
        api0, methods0 = cl.api_calls(), dict(cl.sim.world.calls)
        probes0 = c.port_probes()
        conns0 = cl.handshakes()
        wall0, t0 = time.time(), time.monotonic()
        cl.inject(fault)
        log(f"  {who}: injected {fault} at +0.0s (floor {floor:.1f}s)")
        can_recover = who == "tpuwatch" or fault in ("healed", "crash", "sigkill", "kill")
        budget = floor + (st.poll * 2 + 120 if who == "tpuwatch" else st.give_up)
        lost: set[int] = set()
        end_t = None
        while time.monotonic() - t0 < budget:
            now = cl.trainers()
            for w in range(cl.n):
                if not pre.get(w, set()) & now.get(w, set()):
                    lost.add(w)
            if res.recreated is None and old_id is not None:
                nid = cl.node_id()
                if nid is not None and nid != old_id:
                    res.recreated = round(time.monotonic() - t0, 3)
            if lost and all(now.get(w) for w in range(cl.n)) and all(now[w] - pre.get(w, set()) for w in lost):
                end_t = time.monotonic()
                res.running = round(end_t - t0, 3)
                break
            if any(p.poll() is not None for p in c.procs[:1]) and who == "tpuwatch":
                res.note = f"watch exited {c.procs[0].returncode}"
                break
            time.sleep(SCAN_EVERY)
        window_end = end_t if end_t is not None else time.monotonic()
        res.window = round(window_end - t0, 3)
        res.api = cl.api_calls() - api0
        methods1 = dict(cl.sim.world.calls)
        res.api_methods = {m.rsplit("/", 1)[-1]: n - methods0.get(m, 0) for m, n in methods1.items()
                           if n - methods0.get(m, 0)}
        wall_end = wall0 + res.window
        res.ssh = sum(1 for t in cl.ssh_times() if wall0 < t <= wall_end)
        if fault in ("crash", "sigkill", "kill"):  # the same node throughout
            res.handshakes = cl.handshakes() - conns0
        if res.running is not None:
            base = ck_steps(cl.ck)
            try:
                wait_until(lambda: bool(ck_steps(cl.ck) - base), 30, "a new checkpoint")
                res.ckpt = round(time.monotonic() - t0, 3)
            except RuntimeError:
                res.note = (res.note + "; " if res.note else "") + "no checkpoint within 30 s"
        elif not can_recover:
            res.note = res.note or f"never recovers (gave up {res.window:.0f}s after the fault)"
        else:
            res.note = res.note or f"not running again within {res.window:.0f}s"
        n = c.noticed(wall0)
        res.noticed = None if n is None else round(n - wall0, 3)
        res.tcp_probes = c.port_probes() - probes0
    finally:
        c.stop()
        cl.close()
    if who == "tpuwatch" and res.running is None:
        log(f"  tpuwatch output (last lines):\n{c.output_tail()}")
    return res


# --- summary ------------------------------------------------------------------------------------

def median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    if not vals or len(vals) < len(xs):
        return None  # a run that never got there makes the median "never"
    return statistics.median(vals)


def p95(xs: list[float | None]) -> float | None:
    """The 95th percentile (nearest rank); None when a run never got there."""
    vals = sorted(x for x in xs if x is not None)
    if not vals or len(vals) < len(xs):
        return None
    return vals[max(0, -(-95 * len(vals) // 100) - 1)]


def summarize(results: list[Result]) -> list[dict[str, Any]]:
    rows = []
    keys = []
    for r in results:
        if (r.fault, r.contestant) not in keys:
            keys.append((r.fault, r.contestant))
    for fault, who in keys:
        rs = [r for r in results if r.fault == fault and r.contestant == who]
        running = median([r.running for r in rs])
        floor = statistics.median([r.floor for r in rs])
        rows.append({
            "fault": fault, "contestant": who, "runs": len(rs), "floor": floor,
            "noticed": median([r.noticed for r in rs]), "running": running,
            "noticed_p95": p95([r.noticed for r in rs]), "running_p95": p95([r.running for r in rs]),
            "after": median([r.after for r in rs]),
            "ratio": median([r.ratio for r in rs]) if floor > 0 else None,
            "noticed_max": max((r.noticed for r in rs if r.noticed is not None), default=None),
            "after_max": max((r.after for r in rs if r.after is not None), default=None),
            "ckpt": median([r.ckpt for r in rs]), "recreated": median([r.recreated for r in rs]),
            "ssh": statistics.median([r.ssh for r in rs]), "api": statistics.median([r.api for r in rs]),
            "tcp_probes": statistics.median([r.tcp_probes for r in rs]),
            "handshakes": statistics.median([r.handshakes for r in rs]),
            "window": statistics.median([r.window for r in rs]),
            "notes": sorted({r.note for r in rs if r.note}),
        })
    return rows


def targets(rows: list[dict[str, Any]], st: Settings, delays: dict[str, float]) -> list[dict[str, Any]]:
    """The issue's targets, checked against the measured medians."""
    out = []
    by = {(r["fault"], r["contestant"]): r for r in rows}
    tw = by.get(("healed", "tpuwatch"))
    loop = by.get(("healed", "ssh")) or by.get(("healed", "gcloud"))
    if tw and loop and tw["running"] is not None and loop["running"] is not None:
        cost_tw = tw["ssh"] + tw["api"]
        cost_loop = loop["ssh"] + loop["api"]
        out.append({"target": "healed maintenance: running again no later than the bash loop + 1 s",
                    "measured": f"after the node is back: tpuwatch {tw['after']:.2f}s, {loop['contestant']} loop "
                                f"{loop['after']:.2f}s (medians; running {tw['running']:.1f}s vs "
                                f"{loop['running']:.1f}s from the fault)",
                    "met": tw["after"] <= loop["after"] + 1.0})
        out.append({"target": "healed maintenance: at most a tenth of the loop's ssh attempts + API calls",
                    "measured": f"tpuwatch {tw['ssh']:g} ssh + {tw['api']:g} API = {cost_tw:g} "
                                f"(+{tw['tcp_probes']:g} TCP probes), loop {cost_loop:g}: "
                                f"{cost_tw / max(cost_loop, 1):.1%}",
                    "met": cost_tw <= cost_loop / 10})
    for fault in ("crash", "sigkill", "kill"):
        tw = by.get((fault, "tpuwatch"))
        loop = by.get((fault, "ssh")) or by.get((fault, "gcloud"))
        if tw is None:
            continue
        vs = ""
        if loop is not None:
            vs = (f"; {loop['contestant']} loop {fmt(loop['running'])} median, {fmt(loop['running_p95'])} p95")
        if fault == "sigkill":
            # kill -9 to the next attempt started: median under 2 s, p95 under 3 s
            goal, met = "under 2 s (median), 3 s (p95)", (
                tw["running"] is not None and tw["running"] < 2.0
                and tw["running_p95"] is not None and tw["running_p95"] < 3.0)
        else:
            goal, met = "in under 3 s (median)", tw["running"] is not None and tw["running"] < 3.0
        out.append({"target": f"{FAULT_TEXT[fault]}: running again {goal} with poll {st.poll:g}s",
                    "measured": f"tpuwatch {fmt(tw['running'])} median, {fmt(tw['running_p95'])} p95 over "
                                f"{tw['runs']} run(s) (noticed {fmt(tw['noticed'])} median, "
                                f"{fmt(tw['noticed_p95'])} p95; {tw['ssh']:g} ssh runs, "
                                f"{tw['handshakes']:g} SSH handshakes){vs}",
                    "met": met})
    nh = by.get(("never-heals", "tpuwatch"))
    if nh:
        bound = st.repair_timeout + (delays["delete"] + delays["create"]) / st.speed + st.poll
        got = nh["recreated"]
        out.append({"target": "never-healing maintenance: recreated within repair_timeout + delete + create + one poll",
                    "measured": f"recreated {'never' if got is None else f'{got:.1f}s'} after the fault, "
                                f"bound {bound:.1f}s",
                    "met": got is not None and got <= bound})
    return out


def fmt(x: float | None, unit: str = "s") -> str:
    return "never" if x is None else f"{x:.1f}{unit}"


def render(rows: list[dict[str, Any]], tg: list[dict[str, Any]], st: Settings) -> str:
    head = ["fault", "who", "noticed", "running", "floor", "after", "ratio", "1st ckpt", "recreated", "ssh", "API",
            "TCP"]
    table = [head]
    for r in rows:
        table.append([
            r["fault"], r["contestant"], fmt(r["noticed"]), fmt(r["running"]), fmt(r["floor"]),
            "-" if r["after"] is None else f"+{r['after']:.2f}s",
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}", fmt(r["ckpt"]),
            "-" if r["recreated"] is None else fmt(r["recreated"]),
            f"{r['ssh']:g}", f"{r['api']:g}", f"{r['tcp_probes']:g}",
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r['fault']}/{r['contestant']}: {n}" for r in rows for n in r["notes"]]
    out = [f"recovery, real time: speed {st.speed:g}, poll {st.poll:g}s, repair_timeout {st.repair_timeout:g}s (never-heals), "
           f"outage {st.outage:g}s, stockout {st.stockout:g}s, {st.accelerator}, {st.repeat} run(s) each, "
           f"seed {st.seed}", "", *lines]
    out += ["", "times are seconds from the fault (median over runs); after = running - floor; ssh/API/TCP are "
                "counted from the fault to running again (or to giving up)"]
    if notes:
        out += ["notes:", *notes]
    if tg:
        out += ["", "targets:"]
        out += [f"  [{'met' if t['met'] else 'NOT MET'}] {t['target']}: {t['measured']}" for t in tg]
    return "\n".join(out)


# --- command line -------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> tuple[Settings, bool, bool, str | None]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--faults", default=",".join(d.faults), help=f"comma list of {', '.join(FAULTS)}")
    p.add_argument("--baselines", default="ssh,gcloud", help="comma list of ssh, gcloud (or none)")
    p.add_argument("--speed", type=float, default=d.speed, help="simulator speed (default %(default)s)")
    p.add_argument("--poll", type=float, default=d.poll, help="tpuwatch poll_interval, real seconds (%(default)s)")
    p.add_argument("--repair-timeout", type=float, default=d.repair_timeout,
                   help="tpuwatch repair_timeout in the never-heals runs, real seconds (%(default)s); "
                        "the others keep the shipped 30 minutes")
    p.add_argument("--min-uptime", type=float, default=d.min_uptime, help="tpuwatch min_uptime (%(default)s)")
    p.add_argument("--outage", type=float, default=d.outage, help="healed maintenance length, real s (%(default)s)")
    p.add_argument("--stockout", type=float, default=d.stockout, help="stockout length, real s (%(default)s)")
    p.add_argument("--accelerator", default=d.accelerator, help="node type (%(default)s: 2 workers)")
    p.add_argument("--step-time", type=float, default=d.step_time, help="trainer step time (%(default)s)")
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every, help="trainer steps per checkpoint (%(default)s)")
    p.add_argument("--give-up", type=float, default=d.give_up,
                   help="a loop not running again this long after the floor never will (%(default)s)")
    p.add_argument("--repeat", type=int, default=d.repeat, help="runs per fault and contestant (%(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="first seed; run i uses seed+i (%(default)s)")
    p.add_argument("--config", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra tpuwatch.toml setting, e.g. recovery.backoff_base=1s (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON object to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.parse_args(argv)
    faults = tuple(f for f in a.faults.split(",") if f)
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        p.error(f"--faults: unknown {', '.join(bad)}; known: {', '.join(FAULTS)}")
    base = tuple(b for b in a.baselines.split(",") if b and b != "none")
    bad = [b for b in base if b not in ("ssh", "gcloud")]
    if bad:
        p.error(f"--baselines: unknown {', '.join(bad)}; known: ssh, gcloud")
    if "gcloud" in base and not os.path.exists(GCLOUD):
        print("gcloud not found: skipping the gcloud loop", file=sys.stderr)
        base = tuple(b for b in base if b != "gcloud")
    if a.repeat < 1 or a.speed <= 0 or a.poll <= 0:
        p.error("--repeat, --speed and --poll must be positive")
    st = Settings(faults=faults, contestants=("tpuwatch", *base), speed=a.speed, poll=a.poll,
                  repair_timeout=a.repair_timeout, min_uptime=a.min_uptime, outage=a.outage, stockout=a.stockout,
                  accelerator=a.accelerator, step_time=a.step_time, ckpt_every=a.ckpt_every, give_up=a.give_up,
                  repeat=a.repeat, seed=a.seed, extra_config=tuple(a.config))
    return st, a.json, a.quiet, a.json_out


def runs(st: Settings) -> Iterator[tuple[str, str, int]]:
    for fault in st.faults:
        for i in range(st.repeat):
            for who in st.contestants:
                yield fault, who, st.seed + i


def main(argv: list[str] | None = None) -> int:
    st, as_json, quiet, json_out = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so every simulator, loop and watcher is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    def log(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    results: list[Result] = []
    delays: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for k, (fault, who, seed) in enumerate(runs(st)):
            log(f"[{time.monotonic() - started:6.1f}s] {fault} / {who} (seed {seed})")
            root = Path(tmp) / f"{k:02d}-{fault}-{who}"
            r = run_one(st, fault, who, seed, root, log)
            if not delays:
                from tpuwatch.sim.core import DEFAULT_DELAYS
                delays = dict(DEFAULT_DELAYS)
            log(f"  {who}: noticed {fmt(r.noticed)}, running {fmt(r.running)}, ssh {r.ssh}, API {r.api}, "
                f"TCP {r.tcp_probes}{' - ' + r.note if r.note else ''}")
            results.append(r)
    rows = summarize(results)
    tg = targets(rows, st, delays)
    doc = {"settings": asdict(st), "delays": delays, "rows": rows, "targets": tg,
           "runs": [{**asdict(r), "ratio": r.ratio, "after": r.after} for r in results],
           "seconds": round(time.monotonic() - started, 1)}
    text = json.dumps(doc, indent=2, sort_keys=True)
    if json_out:
        Path(json_out).write_text(text + "\n")
    print(text if as_json else render(rows, tg, st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
