"""The policy's inputs and outputs: PolicyConfig, Observation, the actions, Decision.

Plain frozen values. The tick builds an Observation from the adapters, the policy returns a
Decision, the tick carries out its actions and the journal records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from tpuwatch import tpuconfig, zonespec
from tpuwatch.errors import ConfigError, JobFailed
from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    NodeSnapshot,
    OperationStatus,
    PrecheckReport,
    QueuedStatus,
    WorkerProbe,
)
from tpuwatch.policy.create_errors import Kind
from tpuwatch.policy.rows import ROW_BY_ID
from tpuwatch.policy.signatures import BUILTIN, LogSignature, log_signatures
from tpuwatch.policy.state import AttemptEnd, Memory, Phase

if TYPE_CHECKING:
    from tpuwatch.config import Config

CreateFailureKind = Kind  # what policy/create_errors.py makes of a failed create

# Ticks in a row the cloud API may fail (after its own retries) before the watch exits 3: an
# outage of a few polls is waited out; a wrong project or a lost permission is not.
CLOUD_FAILURES = 10


class ImpossibleObservation(JobFailed):
    """The observation contradicts the memory: a bug, or another tool acting on the same job."""

    def __init__(self, phase: Phase, evidence: str) -> None:
        super().__init__(
            f"impossible observation in phase {phase.value}: {evidence}. This is a tpuwatch bug, "
            "or another tool is acting on the same job; a person must look (tpuwatch history)"
        )
        self.phase = phase
        self.evidence = evidence


@dataclass(frozen=True)
class PolicyConfig:
    """The `[recovery]` keys and names the policy needs, in seconds and plain values."""

    job: str
    tpu_name: str  # the one node; for a multislice job, the name of its group of slices
    zones: tuple[str, ...]  # the zone, then fallback_zones, in the order creates try them
    repair_timeout: float = 1800.0
    max_restarts: int = 5
    max_recreates: int = 3
    no_progress_limit: int = 3
    min_uptime: float = 120.0
    queue_timeout: float = 86400.0
    fail_fast_exit_codes: frozenset[int] = frozenset()
    backoff_base: float = 10.0
    backoff_max: float = 300.0
    stable_run: float = 3600.0
    poll_interval: float = 30.0
    checkpoint_warn_age: float = 4500.0  # job.checkpoint_warn_age (alerts.checkpoint_stale)
    primary_worker: int = 0  # whose exit 0 means the job is done
    # One worker unreachable while the others run ends the attempt only after this long, so a
    # single dropped ssh connection does not cost a restart. Not a setting of its own: one
    # recovery.poll_interval (at least 0.05 s), so the worker gets the next tick to answer.
    unreachable_grace: float = 30.0
    # Disruption evidence excuses an end only when it is this recent (see classify.in_window).
    evidence_window: float = 1800.0
    launch_tries: int = 3  # relaunches of an attempt that left no trace before it is charged
    # A delete or create operation not done this long after tpuwatch started it fails the job.
    operation_timeout: float = 3600.0
    cloud_failures: int = CLOUD_FAILURES  # the loop's tolerance of a failing cloud API (see CLOUD_FAILURES)
    # No new checkpoint for this long while every worker runs: the job is hung (0 = never).
    hang_timeout: float = 0.0
    # hang_timeout = "auto": learned from the job's checkpoint interval, and only while the
    # workers' logs are silent too (see effective_hang_limit). hang_timeout is then 0.
    hang_auto: bool = False
    # Known runtime signatures in the workers' logs that end an attempt at once (policy/signatures.py)
    log_signatures: tuple[LogSignature, ...] = BUILTIN
    # A worker refusing the login this soon after the node booted (created, healed, a new node
    # id): the keys have not reached the VM yet, so it counts as unreachable; later, a person
    # must fix the user or key.
    login_grace: float = 300.0
    # [maintenance] start_early: start a reschedulable announced maintenance at the job's next
    # checkpoint instead of waiting for its window.
    start_early: bool = True
    # [recovery] report_faulty_hosts: a host the evidence points at is reported to the cloud for
    # repair (ReportHost); off, tpuwatch only says what a person should do.
    report_faulty_hosts: bool = False
    # A multislice job's nodes, in slice order (empty: one node, `tpu_name`; `(tpu_name,)` for a
    # job on one node with spares)
    slices: tuple[str, ...] = ()
    queued_resource: str = ""  # the queued resource that made the node (a multislice job: its slices)
    # Whether a node that will not heal can be deleted and created again: not for slices created
    # one by one (only a multislice queued resource can be made again as a whole)
    recreatable: bool = True
    # job.checkpoint_dir is a path on the TPU VM: only a look at the new node tells where to
    # resume, so a create whose checkpoint is not known sets the node up and leaves the launch
    # to the tick that probes it
    checkpoints_on_vm: bool = False
    # [job] min_slices: a multislice job may run on this many of its slices or more (0: never
    # fewer than all; policy/limp.py)
    min_slices: int = 0
    # [tpu] spares: a multislice job's idle nodes of its shape, swapped in for a lost slice
    # (policy/spares.py)
    spares: tuple[str, ...] = ()
    # [tpu.spec] (a Compute Engine job's [tpu.compute_spec.instance]) is there to make a spare again
    # from: a dead idle one is deleted and created again
    spares_remade: bool = False
    # the config table a node of the job's pool is made again from, as messages name it
    spec_table: str = "[tpu.spec]"
    # the pool's nodes are MIGs (tpu.mig): one is made again in place, by recreating its
    # instances (the MIG stays), and one gone is never inserted again
    spares_in_place: bool = False
    # [job] priority (policy/priority.py): None takes no node from another job and gives none
    priority: int | None = None
    # [tpu] spare_pool (policy/pool.py): the watcher's pool the job claims a spare from ("": none)
    spare_pool: str = ""
    # A job that limps ([job] min_slices, or has spares) over slices made one by one (tpu.names,
    # no queued resource) with [tpu.spec]: a dead slice of its own is made again alone
    slices_remade: bool = False

    def __post_init__(self) -> None:
        if not self.zones:
            raise ConfigError("tpu.zone: no zone; set it in the config, pass --zone, or set CLOUDSDK_COMPUTE_ZONE")

    @classmethod
    def from_config(cls, cfg: Config, zone: str | None = None) -> PolicyConfig:
        """From a validated Config; `zone` is the resolved zone when the file leaves it empty."""
        r = cfg.recovery
        primary = zone or str(cfg.tpu["zone"])
        zones = tuple(dict.fromkeys(z for z in (primary, *cfg.tpu["fallback_zones"]) if z))
        if primary and not cfg.tpu["zone"]:  # the zone came from flags or gcloud: check it now
            zonespec.check(cfg.tpu.get("spec") or {}, cfg.tpu.get("zone_overrides") or {}, primary,
                           cfg.tpu["fallback_zones"])
        workers = cfg.job["workers"]
        priority = None if cfg.job.get("priority", "off") == "off" else int(cfg.job["priority"])
        pooled = bool(cfg.tpu["spares"]) or priority is not None or bool(cfg.tpu["spare_pool"])
        return cls(
            job=cfg.job_name,
            tpu_name=cfg.tpu_name,
            zones=zones,
            # a job on one node with spares is a pool of one slot: its node, or a spare in its place
            # (so is one with a priority: a node it takes stands in its slot as a spare does)
            slices=cfg.slots,
            queued_resource=str(cfg.tpu["queued_resource"]),
            # a job over nodes made one by one (or a pool with spares, which makes its dead nodes
            # again itself: policy/spares.py) is never recreated by the rows
            recreatable=bool(cfg.tpu["queued_resource"]) or not (cfg.tpu["names"] or pooled),
            checkpoints_on_vm=bool(cfg.job["checkpoint_dir"]) and not str(cfg.job["checkpoint_dir"]).startswith("gs://"),
            min_slices=int(cfg.job["min_slices"]),
            spares=tuple(cfg.tpu["spares"]),
            spares_remade=pooled and bool(cfg.tpu["spec"] or (cfg.tpu["compute_spec"] or {}).get("instance")
                                          or cfg.tpu.get("mig")),
            spares_in_place=pooled and bool(cfg.tpu.get("mig")),
            spec_table=tpuconfig.spec_table(cfg.tpu),
            priority=priority,
            spare_pool=str(cfg.tpu["spare_pool"]),
            slices_remade=(bool(cfg.tpu["names"]) and not cfg.tpu["queued_resource"] and bool(cfg.tpu["spec"])
                           and bool(cfg.job["min_slices"] or cfg.tpu["spares"] or cfg.tpu["spare_pool"])),
            repair_timeout=float(r["repair_timeout"]),
            max_restarts=int(r["max_restarts"]),
            max_recreates=int(r["max_recreates"]),
            no_progress_limit=int(r["no_progress_limit"]),
            min_uptime=float(r["min_uptime"]),
            queue_timeout=float(r["queue_timeout"]),
            fail_fast_exit_codes=frozenset(r["fail_fast_exit_codes"]),
            backoff_base=float(r["backoff_base"]),
            backoff_max=float(r["backoff_max"]),
            stable_run=float(r["stable_run"]),
            poll_interval=float(r["poll_interval"]),
            checkpoint_warn_age=float(cfg.job["checkpoint_warn_age"]),
            primary_worker=0 if workers == "all" else min(workers),
            unreachable_grace=float(r["poll_interval"]),
            operation_timeout=float(r["operation_timeout"]),
            hang_timeout=0.0 if r["hang_timeout"] == "auto" else float(r["hang_timeout"]),
            hang_auto=r["hang_timeout"] == "auto",
            log_signatures=log_signatures(r["log_signatures"]),
            login_grace=float(cfg.ssh["login_grace"]),
            start_early=bool(cfg.get("maintenance.start_early")),
            report_faulty_hosts=bool(r["report_faulty_hosts"]),
        )


@dataclass(frozen=True)
class Observation:
    """What one tick saw. Everything here is re-observed on the next tick."""

    node: NodeSnapshot | None  # None: the node does not exist. A job that limps: the slices it runs on
    # A job that limps (Memory.limp.out): each slice left out, as read (None: missing), in that order
    left_out: tuple[NodeSnapshot | None, ...] = ()
    # A job with spares: each node of its pool no slot holds (Memory.limp.idle), as read (None:
    # missing), in that order
    spares: tuple[tuple[str, NodeSnapshot | None], ...] = ()
    events: tuple[AuditEvent, ...] = ()  # audit events newer than the journal's cursor
    probes: tuple[WorkerProbe, ...] | None = None  # None: the workers were not or could not be probed
    checkpoint: Checkpoint | None = None  # latest complete checkpoint
    # Status of Memory.recreate.pending_op; or, when the call that would start it was refused at once,
    # a done status with name "" and the error (the tick then calls decide again).
    operation: OperationStatus | None = None
    # When `operation` is a failed create: recreate.classify_operation(op).kind.
    create_failure: CreateFailureKind | None = None
    # And its recreate.CreateFailure reason (no_capacity, quota, reservation, ...): words only.
    create_reason: str = ""
    jitter: float = 0.5  # uniform in [0, 1), drawn by the tick: the policy's only randomness
    adopt: bool = False  # --adopt: treat the node as owned
    recreate_missing: bool = False  # --recreate-missing
    # A person asked for a delete + create now (ports.Flags.recreate: row `recreate_asked`)
    recreate_asked: bool = False
    dry_run: bool = False  # --dry-run: decide, but keep the memory as it was
    checks: bool = False  # the tick can run the workers' environment checks (precheck.enabled)
    # The environment checks of the workers (tpuwatch.workers.precheck), when this tick ran them: before
    # a launch (context "launch": the tick decides once without them, and again with them when
    # the first decision launches), or periodically while the job runs (context "running").
    precheck: PrecheckReport | None = None
    precheck_fixed: bool = False  # this tick already ran the worker cleanup for fixable items
    # The service refused this tick's StartMaintenance at the call ("CODE: message"); decide again.
    maintenance_refused: str = ""
    maintenance_refused_idle: str = ""  # the idle spare whose maintenance start was refused, if it was one's
    # The cloud refused this tick's ReportHost at the call ("CODE: message"); decide again.
    host_report_refused: str = ""
    # Nodes the job moved off whose owed stop (Memory.limp.unstopped) this tick tried and could not
    # do (a worker did not answer, or did not stop): no launch until it is done (row
    # `owed_stop_failed`); decide again.
    owed_stop_failed: tuple[str, ...] = ()
    audit_read: bool = False  # this tick read the audit log (observe.audit_due said it was due)
    # The node's queued resource ([tpu] queued_resource), read while it matters: the node is
    # missing or being deleted, or a create through it is followed. None: not read, or a plain node.
    queued: QueuedStatus | None = None
    # A job with a priority ([job] priority): the zone's nodes as listed, to find one a job of
    # lower priority holds (policy/priority.py)
    zone: tuple[NodeSnapshot, ...] = ()
    # A job of a spare pool that is the pool's keeper (it holds the pool's keeper lock in the
    # state dir): it makes the pool's dead idle spares again (policy/pool.py `keep`)
    pool_keeper: bool = False
    # The keeper's read of the pool's record in the state dir: the spares of the pool tpuwatch
    # deleted to make again (whichever job was keeper then), so a new keeper creates them
    pool_remaking: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# actions: what the tick must do, each with a one-line reason for people


@dataclass(frozen=True)
class Launch:
    """Clean up every worker (old process group, device holders, libtpu lockfile), then start."""

    attempt: int
    checkpoint: Checkpoint | None
    reason: str
    kind: ClassVar[str] = "launch"


@dataclass(frozen=True)
class StopWorkers:
    """Stop the job's process group on every worker (SIGTERM, stop_grace, SIGKILL): of the job's
    node, or of `node`.

    `blocked`: why no stop can be done in this tick (the workers cannot be reached); the tick
    then only says so. What they left is stopped when they answer again (`stale_workers`) or
    by the next launch's own cleanup. `wait`: the tick waits until the processes are gone
    (up to stop_grace, then KILL); without it the tick goes on right after the SIGTERM and the
    workers KILL what ignores it after stop_grace, so a job that ignores SIGTERM holds up
    nothing that does not need it gone (a later launch's own cleanup waits for it)."""

    reason: str
    blocked: str = ""
    wait: bool = True
    # another node of the job's pool than the one it runs on (a node it moved off: policy/owed.py)
    node: str = ""
    # the nodes whose owed stop (Memory.limp.unstopped) this stop settles once every worker it
    # reached has stopped
    settles: tuple[str, ...] = ()
    kind: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Wait:
    """Nothing to do until `until` (None: the next tick)."""

    until: datetime | None
    reason: str
    kind: ClassVar[str] = "wait"


@dataclass(frozen=True)
class DeleteNode:
    """Start deleting the node (owned, checked); journal the operation with `operation_started`."""

    name: str
    zone: str
    reason: str
    kind: ClassVar[str] = "delete"


@dataclass(frozen=True)
class CreateNode:
    """Start creating the node from the saved spec in `zone`; journal the operation.

    `startup`: what the new node's startup script (startup-scripts/resume-training.sh) is told
    through its metadata: the attempt to start at boot and its checkpoint, or not to launch.
    `resumed`: this job's own create may already stand (the journal was in CREATING), so an
    ALREADY_EXISTS answer for its node is success, not a conflict."""

    name: str
    zone: str
    reason: str
    startup: Mapping[str, str] = field(default_factory=dict)
    resumed: bool = False
    kind: ClassVar[str] = "create"


@dataclass(frozen=True)
class ClearQueued:
    """Delete the node's queued resource in `zone` if the service gave up on it (FAILED,
    SUSPENDING, SUSPENDED): it keeps the name, so it must be gone by the retry's create. Done
    after the decision is journaled; a tick killed first leaves it to that create, which
    deletes it then."""

    zone: str
    reason: str
    kind: ClassVar[str] = "clear_queued"


@dataclass(frozen=True)
class FollowOperation:
    """A cloud operation is in flight: look at it again next tick (`name` None: not yet known)."""

    name: str | None
    op: str  # "delete" or "create"
    reason: str
    kind: ClassVar[str] = "follow"


@dataclass(frozen=True)
class MarkDone:
    reason: str
    kind: ClassVar[str] = "done"


@dataclass(frozen=True)
class Fail:
    """The job failed for good (exit 1)."""

    reason: str
    evidence: tuple[str, ...] = ()
    kind: ClassVar[str] = "fail"


@dataclass(frozen=True)
class NeedsPerson:
    """A person must act (exit 1); re-checked every tick, and the job resumes once it is fixed."""

    reason: str
    evidence: tuple[str, ...] = ()
    kind: ClassVar[str] = "needs_person"


@dataclass(frozen=True)
class StartMaintenance:
    """Start the node's announced maintenance now (v2alpha1 performMaintenance, or through its
    queued resource); journaled before the call, like a delete. A refusal is fed back as
    `Observation.maintenance_refused` (and `maintenance_refused_idle`: the start of an `idle`
    spare's)."""

    name: str
    reason: str
    idle: bool = False  # an idle spare of the job's, not a node it runs on (policy/early.py `start_idle`)
    kind: ClassVar[str] = "start_maintenance"


@dataclass(frozen=True)
class ReportHost:
    """Report the host of `worker` as faulty, so the cloud repairs it (Compute Engine's
    instances.reportHostAsFaulty on that worker's instance); journaled before the call, like a
    delete. `description` goes to the cloud with it. A refusal is fed back as
    `Observation.host_report_refused`."""

    worker: int
    description: str
    reason: str
    kind: ClassVar[str] = "report_host"


@dataclass(frozen=True)
class StartNode:
    """Start the stopped node again (Compute Engine's instances.start of a VM Compute Engine
    stopped itself and will not restart); journaled before the call, owned nodes only. A refusal
    is only said: the node is then waited for, then recreated, as a repair."""

    name: str
    reason: str
    kind: ClassVar[str] = "start_node"


@dataclass(frozen=True)
class RemakeSpare:
    """Delete one of the job's idle spares that will not come back by itself (owned, checked),
    or create it again from [tpu.spec] once gone (`create`): policy/spares.py. Journaled before
    the call; a refused call is only said, and tried again later."""

    name: str
    create: bool
    reason: str
    # a spare of this spare pool, made again by the pool's keeper (policy/pool.py `keep`): deleted
    # only while it is an idle spare of the pool, created with the pool's label and no job's
    pool: str = ""
    kind: ClassVar[str] = "remake_spare"


@dataclass(frozen=True)
class Relabel:
    """Write labels on a node (policy/priority.py): `put` set, `drop` removed, the others kept;
    only while its ownership label says `owner` (read again next to the write). Journaled before
    the call; a write that changes nothing is not sent, so a repeat is harmless."""

    name: str
    owner: str
    put: tuple[tuple[str, str], ...]
    drop: tuple[str, ...]
    reason: str
    # a claim from a spare pool (policy/pool.py): only while the node carries tpuwatch-pool=<pool>
    # and no ownership label (`owner` ""), read again and written under the pool's lock
    pool: str = ""
    kind: ClassVar[str] = "relabel"


Action = (Launch | StopWorkers | Wait | DeleteNode | CreateNode | ClearQueued | FollowOperation | MarkDone | Fail
          | NeedsPerson | StartMaintenance | ReportHost | StartNode | RemakeSpare | Relabel)


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one tick."""

    actions: tuple[Action, ...]
    memory: Memory
    summary: str  # one line: what was seen and what is done
    exit_code: int  # 0: running, recovering or finished; 1: failed or needs a person
    row: str  # the id of the policy table row that decided (tpuwatch.policy.ROWS)
    ended: tuple[AttemptEnd, ...] = ()  # attempts whose end this tick classified (or re-classified)
    operation_done: str | None = None  # the pending operation this tick saw finish
    # More to observe, in this same tick (policy/settle.py: decided again, bounded):
    # check_first: it would launch, but the launch-time checks have not run; check, decide again,
    #   and do none of these actions.
    # check_after: do these actions (the cleanup of fixable items), then check and decide again.
    # probe_after: do these actions (the stop after an attempt's end), then probe the workers (with
    #   the launch-time checks) and decide again: the relaunch that is due at once, in this tick.
    # decide_again: an attempt's end whose relaunch is due at once, with nothing left to stop: do
    #   these actions and decide again from the same observation, in this tick.
    # stop_first: it would launch, and nodes the job moved off owe a stop (policy/owed.py): do
    #   those stops only (waited for), then decide again with the ones that could not be done.
    check_first: bool = False
    stop_first: bool = False
    check_after: bool = False
    probe_after: bool = False
    decide_again: bool = False
    # What to tell people though nothing is done about it: the running attempt saves no new
    # checkpoint (alerts.checkpoint_stale); journaled once per stretch (Memory.marks.checkpoint_warned)
    checkpoint_warning: str = ""

    @property
    def terminal(self) -> bool:
        """The job is over (DONE or FAILED): `watch` returns."""
        return self.memory.phase in (Phase.DONE, Phase.FAILED)

    @property
    def ends_watch(self) -> bool:
        """Watching this job stops: it is over, or it needs a person (HALTED: the watcher returns
        so a wrapper or unit sees exit 1; the next watch resumes once it is fixed)."""
        return self.terminal or self.memory.phase is Phase.HALTED

    @property
    def steady(self) -> bool:
        """All is well (the row says so): the next look may wait a whole poll_interval."""
        row = ROW_BY_ID.get(self.row)
        return row is not None and row.steady

    @property
    def deadline(self) -> datetime | None:
        """The soonest time an action named (backoff, queued retry, repair deadline), if any."""
        untils = [u for a in self.actions if isinstance(u := getattr(a, "until", None), datetime)]
        return min(untils) if untils else None

    def as_dict(self) -> dict[str, Any]:
        """For `--json` and the journal's events."""
        return {
            "row": self.row,
            "summary": self.summary,
            "exit_code": self.exit_code,
            "phase": self.memory.phase.value,
            "attempt": self.memory.attempt.number,
            "actions": [action_dict(a) for a in self.actions],
        }


def action_dict(action: Action) -> dict[str, Any]:
    """{"kind": ..., "reason": ..., and the action's own fields}, JSON-ready."""
    out: dict[str, Any] = {"kind": action.kind}
    for name, value in vars(action).items():
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, Checkpoint):
            value = {"path": value.path, "step": value.step, "layout": value.layout,
                     "time": value.time.isoformat() if value.time is not None else None}
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        out[name] = value
    return out

