#!/usr/bin/env python3
"""What tpuwatch costs while nothing goes wrong: start-up time, memory, CPU and cloud API calls.

    python scripts/bench_overhead.py                 # the default measurements, a table
    python scripts/bench_overhead.py --json
    python scripts/bench_overhead.py --runs 5 --ticks 10 --virtual-ticks 40 --nodes 50
    python scripts/bench_overhead.py --pods-only --pod-sizes 4,32,128,256

Measured, against the simulator (tpuwatch.sim.Simulator) with a steady job (the toy trainer on
every worker, started by `tpuwatch watch` itself):
1. start-up: `tpuwatch --help` and `tpuwatch check -c ...` as cold processes, median of --runs;
   for check also the time from spawn to its first API call (imports, config, clients);
2. the watcher while idle: `tpuwatch watch` with poll_interval --poll (scaled down from the
   default 30 s so that --ticks polls take seconds): VmRSS and VmHWM from /proc/<pid>/status,
   CPU seconds per poll from /proc/<pid>/stat (its own and its reaped ssh children's), then
   extrapolated to 10 minutes at the default 30 s poll (20 polls; the sleep between costs none);
3. API calls per hour for one node at the default poll: the loop of `watch` (loop.run_job)
   with the real adapters, SSH and simulator, --virtual-ticks ticks on a clock that advances 30 s
   between ticks (so the audit-log cadence, once per 60 s unless something looks wrong, is the real one);
   counted with the simulator's call counters (sim.world.calls);
4. 200 nodes in one zone: `status --all` (calls and time per run), and --watchers `watch`
   processes of separate jobs in that zone at the scaled poll: TPU calls per tick per job, so the
   hourly TPU cost of watching N jobs is N times one job's; and their audit-log queries
   (ListLogEntries) per minute, which they share through one state dir (one query per project per
   15 s at most; --separate-state-dirs gives each its own, as before sharing). The tick reads the
   audit log once a minute of wall time, so --watch-seconds of 60 or more shows the steady rate;
5. pods of --pod-sizes workers (4, 32, 128, 256: v5p-32 to v5p-2048), each running a job that
   costs nothing (`exec sleep`), watched by the loop of `watch` (loop.run_job: tick, then
   Pacer.wait, which holds one follow channel per worker) in a process of its own, with a view
   that prints a line per tick: per steady tick its wall time, SSH handshakes and channels
   (counted by the simulated workers), probes answered on a follow channel instead of over a
   channel of their own, CPU (the watcher, its reaped ssh clients, and its live master
   connections and follow channels) and TPU calls; then a maintenance that heals, and the time from the node READY again to the relaunch
   and to a probe finding every worker running. `--pods-only` runs just this part.
   With `--hosts-apart` the simulated hosts are kept off the watcher's core, as on a real pod
   (where each host is a VM of its own): the watcher and its ssh clients pinned to one core, this
   process (the simulator, its SSH servers and every shell the simulated workers run) to the
   others at nice --hosts-nice. The heal's figures then show the watcher's own cost, not the
   2-core box's.

    python scripts/bench_overhead.py --pods-only --pod-sizes 4,32,128,256 --hosts-apart

With --jobs 1,10,50,100 it measures only many jobs in one watcher instead: for each count, a
fresh simulator with that many nodes in one zone (v4-8: one worker each, the lightest the
simulator serves, with `sleep` as the job so that 100 jobs fit the box), one `tpuwatch watch
--config-dir` over their configs at poll_interval --jobs-poll, counted for --jobs-seconds once
every job runs: TPU API calls per poll by method (target: one ListNodes per zone per poll, no
GetNode), audit-log queries per minute (target: as for one job, 4 at most), the watcher's
VmRSS/VmHWM (target: under 150 MB at 100 jobs) and its CPU seconds per poll.

    python scripts/bench_overhead.py --jobs 1,10,50,100 --jobs-poll 5 --jobs-seconds 60

With --api compute it measures the same for slices made through Compute Engine, with the real
google-cloud-compute client against the simulator's Compute Engine face (as `tpuwatch sim`
serves it): the API calls per hour of one job at the default poll (--virtual-ticks ticks of the
loop of `watch`, 30 s apart in virtual time, as in 3.) for an instance and for a MIG of
--mig-size VMs, each running the toy trainer launched by `tpuwatch watch` first; and with
--jobs, N instance jobs (one VM each, `sleep` as the job) in one zone under one `tpuwatch watch
--config-dir`: Compute Engine requests per poll by method (target: one instances list per zone
per poll, no get), audit-log queries, RSS and CPU as for the TPU API; --compute-slice mig makes
each job's slice a MIG of one VM (target: one instances list and one MIG list per zone per poll,
and listManagedInstances, which Compute Engine answers only per MIG, one per job).

    python scripts/bench_overhead.py --api compute
    python scripts/bench_overhead.py --api compute --jobs 1,10,50 --jobs-poll 10 --jobs-seconds 60
    python scripts/bench_overhead.py --api compute --jobs 10 --compute-slice mig --jobs-poll 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_recovery import JOB, write_config, write_toml  # noqa: E402

from tpuwatch.sim.simulator import Simulator  # noqa: E402

DEFAULT_POLL = 30.0  # the shipped recovery.poll_interval
CLK_TCK = os.sysconf("SC_CLK_TCK")
TPU_CALL = re.compile(r"google\.cloud\.tpu\.|google\.longrunning\.")
COMPUTE_CALL = re.compile(r"^compute\.")
AUDIT_CALL = "ListLogEntries"
SHARED_AUDIT_PER_HOUR = 3600 / 15  # SharedAuditLog: one query per project per max_age (15 s) while all is quiet


def tpuwatch_argv() -> list[str]:
    """The console script users run, else the module."""
    script = Path(sys.executable).parent / "tpuwatch"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tpuwatch.cli"]


def timed(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], list[subprocess.CompletedProcess[str]]]:
    times, outs = [], []
    for _ in range(runs):
        t = time.perf_counter()
        out = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        times.append(time.perf_counter() - t)
        outs.append(out)
    return times, outs


def slowest_imports(argv_tail: list[str], env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The heaviest top-level imports of a cold `tpuwatch ...` (python -X importtime)."""
    code = f"import sys; sys.argv = ['tpuwatch', *{argv_tail!r}]\nfrom tpuwatch.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True)
    rows = []
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+\s+\|\s+(\d+)\s+\|( *)(\S+)", line)
        if m and len(m.group(2)) <= 2:  # top level (and one below, for packages)
            rows.append((m.group(3), int(m.group(1)) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, reaped children's CPU seconds) of `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def proc_mem(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of `pid`, in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


class Watch:
    """A `tpuwatch watch --json` subprocess whose lines are collected by a thread."""

    def __init__(self, cfg: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([*tpuwatch_argv(), "watch", "-c", str(cfg), "--json"], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def wait_running(self, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(ln.get("row") == "running" for ln in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("watch did not reach a steady running job; its output ends:\n" + "".join(self.raw[-6:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # leaves the job running, like Ctrl-C
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.a = args
        self.tmp = tmp
        self.sim = Simulator(root=tmp / "sim", speed=600, seed=args.seed)
        self.sim.start()
        self.ck = self.sim.bucket / "ck"

    def close(self) -> None:
        self.sim.close()

    def job(self, name: str, accelerator: str, poll: float) -> tuple[Path, dict[str, str]]:
        """A config and environment for a steady job of the toy trainer on node `name`."""
        if not self.sim.world.has_node(name):
            self.sim.create_node(name, accelerator, labels={"tpuwatch-job": name})
        ck = self.sim.bucket / f"ck-{name}"
        command = (f"python3 -m tpuwatch.sim.trainer --steps 100000000 --step-time 0.1 --ckpt-every 50 "
                   f"--ckpt-dir {ck} --resume {{checkpoint}}")
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = write_config(d / "tpuwatch.toml", self.sim, command, ck, accelerator=accelerator, spot=False,
                           recovery={"poll_interval": f"{poll:g}s"}, extra=tuple(self.a.config))
        text = cfg.read_text().replace(f'name = "{JOB}"', f'name = "{name}"', 1)
        cfg.write_text(text)
        env = {**os.environ, **self.sim.env, "TPUWATCH_STATE_DIR": str(d / "state")}
        return cfg, env

    def calls(self) -> Counter[str]:
        with self.sim.world._lock:
            return Counter(self.sim.world.calls)

    def first_call_after(self, t0: float) -> float | None:
        """Monotonic time of the first API call after `t0` (the simulator keeps call times)."""
        with self.sim.world._lock:
            times = [t for q in self.sim.world._call_times.values() for t, _ in q if t > t0]
        return min(times) if times else None


def split(calls: Counter[str]) -> dict[str, int]:
    """Calls of the slice's API (the TPU API, or Compute Engine), audit-log reads, the rest."""
    tpu = sum(n for m, n in calls.items() if TPU_CALL.search(m) or COMPUTE_CALL.search(m))
    audit = sum(n for m, n in calls.items() if m.endswith(AUDIT_CALL))
    return {"tpu": tpu, "audit": audit, "other": sum(calls.values()) - tpu - audit}


def delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({m: n - before.get(m, 0) for m, n in after.items() if n - before.get(m, 0)})


def measure(a: argparse.Namespace, log: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {k: v for k, v in vars(a).items() if k not in ("json", "json_out", "quiet")}}
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TPUWATCH_")}
    if a.pods_only:
        if a.hosts_apart:  # before the simulator starts its threads, which inherit it
            a.placement = out["placement"] = hosts_apart(a.hosts_nice)
            log(f"hosts apart: {a.placement}")
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmpd:
            b = Bench(a, Path(tmpd))
            try:
                out["pods"] = [{**p, "placement": out.get("placement")} for p in pods(b, a, log)]
            finally:
                b.close()
        return out

    log("start-up: tpuwatch --help")
    times, outs = timed([*tpuwatch_argv(), "--help"], base_env, a.runs)
    assert all(o.returncode == 0 for o in outs), outs[-1].stderr
    out["help"] = {"median": statistics.median(times), "min": min(times), "max": max(times), "runs": len(times),
                   "slowest_imports": slowest_imports(["--help"], base_env)}

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmpd:
        b = Bench(a, Path(tmpd))
        try:
            cfg, env = b.job(JOB, a.accelerator, a.poll)

            log(f"idle watcher: watch with poll {a.poll:g}s, {a.ticks} polls")
            w = Watch(cfg, env)
            w.wait_running()
            time.sleep(a.poll * 2)  # settle: the launch tick and the first audit read are behind it
            c0, t0, n0 = b.calls(), time.monotonic(), len(w.lines)
            cpu0 = proc_cpu(w.proc.pid)
            mem0 = proc_mem(w.proc.pid)
            gets0 = c0.get("google.cloud.tpu.v2.Tpu/GetNode", 0) + c0.get("google.cloud.tpu.v2alpha1.Tpu/GetNode", 0)
            samples = [mem0["VmRSS"]]
            while True:
                c = b.calls()
                gets = c.get("google.cloud.tpu.v2.Tpu/GetNode", 0) + c.get("google.cloud.tpu.v2alpha1.Tpu/GetNode", 0)
                if gets - gets0 >= a.ticks:
                    break
                if w.proc.poll() is not None:
                    raise RuntimeError("watch exited:\n" + "".join(w.raw[-6:]))
                samples.append(proc_mem(w.proc.pid)["VmRSS"])
                time.sleep(min(a.poll / 4, 0.25))
            c1, t1 = b.calls(), time.monotonic()
            cpu1 = proc_cpu(w.proc.pid)
            mem1 = proc_mem(w.proc.pid)
            ticks = gets - gets0
            # watch prints a line only when something changes: none while the job stays steady
            rows = [ln.get("row") for ln in w.lines[n0:]]
            w.stop()
            own = (cpu1[0] - cpu0[0]) / ticks
            kids = (cpu1[1] - cpu0[1]) / ticks
            d = delta(c1, c0)
            polls_10min = 600 / DEFAULT_POLL
            out["idle"] = {
                "poll": a.poll, "ticks": ticks, "seconds": t1 - t0,
                "rss_mb": mem1["VmRSS"], "rss_start_mb": mem0["VmRSS"], "rss_max_mb": max(samples + [mem1["VmRSS"]]),
                "hwm_mb": mem1["VmHWM"],
                "cpu_per_poll": own, "ssh_cpu_per_poll": kids,
                "cpu_10min_default": own * polls_10min, "ssh_cpu_10min_default": kids * polls_10min,
                "core_share_default": (own + kids) / DEFAULT_POLL,
                "calls_per_tick": {m.rsplit("/", 1)[-1]: n / ticks for m, n in sorted(d.items())},
                "rows": sorted(set(r for r in rows if r)),
            }

            log(f"start-up: tpuwatch check, {a.runs} runs")
            check_times, first_call = [], []
            for _ in range(a.runs):
                t = time.monotonic()
                r = subprocess.run([*tpuwatch_argv(), "check", "-c", str(cfg)], env=env, capture_output=True,
                                   text=True, stdin=subprocess.DEVNULL, timeout=120)
                check_times.append(time.monotonic() - t)
                if r.returncode != 0:
                    raise RuntimeError(f"check exited {r.returncode}: {r.stdout}{r.stderr}")
                fc = b.first_call_after(t)
                if fc is not None:
                    first_call.append(fc - t)
            out["check"] = {"median": statistics.median(check_times), "min": min(check_times),
                            "max": max(check_times), "runs": len(check_times),
                            "to_first_api_call": statistics.median(first_call) if first_call else None,
                            "slowest_imports": slowest_imports(["check", "--help"], base_env)}

            log(f"API per hour, one node: {a.virtual_ticks} ticks of the real Reconciler, 30 s apart in virtual time")
            out["one_node"] = virtual_hour(b, cfg, env, a.virtual_ticks)

            log(f"{a.nodes} nodes in one zone: status --all, and {a.watchers} watchers")
            out["zone"] = zone(b, a)
            out["pods"] = pods(b, a, log)
        finally:
            b.close()
    return out


class Unseen:
    """The view of a loop nobody watches (loop.View)."""

    ticks = 0

    def show(self, report: object, next_at: object) -> None:
        self.ticks += 1

    def warn(self, text: str) -> None:
        pass


def virtual_hour(b: Bench, cfg: Path, env: dict[str, str], ticks: int) -> dict[str, Any]:
    """The loop of `watch` (loop.run_job) on a clock that advances DEFAULT_POLL between ticks."""
    from tpuwatch.cloud.auditcache import SharedAuditLog
    from tpuwatch.journal import Journal
    from tpuwatch.loop import run_job
    from tpuwatch.ports import Flags
    from tpuwatch.tick import TickReport
    from tpuwatch.wiring import load_job, real_ports

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("TPUWATCH_", "CLOUDSDK_"))})
    try:
        job = load_job(cfg)
        clock = [datetime.now(timezone.utc)]
        # The shared audit cache's age on the same virtual clock: one watcher's reads 60 s apart
        # are each a query, as in real time (with a wall clock it would answer them from cache).
        audit = SharedAuditLog(job.location.project, job.cfg.state_dir, zone=job.location.zone,
                               now=lambda: clock[0])
        ports = replace(real_ports(job), now=lambda: clock[0], audit=audit)
        rows: Counter[str] = Counter()

        def count(report: TickReport) -> None:
            rows[report.decision.row] += 1

        def advance(report: TickReport, delay: float) -> None:  # the wait between ticks, in virtual time
            clock[0] += timedelta(seconds=DEFAULT_POLL)

        with Journal.open(job.cfg.state_dir, job.name, job.pcfg.tpu_name) as journal:
            c0 = b.calls()
            t = time.monotonic()
            run_job(job.cfg, job.pcfg, ports, journal, Flags(), Unseen(), after_tick=count, wait=advance,
                    stop=lambda report: sum(rows.values()) >= ticks)
            seconds = time.monotonic() - t
            d = delta(b.calls(), c0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    per_hour = 3600 / (ticks * DEFAULT_POLL)
    s = split(d)
    return {"ticks": ticks, "virtual_hours": ticks * DEFAULT_POLL / 3600, "real_seconds": seconds,
            "rows": dict(rows), "calls": {m.rsplit("/", 1)[-1]: n for m, n in sorted(d.items())},
            "methods": dict(sorted(d.items())),
            "tpu_per_hour": s["tpu"] * per_hour, "audit_per_hour": s["audit"] * per_hour,
            "other_per_hour": s["other"] * per_hour}


# ---- Compute Engine (--api compute) ----------------------------------------------------------
MIG_SIZE = 4  # the MIG measured: a TPU7x-shaped multi-host slice of 4 VMs
MIG_TOPOLOGY = "2x2x4"  # its workload policy's accelerator topology (4 VMs of 4 chips)


def compute_config(path: Path, sim: Simulator, kind: str, name: str, command: str, poll: float,
                   ck: Path | None = None) -> Path:
    """A tpuwatch.toml for the simulator's Compute Engine instance or MIG `name`."""
    job: dict[str, object] = {"name": name, "command": command}
    if ck is not None:
        job["checkpoint_dir"] = str(ck)
    sections: dict[str, dict[str, object]] = {
        "tpu": {"api": "compute", kind: name},
        "job": job,
        "recovery": {"poll_interval": f"{poll:g}s"},
        "ssh": {"user": sim.ssh_user or "", "identity_file": str(sim.ssh_key), "port": sim.ssh_port or 22,
                "internal_ip": True},
        # The simulator names each VM in its own hosts file only, so a MIG's peers do not resolve
        # there (Compute Engine's internal DNS resolves them).
        "precheck": {"skip": ["dns"]},
    }
    return write_toml(path, sections)


def compute_calls(calls: Counter[str]) -> dict[str, int]:
    """Compute Engine calls by method, as the simulator names them ("Instances/List")."""
    return {m.removeprefix("compute.v1."): n for m, n in sorted(calls.items()) if COMPUTE_CALL.search(m)}


def compute_hours(a: argparse.Namespace, log: Any) -> dict[str, Any]:
    """API calls per hour of one Compute Engine job at the default poll: an instance, and a MIG
    of MIG_SIZE VMs, each running the toy trainer launched by `tpuwatch watch`."""
    from tpuwatch.sim.rest import RestFace

    out: dict[str, Any] = {"settings": {k: v for k, v in vars(a).items() if k not in ("json", "json_out", "quiet")}}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-compute-") as tmpd:
        b = Bench(a, Path(tmpd))
        face = RestFace(b.sim.world).start()
        try:
            for kind, name in (("instance", "vm"), ("mig", "slice")):
                if kind == "instance":
                    b.sim.world.add_instance(name, body={"labels": {"tpuwatch-job": name}})
                else:
                    b.sim.world.add_mig(name, size=MIG_SIZE, topology=MIG_TOPOLOGY, labels={"tpuwatch-job": name})
                ck = b.sim.bucket / f"ck-{name}"
                command = (f"python3 -m tpuwatch.sim.trainer --steps 100000000 --step-time 0.1 --ckpt-every 50 "
                           f"--ckpt-dir {ck} --resume {{checkpoint}}")
                d = b.tmp / name
                d.mkdir()
                cfg = compute_config(d / "tpuwatch.toml", b.sim, kind, name, command, a.poll, ck)
                env = {**os.environ, **b.sim.env, "TPUWATCH_STATE_DIR": str(d / "state"),
                       "TPUWATCH_COMPUTE_EMULATOR": face.url.rstrip("/")}
                log(f"compute {kind}: watch launches the job")
                w = Watch(cfg, env)
                try:
                    w.wait_running()
                finally:
                    w.stop()  # leaves the job running, like Ctrl-C
                log(f"compute {kind}: {a.virtual_ticks} ticks of the real Reconciler, 30 s apart in virtual time")
                hour = virtual_hour(b, cfg, env, a.virtual_ticks)
                hour["compute_calls"] = compute_calls(Counter(hour["methods"]))
                out[kind] = hour
        finally:
            face.close()
            b.close()
    return out


def render_compute_hours(r: dict[str, Any]) -> str:
    lines = ["API calls per hour of one Compute Engine job at the 30 s poll (simulator, steady job)", ""]
    for kind, label in (("instance", "instance"), ("mig", f"MIG of {MIG_SIZE} VMs")):
        h = r[kind]
        lines.append(f"{label:<16} Compute Engine {h['tpu_per_hour']:.0f}/h, audit-log reads {h['audit_per_hour']:.0f}/h, "
                     f"other {h['other_per_hour']:.0f}/h   [{h['ticks']} ticks, rows {h['rows']}]")
        lines.append(f"{'':<16} by method: {h['compute_calls']}")
    return "\n".join(lines)


def zone(b: Bench, a: argparse.Namespace) -> dict[str, Any]:
    sim = b.sim
    have = len(sim.world.list_nodes(sim.project, sim.zone))
    for i in range(have, a.nodes):
        sim.create_node(f"node-{i:03d}", "v4-8")
    n = len(sim.world.list_nodes(sim.project, sim.zone))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TPUWATCH_")}, **sim.env}
    times, per_run = [], []
    for _ in range(a.runs):
        c0 = b.calls()
        t = time.perf_counter()
        r = subprocess.run([*tpuwatch_argv(), "status", "--all", "--json"], env=env, capture_output=True, text=True,
                           timeout=120)
        times.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise RuntimeError(f"status --all exited {r.returncode}: {r.stderr}")
        shown = len(json.loads(r.stdout)["nodes"])
        per_run.append(delta(b.calls(), c0))
    calls = per_run[-1]
    status = {"nodes": n, "shown": shown, "median_seconds": statistics.median(times),
              "calls_per_run": {m.rsplit("/", 1)[-1]: k for m, k in sorted(calls.items())},
              "per_hour_every_poll": sum(calls.values()) * 3600 / DEFAULT_POLL}

    watchers = []
    shared_state = b.tmp / "watchers-state"  # one user's state dir, as on one machine by default
    c_start, t_start = b.calls(), time.monotonic()
    for i in range(a.watchers):
        name = f"job-{i}"
        cfg, env_i = b.job(name, "v4-8", a.poll)
        if not a.separate_state_dirs:
            env_i["TPUWATCH_STATE_DIR"] = str(shared_state)
        watchers.append(Watch(cfg, env_i))
    try:
        for w in watchers:
            w.wait_running()
        time.sleep(a.poll * 2)
        c0, t0 = b.calls(), time.monotonic()
        time.sleep(a.watch_seconds)
        c1, t1 = b.calls(), time.monotonic()
        d, seconds = delta(c1, c0), t1 - t0
        d_all, seconds_all = delta(c1, c_start), t1 - t_start
    finally:
        for w in watchers:
            w.stop()
    s = split(d)
    audit_all = split(d_all)["audit"]
    ticks = sum(n for m, n in d.items() if m.endswith("/GetNode"))
    tpu_per_tick = s["tpu"] / max(ticks, 1)
    return {
        "status_all": status,
        "watchers": {"jobs": a.watchers, "seconds": seconds, "ticks": ticks,
                     "calls": {m.rsplit("/", 1)[-1]: k for m, k in sorted(d.items())},
                     "tpu_calls_per_tick": tpu_per_tick,
                     "tpu_per_hour_per_job_default": tpu_per_tick * 3600 / DEFAULT_POLL,
                     "state_dirs": "separate" if a.separate_state_dirs else "shared",
                     "audit_calls": s["audit"], "audit_per_minute": s["audit"] * 60 / seconds,
                     "audit_calls_since_start": audit_all, "seconds_since_start": seconds_all,
                     "audit_per_minute_since_start": audit_all * 60 / seconds_all},
    }


# ---- pods: the cost of a tick as the node grows ------------------------------------------------

POD_COMMAND = "exec sleep 100000000"  # every worker runs something that costs nothing while it runs


def pod_driver(cfg: str, cpus: list[int] | None = None, nice: int | None = None) -> int:
    """The loop of `watch` (loop.run_job: tick, then Pacer.wait, which holds the follow channels)
    with a view that prints one JSON line per tick on stdout: its wall time, this process's CPU
    so far (own and reaped ssh clients), the attempt and how many workers the probe found
    running. Ends on SIGTERM, closing the follow channels and shared connections as `watch` does."""
    import resource

    from tpuwatch.journal import Journal
    from tpuwatch.loop import run_job
    from tpuwatch.ports import Flags
    from tpuwatch.tick import TickReport
    from tpuwatch.wiring import load_job, real_ports
    from tpuwatch.workers.sshworkers import SshWorkers

    stop, woken = threading.Event(), threading.Event()

    def on_term(*_: object) -> None:  # ends the loop after a tick, and a follow wait at once
        stop.set()
        woken.set()

    signal.signal(signal.SIGTERM, on_term)
    if cpus:  # before any thread or ssh client starts: they inherit it
        os.sched_setaffinity(0, cpus)
        if nice is not None:
            with contextlib.suppress(PermissionError):  # lowering nice needs CAP_SYS_NICE; the lines say
                os.setpriority(os.PRIO_PROCESS, 0, nice)
    job = load_job(cfg)
    ports = real_ports(job)
    workers = ports.workers
    assert isinstance(workers, SshWorkers)
    ends = workers.ends
    walls: list[float] = []

    @contextlib.contextmanager
    def timed_tick() -> Any:
        t = time.monotonic()
        try:
            yield
        finally:
            walls.append(time.monotonic() - t)

    class Lines:
        """The view: a JSON line per tick."""

        ticks = 0

        def show(self, report: TickReport, next_at: object) -> None:
            self.ticks += 1
            me = resource.getrusage(resource.RUSAGE_SELF)
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            running = sum(1 for p in report.probes or () if p.state == "running")
            print(json.dumps({"t": time.time(), "wall": walls[-1], "row": report.decision.row,
                              "attempt": report.memory.attempt.number, "running": running,
                              "on_channel": ends.answered,
                              "own": me.ru_utime + me.ru_stime, "kids": kids.ru_utime + kids.ru_stime,
                              "cpus": sorted(os.sched_getaffinity(0)),
                              "nice": os.getpriority(os.PRIO_PROCESS, 0)}),
                  flush=True)

        def warn(self, text: str) -> None:
            print(text, file=sys.stderr, flush=True)

    with Journal.open(job.cfg.state_dir, job.name, job.pcfg.tpu_name) as journal:
        run_job(job.cfg, job.pcfg, ports, journal, Flags(), Lines(), stopping=stop, woken=woken, slot=timed_tick)
    return 0


def ssh_cpu(marker: str) -> float:
    """CPU seconds of the live ssh processes whose command line holds `marker` (the watcher's
    control socket directory): the detached master connections and the follow channels."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker.encode() not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            total += sum(proc_cpu(int(entry)))
        except (OSError, IndexError, ValueError):
            continue
    return total


def hosts_apart(nice: int) -> dict[str, Any]:
    """Keep the simulated hosts off the watcher's core: every thread of this process (the
    simulator's, and the shells it starts inherit it) to every core but the first, at `nice`.
    Returns the placement; the watcher goes to the first core (`PodDriver`, watcher_cpus)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--hosts-apart needs at least two cores: one for the watcher, one for the hosts")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    hosts = set(cpus[1:])
    for tid in os.listdir("/proc/self/task"):  # affinity and nice are per thread on Linux
        os.sched_setaffinity(int(tid), hosts)
        os.setpriority(os.PRIO_PROCESS, int(tid), base + nice)
    return {"watcher_cpus": cpus[:1], "hosts_cpus": sorted(hosts), "watcher_nice": base, "hosts_nice": base + nice}


class PodDriver:
    """A pod_driver subprocess and its lines, read by a thread. With `place` (hosts_apart's),
    it runs on the watcher's core at the nice this script started with."""

    def __init__(self, cfg: Path, env: dict[str, str], place: dict[str, Any] | None = None) -> None:
        where = [] if place is None else ["--watcher-cpus", ",".join(map(str, place["watcher_cpus"])),
                                          "--watcher-nice", str(place["watcher_nice"])]
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--pod-driver", str(cfg), *where],
                                     env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self.lines: list[dict[str, Any]] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def until(self, pred: Any, timeout: float, what: str) -> int:
        """Index of the first line from now on that satisfies `pred`."""
        start = len(self.lines)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i in range(start, len(self.lines)):
                if pred(self.lines[i]):
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"pod driver: no tick {what} within {timeout:.0f}s; last lines "
                           f"{self.lines[-3:]}; stderr: {''.join(self.err[-8:])}")

    def at(self, i: int, timeout: float) -> int:
        """Wait for line `i`."""
        end = time.monotonic() + timeout
        while len(self.lines) <= i:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"pod driver: no tick {i} within {timeout:.0f}s; stderr: {''.join(self.err[-8:])}")
            time.sleep(0.02)
        return i

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def pod(b: Bench, a: argparse.Namespace, n: int) -> dict[str, Any]:
    """One node of `n` workers (v5p-<8n>): a steady job on every worker, watched by pod_driver."""
    from tpuwatch.workers import mux

    sim, name = b.sim, f"pod{n}"
    accel = f"v5p-{8 * n}"
    t = time.monotonic()
    sim.create_node(name, accel, labels={"tpuwatch-job": name})
    boot = time.monotonic() - t
    d = b.tmp / name
    d.mkdir(parents=True, exist_ok=True)
    # The launch-time environment checks are off unless --config precheck.enabled=true: they add
    # work on every worker (its disk, devices, device holders, interpreter), all on this machine
    # here, and the heal's figures are kept comparable without them.
    cfg = write_config(d / "tpuwatch.toml", sim, POD_COMMAND, sim.bucket / f"ck-{name}", accelerator=accel, spot=False,
                       recovery={"poll_interval": f"{a.pod_poll:g}s", "hang_timeout": "0s"},
                       extra=("precheck.enabled=false", *a.config))
    cfg.write_text(cfg.read_text().replace(f'name = "{JOB}"', f'name = "{name}"', 1))
    state = d / "state"
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(state)}
    marker = str(mux.short_dir(state / "ssh"))
    key = sim.node_key(name)

    def counters() -> tuple[int, int]:
        hosts = sim.hosts
        return (sum(hosts.accepted(key, w) for w in range(n)), sum(hosts.sessions(key, w) for w in range(n)))

    load = os.getloadavg()
    drv = PodDriver(cfg, env, getattr(a, "placement", None))
    try:
        first = drv.until(lambda ln: ln["running"] == n, 600, f"with all {n} workers running")
        launched = drv.lines[first]["t"]
        # steady: counted from the end of one tick to the end of the tick --pod-ticks later
        i0 = drv.until(lambda ln: ln["running"] == n, 120, "steady")
        c0, s0, x0 = counters(), b.calls(), ssh_cpu(marker)
        i1 = drv.at(i0 + a.pod_ticks, 60 + 30 * a.pod_ticks)
        c1, s1, x1 = counters(), b.calls(), ssh_cpu(marker)
        lo, hi = drv.lines[i0], drv.lines[i1]
        ticks = i1 - i0
        walls = [ln["wall"] for ln in drv.lines[i0 + 1:i1 + 1]]
        own, kids, live = hi["own"] - lo["own"], hi["kids"] - lo["kids"], max(x1 - x0, 0.0)
        api = split(delta(s1, s0))
        rows = sorted({ln["row"] for ln in drv.lines[i0 + 1:i1 + 1]})
        # heal: a maintenance that heals; from the node READY again to every worker running
        attempt = hi["attempt"]
        hosts0, cg0 = proc_cpu(os.getpid()), sim.hosts.cgroups_cpu()
        sim.world.maintenance(name, heal_after=a.pod_heal_after)
        down_seen = False
        t_heal = None
        end = time.monotonic() + 600
        while time.monotonic() < end:
            st = sim.world.get_node(sim.project, sim.zone, name).state
            if st != "READY":
                down_seen = True
            elif down_seen:
                t_heal = time.time()
                ready0, ready_cg = proc_cpu(os.getpid()), sim.hosts.cgroups_cpu()
                break
            time.sleep(0.01)
        if t_heal is None:
            raise RuntimeError(f"{name} did not heal")
        relaunch = drv.until(lambda ln: ln["attempt"] > attempt, 600, "relaunching")
        back = drv.until(lambda ln: ln["attempt"] > attempt and ln["running"] == n, 600, "with all running again")
        # CPU from the maintenance to every worker running again, on each side: the watcher (its
        # process, its reaped ssh clients, and its master connections and follow channels, all
        # opened since the heal) and the simulated hosts: this process (their SSH and metadata
        # servers, and the simulator's API) and every process in the workers' cgroups, the
        # detached jobs and relays and the sessions still open too. Without cgroup v2, the
        # shells this process reaped instead: those of the attempt the maintenance ended, whole
        # lives long, and not the new attempt's (the old measure, kept for comparison).
        hosts1, cg1 = proc_cpu(os.getpid()), sim.hosts.cgroups_cpu()
        reaped_way = sum(hosts1) - sum(hosts0)
        if cg0 is not None and cg1 is not None and ready_cg is not None:
            hosts_cpu, ready_cpu = hosts1[0] - hosts0[0] + cg1 - cg0, hosts1[0] - ready0[0] + cg1 - ready_cg
        else:
            hosts_cpu, ready_cpu = reaped_way, sum(hosts1) - sum(ready0)
        procs: dict[str, list[float]] = {}  # the workers' live processes by name: [count, CPU seconds]
        for pid in sim.hosts.cgroup_pids() or []:
            with contextlib.suppress(OSError, ValueError, IndexError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                ns = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])  # ns on a CPU, finer than stat's ticks
                entry = procs.setdefault(comm, [0, 0.0])
                entry[0] += 1
                entry[1] = round(entry[1] + ns / 1e9, 3)
        lb = drv.lines[back]
        live_ssh = ssh_cpu(marker)
        watcher_cpu = lb["own"] + lb["kids"] - hi["own"] - hi["kids"] + live_ssh
        out = {
            "workers": n, "accelerator": accel, "boot_seconds": boot, "first_all_running_after": launched - drv.lines[0]["t"],
            "ticks": ticks, "rows": rows,
            "tick_wall_median": statistics.median(walls), "tick_wall_max": max(walls),
            "handshakes_per_tick": (c1[0] - c0[0]) / ticks, "channels_per_tick": (c1[1] - c0[1]) / ticks,
            "probes_on_channels_per_tick": (hi["on_channel"] - lo["on_channel"]) / ticks,
            "cpu_per_tick": (own + kids + live) / ticks,
            "cpu_own_per_tick": own / ticks, "cpu_ssh_per_tick": (kids + live) / ticks,
            "cpu_per_worker_per_tick": (own + kids + live) / ticks / n,
            "tpu_calls_per_tick": api["tpu"] / ticks, "audit_calls_per_tick": api["audit"] / ticks,
            "heal_to_relaunch": drv.lines[relaunch]["t"] - t_heal,
            "heal_to_all_running": drv.lines[back]["t"] - t_heal,
            "heal_cpu_watcher": watcher_cpu, "heal_cpu_hosts": hosts_cpu,
            "heal_cpu_hosts_how": "cgroups" if cg1 is not None else "reaped",
            "heal_cpu_hosts_sim": hosts1[0] - hosts0[0],  # this process: SSH and metadata servers, the API
            "heal_cpu_hosts_reaped_way": reaped_way,
            # from the node READY on (the maintenance's own work on the hosts left out)
            "ready_cpu_hosts": ready_cpu, "ready_cpu_hosts_sim": hosts1[0] - ready0[0],
            "heal_live_processes": procs,
            "heal_cpu_watcher_own": lb["own"] - hi["own"], "heal_cpu_watcher_ssh": lb["kids"] - hi["kids"] + live_ssh,
            "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()],
            # where the watcher ran (hosts apart: its own core at the script's nice)
            "watcher_cpus": lb.get("cpus"), "watcher_nice": lb.get("nice"),
            # the ticks from the heal on: (seconds after the heal at the tick's end, row, tick wall time)
            "heal_ticks": [(round(ln["t"] - t_heal, 2), ln["row"], round(ln["wall"], 2))
                           for ln in drv.lines[i1 + 1:back + 1] if ln["t"] >= t_heal - 5],
        }
    finally:
        drv.stop()
        sim.world.delete_node(sim.project, sim.zone, name)
        end = time.monotonic() + 120
        while sim.world.has_node(name) and time.monotonic() < end:  # its processes gone before the next size
            time.sleep(0.05)
    return out


def pods(b: Bench, a: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    out = []
    for n in a.pod_sizes:
        for run in range(a.pod_repeat):
            log(f"pod of {n} workers (run {run + 1} of {a.pod_repeat}, load {os.getloadavg()[0]:.1f}): "
                f"{a.pod_ticks} steady ticks at poll {a.pod_poll:g}s, then a heal")
            out.append({**pod(b, a, n), "run": run + 1})
    return out


def render_pods(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["", "pods: one steady job on every worker (ssh.multiplex on, follow channels held)",
             f"{'workers':>7} {'tick wall':>10} {'(max)':>7} {'handshakes':>10} {'channels':>8} {'on chan.':>8} {'CPU/tick':>9} "
             f"{'(ssh)':>7} {'CPU/worker':>10} {'TPU calls':>9} {'heal->relaunch':>14} {'heal->all running':>17}"]
    for p in rows:
        lines.append(
            f"{p['workers']:>7} {p['tick_wall_median']:>9.2f}s {p['tick_wall_max']:>6.2f}s {p['handshakes_per_tick']:>10.2f} "
            f"{p['channels_per_tick']:>8.1f} {p.get('probes_on_channels_per_tick', 0):>8.1f} {p['cpu_per_tick'] * 1000:>7.0f}ms {p['cpu_ssh_per_tick'] * 1000:>5.0f}ms "
            f"{p['cpu_per_worker_per_tick'] * 1000:>8.2f}ms {p['tpu_calls_per_tick']:>9.2f} {p['heal_to_relaunch']:>13.2f}s "
            f"{p['heal_to_all_running']:>16.2f}s")
    lines.append("(per tick, medians of the steady ticks; on chan. = probes answered on a follow channel; "
                 "CPU = the watcher, its ssh clients and its master connections)")
    lines.append("CPU from the maintenance to all running: " + ", ".join(
        f"{p['workers']} workers: watcher {p['heal_cpu_watcher']:.1f}s, simulated hosts {p['heal_cpu_hosts']:.1f}s"
        + (f" (from READY {p['ready_cpu_hosts']:.1f}s, of which the simulator's process {p['ready_cpu_hosts_sim']:.1f}s)"
           if "ready_cpu_hosts" in p else "")
        for p in rows if "heal_cpu_watcher" in p))
    if any(p.get("heal_cpu_hosts_how") == "reaped" for p in rows):
        lines.append("(no cgroup v2 here: the hosts' CPU is the shells the simulator reaped, the attempt the "
                     "maintenance ended, not the new one's)")
    lines.append("load average (1 min) before each: " + ", ".join(
        f"{p['workers']}: {p['load_before'][0]:.1f}" for p in rows if "load_before" in p))
    if rows[0].get("placement"):
        pl = rows[0]["placement"]
        lines.append(f"hosts apart: watcher on CPU {pl['watcher_cpus']} (nice {rows[0]['watcher_nice']}), "
                     f"simulated hosts on CPU {pl['hosts_cpus']} (nice {pl['hosts_nice']})")
    return lines


def render(r: dict[str, Any]) -> str:
    if "help" not in r:  # --pods-only
        return "\n".join(render_pods(r["pods"])[1:])
    h, c, idle, one, z = r["help"], r["check"], r["idle"], r["one_node"], r["zone"]
    st, wt = z["status_all"], z["watchers"]
    jobs = st["nodes"]
    shared_audit = min(one["audit_per_hour"] * jobs, SHARED_AUDIT_PER_HOUR)
    lines = [
        "overhead of tpuwatch (simulator, steady job)",
        "",
        f"start-up  tpuwatch --help          median {h['median']:.3f}s (min {h['min']:.3f}, max {h['max']:.3f}, "
        f"{h['runs']} cold runs)   target < 0.3 s",
        f"          tpuwatch check -c ...    median {c['median']:.3f}s for a whole tick; first API call "
        f"{c['to_first_api_call']:.3f}s after spawn" if c["to_first_api_call"] is not None else
        f"          tpuwatch check -c ...    median {c['median']:.3f}s for a whole tick",
        f"idle      watch, {idle['ticks']} polls at {idle['poll']:g}s   RSS {idle['rss_mb']:.1f} MB "
        f"(start {idle['rss_start_mb']:.1f}, peak {idle['hwm_mb']:.1f})   target < 80 MB",
        f"          CPU per poll {idle['cpu_per_poll'] * 1000:.1f} ms (+{idle['ssh_cpu_per_poll'] * 1000:.1f} ms in ssh "
        f"children) -> 10 min at 30 s: {idle['cpu_10min_default']:.2f} s (+{idle['ssh_cpu_10min_default']:.2f} s), "
        f"{idle['core_share_default']:.2%} of a core",
        f"API/hour  one node, 30 s poll      TPU {one['tpu_per_hour']:.0f} (target <= 130), audit-log reads "
        f"{one['audit_per_hour']:.0f} (target <= 60), other {one['other_per_hour']:.0f}   "
        f"[{one['ticks']} ticks of the real Reconciler, {one['virtual_hours']:.2f} h of virtual time]",
        f"          {jobs} nodes, status --all   {sum(st['calls_per_run'].values())} calls per run "
        f"({', '.join(f'{k} {v}' for k, v in st['calls_per_run'].items())}), {st['median_seconds']:.2f}s; "
        f"every 30 s: {st['per_hour_every_poll']:.0f}/hour",
        f"          {wt['jobs']} watchers at once  {wt['tpu_calls_per_tick']:.2f} TPU calls per tick per job -> "
        f"{wt['tpu_per_hour_per_job_default']:.0f}/hour per job at 30 s",
        f"          {wt['jobs']} watchers, {wt.get('state_dirs', 'separate')} state dir(s)  audit-log queries "
        f"{wt.get('audit_calls', 0)} in {wt['seconds']:.0f} s = {wt.get('audit_per_minute', 0.0):.1f}/min; "
        f"{wt.get('audit_calls_since_start', 0)} since they started "
        f"({wt.get('audit_per_minute_since_start', 0.0):.1f}/min over {wt.get('seconds_since_start', 0.0):.0f} s)",
        f"          {jobs} nodes each watched  TPU {one['tpu_per_hour'] * jobs:.0f}/hour; audit-log queries "
        f"{shared_audit:.0f}/hour at most with one shared state dir "
        f"({one['audit_per_hour'] * jobs / 60:.0f}/min if each job queried for itself; Logging read quota: "
        f"60/min per project); {one['tpu_per_hour'] * jobs + shared_audit:.0f} calls/hour in all",
        "",
        "slowest imports of `tpuwatch --help`: " + ", ".join(f"{m} {s * 1000:.0f} ms" for m, s in h["slowest_imports"][:5]),
        "slowest imports of `tpuwatch check --help`: "
        + ", ".join(f"{m} {s * 1000:.0f} ms" for m, s in c["slowest_imports"][:5]),
    ]
    return "\n".join(lines + render_pods(r.get("pods", [])))


def sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected worker counts like 4,32,128, got {text!r}") from None
    if any(not 1 <= n <= 256 for n in out):
        raise argparse.ArgumentTypeError(f"a simulated node has 1 to 256 workers: {text!r}")
    return out


def jobs_mode(counts: list[int], poll: float, seconds: float, seed: int, log: Any, api: str = "tpu",
              kind: str = "instance") -> dict[str, Any]:
    """Many jobs in one watcher (see the module's docstring); `api` "compute": Compute Engine
    slices of one VM each, `kind` "instance" or "mig"."""
    from tpuwatch.sim.rest import RestFace

    out: dict[str, Any] = {"api": api, "poll": poll, "seconds": seconds, "runs": []}
    if api == "compute":
        out["kind"] = kind
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-jobs-") as tmp_s:
            tmp = Path(tmp_s)
            sim = Simulator(root=tmp / "sim", speed=600, seed=seed).start()
            face = RestFace(sim.world).start() if api == "compute" else None
            try:
                d = tmp / "jobs"
                d.mkdir()
                for i in range(n):
                    name = f"job{i:03d}"
                    if face is not None:
                        if kind == "mig":
                            sim.world.add_mig(name, size=1, labels={"tpuwatch-job": name})
                        else:
                            sim.world.add_instance(name, body={"labels": {"tpuwatch-job": name}})
                        compute_config(d / f"{name}.toml", sim, kind, name, "sleep 100000", poll)
                        continue
                    sim.create_node(name, "v4-8", labels={"tpuwatch-job": name})
                    cfg = write_config(d / f"{name}.toml", sim, "sleep 100000", tmp / "ck" / name, accelerator="v4-8",
                                       spot=False, recovery={"poll_interval": f"{poll:g}s"})
                    cfg.write_text(cfg.read_text().replace(f'name = "{JOB}"', f'name = "{name}"', 1)
                                   .replace("checkpoint_dir = ", "# checkpoint_dir = "))
                env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state")}
                if face is not None:
                    env["TPUWATCH_COMPUTE_EMULATOR"] = face.url.rstrip("/")
                proc = subprocess.Popen([*tpuwatch_argv(), "watch", "--config-dir", str(d), "--json"], env=env,
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL)
                rows: dict[str, str] = {}  # job -> its last tick's row (or status)

                def read(proc: subprocess.Popen[str] = proc, rows: dict[str, str] = rows) -> None:
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        try:
                            obj = json.loads(line)
                        except ValueError:
                            continue
                        rows[obj["job"]] = obj.get("row") or f"{obj.get('status')}: {obj.get('error')}"

                threading.Thread(target=read, daemon=True).start()
                t0 = time.monotonic()
                while sum(1 for r in list(rows.values()) if r == "running") < n:
                    if proc.poll() is not None or time.monotonic() - t0 > 900:
                        late = {j: r for j, r in sorted(rows.items()) if r != "running"}
                        raise RuntimeError(f"not every job running when the watcher stopped or 900 s passed: {late}")
                    time.sleep(0.2)
                startup = time.monotonic() - t0
                log(f"jobs {n}: all running after {startup:.1f} s; counting {seconds:g} s")
                with sim.world._lock:
                    before = Counter(sim.world.calls)
                cpu0 = sum(proc_cpu(proc.pid))
                time.sleep(seconds)
                cpu1 = sum(proc_cpu(proc.pid))
                mem = proc_mem(proc.pid)
                with sim.world._lock:
                    calls = delta(Counter(sim.world.calls), before)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            finally:
                if face is not None:
                    face.close()
                sim.close()
        polls = seconds / poll
        if api == "compute":
            tpu, lister, getter = compute_calls(calls), "Instances/List", "Instances/Get"
        else:
            tpu = {m.rsplit("/", 1)[-1]: c for m, c in calls.items() if TPU_CALL.search(m)}
            lister, getter = "ListNodes", "GetNode"
        run = {"jobs": n, "startup_seconds": round(startup, 1),
               "list_per_poll": round(tpu.get(lister, 0) / polls, 2),
               "get_per_poll": round(tpu.get(getter, 0) / polls, 2),
               "other_tpu_per_poll": round((sum(tpu.values()) - tpu.get(lister, 0) - tpu.get(getter, 0))
                                           / polls, 2),
               "per_poll": {m: round(c / polls, 2) for m, c in sorted(tpu.items())},
               "audit_per_minute": round(sum(c for m, c in calls.items() if m.endswith(AUDIT_CALL)) * 60 / seconds, 2),
               "rss_mb": round(mem.get("VmRSS", 0.0), 1), "hwm_mb": round(mem.get("VmHWM", 0.0), 1),
               "cpu_per_poll": round((cpu1 - cpu0) / polls, 3)}
        log(f"jobs {n}: {run}")
        out["runs"].append(run)
    return out


def render_jobs(r: dict[str, Any]) -> str:
    if r.get("api") == "compute":
        what = f"Compute Engine {'MIGs' if r.get('kind') == 'mig' else 'instances'}, one VM each"
        heads = ("instances.list", "instances.get", "other Compute Engine")
    else:
        what, heads = "one worker per node", ("ListNodes", "GetNode", "other TPU")
    lines = [f"many jobs in one watcher (poll {r['poll']:g} s, counted {r['seconds']:g} s once all run; {what})", "",
             f"| jobs | all running after | {heads[0]} / poll | {heads[1]} / poll | {heads[2]} / poll "
             "| audit reads / min | RSS MB (peak) | CPU s / poll |", "|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        lines.append(f"| {x['jobs']} | {x['startup_seconds']} s | {x['list_per_poll']} | {x['get_per_poll']} | "
                     f"{x['other_tpu_per_poll']} | {x['audit_per_minute']} | {x['rss_mb']} ({x['hwm_mb']}) | "
                     f"{x['cpu_per_poll']} |")
    lines += ["", "per poll, by method:"] + [f"  {x['jobs']} jobs: {x.get('per_poll', {})}" for x in r["runs"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="cold runs of --help / check / status --all (%(default)s)")
    p.add_argument("--poll", type=float, default=0.3, help="scaled poll_interval of the idle watcher (%(default)s)")
    p.add_argument("--ticks", type=int, default=20, help="polls of the idle watcher: 20 = 10 min at 30 s (%(default)s)")
    p.add_argument("--virtual-ticks", type=int, default=120,
                   help="Reconciler ticks 30 s apart in virtual time: 120 = one hour (%(default)s)")
    p.add_argument("--nodes", type=int, default=200, help="nodes in the zone (%(default)s)")
    p.add_argument("--watchers", type=int, default=4, help="watch processes of separate jobs in that zone (%(default)s)")
    p.add_argument("--watch-seconds", type=float, default=10.0,
                   help="how long they are counted; 60 or more for a steady audit-log rate (%(default)s)")
    p.add_argument("--separate-state-dirs", action="store_true",
                   help="give each watcher its own state dir, so none shares the audit-log query")
    p.add_argument("--accelerator", default="v4-16", help="the idle job's node type (%(default)s)")
    p.add_argument("--pod-sizes", type=sizes, default=[4, 32, 128, 256], metavar="N,N,...",
                   help="workers per node for the pod measurements, 1-256 each, '' for none (4,32,128,256)")
    p.add_argument("--pod-ticks", type=int, default=5, help="steady ticks measured per pod size (%(default)s)")
    p.add_argument("--pod-poll", type=float, default=2.0, help="the pods' scaled poll_interval (%(default)s)")
    p.add_argument("--pod-heal-after", type=float, default=600.0,
                   help="simulated seconds a pod's maintenance lasts (600 = 1 s at the speed of 600)")
    p.add_argument("--pods-only", action="store_true", help="only the pod measurements")
    p.add_argument("--pod-repeat", type=int, default=1, help="heals measured per pod size (%(default)s)")
    p.add_argument("--hosts-apart", action="store_true",
                   help="with --pods-only: the watcher and its ssh clients on the first core, the simulated "
                        "hosts on the others at nice --hosts-nice, as on a pod whose hosts are VMs of their own")
    p.add_argument("--hosts-nice", type=int, default=10, help="the simulated hosts' nice increment (%(default)s)")
    p.add_argument("--pod-driver", metavar="CONFIG", help=argparse.SUPPRESS)  # internal: the watcher process
    p.add_argument("--watcher-cpus", type=lambda s: [int(x) for x in s.split(",")], help=argparse.SUPPRESS)  # internal: its cores (--hosts-apart)
    p.add_argument("--watcher-nice", type=int, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra tpuwatch.toml setting (repeatable)")
    p.add_argument("--jobs", metavar="N,N,...", default="",
                   help="measure only many jobs in one watcher, for each of these job counts")
    p.add_argument("--jobs-poll", type=float, default=5.0, help="their poll_interval, seconds (%(default)s)")
    p.add_argument("--jobs-seconds", type=float, default=60.0,
                   help="how long each count is measured once every job runs (%(default)s)")
    p.add_argument("--api", choices=("tpu", "compute"), default="tpu",
                   help="the slices' API: tpu (Cloud TPU API nodes) or compute (Compute Engine instances and "
                        "MIGs: API calls per hour of one job, or with --jobs many jobs in one watcher)")
    p.add_argument("--compute-slice", choices=("instance", "mig"), default="instance",
                   help="with --api compute --jobs: each job's slice, an instance or a MIG of one VM (%(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON object to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.parse_args(argv)
    # The watchers are stopped with SIGINT, as by Ctrl-C: a script started in the background
    # ignores it, and so would they; a handler of our own is reset to the default at their exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if a.pod_driver:
        return pod_driver(a.pod_driver, a.watcher_cpus, a.watcher_nice)
    if a.pod_ticks < 1 or a.pod_poll <= 0 or a.pod_repeat < 1:
        p.error("--pod-ticks and --pod-repeat must be at least 1, --pod-poll positive")
    if a.hosts_apart and not a.pods_only:
        p.error("--hosts-apart goes with --pods-only (the other measurements run the watcher beside the simulator)")
    if not 0 <= a.hosts_nice <= 19:
        p.error("--hosts-nice must be 0 to 19")
    if min(a.runs, a.ticks, a.virtual_ticks, a.nodes) < 1 or a.watchers < 0 or a.poll <= 0:
        p.error("--runs, --ticks, --virtual-ticks and --nodes must be at least 1, --poll positive")

    def log(text: str) -> None:
        if not a.quiet:
            print(text, file=sys.stderr, flush=True)

    started = time.monotonic()
    if a.jobs:
        try:
            counts = [int(x) for x in a.jobs.split(",")]
        except ValueError:
            p.error(f"--jobs: expected job counts such as 1,10,50,100, got {a.jobs!r}")
        if min(counts) < 1 or a.jobs_poll <= 0 or a.jobs_seconds <= 0:
            p.error("--jobs counts must be at least 1, --jobs-poll and --jobs-seconds positive")
        result = jobs_mode(counts, a.jobs_poll, a.jobs_seconds, a.seed, log, a.api, a.compute_slice)
        result["seconds_total"] = round(time.monotonic() - started, 1)
        show = render_jobs
    elif a.api == "compute":
        result = compute_hours(a, log)
        result["seconds"] = round(time.monotonic() - started, 1)
        show = render_compute_hours
    else:
        result = measure(a, log)
        result["seconds"] = round(time.monotonic() - started, 1)
        show = render
    text = json.dumps(result, indent=2, sort_keys=True)
    if a.json_out:
        Path(a.json_out).write_text(text + "\n")
    print(text if a.json else show(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
