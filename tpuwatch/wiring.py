"""From a config file to a ready job: resolved project/zone, policy config, real adapters.

The commands that act on a job (`check`, `watch`, `history`, `recreate`) start here, so flags,
config and environment are resolved the same way everywhere. Nothing here decides anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuwatch.cloud.compute.zoneinstances import SharedCompute
from tpuwatch.cloud.location import Location, resolve
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.cloud.tpu.zonenodes import Due, SharedTpu
from tpuwatch.config import Config, load_config
from tpuwatch.model import NodeSnapshot
from tpuwatch.policy import PolicyConfig
from tpuwatch.policy.signatures import log_signatures, worker_patterns
from tpuwatch.ports import CheckpointStore, JobPorts, NodeLifecycle, TpuApi

if TYPE_CHECKING:
    from tpuwatch.cloud.compute.adapter import ComputeAdapter, Kind, Reads
    from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle
    from tpuwatch.cloud.tpu.adapter import TpuAdapter


@dataclass(frozen=True)
class Job:
    cfg: Config
    location: Location
    pcfg: PolicyConfig

    @property
    def name(self) -> str:
        return self.cfg.job_name


def load_job(config_path: str | Path, project: str | None = None, zone: str | None = None) -> Job:
    """Config file + flags -> Job; UsageError/ConfigError (exit 2) naming what is wrong."""
    cfg = load_config(config_path, require_command=True)
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None  # resolve() raises when no zone is found
    return Job(cfg=cfg, location=loc, pcfg=PolicyConfig.from_config(cfg, zone=loc.zone))


@dataclass(frozen=True)
class Sharing:
    """What the jobs of one watcher share (`watch` with several configs): the TPU API per zone
    and Compute Engine's instances and MIGs per zone (one list per zone per poll), and the
    audit-log cache's directory per project."""

    tpu: SharedTpu
    compute: SharedCompute
    due: Due  # this job's: when its current tick was due
    slack: float  # seconds a zone listing may have begun before the tick was due
    audit_dir: Path  # the shared audit-log cache's directory for this job's project
    audit_reader: AuditLogReader  # the query itself, one per project and zone (one Logging client)


# A job's doors to its slice: TPU API per zone, lifecycle per zone, host keys, instance names
ComputePorts = tuple[Callable[[str], TpuApi], Callable[[str], NodeLifecycle],
                     Callable[[NodeSnapshot], Mapping[int, tuple[str, ...]]], Callable[[NodeSnapshot], tuple[str, ...]]]


def compute_ports(job: Job, sharing: Sharing | None = None) -> ComputePorts:
    """A Compute Engine slice's doors: the adapter per zone, its lifecycle, and the host keys and
    instance names the workers' transport needs. Alone, a tick reads the slice with one get of
    the instance, or three requests for a MIG; with `sharing`, from the zone's instances (and
    MIG) lists shared by the watcher's jobs, plus listManagedInstances for a MIG
    (cloud/compute/zoneinstances.py)."""
    cfg, loc = job.cfg, job.location
    adapters: dict[str, ComputeAdapter] = {}

    def adapter(zone: str) -> ComputeAdapter:
        if zone not in adapters:
            reads = (sharing.compute.zone(loc.project, zone).job(sharing.due, slack=sharing.slack)
                     if sharing is not None else None)
            adapters[zone] = compute_adapter(cfg, loc.project, zone, reads=reads)
        return adapters[zone]

    def lifecycle(zone: str) -> NodeLifecycle:
        return compute_lifecycle(cfg, adapter(zone))

    def host_keys(node: NodeSnapshot) -> Mapping[int, tuple[str, ...]]:
        return adapter(node.zone).host_keys(node.name)

    def instances(node: NodeSnapshot) -> tuple[str, ...]:
        return adapter(node.zone).instance_names(node)

    return adapter, lifecycle, host_keys, instances


def compute_kind(cfg: Config) -> Kind:
    """What names a Compute Engine job's slice: an instance, or a MIG (config checks one is set)."""
    return "instance" if cfg.tpu["instance"] else "mig"


def compute_adapter(cfg: Config, project: str, zone: str, *, reads: Reads | None = None) -> ComputeAdapter:
    """The Compute Engine adapter of a job whose slice was made through Compute Engine; `reads`:
    the zone's shared lists in a watcher of several jobs (direct reads without)."""
    from tpuwatch.cloud.compute.adapter import ComputeAdapter

    return ComputeAdapter(project, zone, compute_kind(cfg), flex_start=float(cfg.tpu["flex_start"]), reads=reads)


def compute_lifecycle(cfg: Config, adapter: ComputeAdapter) -> ComputeLifecycle:
    """Delete and create of the job's instance or MIG through `adapter`."""
    from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle

    return ComputeLifecycle(adapter, mig=cfg.tpu["mig"], size=flex_size(cfg))


def slice_reader(cfg: Config, project: str) -> Callable[[str], TpuAdapter | ComputeAdapter]:
    """Zone -> the adapter that reads the job's slice there ([tpu] api: the TPU API, or Compute
    Engine), one per zone: the commands that only read it (`status`, `events`, `precheck`,
    `run`) get the node, its host keys and instance names from the same adapter, which knows a
    MIG's instances from its last get."""
    from tpuwatch.cloud.tpu.adapter import TpuAdapter

    adapters: dict[str, TpuAdapter | ComputeAdapter] = {}

    def reader(zone: str) -> TpuAdapter | ComputeAdapter:
        if zone not in adapters:
            adapters[zone] = (compute_adapter(cfg, project, zone) if cfg.tpu["api"] == "compute"
                              else TpuAdapter(project, zone))
        return adapters[zone]

    return reader


def flex_size(cfg: Config) -> int:
    """The VMs each resize request of a flex-start MIG asks for: the MIG's size as `init` saw it
    running (config checks it is set when tpu.flex_start is)."""
    mig = (cfg.tpu.get("compute_spec") or {}).get("mig") or {}
    return int(mig.get("targetSize") or 0)


def real_ports(job: Job, sharing: Sharing | None = None, *, sleep: Callable[[float], None] = time.sleep) -> JobPorts:
    """The real adapters: google-cloud-tpu, google-cloud-logging (shared per project), OpenSSH/gcloud, checkpoints.

    `sleep`: the wait between ticks (a watcher of several jobs cuts it short when it stops one)."""
    from tpuwatch.checkpoints import CheckpointDir, WorkerCheckpoints
    from tpuwatch.cloud.auditcache import SharedAuditLog
    from tpuwatch.cloud.tpu.adapter import TpuAdapter
    from tpuwatch.cloud.tpu.lifecycle import Lifecycle
    from tpuwatch.cloud.tpu.zonenodes import JobNodes
    from tpuwatch.workers.ssh import port_open
    from tpuwatch.workers.sshworkers import SshWorkers

    cfg, loc = job.cfg, job.location
    adapters: dict[str, TpuAdapter] = {}
    views: dict[str, JobNodes] = {}

    def adapter_for(zone: str) -> TpuAdapter:
        if sharing is not None:
            return sharing.tpu.adapter(loc.project, zone)
        if zone not in adapters:
            adapters[zone] = TpuAdapter(loc.project, zone)
        return adapters[zone]

    def tpu_for(zone: str) -> TpuApi:
        if sharing is None:
            return adapter_for(zone)
        if zone not in views:
            views[zone] = JobNodes(sharing.tpu.zone(loc.project, zone), sharing.due, slack=sharing.slack)
        return views[zone]

    def lifecycle_for(zone: str) -> NodeLifecycle:
        return Lifecycle(adapter_for(zone), str(cfg.tpu["queued_resource"]), tuple(cfg.tpu["names"]))

    def host_keys(node: NodeSnapshot) -> Mapping[int, tuple[str, ...]]:
        return adapter_for(node.zone).host_keys(node.name)

    def instances(node: NodeSnapshot) -> tuple[str, ...]:
        return adapter_for(node.zone).instance_names(node)

    doors: ComputePorts = (tpu_for, lifecycle_for, host_keys, instances)
    if cfg.tpu["api"] == "compute":
        doors = compute_ports(job, sharing)

    ckpt_dir = cfg.job["checkpoint_dir"]
    checkpoints: CheckpointStore | None = None
    on_vm: WorkerCheckpoints | None = None
    if ckpt_dir and not ckpt_dir.startswith("gs://"):
        # A local path is on the TPU VM: read it there, in the first worker's probe.
        checkpoints = on_vm = WorkerCheckpoints(ckpt_dir, cfg.job["checkpoint_layout"])
    elif ckpt_dir:
        checkpoints = CheckpointDir(ckpt_dir, cfg.job["checkpoint_layout"])

    # the workers' host keys as their guest attributes publish them: the known hosts
    workers = SshWorkers.from_config(cfg, host_keys=doors[2], instances=doors[3],
                                     checkpoint_dir=on_vm.root if on_vm is not None else "",
                                     on_listing=on_vm.feed if on_vm is not None else None,
                                     log_patterns=worker_patterns(log_signatures(cfg.recovery["log_signatures"])))
    workers.transport.check()  # an unreadable key is exit 2 before any cloud call
    from tpuwatch.workers.precheck import Prechecker

    return JobPorts(
        tpu_for=doors[0],
        workers=workers,
        checkpoints=checkpoints,
        # One audit-log query per project per 15 s, shared by every watcher using this state dir
        # (the Logging read quota is 60/min/project). Its warnings reach the tick's report.
        audit=SharedAuditLog(loc.project, cfg.state_dir, zone=loc.zone) if sharing is None else
        SharedAuditLog(loc.project, sharing.audit_dir, zone=loc.zone, direct=sharing.audit_reader),
        precheck=Prechecker.from_config(cfg, workers) if cfg.precheck["enabled"] else None,
        lifecycle_for=doors[1],
        port_open=port_open,
        sleep=sleep,
    )
