"""Chaos: `tpuwatch watch` of a Compute Engine job with hot spares SIGKILLed at seeded moments of
a swap onto a spare and of the making again of what was swapped out, and started again.

A job on Spot instance <job> with spare instances (`tpu.instance` + `tpu.spares`, and the
[tpu.compute_spec] `tpuwatch init` captures): the instance the job runs on is preempted again and
again, so the job moves to the spare and back, and the instance swapped out is made again under
its own name in the background (its termination action STOP: tpuwatch's `instances.delete` then
`instances.insert`; DELETE: Google deletes it and, on the audit log's word, tpuwatch inserts it).
A second spare a person deletes is never inserted again. The watcher is killed between a
preemption and the relaunch on the spare ("swap") and while the lost instance is made again
("remake").

The invariants are read from the world (tests/chaos/harness.py): never two trainers on one VM,
never two attempts alive at once (sampled all along), every attempt resumed from the newest
complete checkpoint, nothing charged, the job done on an instance it owns that its journal binds
it to, and only the preempted instances deleted (each once) and inserted (each once).

The same for a job on a MIG with a spare MIG (`tpu.mig` + `tpu.spares`): a VM of the MIG the job
runs on is preempted, the job moves onto the other MIG, and the MIG swapped off is recreated in
place (one recreateInstances, never a delete or an insert). The old attempt is stopped on the
swapped-off MIG's VM still running before the launch on the spare: never two attempts at once.
TPUWATCH_CHAOS_SEED changes the kill moments.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_process
import pytest
import tomli_w
from chaos.harness import Watched

from tpuwatch.errors import NotFoundError, UsageError
from tpuwatch.policy import Memory
from tpuwatch.sim.cerecords import ComputeOpRec
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("TPUWATCH_CHAOS_SEED", "9"))
# kill points each test must land: between a preemption and the relaunch on a spare, and while
# the instance swapped out is made again (>= 20 in all)
SWAP_KILLS = 8
REMAKE_KILLS = 12


class OnInstances(Watched):
    """A job on Compute Engine instance `name` with spare instances <name>-s0.., Spot VMs of
    termination action `action`; the last spare (STOP) is the one a person deletes."""

    def __init__(self, sim: Simulator, tmp: Path, name: str, *, compute_url: str, action: str, **kw: Any) -> None:
        self.action = action
        self.spec: dict[str, Any] | None = None
        super().__init__(sim, tmp, name, env={"TPUWATCH_COMPUTE_EMULATOR": compute_url.rstrip("/")}, spot=True,
                         **kw)

    def make_nodes(self, labels: dict[str, str]) -> None:
        for name in (*self.names, *self.spares):
            action = "STOP" if name == self.spares[-1] else self.action
            self.sim.world.add_instance(name, body={"labels": labels, "scheduling": {
                "provisioningModel": "SPOT", "instanceTerminationAction": action}})

    def capture_spec(self) -> None:
        """[tpu.compute_spec] as `tpuwatch init <instance>` captures it, in the config from now on."""
        init = cli_process.run(["init", self.name, "-o", str(self.cfg.with_suffix(".init")), "--json"], self.env)
        assert init.returncode == 0, init.stderr
        self.spec = json.loads(init.stdout)["spec"]
        self.set_steps(self.steps)

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        super().set_steps(steps, hold_at)
        text = self.cfg.read_text().replace("[tpu]\n", f'[tpu]\napi = "compute"\ninstance = "{self.name}"\n', 1)
        if self.spec is not None:
            text += tomli_w.dumps({"tpu": {"compute_spec": self.spec}})
        tmp = self.cfg.with_suffix(".ce")
        tmp.write_text(text)
        tmp.replace(self.cfg)

    def running_with_progress(self, timeout: float = 30) -> None:
        before = (self.steps_done() or [0])[-1]
        self.wait(lambda: self.workers_running() == 1 and (self.steps_done() or [0])[-1] > before,
                  timeout, "the job running with a new checkpoint")

    def assert_nodes(self) -> None:
        """The job's instance and its spares (the person-deleted one aside) each one RUNNING VM
        labelled the job's; the job bound to one of them."""
        for name in (self.name, *self.spares):
            found = [r for r in self.sim.world.instances() if r.name == name]
            if name == self.spares[-1]:
                assert found == [], found  # a person deleted it: never inserted again
                continue
            assert len(found) == 1 and found[0].status == "RUNNING", [(r.name, r.status) for r in found]
            assert found[0].labels.get("tpuwatch-job") == self.name, found[0].labels

    def memory(self) -> Memory | None:
        try:
            with self.journal() as j:
                return j.load_memory()
        except NotFoundError:
            return None

    def on(self) -> set[str]:
        """The instances a trainer of the job runs on now (a worker's marker ends "<instance>/<index>")."""
        return {w.split("/")[-2] for w in self.sampler.trainers()}

    def newest(self) -> int:
        return max((a for procs in self.sampler.trainers().values() for _, a in procs), default=0)

    def runs_newer(self, attempt: int) -> bool:
        return any(a > attempt for procs in self.sampler.trainers().values() for _, a in procs)


class OneInstance(OnInstances):
    """A job on Spot instance `name` (termination action `action`) with no spares of its own,
    whose instance may change hands (taken by another job, claimed from a spare pool)."""

    def make_nodes(self, labels: dict[str, str]) -> None:
        self.sim.world.add_instance(self.name, body={"labels": labels, "scheduling": {
            "provisioningModel": "SPOT", "instanceTerminationAction": self.action}})

    def assert_nodes(self) -> None:
        """The job ends on one RUNNING instance labelled its own (its own, or another's)."""
        [vm] = [r for r in self.sim.world.instances() if r.labels.get("tpuwatch-job") == self.name]
        assert vm.status == "RUNNING" and self.on() <= {vm.name}, (vm.name, vm.status, self.on())


def labels(sim: Simulator, name: str) -> dict[str, str]:
    """Instance `name`'s labels; {} while it is gone (deleted to be inserted again)."""
    try:
        return dict(sim.world.instance(name).labels)
    except UsageError:
        return {}


def vm_id(sim: Simulator, name: str) -> int | None:
    """Instance `name`'s id; None while it is gone."""
    try:
        return sim.world.instance(name).id
    except UsageError:
        return None


def done_ops(ops: list[ComputeOpRec]) -> dict[str, Counter[str]]:
    """Of Compute Engine operations, the deletes and inserts that succeeded, by instance name."""
    return {verb: Counter(o.target.rsplit("/", 1)[-1] for o in ops if o.op_type == verb and not o.errors)
            for verb in ("delete", "insert")}


def remade(job: OnInstances, name: str, old: int) -> bool:
    """Instance `name` is there again, another VM than `old`, RUNNING, and the journal has seen so
    (nothing left to make again)."""
    found = [r for r in job.sim.world.instances() if r.name == name]
    if not (len(found) == 1 and found[0].id != old and found[0].status == "RUNNING"):
        return False
    mem = job.memory()
    return mem is not None and name not in mem.limp.remaking and name not in mem.limp.away


def kill_in(job: OnInstances, since: float, lo: float, hi: float, stage: str, done: Callable[[], bool]) -> bool:
    """Kill at a seeded moment lo..hi s after `since`, counted in `stage`, unless what the stage
    leads to is `done` first; False then (no kill)."""
    return job.kill_unless(since, lo, hi, done, stage) is not None


@pytest.mark.parametrize("action", ["STOP", "DELETE"])
def test_kills_while_an_instance_job_swaps_onto_a_spare_and_its_lost_instance_is_made_again(
        tmp_path: Path, action: str) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim, RestFace(sim.world) as rest:
        # room for kills inside them: a delete, an insert and Google's deletion about 0.5 s each
        sim.world.delays.update(delete=300.0, create=300.0, stop=300.0)
        job = OnInstances(sim, tmp_path, "cevm", compute_url=rest.url, action=action,
                          seed=SEED * 53 + (1 if action == "STOP" else 2), spares=2)
        gone = job.spares[-1]
        try:
            job.capture_spec()
            job.start()
            job.running_with_progress()
            sim.world.delete_instance(sim.project, sim.zone, gone)  # a person's instances.delete
            cycles, final = 0, False
            preempted: Counter[str] = Counter()
            while True:
                if Counter(k.phase for k in job.kills)["swap"] >= SWAP_KILLS and \
                        Counter(k.phase for k in job.kills)["remake"] >= REMAKE_KILLS:
                    end, final = job.hold_end(), True
                job.wait(lambda: time.monotonic() - job.started_at > 1.2, what="the watcher up")
                before = job.newest()
                [lost] = job.on()
                spare = next(n for n in (job.name, *job.spares) if n not in (lost, gone))
                old = sim.world.instance(lost).id
                sim.world.preempt_instance(lost)
                preempted[lost] += 1
                since = time.monotonic()
                moved = lambda b=before, s=spare: job.runs_newer(b) and job.on() == {s}  # noqa: E731
                for _ in range(0 if final else 2):
                    if not kill_in(job, since, 0.0, 0.6, "swap", moved):
                        break
                    since = job.started_at
                job.wait(moved, timeout=60, what=f"the job's next attempt on spare {spare}")
                mem = job.memory()
                assert mem is not None and mem.limp.node_of(job.name) == spare, (spare, mem and mem.limp)
                since = time.monotonic()
                back = lambda n=lost, o=old: remade(job, n, o)  # noqa: E731
                for _ in range(0 if final else 2):
                    if not kill_in(job, since, 0.0, 1.5, "remake", back):
                        break
                    since = job.started_at
                job.wait(back, timeout=60, what=f"{lost} made again")
                if final:
                    job.release(end - 100)
                assert job.on() == {spare}  # the job stays where it runs
                cycles += 1
                if final:
                    break
                job.running_with_progress()
            rc = job.finish()
            result = job.assert_invariants(rc)
        finally:
            job.close()
        kills = Counter(k.phase for k in job.kills)
        print(f"\ncompute instance chaos ({action}, seed {SEED}): {cycles} cycles, kills {dict(kills)}, watcher "
              f"started {job.starts} times; {job.sampler.samples} samples\n  "
              + ", ".join(f"{k.phase}@{k.delay:.2f}s/{k.journal_phase}" for k in job.kills))
        assert kills["swap"] >= SWAP_KILLS and kills["remake"] >= REMAKE_KILLS, kills
        assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        assert len(result["attempts"]) >= cycles + 1, (cycles, result["attempts"])
        mem = job.memory()
        assert mem is not None and mem.limp.node_of(job.name) == spare, (spare, mem and mem.limp)
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # only the preempted instances deleted (by tpuwatch when they stop, by Google when it
        # deletes them) and inserted again, each once per preemption, whatever the kills; never the
        # one a person deleted
        ops = sim.world.list_compute_operations(sim.project, f"zones/{sim.zone}")
        by = done_ops(ops)
        person = Counter({gone: 1})
        shown = [(o.op_type, o.target.rsplit("/", 1)[-1], o.target_id, o.insert_ns, o.errors) for o in ops
                 if o.op_type in ("delete", "insert")]
        assert by["delete"] == (preempted if action == "STOP" else Counter()) + person, (by, preempted, shown)
        assert by["insert"] == preempted, (by, preempted)


# kill points of the MIG test (>= 12 in all): its spare MIGs are made again in place, one
# recreateInstances, so there is less to kill in
MIG_SWAP_KILLS = 6
MIG_REMAKE_KILLS = 6


class OnMigs(OnInstances):
    """A job on Compute Engine MIG `name` of 2 Spot VMs (DO_NOTHING: a preempted VM stays
    TERMINATED) with spare MIGs <name>-s0.. of its shape, all from templates that only set the VMs
    up (the watcher starts the job)."""

    def __init__(self, sim: Simulator, tmp: Path, name: str, *, compute_url: str, **kw: Any) -> None:
        super().__init__(sim, tmp, name, compute_url=compute_url, action="STOP", **kw)

    def make_nodes(self, labels: dict[str, str]) -> None:
        for name in (*self.names, *self.spares):
            self.sim.world.add_mig(name, "tpu7x-standard-4t", 2, spot=True, labels=labels,
                                   metadata={"tpuwatch-launch": "false"}, on_failure="DO_NOTHING")

    def set_steps(self, steps: int, hold_at: int = 0) -> None:
        Watched.set_steps(self, steps, hold_at)
        text = self.cfg.read_text().replace("[tpu]\n", f'[tpu]\napi = "compute"\nmig = "{self.name}"\n', 1)
        tmp = self.cfg.with_suffix(".ce")
        tmp.write_text(text)
        tmp.replace(self.cfg)

    def vms(self, mig: str) -> dict[str, int]:
        """MIG `mig`'s instances: name -> id."""
        names = set(self.sim.world.mig(mig).members)
        return {r.name: r.id for r in self.sim.world.instances() if r.name in names}

    def running_with_progress(self, timeout: float = 30) -> None:
        before = (self.steps_done() or [0])[-1]
        self.wait(lambda: self.workers_running() == 2 and (self.steps_done() or [0])[-1] > before,
                  timeout, "the job running with a new checkpoint")

    def on(self) -> set[str]:
        """The MIGs a trainer of the job runs on now."""
        vms = {w.split("/")[-2] for w in self.sampler.trainers()}
        return {m for m in (*self.names, *self.spares) if vms & set(self.sim.world.mig(m).members)}

    def assert_nodes(self) -> None:
        for mig in (*self.names, *self.spares):
            vms = [r for r in self.sim.world.instances() if r.name in set(self.sim.world.mig(mig).members)]
            assert len(vms) == 2 and all(r.status == "RUNNING" for r in vms), [(r.name, r.status) for r in vms]
            assert all(r.labels.get("tpuwatch-job") == self.name for r in vms), [r.labels for r in vms]


def mig_remade(job: OnMigs, mig: str, old: dict[str, int]) -> bool:
    """Every VM of MIG `mig` made again (another id), RUNNING, and the journal has seen so."""
    now = job.vms(mig)
    if set(now) != set(old) or any(now[n] == old[n] for n in old):
        return False
    if not all(r.status == "RUNNING" for r in job.sim.world.instances() if r.name in now):
        return False
    mem = job.memory()
    return mem is not None and mig not in mem.limp.remaking and mig not in mem.limp.away


def test_kills_while_a_mig_job_swaps_onto_a_spare_mig_and_its_lost_mig_is_recreated_in_place(tmp_path: Path) -> None:
    with Simulator(root=tmp_path / "sim", speed=600, seed=SEED) as sim, RestFace(sim.world) as rest:
        sim.world.delays.update(delete=300.0, create=300.0, stop=300.0)  # a recreate about 1 s
        job = OnMigs(sim, tmp_path, "cemig", compute_url=rest.url, seed=SEED * 53 + 3, spares=1)
        try:
            job.start()
            job.running_with_progress()
            cycles, final, preempted = 0, False, 0
            while True:
                kills = Counter(k.phase for k in job.kills)
                if kills["swap"] >= MIG_SWAP_KILLS and kills["remake"] >= MIG_REMAKE_KILLS:
                    end, final = job.hold_end(), True
                job.wait(lambda: time.monotonic() - job.started_at > 1.2, what="the watcher up")
                before = job.newest()
                [lost] = job.on()
                spare = next(m for m in (job.name, *job.spares) if m != lost)
                old = job.vms(lost)
                sim.world.preempt_instance(job.rng.choice(sorted(old)))
                preempted += 1
                since = time.monotonic()
                moved = lambda b=before, s=spare: job.runs_newer(b) and job.on() == {s}  # noqa: E731
                for _ in range(0 if final else 2):
                    if not kill_in(job, since, 0.0, 0.6, "swap", moved):
                        break
                    since = job.started_at
                job.wait(moved, timeout=60, what=f"the job's next attempt on spare MIG {spare}")
                mem = job.memory()
                assert mem is not None and mem.limp.node_of(job.name) == spare, (spare, mem and mem.limp)
                since = time.monotonic()
                back = lambda m=lost, o=old: mig_remade(job, m, o)  # noqa: E731
                for _ in range(0 if final else 2):
                    if not kill_in(job, since, 0.0, 1.2, "remake", back):
                        break
                    since = job.started_at
                job.wait(back, timeout=60, what=f"MIG {lost} recreated in place")
                if final:
                    job.release(end - 100)
                assert job.on() == {spare}  # the job stays where it runs
                cycles += 1
                if final:
                    break
                job.running_with_progress()
            rc = job.finish()
            result = job.assert_invariants(rc)
        finally:
            job.close()
        kills = Counter(k.phase for k in job.kills)
        print(f"\ncompute MIG chaos (seed {SEED}): {cycles} cycles, kills {dict(kills)}, watcher started {job.starts} "
              f"times; {job.sampler.samples} samples\n  "
              + ", ".join(f"{k.phase}@{k.delay:.2f}s/{k.journal_phase}" for k in job.kills))
        assert kills["swap"] >= MIG_SWAP_KILLS and kills["remake"] >= MIG_REMAKE_KILLS, kills
        assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        assert len(result["attempts"]) >= cycles + 1, (cycles, result["attempts"])
        mem = job.memory()
        assert mem is not None and mem.limp.node_of(job.name) == spare, (spare, mem and mem.limp)
        assert sim.world.scheduler_errors == [] and sim.world.host_errors == []
        # each lost MIG recreated in place once, whatever the kills; no VM deleted nor inserted, no MIG deleted
        calls = {m.rsplit("/", 1)[-1]: n for m, n in sim.world.calls.items() if m.startswith("compute.")}
        assert calls.get("RecreateInstances", 0) == preempted, calls
        assert not any(calls.get(v) for v in ("Delete", "Insert", "Resize")), calls
