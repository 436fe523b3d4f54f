"""Shared helpers for end-to-end tests: a job on the simulator driven by the real CLI.

Not a test module: `Job` writes a tpuwatch.toml with scaled durations for a node it creates,
runs `tpuwatch` subcommands as subprocesses, and reads outcomes from the journal, the
trainer's checkpoints and the simulated workers' processes. With `hold_at` its job stalls at that
step until `release()`, so a fault injected there meets a running job however busy the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_process

from tpuwatch.errors import NotFoundError, UsageError
from tpuwatch.journal import AttemptRow, Journal
from tpuwatch.policy import Memory
from tpuwatch.sim.hosts import MARKER
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler, TickReport

STEPS = 60


def trainer(ck: Path, extra: str = "", steps: int = STEPS) -> str:
    return (f"python3 -m tpuwatch.sim.trainer --steps {steps} --step-time 0.04 --ckpt-every 10 "
            f"--ckpt-dir {ck} --resume {{checkpoint}} {extra}").strip()


def trainer_env(pid: int, job: str) -> dict[str, str] | None:
    """The environment of process `pid` when it is job `job`'s trainer (not the bash wrapper
    whose argument is the command text), else None (or when it is gone)."""
    env = _trainer(pid)
    return env if env is not None and env.get("TPUWATCH_JOB") == job else None


def _trainer(pid: int) -> dict[str, str] | None:
    """The environment of process `pid` when it is a simulated trainer (its command line read
    first: only a trainer's environment is read)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if not (argv[0].rsplit(b"/", 1)[-1].startswith(b"python") and b"tpuwatch.sim.trainer" in argv):
            return None
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def running_trainers(jobs: tuple[str, ...]) -> dict[str, list[dict[str, str]]]:
    """The environments of the trainers of `jobs` running now, by the simulated worker running
    each (its MARKER value): one pass over /proc, for a sampler that looks many times a second."""
    out: dict[str, list[dict[str, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (env := _trainer(int(entry))) is not None and env.get("TPUWATCH_JOB") in jobs:
            out.setdefault(env.get(MARKER, ""), []).append(env)
    return out


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))


def write_config(path: Path, sim: Simulator, command: str, ck: Path, *, tpu: dict[str, object] | None = None,
                 spec: dict[str, object] | None = None, name: str = "pod", **recovery: str | int) -> Path:
    rec: dict[str, object] = {"poll_interval": "0.5s", "stop_grace": "2s", "repair_timeout": "30s",
                              "min_uptime": "0.5s", "backoff_base": "0.2s", "backoff_max": "1s"}
    rec.update(recovery)
    lines = ["[tpu]", f"name = {json.dumps(name)}", *[f"{k} = {toml_value(v)}" for k, v in (tpu or {}).items()]]
    if spec:
        lines += ["[tpu.spec]", *[f"{k} = {toml_value(v)}" for k, v in spec.items()]]
    lines += ["[job]", f"command = {json.dumps(command)}", f"checkpoint_dir = {json.dumps(str(ck))}", "[recovery]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in rec.items()]
    lines += ["[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
              f"port = {sim.ssh_port}", "internal_ip = true"]
    path.write_text("\n".join(lines) + "\n")
    return path


class Job:
    def __init__(self, sim: Simulator, tmp: Path, command_extra: str = "", steps: int = STEPS,
                 accelerator: str = "v4-32", *, spot: bool = False, recreatable: bool = False,
                 tpu: dict[str, object] | None = None, labels: dict[str, str] | None = None,
                 queued: str = "", hold_at: int | None = None, **recovery: str | int) -> None:
        self.sim = sim
        self.ck = sim.bucket / "ck"
        self.steps = steps
        # With hold_at the job stalls at that step (after its checkpoint) until `release()`: a
        # fault injected there always meets a running job, however slow the machine.
        self.go = tmp / "go"
        self.hold_at = hold_at
        if hold_at is not None:
            self.go.mkdir()
            command_extra = f"{command_extra} --hold-at {hold_at} --hold-until {self.go}".strip()
        owner = {"tpuwatch-job": "pod"} if labels is None else labels
        if queued:  # made through queued resource `queued` (its tier: spot when `spot`)
            create_through_queued_resource(sim, queued, accelerator, owner, spot)
            tpu = {"queued_resource": queued, **(tpu or {})}
        else:
            sim.create_node("pod", accelerator, labels=owner, spot=spot)
        spec: dict[str, object] | None = None
        if recreatable:
            spec = {"accelerator_type": accelerator, "runtime_version": "tpu-ubuntu2204-base", "spot": spot,
                    "labels": {"team": "ml"}, "metadata": {"owner-note": "kept on recreate"}}
            if queued:  # as `tpuwatch init` captures it: the tier on the request, not on the node
                spec.update(spot=False, queued_resource_tier="spot" if spot else "")
        self.cfg = write_config(tmp / "tpuwatch.toml", sim, trainer(self.ck, command_extra, steps), self.ck,
                                tpu=tpu, spec=spec, **recovery)
        self.env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state")}

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A one-shot command, a process of its own forked from a warm server (tests/cli_process.py)."""
        return cli_process.run(args, self.env, timeout=timeout)

    def release(self) -> None:
        """Let a job made with `hold_at` go on past that step."""
        assert self.hold_at is not None, "the job was made without hold_at"
        (self.go / str(self.hold_at)).touch()

    def watch(self) -> cli_process.Forked:
        """`tpuwatch watch`, forked from a warm server (tests/cli_process.py): a process of its own."""
        return cli_process.start(["watch", "-c", str(self.cfg)], self.env)

    def history(self) -> dict[str, Any]:
        out = self.cli("history", "-c", str(self.cfg), "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def attempts_journaled(self) -> list[AttemptRow]:
        """The journal's attempts, read in this process as `history` reads them: for a wait that
        looks ten times a second, without a `tpuwatch history` process each time."""
        try:
            with Journal.open(Path(self.env["TPUWATCH_STATE_DIR"]), "pod", None, readonly=True) as j:
                return j.attempts()
        except NotFoundError:  # no tick yet
            return []

    def memory(self) -> dict[str, Any]:
        out = self.cli("check", "-c", str(self.cfg), "--json", "--dry-run")
        assert out.returncode in (0, 1), out.stderr
        return json.loads(out.stdout)

    def steps_done(self) -> list[int]:
        return sorted(int(p.name) for p in self.ck.iterdir() if p.name.isdigit()) if self.ck.exists() else []

    def wait(self, pred: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def job_processes(self) -> dict[int, list[int]]:
        """Live processes of the job per worker (by the job's env marker)."""
        out: dict[int, list[int]] = {}
        key = self.sim.node_key("pod")
        n = self.sim.world.node("pod").n_workers
        # One look at the machine's processes for the node (tests wait on this ten times a
        # second), each sorted to its worker by the marker the worker gave it.
        markers = {f"\0{MARKER}={self.sim.hosts.instance}/{key}/{w}\0".encode(): w for w in range(n)}
        for pid in self.sim.hosts.pids(key):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                argv = cmd.split(b"\0")
                # The trainer itself, not the bash wrapper whose argument is the command text.
                if not (argv[0].rsplit(b"/", 1)[-1].startswith(b"python") and b"tpuwatch.sim.trainer" in argv):
                    continue
                env = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if b"\0TPUWATCH_JOB=pod\0" in env:
                for marker, w in markers.items():
                    if marker in env:
                        out.setdefault(w, []).append(pid)
        return out


def create_through_queued_resource(sim: Simulator, qr_id: str, accelerator: str, labels: dict[str, str],
                                   spot: bool) -> None:
    """Node "pod" made by queued resource `qr_id`, READY with booted workers and the request ACTIVE.

    Straight into the simulated world (not over the API), so the API call counters start at 0.
    """
    from google.cloud import tpu_v2

    from tpuwatch.sim.grpc_api import spec_from_node

    parent = f"projects/{sim.project}/locations/{sim.zone}"
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version="tpu-ubuntu2204-base", labels=labels)
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id="pod", node=node)]))
    if spot:
        qr.spot = tpu_v2.QueuedResource.Spot()
    spec = spec_from_node(node, sim.zone)
    spec.spot = spot
    sim.world.create_queued_resource(sim.project, sim.zone, qr_id, "pod", spec, spot,
                                     tpu_v2.QueuedResource.to_json(qr))
    sim.world.wait_for(lambda w: w.has_node("pod") and w.node("pod").state == "READY"
                       and w.get_queued_resource(sim.project, sim.zone, qr_id).state == "ACTIVE", timeout=30)


def finish(proc: subprocess.Popen[str] | cli_process.Forked, timeout: float = 90) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"watch did not finish:\n{out}") from None
    return proc.returncode, out


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)

def tick_until(rec: Reconciler, done: Callable[[TickReport], bool], what: str, timeout: float = 60,
               pause: float = 0.2) -> TickReport:
    """Tick `rec` until `done(report)`; AssertionError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        report = rec.tick()
        if done(report):
            return report
        time.sleep(pause)
    raise AssertionError(f"timed out waiting for {what}")


def watch_process(cfg: Path, env: dict[str, str]) -> cli_process.Forked:
    """`tpuwatch watch -c cfg`, a process of its own forked from a warm server (tests/cli_process.py)
    whose output the test reads at its end."""
    return cli_process.start(["watch", "-c", str(cfg)], env)


def job_memory(state_dir: Path, job: str) -> Memory | None:
    """The job's memory as its journal holds it now; None before its first tick."""
    try:
        with Journal.open(state_dir, job, job, readonly=True) as journal:
            return journal.load_memory()
    except NotFoundError:  # no journal yet
        return None


def wait_while_watched(pred: Callable[[], bool], proc: subprocess.Popen[str] | cli_process.Forked, what: str,
                       timeout: float = 90) -> None:
    """Wait until `pred()`, while the watcher runs; its output in the failure when it ends or the time is up."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}\n{proc.communicate()[0][-4000:]}")


def checkpoint_steps(ck: Path) -> list[int]:
    """The steps of the checkpoints under `ck`, oldest first."""
    return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.exists() else []


def held_compute_job(sim: Simulator, compute_url: str, tmp: Path, name: str, tpu: dict[str, object]
                     ) -> tuple[Path, dict[str, str], Path]:
    """A Compute Engine job `name` ([tpu] api = "compute" and `tpu`) whose trainer is held at step
    100 until the test creates the returned `go` folder's file "100"; its config, the CLI's env
    (the simulator's REST face at `compute_url`) and `go`."""
    ck, go = sim.bucket / "ck", tmp / "go"
    go.mkdir()
    cfg = write_config(tmp / "tpuwatch.toml", sim, trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1",
                                                           steps=200),
                       ck, name=name, tpu={"api": "compute", **tpu})
    with cfg.open("a") as f:  # each VM resolves only itself in the simulator (not Compute Engine's DNS)
        f.write('[precheck]\nskip = ["dns"]\n')
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state"),
           "TPUWATCH_COMPUTE_EMULATOR": compute_url.rstrip("/")}
    return cfg, env, go


def instance_key(sim: Simulator, instance: str) -> str:
    """The simulator's key of Compute Engine instance `instance` (its hosts' marker)."""
    return f"{sim.project}/{sim.zone}/instances/{instance}"


def trainer_on_instance(sim: Simulator, instance: str, job: str, attempt: int) -> dict[str, str] | None:
    """The environment of job `job`'s trainer of `attempt` on Compute Engine instance `instance`
    (its worker 0), or None."""
    try:
        pids = sim.hosts.pids(instance_key(sim, instance), 0)
    except UsageError:  # its host is not booted (yet, or any more)
        return None
    return next((e for pid in pids if (e := trainer_env(pid, job)) is not None
                 and e["TPUWATCH_ATTEMPT"] == str(attempt)), None)


def compute_job(sim: Simulator, compute_url: str, tmp: Path, name: str, *, steps: int, body: dict[str, Any],
                tpu: dict[str, object] | None = None, job_keys: str = "") -> tuple[Path, dict[str, str], Path]:
    """Compute Engine instance `name` RUNNING (its insert `body`, labelled job `name`'s) and the
    job's config in tmp/jobs (for `tpuwatch watch --config-dir`: [tpu] keys `tpu`, lines
    `job_keys` under [job], and the [tpu.compute_spec] `tpuwatch init` captures); the CLI's env,
    and the directory whose file `100` lets its trainer past step 100."""
    import tomli_w

    sim.world.add_instance(name, body={**body, "labels": {"tpuwatch-job": name}})
    ck, go = sim.bucket / name, tmp / f"go-{name}"
    go.mkdir()
    (tmp / "jobs").mkdir(exist_ok=True)
    cfg = write_config(tmp / "jobs" / f"{name}.toml", sim,
                       trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1", steps=steps), ck, name=name,
                       tpu={"api": "compute", "instance": name, **(tpu or {})})
    if job_keys:
        cfg.write_text(cfg.read_text().replace("[job]\n", f"[job]\n{job_keys}\n", 1))
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state"),
           "TPUWATCH_COMPUTE_EMULATOR": compute_url.rstrip("/")}
    init = cli_process.run(["init", name, "-o", str(tmp / f"init-{name}.toml"), "--json"], env)
    assert init.returncode == 0, init.stderr
    with cfg.open("a") as f:  # each VM resolves only itself in the simulator (not Compute Engine's DNS)
        f.write('[precheck]\nskip = ["dns"]\n')
        f.write(tomli_w.dumps({"tpu": {"compute_spec": json.loads(init.stdout)["spec"]}}))
    return cfg, env, go


def compute_writes(sim: Simulator, verbs: tuple[str, ...]) -> list[str]:
    """The Compute Engine calls ending in one of `verbs` the world served, once each call, sorted."""
    return sorted(m.rsplit(".", 1)[-1] for m, n in sim.world.calls.items() for _ in range(n)
                  if m.startswith("compute.") and m.endswith(verbs))


def cli_json(cfg: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`tpuwatch ARGS -c CFG --json`'s output."""
    run = subprocess.run([sys.executable, "-m", "tpuwatch.cli", *args, "-c", str(cfg), "--json"], env=env, text=True,
                         capture_output=True, timeout=120)
    return dict(json.loads(run.stdout))


def node_trainers(sim: Simulator, node: str, jobs: tuple[str, ...]) -> list[dict[str, str]]:
    """The environments of the trainers of `jobs` running on TPU node `node`'s worker 0."""
    try:
        pids = sim.hosts.pids(sim.node_key(node), 0)
    except UsageError:  # its host is not booted (yet, or any more)
        return []
    return [env for pid in pids for j in jobs if (env := trainer_env(pid, j)) is not None]


class Overlap:
    """Samples the workers of `nodes` every 50 ms until stopped: `seen` holds each moment two
    trainers of `jobs` ran on one (none is what a test asserts), `samples` how many were taken.
    `key` names a node as the simulator does: a TPU API node's by default, `instance_key` for
    Compute Engine instances."""

    def __init__(self, sim: Simulator, nodes: tuple[str, ...], jobs: tuple[str, ...],
                 key: Callable[[Simulator, str], str] = Simulator.node_key) -> None:
        self.sim, self.nodes, self.jobs, self.key = sim, nodes, jobs, key
        self.seen: list[tuple[str, list[str]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            running = running_trainers(self.jobs)
            for node in self.nodes:
                found = running.get(f"{self.sim.hosts.instance}/{self.key(self.sim, node)}/0", [])
                if len(found) > 1:
                    self.seen.append((node, [f"{e['TPUWATCH_JOB']}#{e['TPUWATCH_ATTEMPT']}" for e in found]))
            self.samples += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
