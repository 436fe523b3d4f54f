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
  MIN_AUDIT_GAP); worker probes go over SSH and cost no API quota. A TPU made through a queued
  resource ([tpu] queued_resource) is deleted (force) and created through it, and while its
  node is awaited the request's state is read once a tick.
- Between ticks (`Reconciler.wait`), while the node is down and being waited for, the API is
  asked once per poll_interval only; a TCP connect to worker 0's SSH port, which costs no quota,
  runs every second or so, and the moment the port answers the next tick confirms with the API.
- No recovery rule lives here: what to do is tpuwatch.policy's to say.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, cast

from tpuwatch import precheck, recreate
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
    WorkerProbe,
)
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
    hang_limit,
)
from tpuwatch.ports import AuditLog, CheckpointStore, TpuApi

MIN_AUDIT_GAP = 2.0  # seconds: 30 reads a minute at most, half the Logging API's read quota
PORT_PROBE_EVERY = 0.5  # seconds between TCP probes of a down node: quicker than a 1 s retry loop
# Queued resource states that will never make the node: a failed create, for the policy.
QR_GIVEN_UP = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})
RESOURCE_EXHAUSTED = 8  # google.rpc.Code: how a given-up queued resource is shown as a failed create


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
    """The adapters one tick talks to; real ones in `tpuwatch.wiring`, fakes in tests."""

    tpu_for: Callable[[str], TpuApi]  # zone -> TPU API of that zone
    workers: Any  # tpuwatch.workers.SshWorkers (ports.Workers plus stop(node, workers))
    checkpoints: CheckpointStore | None
    audit: AuditLog | None = None
    now: Callable[[], datetime] = utcnow
    jitter: Callable[[], float] = random.random
    sleep: Callable[[float], None] = time.sleep  # between ticks (Reconciler.wait)
    clock: Callable[[], float] = time.monotonic
    # tpuwatch.precheck.Prechecker: environment checks before launches and while running
    precheck: Any = None
    # TCP probe of a down node's SSH port between ticks (`wait`); a benchmark in virtual time
    # answers from its simulated hosts
    port_open: Callable[[str, int, float], bool] = port_open


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
    port_probes: int = 0  # TCP probes of a down node's SSH port made by this process so far
    precheck: PrecheckReport | None = None  # this tick's environment checks, else the last journaled
    pcfg: PolicyConfig | None = None  # the job's policy settings (for what hang detection knows)

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
                 "log_bytes": p.log_bytes, "detail": p.detail} for p in self.probes
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
    port_probes: int = 0  # TCP probes made by `wait` (they cost no API quota)
    _port_closed_seen: bool = field(default=False, init=False, repr=False)  # a probe found it closed

    def tick(self) -> TickReport:
        now = self.ports.now()
        mem = self.journal.load_memory() or Memory.initial(self.pcfg.zones[0])
        tpu = self.ports.tpu_for(mem.zone or self.pcfg.zones[0])
        node = tpu.get_node(self.pcfg.tpu_name)
        probes, launch_checks = self._probe(node, mem, now)
        operation, create_failure = self._operation(mem, tpu, node)
        checkpoint = self.ports.checkpoints.latest() if self.ports.checkpoints is not None else None
        warnings: list[str] = []
        events, cursor = self._audit(now, mem, node, probes, warnings)
        pre = launch_checks or self._precheck_due(now, mem, node, probes)
        obs = Observation(
            node=node, events=tuple(events), probes=probes, checkpoint=checkpoint,
            operation=operation, create_failure=create_failure,
            create_reason=recreate.failure_reason(operation) if create_failure else "",
            owned=node is not None and recreate.owned(node, self.pcfg.job),
            jitter=min(max(self.ports.jitter(), 0.0), 0.999999),
            adopt=self.flags.adopt, recreate_missing=self.flags.recreate_missing,
            dry_run=self.flags.dry_run, precheck=pre,
        )
        decision = decide(obs, mem, self.pcfg, now)
        if node is not None and self._checks_before(decision, obs):
            # The policy wants to launch: check the workers' environment first and decide
            # again with what the checks found (a bad node is waited for, never charged).
            pre = self._run_precheck(node, "launch", now)
            obs = replace(obs, precheck=pre)
            decision = decide(obs, mem, self.pcfg, now)
        if pre is not None and pre.context == "running":
            warnings.extend(f"environment check failed: {line}" for line in precheck.failing_lines(pre))
        ck_warning = precheck.checkpoint_warning(checkpoint, mem, float(self.cfg.job["checkpoint_warn_age"]), now)
        if ck_warning:
            warnings.append(ck_warning)
        report = TickReport(now, node, probes, checkpoint, tuple(events), decision,
                            warnings=tuple(warnings), dry_run=self.flags.dry_run,
                            port_probes=self.port_probes, precheck=pre or self._last_precheck(), pcfg=self.pcfg)
        if self.flags.dry_run:
            return replace(report, done=tuple(f"would {_describe(a)}" for a in decision.actions))
        with self.journal.transaction():
            self.journal.record(now, decision, operation)
            if cursor is not None:
                self.journal.set_audit_cursor(cursor)
                self.journal.set_cursor("audit_read_at", now.isoformat())
            self._journal_precheck(now, pre)
            self.journal.set_cursor("checkpoint_warning", json.dumps({"time": now.isoformat(), "text": ck_warning})
                                    if ck_warning else None)
        done, decision = self._act(decision, obs, mem, now)
        if decision.row == "precheck_fix" and node is not None and not obs.precheck_fixed:
            # The cleanup ran (StopWorkers): check again and decide, in this same tick.
            pre = self._run_precheck(node, "launch", now)
            obs = replace(obs, precheck=pre, precheck_fixed=True)
            again = decide(obs, decision.memory, self.pcfg, now)
            with self.journal.transaction():
                self.journal.record(now, again, operation)
                self._journal_precheck(now, pre)
            more, decision = self._act(again, obs, decision.memory, now)
            done.extend(more)
            report = replace(report, precheck=pre)
        return replace(report, decision=decision, done=tuple(done))

    # -- environment checks (tpuwatch.precheck) -----------------------------------------------

    def _checks_before(self, decision: Decision, obs: Observation) -> bool:
        """The decision launches, and the launch-time checks have not been run yet."""
        return (self.ports.precheck is not None and bool(self.cfg.precheck["enabled"])
                and any(isinstance(a, Launch) for a in decision.actions)
                and (obs.precheck is None or obs.precheck.context != "launch"))

    def _run_precheck(self, node: NodeSnapshot, context: precheck.Context, now: datetime) -> PrecheckReport:
        report: PrecheckReport = self.ports.precheck.run(node, context, now=now)
        return report

    def _precheck_due(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
                      probes: Sequence[WorkerProbe] | None) -> PrecheckReport | None:
        """The periodic checks while the attempt runs, every precheck.interval."""
        if (self.ports.precheck is None or not self.cfg.precheck["enabled"] or mem.phase is not Phase.RUNNING
                or node is None or not node.usable or not probes
                or not any(p.state == "running" for p in probes)):
            return None
        last = self.journal.cursor("precheck_at")
        if last:
            try:
                if (now - datetime.fromisoformat(last)).total_seconds() < float(self.cfg.precheck["interval"]):
                    return None
            except ValueError:
                pass
        return self._run_precheck(node, "running", now)

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

    # -- between ticks ------------------------------------------------------------------------

    def wait(self, report: TickReport, delay: float) -> float:
        """Sleep until the next tick, `delay` seconds at most; return the seconds waited.

        While the node is down and the job waits for it to heal, a tick every `delay` would ask
        the API every few seconds for an answer that rarely changes. Instead the API is asked
        once per poll_interval (or at the policy's own deadline, whichever is sooner), and in
        between worker 0's SSH port gets a TCP connect every PORT_PROBE_EVERY seconds. When
        the port answers after having been closed, the wait ends at once, so the next tick
        confirms with the API and relaunches without waiting out the poll.
        """
        start = self.ports.clock()
        target = self._probe_target(report)
        if target is None:
            self._port_closed_seen = False
            self.ports.sleep(delay)
            return self.ports.clock() - start
        host, port = target
        poll = self.pcfg.poll_interval
        every = min(PORT_PROBE_EVERY, max(poll / 6, 0.05))
        longest = max(delay, _until_cap(report, poll))
        while True:
            self.port_probes += 1
            if self.ports.port_open(host, port, max(0.2, min(every, 1.0))):
                if self._port_closed_seen:
                    self._port_closed_seen = False
                    return self.ports.clock() - start
                # The port answers while the API says the node is down: probes tell nothing
                # new, so wait as before and let the API decide.
                left = delay - (self.ports.clock() - start)
                if left > 0:
                    self.ports.sleep(left)
                return self.ports.clock() - start
            self._port_closed_seen = True
            left = longest - (self.ports.clock() - start)
            if left <= 0:
                return self.ports.clock() - start
            self.ports.sleep(min(every, left))

    def _probe_target(self, report: TickReport) -> tuple[str, int] | None:
        """Worker 0's SSH address while the job waits for a down node, when OpenSSH reaches it."""
        node = report.node
        if (node is None or node.usable or not node.workers or self.flags.dry_run
                or report.memory.phase is not Phase.WAITING_NODE):
            return None
        transport = getattr(self.ports.workers, "transport", None)
        # Only a direct OpenSSH connection goes where a TCP probe can follow; gcloud (IAP,
        # OS Login) may reach the worker by a path the probe cannot see.
        if getattr(transport, "name", "") != "openssh":
            return None
        first = min(node.workers, key=lambda w: w.index)
        host = first.address(bool(getattr(transport, "internal_ip", False)))
        port = int(getattr(transport, "port", 22))
        return (host, port) if host else None

    # -- observe ------------------------------------------------------------------------------

    def _probe(self, node: NodeSnapshot | None, mem: Memory,
               now: datetime) -> tuple[tuple[WorkerProbe, ...] | None, PrecheckReport | None]:
        """Every selected worker's job files, when the node is READY (healthy or not).

        When this tick will probably launch (no attempt alive, the node usable), the
        launch-time environment checks ride along in the probe's connection: a relaunch then
        costs two SSH rounds (this one and the launch, which cleans up itself), not four.
        """
        if node is None or node.state != "READY" or not node.workers:
            return None, None
        likely = mem.phase in (Phase.IDLE, Phase.WAITING_NODE) or (
            mem.phase is Phase.BACKOFF and (mem.backoff_until is None or mem.backoff_until <= now))
        if likely and node.usable and self.ports.precheck is not None and self.cfg.precheck["enabled"]:
            probes, report = self.ports.precheck.probe_and_run(node, "launch", now=now)
            return tuple(probes), report
        return tuple(self.ports.workers.probe(node)), None

    def _operation(self, mem: Memory, tpu: TpuApi,
                   node: NodeSnapshot | None = None) -> tuple[OperationStatus | None, Any]:
        if not mem.pending_op or mem.phase not in (Phase.DELETING, Phase.CREATING):
            return None, None
        op = tpu.get_operation(mem.pending_op)
        qr = self._qr_id()
        if qr and mem.phase is Phase.CREATING and op.done and not op.error_code and node is None:
            # The queued resource's create operation ends when the request is accepted; the node
            # comes minutes (or hours) later. Its state, read once a tick, says whether it still
            # will: a FAILED or SUSPENDED request never makes the node, so the policy sees a
            # failed create it may queue and retry (the request is deleted before the retry).
            status = recreate.queued_status(self._qr_api(tpu), qr)
            if status.state in QR_GIVEN_UP:
                detail = status.error_message or (
                    f"code {recreate.CODE_NAMES.get(status.error_code, status.error_code)}"
                    if status.error_code else "no detail given")
                return (replace(op, error_code=RESOURCE_EXHAUSTED,
                                error_message=f"queued resource {qr} {status.state}: {detail}"), "queueable")
        if not op.done:  # its age, for recovery.operation_timeout: when the journal recorded it
            started = next((r.started for r in self.journal.operations(pending_only=True)
                            if r.name == mem.pending_op), None)
            op = replace(op, started=started)
        failure = None
        if mem.phase is Phase.CREATING and op.done and op.error_code:
            classified = recreate.classify_operation(op, started_by_us=True)
            failure = classified.kind if classified is not None else None
        return op, failure

    def _worker_instances(self, node: NodeSnapshot | None) -> Any:
        """The node's worker VMs for the audit reader (read lazily by the TPU adapter), or None."""
        lookup = getattr(self.ports.tpu_for(node.zone), "worker_instances", None) if node is not None else None
        return lookup(node) if lookup is not None else None

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
        # Sooner only while an attempt runs and something looks wrong on a node that looks
        # fine: that is when a terminate/restart entry decides whether its end is charged. A
        # node that is down, being repaired or recreated is evidence enough by its state; the
        # log can wait for the minute.
        wrong = mem.phase is Phase.RUNNING and (
            node is None or (node.usable and any(p.state != "running" for p in probes or ())))
        due = since is None or since >= self.audit_interval or (wrong and since >= MIN_AUDIT_GAP)
        if not due:
            return [], None
        try:
            events, cursor = self.ports.audit.read([self.pcfg.tpu_name], self.journal.audit_cursor(),
                                                   self._worker_instances(node))
        except CloudError as exc:
            # The job can be kept alive without the audit log; it only loses one kind of evidence.
            warnings.append(f"audit log not read: {exc.message}")
            return [], None
        finally:
            # The shared reader (cloud/auditcache.py) says once when it cannot use its cache.
            take = getattr(self.ports.audit, "take_warnings", None)
            warnings.extend(take() if take is not None else ())
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
            elif isinstance(action, DeleteNode) and node is not None:
                tpu = self.ports.tpu_for(action.zone)
                what = action.name
                try:
                    name, what = self._delete(tpu, node)
                except NotFoundError:
                    name = ""  # already gone: the next tick sees it missing and creates
                self.journal.record_operation(now, decision.memory, name, "delete", action.zone)
                done.append(f"started deleting {what} in {action.zone} ({name or 'already gone'}): "
                            f"{action.reason}")
            elif isinstance(action, CreateNode):
                created, decision = self._create(action, decision, obs, before, now, again=again)
                done.extend(created)
        if (self._qr_id() and before.phase is Phase.CREATING and decision.memory.phase is Phase.QUEUED
                and obs.operation is not None and obs.operation.error_code):
            # The failed request keeps the name: delete it now (after the decision is journaled),
            # so it is gone by the retry's create. A tick killed before this line leaves it to
            # the retry (`_qr_create`), which deletes it then.
            done.extend(self._qr_clear(self.ports.tpu_for(before.zone or self.pcfg.zones[0])))
        return done, decision

    # -- queued resources: a node made through one is recreated through one ---------------------

    def _qr_id(self) -> str:
        """The queued resource id from [tpu] queued_resource ("" for a plain node).

        A full name keeps only its id: the zone is the one the create goes to.
        """
        return str(self.cfg.tpu.get("queued_resource") or "").rsplit("/", 1)[-1]

    @staticmethod
    def _qr_api(tpu: TpuApi) -> recreate.RecreateApi:
        # tpuwatch.cloud.tpu.TpuAdapter (and the simulator behind it) serves queued resources;
        # the narrower TpuApi port is what ticks of a plain node need.
        return cast(recreate.RecreateApi, tpu)

    def _delete(self, tpu: TpuApi, node: NodeSnapshot) -> tuple[str, str]:
        """Start deleting the node, through its queued resource (force) when it came from one."""
        qr = self._qr_id()
        if qr:
            if not self.flags.adopt and not recreate.owned(node, self.pcfg.job):
                raise recreate.ownership_error(node, self.pcfg.job)
            api = self._qr_api(tpu)
            if recreate.queued_status(api, qr).state:
                try:
                    return recreate.start_qr_delete(api, qr), f"queued resource {qr} and its node {node.name} (force)"
                except NotFoundError:
                    pass  # gone between the get and the delete: the node alone is left
        return recreate.start_delete(tpu, node, self.pcfg.job, adopt=self.flags.adopt), node.name

    def _qr_clear(self, tpu: TpuApi) -> list[str]:
        """Delete the job's queued resource when it FAILED or was SUSPENDED; what was done."""
        qr = self._qr_id()
        api = self._qr_api(tpu)
        status = recreate.queued_status(api, qr)
        if status.state not in QR_GIVEN_UP:
            return []
        try:
            op = recreate.start_qr_delete(api, qr)
        except NotFoundError:
            return []
        return [f"started deleting queued resource {qr} ({status.state}) so it can be created again: {op}"]

    def _qr_create(self, tpu: TpuApi, zone: str, *, resumed: bool, launch: Mapping[str, str]) -> str:
        """Start creating the queued resource; "" when this job's earlier request still stands.

        A request that FAILED (or was SUSPENDED) keeps its name until deleted, and a force
        delete removes the node before the request: either way the name is not free yet, so the
        create is refused as queueable and the policy retries it after its backoff.
        """
        qr = self._qr_id()
        api = self._qr_api(tpu)
        status = recreate.queued_status(api, qr)
        if status.state in QR_GIVEN_UP:
            done = self._qr_clear(tpu)
            raise recreate.CreateRejected(recreate.CreateFailure(
                "queueable", "unavailable", "ABORTED",
                f"queued resource {qr} is {status.state}"
                + ("; deleting it before the next create" if done else "")), zone)
        if status.state == "DELETING":
            raise recreate.CreateRejected(recreate.CreateFailure(
                "queueable", "unavailable", "ABORTED",
                f"queued resource {qr} is still being deleted; it is created again once it is gone"), zone)
        if status.state and resumed:
            return ""  # this job's own request (the journal was in CREATING): follow it, no second call
        return recreate.start_qr_create(api, self.cfg, zone, resumed=resumed, launch=launch)

    def _launch(self, node: NodeSnapshot, action: Launch) -> str:
        # Each worker not already running this attempt cleans up first (old process group,
        # device holders, a stale libtpu lockfile), in the launch's own connection; the
        # worker-side lock makes a repeat harmless.
        results = self.ports.workers.launch(node, action.attempt, action.checkpoint, clean=True)
        started = [r for r in results if r.started]
        problems = []
        for r in results:
            cleanup = getattr(r, "cleanup", None)
            if cleanup is not None and not cleanup.ok:
                problems.append(f"w{r.worker}: cleanup: {cleanup.describe()}")
            if not r.started:
                problems.append(f"w{r.worker}: {r.describe()}")
        where = (f"from {action.checkpoint.path} (step {action.checkpoint.step})"
                 if action.checkpoint else "from scratch (no complete checkpoint yet)")
        text = f"launched attempt {action.attempt} on {len(started)}/{len(results)} workers {where}"
        return text + ("; " + "; ".join(problems) if problems else "")

    def _stop(self, node: NodeSnapshot | None, reason: str, probes: Sequence[WorkerProbe] | None = None) -> str:
        if node is None or node.state != "READY":
            state = "missing" if node is None else node.state
            return f"did not stop workers: node is {state}, its workers cannot be reached ({reason})"
        if probes and all(p.state == "unreachable" for p in probes):
            # This tick's probe reached none of them (a node under maintenance refuses SSH): a
            # stop would fail the same way. What they left is stopped when they answer again
            # (stale_workers) or by the next launch's own cleanup.
            return f"did not stop workers: none answered this tick's probe ({reason})"
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
        # The new node's startup script (startup-scripts/resume-training.sh) can start the job at
        # boot, before the watcher reconnects: as the next attempt, from the newest complete
        # checkpoint, which the policy then follows instead of launching it a second time.
        launch = {"attempt": str(decision.memory.attempt + 1)}
        if obs.checkpoint is not None:
            launch.update(checkpoint=obs.checkpoint.path, step=str(obs.checkpoint.step))
        try:
            if self._qr_id():
                name = self._qr_create(tpu, action.zone, resumed=resumed, launch=launch)
            else:
                name = recreate.start_create(tpu, self.cfg, action.zone, resumed=resumed, launch=launch)
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
        through = f" through queued resource {self._qr_id()}" if self._qr_id() else ""
        return ([f"started creating {action.name}{through} in {action.zone} ({name or 'already exists'}): "
                 f"{action.reason}"], replace(decision, memory=mem))


def _until_cap(report: TickReport, limit: float) -> float:
    """`limit` seconds, or less when an action of the decision has a deadline (`until`) sooner."""
    for action in report.decision.actions:
        until = getattr(action, "until", None)
        if isinstance(until, datetime):
            limit = min(limit, max((until - report.time).total_seconds(), 0.05))
    return limit


def _describe(action: Any) -> str:
    d = action_dict(action)
    kind = d.pop("kind")
    reason = d.pop("reason", "")
    extra = ", ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], ()))
    return f"{kind}{' (' + extra + ')' if extra else ''}: {reason}"
