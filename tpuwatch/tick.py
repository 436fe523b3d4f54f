"""One reconcile tick, shared by `watch` (tick after tick) and `check` (one tick from cron).

Rules of this module:
- Level-triggered (STYLE.md section 4): every tick re-reads the node, the workers, the newest
  complete checkpoint and the audit log. Memory comes only from the journal.
- Write-ahead: the decision is journaled before any action is carried out, and an operation's
  name right after the call that started it. A process killed between any two lines resumes
  from what it meant to do; the worker-side lock (a relaunch of attempt n is refused while or
  after it ran) and ALREADY_EXISTS-is-success cover the gap between a call and its journal line.
- Never blocks on a long cloud operation: it starts it, and a later tick follows it up.
- API cost per tick: one node get, one operation get while one is in flight, the audit log at
  most once per `audit_interval` unless something looks wrong (and never twice within
  MIN_AUDIT_GAP); worker probes go over SSH and cost no API quota.
- No recovery rule lives here: what to do is tpuwatch.policy's to say.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from tpuwatch import recreate
from tpuwatch.config import Config
from tpuwatch.durations import human
from tpuwatch.errors import CloudError, NotFoundError
from tpuwatch.journal import Journal
from tpuwatch.model import AuditEvent, Checkpoint, NodeSnapshot, OperationStatus, WorkerProbe
from tpuwatch.policy import (
    CreateNode,
    Decision,
    DeleteNode,
    Launch,
    Memory,
    Observation,
    Phase,
    PolicyConfig,
    StopWorkers,
    action_dict,
    decide,
)
from tpuwatch.ports import AuditLog, CheckpointStore, TpuApi

MIN_AUDIT_GAP = 2.0  # seconds: 30 reads a minute at most, half the Logging API's read quota


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
    """The adapters one tick talks to; real ones in `tpuwatch.wiring`, fakes in tests."""

    tpu_for: Callable[[str], TpuApi]  # zone -> TPU API of that zone
    workers: Any  # tpuwatch.workers.SshWorkers (ports.Workers plus stop(node, workers))
    checkpoints: CheckpointStore | None
    audit: AuditLog | None = None
    now: Callable[[], datetime] = utcnow
    jitter: Callable[[], float] = random.random


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

    @property
    def exit_code(self) -> int:
        return self.decision.exit_code

    @property
    def memory(self) -> Memory:
        return self.decision.memory

    def line(self) -> str:
        """One line for people: node, job and what happens next."""
        node = "missing" if self.node is None else f"{self.node.state}/{self.node.health or '-'}"
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
            },
            "workers": None if self.probes is None else [
                {"worker": p.worker, "state": p.state, "attempt": p.attempt, "exit_code": p.exit_code,
                 "detail": p.detail} for p in self.probes
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
        tpu = self.ports.tpu_for(mem.zone or self.pcfg.zones[0])
        node = tpu.get_node(self.pcfg.tpu_name)
        probes = self._probe(node)
        operation, create_failure = self._operation(mem, tpu)
        checkpoint = self.ports.checkpoints.latest() if self.ports.checkpoints is not None else None
        warnings: list[str] = []
        events, cursor = self._audit(now, mem, node, probes, warnings)
        obs = Observation(
            node=node, events=tuple(events), probes=probes, checkpoint=checkpoint,
            operation=operation, create_failure=create_failure,
            owned=node is not None and recreate.owned(node, self.pcfg.job),
            jitter=min(max(self.ports.jitter(), 0.0), 0.999999),
            adopt=self.flags.adopt, recreate_missing=self.flags.recreate_missing,
            dry_run=self.flags.dry_run,
        )
        decision = decide(obs, mem, self.pcfg, now)
        report = TickReport(now, node, probes, checkpoint, tuple(events), decision,
                            warnings=tuple(warnings), dry_run=self.flags.dry_run)
        if self.flags.dry_run:
            return replace(report, done=tuple(f"would {_describe(a)}" for a in decision.actions))
        with self.journal.transaction():
            self.journal.record(now, decision, operation)
            if cursor is not None:
                self.journal.set_audit_cursor(cursor)
                self.journal.set_cursor("audit_read_at", now.isoformat())
        done, decision = self._act(decision, obs, mem, now)
        return replace(report, decision=decision, done=tuple(done))

    # -- observe ------------------------------------------------------------------------------

    def _probe(self, node: NodeSnapshot | None) -> tuple[WorkerProbe, ...] | None:
        """Every selected worker's job files, when the node is READY (healthy or not)."""
        if node is None or node.state != "READY" or not node.workers:
            return None
        return tuple(self.ports.workers.probe(node))

    def _operation(self, mem: Memory, tpu: TpuApi) -> tuple[OperationStatus | None, Any]:
        if not mem.pending_op or mem.phase not in (Phase.DELETING, Phase.CREATING):
            return None, None
        op = tpu.get_operation(mem.pending_op)
        failure = None
        if mem.phase is Phase.CREATING and op.done and op.error_code:
            classified = recreate.classify_operation(op, started_by_us=True)
            failure = classified.kind if classified is not None else None
        return op, failure

    def _audit(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
               probes: Sequence[WorkerProbe] | None, warnings: list[str]) -> tuple[list[AuditEvent], str | None]:
        """New audit events, read once per audit_interval, or sooner when something looks wrong."""
        if self.ports.audit is None:
            return [], None
        last_text = self.journal.cursor("audit_read_at")
        since = None
        if last_text:
            try:
                since = (now - datetime.fromisoformat(last_text)).total_seconds()
            except ValueError:
                since = None
        wrong = (node is None or not node.usable or mem.phase not in (Phase.RUNNING, Phase.IDLE)
                 or any(p.state != "running" for p in probes or ()))
        due = since is None or since >= self.audit_interval or (wrong and since >= MIN_AUDIT_GAP)
        if not due:
            return [], None
        try:
            events, cursor = self.ports.audit.read([self.pcfg.tpu_name], self.journal.audit_cursor())
        except CloudError as exc:
            # The job can be kept alive without the audit log; it only loses one kind of evidence.
            warnings.append(f"audit log not read: {exc.message}")
            return [], None
        return list(events), cursor

    # -- act ----------------------------------------------------------------------------------

    def _act(self, decision: Decision, obs: Observation, before: Memory,
             now: datetime, *, again: bool = True) -> tuple[list[str], Decision]:
        done: list[str] = []
        node = obs.node
        for action in decision.actions:
            if isinstance(action, Launch) and node is not None:
                done.append(self._launch(node, obs.probes, action))
            elif isinstance(action, StopWorkers):
                done.append(self._stop(node, action.reason))
            elif isinstance(action, DeleteNode) and node is not None:
                tpu = self.ports.tpu_for(action.zone)
                try:
                    name = recreate.start_delete(tpu, node, self.pcfg.job, adopt=self.flags.adopt)
                except NotFoundError:
                    name = ""  # already gone: the next tick sees it missing and creates
                self.journal.record_operation(now, decision.memory, name, "delete", action.zone)
                done.append(f"started deleting {action.name} in {action.zone} ({name or 'already gone'}): "
                            f"{action.reason}")
            elif isinstance(action, CreateNode):
                created, decision = self._create(action, decision, obs, before, now, again=again)
                done.extend(created)
        return done, decision

    def _launch(self, node: NodeSnapshot, probes: Sequence[WorkerProbe] | None, action: Launch) -> str:
        # Clean every worker not already running this attempt (old process group, device holders,
        # a stale libtpu lockfile), then launch; the worker-side lock makes a repeat harmless.
        keep = {p.worker for p in probes or () if p.state == "running" and p.attempt == action.attempt}
        others = [w.index for w in node.workers if w.index not in keep]
        problems = []
        if others:
            for r in self.ports.workers.stop(node, others):
                if not getattr(r, "ok", True):
                    problems.append(f"w{r.worker}: cleanup: {r.describe()}")
        results = self.ports.workers.launch(node, action.attempt, action.checkpoint)
        started = [r for r in results if r.started]
        for r in results:
            if not r.started:
                problems.append(f"w{r.worker}: {r.describe()}")
        where = (f"from {action.checkpoint.path} (step {action.checkpoint.step})"
                 if action.checkpoint else "from scratch (no complete checkpoint yet)")
        text = f"launched attempt {action.attempt} on {len(started)}/{len(results)} workers {where}"
        return text + ("; " + "; ".join(problems) if problems else "")

    def _stop(self, node: NodeSnapshot | None, reason: str) -> str:
        if node is None or node.state != "READY":
            state = "missing" if node is None else node.state
            return f"did not stop workers: node is {state}, its workers cannot be reached ({reason})"
        results = self.ports.workers.stop(node)
        failed = [r for r in results if not getattr(r, "ok", True)]
        text = f"stopped the job on {len(results) - len(failed)}/{len(results)} workers: {reason}"
        if failed:
            text += "; " + "; ".join(f"w{r.worker}: {r.describe()}" for r in failed)
        return text

    def _create(self, action: CreateNode, decision: Decision, obs: Observation, before: Memory,
                now: datetime, *, again: bool) -> tuple[list[str], Decision]:
        tpu = self.ports.tpu_for(action.zone)
        # A create this job started earlier (the journal was in CREATING) answers ALREADY_EXISTS
        # when the node is ours: that is success, not a conflict.
        resumed = before.phase is Phase.CREATING
        try:
            name = recreate.start_create(tpu, self.cfg, action.zone, resumed=resumed)
        except recreate.CreateRejected as exc:
            text = f"create in {action.zone} refused: {exc.message}"
            if not again:
                return [text], decision
            # Refused at the call: the policy decides again with the refusal as a failed operation.
            obs2 = replace(obs, operation=exc.as_operation(), create_failure=exc.failure.kind)
            d2 = decide(obs2, decision.memory, self.pcfg, now)
            self.journal.record(now, d2, obs2.operation)
            more, d2 = self._act(d2, obs2, decision.memory, now, again=False)
            return [text, *more], d2
        mem = self.journal.record_operation(now, decision.memory, name, "create", action.zone)
        return ([f"started creating {action.name} in {action.zone} ({name or 'already exists'}): "
                 f"{action.reason}"], replace(decision, memory=mem))


def _describe(action: Any) -> str:
    d = action_dict(action)
    kind = d.pop("kind")
    reason = d.pop("reason", "")
    extra = ", ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], ()))
    return f"{kind}{' (' + extra + ')' if extra else ''}: {reason}"
