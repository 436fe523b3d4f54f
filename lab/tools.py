"""The supervisors the goodput benchmark compares, each a small process over the same BenchWorld.

- `tpuwatch`: the product itself. `TpuwatchDriver` is `tpuwatch watch`'s loop without its view:
  `tpuwatch.tick.Reconciler.tick()` (observe -> decide -> journal -> act, with the real policy,
  config, journal and audit-log cadence), then `tpuwatch.loop.next_delay` and
  `loop.Pacer.wait`, against in-memory ports over the BenchWorld (`lab.fakeports`) and
  the BenchWorld's virtual clock. No rule and no cadence is copied here.
- the baselines (docs/benchmarks.md, "The baselines"), modelled as their scripts are
  written: the docs' bash loop, TensorFlow's retry.sh, tpunicorn `pu babysit`, Levanter's
  babysit-tpu-vm.sh and SkyPilot's managed-job controller;
- `ideal` (lab/bounds.py): an oracle that knows the trace and reacts at once, the bound for all
  of them; a reactive bound: like the baselines it neither reads upcomingMaintenance nor relays
  the metadata server's notice, so an announced maintenance is to all of them an unannounced one;
- `ideal_ways` (lab/bounds.py): the same oracle past fixed slices, with hot spares and limping on
  fewer slices (`way_tools`; docs/benchmarks.md, "Past fixed slices").

Every tool counts what it spends in a Meter: TPU API calls (one per gcloud describe, list,
create, delete, and one per gcloud ssh, which looks the node up first; for tpuwatch, one per
call its tick makes), audit-log reads, checkpoint-store lists and ssh connections. gcloud's own
polling of a long-running operation is not counted, so the baselines' figures are lower bounds.

This module must not know the fault trace except through the BenchWorld (the oracle alone reads
the world's knowledge of the future: when the current maintenance heals, when stockouts end).
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lab.bounds import ideal, ideal_ways
from lab.clock import Process, Signal, Sim
from lab.fakeports import (
    PROJECT,
    ZONE,
    BenchAudit,
    BenchCheckpoints,
    BenchTpu,
    BenchWorkers,
    at,
)
from lab.world import OK, SSH_LOST, BenchWorld, Meter
from tpuwatch.cloud.tpu.lifecycle import Lifecycle
from tpuwatch.config import SCHEMA, Config, validate
from tpuwatch.durations import human
from tpuwatch.journal import Journal
from tpuwatch.loop import next_delay, run_job
from tpuwatch.model import NodeSnapshot, bound_view
from tpuwatch.policy import Marks, Memory, Observation, PolicyConfig, decide
from tpuwatch.ports import Flags, JobPorts
from tpuwatch.tick import TickReport

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

JOB = "bench"
# States in which `gcloud compute tpus tpu-vm ssh` tries to connect; it refuses the others
# (gcloud's TPU ssh code: PREEMPTED/TERMINATED/STOPPED; a node being created or deleted has no endpoints).
SSH_STATES = frozenset({"READY", "REPAIRING", "RESTARTING", "UNKNOWN"})
GCLOUD_SSH_TRIES = 10  # gcloud retries ssh exit 255 up to 10 times, 5 s apart
GCLOUD_SSH_RETRY_WAIT = 5.0


@dataclass
class Run:
    """What one tool's processes share: the world, the meter, a seeded random source."""

    sim: Sim
    world: BenchWorld
    meter: Meter
    rng: random.Random
    extra: dict[str, Any] = field(default_factory=dict)  # tool-specific results (tpuwatch's memory)


# ---------------------------------------------------------------------------------------------
# gcloud, as the shell baselines use it


def gcloud_ssh(run: Run, attempt: Callable[[], int]) -> Process:
    """`gcloud compute tpus tpu-vm ssh NAME --worker=all --command "python3 train.py"`: its exit code.

    gcloud looks the node up (one API call), refuses a node that is not in SSH_STATES, and
    retries an ssh exit 255 (host unreachable, or the connection dropped mid-command) up to
    GCLOUD_SSH_TRIES times 5 s apart, which reruns the command. train.py resumes from the
    newest checkpoint by itself.
    """
    w, m = run.world, run.meter
    m.tpu += 1
    yield w.p.gcloud_overhead
    node = w.node
    if node is None or node.state not in SSH_STATES:
        return 1
    for i in range(GCLOUD_SSH_TRIES):
        if i:
            yield GCLOUD_SSH_RETRY_WAIT
        m.ssh += w.p.workers
        if not w.hosts_up or w.node is None or w.node.state != "READY":
            continue
        a = w.launch(attempt())
        if a is None:
            return 1
        rc = yield a.end_sig
        if rc != SSH_LOST:
            return int(rc)
    return SSH_LOST


def refused(run: Run) -> bool:
    """gcloud ssh would refuse at once: no node, or a state it does not connect to."""
    node = run.world.node
    return node is None or node.state not in SSH_STATES


def spin_until_change(run: Run, period: float) -> Process:
    """A shell loop retrying a refused command every `period` s, until the world changes.

    Equivalent to looping (one gcloud call each time) but costs one event instead of one per
    iteration: it waits for the next change and counts the calls the loop made meanwhile.
    """
    w, sim = run.world, run.sim
    t0 = sim.now
    yield sim.any_of(w.changed, max(0.0, w.p.horizon - sim.now))
    k = max(0, math.ceil((sim.now - t0) / period) - 1)
    run.meter.tpu += k
    nxt = t0 + (k + 1) * period - w.p.gcloud_overhead
    if nxt > sim.now:
        yield nxt - sim.now


def bash_loop(run: Run) -> Process:
    """`while ! gcloud compute tpus tpu-vm ssh $TPU --worker=all --command "python3 train.py"; do sleep 1; done`."""
    nxt = itertools.count(1).__next__  # the attempt numbers a loop's relaunches carry

    while True:
        rc = yield from gcloud_ssh(run, nxt)
        if rc == 0:
            run.world.give_up("job done")
            return
        if refused(run):
            yield from spin_until_change(run, run.world.p.gcloud_overhead + 1.0)
        else:
            yield 1.0


def gcloud_delete(run: Run) -> Process:
    """`gcloud compute tpus tpu-vm delete` (waits for the operation)."""
    run.meter.tpu += 1
    yield run.world.p.gcloud_overhead
    op = run.world.delete_node()
    if op is not None:
        yield op.sig


def gcloud_create(run: Run) -> Process:
    """`gcloud compute tpus tpu-vm create` (waits for the operation): True when it succeeded."""
    run.meter.tpu += 1
    yield run.world.p.gcloud_overhead
    op = run.world.create_node()
    done = yield op.sig
    return done.error_code == OK


# ---------------------------------------------------------------------------------------------
# the baselines


def retry_sh(run: Run) -> Process:
    """TensorFlow's retry.sh as intended: every 30 s describe, grep TERMINATED|UNHEALTHY_MAINTENANCE,
    then delete and create (once). It never reruns training: the bash loop beside it does."""
    w, m = run.world, run.meter
    while True:
        m.tpu += 1
        yield w.p.gcloud_overhead
        node = w.node
        if node is not None and (node.state == "TERMINATED" or node.health == "UNHEALTHY_MAINTENANCE"):
            yield from gcloud_delete(run)
            yield from gcloud_create(run)  # a failed create leaves no node, and no line to grep
        yield 30.0


def tpunicorn(run: Run) -> Process:
    """tpunicorn `pu babysit NAME`: every 30 s, recreate only when the state is PREEMPTED.

    get_tpu lists the zone and is_preempted fetches the node again (two calls a check); a
    missing node makes get_tpu raise, which babysit prints and loops on forever. The create
    is not retried (no --retry), and READY+HEALTHY is awaited every 30 s with no timeout.
    Its `-c` command runs on the watcher; training is rerun by the bash loop beside it.
    """
    w, m = run.world, run.meter
    first = True
    while True:
        if not first:
            yield 30.0
        first = False
        m.tpu += 1
        node = w.node
        if node is None:
            continue
        m.tpu += 1
        if node.state != "PREEMPTED":
            continue
        yield from gcloud_delete(run)
        ok = yield from gcloud_create(run)
        if not ok:
            continue
        while True:
            m.tpu += 1
            n = w.node
            if n is not None and n.state == "READY" and n.health == "HEALTHY":
                break
            yield 30.0


def levanter(run: Run) -> Process:
    """Levanter's infra/babysit-tpu-vm.sh: every 10 s, describe; missing -> create (spin-up-vm.sh,
    retried every 5 s forever, then setup); any state but READY -> delete; READY -> rerun the
    command with --worker=all. Unlimited retries, no failure/preemption split."""
    w, m, p = run.world, run.meter, run.world.p
    nxt = itertools.count(1).__next__  # the attempt numbers a loop's relaunches carry

    while True:
        m.tpu += 1
        yield p.gcloud_overhead
        if w.node is not None:
            m.tpu += 1  # a second describe, for the state
            yield p.gcloud_overhead
            node = w.node
            if node is None:
                pass
            elif node.state != "READY":
                yield from gcloud_delete(run)
            else:
                rc = yield from gcloud_ssh(run, nxt)
                if rc == 0:
                    w.give_up("job done")
                    return
        else:
            while not (yield from gcloud_create(run)):
                yield 5.0
            yield 15.0
            for _ in range(3):  # scp the setup script, check it, run it
                m.tpu += 1
                m.ssh += p.workers
                yield p.gcloud_overhead
        yield 10.0


def skypilot(run: Run, restarts_on_errors: int = 0) -> Process:
    """SkyPilot managed job: every ~15 s the controller asks the cluster for the job's status.

    A job that failed on a cluster whose `state` is READY is a user error: with
    max_restarts_on_errors (default 0) spent, the managed job fails and its cluster is torn
    down. A cluster whose state is not READY (health is never read) is a preemption: after
    about 2.5 min it deletes the TPU and relaunches it, create retried with backoff from 60 s,
    x1.6 with jitter, capped at 300 s, then reruns the job.
    """
    w, m = run.world, run.meter
    n = 1
    errors = 0
    w.launch(n)
    while True:
        yield 15.0
        m.ssh += 1  # job status, from the cluster's head
        a = w.live()
        if a is not None and w.hosts_up:
            continue  # RUNNING (a hung job too)
        if w.done is not None:
            w.give_up("job done")
            return
        m.tpu += 1  # the controller refreshes the cluster's status
        node = w.node
        if node is not None and node.state == "READY" and not w.hosts_up:
            continue  # status unknown; look again
        last = w.attempt
        user_error = (node is not None and node.state == "READY" and last is not None
                      and last.ended and any(c not in (None, 0) for c in last.exits.values()))
        if user_error:
            if errors >= restarts_on_errors:
                yield from gcloud_delete(run)
                w.give_up("FAILED: the job exited non-zero on a healthy cluster "
                          f"(max_restarts_on_errors = {restarts_on_errors})", "FAILED (user error)")
                return
            errors += 1
        yield 120.0  # ~2.5 min from "preempted" to "recovering" (in a SkyPilot user's log)
        if w.node is not None:
            yield from gcloud_delete(run)
        backoff = 60.0
        while not (yield from gcloud_create(run)):
            yield min(300.0, backoff * run.rng.uniform(0.5, 1.5))
            backoff = min(300.0, backoff * 1.6)
        n += 1
        w.launch(n)


# ---------------------------------------------------------------------------------------------
# tpuwatch: the real tick, driven as `tpuwatch watch` drives it


class _Horizon(Exception):
    """The run's end was reached while `loop.Pacer.wait` slept."""


def tpuwatch_toml(*, tpu: str = "llm-pod", names: list[str] | None = None, min_slices: int = 0,
                  spares: list[str] | None = None, **recovery: Any) -> str:
    """A tpuwatch.toml for the benchmark's job: `[recovery]` holds only the keys given (None
    values dropped), so every other key keeps the product's default. Durations may be given as
    text ("30m") or seconds. `tpu` is `[tpu] name`; `names`, the slices' node names of a
    multislice job (`[tpu] names`); `min_slices`, `[job] min_slices` (0: not set, never limps);
    `spares`, its hot spares' node names (`[tpu] spares`, made again from `[tpu.spec]`)."""
    lines = [
        "[tpu]", f"name = {_toml(tpu)}", f'project = "{PROJECT}"', f'zone = "{ZONE}"',
        *([f"names = [{', '.join(_toml(n) for n in names)}]"] if names else []),
        *([f"spares = [{', '.join(_toml(n) for n in spares)}]"] if spares else []),
        "[tpu.spec]", 'accelerator_type = "v4-32"', 'runtime_version = "tpu-ubuntu2204-base"', "spot = true",
        "[job]", f'name = "{JOB}"', 'command = "cd ~/repo && python3 train.py --resume={checkpoint}"',
        'checkpoint_dir = "gs://bench/ckpt"', *([f"min_slices = {min_slices}"] if min_slices else []),
        "[recovery]", *(f"{k} = {_toml(v)}" for k, v in recovery.items() if v is not None),
    ]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return f'"{v:g}s"'  # seconds: a duration
    return str(v)


def tpuwatch_config(*, tpu: str = "llm-pod", names: list[str] | None = None, min_slices: int = 0,
                    **recovery: Any) -> Config:
    """A real Config from `tpuwatch_toml(...)`, validated by the product's own schema."""
    text = tpuwatch_toml(tpu=tpu, names=names, min_slices=min_slices, **recovery)
    return Config(values=validate(tomllib.loads(text)), path=None)


def limp_config(cfg: Config, slices: int, floor: int, tpu: str = "llm-pod") -> Config:
    """`cfg` for a job over `slices` slices (the BenchWorld's nodes `<tpu>-0..`) that limps down to
    `floor` of them (`[job] min_slices`), the key checked by the product's own validation."""
    names = [f"{tpu}-{i}" for i in range(slices)]
    checked = validate(tomllib.loads(tpuwatch_toml(tpu=tpu, names=names, min_slices=floor)))
    return Config(values={**cfg.values, "tpu": {**cfg.values["tpu"], "names": tuple(names)},
                          "job": {**cfg.values["job"], "min_slices": checked["job"]["min_slices"]}}, path=None)


def slice_config(cfg: Config, name: str) -> Config:
    """`cfg` for a one-node job on the node `name` (a watcher of one slice of a multislice job)."""
    tpu = {**cfg.values["tpu"], "name": name, "names": (), "queued_resource": ""}
    return Config(values={**cfg.values, "tpu": tpu}, path=None)


def job_config(cfg: Config, world: BenchWorld) -> Config:
    """`cfg` for the whole job of `world`: over several slices, `[tpu] names` lists their nodes and
    `[tpu] queued_resource` names the multislice request they came from. With spares (the world's
    slices past the job's, `p.spares`), `[tpu] spares` lists them and there is no queued resource:
    every node is made alone, a dead spare made again from `[tpu.spec]` (checked by the product's
    own validation). So is every node of a job that limps (`Params.made_alone`): a dead slice it
    limps without is made again from `[tpu.spec]`."""
    if len(world.slices) == 1:
        return cfg
    names = [sl.name for sl in world.slices[:world.p.slices]]
    if world.p.spares:
        spares = [sl.name for sl in world.slices[world.p.slices:]]
        checked = validate(tomllib.loads(tpuwatch_toml(tpu=world.name, names=names, spares=spares)))
        tpu = {**cfg.values["tpu"], "names": checked["tpu"]["names"], "spares": checked["tpu"]["spares"],
               "queued_resource": ""}
    elif world.p.made_alone:
        tpu = {**cfg.values["tpu"], "names": tuple(names), "queued_resource": ""}
    else:
        tpu = {**cfg.values["tpu"], "names": tuple(names), "queued_resource": world.name}
    return Config(values={**cfg.values, "tpu": tpu}, path=None)


@dataclass
class _Anchor:
    """The last steady tick that read the audit log: what the run had spent by then."""

    t: float
    meter: tuple[int, ...]
    ticks: int
    draws: int


class TpuwatchDriver:
    """`tpuwatch watch` without its view: `Reconciler.tick()`, then `next_delay`, then
    `loop.Pacer.wait` (which probes a down node's SSH port every 0.5 s and asks the API once a
    poll), until the job is done, failed or needs a person, against BenchTpu & co. with a real
    Journal (SQLite) in a temporary directory and the BenchWorld's virtual clock.

    Fast-forward (`skip_idle`): a 30-day run is ~86,000 ticks, nearly all of them "running" with
    nothing new. Once two ticks that read the audit log are a steady period apart (same row
    `running`, no action, same memory, same checkpoint, no event, the world untouched, the
    poll as delay), the driver replays that measured period - its API calls, log reads, ssh
    connections, jitter draws and ticks - whole periods at a time, up to the BenchWorld's next
    observable change, and moves the memory's `marks.audit_read_at` with it, so the next real
    tick reads the audit log exactly when it would have. It asks the policy itself (`decide`
    is pure) whether the decision at the end of the jump is still `running` with the same
    memory, so a time-based rule (hang_timeout) fires on time. Runs with and without it give the
    same figures (tests/project/test_bench_goodput.py checks it); `skip_idle=False` runs every tick.
    """

    def __init__(self, run: Run, cfg: Config, skip_idle: bool = True, slice: int | None = None,
                 group: Watchers | None = None) -> None:
        self.run = run
        self.cfg = cfg
        # A watcher of one slice only (`slice`), which sleeps through its `group` when it shares
        # the clock with others (Watchers); by default the one watcher runs the engine itself.
        self.slice = slice
        self.group = group
        # its own calls and jitter: the run's, or, beside other watchers, its own (its calls are
        # added to the run's at the end), so that replaying its idle periods touches no other's
        self.meter = Meter() if group is not None else run.meter
        self.rng = random.Random(run.rng.getrandbits(64)) if group is not None else run.rng
        self.pcfg = PolicyConfig.from_config(cfg)
        self.skip_idle = skip_idle
        self.mem: Memory = Memory.initial(self.pcfg.zones[0])
        self.rows: Counter[str] = Counter()
        self.ticks = 0  # ticks, the fast-forwarded ones included
        self.real_ticks = 0  # ticks actually run
        self.error = ""
        self.port_probes = 0
        self.draws = 0  # jitter values drawn

    def _jitter(self) -> float:
        self.draws += 1
        return self.rng.random()

    def ports(self) -> JobPorts:
        run, w, m, job = self.run, self.run.world, self.meter, self.pcfg.job
        sim, horizon = run.sim, w.p.horizon
        tpu = BenchTpu(w, m, job)
        self.tpu = tpu

        def until(t: float) -> None:
            if sim.now >= horizon:
                raise _Horizon
            sim.run(min(t, horizon))

        def sleep(seconds: float) -> None:
            until(sim.now + max(seconds, 0.0))

        def wait_for(event: threading.Event, seconds: float) -> bool:
            """The clock runs until a followed attempt ends (`event`), `seconds` at most."""
            if sim.now >= horizon:
                raise _Horizon
            end = min(sim.now + max(seconds, 0.0), horizon)
            while not event.is_set() and sim.next_time() <= end:
                sim.run(sim.next_time())
            if not event.is_set():
                sim.run(end)
            return event.is_set()

        def port_open(host: str, port: int, timeout: float) -> bool:
            self.port_probes += 1
            sl = w.slices[int(host.split(".")[1])]  # BenchTpu's addresses: 10.<slice>.0.<worker + 2>
            return sl.hosts_up and sl.node is not None and sl.node.state == "READY"

        group = self.group
        self.until = group.alarm(self) if group is not None else until
        self.sleep = group.sleeper(self) if group is not None else sleep
        workers = BenchWorkers(w, m, self.slice, rouse=(lambda: group.rouse(self)) if group is not None else None)
        self.workers = workers
        life = Lifecycle(tpu, str(self.cfg.tpu["queued_resource"]), tuple(self.cfg.tpu["names"]))
        return JobPorts(tpu_for=lambda zone: tpu, lifecycle_for=lambda zone: life, workers=workers,
                     checkpoints=BenchCheckpoints(w, m), audit=BenchAudit(w, m), now=lambda: at(sim.now),
                     jitter=self._jitter, sleep=self.sleep, clock=lambda: sim.now, port_open=port_open,
                     wait_for=group.waiter(self) if group is not None else wait_for)

    def drive(self) -> None:
        w, sim = self.run.world, self.run.sim
        poll = self.pcfg.poll_interval
        # The launch puts the notice relay beside each attempt when notify_signal names a signal.
        w.relay = bool(self.cfg.get("maintenance.notify_signal"))
        # A multislice launch appends Megascale's abort-on-hang flags ([job] megascale_abort_on_hang).
        w.megascale_abort = bool(self.cfg.job["megascale_abort_on_hang"]) and bool(self.cfg.tpu["names"])
        with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-") as state, \
                Journal.open(Path(state), self.cfg.job_name, self.cfg.tpu_name, wait=False) as journal:
            # A throwaway journal: no fsync and no rollback file per tick (the product's
            # durability is not what is measured; this keeps a tick at ~0.3 ms).
            journal.connection.execute("PRAGMA synchronous=OFF")
            journal.connection.execute("PRAGMA journal_mode=MEMORY")
            failed = ""  # what the last tick raised
            reads = 0  # audit-log reads before the last tick
            last: TickReport | None = None
            seen = w.changed
            anchor: _Anchor | None = None

            @contextmanager
            def slot() -> Iterator[None]:
                nonlocal failed, reads
                if sim.now >= w.p.horizon:  # the run is over before this tick
                    raise _Horizon
                failed, reads = "", self.meter.log
                try:
                    yield
                except Exception as exc:
                    failed = f"{type(exc).__name__}: {exc}"
                    raise

            def after_tick(report: TickReport) -> None:
                nonlocal last, seen, anchor
                self.ticks += 1
                self.real_ticks += 1
                for d in (*report.earlier, report.decision):
                    self.rows[d.row] += 1
                self.mem = report.memory
                if report.decision.ends_watch:
                    return
                delay = next_delay(report, poll)
                steady = (last is not None and _idle(report, delay, poll) and _idle(last, delay, poll)
                          and w.changed is seen and _steady(report.memory) == _steady(last.memory)
                          and report.checkpoint == last.checkpoint)
                last, seen = report, w.changed
                if not steady or not self.skip_idle:
                    anchor = None
                elif self.meter.log > reads:  # this tick read the audit log
                    if anchor is not None:
                        self._skip(anchor, report, journal)
                    anchor = _Anchor(sim.now, _meter(self.meter), self.ticks, self.draws)

            try:
                report = run_job(self.cfg, self.pcfg, self.ports(), journal, Flags(), _Unseen(),
                                 after_tick=after_tick, slot=slot)
            except _Horizon:
                return
            except Exception:
                if not failed:  # the benchmark's own bug, not the tick's
                    raise
                # a policy or tick bug: recorded and reported, never hidden
                self.error = failed
                w.give_up(f"tick error: {self.error}", "TICK ERROR")
                return
            d = report.decision
            w.give_up(f"{self.mem.phase.value} ({d.row}): {self.mem.reason}", f"{self.mem.phase.value} ({d.row})")

    def _skip(self, anchor: _Anchor, report: TickReport, journal: Journal) -> None:
        """Replay the steady period since `anchor`, whole periods, up to the next change."""
        sim, w = self.run.sim, self.run.world
        period = sim.now - anchor.t
        if period <= 0:
            return
        group = self.group
        limit = min(w.next_change(group.fire if group is not None else None), w.p.horizon)
        n = self._periods(limit, period)
        n = self._still_running(report, period, n)
        if group is not None and n > 0:
            # Beside other watchers: promise to act on nothing before the tick after the jump
            # (as long as the world does not change), and jump no further than the others promised.
            group.promise(self, sim.now + n * period + self.pcfg.poll_interval)
            n = min(n, self._periods(min(group.bound(self), w.p.horizon), period))
        if n <= 0:
            return
        delta = [b - a for a, b in zip(anchor.meter, _meter(self.meter), strict=True)]
        m = self.meter
        m.tpu, m.log, m.storage, m.ssh = (v + n * d for v, d in zip(_meter(m), delta, strict=True))
        ticks = n * (self.ticks - anchor.ticks)
        self.ticks += ticks
        self.rows[report.decision.row] += ticks
        for _ in range(n * (self.draws - anchor.draws)):
            self._jitter()
        self.until(self._after(ticks))
        with journal.transaction():  # as the last replayed tick, which read the log, left it
            mem = journal.load_memory()
            if mem is not None:
                journal.save_memory(replace(mem, marks=replace(mem.marks, audit_read_at=at(sim.now))))

    def _after(self, ticks: int) -> float:
        """The clock after `ticks` steady waits of a poll each, added up one by one as the loop's
        own waits add them (the same float, so a jump lands where every tick would have)."""
        t, poll = self.run.sim.now, self.pcfg.poll_interval
        for _ in range(ticks):
            t += poll
        return t

    def _periods(self, limit: float, period: float) -> int:
        """Whole periods from now whose last tick comes before `limit` (the change a tick after them sees)."""
        now = self.run.sim.now
        n = math.floor((limit - now) / period)
        return n - 1 if now + n * period >= limit else n

    def _still_running(self, report: TickReport, period: float, n: int) -> int:
        """The largest k <= n for which the policy still decides `running`, with the same memory,
        k periods from now (time-based rules are monotone in time, so k splits cleanly)."""
        node = report.node
        left_out: tuple[NodeSnapshot | None, ...] = ()
        limp = report.memory.limp
        if limp.out:  # a job that limps: its slices left out, as the tick read them (unchanged since)
            w, names = self.run.world, self.pcfg.slices
            pool = (*names, *self.pcfg.spares)
            read = {name: self.tpu.snapshot(s) if (s := w.slice_of(name)) is not None else None for name in pool}
            left_out = bound_view(self.pcfg.tpu_name, names, read, limp.out, dict(limp.swapped))[1]
        # a job with spares: its idle ones as the tick read them (a spare's remake is on a schedule)
        obs = Observation(node=node, left_out=left_out, spares=report.spares, probes=report.probes,
                          checkpoint=report.checkpoint, jitter=0.5)
        lo, hi = 0, n
        while lo < hi:
            k = (lo + hi + 1) // 2
            t = self.run.sim.now + k * period
            # the logs' ages as the probes would read them then (a frozen job's silence grows)
            later = replace(obs, probes=self.workers.at(obs.probes, t)) if obs.probes is not None else obs
            d = decide(later, report.memory, self.pcfg, at(t))
            if d.row == report.decision.row and not d.actions and _steady(d.memory) == _steady(report.memory):
                lo = k
            else:
                hi = k - 1
        return lo


def _steady(mem: Memory) -> Memory:
    """The memory without the log cadence's bookkeeping (policy/cadence.py: the last write seen
    and the silence since), which moves on every tick of a job that logs every minute, nor the
    times of what the tick does on a schedule (`marks`: the audit log's read, moved with the jump).
    Replayed ticks leave them as the last real tick did; the next real tick learns at most the
    silence a tick saw plus one poll, as after any gap between ticks."""
    return replace(mem, hang=replace(mem.hang, log_last=None, log_peak=0.0), marks=Marks())


class Watchers:
    """Several `tpuwatch watch` loops sharing one virtual clock: one per slice of a multislice
    job, each configured as a one-node job on its slice (`slice_config`), none aware of the
    others. Each loop runs in a thread of its own, and only while the engine and every other loop
    wait: its sleep schedules its wake-up in the engine and hands the baton back, so a run is as
    deterministic as with one loop. Loops due at the same moment run in slice order. The engine
    runs in the calling thread.

    Fast-forward stays exact: a loop that replays its idle periods promises to act on nothing
    before a time (its policy's own bound), a promise void once the world changes; a loop jumps
    no further than every other loop's next wake-up or valid promise, so nothing another loop
    does can fall inside a jump (`--every-tick` gives the same figures).
    """

    def __init__(self, run: Run, cfg: Config, skip_idle: bool) -> None:
        self.run = run
        self.drivers = [TpuwatchDriver(run, slice_config(cfg, sl.name), skip_idle, s, self)
                        for s, sl in enumerate(run.world.slices)]
        self._go = {id(d): threading.Semaphore(0) for d in self.drivers}
        self._back = threading.Semaphore(0)
        self._due: dict[int, float] = {}  # driver -> when it wakes next
        self._fires: set[float] = set()  # times a fire() is scheduled for
        self._promises: dict[int, tuple[float, Signal]] = {}  # driver -> (no action before, world as of)
        self._finished: set[int] = set()
        self._waiting: set[int] = set()  # drivers in a follow wait
        self._failure: BaseException | None = None

    def alarm(self, driver: TpuwatchDriver) -> Callable[[float], None]:
        """The loop's sleep until a moment: its wake-up is scheduled in the engine, and the baton
        handed back."""
        sim, horizon = self.run.sim, self.run.world.p.horizon

        def until(t: float) -> None:
            if sim.now >= horizon:
                raise _Horizon
            self._arm(driver, min(t, horizon))
            self._back.release()
            self._go[id(driver)].acquire()

        return until

    def sleeper(self, driver: TpuwatchDriver) -> Callable[[float], None]:
        until = self.alarm(driver)
        sim = self.run.sim

        def sleep(seconds: float) -> None:
            until(sim.now + max(seconds, 0.0))

        return sleep

    def waiter(self, driver: TpuwatchDriver) -> Callable[[threading.Event, float], bool]:
        """The loop's follow wait: a sleep that `rouse` ends when a followed attempt ends."""
        sleep = self.sleeper(driver)

        def wait_for(event: threading.Event, seconds: float) -> bool:
            if not event.is_set():
                self._waiting.add(id(driver))
                try:
                    sleep(seconds)
                finally:
                    self._waiting.discard(id(driver))
            return event.is_set()

        return wait_for

    def rouse(self, driver: TpuwatchDriver) -> None:
        """A followed attempt of `driver` ended (an engine callback): its follow wait ends now."""
        if id(driver) in self._waiting:
            self._arm(driver, self.run.sim.now)

    def promise(self, driver: TpuwatchDriver, until: float) -> None:
        self._promises[id(driver)] = (until, self.run.world.changed)

    def bound(self, driver: TpuwatchDriver) -> float:
        """The first moment another loop may act: its next wake-up, or later when it promised so."""
        out = math.inf
        for d in self.drivers:
            key = id(d)
            if d is driver or key in self._finished:
                continue
            at_least = self._due.get(key, self.run.sim.now)
            until, world = self._promises.get(key, (at_least, None))
            out = min(out, max(at_least, until) if world is self.run.world.changed else at_least)
        return out

    def _arm(self, driver: TpuwatchDriver, until: float) -> None:
        self._due[id(driver)] = until
        if until not in self._fires:
            self._fires.add(until)
            self.run.sim.at(until, self.fire, until)

    def fire(self, t: float) -> None:
        """An engine callback: run the loops due at `t`, in slice order, each until it sleeps or ends."""
        self._fires.discard(t)
        for d in [d for d in self.drivers if self._due.get(id(d)) == t]:
            if self._due.get(id(d)) != t:
                continue
            del self._due[id(d)]
            self._go[id(d)].release()
            self._back.acquire()

    def _thread(self, driver: TpuwatchDriver) -> None:
        self._go[id(driver)].acquire()
        try:
            driver.drive()
        except BaseException as exc:  # handed to the engine's thread, never lost
            self._failure = exc
        finally:
            self._finished.add(id(driver))
            self._back.release()

    def drive(self) -> None:
        sim = self.run.sim
        threads = [threading.Thread(target=self._thread, args=(d,), daemon=True) for d in self.drivers]
        for d, t in zip(self.drivers, threads, strict=True):
            t.start()
            self._arm(d, sim.now)
        sim.run(self.run.world.p.horizon)
        for t in threads:
            t.join()
        m = self.run.meter
        for d in self.drivers:
            m.tpu, m.log, m.storage, m.ssh = (a + b for a, b in zip(_meter(m), _meter(d.meter), strict=True))
        if self._failure is not None:
            raise self._failure


class _Unseen:
    """The view of a loop nobody watches (loop.View)."""

    def __init__(self) -> None:
        self.ticks = 0

    def show(self, report: TickReport, next_at: object) -> None:
        self.ticks += 1

    def warn(self, text: str) -> None:
        pass


def _idle(report: TickReport, delay: float, poll: float) -> bool:
    """A tick that only follows a running attempt: nothing seen, nothing done, the poll next."""
    return (report.decision.row == "running" and not report.decision.actions and not report.events
            and delay == poll)


def _meter(m: Meter) -> tuple[int, ...]:
    return (m.tpu, m.log, m.storage, m.ssh)


# ---------------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class Tool:
    key: str
    label: str
    start: Callable[[Run], list[Process]]  # processes for the engine to run
    note: str
    # Or: a driver that runs the engine itself (tpuwatch's synchronous watch loop) to the horizon.
    drive: Callable[[Run], None] | None = None
    # What the tool may use past the job's fixed slices (lab.goodput.run_tool builds its world):
    # `spares` idle same-shape slices (the world's slices p.slices and up, drawn from the trace),
    # and limping down to `limp_floor` slices. It names the slices of each launch
    # (BenchWorld.launch(slices=...)); a tool without them never sees the spares.
    spares: int = 0
    limp_floor: int | None = None


def way_tools(spares: int = 0, limp_floor: int | None = None) -> list[Tool]:
    """The ideal bound of each way past fixed slices asked for (`ideal_ways`): with `spares`, limping
    down to `limp_floor`, and both. The fixed-slice bound is `ideal` (make_tools)."""
    ways: list[tuple[str, str, int, int | None, str]] = []
    if spares:
        ways.append(("ideal-spares", f"ideal bound, {spares} spare{'s' if spares > 1 else ''}", spares, None,
                     "oracle: relaunches on a READY spare at once; the lost slice, recovered, is the spare"))
    if limp_floor is not None:
        ways.append(("ideal-limp", f"ideal bound, limping (floor {limp_floor})", 0, limp_floor,
                     "oracle: relaunches on the slices left (k/n a step); on all at the next checkpoint"))
    if spares and limp_floor is not None:
        ways.append(("ideal-both", f"ideal bound, {spares} spare{'s' if spares > 1 else ''} and limping "
                     f"(floor {limp_floor})", spares, limp_floor, "oracle: a spare first, else the slices left"))
    return [Tool(key, label, lambda run: [ideal_ways(run)], note, spares=n, limp_floor=k)
            for key, label, n, k, note in ways]


def _with_loop(watcher: Callable[[Run], Process]) -> Callable[[Run], list[Process]]:
    return lambda run: [bash_loop(run), watcher(run)]


def tpuwatch_tool(key: str, label: str, cfg: Config, note: str, skip_idle: bool = True, spares: int = 0) -> Tool:
    """tpuwatch with `cfg`; one with `[job] min_slices` limps, in a world that counts a step on k of
    n slices as k/n of a step (as the limping bound's); with `spares`, in a world with that many
    idle slices beside the job's, its `[tpu] spares` (job_config)."""
    def drive(run: Run) -> None:
        driver = TpuwatchDriver(run, job_config(cfg, run.world), skip_idle)
        run.extra["ticks"] = [driver]
        driver.drive()

    floor = int(cfg.job["min_slices"]) or None
    return Tool(key, label, lambda run: [], note, drive, spares=spares, limp_floor=floor)


def per_slice_tool(cfg: Config, skip_idle: bool = True) -> Tool:
    """One tpuwatch per slice (Watchers): each relaunches its own slice, none waits for the others."""
    def drive(run: Run) -> None:
        group = Watchers(run, cfg, skip_idle)
        run.extra["ticks"] = group.drivers
        group.drive()

    return Tool("tpuwatch-per-slice", "one tpuwatch per slice", lambda run: [],
                "a one-node watcher per slice (defaults); they cannot coordinate", drive)


def reactive_tool(cfg: Config) -> Tool:
    """The ideal bound without foresight: every slice not usable but preempted is waited for
    `cfg`'s repair_timeout, then recreated (over several slices: on request, `--tools`)."""
    return Tool("ideal-reactive", "ideal bound without foresight",
                lambda run: [ideal(run, float(cfg.recovery["repair_timeout"]))],
                "as the oracle, but it cannot know how long a repair takes: recreates after repair_timeout")


def describe(cfg: Config, keys: tuple[str, ...] = ("repair_timeout", "max_restarts", "max_recreates",
                                                   "queue_timeout", "hang_timeout")) -> str:
    r = cfg.recovery
    return " ".join(f"{k}={human(r[k]) if isinstance(r[k], float) else r[k]}" for k in keys)


# tpuwatch watches a job over several slices once its config has `[tpu] names`.
MULTISLICE = "names" in SCHEMA["tpu"]


def make_tools(cfg: Config, tuned: Config, skypilot_restarts: int = 0, skip_idle: bool = True,
               slices: int = 1, limp_floor: int | None = None, spares: int = 0) -> list[Tool]:
    """Every compared tool, the bound first. Over several slices: the bound, tpuwatch (when it
    has `[tpu] names`) and one tpuwatch per slice; the baselines are modelled on one slice only.
    With `limp_floor` (below `slices`) both tpuwatch rows limp: `[job] min_slices = limp_floor`;
    with `spares`, both have that many hot spares (`[tpu] spares`, multislice only)."""
    if slices > 1:
        limps = limp_floor is not None and limp_floor < slices
        if limps:
            assert limp_floor is not None
            cfg, tuned = limp_config(cfg, slices, limp_floor), limp_config(tuned, slices, limp_floor)
        how = (f", min_slices {limp_floor}" if limps else "") + (f", {spares} spare{'s' if spares > 1 else ''}"
                                                                  if spares else "")
        return [
            Tool("ideal", "ideal bound", lambda run: [ideal(run)],
                 "oracle: every slice recovered at once, relaunched on all when all are usable"),
            *([tpuwatch_tool("tpuwatch", f"tpuwatch (defaults{how})", cfg, describe(cfg), skip_idle, spares),
               tpuwatch_tool("tpuwatch-30d", f"tpuwatch (tuned{how})", tuned, describe(tuned), skip_idle, spares)]
              if MULTISLICE else []),
            per_slice_tool(cfg, skip_idle),
        ]
    return [
        Tool("ideal", "ideal bound", lambda run: [ideal(run)],
             "oracle: instant detection, best of heal or recreate, stops at the bug's first failure"),
        reactive_tool(cfg),
        tpuwatch_tool("tpuwatch", "tpuwatch (defaults)", cfg, describe(cfg), skip_idle),
        tpuwatch_tool("tpuwatch-30d", "tpuwatch (tuned)", tuned, describe(tuned), skip_idle),
        Tool("bash", "bash loop (docs)", lambda run: [bash_loop(run)],
             "reruns every 1 s forever; never recreates"),
        Tool("retry.sh", "TF retry.sh + bash loop", _with_loop(retry_sh),
             "recreates on UNHEALTHY_MAINTENANCE/TERMINATED; one create try"),
        Tool("tpunicorn", "tpunicorn babysit + bash loop", _with_loop(tpunicorn),
             "recreates on PREEMPTED only; one create try"),
        Tool("levanter", "Levanter babysit-tpu-vm.sh", lambda run: [levanter(run)],
             "not READY -> delete; missing -> create every 5 s; reruns forever"),
        Tool("skypilot", "SkyPilot managed job", lambda run: [skypilot(run, skypilot_restarts)],
             f"state only; recreate on every relaunch; max_restarts_on_errors={skypilot_restarts}"),
    ]
