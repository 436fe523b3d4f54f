"""The demo's script: its pace, where it plays (a Cloud TPU API node or a Compute Engine MIG),
the four disruptions, and when each one is played; or, with `--limp`, a multislice job over
four slices that limps on three while one is lost and grows back onto it; or, with `--spare`,
the same job with a hot spare swapped in for a preempted slice, the slice made again as the
spare.

Rules of this module: the director decides when to inject a disruption only from what a person
could see — the newest checkpoint in the bucket, the simulated slice's state, and whether the
previous disruption's job has been relaunched (the journal's attempts) — never from tpuwatch's
intentions. It injects through the simulator's fault names (`Simulator.inject`), exactly as
`tpuwatch sim inject` would. It renders nothing; it reports through `say`.

The two stages tell the same story where their APIs do the same thing, and each says what its
own API does: a spot TPU node goes into maintenance; a Spot VM of a MIG gets no maintenance
restart (automatic restart is off for Spot VMs), so there the MIG's autoheal and a host error
play those parts.

The limping story's slice comes back the same way (the simulator's `heal`, once the job has
saved on the slices left). Its trainer holds at a few steps until the story has got there (the
files the director writes, as a job stalled on its input would wait), so a loaded machine whose
ticks lag the trainer plays the same story; the director lets it past on what a person sees:
the job relaunched (the journal's attempts), or tpuwatch saying it saw the slice back (the
journal's memory, shown by `status` and the dashboard). The spare's story holds its trainer the
same way until tpuwatch says the preempted slice, made again, can stand in for a slice (the
journal's `spare_back`).

The crash is not injected: the trainer's command carries `--segfault-at` with `--crash-once`,
as a job with a rare bug would, and the director notices it from the marker file the trainer
writes at the crash.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpuwatch.config import TPU_APIS
from tpuwatch.errors import UsageError
from tpuwatch.journal import Journal
from tpuwatch.policy import Phase
from tpuwatch.spec import OWNER_LABEL

JOB = "demo"
CRASH_WORKER = 0  # the worker that saves: its crash loses the steps since the last save
APIS = TPU_APIS  # `tpuwatch demo --api`, as `[tpu] api` names them
API_TPU, API_COMPUTE = APIS


@dataclass(frozen=True)
class Pace:
    """Every duration of one demo run. Simulated durations run `speed` times faster."""

    name: str
    speed: float  # simulator speed: simulated seconds per real second
    step_time: float  # trainer seconds per step
    ckpt_every: int  # trainer steps per checkpoint
    gap: int  # steps of progress before each scripted disruption
    poll_interval: float  # seconds between ticks
    heal_after: float  # simulated seconds a healing maintenance takes
    repair_timeout: float  # seconds tpuwatch waits for a repair before recreating
    stockout: float  # simulated seconds with no capacity after the preemption
    min_uptime: float
    backoff_base: float
    backoff_max: float
    deadline: float  # seconds: past this, stop and report what did not recover

    def at_step(self, index: int) -> int:
        """Checkpoint step at or past which scripted disruption `index` (0-based) is played."""
        return self.gap * (index + 1)

    @property
    def crash_step(self) -> int:
        # Past the third disruption's resume point, between two checkpoints so steps are lost.
        return self.gap * 3 + self.gap + self.ckpt_every // 2

    @property
    def steps(self) -> int:
        return self.crash_step + self.gap


# A person can follow NORMAL on the dashboard; FAST is for tests and the impatient.
NORMAL = Pace("normal", speed=300.0, step_time=0.1, ckpt_every=10, gap=30, poll_interval=1.0,
              heal_after=1800.0, repair_timeout=8.0, stockout=1800.0, min_uptime=1.0,
              backoff_base=1.0, backoff_max=3.0, deadline=170.0)
FAST = Pace("fast", speed=1200.0, step_time=0.03, ckpt_every=10, gap=20, poll_interval=0.3,
            heal_after=1800.0, repair_timeout=1.5, stockout=2400.0, min_uptime=0.5,
            backoff_base=0.3, backoff_max=1.0, deadline=60.0)


@dataclass(frozen=True)
class Act:
    """One disruption of the story."""

    key: str  # what the stage injects: maintenance, stuck, autoheal, host-error, preemption, crash, lost, back
    title: str  # the summary's row name
    expect: str  # what tpuwatch should do about it, said when it is played
    # False: the act stops no training (a lost slice coming back); the job trains on until
    # tpuwatch stops it, so its steps lost are counted from that stop, not from the act
    stops: bool = True


def _crash(pace: Pace) -> Act:
    return Act("crash", "crash (segfault)",
               f"worker {CRASH_WORKER} segfaults at step {pace.crash_step} (a transient bug); tpuwatch "
               "should stop the other workers, charge one restart and relaunch")


class Stage(ABC):
    """Where the story plays: the slice the simulator makes, its [tpu] table, and how each act
    is injected into it."""

    api: str
    name: str
    accelerator: str

    @abstractmethod
    def acts(self, pace: Pace) -> tuple[Act, ...]: ...

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def make(self, sim: Any) -> None: ...

    @abstractmethod
    def tpu_table(self, project: str, zone: str) -> str:
        """The config's [tpu] table, as `tpuwatch init` would write it for this slice."""

    @abstractmethod
    def ready(self, sim: Any) -> bool: ...

    @abstractmethod
    def vms(self, sim: Any) -> set[str]:
        """The slice's Compute Engine instances now (none for a TPU node)."""

    @abstractmethod
    def concerns(self, entry: Any, vms: set[str]) -> bool:
        """An audit entry about this slice (`vms`: its instances when the act was played)."""

    @abstractmethod
    def inject(self, sim: Any, act: Act, pace: Pace) -> None: ...

    # What only the multislice stories change; the four-disruption stages keep these defaults.
    limps = False  # the job may run on fewer slices; the summary says what that cost
    swaps = False  # the job has a hot spare; the summary says what the swap did

    def steps(self, pace: Pace) -> int:
        """The trainer's total steps."""
        return pace.steps

    def job_lines(self) -> str:
        """Lines the config's [job] table gets besides the command and checkpoint_dir."""
        return ""

    def plot(self, acts: tuple[Act, ...]) -> str:
        """What the opening line says follows."""
        return f"{len(acts)} disruptions follow, each detected and recovered by tpuwatch"

    def ready_for(self, sim: Any, act: Act) -> bool:
        """The slice is as `act` needs it to be played."""
        return self.ready(sim)

    def holds(self, pace: Pace) -> tuple[int, ...]:
        """Steps the trainer holds at (after their checkpoint) until the director lets it past."""
        return ()

    def release(self, step: int, pace: Pace, played: list[Played], journal: Journal) -> bool:
        """The story has got far enough for the trainer to go past its hold at `step`."""
        return True


class TpuNode(Stage):
    """The story on a spot v4-32 node of the Cloud TPU API (four workers)."""

    api = API_TPU
    name = "demo-pod"
    accelerator = "v4-32"

    def acts(self, pace: Pace) -> tuple[Act, ...]:
        heal = pace.heal_after / pace.speed
        stock = pace.stockout / pace.speed
        return (
            Act("maintenance", "maintenance, heals",
                f"the TPU goes into maintenance and heals in {heal:g}s; tpuwatch should wait for it "
                "and resume from the last checkpoint, charging nothing"),
            Act("stuck", "maintenance, never heals",
                f"maintenance that never ends; after repair_timeout ({pace.repair_timeout:g}s) "
                "tpuwatch should delete the TPU, create it from the saved spec and resume"),
            Act("preemption", "spot preemption+stockout",
                f"the spot TPU is preempted and the zone has no capacity for {stock:g}s; tpuwatch "
                "should recreate it, queueing until capacity returns"),
            _crash(pace),
        )

    def describe(self) -> str:
        return f"a simulated {self.accelerator} spot TPU {self.name!r} (4 workers)"

    def make(self, sim: Any) -> None:
        sim.create_node(self.name, self.accelerator, spot=True, labels={OWNER_LABEL: JOB})

    def tpu_table(self, project: str, zone: str) -> str:
        return f"""\
[tpu]
name = {json.dumps(self.name)}
project = {json.dumps(project)}
zone = {json.dumps(zone)}

[tpu.spec]
accelerator_type = {json.dumps(self.accelerator)}
runtime_version = "tpu-ubuntu2204-base"
spot = true
labels = {{ {OWNER_LABEL} = {json.dumps(JOB)} }}
"""

    def ready(self, sim: Any) -> bool:
        node = sim.world.node(self.name)
        return bool(node.state == "READY" and node.health == "HEALTHY")

    def vms(self, sim: Any) -> set[str]:
        return set()

    def concerns(self, entry: Any, vms: set[str]) -> bool:
        return bool(entry.node == self.name)

    def inject(self, sim: Any, act: Act, pace: Pace) -> None:
        if act.key == "maintenance":
            sim.inject("maintenance", node=self.name, heal_after=pace.heal_after)
        elif act.key == "stuck":
            sim.inject("maintenance", node=self.name, stuck="REPAIRING")
        elif act.key == "preemption":
            sim.inject("stockout", duration=pace.stockout)
            sim.inject("preempt", node=self.name)


class ComputeMig(Stage):
    """The story on a TPU7x multi-host slice made through Compute Engine: a MIG of four Spot VMs
    whose workload policy names the 2x2x4 topology."""

    api = API_COMPUTE
    name = "demo-slice"
    accelerator = "tpu7x-standard-4t"  # the machine type: four chips a VM
    topology = "2x2x4"  # 16 chips: four VMs

    def acts(self, pace: Pace) -> tuple[Act, ...]:
        stock = pace.stockout / pace.speed
        return (
            Act("autoheal", "MIG autoheal",
                "a VM fails the MIG's health check and the MIG's autoheal recreates the whole slice "
                "(a multi-host slice is replaced as a whole: new VMs, same names); tpuwatch should wait "
                "for the MIG, delete nothing and resume from the last checkpoint, charging nothing"),
            Act("host-error", "host error, Spot VM",
                "a VM's host fails and the whole slice stops; Compute Engine restarts no Spot VM "
                "(automatic restart is off for Spot), so tpuwatch should recreate the slice's VMs "
                "through the MIG (recreateInstances; the MIG keeps its template and workload policy) "
                "and resume"),
            Act("preemption", "spot preemption+stockout",
                f"a Spot VM of the slice is preempted and the zone has no capacity for {stock:g}s; "
                "tpuwatch should recreate the slice's VMs through the MIG, which keeps trying to make "
                "them until capacity returns"),
            _crash(pace),
        )

    def describe(self) -> str:
        return (f"a simulated TPU7x multi-host slice made through Compute Engine, MIG {self.name!r} of "
                f"4 Spot VMs ({self.accelerator}, topology {self.topology}), set to do nothing on a VM's "
                "failure (defaultActionOnFailure DO_NOTHING)")

    def make(self, sim: Any) -> None:
        # DO_NOTHING: the MIG leaves a failed or preempted VM to tpuwatch (with REPAIR, the
        # default, it recreates a preempted Spot VM itself, and tpuwatch waits for it)
        sim.world.add_mig(self.name, self.accelerator, 4, topology=self.topology, spot=True,
                          labels={OWNER_LABEL: JOB}, on_failure="DO_NOTHING")

    def tpu_table(self, project: str, zone: str) -> str:
        # The MIG is never deleted (its VMs are recreated in it), so no saved spec is needed.
        return f"""\
[tpu]
api = "compute"
mig = {json.dumps(self.name)}
project = {json.dumps(project)}
zone = {json.dumps(zone)}
"""

    def ready(self, sim: Any) -> bool:
        return bool(sim.world.mig_is_stable(sim.world.mig(self.name)))

    def vms(self, sim: Any) -> set[str]:
        return set(sim.world.mig(self.name).members)

    def concerns(self, entry: Any, vms: set[str]) -> bool:
        return bool(entry.instance in vms)

    def inject(self, sim: Any, act: Act, pace: Pace) -> None:
        vms = sorted(self.vms(sim))
        if act.key == "autoheal":
            sim.inject("mig-autoheal", mig=self.name, instance=vms[2])
        elif act.key == "host-error":
            sim.inject("host-error", instance=vms[1])
        elif act.key == "preemption":
            sim.inject("stockout", duration=pace.stockout)
            sim.inject("preempt-instance", instance=vms[0])


class Multislice(Stage):
    """The limp: one job over four v4-8 slices of the Cloud TPU API created one by one (a worker
    each), with job.min_slices = 3. One slice goes into maintenance that lasts; the director
    heals it once the job has trained on the three left."""

    api = API_TPU
    name = "demo-ms"  # the job's name for its slices
    accelerator = "v4-8"
    slices = ("demo-0", "demo-1", "demo-2", "demo-3")
    lost = "demo-1"  # not slice 0: its first worker saves the checkpoints
    min_slices = 3
    limps = True

    def acts(self, pace: Pace) -> tuple[Act, ...]:
        n, k = len(self.slices), self.min_slices
        return (
            Act("lost", f"slice lost: limp on {k}",
                f"slice {self.lost} goes into maintenance that lasts; tpuwatch should stop the job on the "
                f"other {k} and relaunch it on them at once from the last checkpoint (job.min_slices {k}), "
                "charging nothing"),
            Act("back", f"slice back: grow to {n}",
                f"{self.lost} is READY+HEALTHY again; tpuwatch should let the job train on to its next "
                f"checkpoint, then relaunch it on all {n} slices from it, charging nothing", stops=False),
        )

    def describe(self) -> str:
        return (f"{len(self.slices)} simulated {self.accelerator} TPUs {', '.join(self.slices)} created one by "
                f"one (a worker each): one multislice job over them (job.min_slices = {self.min_slices})")

    def plot(self, acts: tuple[Act, ...]) -> str:
        return (f"{self.lost} is lost and comes back: tpuwatch should limp the job on {self.min_slices} "
                f"slices, then grow it back onto {len(self.slices)}")

    def steps(self, pace: Pace) -> int:
        return pace.at_step(4)

    # A loaded machine can slow the ticks more than the trainer, so the trainer holds at three
    # steps until the story has got there, and the story plays the same however slow the
    # machine; on time, the director lets it past before it gets there. The first hold, one
    # step short of the checkpoint after the loss, also stalls the job on all slices without
    # saving once one is lost, as a real multislice job stalls in its collectives (the toy
    # trainer would train on).
    def holds(self, pace: Pace) -> tuple[int, ...]:
        return self._stall(pace), pace.at_step(2), pace.at_step(3)

    @staticmethod
    def _stall(pace: Pace) -> int:
        return pace.at_step(0) + pace.ckpt_every - 1

    def release(self, step: int, pace: Pace, played: list[Played], journal: Journal) -> bool:
        # The return is due at a checkpoint past the first hold: saved on the slices left.
        at = {p.act.key: p.fault_at for p in played}
        if step == self._stall(pace):  # the job on all slices: until it runs on the slices left
            return relaunched_after(journal, at.get("lost"))
        if step == pace.at_step(2):  # on the slices left: until tpuwatch has seen the slice back
            if "back" not in at:
                return False
            mem = journal.load_memory()
            # it grows at a checkpoint past the one it saw then, so the job must go on to it
            return (mem is not None and mem.limp.back_since is not None) or relaunched_after(journal, at["back"])
        return relaunched_after(journal, at.get("back"))  # until it has grown back onto every slice

    def job_lines(self) -> str:
        return f"min_slices = {self.min_slices}\n"

    def make(self, sim: Any) -> None:
        for name in self.slices:
            sim.create_node(name, self.accelerator, labels={OWNER_LABEL: JOB})

    def tpu_table(self, project: str, zone: str) -> str:
        # Slices created one by one: `names` without `queued_resource`, never deleted or created.
        return f"""\
[tpu]
name = {json.dumps(self.name)}
names = {json.dumps(list(self.slices))}
project = {json.dumps(project)}
zone = {json.dumps(zone)}
"""

    def _usable(self, sim: Any, names: tuple[str, ...]) -> bool:
        nodes = [sim.world.node(n) for n in names]
        return all(n.state == "READY" and n.health == "HEALTHY" for n in nodes)

    def ready(self, sim: Any) -> bool:
        return self._usable(sim, self.slices)

    def ready_for(self, sim: Any, act: Act) -> bool:
        # The return is played while the lost slice is still down: the others must be up.
        return self._usable(sim, tuple(n for n in self.slices if n != self.lost)) if act.key == "back" \
            else self.ready(sim)

    def vms(self, sim: Any) -> set[str]:
        return set()

    def concerns(self, entry: Any, vms: set[str]) -> bool:
        return bool(entry.node == self.lost)

    def inject(self, sim: Any, act: Act, pace: Pace) -> None:
        if act.key == "lost":
            sim.inject("maintenance", node=self.lost, stuck="REPAIRING")
        elif act.key == "back":
            sim.inject("heal", node=self.lost)


class Spared(Multislice):
    """The swap: one job over four spot v4-8 slices of the Cloud TPU API created one by one and
    a spare of their shape ([tpu] spares), with [tpu.spec] to make a dead spare again from. A
    slice is preempted; tpuwatch swaps the spare into its place at once, and deletes and creates
    the preempted slice again in the background, as the job's spare from then on."""

    name = "demo-ms"
    spare = "demo-4"
    limps = False
    swaps = True

    def acts(self, pace: Pace) -> tuple[Act, ...]:
        return (
            Act("preempt", "slice preempted: spare in",
                f"spot slice {self.lost} is preempted; tpuwatch should swap spare {self.spare} into its place "
                f"(slice id {self.slices.index(self.lost)}) at once and relaunch the job there from the last "
                f"checkpoint, charging nothing, then delete {self.lost} and create it again from [tpu.spec] "
                "in the background, as the job's spare"),
        )

    def describe(self) -> str:
        return (f"{len(self.slices)} simulated spot {self.accelerator} TPUs {', '.join(self.slices)} created one by "
                f"one (a worker each) and a spare of their shape, {self.spare}: one multislice job over the "
                f"{len(self.slices)} ([tpu] spares = [{self.spare!r}])")

    def plot(self, acts: tuple[Act, ...]) -> str:
        return (f"{self.lost} is preempted: tpuwatch should swap {self.spare} in at once and make {self.lost} "
                "again as the new spare")

    # The first hold stalls the job on all slices without saving once one is lost, as a real
    # multislice job stalls in its collectives (the toy trainer would train on); the second
    # waits for the preempted slice to be made again and fit to stand in, so the story shows it
    # before the job ends however slow the machine.
    def holds(self, pace: Pace) -> tuple[int, ...]:
        return self._stall(pace), pace.at_step(2)

    def release(self, step: int, pace: Pace, played: list[Played], journal: Journal) -> bool:
        at = {p.act.key: p.fault_at for p in played}
        if step == self._stall(pace):
            return relaunched_after(journal, at.get("preempt"))
        # until tpuwatch says the preempted slice, made again, can stand in for a slice
        return "preempt" in at and any(e.kind == "spare_back" and e.data.get("node") == self.lost
                                       for e in journal.events())

    def job_lines(self) -> str:
        return ""

    def make(self, sim: Any) -> None:
        for name in (*self.slices, self.spare):
            sim.create_node(name, self.accelerator, spot=True, labels={OWNER_LABEL: JOB})

    def tpu_table(self, project: str, zone: str) -> str:
        # Slices created one by one are never deleted or created; the idle spare is, from [tpu.spec].
        return f"""\
[tpu]
name = {json.dumps(self.name)}
names = {json.dumps(list(self.slices))}
spares = {json.dumps([self.spare])}
project = {json.dumps(project)}
zone = {json.dumps(zone)}

[tpu.spec]
accelerator_type = {json.dumps(self.accelerator)}
runtime_version = "tpu-ubuntu2204-base"
spot = true
labels = {{ {OWNER_LABEL} = {json.dumps(JOB)} }}
"""

    def ready(self, sim: Any) -> bool:
        return self._usable(sim, (*self.slices, self.spare))

    def ready_for(self, sim: Any, act: Act) -> bool:
        return self.ready(sim)

    def inject(self, sim: Any, act: Act, pace: Pace) -> None:
        if act.key == "preempt":
            sim.inject("preempt", node=self.lost)


STAGES: dict[str, type[Stage]] = {API_TPU: TpuNode, API_COMPUTE: ComputeMig}


def stage_for(api: str, limp: bool = False, spare: bool = False) -> Stage:
    """The stage `--api` (and `--limp` or `--spare`) name."""
    if limp and spare:
        raise UsageError("--limp and --spare are two stories; pick one (drop --limp or --spare)")
    if spare:
        if api != API_TPU:
            raise UsageError(f"--spare: spares stand in for slices of the Cloud TPU API created one by one; "
                             f"drop --api {api} (or --spare)")
        return Spared()
    if limp:
        if api != API_TPU:
            raise UsageError(f"--limp: the limping story plays on slices of the Cloud TPU API created one by one; "
                             f"drop --api {api} (or --limp)")
        return Multislice()
    try:
        return STAGES[api]()
    except KeyError:
        raise UsageError(f"--api: {api!r} is not one of {', '.join(APIS)}") from None


def story(pace: Pace, api: str = API_TPU, limp: bool = False, spare: bool = False) -> tuple[Act, ...]:
    return stage_for(api, limp, spare).acts(pace)


@dataclass(frozen=True)
class Played:
    """A disruption that happened: when, and where the journal stood just before it."""

    act: Act
    fault_at: datetime  # the fault's own time: its audit entry, or the trainer's crash marker
    mark: int  # the id of the journal's last event before the fault (0: none)
    step: int | None = None  # the step the job was at, when known exactly (the crash)


def checkpoint_times(ckpt_dir: Path) -> dict[int, datetime]:
    """step -> commit time of every complete checkpoint (Orbax `_CHECKPOINT_METADATA`)."""
    out: dict[int, datetime] = {}
    try:
        entries = [e for e in os.scandir(ckpt_dir) if e.name.isdigit() and e.is_dir()]
    except OSError:
        return out
    for e in entries:
        path = Path(e.path)
        t: datetime | None = None
        try:
            meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
            ns = meta.get("commit_timestamp_nsecs")
            if isinstance(ns, int):
                t = datetime.fromtimestamp(ns / 1e9, timezone.utc)
        except (OSError, ValueError):
            pass
        if t is None:
            try:
                t = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
            except OSError:
                continue
        out[int(e.name)] = t
    return out


def hold_dir_for(ckpt_dir: Path) -> Path:
    """Where the director lets the trainer past a hold (the file <step>), beside the checkpoints."""
    return ckpt_dir.parent / "go"


def relaunched_after(journal: Journal, t: datetime | None) -> bool:
    """An attempt of the job started after `t` (None: not yet)."""
    return t is not None and any(a.start > t for a in journal.attempts())


class Director:
    """Plays the story: call `poll` often (between ticks); it injects each act when due."""

    def __init__(self, sim: Any, pace: Pace, ckpt_dir: Path, crash_marker: Path,
                 say: Callable[[str], None], stage: Stage) -> None:
        self.sim = sim
        self.hold_dir = hold_dir_for(ckpt_dir)
        self.pace = pace
        self.ckpt_dir = ckpt_dir
        self.crash_marker = crash_marker
        self.say = say
        self.stage = stage
        self.acts = stage.acts(pace)
        self.played: list[Played] = []
        self._scripted = [a for a in self.acts if a.key != "crash"]

    def poll(self, journal: Journal) -> None:
        self._notice_crash(journal)
        self._release(journal)
        done = [p.act.key for p in self.played]
        todo = [a for a in self._scripted if a.key not in done]
        if not todo:
            return
        index = self._scripted.index(todo[0])
        ckpts = checkpoint_times(self.ckpt_dir)
        due = [t for s, t in ckpts.items() if s >= self.pace.at_step(index)]
        # Half a checkpoint interval after the save, so the fault lands between two saves and
        # the job has steps to lose, as a real one usually does.
        half = self.pace.ckpt_every * self.pace.step_time / 2
        if not due or (datetime.now(timezone.utc) - min(due)).total_seconds() < half:
            return
        if not self._settled(journal, todo[0]):
            return
        self._play(todo[0], journal)

    def _settled(self, journal: Journal, act: Act) -> bool:
        """The slice is fine, the job runs, and the last disruption's job was relaunched."""
        if not self.stage.ready_for(self.sim, act):
            return False
        mem = journal.load_memory()
        if mem is None or mem.phase is not Phase.RUNNING:
            return False
        if self.played:
            last = self.played[-1].fault_at
            if not any(a.start > last for a in journal.attempts()):
                return False
        return True

    def _play(self, act: Act, journal: Journal) -> None:
        mark = _last_event_id(journal)
        seen = len(self.sim.world.audit_entries())
        vms = self.stage.vms(self.sim)
        try:
            self.stage.inject(self.sim, act, self.pace)
        except UsageError as exc:  # the slice changed under us (the simulator's own clock): later
            self.say(f"could not play {act.title} yet: {exc.message}")
            return
        self.say(f"disruption {self._number(act)}/{len(self.acts)}: {act.title}: {act.expect}")
        entries = [e for e in self.sim.world.audit_entries()[seen:] if self.stage.concerns(e, vms)]
        t = (datetime.fromtimestamp(entries[0].time_ns / 1e9, timezone.utc) if entries
             else datetime.now(timezone.utc))
        self.played.append(Played(act, t, mark))

    def _notice_crash(self, journal: Journal) -> None:
        if any(p.act.key == "crash" for p in self.played) or not any(a.key == "crash" for a in self.acts):
            return
        try:
            mtime = self.crash_marker.stat().st_mtime
        except OSError:
            return
        t = datetime.fromtimestamp(mtime, timezone.utc)
        act = next(a for a in self.acts if a.key == "crash")
        # The tick may already have reacted before this poll: mark where the journal stood
        # before the crash, not now.
        mark = _last_event_id(journal, before=t)
        self.played.append(Played(act, t, mark, step=self.pace.crash_step))
        self.say(f"disruption {self._number(act)}/{len(self.acts)}: {act.title}: {act.expect}")

    def _release(self, journal: Journal) -> None:
        """Let the trainer past each of the stage's holds once the story has got there, in order."""
        for step in self.stage.holds(self.pace):
            go = self.hold_dir / str(step)
            if go.exists():
                continue
            if not self.stage.release(step, self.pace, self.played, journal):
                return
            go.parent.mkdir(parents=True, exist_ok=True)
            go.touch()

    def _number(self, act: Act) -> int:
        return self.acts.index(act) + 1


def _last_event_id(journal: Journal, before: datetime | None = None) -> int:
    events = journal.events()
    if before is not None:
        events = [e for e in events if e.time < before]
    return events[-1].id if events else 0
