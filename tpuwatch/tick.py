"""One reconcile tick, shared by `watch` (tick after tick, tpuwatch/loop.py) and `check` (one tick).

Rules of this module:
- Observe -> decide -> journal -> act, and nothing else: what to do, what more to observe before
  deciding, and when to decide again in the same tick are tpuwatch.policy's to say
  (policy/observe.py, policy/settle.py); no branch here names a row or a phase.
- Level-triggered: every tick re-reads the node, the workers, the newest complete checkpoint and
  the audit log. Memory comes only from the journal.
- Write-ahead: each decision is journaled before any of its actions is carried out, and an
  operation's name right after the call that started it. A process killed between any two
  lines resumes from what it meant to do; the worker-side lock (a relaunch of attempt n is
  refused while or after it ran) and ALREADY_EXISTS-is-success cover the gap between a call and
  its journal line.
- Never blocks on a long cloud operation: it starts it, and a later tick follows it up.
- API cost per tick: one node get (one per slice of a multislice job), one operation get while one
  is in flight, the queued resource's state while it matters, the audit log at most once per
  observe.AUDIT_INTERVAL unless something looks wrong; worker probes (SSH) cost no API quota.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from tpuwatch import recreate
from tpuwatch.cloud import poollock
from tpuwatch.config import Config
from tpuwatch.durations import human
from tpuwatch.errors import CloudError, HostReportRefused, MaintenanceRefused, NotFoundError
from tpuwatch.journal import Journal
from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    LaunchResult,
    NodeSnapshot,
    OperationStatus,
    PrecheckReport,
    StopResult,
    WorkerProbe,
    bound_view,
    job_node,
    megascale_note,
)
from tpuwatch.policy import (
    Action,
    Again,
    ClearQueued,
    CreateNode,
    Decision,
    DeleteNode,
    Launch,
    Memory,
    Observation,
    PolicyConfig,
    Relabel,
    RemakeSpare,
    ReportHost,
    StartMaintenance,
    StartNode,
    StopWorkers,
    action_dict,
    decide_until_settled,
)
from tpuwatch.policy.observe import (
    audit_due,
    launch_likely,
    operation_due,
    precheck_due,
    probes_due,
    queued_due,
)
from tpuwatch.policy.owed import stopped as owed_stopped
from tpuwatch.policy.pool import POOL_LABEL, idle_in
from tpuwatch.policy.pool import said as pool_said
from tpuwatch.policy.pool import still_remaking as pool_still_remaking
from tpuwatch.policy.values import CreateFailureKind
from tpuwatch.ports import Flags, JobPorts, NodeLabels, TpuApi, ZoneListing
from tpuwatch.workers import login, precheck


@dataclass(frozen=True)
class TickReport:
    """What one tick saw, decided and did: for the dashboard, `check`'s output and `--json`
    (rendered by tpuwatch/ui/tickview.py)."""

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
    # decisions carried out in this tick before `decision` (e.g. an attempt's end, then its
    # relaunch in the same tick), oldest first
    earlier: tuple[Decision, ...] = ()
    # the cloud operation the last decision was made from (a failed create's error, for people)
    operation: OperationStatus | None = None
    # a job with spares: its pool's nodes no slot holds, as read (Observation.spares)
    spares: tuple[tuple[str, NodeSnapshot | None], ...] = ()
    # a job of a spare pool ([tpu] spare_pool): the pool's nodes as listed, each with the job that
    # holds it ("": idle) and, idle, why it cannot be claimed now ("": it can)
    pool: tuple[tuple[str, str, str], ...] = ()

    @property
    def exit_code(self) -> int:
        return self.decision.exit_code

    @property
    def memory(self) -> Memory:
        return self.decision.memory


@dataclass
class _Settling:
    """One tick's running account while its decisions settle."""

    now: datetime
    cursor: str | None  # the audit log's new cursor, journaled with the first decision
    warnings: list[str]
    precheck: PrecheckReport | None
    probes: tuple[WorkerProbe, ...] | None  # the workers as last probed in this tick
    done: list[str] = field(default_factory=list)
    acted: Decision | None = None  # the last decision carried out, with the memory its acts left
    carried: list[Decision] = field(default_factory=list)  # every decision carried out, in order
    journaled: bool = False
    operation: OperationStatus | None = None  # the one the last decision was made from
    # a multislice job (or one with spares): each node of its pool (tpu.names, tpu.spares, the
    # nodes its slices are bound to) as read this tick (the job's node is rebuilt from them when a
    # decision changes the slices it runs on)
    read: dict[str, NodeSnapshot | None] = field(default_factory=dict)
    node: NodeSnapshot | None = None  # the job's node as last decided on
    spares: tuple[tuple[str, NodeSnapshot | None], ...] = ()  # and its idle spares
    extra: tuple[str, ...] = ()  # nodes of its pool by their label alone (handed over to it)
    owed_failed: list[str] = field(default_factory=list)  # nodes whose owed stop failed this tick (policy/owed.py)


@dataclass
class Reconciler:
    """Runs ticks for one job. Holds no state between ticks beyond what the journal keeps."""

    cfg: Config
    pcfg: PolicyConfig
    ports: JobPorts
    journal: Journal
    flags: Flags = field(default_factory=Flags)

    def tick(self) -> TickReport:
        now = self.ports.now()
        mem = self.journal.load_memory() or Memory.initial(self.pcfg.zones[0])
        login.restore(self.ports.workers, self.journal)  # the user learned for this node id
        zone = mem.zone or self.pcfg.zones[0]
        tpu, life = self.ports.tpu_for(zone), self.ports.lifecycle_for(zone)
        read: dict[str, NodeSnapshot | None] = {}
        left_out: tuple[NodeSnapshot | None, ...] = ()
        spares: tuple[tuple[str, NodeSnapshot | None], ...] = ()
        zone_nodes: tuple[NodeSnapshot, ...] = ()
        extra: tuple[str, ...] = ()
        if self.pcfg.slices:  # a multislice job: the slices it runs on now, those left out, its spares
            # and the nodes its slices are bound to, though a config edit took one out of tpu.spares:
            # the job still runs there until it moves ("": a slot lent to another job)
            pool = (*self.pcfg.slices, *self.pcfg.spares, *(n for s, n in mem.limp.swapped if s in self.pcfg.slices))
            if self.pcfg.priority is not None or self.pcfg.spare_pool:
                # a job with a priority (or of a spare pool): the zone's nodes, listed once; the nodes
                # labelled the job's (one handed over to it, or claimed) are in its pool too
                # (policy/priority.py, policy/pool.py)
                zone_nodes = tuple(tpu.listed() if isinstance(tpu, ZoneListing) else tpu.list_nodes())
                listed = {n.name: n for n in zone_nodes}
                # (and one of those it deletes to make again, gone from the listing meanwhile)
                extra = tuple(dict.fromkeys(
                    [*(n.name for n in zone_nodes if n.owned_by(self.pcfg.job) and n.name not in pool),
                     *(n for n in mem.limp.remaking if n not in pool)]))
                read = {n: listed.get(n) for n in dict.fromkeys((*pool, *extra)) if n}
            else:
                read = {n: tpu.get_node(n) for n in dict.fromkeys(pool) if n}
            node, left_out, spares = self._bound(read, mem, extra)
        else:
            node = job_node(tpu.get_node, self.pcfg.tpu_name)
        probes, pre = self._probe(node, mem, now)
        operation, create_failure = self._operation(mem, tpu)
        checkpoint = self.ports.checkpoints.latest() if self.ports.checkpoints is not None else None
        warnings = tpu.take_notes()  # e.g. a MIG whose worker numbers tpuwatch cannot follow
        events, cursor = self._audit(now, mem, node, probes, warnings)
        pre = pre or self._periodic_precheck(now, mem, node, probes)
        queued = life.status() if life.queue and queued_due(mem, node) else None
        # one job of a spare pool makes its dead idle spares again: the holder of its keeper lock
        keeper = (bool(self.pcfg.spare_pool) and self.pcfg.spares_remade and not self.flags.dry_run
                  and poollock.keeper(Path(self.cfg.state_dir), self.pcfg.spare_pool, self.pcfg.job))
        obs = Observation(
            node=node, left_out=left_out, spares=spares, events=tuple(events), probes=probes, checkpoint=checkpoint,
            operation=operation, create_failure=create_failure, queued=queued,
            create_reason=recreate.failure_reason(operation) if create_failure else recreate.queued_reason(queued),
            jitter=min(max(self.ports.jitter(), 0.0), 0.999999),
            adopt=self.flags.adopt, recreate_missing=self.flags.recreate_missing, recreate_asked=self.flags.recreate,
            dry_run=self.flags.dry_run, precheck=pre, checks=self.ports.precheck is not None,
            audit_read=cursor is not None, zone=zone_nodes,
            pool_keeper=keeper, pool_remaking=self._pool_remaking(zone_nodes) if keeper else (),
        )
        if pre is not None and pre.context == "running":
            warnings.extend(f"environment check failed: {line}" for line in precheck.failing_lines(pre))
        st = _Settling(now, cursor, warnings, pre, probes, read=read, node=node, spares=spares, extra=extra)
        decision = decide_until_settled(obs, mem, self.pcfg, now,
                                        lambda d, o, m: self._settle(st, d, o, m))
        return TickReport(now, st.node, st.probes, checkpoint, tuple(events), st.acted or decision,
                          done=tuple(st.done), warnings=tuple(st.warnings), dry_run=self.flags.dry_run,
                          precheck=st.precheck or precheck.last(self.journal), pcfg=self.pcfg,
                          earlier=tuple(st.carried[:-1]), operation=st.operation, spares=st.spares,
                          pool=tuple((n, *held) for n, held in pool_said(self.pcfg.spare_pool, zone_nodes).items()))

    def _pool_remaking(self, zone_nodes: tuple[NodeSnapshot, ...]) -> tuple[str, ...]:
        """The keeper's read of its pool's record of spares deleted to make again, those made
        since (or no longer the pool's idle spares) dropped from it."""
        state_dir, pool = Path(self.cfg.state_dir), self.pcfg.spare_pool
        names = poollock.remaking(state_dir, pool)
        left = pool_still_remaking(pool, names, {n.name: n for n in zone_nodes})
        if left != names:
            try:
                with poollock.held(state_dir, pool):
                    poollock.record(state_dir, pool, pool_still_remaking(
                        pool, poollock.remaking(state_dir, pool), {n.name: n for n in zone_nodes}))
            except (OSError, CloudError):
                pass  # dropped at a later tick; a name left in it is only ever created while gone
        return left

    def _settle(self, st: _Settling, decision: Decision, obs: Observation, mem: Memory) -> Again | None:
        """Journal and act on one decision (policy/settle.py): what to decide again with, or None;
        with the nodes whose owed stop failed so far this tick, so none is tried twice in a tick."""
        again = self._settle_one(st, decision, obs, mem)
        if again is None or not st.owed_failed:
            return again
        failed = tuple(dict.fromkeys((*again.obs.owed_stop_failed, *st.owed_failed)))
        return Again(replace(again.obs, owed_stop_failed=failed), again.memory)

    def _settle_one(self, st: _Settling, decision: Decision, obs: Observation, mem: Memory) -> Again | None:
        """Journal and act on one decision, or do what it asks first; what to decide again with."""
        checker = self.ports.precheck
        st.operation = obs.operation
        if decision.check_first and obs.node is not None and checker is not None:
            # It would launch: check the workers' environment first and decide again with what
            # the checks found (a bad node is waited for, never charged).
            st.precheck = checker.run(obs.node, "launch", now=st.now)
            return Again(replace(obs, precheck=st.precheck), mem)
        if not st.journaled:
            st.warnings.extend(self.ports.workers.take_notes())  # e.g. host keys trusted on first use
            if decision.checkpoint_warning:
                st.warnings.append(decision.checkpoint_warning)
        if self.flags.dry_run:
            st.done.extend(f"would {_describe(a)}" for a in decision.actions)
            for a in decision.actions:  # the request a report would send, as it would send it
                if isinstance(a, ReportHost) and obs.node is not None:
                    life = self.ports.lifecycle_for(mem.zone or self.pcfg.zones[0])
                    if request := life.faulty_host_request(obs.node, a.worker, a.description):
                        st.done.append(f"would send {request}")
            return None
        if decision.stop_first:
            # It would launch while nodes the job moved off owe a stop: those stops alone, waited
            # for; then decide again (a launch held while one failed: row owed_stop_failed).
            return Again(obs, self._stop_owed(st, decision, mem))
        self._journal(st, decision, obs, mem)
        refused = self._act(st, decision, obs)
        acted = st.acted
        assert acted is not None
        st.carried.append(acted)
        if refused is not None:
            return Again(refused, acted.memory)
        if _moved(acted.memory, mem):
            # The job limps on fewer slices, grows back, or runs on a spare: look at the slices it
            # runs on now.
            view, left_out, spares = self._bound(st.read, acted.memory, st.extra)
            st.node, st.spares = view, spares
            looked, st.precheck = self._probe(view, acted.memory, st.now)
            st.probes = looked
            # and at the checkpoints again: the job stopped may have saved on its SIGTERM
            ckpt = self.ports.checkpoints.latest() if self.ports.checkpoints is not None else obs.checkpoint
            return Again(replace(obs, node=view, left_out=left_out, spares=spares, probes=looked, precheck=st.precheck,
                                 precheck_fixed=False, checkpoint=ckpt), acted.memory)
        if decision.check_after and obs.node is not None and checker is not None:
            # The cleanup ran (StopWorkers): check again and decide, in this same tick.
            st.precheck = checker.run(obs.node, "launch", now=st.now)
            return Again(replace(obs, precheck=st.precheck, precheck_fixed=True), acted.memory)
        if decision.decide_again:  # an end with nothing left to stop: the relaunch, from what was seen
            return Again(obs, acted.memory)
        if decision.probe_after and obs.node is not None:
            # The stop after an end ran and the relaunch is due: look at the workers again (with
            # the launch-time checks in the same connection) and decide, in this same tick.
            if checker is not None:
                found, st.precheck = checker.probe_and_run(obs.node, "launch", now=st.now)
                st.probes = tuple(found)
            else:
                st.probes = tuple(self.ports.workers.probe(obs.node))
            return Again(replace(obs, probes=st.probes, precheck=st.precheck if checker is not None else obs.precheck,
                                 precheck_fixed=False), acted.memory)
        return None

    def _journal(self, st: _Settling, decision: Decision, obs: Observation, mem: Memory) -> None:
        """Write-ahead: the decision, and with the tick's first one what it observed, in one transaction."""
        with self.journal.transaction():
            self.journal.record(st.now, decision, obs.operation)
            limp = decision.memory.limp
            if _moved(decision.memory, mem):  # the slices the job runs on changed (`tpuwatch report` counts them)
                self.journal.add_event(st.now, "slices", decision.summary,
                                       {"out": list(limp.out), "in_use": len(limp.kept(self.pcfg.slices)),
                                        "of": len(self.pcfg.slices), "on": list(limp.kept(self.pcfg.slices)),
                                        "row": decision.row,
                                        "spares": list(limp.idle(self.pcfg.slices, self.pcfg.spares))})
            for node, since in _back(mem, decision.memory, obs):  # a node swapped out can stand in again
                self.journal.add_event(st.now, "spare_back", f"{node} can stand in for a slice again, "
                                       f"{human((st.now - since).total_seconds())} after it was swapped out: the wait "
                                       "the swap spared the job", {"node": node, "seconds": (st.now - since).total_seconds()})
            if st.precheck is not None:
                precheck.record(self.journal, st.now, st.precheck)
            if st.journaled:
                return
            st.journaled = True
            if st.cursor is not None:  # when it was read is in the decision's memory (marks)
                self.journal.set_audit_cursor(st.cursor)
            login.record(self.ports.workers, obs.node, self.journal, st.now)

    # -- observe ------------------------------------------------------------------------------

    def _bound(self, read: dict[str, NodeSnapshot | None], mem: Memory, extra: tuple[str, ...] = ()) -> tuple[
            NodeSnapshot | None, tuple[NodeSnapshot | None, ...], tuple[tuple[str, NodeSnapshot | None], ...]]:
        """A multislice job's node as `mem` binds it (its slots on their nodes, those left out
        apart), the slices left out, and its idle spares (`extra`: the nodes handed over to it),
        from the pool as read."""
        node, left_out = bound_view(self.pcfg.tpu_name, self.pcfg.slices, read, mem.limp.out, dict(mem.limp.swapped))
        idle = mem.limp.idle(self.pcfg.slices, (*self.pcfg.spares, *extra))
        return node, left_out, tuple((n, read.get(n)) for n in idle)

    def _probe(self, node: NodeSnapshot | None, mem: Memory,
               now: datetime) -> tuple[tuple[WorkerProbe, ...] | None, PrecheckReport | None]:
        """Every selected worker's job files, when the node is READY (healthy or not; of a
        multislice job, the workers of its READY slices, the others unreachable); with the
        launch-time checks in the same connection when a launch is likely (policy/observe.py)."""
        if node is None or not node.reachable or not node.workers or not probes_due(mem, self.flags.recreate):
            return None, None
        checker = self.ports.precheck
        if checker is not None and launch_likely(mem, node, now):
            probes, report = checker.probe_and_run(node, "launch", now=now)
            return tuple(probes), report
        return tuple(self.ports.workers.probe(node)), None

    def _operation(self, mem: Memory, tpu: TpuApi) -> tuple[OperationStatus | None, CreateFailureKind | None]:
        kind = operation_due(mem)
        if kind is None or mem.recreate.pending_op is None:
            return None, None
        op = tpu.get_operation(mem.recreate.pending_op)
        if not op.done:  # its age, for recovery.operation_timeout: when tpuwatch started it
            op = replace(op, started=mem.recreate.op_started)
        failure = None
        if kind == "create" and op.done and op.error_code:
            classified = recreate.classify_operation(op, started_by_us=True)
            failure = classified.kind if classified is not None else None
        return op, failure

    def _worker_instances(self, node: NodeSnapshot | None) -> Mapping[str, tuple[str, str]] | None:
        """The node's worker VMs for the audit reader (read lazily by the TPU adapter), or None.
        With no node, those its API still knows (a gone Compute Engine instance is its own one
        worker: the log's entry on its preemption says whether Google deleted it)."""
        if node is None:
            return recreate.gone_workers(self.cfg)
        return self.ports.tpu_for(node.zone).worker_instances(node)

    def _audit(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
               probes: Sequence[WorkerProbe] | None, warnings: list[str]) -> tuple[list[AuditEvent], str | None]:
        """New audit events, when policy/observe.py says they are due."""
        audit = self.ports.audit
        if audit is None or not audit_due(mem, node, probes, now):
            return [], None
        try:
            # the nodes the job's slices run on (a spare in a lost slice's place)
            # ("": a slot lent to another job runs nowhere)
            nodes = [n for s in self.pcfg.slices if (n := mem.limp.node_of(s))] or [self.pcfg.tpu_name]
            # and the pool's idle VMs Google may delete itself: its word decides whether one gone
            # is made again (policy/spares.py); each is its own one worker
            # (the keeper of a spare pool: the pool's too)
            word = mem.limp.pool_word
            idle = list(dict.fromkeys(n for n in (*mem.limp.deletes, *mem.limp.vanished, *word.deletes, *word.vanished)
                                      if n not in nodes))
            instances = self._worker_instances(node)
            if node is None and instances is not None:
                # a gone VM is its own one worker under its own name, whichever its slot is bound to
                # (the job's own, a spare, one taken from a job of lower priority or claimed from a
                # spare pool): the entry on its preemption says whether Google deleted it
                instances = {**instances, **{n: (n, "0") for n in nodes}}
            if idle:
                instances = {**(instances or {}), **{n: (n, "0") for n in idle}}
            events, cursor = audit.read([*nodes, *idle], self.journal.audit_cursor(), instances)
        except CloudError as exc:
            # The job can be kept alive without the audit log; it only loses one kind of evidence.
            warnings.append(f"audit log not read: {exc.message}")
            return [], None
        finally:
            # The shared reader (cloud/auditcache.py) says once when it cannot use its cache.
            warnings.extend(audit.take_warnings())
        return list(events), cursor

    # -- environment checks (tpuwatch.workers.precheck) ------------------------------------------

    def _periodic_precheck(self, now: datetime, mem: Memory, node: NodeSnapshot | None,
                           probes: Sequence[WorkerProbe] | None) -> PrecheckReport | None:
        """The periodic checks while the attempt runs, every precheck.interval."""
        checker = self.ports.precheck
        if checker is None or node is None:
            return None
        if not precheck_due(mem, node, probes, now, float(self.cfg.precheck["interval"])):
            return None
        return checker.run(node, "running", now=now)

    # -- act ----------------------------------------------------------------------------------

    def _act(self, st: _Settling, decision: Decision, obs: Observation) -> Observation | None:
        """Carry out the decision's actions in order (st.acted: it, with the memory they left).
        A call refused at once ends the run: the observation to decide again with."""
        st.acted = decision
        node = obs.node
        for action in decision.actions:
            if isinstance(action, Launch) and node is not None:
                st.done.append(self._launch(node, action))
            elif isinstance(action, StopWorkers):
                mem = self._stop_settling(st, action, node, st.acted.memory)
                st.acted = replace(st.acted, memory=mem)
            elif isinstance(action, DeleteNode):
                st.done.append(self._delete(action, decision.memory, node, st.now))
            elif isinstance(action, CreateNode):
                try:
                    text, mem = self._create(action, decision.memory, st.now)
                except recreate.CreateRejected as exc:
                    st.done.append(f"create in {action.zone} refused: {exc.message}")
                    return replace(obs, operation=exc.as_operation(), create_failure=exc.failure.kind,
                                   create_reason=exc.failure.reason)
                st.done.append(text)
                st.acted = replace(decision, memory=mem)
            elif isinstance(action, ClearQueued):
                cleared = self.ports.lifecycle_for(action.zone).clear_ended()
                if cleared:
                    st.done.append(cleared)
            elif isinstance(action, StartMaintenance) and (on := st.read.get(action.name) if action.idle
                                                           else node) is not None:
                try:
                    st.done.append(self._start_maintenance(action, decision.memory, on, st.now))
                except MaintenanceRefused as exc:
                    st.done.append(f"starting the maintenance of {on.name} early was refused: {exc.message}")
                    return replace(obs, maintenance_refused=f"{exc.code}: {exc.message}",
                                   maintenance_refused_idle=action.name if action.idle else "")
            elif isinstance(action, StartNode) and node is not None:
                st.done.append(self._start_node(action, decision.memory, node, st.now))
            elif isinstance(action, Relabel):
                st.done.append(self._relabel(action, decision.memory, st.now))
            elif isinstance(action, RemakeSpare):
                st.done.append(self._remake_spare(action, st.read.get(action.name), decision.memory, st.now))
            elif isinstance(action, ReportHost) and node is not None:
                try:
                    st.done.append(self._report_host(action, decision.memory, node, st.now))
                except HostReportRefused as exc:
                    st.done.append(f"reporting the host of worker {action.worker} as faulty was refused: {exc.message}")
                    return replace(obs, host_report_refused=f"{exc.code}: {exc.message}")
        return None

    def _delete(self, action: DeleteNode, mem: Memory, node: NodeSnapshot | None, now: datetime) -> str:
        what = action.name
        # A slice inserted again from the config (a Compute Engine instance): a body the cloud
        # would refuse stops the watcher here (UsageError), before the delete, not after it.
        recreate.check_before_delete(self.cfg, action.zone)
        try:
            # The policy checked ownership; start_delete checks it again next to the act.
            name, what = recreate.start_delete(self.ports.lifecycle_for(action.zone), node, self.pcfg.job,
                                               adopt=self.flags.adopt)
        except NotFoundError:
            name = ""  # already gone: the next tick sees it missing and creates
        self.journal.record_operation(now, mem, name, "delete", action.zone)
        return f"deleting {what} in {action.zone} ({name or 'already gone'}): {action.reason}"

    def _start_maintenance(self, action: StartMaintenance, mem: Memory, node: NodeSnapshot, now: datetime) -> str:
        if not self.flags.adopt and not node.owned_by(self.pcfg.job):
            raise recreate.ownership_error(node, self.pcfg.job)  # the policy checked; kept next to the act
        name, what = self.ports.lifecycle_for(mem.zone or self.pcfg.zones[0]).start_maintenance(node)
        with self.journal.transaction():
            self.journal.add_event(now, "maintenance_started", f"started the maintenance of {what}: {action.reason}",
                                   {"operation": name, "node": node.name, "node_id": node.id})
        return f"started the maintenance of {what} ({name}): {action.reason}"

    def _start_node(self, action: StartNode, mem: Memory, node: NodeSnapshot, now: datetime) -> str:
        """Start the node Compute Engine stopped (journaled with the decision before this call). A
        refusal is said, never an API failure: the policy waits out repair_timeout, then recreates."""
        if not self.flags.adopt and not node.owned_by(self.pcfg.job):
            raise recreate.ownership_error(node, self.pcfg.job)  # the policy checked; kept next to the act
        try:
            name, what = self.ports.lifecycle_for(mem.zone or self.pcfg.zones[0]).start_node(node)
        except (CloudError, NotFoundError) as exc:
            return f"starting {node.name} again was refused: {exc.message}; waiting for it as a repair"
        with self.journal.transaction():
            self.journal.add_event(now, "node_started", f"started {what} again: {action.reason}",
                                   {"operation": name, "node": node.name, "node_id": node.id})
        return f"started {what} again ({name}): {action.reason}"

    def _remake_spare(self, action: RemakeSpare, spare: NodeSnapshot | None, mem: Memory, now: datetime) -> str:
        """Delete a dead idle spare, or create one tpuwatch deleted (journaled with the decision
        before this call). A refused call is said; the policy tries again later."""
        zone = mem.zone or self.pcfg.zones[0]
        tpu = self.ports.tpu_for(zone)
        try:
            if action.pool:  # a spare of the job's spare pool, made again by the pool's keeper
                name = self._remake_pool_spare(tpu, action, spare, zone)
            elif action.create:
                name = recreate.start_spare_create(tpu, self.cfg, action.name, zone)
            else:
                if spare is None or not spare.owned_by(self.pcfg.job):  # the policy checked; kept next to the act
                    raise recreate.ownership_error(spare, self.pcfg.job) if spare is not None else NotFoundError(
                        f"spare {action.name} is gone")
                recreate.check_before_delete(self.cfg, zone)  # a body the cloud would refuse: exit 2, not deleted
                name = tpu.delete_node(action.name)  # a MIG's: recreateInstances, the MIG stays
        except (CloudError, NotFoundError) as exc:
            return f"{'creating' if action.create else 'deleting'} spare {action.name} was refused: {exc.message}"
        verb = "creating" if action.create else "recreating" if self.pcfg.spares_in_place else "deleting"
        with self.journal.transaction():
            self.journal.add_event(now, "spare_remade", f"{verb} spare {action.name}: {action.reason}",
                                   {"operation": name, "node": action.name, "create": action.create})
        return f"{verb} spare {action.name} ({name}): {action.reason}"

    def _remake_pool_spare(self, tpu: TpuApi, action: RemakeSpare, spare: NodeSnapshot | None, zone: str) -> str:
        """Delete an idle spare of the pool only while it is one (its label, no job's: read again
        next to the act), or create it with the pool's label; the operation's name."""
        if not action.create:
            now = tpu.read_node(action.name) if isinstance(tpu, NodeLabels) else spare
            if now is None:
                raise NotFoundError(f"spare {action.name} is gone")
            if not idle_in(action.pool, now):
                raise NotFoundError(f"spare {action.name} is no longer an idle spare of pool {action.pool} (its labels "
                                    f"say job {now.owner or 'none'}, pool {now.labels.get(POOL_LABEL, 'none')})")
            recreate.check_before_delete(self.cfg, zone)  # a body the cloud would refuse: exit 2, not deleted
        # recorded in the state dir before the delete (or the create of one Google deleted): whichever
        # job keeps the pool next creates it, should this one end or stop keeping it first
        state_dir = Path(self.cfg.state_dir)
        try:
            with poollock.held(state_dir, action.pool):
                names = poollock.remaking(state_dir, action.pool)
                if action.name not in names:
                    poollock.record(state_dir, action.pool, (*names, action.name))
        except OSError as exc:
            raise CloudError(f"the pool's record {state_dir} could not be written ({exc}); not "
                             f"{'created' if action.create else 'deleted'}") from None
        if action.create:
            return recreate.start_pool_create(tpu, self.cfg, action.name, zone, action.pool)
        return tpu.delete_node(action.name)

    def _relabel(self, action: Relabel, mem: Memory, now: datetime) -> str:
        """Write a node's labels (journaled with the decision before this call), read again next to
        the write: only while its ownership label says `action.owner`, and only when they change.
        A refused write is said; the policy writes again while its labels do not say so."""
        tpu = self.ports.tpu_for(mem.zone or self.pcfg.zones[0])
        if not isinstance(tpu, NodeLabels):
            return f"did not relabel {action.name}: this API takes no label writes from tpuwatch ({action.reason})"
        if action.pool:
            return self._claim(tpu, action, now)
        node = tpu.read_node(action.name)
        if node is None:
            return f"did not relabel {action.name}: it is gone ({action.reason})"
        if node.owner != action.owner:
            return (f"did not relabel {action.name}: its label says job {node.owner or 'none'}, not "
                    f"{action.owner} ({action.reason})")
        labels = {k: v for k, v in node.labels.items() if k not in action.drop} | dict(action.put)
        if labels == dict(node.labels):
            return f"{action.name} is labelled so already ({action.reason})"
        try:
            name = tpu.set_labels(action.name, labels)
        except (CloudError, NotFoundError) as exc:
            return f"relabelling {action.name} was refused: {exc.message} ({action.reason})"
        said = ", ".join([*(f"{k}={v}" for k, v in action.put), *(f"-{k}" for k in action.drop if k in node.labels)])
        with self.journal.transaction():
            self.journal.add_event(now, "relabel", f"relabelled {action.name} ({said}): {action.reason}",
                                   {"operation": name, "node": action.name, "labels": labels})
        return f"relabelled {action.name} ({said}; {name}): {action.reason}"

    def _claim(self, tpu: NodeLabels, action: Relabel, now: datetime) -> str:
        """Claim a spare of a spare pool (journaled with the decision before this call): under the
        pool's lock in the state dir, read it again, label it the job's only while it is an idle
        spare of the pool, and wait for the label to land (the API applies it when its operation
        ends), so no other job of this watcher, or of one sharing the state dir, claims it too."""
        with poollock.held(Path(self.cfg.state_dir), action.pool):
            node = tpu.read_node(action.name)
            if node is None or not idle_in(action.pool, node):
                held = "it is gone" if node is None else f"its labels say job {node.owner or 'none'}, pool " \
                                                          f"{node.labels.get(POOL_LABEL, 'none')}"
                return f"did not claim {action.name}: {held} ({action.reason})"
            labels = {**node.labels, **dict(action.put)}
            try:
                name = tpu.set_labels(action.name, labels)
            except (CloudError, NotFoundError) as exc:
                return f"claiming {action.name} was refused: {exc.message} ({action.reason})"
            landed = poollock.wait_for(lambda: tpu.read_node(action.name), self.pcfg.job, self.ports.sleep)
        with self.journal.transaction():
            self.journal.add_event(now, "pool_claim", f"claimed {action.name} from spare pool {action.pool}: "
                                   f"{action.reason}", {"operation": name, "node": action.name, "pool": action.pool,
                                                        "labels": labels, "landed": landed})
        if not landed:
            return (f"claimed {action.name} ({name}) but its label did not say so within {poollock.LAND_WAIT:.0f} s: "
                    f"{action.reason}")
        return f"claimed {action.name} from spare pool {action.pool} ({name}): {action.reason}"

    def _report_host(self, action: ReportHost, mem: Memory, node: NodeSnapshot, now: datetime) -> str:
        if not self.flags.adopt and not node.owned_by(self.pcfg.job):
            raise recreate.ownership_error(node, self.pcfg.job)  # the policy checked; kept next to the act
        life = self.ports.lifecycle_for(mem.zone or self.pcfg.zones[0])
        name, what = life.report_faulty_host(node, action.worker, action.description)
        with self.journal.transaction():
            self.journal.add_event(now, "host_reported", f"reported the host of {what} as faulty: {action.reason}",
                                   {"operation": name, "node": node.name, "node_id": node.id, "worker": action.worker})
        return f"reported the host of {what} as faulty ({name}): {action.reason}"

    def _launch(self, node: NodeSnapshot, action: Launch) -> str:
        # Each worker not already running this attempt cleans up first (old process group,
        # device holders, a stale libtpu lockfile), in the launch's own connection; the
        # worker-side lock makes a repeat harmless.
        results = self.ports.workers.launch(node, action.attempt, action.checkpoint, clean=True)
        return launch_line(action, results, megascale_note(node))

    def _stop_owed(self, st: _Settling, decision: Decision, mem: Memory) -> Memory:
        """A `stop_first` decision's owed stops (policy/owed.py), and nothing else of it: the
        memory it was decided from, with those done settled (journaled)."""
        for action in decision.actions:
            if isinstance(action, StopWorkers) and action.node and action.settles:
                mem = self._stop_settling(st, action, None, mem)
        return mem

    def _stop_settling(self, st: _Settling, action: StopWorkers, node: NodeSnapshot | None, mem: Memory) -> Memory:
        """Do the stop; one that settles a stop a move owed (policy/owed.py) is journaled done, or
        noted failed for the rest of the tick. The memory after it."""
        text, clean = self._stop(st.read.get(action.node) if action.node else node, action)
        st.done.append(text)
        if not action.settles:
            return mem
        if not clean:
            st.owed_failed.extend(n for n in action.settles if n not in st.owed_failed)
            return mem
        mem = owed_stopped(mem, action.settles)
        with self.journal.transaction():
            self.journal.save_memory(mem)
        return mem

    def _stop(self, node: NodeSnapshot | None, action: StopWorkers) -> tuple[str, bool]:
        """What the stop did, and whether every worker it reached stopped."""
        if action.blocked or node is None:  # the policy saw the workers cannot be reached
            return f"did not stop workers: {action.blocked or 'node is missing'} ({action.reason})", False
        results = self.ports.workers.stop(node, wait=action.wait)
        failed = [r for r in results if not r.ok]
        done = len(results) - len(failed)
        stopping = [r for r in results if r.ok and r.stopping]
        killed = [r for r in results if r.ok and r.killed]
        on = f"{done}/{len(results)} workers" + (f" of {action.node}" if action.node else "")
        if stopping:  # not waited for: say what is true now, not what will be
            grace = max(r.grace for r in stopping)
            text = (f"asked the job to stop (SIGTERM) on {on}: {action.reason}; still "
                    f"running on {_listed(stopping)}, killed after {human(grace)} (recovery.stop_grace) "
                    "unless they exit first")
        elif killed:
            grace = max(r.grace for r in killed)
            text = (f"stopped the job on {on}: {action.reason}; {_listed(killed)} "
                    f"ignored SIGTERM for {human(grace)} (recovery.stop_grace) and were killed")
        else:
            text = f"stopped the job on {on}: {action.reason}"
        if failed:
            text += "; " + "; ".join(f"w{r.worker}: {r.describe()}" for r in failed)
        return text, not failed

    def _create(self, action: CreateNode, mem: Memory, now: datetime) -> tuple[str, Memory]:
        """Start the create (CreateRejected when refused at the call); journal its operation."""
        life = self.ports.lifecycle_for(action.zone)
        startup = dict(action.startup)
        # The user the watcher logs in as, so the job the startup script starts lives in the home
        # the watcher probes: a fact the journal keeps (workers/login.py), not a decision.
        if user := login.user_for_create(self.journal):
            startup["user"] = user
        name = recreate.start_create(life, self.cfg, action.zone, resumed=action.resumed, launch=startup)
        mem = self.journal.record_operation(now, mem, name, "create", action.zone)
        through = f" through {life.queue}" if life.queue else ""
        note = recreate.command_withheld_note(self.cfg)
        return (f"creating {action.name}{through} in {action.zone} ({name or 'already exists'}): "
                f"{action.reason}" + (f"; {note}" if note else "")), mem


def launch_line(action: Launch, results: Sequence[LaunchResult], note: str = "") -> str:
    """What a launch did, for people: where it started, and what each worker that did not
    start it said. The worker-side lock may find the attempt started already (by the startup
    script at boot, or an earlier try): that is said, not claimed as a start."""
    started = [r for r in results if r.started]
    problems = []
    for r in results:
        if r.cleanup is not None and not r.cleanup.ok:
            problems.append(f"w{r.worker}: cleanup: {r.cleanup.describe()}")
        if not r.started:
            problems.append(r.describe())  # "worker N: ..."
    where = (f"from {action.checkpoint.path} (step {action.checkpoint.step})"
             if action.checkpoint else "from scratch (no complete checkpoint yet)")
    launched = [r for r in results if r.outcome == "launched"]
    running = [r for r in started if r.outcome == "running"]
    if launched or not running:
        text = f"launched attempt {action.attempt} on {len(started)}/{len(results)} workers {where}"
        if running:
            text += f"; already running on {_listed(running)}, not started again"
    else:
        text = f"attempt {action.attempt} already running on {len(started)}/{len(results)} workers {where}, not started again"
    if note:
        text += f"; {note}"
    return text + ("; " + "; ".join(problems) if problems else "")


def _listed(results: Sequence[StopResult | LaunchResult]) -> str:
    return ", ".join(f"w{r.worker}" for r in results)


def _describe(action: Action) -> str:
    d = action_dict(action)
    kind = d.pop("kind")
    reason = d.pop("reason", "")
    extra = ", ".join(f"{k}={v}" for k, v in d.items() if v not in (None, "", [], (), {}) and v is not False)
    return f"{kind}{' (' + extra + ')' if extra else ''}: {reason}"


def _moved(new: Memory, old: Memory) -> bool:
    """The slices the job runs on changed: a slice left out or taken back, a spare swapped in."""
    return new.limp.out != old.limp.out or new.limp.swapped != old.limp.swapped


def _back(old: Memory, new: Memory, obs: Observation) -> list[tuple[str, datetime]]:
    """The nodes swapped out while lost that this decision saw able to stand in again."""
    left = set(zip(new.limp.away, new.limp.away_since, strict=True))
    idle = dict(obs.spares)
    return [(n, t) for n, t in zip(old.limp.away, old.limp.away_since, strict=True) if (n, t) not in left and n in idle]
