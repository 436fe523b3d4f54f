"""From a config file to a ready job: resolved project/zone, policy config, real adapters.

The commands that act on a job (`check`, `watch`, `history`, `recreate`) start here, so flags,
config and environment are resolved the same way everywhere. Nothing here decides anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.cloud.apis import SharedLists, api_for
from tpuwatch.cloud.base import Doors, Due, SliceReader, ZoneSharing
from tpuwatch.cloud.location import Location, resolve
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.config import Config, load_config
from tpuwatch.policy import PolicyConfig
from tpuwatch.policy.signatures import log_signatures, worker_patterns
from tpuwatch.ports import CheckpointStore, JobPorts


@dataclass(frozen=True)
class Job:
    cfg: Config
    location: Location
    pcfg: PolicyConfig

    @property
    def name(self) -> str:
        return self.cfg.job_name


def load_job(config_path: str | Path, project: str | None = None, zone: str | None = None, *,
             require_command: bool = True) -> Job:
    """Config file + flags -> Job; UsageError/ConfigError (exit 2) naming what is wrong.
    `require_command=False`: a config with no [job] command (what recreates the TPU only)."""
    cfg = load_config(config_path, require_command=require_command)
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None  # resolve() raises when no zone is found
    return Job(cfg=cfg, location=loc, pcfg=PolicyConfig.from_config(cfg, zone=loc.zone))


@dataclass(frozen=True)
class Sharing:
    """What the jobs of one watcher share (`watch` with several configs): each API's lists per
    zone (one list per zone per poll: the TPU API's nodes, Compute Engine's instances and MIGs),
    and the audit-log cache's directory per project."""

    lists: SharedLists
    due: Due  # this job's: when its current tick was due
    slack: float  # seconds a zone listing may have begun before the tick was due
    audit_dir: Path  # the shared audit-log cache's directory for this job's project
    audit_reader: AuditLogReader  # the query itself, one per project and zone (one Logging client)


def slice_reader(cfg: Config, project: str, *, as_is: bool = False) -> Callable[[str], SliceReader]:
    """Zone -> the adapter that reads the job's slice there (its [tpu] api's), one per zone: the
    commands that only read it (`status`, `events`, `precheck`, `run`) get the node, its host
    keys and instance names from the same adapter, which knows a MIG's instances from its last get.
    `as_is`: the slice as `status` shows it (CloudApi.reader)."""
    adapters: dict[str, SliceReader] = {}
    api = api_for(cfg)

    def reader(zone: str) -> SliceReader:
        if zone not in adapters:
            adapters[zone] = api.reader(cfg, project, zone, as_is=as_is)
        return adapters[zone]

    return reader


def real_ports(job: Job, sharing: Sharing | None = None, *, sleep: Callable[[float], None] = time.sleep,
               ssh: bool = True) -> JobPorts:
    """The real adapters: the job's cloud API (cloud/apis.py), google-cloud-logging (shared per project), OpenSSH/gcloud, checkpoints.

    `sleep`: the wait between ticks (a watcher of several jobs cuts it short when it stops one).
    `ssh=False`: the ticks will not log in (a recreate with no attempt to stop), so the SSH key is
    not required."""
    from tpuwatch.checkpoints import CheckpointDir, WorkerCheckpoints
    from tpuwatch.cloud.auditcache import SharedAuditLog
    from tpuwatch.workers.ssh import port_open
    from tpuwatch.workers.sshworkers import SshWorkers

    cfg, loc = job.cfg, job.location
    api = api_for(cfg)
    doors: Doors = api.doors(cfg, loc.project, None if sharing is None else
                             ZoneSharing(sharing.lists.of(api), sharing.due, sharing.slack))

    ckpt_dir = cfg.job["checkpoint_dir"]
    checkpoints: CheckpointStore | None = None
    on_vm: WorkerCheckpoints | None = None
    if job.pcfg.checkpoints_on_vm:
        # A local path is on the TPU VM: read it there, in the first worker's probe.
        checkpoints = on_vm = WorkerCheckpoints(ckpt_dir, cfg.job["checkpoint_layout"])
    elif ckpt_dir:
        checkpoints = CheckpointDir(ckpt_dir, cfg.job["checkpoint_layout"])

    # the workers' host keys as their guest attributes publish them: the known hosts
    workers = SshWorkers.from_config(cfg, host_keys=doors.host_keys, instances=doors.instances,
                                     checkpoint_dir=on_vm.root if on_vm is not None else "",
                                     on_listing=on_vm.feed if on_vm is not None else None,
                                     log_patterns=worker_patterns(log_signatures(cfg.recovery["log_signatures"])))
    if ssh:
        workers.transport.check()  # an unreadable key is exit 2 before any cloud call
    from tpuwatch.workers.precheck import Prechecker

    return JobPorts(
        tpu_for=doors.tpu_for,
        workers=workers,
        checkpoints=checkpoints,
        # One audit-log query per project per 15 s, shared by every watcher using this state dir
        # (the Logging read quota is 60/min/project). Its warnings reach the tick's report.
        audit=SharedAuditLog(loc.project, cfg.state_dir, zone=loc.zone) if sharing is None else
        SharedAuditLog(loc.project, sharing.audit_dir, zone=loc.zone, direct=sharing.audit_reader),
        precheck=Prechecker.from_config(cfg, workers) if cfg.precheck["enabled"] else None,
        lifecycle_for=doors.lifecycle_for,
        port_open=port_open,
        sleep=sleep,
    )
