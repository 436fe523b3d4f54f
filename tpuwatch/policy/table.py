"""`decide`: the recovery table (policy/rows.py; docs/policy.md shows it) walked for one tick.

How a decision is found, in order:
1. a terminal phase (DONE, FAILED) stays as it is;
2. late disruption evidence for the last charged attempt refunds its charge;
3. while RUNNING, this tick's disruption signs are added to the attempt's evidence;
4. a phase with a cloud operation in flight (DELETING, CREATING, QUEUED) follows it: OP_ROWS;
5. otherwise the node's condition picks the handler: NODE_ROWS. Each handler ends a running
   attempt first when the node can no longer carry it, then decides for the node.
Every Decision names the row that made it (`Decision.row`, one of ROWS).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.model import (
    OWNER_LABEL,
    UNHEALTHY,
    AuditEvent,
    Checkpoint,
    NodeSnapshot,
    PrecheckReport,
    WorkerProbe,
)
from tpuwatch.policy.backoff import backoff_delay, next_level, restart_delay
from tpuwatch.policy.cadence import LOG_FACTOR, LOG_FLOOR, learn, log_age, silent_limit
from tpuwatch.policy.classify import (
    OUTCOMES,
    STOP_CODES,
    AttemptFacts,
    Outcome,
    Verdict,
    classify,
    describe_exit,
    in_window,
    is_notice,
    notice_evidence,
)
from tpuwatch.policy.maintenance import can_start_early
from tpuwatch.policy.nodes import NODE_ROWS, OP_ROWS, Cond, failed_repair, node_condition
from tpuwatch.policy.observe import launch_likely
from tpuwatch.policy.rows import ROW_IDS
from tpuwatch.policy.signatures import find
from tpuwatch.policy.state import (
    PHASE_EXIT,
    TERMINAL,
    AttemptEnd,
    Evidence,
    Memory,
    Phase,
    merge_evidence,
    move,
)
from tpuwatch.policy.values import (
    Action,
    ClearQueued,
    CreateNode,
    Decision,
    DeleteNode,
    Fail,
    FollowOperation,
    ImpossibleObservation,
    Launch,
    MarkDone,
    NeedsPerson,
    Observation,
    PolicyConfig,
    StartMaintenance,
    StopWorkers,
    Wait,
)

NOT_FOUND = 5  # google.rpc.Code: a delete that finds nothing has done its job
RESOURCE_EXHAUSTED = 8  # google.rpc.Code: how a given-up queued resource is shown when it gave none
# What a queueable create failure is called, by its recreate.CreateFailure reason.
SHORTFALLS = {
    "no_capacity": "no capacity",
    "quota": "out of quota",
    "reservation": "reservation shortfall (not enough reserved capacity)",
    "unavailable": "create failed for a transient reason",
}
DISRUPTING_EVENTS = frozenset({"terminate", "restart"})  # AuditEvent.kind values that are evidence
# hang_timeout = "auto": never judge a hang sooner than this, whatever the checkpoint interval
# (a job that saves every 5 minutes may still pause for an evaluation); and the workers' log
# growth is recorded at most this often.
HANG_AUTO_FLOOR = 30 * 60.0
LOG_GRAIN = 10 * 60.0
HUNG = "hung: no new checkpoint"  # how a hung attempt's reason begins (after "attempt <n>: ")
HUNG_SAID = "hung: the runtime says so"  # how the reason of an attempt a runtime signature called hung begins
DIRTY = "dirty host"  # how the end of an attempt whose worker could not open its TPU is told
# After a notice ended an attempt, the node is about to stop (Compute Engine gives about 60 s
# before maintenance, 30 s before a preemption): launch there again only once it went down and
# came back, or after this long if it never went down.
NOTICE_HOLD = 5 * 60.0
# A node in UNKNOWN with no health is past a failed repair (the API's own words): the repair
# that repair_timeout waits for is over. It is recreated once it has stayed so this long, the
# service's diagnosis that UNKNOWN covers (its length is not published) given a few polls to
# bring it back; a recreate costs a delete, a create and a chance of meeting no capacity.
FAILED_REPAIR_GRACE = 5 * 60.0
# An end that would be charged, seen with no exit code of the job's own (its process vanished, or
# SIGKILL/SIGTERM ended it), is charged at once and the job relaunched at once; a node read this
# long after it that shows a host going away (the API may report it after the processes died)
# refunds it. The relaunch comes in the tick that saw the end; the tick after it (a sixth of a
# poll later at most) reads the node after the sighting, and at the defaults one more follows
# within the window.
END_CONFIRM_WINDOW = 60.0
# maintenance.start_early: when no new checkpoint lands first, start it this long before its window.
EARLY_MARGIN = 10 * 60.0
# While an early start waits for the job's next checkpoint: from EARLY_LEAD of the checkpoint
# interval before it is due, look every EARLY_CHECK of the interval (never more often than every
# EARLY_CHECK_MIN seconds: a tick probes every worker over SSH; never less often than a poll), so
# the job is stopped within ~0.1 % of a 30 min interval of its save instead of within a poll (a
# 30 s poll is 1.6 % of it). These ticks are spent only in one stretch per announced maintenance.
EARLY_LEAD = 0.1
EARLY_CHECK = 0.001
EARLY_CHECK_MIN = 1.0




def effective_hang_limit(cfg: PolicyConfig, mem: Memory, from_start: bool = False) -> float:
    """How long without a checkpoint makes an attempt hung (from its start when `from_start`,
    else from its newest checkpoint); 0 = not judged (off, or "auto" before it has seen the
    job's checkpoint interval). With "auto" the logs must also have been silent that long."""
    if not cfg.hang_auto:
        return cfg.hang_timeout
    if mem.ckpt_gap <= 0:
        return 0.0
    base = (max(mem.ckpt_first, mem.ckpt_gap) + 2 * mem.ckpt_gap) if from_start else 3 * mem.ckpt_gap
    return max(HANG_AUTO_FLOOR, base)


def decide(obs: Observation, mem: Memory, cfg: PolicyConfig, now: datetime) -> Decision:
    """The decision for one tick. Pure: the same arguments always give the same Decision."""
    _check(obs, mem, cfg, now)
    tick = _Tick(obs, cfg, now)
    if mem.phase in TERMINAL:
        word = "done" if mem.phase is Phase.DONE else "failed"
        # The stop that went with the end may not have happened (the tick was killed): repeat it.
        left = [p for p in obs.probes or () if p.state == "running"]
        stop = (StopWorkers(f"job {word}: stopping leftover workers {_workers(left)}"),) if left else ()
        decision = tick.out(mem, "terminal", f"job {word}: {mem.reason}", *stop)
    elif obs.maintenance_refused:
        decision = tick.early_refused(mem)
    else:
        new = tick.refund(boots_seen(obs.node, mem, now))
        if new.phase is Phase.RUNNING:
            new = replace(new, evidence=merge_evidence(new.evidence, tick.signs(new)))
        handler = OP_ROWS.get(new.phase) or NODE_ROWS[node_condition(obs.node)]
        decision = getattr(tick, handler)(new)
    if obs.checks and obs.node is not None:
        # What more to observe in this tick (policy/settle.py bounds the re-decisions).
        launches = any(isinstance(a, Launch) for a in decision.actions)
        unchecked = obs.precheck is None or obs.precheck.context != "launch"
        decision = replace(decision, check_first=launches and unchecked,
                           check_after=decision.row == "precheck_fix" and not obs.precheck_fixed)
    if obs.node is not None and decision.memory.notice_hold is None and launch_likely(decision.memory, obs.node, now):
        # An end whose relaunch is due now: after the stop, look at the workers again and launch
        # in this same tick, rather than on the next one.
        probe_after = bool(decision.ended) and any(isinstance(a, StopWorkers) and not a.blocked
                                                   for a in decision.actions)
        # The probe after the stop must find the old attempt gone: that stop is waited for.
        actions = tuple(replace(a, wait=True) if probe_after and isinstance(a, StopWorkers) else a
                        for a in decision.actions)
        decision = replace(decision, probe_after=probe_after, actions=actions)
    if obs.dry_run:
        return replace(decision, memory=mem, summary=f"dry run: {decision.summary}", ended=(), operation_done=None)
    return decision


def boots_seen(node: NodeSnapshot | None, mem: Memory, now: datetime) -> Memory:
    """Memory that knows when this policy last saw the node boot: a node id other than the one it
    knew (not the first one it sees), or usable again after it saw it not usable."""
    if node is None:
        return mem
    up = node.usable
    if node.id != mem.node_seen:
        return replace(mem, node_seen=node.id, node_down=not up, booted_at=now if mem.node_seen else None)
    if up == mem.node_down:  # a change: down now, or up again
        return replace(mem, node_down=not up, booted_at=now if up else mem.booted_at)
    return mem


def _maintained_since(node: NodeSnapshot, since: datetime) -> bool:
    """The node reports a maintenance event (its health description's time) after `since`.

    A maintenance shorter than a poll goes down and comes back between two ticks; this is how
    the node says it happened all the same."""
    return node.maintenance_time is not None and node.maintenance_time > since


def boot_time(node: NodeSnapshot, mem: Memory) -> datetime | None:
    """The node's latest boot known: its create time, its last maintenance, or a boot seen."""
    times = [t for t in (node.create_time, node.maintenance_time, mem.booted_at) if t is not None]
    return max(times) if times else None


def operation_started(mem: Memory, name: str) -> Memory:
    """Memory after the tick started the DeleteNode/CreateNode operation called `name`.

    "" (a create answered ALREADY_EXISTS for tpuwatch's own earlier create) records nothing:
    the next tick sees the node.
    """
    if mem.phase not in (Phase.DELETING, Phase.CREATING):
        raise ValueError(f"operation_started: no operation is started in phase {mem.phase.value}")
    return replace(mem, pending_op=name) if name else mem


# ---------------------------------------------------------------------------------------------


def _check(obs: Observation, mem: Memory, cfg: PolicyConfig, now: datetime) -> None:
    """Raise ImpossibleObservation, naming phase and evidence, when inputs contradict each other."""
    if now.tzinfo is None:
        raise ValueError("decide: `now` must carry a time zone")
    phase = mem.phase
    if not 0.0 <= obs.jitter < 1.0:
        raise ImpossibleObservation(phase, f"jitter {obs.jitter!r} is outside [0, 1)")
    if obs.node is not None and obs.node.name != cfg.tpu_name:
        raise ImpossibleObservation(phase, f"observed node {obs.node.name!r}, but the job watches {cfg.tpu_name!r}")
    if obs.probes is not None:
        workers = [p.worker for p in obs.probes]
        if len(set(workers)) != len(workers):
            raise ImpossibleObservation(phase, f"two probes for one worker: {sorted(workers)}")
    op = obs.operation
    if op is not None:
        if phase not in (Phase.DELETING, Phase.CREATING):
            raise ImpossibleObservation(phase, f"status of operation {op.name!r} observed, but none is pending")
        if op.name and op.name != mem.pending_op:
            raise ImpossibleObservation(
                phase, f"status of operation {op.name!r} observed, but the pending one is {mem.pending_op!r}"
            )
        if not op.name and not op.done:
            raise ImpossibleObservation(phase, "a refused call (operation name \"\") must be done")
    if phase is Phase.RUNNING and (mem.attempt < 1 or mem.attempt_start is None):
        raise ImpossibleObservation(phase, f"memory records no attempt start (attempt {mem.attempt})")
    if mem.pending_op is not None and not mem.pending_kind:
        raise ImpossibleObservation(phase, f"memory records operation {mem.pending_op!r} in flight")
    if phase is Phase.QUEUED and (mem.retry_at is None or mem.queued_since is None):
        raise ImpossibleObservation(phase, "memory records no retry time")


def _secs(d: timedelta) -> float:
    return d.total_seconds()


def _workers(probes: list[WorkerProbe]) -> str:
    return ", ".join(str(p.worker) for p in probes)


def _event_text(ev: AuditEvent) -> str:
    where = f" on worker {ev.worker}" if ev.worker else ""
    why = f" ({ev.reason})" if ev.reason else ""
    return f"audit {ev.method or ev.kind}{where}{why}"


def _ckpt_text(ckpt: Checkpoint | None, now: datetime) -> str:
    if ckpt is None:
        return "no checkpoint yet"
    # a save that lands while the tick runs is stamped after `now`: call it 0s old
    age = f", {human(max(0.0, _secs(now - ckpt.time)))} old" if ckpt.time is not None else ""
    return f"checkpoint step {ckpt.step} ({ckpt.path}{age})"


def _ends(probes: tuple[WorkerProbe, ...], attempt: int) -> dict[int, int | None]:
    """worker -> exit code, for each worker no longer running `attempt` (None: no code)."""
    out: dict[int, int | None] = {}
    for p in probes:
        if p.state == "running" and p.attempt == attempt:
            continue
        # exited with its code; absent, unreachable or showing another attempt: gone, no code
        out[p.worker] = p.exit_code if p.state == "exited" and p.attempt == attempt else None
    return out


class _Tick:
    """One decision in the making: handlers per row, sharing the actions and notes so far."""

    def __init__(self, obs: Observation, cfg: PolicyConfig, now: datetime) -> None:
        self.obs = obs
        self.cfg = cfg
        self.now = now
        self.actions: list[Action] = []
        self.ended: list[AttemptEnd] = []
        self.notes: list[str] = []
        self.op_done: str | None = None

    def out(self, mem: Memory, row: str, summary: str, *actions: Action) -> Decision:
        if row not in ROW_IDS:
            raise KeyError(f"policy bug: unknown row {row!r}")
        self.actions.extend(actions)
        acts = [self._stoppable(a) for a in self.actions]
        if any(isinstance(a, (StartMaintenance, Launch)) for a in acts):
            # What comes next needs the job gone first (a job saving on SIGTERM before its
            # host goes down, a launch): the stop is waited for.
            acts = [replace(a, wait=True) if isinstance(a, StopWorkers) else a for a in acts]
        return Decision(
            actions=tuple(acts),
            memory=mem,
            summary="; ".join([*self.notes, summary]),
            exit_code=PHASE_EXIT[mem.phase],
            row=row,
            ended=tuple(self.ended),
            operation_done=self.op_done,
        )

    def _stoppable(self, action: Action) -> Action:
        """A stop the workers can take: one that cannot reach them says why, and is not tried."""
        if not isinstance(action, StopWorkers) or action.blocked:
            return action
        node, probes = self.obs.node, self.obs.probes
        if node is None or not node.reachable:
            state = "missing" if node is None else node.state
            return replace(action, blocked=f"node is {state}, its workers cannot be reached")
        if probes and all(p.state == "unreachable" for p in probes):
            # This tick's probe reached none of them (a node under maintenance refuses SSH): a
            # stop would fail the same way.
            return replace(action, blocked="none answered this tick's probe")
        return action

    def fail(self, mem: Memory, row: str, reason: str, evidence: tuple[str, ...] = ()) -> Decision:
        return self.out(move(mem, Phase.FAILED, reason=reason), row, f"job failed: {reason}", Fail(reason, evidence))

    def halt(self, mem: Memory, row: str, reason: str, evidence: tuple[str, ...] = ()) -> Decision:
        return self.out(move(mem, Phase.HALTED, reason=reason), row, f"needs a person: {reason}",
                        NeedsPerson(reason, evidence))

    # -- evidence ---------------------------------------------------------------------------

    def _disrupting(self) -> list[AuditEvent]:
        names = self.cfg.slices or (self.cfg.tpu_name,)
        return [e for e in self.obs.events if e.kind in DISRUPTING_EVENTS and e.node in names]

    def explains(self, ev: AuditEvent, start: datetime) -> bool:
        """Can audit event `ev` explain the end of an attempt launched at `start`?

        A restart entry is written when the node comes back, which is when tpuwatch launches
        (within one poll): one stamped before `start` + poll_interval describes the return the
        attempt was launched on, not a disruption of it.
        """
        if ev.kind == "restart":
            return ev.time > start + timedelta(seconds=self.cfg.poll_interval)
        return ev.time >= start

    def signs(self, mem: Memory) -> list[Evidence]:
        """This tick's signs that the infrastructure disturbed the running attempt."""
        start, now, node = mem.attempt_start, self.now, self.obs.node
        assert start is not None  # checked in _check
        out = [Evidence(min(e.time, now), _event_text(e)) for e in self._disrupting() if self.explains(e, start)]
        if node is None:
            return [*out, Evidence(now, "node missing")]
        # a multislice job: which slice (node "ms" is the job's name for all of them)
        for part in node.slices or (node,):
            what = f"slice {part.name or '(missing)'}" if node.slices else "node"
            if part.state != "READY":
                out.append(Evidence(now, f"{what} state {part.state}"))
            if part.health in UNHEALTHY:
                out.append(Evidence(now, f"{what} health {part.health}"))
        if mem.attempt_node_id and node.id != mem.attempt_node_id:
            out.append(Evidence(now, f"node id changed from {mem.attempt_node_id} to {node.id}"))
        for s in node.symptoms:
            if s.time is not None and start <= s.time:
                out.append(Evidence(min(s.time, now), f"symptom {s.type} on worker {s.worker_id or '?'}"))
        if node.maintenance_time is not None and start <= node.maintenance_time:
            # "The TPU had a maintenance event at ...": what a healed node still says afterwards
            out.append(Evidence(min(node.maintenance_time, now), "node health description: a maintenance event"))
        um = node.upcoming_maintenance
        if um is not None and um.status == "ONGOING":
            out.append(Evidence(now, f"{um.type.lower()} maintenance ONGOING"))
        for p in self.obs.probes or ():
            if p.notice and p.attempt == mem.attempt:
                out.append(notice_evidence(now, p.notice, p.worker))
        pre = self.obs.precheck
        if pre is not None and pre.context == "running" and pre.node_id in ("", node.id):
            # The same text for the same item every time: one evidence entry per failing item.
            out.extend(Evidence(now, f"environment check {i.check} failed on worker {i.worker}")
                       for i in pre.failing)
        return out

    def late_signs(self, last: AttemptEnd) -> list[tuple[datetime, str]]:
        """Signs that can still explain an attempt after its end: the audit log's terminate and
        restart entries, and the maintenance time a healed node's health description gives."""
        out = [(ev.time, _event_text(ev)) for ev in self._disrupting() if self.explains(ev, last.start)]
        node = self.obs.node
        if node is not None and node.id == last.node_id and node.maintenance_time is not None:
            out.append((node.maintenance_time, f"node had a maintenance event at {node.maintenance_time.isoformat()}"))
        return out

    def host_gone_signs(self, last: AttemptEnd) -> list[tuple[datetime, str]]:
        """What this tick's node read says of a host going away after the end `last`: the node
        (or a slice) not READY or not healthy, missing, or another node id. Dated at the end,
        which they explain."""
        node, after = self.obs.node, f"seen {human(_secs(self.now - last.end))} after the end"
        if node is None:
            return [(last.end, f"node missing, {after}")]
        out = [(last.end, f"node id changed from {last.node_id} to {node.id}, {after}")] \
            if last.node_id and node.id != last.node_id else []
        for part in node.slices or (node,):
            what = f"slice {part.name or '(missing)'}" if node.slices else "node"
            if part.state != "READY":
                out.append((last.end, f"{what} state {part.state}, {after}"))
            if part.health in UNHEALTHY:
                out.append((last.end, f"{what} health {part.health}, {after}"))
        return out

    def refund(self, mem: Memory) -> Memory:
        """A sign that arrives after the charged end it explains refunds it: the audit log's and
        the health description's whenever they come, and within END_CONFIRM_WINDOW of an end
        charged on first sight, the node itself showing a host going away."""
        last = mem.last_end
        if last is None or not last.charged:
            return replace(mem, confirm_by=None) if mem.confirm_by is not None else mem
        signs, until = self.late_signs(last), last.end
        if mem.confirm_by is not None:
            # Open: the first node read after the end counts however late it is (a watcher
            # stopped between two ticks), and every one until confirm_by. The sighting came
            # after its tick's `now`, so a maintenance dated up to this read may explain it.
            signs, until = signs + self.host_gone_signs(last), self.now
            if self.now > mem.confirm_by:
                mem = replace(mem, confirm_by=None)
        for t, text in signs:
            if not in_window(min(t, self.now), last.start, until, self.cfg.evidence_window):
                continue
            fixed = replace(last, outcome=Outcome.DISRUPTION.value, charged=False, streak_added=False,
                            reason=f"{last.reason}; re-classified as a disruption: {text} arrived late")
            self.ended.append(fixed)
            self.notes.append(f"attempt {last.attempt} was ended by a disruption ({text}, reported late): "
                              "its restart is refunded")
            mem = replace(
                mem,
                last_end=fixed,
                confirm_by=None,
                restarts=max(0, mem.restarts - 1),
                disruptions=mem.disruptions + 1,
                no_progress=max(0, mem.no_progress - int(last.streak_added)),
                backoff_level=max(0, mem.backoff_level - 1),
                backoff_until=None,
            )
            return move(mem, Phase.IDLE) if mem.phase is Phase.BACKOFF else mem
        return mem

    # -- ending an attempt ------------------------------------------------------------------

    def finish(
        self, mem: Memory, codes: dict[int, int | None], reachable: bool, detail: str = "", hung: str = "",
        unsure: bool = False,
    ) -> tuple[Memory, str, Decision | None]:
        """End the running attempt: classify it, update the counters.

        Returns the memory (IDLE after a disruption, BACKOFF after a charged failure), a line
        for people, and a Decision when the job is over (done, failed). `hung`: tpuwatch ends a
        live attempt that stopped making progress; a charged failure whatever the evidence, since
        evidence within evidence_window of the stop postdates a hang older than hang_timeout.
        `unsure`: no worker exited with a code of its own; a charge stays open to a refund for
        END_CONFIRM_WINDOW (`refund`).
        """
        cfg, now, n = self.cfg, self.now, mem.attempt
        start = mem.attempt_start
        assert start is not None  # checked in _check
        verdict = Verdict(Outcome.FAILURE, None, hung, ()) if hung else classify(
            AttemptFacts(start, now, codes, cfg.primary_worker, mem.evidence, seen=mem.end_seen),
            min_uptime=cfg.min_uptime, fail_fast=cfg.fail_fast_exit_codes, window=cfg.evidence_window,
        )
        cost = OUTCOMES[verdict.outcome]
        mem_evidence = mem.evidence
        ckpt = self.obs.checkpoint
        end_step = ckpt.step if ckpt is not None else None
        progressed = self.progressed(mem)
        streak_added = cost.charged and not progressed
        confirm_by = now + timedelta(seconds=END_CONFIRM_WINDOW) if unsure and cost.charged else None
        reason = f"attempt {n}: {verdict.reason}" + (f" ({detail})" if detail else "")
        end = AttemptEnd(n, start, now, mem.attempt_node_id, mem.attempt_start_step, end_step,
                         verdict.outcome.value, cost.charged, verdict.exit_code, reason, streak_added)
        self.ended.append(end)
        mem = replace(
            mem, last_end=end, evidence=(), unreachable_since=None, end_seen=None, confirm_by=confirm_by,
            no_progress=0 if progressed else mem.no_progress + int(streak_added),
            disruptions=mem.disruptions + int(verdict.outcome is Outcome.DISRUPTION),
        )
        if _secs(now - start) >= cfg.stable_run:
            # A run this long shows the job and the node are sound: the budgets count trouble
            # since then, so a month-long spot job is not failed by its fourth preemption.
            mem = replace(mem, restarts=0, recreates=0)
        if reachable:
            stop_why = "job done: stopping the other workers" if verdict.outcome is Outcome.SUCCESS \
                else f"attempt {n} ended: stopping every worker"
            self.actions.append(StopWorkers(stop_why, wait=False))
        if verdict.outcome is Outcome.SUCCESS:
            done = move(mem, Phase.DONE, reason=reason)
            return done, reason, self.out(done, "success", f"job done: {reason}", MarkDone(reason))
        if verdict.outcome is Outcome.FAIL_FAST:
            return mem, reason, self.fail(mem, "fail_fast", reason, verdict.evidence)
        if verdict.outcome is Outcome.DISRUPTION:
            noticed = any(is_notice(e) for e in mem_evidence)
            hold = now + timedelta(seconds=NOTICE_HOLD) if noticed else None
            return move(mem, Phase.IDLE, notice_hold=hold), f"{reason}; not charged", None
        # charged: failed start or failure
        since = f"step {mem.attempt_start_step}" if mem.attempt_start_step is not None else "no checkpoint"
        if mem.no_progress >= cfg.no_progress_limit:
            why = (f"{mem.no_progress} attempts in a row ended with no checkpoint newer than {since} "
                   f"(last: {hung or describe_exit(verdict.exit_code)}); a deterministic bug is not retried forever")
            return mem, why, self.fail(mem, "no_progress", why, (reason,))
        if mem.restarts >= cfg.max_restarts:
            why = f"restart budget spent: {mem.restarts} of recovery.max_restarts = {cfg.max_restarts} used"
            return mem, why, self.fail(mem, "budget_spent", why, (reason,))
        ran = _secs(now - start)
        level = next_level(mem.backoff_level, ran, cfg.stable_run)
        delay = restart_delay(level, cfg.backoff_base, cfg.backoff_max, self.obs.jitter)
        mem = move(mem, Phase.BACKOFF, restarts=mem.restarts + 1, backoff_level=level,
                   backoff_until=now + timedelta(seconds=delay))
        when = f"relaunching in {human(delay)}" if delay else "relaunching now (the first charged restart since a stable run)"
        if confirm_by is not None:
            when += (f"; refunded if the node shows a host going away by {confirm_by.isoformat()} "
                     "(no worker exited with a code of its own)")
        return mem, f"{reason}; charged (restart {mem.restarts} of {cfg.max_restarts}), {when}", None

    def confirm_end(self, mem: Memory, codes: dict[int, int | None]) -> Decision:
        """An end seen on a node that looks usable: end it now, and relaunch as its class says.

        This tick read the node before it probed the workers: a maintenance that began in
        between killed the job on a node this tick saw as healthy (and the API may report a
        host going away after its processes died). So when no worker exited with a code of its
        own, a charge is open to the node reads that follow (`refund`, END_CONFIRM_WINDOW): the
        next tick's read comes after this sighting, however soon, and a host going away then
        refunds it; the relaunch does not wait for them. Only a charge that would end the job
        (its restart budget or no-progress limit) waits one tick for that read first (row
        `end_confirm`): a job is never failed on an end its node may yet explain.
        """
        cfg = self.cfg
        start = mem.attempt_start
        assert start is not None  # checked in _check
        own = codes.get(cfg.primary_worker) == 0 or any(
            c is not None and c != 0 and c not in STOP_CODES for c in codes.values())
        if own or mem.end_seen is not None:
            return self.end_usable(mem, codes)
        verdict = classify(AttemptFacts(start, self.now, codes, cfg.primary_worker, mem.evidence),
                           min_uptime=cfg.min_uptime, fail_fast=cfg.fail_fast_exit_codes, window=cfg.evidence_window)
        if not OUTCOMES[verdict.outcome].charged:
            return self.end_usable(mem, codes)
        if not self.ends_job(mem, start):
            return self.end_usable(mem, codes, unsure=True)
        return self.out(replace(mem, end_seen=self.now), "end_confirm",
                        f"attempt {mem.attempt}: {verdict.reason}; nothing charged yet: charging it would end the "
                        "job, and a host taken down looks the same before the node says so, so the next tick "
                        "looks at the node again first",
                        Wait(None, "confirming how the attempt ended"))

    def progressed(self, mem: Memory) -> bool:
        """The newest checkpoint is newer than the one the running attempt started from."""
        ckpt = self.obs.checkpoint
        return ckpt is not None and (mem.attempt_start_step is None or ckpt.step > mem.attempt_start_step)

    def ends_job(self, mem: Memory, start: datetime) -> bool:
        """Charging the running attempt's end now would fail the job (as `finish` counts)."""
        streak = 0 if self.progressed(mem) else mem.no_progress + 1
        restarts = 0 if _secs(self.now - start) >= self.cfg.stable_run else mem.restarts
        return streak >= self.cfg.no_progress_limit or restarts >= self.cfg.max_restarts

    def end_usable(self, mem: Memory, codes: dict[int, int | None], detail: str = "", unsure: bool = False) -> Decision:
        mem, line, final = self.finish(mem, codes, reachable=True, detail=detail, unsure=unsure)
        if final is not None:
            return final
        last = mem.last_end
        assert last is not None
        row = {Outcome.DISRUPTION.value: "notice_end" if mem.notice_hold else "disruption",
               Outcome.FAILED_START.value: "failed_start"}.get(last.outcome, "failure")
        wait = Wait(mem.backoff_until, "backoff before the next attempt") if mem.phase is Phase.BACKOFF else None
        return self.out(mem, row, line, *([wait] if wait else []))

    def end_unusable(self, mem: Memory) -> tuple[Memory, Decision | None]:
        """The node can no longer carry the attempt: end it (a disruption, or a success)."""
        if mem.phase is not Phase.RUNNING:
            return mem, None
        probes = self.obs.probes or ()
        codes = _ends(probes, mem.attempt)
        node = self.obs.node
        # a multislice job's slices that are still READY: the attempt is stopped there too
        reachable = node is not None and node.reachable and bool(probes)
        mem, line, final = self.finish(mem, codes, reachable=reachable)
        if final is None:
            self.notes.append(line)
        return mem, final

    # -- node rows --------------------------------------------------------------------------

    def usable(self, mem: Memory) -> Decision:
        node = self.obs.node
        assert node is not None
        if mem.unhealthy_since is not None or mem.unknown_since is not None:
            mem = replace(mem, unhealthy_since=None, unknown_since=None)
        if mem.phase in (Phase.WAITING_NODE, Phase.PAUSED, Phase.HALTED):
            self.notes.append(f"{self.subject} is READY+HEALTHY")
            # A notice's hold ends too: the node went down and came back.
            mem = move(mem, Phase.IDLE, reason="", notice_hold=None)
        if not self.obs.probes:
            return self.out(mem, "probe_failed", "could not probe the workers; looking again next tick",
                            Wait(None, "workers not probed"))
        if mem.phase is Phase.RUNNING:
            return self.running(mem)
        return self.idle(mem)

    def running(self, mem: Memory) -> Decision:
        cfg, n = self.cfg, mem.attempt
        probes = tuple(sorted(self.obs.probes or (), key=lambda p: p.worker))
        for p in probes:
            if p.attempt is not None and p.attempt > n and p.state in ("running", "exited"):
                raise ImpossibleObservation(
                    mem.phase, f"the journal's latest attempt is {n}, but worker {p.worker} shows attempt "
                               f"{p.attempt} ({p.state}); is another tpuwatch launching this job?")
        # "absent" with this attempt's number: it was launched there and died with no exit code
        # (killed, or the host rebooted before any tick saw it run). That is a trace: end it and
        # classify the end; relaunching the same number would only be refused as "ran".
        mine = [p for p in probes if p.attempt == n and p.state in ("running", "exited", "absent")]
        if not mem.attempt_seen and not mine:
            return self.unseen(mem, probes)
        # Workers that never had attempt n (their attempt file is monotonic): a launch cut short
        # (the watcher killed between workers, a launch refused or lost on one), not an end.
        missing = [p for p in probes if p.state != "unreachable" and (p.attempt or 0) < n]
        if not mem.attempt_seen and missing and all(p.state == "running" for p in mine):
            return self.launch_rest(mem, missing, [p for p in probes if p.state == "unreachable"])
        mem = replace(mem, attempt_seen=True, launch_tries=0)
        signed = self.signature(mem, probes)
        if signed is not None:
            return signed
        codes = _ends(probes, n)
        unreachable = [p for p in probes if p.state == "unreachable"]
        if codes.get(cfg.primary_worker) == 0 or any(
            c != 0 for w, c in codes.items() if w not in {p.worker for p in unreachable}
        ):
            return self.confirm_end(mem, codes)
        alive = [p for p in probes if p.state == "running" and p.attempt == n]
        if unreachable and not alive:
            return self.out(mem, "workers_unreachable",
                            f"cannot reach workers {_workers(unreachable)}; attempt {n} unknown, looking again",
                            Wait(None, "workers unreachable"))
        if unreachable:
            since = mem.unreachable_since or self.now
            if _secs(self.now - since) >= cfg.unreachable_grace:
                return self.end_usable(mem, codes, detail=f"worker {_workers(unreachable)} unreachable "
                                                         f"for {human(_secs(self.now - since))}")
            until = since + timedelta(seconds=cfg.unreachable_grace)
            return self.out(replace(mem, unreachable_since=since), "unreachable_grace",
                            f"worker {_workers(unreachable)} unreachable while the others run attempt {n}; "
                            f"ending it at {until.isoformat()} if it stays so", Wait(until, "unreachable worker"))
        mem = replace(mem, unreachable_since=None, end_seen=None)
        start = mem.attempt_start
        assert start is not None
        if len(alive) == len(probes):
            mem, quiet, from_start = self.quiet(mem, start)
            mem, silent = self.silence(mem, start)
            age = log_age(probes, n)
            mem = learn(mem, age, self.now, start, warm=not from_start, poll=cfg.poll_interval)
            cut = silent_limit(mem) if cfg.hang_auto and not from_start and age is not None else 0.0
            if cut > 0 and age is not None and age >= cut and quiet >= cut:
                return self.log_silent(mem, quiet, age)
            limit = effective_hang_limit(cfg, mem, from_start)
            # "auto" also wants the logs silent: a long evaluation that prints is not a hang.
            if limit > 0 and quiet >= limit and (not cfg.hang_auto or silent >= limit):
                return self.hung(mem, quiet, silent if cfg.hang_auto else None)
            early = self.early(mem, probes)
            if early is not None:
                return early
        return self.out(mem, "running", f"attempt {n} running on {len(alive)} worker(s) for "
                                        f"{human(_secs(self.now - start))}; {_ckpt_text(self.obs.checkpoint, self.now)}")

    # -- announced maintenance, started early (maintenance.start_early) ---------------------

    def early(self, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision | None:
        """While every worker runs on an owned node whose announced maintenance may start early:
        wait for the next complete checkpoint, then end the attempt (uncharged), stop the job and
        start the maintenance. None when there is nothing to do about maintenance."""
        node, cfg, now, ck = self.obs.node, self.cfg, self.now, self.obs.checkpoint
        assert node is not None
        um = node.upcoming_maintenance
        if (not cfg.start_early or um is None or not can_start_early(um)
                or not (self.obs.adopt or node.owned_by(cfg.job))
                or (mem.early_refused is not None and mem.early_refused == um.window_start)):
            return None
        if mem.early_window != um.window_start or mem.early_window is None:
            mem = replace(mem, early_window=um.window_start, early_step=ck.step if ck is not None else None)
        saved = ck is not None and (mem.early_step is None or ck.step > mem.early_step)
        latest = um.window_start - timedelta(seconds=EARLY_MARGIN) if um.window_start is not None else now
        window = um.window_start.isoformat() if um.window_start is not None else "not given"
        if not saved and now < latest:
            after = f"newer than step {mem.early_step}" if mem.early_step is not None else "its first"
            return self.out(mem, "early_wait", f"attempt {mem.attempt} running; {um.type.lower()} maintenance "
                                               f"(window {window}) may start early: starting it after the next "
                                               f"checkpoint ({after}), at the latest at {latest.isoformat()}",
                            Wait(min(latest, self.early_check(mem)), "maintenance to start after the next checkpoint"))
        why = (f"checkpoint step {ck.step} saved after the maintenance notice" if saved and ck is not None
               else f"no new checkpoint {human(EARLY_MARGIN)} before the window ({window})")
        sign = Evidence(now, f"maintenance started early by tpuwatch ({why})")
        mem = replace(mem, evidence=merge_evidence(mem.evidence, [sign]))
        mem, line, final = self.finish(mem, {p.worker: None for p in probes}, reachable=True)
        if final is not None:
            return final
        # The node is about to go down: no launch there until it has gone down and come back.
        mem = replace(mem, notice_hold=now + timedelta(seconds=NOTICE_HOLD))
        return self.out(mem, "early_start", f"{line}; starting the maintenance of node {node.name} now ({why})",
                        StartMaintenance(node.name, f"{why}: starting the {um.type.lower()} maintenance "
                                                    f"(window {window}) now"))

    def early_check(self, mem: Memory) -> datetime:
        """When to look for the awaited checkpoint next: shortly, once it is nearly due by the
        interval this attempt has shown (`ckpt_gap`, from its newest checkpoint); at the start of
        that stretch before it; a poll from now when the interval is not known yet."""
        gap, last, now = mem.ckpt_gap, mem.progress_time, self.now
        if gap <= 0 or last is None or self.obs.checkpoint is None or mem.progress_step != self.obs.checkpoint.step:
            return now + timedelta(seconds=self.cfg.poll_interval)
        close = last + timedelta(seconds=gap * (1 - EARLY_LEAD))
        if now < close:
            return close
        return now + timedelta(seconds=min(self.cfg.poll_interval, max(EARLY_CHECK_MIN, gap * EARLY_CHECK)))

    def early_refused(self, mem: Memory) -> Decision:
        node = self.obs.node
        um = node.upcoming_maintenance if node is not None else None
        mem = replace(mem, early_refused=um.window_start if um is not None else mem.early_window, notice_hold=None)
        return self.out(mem, "early_refused", f"the maintenance could not be started early "
                                              f"({self.obs.maintenance_refused}); relaunching, and the job "
                                              "gets the last-minute notice instead",
                        Wait(None, "relaunch after the refused early maintenance"))

    def quiet(self, mem: Memory, start: datetime) -> tuple[Memory, float, bool]:
        """Seconds since the attempt last showed progress, and whether that is since its start.

        Progress is its newest checkpoint when newer than the one it resumed from (the
        checkpoint's own time when the store gives one, else when a tick first saw it). Each
        new one also teaches the memory the job's checkpoint interval (for "auto")."""
        ckpt, now, since = self.obs.checkpoint, self.now, start
        if ckpt is not None and (mem.attempt_start_step is None or ckpt.step > mem.attempt_start_step):
            this_attempt = mem.progress_at is not None and mem.progress_at >= start
            if mem.progress_step != ckpt.step or not this_attempt:
                seen = ckpt.time if ckpt.time is not None else now
                if this_attempt and mem.progress_time is not None and (mem.progress_step or 0) < ckpt.step:
                    mem = replace(mem, ckpt_gap=max(mem.ckpt_gap, _secs(seen - mem.progress_time)))
                elif not this_attempt:
                    mem = replace(mem, ckpt_first=max(mem.ckpt_first, _secs(seen - start)))
                mem = replace(mem, progress_step=ckpt.step, progress_at=now, progress_time=seen)
            seen = mem.progress_time or mem.progress_at or since
            since = max(since, seen)
        return mem, max(0.0, _secs(now - since)), since == start

    def silence(self, mem: Memory, start: datetime) -> tuple[Memory, float]:
        """Seconds the attempt's workers have written no output (0 when a size is unknown).

        The growth is recorded at most every LOG_GRAIN: the silence can be underestimated by
        that much, never overestimated, and the memory does not change on every tick."""
        sizes = [p.log_bytes for p in self.obs.probes or ()]
        if not sizes or any(b is None for b in sizes):
            return mem, 0.0
        total, now = sum(b for b in sizes if b is not None), self.now
        first = mem.log_at is None or mem.log_at < start or mem.log_bytes is None or total < mem.log_bytes
        if first or (total != mem.log_bytes and _secs(now - mem.log_at) >= LOG_GRAIN):  # type: ignore[operator]
            mem = replace(mem, log_bytes=total, log_at=now)
        assert mem.log_at is not None
        return mem, max(0.0, _secs(now - mem.log_at))


    def hung(self, mem: Memory, quiet: float, silent: float | None) -> Decision:
        """Every worker runs, yet no checkpoint for hang_timeout: stop it, charged (row `hung`)."""
        why = f"{HUNG} for {human(quiet)}"
        if silent is None:
            setting = f"recovery.hang_timeout {human(self.cfg.hang_timeout)}"
        else:
            why += f" and no output for {human(silent)}"
            setting = (f"recovery.hang_timeout auto: 3x the {human(mem.ckpt_gap)} checkpoint interval seen, "
                       f"at least {human(HANG_AUTO_FLOOR)}")
        mem, line, final = self.finish(
            mem, {}, reachable=True, hung=f"{why} while every worker ran ({setting})")
        if final is not None:
            return final
        wait = Wait(mem.backoff_until, "backoff before the next attempt") if mem.phase is Phase.BACKOFF else None
        return self.out(mem, "hung", line, *([wait] if wait else []))

    def log_silent(self, mem: Memory, quiet: float, age: float) -> Decision:
        """Past its first checkpoint, the attempt's logs have been silent far longer than the job
        has ever been (policy/cadence.py), and no checkpoint came either: stop it, charged."""
        why = (f"{HUNG} for {human(quiet)} and no output for {human(age)} while every worker ran "
               f"(recovery.hang_timeout auto: {LOG_FACTOR:g}x the longest silence the job has shown, "
               f"{human(mem.log_gap)}, at least {human(LOG_FLOOR)})")
        return self.ended_now(mem, "log_silent", {}, hung=why)

    def signature(self, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision | None:
        """A worker's log of this attempt shows a known runtime signature (policy/signatures.py):
        end the attempt at once as its kind says (rows `log_hang`, `log_crash`,
        `log_dirty_host`); None when none does, or worker 0 exited 0 (done is done)."""
        n, cfg = mem.attempt, self.cfg
        codes = _ends(probes, n)
        if codes.get(cfg.primary_worker) == 0:
            return None
        for p in probes:
            sig = find(p.log_match, cfg.log_signatures) if p.attempt == n and p.log_match else None
            if sig is None:
                continue
            what = f"{sig.name} in worker {p.worker}'s log: {p.log_match[:200]}"
            if sig.kind == "hang" and not self.disrupted(mem, codes):
                return self.ended_now(mem, "log_hang", codes, hung=f"{HUNG_SAID} ({what})")
            if sig.kind in ("hang", "crash"):
                # a multislice job's other slices hang (and say so) when one slice goes away:
                # with disruption evidence the end is classified as the disruption it is
                return self.ended_now(mem, f"log_{sig.kind}", codes, detail=what)
            # dirty_host: uncharged unless the attempt before ended the same way (then the
            # cleanup did not help: charged, so a host that stays dirty cannot loop for ever)
            last = mem.last_end
            again = last is not None and last.attempt == n - 1 and DIRTY in last.reason
            if again:
                return self.ended_now(mem, "log_dirty_host", codes, detail=f"{DIRTY} again: {what}")
            sign = Evidence(self.now, f"{DIRTY}: {what}")
            return self.ended_now(replace(mem, evidence=merge_evidence(mem.evidence, [sign])), "log_dirty_host", codes)
        return None

    def disrupted(self, mem: Memory, codes: dict[int, int | None]) -> bool:
        """The attempt's evidence explains its end now: a disruption, never charged."""
        start = mem.attempt_start
        assert start is not None  # checked in _check
        verdict = classify(AttemptFacts(start, self.now, codes, self.cfg.primary_worker, mem.evidence),
                           min_uptime=self.cfg.min_uptime, fail_fast=self.cfg.fail_fast_exit_codes,
                           window=self.cfg.evidence_window)
        return verdict.outcome is Outcome.DISRUPTION

    def ended_now(self, mem: Memory, row: str, codes: dict[int, int | None], detail: str = "",
                  hung: str = "") -> Decision:
        """End the running attempt now, stopping every worker, under `row` (the job's end when it is one)."""
        mem, line, final = self.finish(mem, codes, reachable=True, detail=detail, hung=hung)
        if final is not None:
            return final
        wait = Wait(mem.backoff_until, "backoff before the next attempt") if mem.phase is Phase.BACKOFF else None
        return self.out(mem, row, line, *([wait] if wait else []))

    def unseen(self, mem: Memory, probes: tuple[WorkerProbe, ...]) -> Decision:
        """The journal says attempt n was launched, but no worker shows it."""
        n, node = mem.attempt, self.obs.node
        assert node is not None
        older = [p for p in probes if p.state == "running"]
        if older:
            return self.out(mem, "stale_workers", f"workers {_workers(older)} still run an older attempt; "
                                                  f"stopping them before attempt {n}", StopWorkers("older attempt still running"))
        refused = [p for p in probes if p.login_refused]
        if refused:
            return self.login_refused(mem, refused)
        unreachable = [p for p in probes if p.state == "unreachable"]
        if unreachable:
            return self.out(mem, "workers_unreachable", f"cannot reach workers {_workers(unreachable)}; "
                                                        f"attempt {n} not confirmed", Wait(None, "workers unreachable"))
        pre = self.obs.precheck
        if pre is not None and pre.context == "launch" and pre.failing:
            if pre.fixable and not self.obs.precheck_fixed:
                return self.fix_environment(mem, pre)
            # The environment, not the job, is why the attempt left no trace: end it uncharged,
            # and the next launch waits for the node (precheck_wait).
            mem = replace(mem, evidence=merge_evidence(mem.evidence, [
                Evidence(self.now, f"environment check {i.check} failed on worker {i.worker}") for i in pre.failing]))
            return self.end_usable(mem, {p.worker: None for p in probes},
                                   detail="the environment checks failed: " + "; ".join(i.line() for i in pre.failing[:3]))
        if mem.launch_tries < self.cfg.launch_tries:
            mem = replace(mem, launch_tries=mem.launch_tries + 1, attempt_start=self.now, attempt_node_id=node.id)
            why = (f"attempt {n} left no trace on the workers; launching it again "
                   f"(try {mem.launch_tries} of {self.cfg.launch_tries})")
            return self.out(mem, "launch_unseen", why, Launch(n, self.obs.checkpoint, why))
        return self.end_usable(mem, {p.worker: None for p in probes},
                               detail=f"it never started on any worker after {mem.launch_tries} launches")

    def idle(self, mem: Memory) -> Decision:
        node, probes, now = self.obs.node, self.obs.probes or (), self.now
        assert node is not None
        running = [p for p in probes if p.state == "running"]
        if running:
            top = max(p.attempt or 0 for p in running)
            if top > mem.attempt:
                mem = self._follow(mem, top, now, self._step())
                return self.out(mem, "adopt_running", f"workers {_workers(running)} run attempt {top}, which the "
                                                      "journal did not record; following it (no second launch)")
            last = mem.last_end
            if (last is not None and last.attempt == top == mem.attempt and last.outcome == Outcome.DISRUPTION.value
                    and all(p.state == "running" and p.attempt == top for p in probes)):
                mem = self._follow(mem, top, last.start, last.start_step)
                return self.out(mem, "survived", f"every worker still runs attempt {top} after the disruption; "
                                                 "following it again")
            return self.out(mem, "stale_workers", f"workers {_workers(running)} still run attempt {top}; stopping "
                                                  "them before the next launch", StopWorkers("old attempt still running"))
        last = mem.last_end
        if (mem.notice_hold is not None and now < mem.notice_hold and last is not None
                and last.node_id == node.id and not _maintained_since(node, last.start)):
            return self.out(mem, "notice_hold", f"attempt {last.attempt} ended on a maintenance or preemption notice: "
                                                f"node {node.name} is about to stop; not launching there until it "
                                                f"has gone down and come back, or {human(_secs(mem.notice_hold - now))}",
                            Wait(mem.notice_hold, "node about to stop"))
        if mem.backoff_until is not None and now < mem.backoff_until:
            return self.out(mem, "backoff", f"backoff: attempt {mem.attempt + 1} starts in "
                                            f"{human(_secs(mem.backoff_until - now))} ({mem.restarts} charged restarts)",
                            Wait(mem.backoff_until, "backoff between charged restarts"))
        refused = [p for p in probes if p.login_refused]
        if refused:
            return self.login_refused(mem, refused)
        unreachable = [p for p in probes if p.state == "unreachable"]
        if unreachable:
            return self.out(mem, "workers_unreachable", f"cannot reach workers {_workers(unreachable)}; launching "
                                                        "only when every worker answers", Wait(None, "workers unreachable"))
        checked = self.prechecked(mem)
        if checked is not None:
            return checked
        n = max([mem.attempt, *(p.attempt or 0 for p in probes)]) + 1
        ckpt = self.obs.checkpoint
        mem = move(mem, Phase.RUNNING, attempt=n, attempt_start=now, attempt_node_id=node.id,
                   attempt_start_step=self._step(), attempt_seen=False, launch_tries=0, evidence=(),
                   unreachable_since=None, end_seen=None, backoff_until=None, env_failing_since=None,
                   notice_hold=None)
        why = f"launching attempt {n} from {_ckpt_text(ckpt, now)}"
        return self.out(mem, "launch", f"{why} on node {node.id}", Launch(n, ckpt, why))

    def launch_rest(self, mem: Memory, missing: list[WorkerProbe], unreachable: list[WorkerProbe]) -> Decision:
        """Attempt n runs on some workers and never reached the others (row `launch_partial`).

        Launch it again (the workers that run it answer "running"; the others start it) from the
        checkpoint it started from, launch_tries times; never charged to the job. Only when every
        worker answers and none of the others still runs an older attempt: a launch there would
        start n beside it. An unreachable worker is waited for up to unreachable_grace; an older
        attempt still running, a newest checkpoint that is no longer the one n started from (the
        workers would resume from different steps), or tries spent: end n uncharged instead (its
        end stops every worker), and the next attempt starts everywhere from the newest."""
        n, ckpt, cfg, now = mem.attempt, self.obs.checkpoint, self.cfg, self.now
        where = f"attempt {n} never reached workers {_workers(missing)} (a launch cut short)"
        if unreachable:
            since = mem.unreachable_since or now
            if _secs(now - since) < cfg.unreachable_grace:
                until = since + timedelta(seconds=cfg.unreachable_grace)
                return self.out(replace(mem, unreachable_since=since), "unreachable_grace",
                                f"{where}; cannot reach workers {_workers(unreachable)}: launching there only "
                                f"when every worker answers, ending it at {until.isoformat()} if it stays so",
                                Wait(until, "unreachable worker"))
            where = f"{where}; workers {_workers(unreachable)} unreachable for {human(_secs(now - since))}"
        older = [p for p in missing if p.state == "running"]
        if older:
            where = f"{where}; workers {_workers(older)} still run an older attempt"
        same = (ckpt.step if ckpt is not None else None) == mem.attempt_start_step
        if same and not unreachable and not older and mem.launch_tries < cfg.launch_tries:
            mem = replace(mem, launch_tries=mem.launch_tries + 1, unreachable_since=None)
            why = f"{where}; launching it there (try {mem.launch_tries} of {cfg.launch_tries})"
            return self.out(mem, "launch_partial", why, Launch(n, ckpt, why))
        sign = Evidence(now, where)
        mem = replace(mem, attempt_seen=True, evidence=merge_evidence(mem.evidence, [sign]))
        return self.end_usable(mem, {p.worker: None for p in missing}, detail=where)

    def login_refused(self, mem: Memory, refused: list[WorkerProbe]) -> Decision:
        """Workers refuse the login before anything runs there. Soon after a boot that is the
        keys not installed yet (the guest agent adds them after sshd listens); later, the user or
        the key is wrong and no wait will fix it."""
        node, cfg, now = self.obs.node, self.cfg, self.now
        assert node is not None
        boot = boot_time(node, mem)
        since = _secs(now - boot) if boot is not None else None
        if since is not None and since < cfg.login_grace:
            until = boot + timedelta(seconds=cfg.login_grace) if boot is not None else now
            return self.out(mem, "keys_not_there_yet",
                            f"workers {_workers(refused)} refuse the login {human(max(0.0, since))} after the node "
                            f"booted: keys not there yet (they reach a new VM after sshd listens); launching "
                            f"nothing, looking again until {until.isoformat()} (ssh.login_grace)",
                            Wait(None, "keys not there yet"))
        when = f"{human(since)} after the node booted" if since is not None else "and the node's boot time is unknown"
        detail = refused[0].detail
        reason = (f"workers {_workers(refused)} still refuse the login {when} (ssh.login_grace "
                  f"{human(cfg.login_grace)}): {detail}")
        return self.halt(mem, "login_refused", reason, tuple(p.detail for p in refused[:4]))

    def _step(self) -> int | None:
        return self.obs.checkpoint.step if self.obs.checkpoint is not None else None

    def _follow(self, mem: Memory, attempt: int, start: datetime, step: int | None) -> Memory:
        node = self.obs.node
        assert node is not None
        return move(mem, Phase.RUNNING, attempt=attempt, attempt_start=start, attempt_node_id=node.id,
                    attempt_start_step=step, attempt_seen=True, launch_tries=0, evidence=(),
                    unreachable_since=None, end_seen=None, backoff_until=None)

    # -- environment checks -------------------------------------------------------------------

    def prechecked(self, mem: Memory) -> Decision | None:
        """Before a launch: None when the environment checks pass (or were not run), else the
        decision for a failing environment. Never charged: the node is at fault, not the job."""
        pre, now, cfg = self.obs.precheck, self.now, self.cfg
        if pre is None or pre.context != "launch":
            return None
        if pre.unreachable:
            workers = ", ".join(str(w) for w, _ in pre.unreachable)
            return self.out(mem, "workers_unreachable", f"cannot reach workers {workers} to check them; launching "
                                                        "only when every worker answers", Wait(None, "workers unreachable"))
        failing = pre.failing
        if not failing:
            if mem.env_failing_since is not None:
                self.notes.append("the environment checks pass again")
                mem = replace(mem, env_failing_since=None)
            return None
        if pre.fixable and not self.obs.precheck_fixed:
            return self.fix_environment(mem, pre)
        lines = tuple(i.line() for i in failing)
        shown = "; ".join(lines[:4]) + (f"; and {len(lines) - 4} more" if len(lines) > 4 else "")
        since = mem.env_failing_since or now
        waited = _secs(now - since)
        if waited < cfg.repair_timeout:
            until = since + timedelta(seconds=cfg.repair_timeout)
            why = f"environment checks fail: {shown}"
            mem = move(mem, Phase.WAITING_NODE, env_failing_since=since, reason=why)
            return self.out(mem, "precheck_wait", f"{why}; not launching, not charged; waiting for the node to be "
                                                  f"fixed until {until.isoformat()} (recovery.repair_timeout "
                                                  f"{human(cfg.repair_timeout)})", Wait(until, "environment checks fail"))
        why = (f"environment checks failing for {human(waited)}, longer than recovery.repair_timeout "
               f"({human(cfg.repair_timeout)}): {shown}")
        mem = replace(mem, env_failing_since=since)
        node = self.obs.node
        assert node is not None
        if not (node.owned_by(cfg.job) or self.obs.adopt):
            return self.halt(mem, "precheck_needs_person",
                             f"{why}; not owned: will not delete {node.name} (label {OWNER_LABEL}={cfg.job} "
                             "missing; pass --adopt to let tpuwatch recreate it); fix the workers and the job "
                             "resumes", lines)
        return self.recreate(mem, "precheck_recreate", why)

    def fix_environment(self, mem: Memory, pre: PrecheckReport) -> Decision:
        """Orphan device holders and a stale libtpu lockfile: the worker cleanup fixes them; the
        tick then checks again in the same tick (Observation.precheck_fixed) before launching."""
        shown = "; ".join(i.line() for i in pre.failing[:4])
        why = f"environment checks found what tpuwatch can fix: {shown}"
        return self.out(mem, "precheck_fix", f"{why}; cleaning up the workers, then checking again (not charged)",
                        StopWorkers(f"fix before the launch: {shown}"))

    def repairing(self, mem: Memory) -> Decision:
        """REPAIR (service is working on it) or UNRECOGNIZED (a state this version does not know).

        A node in UNKNOWN with no health is past a failed repair: recreated FAILED_REPAIR_GRACE
        after its first sight (row `failed_repair`) rather than after repair_timeout."""
        node, cfg, now = self.obs.node, self.cfg, self.now
        assert node is not None
        known = node_condition(node) is Cond.REPAIR
        what = node.state if node.state != "READY" else f"READY but {node.health}"
        since = mem.unhealthy_since or now
        unknown = (mem.unknown_since or now) if failed_repair(node) else None
        if mem.phase is Phase.RUNNING:
            probes = self.obs.probes
            if probes and all(p.state == "running" and p.attempt == mem.attempt for p in probes):
                return self.out(replace(mem, unhealthy_since=since, unknown_since=unknown), "unhealthy_running",
                                f"node {what} since {since.isoformat()}, but every worker still runs attempt "
                                f"{mem.attempt}; following it")
            mem, final = self.end_unusable(mem)
            if final is not None:
                return final
        mem = replace(mem, unknown_since=unknown)
        waited = _secs(now - since)
        grace = min(FAILED_REPAIR_GRACE, cfg.repair_timeout)
        if unknown is not None and _secs(now - unknown) >= grace:
            return self.recreate(replace(mem, unhealthy_since=since), "failed_repair",
                                 f"node UNKNOWN with no health (the API's state after a failed repair) for "
                                 f"{human(_secs(now - unknown))}, not waiting out recovery.repair_timeout "
                                 f"({human(cfg.repair_timeout)})")
        if auto := self.autorepairing(mem):
            # Recreating the request would ask for every slice at once, behind the same shortage
            # the repair waits on, and lose its place: wait as long as a create may queue.
            bound = max(cfg.repair_timeout, cfg.queue_timeout)
            if waited < bound:
                until = since + timedelta(seconds=bound)
                mem = move(mem, Phase.WAITING_NODE, unhealthy_since=since, reason=auto)
                return self.out(mem, "autorepair_wait", f"{auto} since {since.isoformat()}; waiting for it until "
                                f"{until.isoformat()} (the longer of recovery.repair_timeout and "
                                f"recovery.queue_timeout, {human(bound)}) before recreating the whole request",
                                Wait(until, auto))
            return self.recreate(mem, "repair_timeout", f"{auto} for {human(waited)}, longer than "
                                 f"recovery.queue_timeout ({human(bound)})")
        if waited < cfg.repair_timeout:
            until = since + timedelta(seconds=cfg.repair_timeout)
            if unknown is not None:
                until = min(until, unknown + timedelta(seconds=grace))
            mem = move(mem, Phase.WAITING_NODE, unhealthy_since=since, reason=f"node {what}")
            row = "repair_wait" if known else "unknown_state"
            limit = (f"{human(grace)} in UNKNOWN after a failed repair" if unknown is not None
                     else f"recovery.repair_timeout {human(cfg.repair_timeout)}")
            return self.out(mem, row, f"node {what} since {since.isoformat()}; waiting for it to heal until "
                                      f"{until.isoformat()} ({limit})", Wait(until, f"node {what}"))
        why = f"node {what} for {human(waited)}, longer than recovery.repair_timeout ({human(cfg.repair_timeout)})"
        if not known:
            return self.halt(replace(mem, unhealthy_since=since), "unknown_state",
                             f"{why}; tpuwatch does not know state {node.state} and will not delete the node")
        return self.recreate(mem, "repair_timeout", why)

    @property
    def subject(self) -> str:
        """What the job runs on, as the person who made it calls it: its node, or a multislice
        job's queued resource (or its slices, when they were created one by one)."""
        cfg = self.cfg
        if not cfg.slices:
            return f"node {cfg.tpu_name}"
        if cfg.queued_resource:
            return f"queued resource {cfg.queued_resource}"
        return f"slices {', '.join(cfg.slices)}"

    def autorepairing(self, mem: Memory) -> str:
        """What Cloud TPU's multislice autorepair is doing, "" when it is not. While the job's
        multislice queued resource stays ACTIVE: a slice is missing or being created (the service
        creates a new one, waiting for hardware if needed), or a slice has a new id since the
        attempt's launch and another is RESTARTING (the service restarts the others after it)."""
        node, q = self.obs.node, self.obs.queued
        if not (self.cfg.slices and self.cfg.recreatable and node is not None and q is not None
                and q.state == "ACTIVE"):
            return ""
        request = q.name.rsplit("/", 1)[-1]
        parts = list(zip(self.cfg.slices, node.slices, strict=False))
        gone = [name for name, part in parts if part.state in ("MISSING", "CREATING")]
        if gone:
            return (f"slice {', '.join(gone)} of queued resource {request} is being replaced (Cloud TPU's "
                    "multislice autorepair creates a new slice, waiting for hardware if needed, then restarts "
                    "the others)")
        before = mem.attempt_node_id.split("+")
        new = [name for i, (name, part) in enumerate(parts) if i < len(before) and part.id != before[i]]
        restarting = [name for name, part in parts if part.state == "RESTARTING"]
        if new and restarting:
            return (f"slice {', '.join(new)} of queued resource {request} was replaced; Cloud TPU's multislice "
                    f"autorepair restarts the others ({', '.join(restarting)} RESTARTING)")
        return ""

    def dead(self, mem: Memory) -> Decision:
        node = self.obs.node
        assert node is not None
        mem, final = self.end_unusable(mem)
        return final or self.recreate(mem, "dead_node", f"node {node.state}: it does not come back by itself")

    def person(self, mem: Memory) -> Decision:
        node = self.obs.node
        assert node is not None
        mem, final = self.end_unusable(mem)
        if final is not None:
            return final
        why = f"node is {node.state}: a person stopped it; leaving it alone until it is READY again"
        return self.out(move(mem, Phase.PAUSED, reason=why, unhealthy_since=None, unknown_since=None),
                        "person_stopped", why, Wait(None, why))

    def missing(self, mem: Memory) -> Decision:
        cfg = self.cfg
        mem, final = self.end_unusable(mem)
        if final is not None:
            return final
        if self.queued_ended():
            # Its request still holds the name: delete it (nothing is left of the node to own or
            # lose), then create it again.
            return self.recreate(mem, "queued_preempted", self.queued_why())
        if self.obs.recreate_missing:
            return self.recreate_missing(mem, "recreate_missing", f"{self.subject} is missing; "
                                                                  "--recreate-missing")
        return self.halt(
            mem, "node_missing",
            f"{self.subject} is missing in {mem.zone} and tpuwatch did not delete it; tpuwatch never "
            "recreates a node a person deleted. Pass --recreate-missing to create it from the saved spec",
            (f"nodes/{cfg.tpu_name}: not found in {mem.zone}",),
        )

    def someone_deleting(self, mem: Memory) -> Decision:
        mem, final = self.end_unusable(mem)
        if final is None and self.queued_ended():
            return self.recreate(mem, "queued_preempted", self.queued_why())
        return final or self.halt(
            mem, "someone_deleting",
            f"{self.subject} is being deleted, not by tpuwatch; once it is gone, pass "
            "--recreate-missing to create it again",
        )

    def not_recreatable(self, mem: Memory, why: str) -> Decision:
        return self.halt(mem, "not_recreatable",
                         f"{why}; the job's slices ({', '.join(self.cfg.slices)}) were created one by one, not by one "
                         "multislice queued resource: tpuwatch does not delete or create across them. Repair or "
                         "recreate that slice: the job is launched again once every slice is READY+HEALTHY", (why,))

    def recreate_missing(self, mem: Memory, row: str, why: str) -> Decision:
        cfg = self.cfg
        if not cfg.recreatable:
            return self.not_recreatable(mem, why)
        if mem.recreates >= cfg.max_recreates:
            return self.fail(mem, "recreate_budget_spent", f"{why}; recreate budget spent: {mem.recreates} of "
                             f"recovery.max_recreates = {cfg.max_recreates} used", (why,))
        mem = replace(mem, recreates=mem.recreates + 1, queued_since=None, queue_tries=0)
        return self.create(mem, 0, row, f"{why}: creating it in {cfg.zones[0]}")

    def queued_ended(self) -> bool:
        """The node's queued resource was given up by the service (FAILED, SUSPENDING, SUSPENDED)."""
        return self.obs.queued is not None and self.obs.queued.ended

    def queued_why(self) -> str:
        q = self.obs.queued
        assert q is not None
        detail = f" ({q.error_message})" if q.error_message else ""
        if "/resizeRequests/" in q.name:  # a flex-start MIG's request stands for its queued resource
            return (f"Compute Engine took {self.subject} back: its resize request {q.name.rsplit('/', 1)[-1]} "
                    f"is {q.state}{detail}; not charged")
        return (f"the Cloud TPU service took {self.subject} back: its queued resource "
                f"{q.name.rsplit('/', 1)[-1]} is {q.state}{detail} (a spot preemption does this); not charged")

    def recreate(self, mem: Memory, row: str, why: str) -> Decision:
        """Delete the node (or, when it is gone, its ended queued resource) to create it again."""
        node, cfg = self.obs.node, self.cfg
        if node is not None and not (node.owned_by(cfg.job) or self.obs.adopt):
            have = node.owner
            label = f"it has {OWNER_LABEL}={have}" if have is not None else "it has no such label"
            return self.halt(
                mem, "not_owned",
                f"{why}; not owned: will not delete {node.name} (label {OWNER_LABEL}={cfg.job} missing); pass --adopt",
                (label,),
            )
        if not cfg.recreatable:
            return self.not_recreatable(mem, why)
        if mem.recreates >= cfg.max_recreates:
            return self.fail(mem, "recreate_budget_spent", f"{why}; recreate budget spent: {mem.recreates} of "
                             f"recovery.max_recreates = {cfg.max_recreates} used", (why,))
        mem = move(mem, Phase.DELETING, recreates=mem.recreates + 1, pending_op=None,
                   deleting_node_id=node.id if node is not None else "", queued_since=None, queue_tries=0,
                   retry_at=None, env_failing_since=None)
        return self.out(mem, row, f"{why}: deleting it to create it again (recreate {mem.recreates} of "
                                  f"{cfg.max_recreates})", DeleteNode(cfg.tpu_name, mem.zone, why))

    # -- operation rows ---------------------------------------------------------------------

    def create(self, mem: Memory, zone_try: int, row: str, why: str) -> Decision:
        zone = self.cfg.zones[zone_try]
        mem = move(mem, Phase.CREATING, pending_op=None, zone=zone, zone_try=zone_try,
                   retry_at=None, unhealthy_since=None, unknown_since=None)
        return self.out(mem, row, why, self.create_node(mem, zone, why))

    def create_node(self, mem: Memory, zone: str, why: str, *, resumed: bool = False) -> CreateNode:
        """The create, with what the new node's startup script needs. It can start the job at
        boot, before the watcher reconnects: as the next attempt, from the newest complete
        checkpoint, which the policy then follows instead of launching it a second time. A
        multislice job starts only on every slice at once, with the slices' ids and the
        coordinator: the watcher launches it, the startup script only sets up."""
        if self.cfg.slices:
            return CreateNode(self.cfg.tpu_name, zone, why, {"launch": "false"}, resumed)
        startup = {"attempt": str(mem.attempt + 1)}
        if self.obs.checkpoint is not None:
            startup.update(checkpoint=self.obs.checkpoint.path, step=str(self.obs.checkpoint.step))
        return CreateNode(self.cfg.tpu_name, zone, why, startup, resumed)

    def deleting(self, mem: Memory) -> Decision:
        op, node, name = self.obs.operation, self.obs.node, self.cfg.tpu_name
        if op is not None and op.done:
            self.op_done = op.name or None
            if op.error_code not in (0, NOT_FOUND):
                return self.fail(mem, "delete_failed", f"deleting {self.subject} failed: code {op.error_code}: "
                                                       f"{op.error_message}")
        queued = self.obs.queued
        if node is None and queued is not None and queued.state and not (op is not None and op.done):
            # The node is gone and its queued resource is still being deleted: a create now
            # would be refused (the name is taken), so follow the delete to its end.
            return self.out(mem, "deleting", f"{self.subject} is deleted; its queued resource is {queued.state}, "
                                             f"still being deleted (operation {mem.pending_op or 'not recorded'})",
                            FollowOperation(mem.pending_op, "delete", "queued resource delete in flight"))
        if node is None:
            self.op_done = self.op_done or mem.pending_op
            return self.create(mem, 0, "create_after_delete", f"{self.subject} is deleted; creating it in {self.cfg.zones[0]}")
        if mem.deleting_node_id and node.id != mem.deleting_node_id:
            mem = move(mem, Phase.IDLE, pending_op=None, deleting_node_id="")
            return self.out(mem, "deleting", f"{self.subject} was replaced (id {node.id}) while tpuwatch deleted it; "
                                             "following the new node", Wait(None, "node replaced"))
        if mem.pending_op is None and node.state != "DELETING" and op is None:
            # The tick stopped between journaling this decision and the delete call. Decide
            # afresh from the node as it is now: it may have healed, or lost its label.
            self.notes.append(f"no delete of {name} was started")
            mem = move(mem, Phase.IDLE, deleting_node_id="", recreates=max(0, mem.recreates - 1))
            d = getattr(self, NODE_ROWS[node_condition(node)])(mem)
            return replace(d, row="delete_resume") if any(isinstance(a, DeleteNode) for a in d.actions) else d
        overdue = self.overdue(mem, "delete")
        if overdue is not None:
            return overdue
        return self.out(mem, "deleting", f"deleting {self.subject} (operation {mem.pending_op or 'not recorded'}, "
                                         f"state {node.state})", FollowOperation(mem.pending_op, "delete", "delete in flight"))

    def creating(self, mem: Memory) -> Decision:
        op, node, name = self.obs.operation, self.obs.node, self.cfg.tpu_name
        if op is not None and op.done:
            self.op_done = op.name or None
            if op.error_code != 0:
                kind = self.obs.create_failure
                if kind is None:
                    raise ImpossibleObservation(
                        mem.phase, f"create operation {op.name!r} failed (code {op.error_code}) and the observation "
                                   "has no create_failure (recreate.classify_operation(op).kind)")
                if kind == "queueable":
                    return self.queue(mem, op.error_code, op.error_message)
                if kind == "fatal":
                    return self.fail(mem, "create_failed", f"creating {self.subject} in {mem.zone} failed: code "
                                                           f"{op.error_code}: {op.error_message}")
                # "exists": tpuwatch's own earlier create made it
            if node is None and self.queued_ended():
                # The request was accepted and then given up (FAILED, or SUSPENDED before its node
                # came): it never makes the node. Queue and retry, as for no capacity.
                q = self.obs.queued
                assert q is not None
                return self.queue(mem, q.error_code or RESOURCE_EXHAUSTED,
                                  f"queued resource {q.name.rsplit('/', 1)[-1]} {q.state}: "
                                  f"{q.error_message or 'no detail given'}")
            if node is not None:
                return self.created(mem, node)
            return self.out(mem, "creating", f"create of {name} done; waiting for the node to appear",
                            FollowOperation(mem.pending_op, "create", "create done, node not listed yet"))
        if op is None and node is not None:
            if node.state == "CREATING" and not self.create_overdue(node):
                # This job's create whose operation name was never journaled (a watcher killed
                # right after the call): the node is on its way, not unhealthy; judging it
                # against repair_timeout would delete it mid-create and create it again.
                return self.out(mem, "creating", f"{self.subject} is being created in {mem.zone} (its create "
                                                 "operation was not recorded); waiting for it",
                                Wait(None, "node creating"))
            return self.created(mem, node)
        if op is None and mem.pending_op is None:
            return self.out(mem, "create_resume", f"no create operation recorded and {self.subject} is missing: "
                                                  f"creating it in {mem.zone}", self.create_node(mem, mem.zone, "create not started", resumed=True))
        overdue = self.overdue(mem, "create")
        if overdue is not None:
            return overdue
        return self.out(mem, "creating", f"creating {self.subject} in {mem.zone} (operation {mem.pending_op})",
                        FollowOperation(mem.pending_op, "create", "create in flight"))

    def create_overdue(self, node: NodeSnapshot) -> bool:
        """A node still CREATING for longer than recovery.operation_timeout (or of unknown age)."""
        return node.create_time is None or _secs(self.now - node.create_time) >= self.cfg.operation_timeout

    def overdue(self, mem: Memory, kind: str) -> Decision | None:
        """Fail when the operation in flight is older than recovery.operation_timeout.

        An operation that never ends would keep the job waiting forever; starting another one
        beside it could give two nodes, so the job stops and says which operation to look at.
        """
        op, cfg = self.obs.operation, self.cfg
        if op is None or op.done or op.started is None:
            return None
        age = _secs(self.now - op.started)
        if age < cfg.operation_timeout:
            return None
        return self.fail(mem, "operation_timeout",
                         f"the {kind} of {self.subject} in {mem.zone} (operation {op.name}) is not done after "
                         f"{human(age)}, longer than recovery.operation_timeout ({human(cfg.operation_timeout)}); "
                         f"tpuwatch stops following it and starts no other {kind}. See `gcloud compute tpus "
                         f"operations describe {op.name.rsplit('/', 1)[-1]} --zone {mem.zone}`")

    def created(self, mem: Memory, node: NodeSnapshot) -> Decision:
        mem = move(mem, Phase.IDLE, pending_op=None, zone=node.zone or mem.zone, zone_try=0,
                   queued_since=None, queue_tries=0, retry_at=None, deleting_node_id="", unhealthy_since=None,
                   unknown_since=None)
        return self.out(mem, "created", f"{self.subject} exists in {mem.zone} (id {node.id}, {node.state}); "
                                        "the job resumes once it is READY+HEALTHY", Wait(None, "node created"))

    def queue(self, mem: Memory, code: int, message: str) -> Decision:
        cfg, now = self.cfg, self.now
        since = mem.queued_since or now
        tries = mem.queue_tries + 1
        delay = backoff_delay(tries, cfg.backoff_base, cfg.backoff_max, self.obs.jitter)
        retry_at = now + timedelta(seconds=delay)
        mem = move(mem, Phase.QUEUED, pending_op=None, queued_since=since, queue_tries=tries,
                   retry_at=retry_at)
        what = SHORTFALLS.get(self.obs.create_reason, "no capacity or quota")
        # A queued resource the service gave up on keeps the name: delete it now, so it is gone
        # by the retry's create.
        clear = (ClearQueued(mem.zone, "free the name for the retry's create"),) if self.obs.queued is not None else ()
        return self.out(mem, "no_capacity", f"{what} in {mem.zone} (code {code}: {message}); "
                                            f"queued {human(_secs(now - since))} of {human(cfg.queue_timeout)}, next "
                                            f"create in {human(delay)}", Wait(retry_at, "no capacity"), *clear)

    def queued(self, mem: Memory) -> Decision:
        cfg, now, node = self.cfg, self.now, self.obs.node
        if node is not None:
            return self.created(mem, node)
        assert mem.retry_at is not None and mem.queued_since is not None  # checked in _check
        if now < mem.retry_at:
            return self.out(mem, "queued", f"no capacity in {mem.zone}; next create in "
                                           f"{human(_secs(mem.retry_at - now))}", Wait(mem.retry_at, "no capacity"))
        waited = _secs(now - mem.queued_since)
        if waited < cfg.queue_timeout and mem.zone_try < len(cfg.zones):
            return self.create(mem, mem.zone_try, "queue_retry", f"retrying the create in {mem.zone} "
                                                                 f"(try {mem.queue_tries + 1})")
        nxt = mem.zone_try + 1
        if nxt >= len(cfg.zones):
            return self.fail(mem, "queue_exhausted", f"no capacity for {self.subject} in "
                             f"{', '.join(cfg.zones)}: each zone tried for recovery.queue_timeout "
                             f"({human(cfg.queue_timeout)})")
        mem = replace(mem, queued_since=None, queue_tries=0)
        return self.create(mem, nxt, "queue_retry", f"no capacity in {mem.zone} for {human(waited)}: trying "
                                                    f"fallback zone {cfg.zones[nxt]}")
