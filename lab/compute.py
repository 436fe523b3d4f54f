"""The goodput benchmark's Compute Engine model: the job's slice as a multi-host MIG of TPU VMs.

The BenchWorld's slice stays the one simulated slice (its hosts, the job, the checkpoints, the
trace's faults); this module is how Compute Engine shows it and acts on it
(docs/benchmarks.md, "Compute Engine"):

- `MigModel`: the MIG (TPU7x-shaped, one instance per worker, a workload policy's topology)
  over the slice. What each fault of the trace is on Compute Engine: a healing "maintenance"
  is a host error the slice is recovered from as a whole (STANDARD: the instances TERMINATED,
  then restarted by Compute Engine, same ids; SPOT, which has no automatic restart: the MIG's
  autoheal recreates them all, new ids); a "stuck" one a MIG that never gets them back; a
  preemption (SPOT) TERMINATED instances that only recreateInstances cures. `recreate()` is
  recreateInstances: the whole slice deleted and made again, the MIG trying again through a
  stockout by itself until capacity returns.
- `BenchCompute`: `tpuwatch.cloud.compute.ComputeAdapter` with its three requests replaced by
  compute_v1 messages built from the model, so that the product's own `mig_snapshot` maps
  them to the node the policy sees, and the product's `ComputeLifecycle` acts through it.
- `BenchComputeAudit`: the Compute Engine system events of the slice's instances, matched to
  the job by the product's own `logs.event_of`.
- the baselines: the bash loop around `gcloud compute ssh`, and that loop beside a script that
  recreates a preempted Spot MIG as Google's Spot page says; and `compute_tools`, the registry.

Nothing here decides for tpuwatch: its policy and tick run unchanged (tools.TpuwatchDriver).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lab.bounds import ideal
from lab.clock import Process
from lab.fakeports import PROJECT, ZONE, at
from lab.tools import JOB, Run, Tool, TpuwatchDriver, describe
from lab.world import OK, BenchWorld, Meter
from tpuwatch.cloud.compute import ComputeAdapter
from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle
from tpuwatch.cloud.errors import ApiError, Call
from tpuwatch.cloud.logs import RawEntry, event_of, to_ns
from tpuwatch.config import Config, validate
from tpuwatch.model import AuditEvent, OperationStatus
from tpuwatch.ports import JobPorts
from tpuwatch.spec import OWNER_LABEL

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Provisioning = Literal["spot", "standard"]
MACHINE = "tpu7x-standard-4t"  # 4 chips a VM: 4 VMs are a 2x2x4 TPU7x slice
TEMPLATE = "llm-pod-template"  # the MIG's instance template (the job's owner label among its labels)
# A MIG tries a failed create again by itself; how soon is not documented (assumed).
MIG_RETRY = 30.0
STOCKOUT = ("ZONE_RESOURCE_POOL_EXHAUSTED",
            "The zone 'projects/bench-project/zones/us-central2-b' does not have enough resources available "
            "to fulfill the request.")


@dataclass
class View:
    """The MIG as listManagedInstances and instances.list show it now."""

    statuses: list[str]  # Instance.status per instance made (none while not made)
    action: str  # every managed instance's currentAction (a multi-host slice acts as a whole)
    stable: bool
    errors: list[tuple[str, str]] = field(default_factory=list)  # lastAttempt.errors
    gen: int = 0  # incarnation of the instances (their ids change with it)


class MigModel:
    """The slice as a Compute Engine MIG, and its recreateInstances (see the module's docstring)."""

    def __init__(self, run: Run, provisioning: Provisioning) -> None:
        self.run = run
        self.world: BenchWorld = run.world
        self.spot = provisioning == "spot"
        self.recreating = False  # a recreateInstances is under way
        self.error: tuple[str, str] | None = None  # its last failed create
        self._ops = itertools.count(1)

    @property
    def name(self) -> str:
        return self.world.slices[0].name

    def instances(self) -> list[str]:
        return [f"{self.name}-{k:04x}" for k in range(self.world.p.workers)]

    def view(self) -> View:
        w = self.world
        sl = w.slices[0]
        node = sl.node
        n = w.p.workers
        errors = [self.error] if self.error is not None and self.recreating else []
        acting = "RECREATING" if self.recreating else "CREATING"
        if node is None:
            return View([], acting, False, errors)
        gen = sum(1 for r in w.audit if r.node_id == node.id and r.kind == "restart") if self.spot else 0
        if node.state == "DELETING":
            return View(["STOPPING"] * n, "RECREATING" if self.recreating else "DELETING", False, errors, gen)
        if node.state == "CREATING":
            return View(["PROVISIONING"] * n, acting, False, errors, gen)
        if node.state == "PREEMPTED":  # a Spot VM's STOP: TERMINATED for good
            return View(["TERMINATED"] * n, "NONE", False, [], gen)
        if sl.maintenance:
            if self.spot:  # no automatic restart: the MIG's autoheal recreates the slice as a whole
                return View(["STOPPING"] * n, "RECREATING", False, [], gen)
            return View(["TERMINATED"] * n, "NONE", False, [], gen)  # Compute Engine restarts it
        if node.state == "READY" and sl.hosts_up:
            return View(["RUNNING"] * n, "NONE", True, [], gen)
        return View(["STAGING"] * n, "NONE", False, [], gen)

    def all_running(self) -> bool:
        v = self.view()
        return len(v.statuses) == self.world.p.workers and all(s == "RUNNING" for s in v.statuses)

    def preempted(self) -> bool:
        """An instance is a Spot VM TERMINATED with no action on it (what a script can see)."""
        v = self.view()
        return self.spot and v.action == "NONE" and "TERMINATED" in v.statuses

    # -- recreateInstances ---------------------------------------------------------------------

    def recreate(self) -> str:
        """recreateInstances of every instance: the operation (done at once, as the service's is:
        the MIG then acts); one already under way goes on."""
        if not self.recreating:
            self.recreating, self.error = True, None
            self.run.sim.spawn(self._recreate(), "mig-recreate")
        return f"operation-recreate-{next(self._ops)}"

    def _recreate(self) -> Process:
        w = self.world
        op = w.delete_node(0)
        if op is not None:
            yield op.sig
        while w.slices[0].node is None:
            done = yield w.create_node(0).sig
            if done.error_code == OK:
                break
            self.error = STOCKOUT
            yield MIG_RETRY
        self.recreating, self.error = False, None


# ---------------------------------------------------------------------------------------------
# what the product reads: compute_v1 messages through its own mapping


class BenchCompute(ComputeAdapter):
    """ComputeAdapter of the job's MIG with its requests answered from the MigModel: the product's
    own `get_node` (and so `mig_snapshot`), `recreate_mig` through the product's lifecycle. Each
    request counts one Compute Engine call in the Meter (the `tpu` column: the slice's API)."""

    def __init__(self, mig: MigModel, meter: Meter, job: str) -> None:
        super().__init__(PROJECT, ZONE, "mig")
        self.mig = mig
        self.meter = meter
        self.job = job
        self._key: Any = None
        self._parts: tuple[Any, list[Any], list[Any]] | None = None

    def _messages(self) -> tuple[Any, list[Any], list[Any]]:
        from google.cloud import compute_v1

        mig, w = self.mig, self.mig.world
        v = mig.view()
        node = w.slices[0].node
        up = w.upcoming
        key = (v.statuses, v.action, v.stable, v.errors, v.gen, node.id if node else None,
               (up.status, up.start) if up is not None else None)
        if key == self._key and self._parts is not None:
            return self._parts
        where = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}"
        names = mig.instances()
        managed = []
        for k, name in enumerate(names):
            m = compute_v1.ManagedInstance(instance=f"{where}/instances/{name}", name=name, current_action=v.action)
            if k < len(v.statuses):
                m.instance_status = v.statuses[k]
            if v.errors:
                m.last_attempt = compute_v1.ManagedInstanceLastAttempt(errors=compute_v1.ManagedInstanceLastAttemptErrors(
                    errors=[compute_v1.Errors(code=c, message=t) for c, t in v.errors]))
            managed.append(m)
        sched = compute_v1.Scheduling(provisioning_model="SPOT" if mig.spot else "STANDARD",
                                      automatic_restart=not mig.spot, on_host_maintenance="TERMINATE",
                                      instance_termination_action="STOP" if mig.spot else "")
        instances = []
        for k, status in enumerate(v.statuses):
            inst = compute_v1.Instance(
                name=names[k], id=(node.id if node else 0) * 10_000 + v.gen * 10 + k, status=status,
                machine_type=f"{where}/machineTypes/{MACHINE}", labels={OWNER_LABEL: self.job},
                creation_timestamp=at(node.created if node else 0.0).isoformat(), scheduling=sched,
                network_interfaces=[compute_v1.NetworkInterface(network_i_p=f"10.0.0.{k + 2}")])
            if up is not None and k == 0:  # upcomingMaintenance of the host announced
                inst.resource_status = compute_v1.ResourceStatus(upcoming_maintenance=compute_v1.UpcomingMaintenance(
                    type_=up.type, maintenance_status=up.status, can_reschedule=up.can_reschedule and up.status == "PENDING",
                    window_start_time=at(up.start).isoformat(), window_end_time=at(up.start + 3600.0).isoformat(),
                    latest_window_start_time=at(up.start).isoformat()))
            instances.append(inst)
        group = compute_v1.InstanceGroupManager(
            name=mig.name, target_size=w.p.workers, base_instance_name=mig.name,
            instance_template=f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/instanceTemplates/{TEMPLATE}",
            status=compute_v1.InstanceGroupManagerStatus(is_stable=v.stable),
            # the model's MIG never repairs a preempted Spot VM by itself (only recreateInstances
            # cures it): Google's MIG does so with defaultActionOnFailure DO_NOTHING
            instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
                default_action_on_failure="DO_NOTHING"))
        self._key, self._parts = key, (group, managed, instances)
        return self._parts

    def mig_parts(self, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        self.meter.tpu += 3  # instanceGroupManagers.get, listManagedInstances, instances.list
        return self._messages() if name == self.mig.name else None

    def managed_instances(self, name: str) -> list[Any]:
        self.meter.tpu += 1
        return self._messages()[1] if name == self.mig.name else []

    def list_instances(self, names: Iterable[str] | None = None) -> list[Any]:
        self.meter.tpu += 1
        return self._messages()[2]

    def get_template(self, url: str) -> Any | None:
        from google.cloud import compute_v1

        self.meter.tpu += 1
        return compute_v1.InstanceTemplate(name=TEMPLATE, properties=compute_v1.InstanceProperties(
            machine_type=MACHINE, labels={OWNER_LABEL: self.job})) if url.endswith(f"/{TEMPLATE}") else None

    def host_keys(self, name: str) -> dict[int, tuple[str, ...]]:
        return {}

    def recreate_mig(self, name: str) -> str:
        self.managed_instances(name)
        self.meter.tpu += 1
        return self.mig.recreate()

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        self.meter.tpu += 1
        call = Call("Compute Engine API", "insert_mig", f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{name}",
                    "compute.instanceGroupManagers.create", "compute.googleapis.com")
        raise ApiError(f"{call}: ALREADY_EXISTS: MIG {name} already exists", call=call, code="ALREADY_EXISTS")

    def get_operation(self, name: str) -> OperationStatus:
        self.meter.tpu += 1
        return OperationStatus(name, True, 0, "")


class BenchComputeAudit:
    """The system-event audit log (tpuwatch.ports.AuditLog) as Compute Engine writes it for the
    slice's instances, one entry per instance, matched by the product's `logs.event_of`."""

    def __init__(self, mig: MigModel, meter: Meter) -> None:
        self.mig = mig
        self.meter = meter

    def _method(self, kind: str, reason: str) -> str:
        if kind == "restart":
            return "compute.instances.repair.recreateInstance" if self.mig.spot else "compute.instances.automaticRestart"
        return "compute.instances.preempted" if reason == "PREEMPTED" else "compute.instances.hostError"

    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        self.meter.log += 1
        recs, end = self.mig.world.audit_since(int(cursor) if cursor else 0)
        wanted = list(nodes)
        out = []
        for r in recs:
            for name in self.mig.instances():
                raw = RawEntry(to_ns(at(r.time)), f"{r.time:.3f}-{r.kind}-{name}", self._method(r.kind, r.reason),
                               f"projects/{PROJECT}/zones/{ZONE}/instances/{name}", None, "")
                ev = event_of(raw, wanted, ZONE, instances)
                if ev is not None:
                    out.append(ev)
        return out, str(end)

    def take_warnings(self) -> list[str]:
        return []


def mig_of(run: Run, provisioning: Provisioning) -> MigModel:
    """The run's MIG (one per run, shared by every process of the tool)."""
    mig = run.extra.get("mig")
    if not isinstance(mig, MigModel):
        mig = run.extra["mig"] = MigModel(run, provisioning)
    return mig


class ComputeDriver(TpuwatchDriver):
    """tpuwatch's watch loop (TpuwatchDriver) with the MIG's Compute Engine ports."""

    def __init__(self, run: Run, cfg: Config, provisioning: Provisioning, skip_idle: bool = True) -> None:
        super().__init__(run, cfg, skip_idle)
        self.mig = mig_of(run, provisioning)

    def ports(self) -> JobPorts:
        base = super().ports()
        api = BenchCompute(self.mig, self.meter, self.pcfg.job)
        life = ComputeLifecycle(api)
        return replace(base, tpu_for=lambda zone: api, lifecycle_for=lambda zone: life,
                       audit=BenchComputeAudit(self.mig, self.meter))


def compute_toml(*, mig: str = "llm-pod", **recovery: Any) -> str:
    """A tpuwatch.toml for the benchmark's job on a Compute Engine MIG (`[tpu] api = "compute"`)."""
    from lab.tools import _toml

    lines = [
        "[tpu]", 'api = "compute"', f"mig = {_toml(mig)}", f'project = "{PROJECT}"', f'zone = "{ZONE}"',
        "[job]", f'name = "{JOB}"', 'command = "cd ~/repo && python3 train.py --resume={checkpoint}"',
        'checkpoint_dir = "gs://bench/ckpt"',
        "[recovery]", *(f"{k} = {_toml(v)}" for k, v in recovery.items() if v is not None),
    ]
    return "\n".join(lines) + "\n"


def compute_config(**recovery: Any) -> Config:
    """A real Config from `compute_toml(...)`, validated by the product's own schema."""
    return Config(values=validate(tomllib.loads(compute_toml(**recovery))), path=None)


# ---------------------------------------------------------------------------------------------
# the baselines on Compute Engine


def gcloud_compute_ssh(run: Run, mig: MigModel, attempt: Any) -> Process:
    """`gcloud compute ssh VM --command "python3 train.py" &` for every VM of the slice, then `wait`:
    each gcloud reads its instance first (one call each) and fails when it is not RUNNING (no
    external IP to reach); gcloud compute ssh does not retry a dropped connection."""
    w, m = run.world, run.meter
    m.tpu += w.p.workers
    yield w.p.gcloud_overhead
    if not mig.all_running():
        return 1
    m.ssh += w.p.workers
    a = w.launch(attempt())
    if a is None:
        return 1
    rc = yield a.end_sig
    return int(rc)


def compute_bash_loop(run: Run, mig: MigModel) -> Process:
    """`while ! (for vm in $VMS; do gcloud compute ssh $vm --command "python3 train.py" & done; wait);
    do sleep 1; done`: reruns forever, never recreates."""
    nxt = itertools.count(1).__next__
    w, sim = run.world, run.sim
    period = w.p.gcloud_overhead + 1.0
    while True:
        rc = yield from gcloud_compute_ssh(run, mig, nxt)
        if rc == 0:
            w.give_up("job done")
            return
        if mig.all_running():
            yield 1.0
            continue
        # refused: it spins (one call per VM a try) until something changes
        t0 = sim.now
        yield sim.any_of(w.changed, max(0.0, w.p.horizon - sim.now))
        k = max(0, math.ceil((sim.now - t0) / period) - 1)
        run.meter.tpu += k * w.p.workers
        nxt_t = t0 + (k + 1) * period - w.p.gcloud_overhead
        if nxt_t > sim.now:
            yield nxt_t - sim.now


def spot_recreate(run: Run, mig: MigModel) -> Process:
    """A script following Google's Spot TPU page: every 30 s `gcloud compute instance-groups managed
    list-instances`; a Spot instance TERMINATED -> `recreate-instances` of all of them, then
    `wait-until --stable`. Training is rerun by the bash loop beside it."""
    w, m = run.world, run.meter
    while True:
        yield 30.0
        m.tpu += 1
        if mig.preempted():
            m.tpu += 1
            yield w.p.gcloud_overhead
            mig.recreate()
            while not mig.view().stable:  # wait-until --stable polls
                m.tpu += 1
                yield 10.0


def compute_tools(cfg: Config, tuned: Config, provisioning: Provisioning, skip_idle: bool = True) -> list[Tool]:
    """Every tool compared on the Compute Engine MIG, the bound first."""
    def tpuwatch(key: str, label: str, c: Config) -> Tool:
        def drive(run: Run) -> None:
            driver = ComputeDriver(run, c, provisioning, skip_idle)
            run.extra["ticks"] = [driver]
            driver.drive()

        return Tool(key, label, lambda run: [], describe(c), drive)

    def loop(run: Run) -> list[Process]:
        return [compute_bash_loop(run, mig_of(run, provisioning))]

    def loop_and_spot(run: Run) -> list[Process]:
        mig = mig_of(run, provisioning)
        return [compute_bash_loop(run, mig), spot_recreate(run, mig)]

    return [
        Tool("ideal", "ideal bound", lambda run: [ideal(run)],
             "oracle: instant detection, best of Google's repair or a recreate, stops at the bug's first failure"),
        Tool("ideal-reactive", "ideal bound without foresight",
             lambda run: [ideal(run, float(cfg.recovery["repair_timeout"]))],
             "as the oracle, but it cannot know how long Google's repair takes: recreates after repair_timeout"),
        tpuwatch("tpuwatch", "tpuwatch (defaults)", cfg),
        tpuwatch("tpuwatch-30d", "tpuwatch (tuned)", tuned),
        Tool("bash", "bash loop (gcloud compute ssh)", loop, "reruns every 1 s forever; never recreates"),
        Tool("spot-recreate", "Spot recreate script + bash loop", loop_and_spot,
             "recreateInstances when a Spot VM is TERMINATED, as Google's Spot page says; nothing else"),
    ]
