"""One reconcile tick, shared by `watch` (tick after tick, tpuwatch/loop.py) and `check` (one tick).

Rules of this module:
- Observe -> decide -> journal -> act, and nothing else: what to do, and what more to observe
  before deciding, is tpuwatch.policy's to say (policy/observe.py); no branch here names a row.
- Level-triggered: every tick re-reads the node, the workers, the newest complete checkpoint and
  the audit log. Memory comes only from the journal.
- Write-ahead: the decision is journaled before any action is carried out, and an operation's
  name right after the call that started it. A process killed between any two lines resumes
  from what it meant to do; the worker-side lock (a relaunch of attempt n is refused while or
  after it ran) and ALREADY_EXISTS-is-success cover the gap between a call and its journal line.
- Never blocks on a long cloud operation: it starts it, and a later tick follows it up.
- API cost per tick: one node get (one per slice of a multislice job), one operation get while
  one is in flight, the queued resource's state while it matters (a node made through one that
  is missing or deleting, or a create through it followed), the audit log at most once per
  `audit_interval` unless something looks wrong; worker probes go over SSH and cost no API quota.
- `decide` is called at most four times a tick (policy/observe.py says when).
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from tpuwatch import recreate
from tpuwatch.cloud.errors import ApiError
from tpuwatch.cloud.lifecycle import Lifecycle
from tpuwatch.config import Config
from tpuwatch.durations import human
from tpuwatch.errors import CloudError, NotFoundError
from tpuwatch.journal import Journal
from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    NodeSnapshot,
    OperationStatus,
    PrecheckReport,
    QueuedStatus,
    WorkerProbe,
    job_node,
)
from tpuwatch.policy import (
    Action,
    CreateNode,
    Decision,
    DeleteNode,
    Launch,
    Memory,
    Observation,
    Phase,
    PolicyConfig,
    StartMaintenance,
    StopWorkers,
    action_dict,
    decide,
    hang_limit,
)
from tpuwatch.policy.observe import audit_due, launch_likely, precheck_due
from tpuwatch.policy.values import CreateFailureKind
from tpuwatch.ports import AuditLog, CheckpointStore, NodeLifecycle, Prechecker, TpuApi, Workers
from tpuwatch.workers import login, precheck

# How the service refuses to start a maintenance early: not offered for this TPU type, or nothing
# (reschedulable) pending. Anything else is an API failure like any other.
MAINTENANCE_REFUSALS = frozenset({"UNIMPLEMENTED", "FAILED_PRECONDITION"})


def port_open(host: str, port: int, timeout: float) -> bool:
    """True when a TCP connection to host:port is accepted within `timeout` (no bytes sent)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Flags:
    """Command-line choices that widen what the policy may do."""

    adopt: bool = False  # treat the node as owned (it lacks the tpuwatch-job label)
    recreate_missing: bool = False  # recreate a node that vanished without tpuwatch deleting it
    dry_run: bool = False  # decide and print, change nothing


@dataclass
class Ports:
    """The adapters one tick talks to; real ones in `tpuwatch.wiring`, fakes in tests and benchmarks."""

    tpu_for: Callable[[str], TpuApi]  # zone -> TPU API of that zone
    workers: Workers
    checkpoints: CheckpointStore | None
    audit: AuditLog | None = None
    now: Callable[[], datetime] = utcnow
    jitter: Callable[[], float] = random.random
    sleep: Callable[[float], None] = time.sleep  # between ticks (loop.Pacer)
    # between ticks while the workers are followed: until `event` is set (a worker's attempt
    # ended), `seconds` at most; True when it was set (a benchmark in virtual time runs its clock)
    wait_for: Callable[[threading.Event, float], bool] = threading.Event.wait
    clock: Callable[[], float] = time.monotonic
    # Environment checks before launches and while running; None: not run
    precheck: Prechecker | None = None
    # TCP probe of a down node's SSH port between ticks (loop.Pacer); a benchmark in virtual
    # time answers from its simulated hosts
    port_open: Callable[[str, int, float], bool] = port_open
    # zone -> delete/create of the job's node there; default: a plain node through tpu_for
    lifecycle_for: Callable[[str], NodeLifecycle] | None = None

    def lifecycle(self, zone: str) -> NodeLifecycle:
        if self.lifecycle_for is not None:
            return self.lifecycle_for(zone)
        return Lifecycle(self.tpu_for(zone))


@dataclass(frozen=True)
class TickReport:
    """What one tick saw, decided and did: for the dashboard, `check`'s output and `--json`."""

    time: datetime
    node: NodeSnapshot | None
    probes: tuple[WorkerProbe, ...] | None
    checkpoint: Checkpoint | None
    events: tuple[AuditEvent, ...]
    decision: Decision
    done: tuple[str, ...] = ()  # what was carried out, one line each
    warnings: tuple[str, ...] = ()
    dry_run: bool = False
    port_probes: int = 0  # TCP probes of a down node's SSH port made so far (stamped by loop.tick_loop)
    precheck: PrecheckReport | None = None  # this tick's environment checks, else the last journaled
    pcfg: PolicyConfig | None = None  # the job's policy settings (for what hang detection knows)

    @property
    def exit_code(self) -> int:
        return self.decision.exit_code

    @property
    def memory(self) -> Memory:
        return self.decision.memory

    def _slice_of(self, worker: int) -> dict[str, int]:
        """{"slice": n} for a worker of a multislice job, else {}."""
        if self.node is None or not self.node.slices:
            return {}
        return next(({"slice": w.slice} for w in self.node.workers if w.index == worker), {})

    def node_text(self) -> str:
        """`READY/HEALTHY`, `missing`; for a multislice job each slice's too, in parentheses."""
        node = self.node
        if node is None:
            return "missing"
        text = f"{node.state}/{node.health or '-'}"
        if node.slices:
            text += " (" + ", ".join(f"{s.name or 'missing'} {s.state}/{s.health or '-'}" for s in node.slices) + ")"
        return text

    def line(self) -> str:
        """One line for people: node, job and what happens next."""
        node = self.node_text()
        mem = self.decision.memory
        parts = [f"node {node}", f"{mem.phase.value}", f"attempt {mem.attempt}"]
        if self.checkpoint is not None:
            age = max(0.0, (self.time - self.checkpoint.time).total_seconds()) if self.checkpoint.time else None
            parts.append(f"step {self.checkpoint.step}" + (f" ({human(age)} old)" if age is not None else ""))
        return f"{' | '.join(parts)}: {self.decision.summary}"

    def as_dict(self) -> dict[str, Any]:
        mem = self.decision.memory
        return {
            "time": self.time.isoformat(),
            "node": None if self.node is None else {
                "name": self.node.name, "zone": self.node.zone, "id": self.node.id,
                "state": self.node.state, "health": self.node.health,
                "health_description": self.node.health_description,
                # a multislice job: each slice, and its workers' numbers in "workers"
                **({"slices": [{"slice": i, "name": s.name, "id": s.id, "state": s.state, "health": s.health,
                                "workers": [w.index for w in self.node.workers if w.slice == i]}
                               for i, s in enumerate(self.node.slices)]} if self.node.slices else {}),
            },
            "workers": None if self.probes is None else [
                {"worker": p.worker, "state": p.state, "attempt": p.attempt, "exit_code": p.exit_code,
                 "log_bytes": p.log_bytes, "detail": p.detail, **self._slice_of(p.worker)} for p in self.probes
            ],
            "checkpoint": None if self.checkpoint is None else {
                "path": self.checkpoint.path, "step": self.checkpoint.step, "layout": self.checkpoint.layout,
                "time": self.checkpoint.time.isoformat() if self.checkpoint.time else None,
            },
            "events": [{"time": e.time.isoformat(), "kind": e.kind, "worker": e.worker, "reason": e.reason}
                       for e in self.events],
            **self.decision.as_dict(),
            "budgets": {"restarts": mem.restarts, "recreates": mem.recreates, "disruptions": mem.disruptions,
                        "no_progress": mem.no_progress},
            "done": list(self.done),
            "warnings": list(self.warnings),
            "dry_run": self.dry_run,
            "port_probes": self.port_probes,
            "precheck": None if self.precheck is None else precheck.report_dict(self.precheck),
            # what hang detection knows: "auto" learns the interval; the limit counts from the
            # newest checkpoint of the attempt (0 = not judged yet, or off)
            "hang": None if self.pcfg is None else {
                "timeout": "auto" if self.pcfg.hang_auto else self.pcfg.hang_timeout,
                "checkpoint_interval_seen": mem.ckpt_gap or None,
                "first_checkpoint_seen": mem.ckpt_first or None,
                "limit": hang_limit(self.pcfg, mem) or None},
        }


@dataclass
class Reconciler:
    """Runs ticks for one job. Holds no state between ticks beyond what the journal keeps."""

    cfg: Config
    pcfg: PolicyConfig
    ports: Ports
    journal: Journal
    flags: Flags = field(default_factory=Flags)
    audit_interval: float = 60.0

    def tick(self) -> TickReport:
        now = self.ports.now()
        mem = self.journal.load_memory() or Memory.initial(self.pcfg.zones[0])
        login.restore(self.ports.workers, self.journal)  # the user learned for this node id
        zone = mem.zone or self.pcfg.zones[0]
        tpu = self.ports.tpu_for(zone)
        life = self.ports.lifecycle(zone)
        node = self._node(tpu)
        probes, pre = self._probe(node, mem, now)
        operation, create_failure = self._operation(mem, tpu)
        checkpoint = self.ports.checkpoints.latest() if self.ports.checkpoints is not None else None
        warnings: list[str] = []
        events, cursor = self._audit(now, mem, node, probes, warnings)
        pre = pre or self._periodic_precheck(now, mem, node, probes)
        queued = self._queued(life, mem, node)
        obs = Observation(
            node=node, events=tuple(events), probes=probes, checkpoint=checkpoint,
            operation=operation, create_failure=create_failure, queued=queued,
            create_reason=recreate.failure_reason(operation) if create_failure else recreate.queued_reason(queued),
            jitter=min(max(self.ports.jitter(), 0.0), 0.999999),
            adopt=self.flags.adopt, recreate_missing=self.flags.recreate_missing,
            dry_run=self.flags.dry_run, precheck=pre, checks=self._checks() is not None,
        )
        decision = decide(obs, mem, self.pcfg, now)
        checker = self._checks()
        if decision.check_first and node is not None and checker is not None:
            # It would launch: check the workers' environment first and decide again with what
            # the checks found (a bad node is waited for, never charged).
            pre = checker.run(node, "launch", now=now)
            obs = replace(obs, precheck=pre)
            decision = decide(obs, mem, self.pcfg, now)
        if pre is not None and pre.context == "running":
            warnings.extend(f"environment check failed: {line}" for line in precheck.failing_lines(pre))
        warnings.extend(self.ports.workers.take_notes())  # e.g. host keys trusted on first use
        ck_warning = precheck.checkpoint_warning(checkpoint, mem, float(self.cfg.job["checkpoint_warn_age"]), now)
        if ck_warning:
            warnings.append(ck_warning)
        report = TickReport(now, node, probes, checkpoint, tuple(events), decision,
                            warnings=tuple(warnings), dry_run=self.flags.dry_run,
                            precheck=pre or self._last_precheck(), pcfg=self.pcfg)
        if self.flags.dry_run:
            return replace(report, done=tuple(f"would {_describe(a)}" for a in decision.actions))
        with self.journal.transaction():
            self.journal.record(now, decision, operation)
            if cursor is not None:
                self.journal.set_audit_cursor(cursor)
                self.journal.set_cursor("audit_read_at", now.isoformat())
            self._journal_precheck(now, pre)
            login.record(self.ports.workers, node, self.journal, now)
            self.journal.set_cursor("checkpoint_warning", json.dumps({"time": now.isoformat(), "text": ck_warning})
                                    if ck_warning else None)
        done, decision = self._act(decision, obs, mem, now)
        if decision.check_after and node is not None and checker is not None:
            # The cleanup ran (StopWorkers): check again and decide, in this same tick.
            pre = checker.run(node, "launch", now=now)
            obs = replace(obs, precheck=pre, precheck_fixed=True)
            again = decide(obs, decision.memory, self.pcfg, now)
            with self.journal.transaction():
                self.journal.record(now, again, operation)
                self._journal_precheck(now, pre)
            more, decision = self._act(again, obs, decision.memory, now)
            done.extend(more)
            report = replace(report, precheck=pre)
        return replace(report, decision=decision, done=tuple(done))

    # -- environment checks (tpuwatch.workers.precheck) -----------------------------------------------

    def _checks(self) -> Prechecker | None:
        checker = self.ports.precheck
        return checker if checker is not None and checker.enabled else None

    def _periodic_precheck(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
                           probes: Sequence[WorkerProbe] | None) -> PrecheckReport | None:
        """The periodic checks while the attempt runs, every precheck.interval."""
        checker = self._checks()
        if checker is None or node is None:
            return None
        if not precheck_due(mem, node, probes, self._since(now, "precheck_at"), float(self.cfg.precheck["interval"])):
            return None
        return checker.run(node, "running", now=now)

    def _since(self, now: datetime, cursor: str) -> float | None:
        """Seconds since the time the journal keeps under `cursor`; None when it keeps none."""
        text = self.journal.cursor(cursor)
        if not text:
            return None
        try:
            return (now - datetime.fromisoformat(text)).total_seconds()
        except ValueError:
            return None

    def _last_precheck(self) -> PrecheckReport | None:
        text = self.journal.cursor("precheck_last")
        if not text:
            return None
        try:
            return precheck.report_from_dict(json.loads(text))
        except ValueError:
            return None

    def _journal_precheck(self, now: datetime, pre: PrecheckReport | None) -> None:
        """Keep the last report (for status and the dashboard); an event when what fails changes."""
        if pre is None or self.flags.dry_run:
            return
        previous = self._last_precheck()
        before = sorted(precheck.failing_lines(previous)) if previous is not None else None
        now_failing = sorted(precheck.failing_lines(pre))
        self.journal.set_cursor("precheck_at", now.isoformat())
        self.journal.set_cursor("precheck_last", json.dumps(precheck.report_dict(pre), sort_keys=True))
        if before != now_failing:
            # The event keeps what did not pass; the full report stays in the cursor above.
            data = precheck.report_dict(pre)
            data["checked"] = len(data["items"])
            data["items"] = [i for i in data["items"] if i["verdict"] in ("fail", "warn")]
            self.journal.add_event(now, "precheck", precheck.summary(pre), data)

    # -- observe ------------------------------------------------------------------------------

    def _node(self, tpu: TpuApi) -> NodeSnapshot | None:
        """The job's node; a multislice job's slices as one (model.combine_slices)."""
        return job_node(tpu.get_node, self.pcfg.tpu_name, self.pcfg.slices)

    def _probe(self, node: NodeSnapshot | None, mem: Memory,
               now: datetime) -> tuple[tuple[WorkerProbe, ...] | None, PrecheckReport | None]:
        """Every selected worker's job files, when the node is READY (healthy or not; of a
        multislice job, the workers of its READY slices, the others unreachable); with the
        launch-time checks in the same connection when a launch is likely (policy/observe.py)."""
        if node is None or not node.reachable or not node.workers:
            return None, None
        checker = self._checks()
        if checker is not None and launch_likely(mem, node, now):
            probes, report = checker.probe_and_run(node, "launch", now=now)
            return tuple(probes), report
        return tuple(self.ports.workers.probe(node)), None

    def _operation(self, mem: Memory, tpu: TpuApi) -> tuple[OperationStatus | None, CreateFailureKind | None]:
        if not mem.pending_op or mem.phase not in (Phase.DELETING, Phase.CREATING):
            return None, None
        op = tpu.get_operation(mem.pending_op)
        if not op.done:  # its age, for recovery.operation_timeout: when the journal recorded it
            started = next((r.started for r in self.journal.operations(pending_only=True)
                            if r.name == mem.pending_op), None)
            op = replace(op, started=started)
        failure = None
        if mem.phase is Phase.CREATING and op.done and op.error_code:
            classified = recreate.classify_operation(op, started_by_us=True)
            failure = classified.kind if classified is not None else None
        return op, failure

    @staticmethod
    def _queued(life: NodeLifecycle, mem: Memory, node: NodeSnapshot | None) -> QueuedStatus | None:
        """The queued resource's state, read only while it can change the decision: the node is
        missing or being deleted, or tpuwatch follows a delete or create through it."""
        if not life.queued_resource:
            return None
        if node is not None and node.state not in ("DELETING", "MISSING") \
                and mem.phase not in (Phase.DELETING, Phase.CREATING):
            return None
        return life.status()

    def _worker_instances(self, node: NodeSnapshot | None) -> Mapping[str, tuple[str, str]] | None:
        """The node's worker VMs for the audit reader (read lazily by the TPU adapter), or None."""
        return self.ports.tpu_for(node.zone).worker_instances(node) if node is not None else None

    def _audit(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
               probes: Sequence[WorkerProbe] | None, warnings: list[str]) -> tuple[list[AuditEvent], str | None]:
        """New audit events, when policy/observe.py says they are due."""
        audit = self.ports.audit
        if audit is None or not audit_due(mem, node, probes, self._since(now, "audit_read_at"), self.audit_interval):
            return [], None
        try:
            events, cursor = audit.read(list(self.pcfg.slices or (self.pcfg.tpu_name,)), self.journal.audit_cursor(),
                                        self._worker_instances(node))
        except CloudError as exc:
            # The job can be kept alive without the audit log; it only loses one kind of evidence.
            warnings.append(f"audit log not read: {exc.message}")
            return [], None
        finally:
            # The shared reader (cloud/auditcache.py) says once when it cannot use its cache.
            warnings.extend(audit.take_warnings())
        return list(events), cursor

    # -- act ----------------------------------------------------------------------------------

    def _act(self, decision: Decision, obs: Observation, before: Memory,
             now: datetime, *, again: bool = True) -> tuple[list[str], Decision]:
        done: list[str] = []
        node = obs.node
        for action in decision.actions:
            if isinstance(action, Launch) and node is not None:
                done.append(self._launch(node, action))
            elif isinstance(action, StopWorkers):
                done.append(self._stop(node, action.reason, obs.probes))
            elif isinstance(action, DeleteNode):
                done.append(self._delete(action, decision.memory, node, now))
            elif isinstance(action, CreateNode):
                created, decision = self._create(action, decision, obs, before, now, again=again)
                done.extend(created)
            elif isinstance(action, StartMaintenance) and node is not None:
                started, decision = self._start_maintenance(action, decision, obs, node, now, again=again)
                done.extend(started)
        if before.phase is Phase.CREATING and decision.memory.phase is Phase.QUEUED:
            # A queued resource the service gave up on keeps the name: delete it now (after the
            # decision is journaled), so it is gone by the retry's create. A tick killed before
            # this line leaves it to the retry's create, which deletes it then.
            cleared = self.ports.lifecycle(before.zone or self.pcfg.zones[0]).clear_ended()
            if cleared:
                done.append(cleared)
        return done, decision

    def _delete(self, action: DeleteNode, mem: Memory, node: NodeSnapshot | None, now: datetime) -> str:
        what = action.name
        try:
            # The policy checked ownership; start_delete checks it again next to the act.
            name, what = recreate.start_delete(self.ports.lifecycle(action.zone), node, self.pcfg.job,
                                               adopt=self.flags.adopt)
        except NotFoundError:
            name = ""  # already gone: the next tick sees it missing and creates
        self.journal.record_operation(now, mem, name, "delete", action.zone)
        return f"started deleting {what} in {action.zone} ({name or 'already gone'}): {action.reason}"

    def _start_maintenance(self, action: StartMaintenance, decision: Decision, obs: Observation,
                           node: NodeSnapshot, now: datetime, *, again: bool) -> tuple[list[str], Decision]:
        if not self.flags.adopt and not node.owned_by(self.pcfg.job):
            raise recreate.ownership_error(node, self.pcfg.job)  # the policy checked; kept next to the act
        zone = decision.memory.zone or self.pcfg.zones[0]
        try:
            name, what = self.ports.lifecycle(zone).start_maintenance(node)
        except ApiError as exc:
            if exc.code not in MAINTENANCE_REFUSALS:
                raise
            text = f"starting the maintenance of {node.name} early was refused: {exc.message}"
            if not again:
                return [text], decision
            # Refused at the call: the policy decides again with the refusal (it notes it once).
            obs2 = replace(obs, maintenance_refused=f"{exc.code}: {exc.message}")
            d2 = decide(obs2, decision.memory, self.pcfg, now)
            with self.journal.transaction():
                self.journal.record(now, d2, None)
            more, d2 = self._act(d2, obs2, decision.memory, now, again=False)
            return [text, *more], d2
        with self.journal.transaction():
            self.journal.add_event(now, "maintenance_started", f"started the maintenance of {what}: {action.reason}",
                                   {"operation": name, "node": node.name, "node_id": node.id})
        return [f"started the maintenance of {what} ({name}): {action.reason}"], decision

    def _launch(self, node: NodeSnapshot, action: Launch) -> str:
        # Each worker not already running this attempt cleans up first (old process group,
        # device holders, a stale libtpu lockfile), in the launch's own connection; the
        # worker-side lock makes a repeat harmless.
        results = self.ports.workers.launch(node, action.attempt, action.checkpoint, clean=True)
        started = [r for r in results if r.started]
        problems = []
        for r in results:
            if r.cleanup is not None and not r.cleanup.ok:
                problems.append(f"w{r.worker}: cleanup: {r.cleanup.describe()}")
            if not r.started:
                problems.append(f"w{r.worker}: {r.describe()}")
        where = (f"from {action.checkpoint.path} (step {action.checkpoint.step})"
                 if action.checkpoint else "from scratch (no complete checkpoint yet)")
        text = f"launched attempt {action.attempt} on {len(started)}/{len(results)} workers {where}"
        return text + ("; " + "; ".join(problems) if problems else "")

    def _stop(self, node: NodeSnapshot | None, reason: str, probes: Sequence[WorkerProbe] | None = None) -> str:
        if node is None or not node.reachable:
            state = "missing" if node is None else node.state
            return f"did not stop workers: node is {state}, its workers cannot be reached ({reason})"
        if probes and all(p.state == "unreachable" for p in probes):
            # This tick's probe reached none of them (a node under maintenance refuses SSH): a
            # stop would fail the same way. What they left is stopped when they answer again
            # (stale_workers) or by the next launch's own cleanup.
            return f"did not stop workers: none answered this tick's probe ({reason})"
        results = self.ports.workers.stop(node)
        failed = [r for r in results if not r.ok]
        text = f"stopped the job on {len(results) - len(failed)}/{len(results)} workers: {reason}"
        if failed:
            text += "; " + "; ".join(f"w{r.worker}: {r.describe()}" for r in failed)
        return text

    def _create(self, action: CreateNode, decision: Decision, obs: Observation, before: Memory,
                now: datetime, *, again: bool) -> tuple[list[str], Decision]:
        life = self.ports.lifecycle(action.zone)
        # A create this job started earlier (the journal was in CREATING) answers ALREADY_EXISTS
        # when the node is ours: that is success, not a conflict.
        resumed = before.phase is Phase.CREATING
        # The new node's startup script (startup-scripts/resume-training.sh) can start the job at
        # boot, before the watcher reconnects: as the next attempt, from the newest complete
        # checkpoint, which the policy then follows instead of launching it a second time.
        launch = {"attempt": str(decision.memory.attempt + 1)}
        if self.pcfg.slices:
            # A multislice job starts only on every slice at once, with the slices' ids and the
            # coordinator: the watcher launches it, the startup script only sets up.
            launch = {"launch": "false"}
        if user := login.user_for_create(self.journal):  # the user the watcher logs in as
            launch["user"] = user
        if obs.checkpoint is not None and not self.pcfg.slices:
            launch.update(checkpoint=obs.checkpoint.path, step=str(obs.checkpoint.step))
        try:
            name = recreate.start_create(life, self.cfg, action.zone, resumed=resumed, launch=launch)
        except recreate.CreateRejected as exc:
            text = f"create in {action.zone} refused: {exc.message}"
            if not again:
                return [text], decision
            # Refused at the call: the policy decides again with the refusal as a failed operation.
            obs2 = replace(obs, operation=exc.as_operation(), create_failure=exc.failure.kind,
                           create_reason=exc.failure.reason)
            d2 = decide(obs2, decision.memory, self.pcfg, now)
            self.journal.record(now, d2, obs2.operation)
            more, d2 = self._act(d2, obs2, decision.memory, now, again=False)
            return [text, *more], d2
        mem = self.journal.record_operation(now, decision.memory, name, "create", action.zone)
        through = f" through queued resource {life.queued_resource}" if life.queued_resource else ""
        return ([f"started creating {action.name}{through} in {action.zone} ({name or 'already exists'}): "
                 f"{action.reason}"], replace(decision, memory=mem))


def _describe(action: Action) -> str:
    d = action_dict(action)
    kind = d.pop("kind")
    reason = d.pop("reason", "")
    extra = ", ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], ()))
    return f"{kind}{' (' + extra + ')' if extra else ''}: {reason}"
