"""The goodput benchmark's simulated world, driven by the virtual clock (`clock.Sim`).

`BenchWorld` is the job's pod slices and the job as the tools see them: each slice's node (state,
health, incarnation id), its workers' job files and the processes last launched there, the running
attempt and its progress (`job.Attempt`), the checkpoint bucket, the audit log, long-running
operations and the zone's capacity. Tools act on the world only through its methods; faults come
from a `Trace`, each on one slice.

Multislice (`Params.slices` > 1): the job is one program over every worker of every slice. An
attempt trains only once every slice runs processes launched since the last disruption; until
then the processes that are there wait for their peers. Any slice's disruption (its hosts going
down, a crash, a hang, a stop) ends the attempt's progress on all slices: the processes of the
other slices live on, blocked in their cross-slice collectives, making no progress and writing no
checkpoint, until someone stops them. A hang there is said in the logs: Megascale (libtpu's
multislice runtime) logs "Megascale hang detected" after `megascale_threshold` without progress
(its --megascale_graph_hang_threshold, 5 minutes by default, per MaxText's Megascale hang
playbook), and with `megascale_abort` (the abort-on-hang flags tpuwatch appends to
LIBTPU_INIT_ARGS) the processes then abort (134). Within a slice a dead worker still makes its peers abort
after `peer_timeout`. Checkpoints are global (one bucket). With one slice all of this is the
single-slice model: a launch is at once the attempt.

This module knows nothing of tpuwatch's policy or of any baseline: it is the cloud, the hosts
and the training program. It imports no google, ssh or time code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from lab.clock import Signal, Sim
from lab.job import Attempt, Params, Procs

# google.rpc codes the world's operations end with
OK, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED = 0, 5, 6, 8
# exit codes a worker can record
EXIT_TERM = 143  # stopped by a supervisor (SIGTERM, recorded by the wrapper)
SSH_LOST = 255  # what an ssh session reports when the host went away under it


@dataclass
class Upcoming:
    """A maintenance announced on a node: v2alpha1 `upcomingMaintenance` when `shown`; the
    metadata server's notice `notice_lead` before `start` in any case."""

    kind: str  # trace kind: scheduled, unscheduled, notice
    type: str  # SCHEDULED / UNSCHEDULED
    start: float  # window start: the host goes down then unless started earlier
    heal_after: float
    can_reschedule: bool
    shown: bool  # in the node's upcomingMaintenance (notice-only events are not)
    status: str = "PENDING"  # PENDING, ONGOING
    attempt: Attempt | None = None  # the attempt the notice reached
    done: bool = False  # its work lost is recorded


@dataclass
class AnnouncedHit:
    """An announced maintenance that found a job making progress, and the work it cost."""

    kind: str
    time: float
    lost_steps: int
    how: str  # early (started by the tool), notice (the job saved/stopped on it), down (killed)


@dataclass
class SliceNode:
    id: int
    state: str
    health: str
    created: float
    description: str = ""
    maintenance_time: float | None = None
    files: dict[int, int] = field(default_factory=dict)  # worker -> attempt number in its job dir
    epoch: int = 0  # bumped by every fault, so a stale scheduled change is ignored


@dataclass
class AuditRec:
    time: float
    kind: str  # terminate / restart
    node_id: int
    reason: str
    node: str = ""  # the slice's node name


@dataclass
class SliceRec:
    """One slice: its node of the moment, whether its hosts are up, its last launch."""

    name: str
    node: SliceNode | None
    hosts_up: bool = True
    maintenance: bool = False  # the node is in a maintenance fault now
    heal_at: float | None = None  # the current maintenance heals then (None: never / none)
    procs: Procs | None = None


@dataclass
class OpRec:
    name: str
    kind: str  # create / delete
    done: bool = False
    error_code: int = OK
    error_message: str = ""
    sig: Signal = field(default_factory=Signal)


@dataclass
class FaultHit:
    """A fault the world received, and when the job ran again after it."""

    kind: str
    time: float
    interrupted: bool  # a live attempt was making progress when it struck
    resumed: float | None = None  # next launch after it


@dataclass
class Meter:
    """Calls a tool made: cloud API (TPU, Logging, Storage) and ssh connections."""

    tpu: int = 0
    log: int = 0
    storage: int = 0
    ssh: int = 0


class BenchWorld:
    """The job's slices, the job and its zone, under one fault trace, driven by one tool.

    Slice `s` is `self.slices[s]`; `node`, `hosts_up`, `maintenance` and `heal_at` are slice 0's,
    which is all there is to a single-slice job (the baselines only run on one). Workers are
    numbered globally, slice by slice: worker `w` of slice `s` is `s * workers + w`.
    """

    def __init__(self, sim: Sim, p: Params, stockouts: list[tuple[float, float]], name: str = "llm-pod") -> None:
        self.sim = sim
        self.p = p
        self.name = name
        self.stockouts = sorted(stockouts)
        self._next_id = 1000
        total = p.slices + p.spares
        names = [name] if total == 1 else [f"{name}-{i}" for i in range(total)]
        self.slices = [SliceRec(n, SliceNode(self._new_id(), "READY", "HEALTHY", 0.0)) for n in names]
        # The slices the job runs on: all of them, unless there are spares (the slices beyond
        # p.slices, idle) or the job limps (on fewer); a launch may name others (`launch`).
        self.active: list[int] = list(range(p.slices))
        # A fault of the trace strikes a role, not a machine: role i < p.slices is the job's slot i,
        # the others the spares; roles[i] is the slice in it now. A swap to a spare swaps their
        # roles, so every way meets the job's faults at the same times (every slice's faults come
        # from the same memoryless process: which slice a stream follows changes no distribution).
        self.roles: list[int] = list(range(total))
        self.attempt: Attempt | None = None
        self.attempts: list[Attempt] = []
        self.ckpt_step = 0
        self.ckpt_time: float | None = None
        self.audit: list[AuditRec] = []
        self.ops: dict[str, OpRec] = {}
        self._op_seq = 0
        self.pushed = False  # the buggy code is in the repository
        self.bug_seen: float | None = None  # first launch of the buggy code
        self.bad_launches = 0  # launches of the buggy code (on every slice, or on one)
        self.stopped: float | None = None  # the tool gave up (or finished)
        self.stop_reason = ""
        self.stop_short = ""  # a few words for tables
        self.done: float | None = None  # worker 0 exited 0: the job is complete
        self.hits: list[FaultHit] = []
        self.skipped: list[tuple[str, float]] = []  # faults that found nothing to hit
        self.steps_run = 0  # steps executed by ended attempts (redone ones included)
        self.changed = Signal()  # fired on every change a supervisor could observe
        # A relay beside each attempt passes the metadata server's notice to the job as a signal
        # (tpuwatch's maintenance.notify_signal); no baseline has one.
        self.relay = False
        # The launch appends Megascale's abort-on-hang flags to LIBTPU_INIT_ARGS (tpuwatch's
        # [job] megascale_abort_on_hang, multislice only); no baseline does.
        self.megascale_abort = False
        self.announced: list[AnnouncedHit] = []
        self._stopped_now: Attempt | None = None  # the attempt a supervisor stopped last (early start)
        # Announced and not over. Like every fault of the trace they strike the slice's node of
        # the moment: a node recreated in between has them too. (Slice 0 only.)
        self.upcomings: list[Upcoming] = []
        # Relaunch time: from the moment the last slice a disruption took down is usable again
        # to the next attempt on every slice, one figure per such disruption.
        self.relaunches: list[float] = []
        self._down: bool = False  # a disruption took a slice down and the job has not run since
        self._all_usable_at: float | None = None
        # A multislice job's slices came from one queued resource (multisliceParams, nodes
        # <name>-0..N-1), which a tool may delete (force: every slice) and create again as a whole.
        # Not with spares, nor for a job that limps (`Params.made_alone`): then every slice, the
        # spares too, is a node made alone (what such a job runs: a slice swapped out or left out
        # can be made again alone, as the bounds assume), so no autorepair either: a stuck node
        # stays stuck until a tool deletes it.
        self.queued = "ACTIVE" if p.slices > 1 and not p.made_alone else ""  # its state; "" when there is none
        self._queued_gen = 0  # bumped by every create of it: an autorepair of an older one is void

    # -- slice 0, the whole of a single-slice job --------------------------------------------

    @property
    def node(self) -> SliceNode | None:
        return self.slices[0].node

    @property
    def hosts_up(self) -> bool:
        return self.slices[0].hosts_up

    @property
    def maintenance(self) -> bool:
        return self.slices[0].maintenance

    @property
    def heal_at(self) -> float | None:
        return self.slices[0].heal_at

    @property
    def upcoming(self) -> Upcoming | None:
        """What the node's upcomingMaintenance shows: the one under way, else the soonest announced."""
        shown = [u for u in self.upcomings if u.shown]
        ongoing = [u for u in shown if u.status == "ONGOING"]
        return ongoing[0] if ongoing else min(shown, key=lambda u: u.start, default=None)

    def slice_of(self, name: str) -> int | None:
        """The index of the slice whose node is named `name` (None: no such slice)."""
        return next((i for i, sl in enumerate(self.slices) if sl.name == name), None)

    # -- helpers ----------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _touch(self) -> None:
        if self._down:
            if not self.usable():
                self._all_usable_at = None
            elif self._all_usable_at is None:
                self._all_usable_at = self.now
        old, self.changed = self.changed, Signal()
        self.sim.fire(old)

    @property
    def now(self) -> float:
        return self.sim.now

    def in_stockout(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.stockouts)

    def stockout_end(self, t: float) -> float:
        """The first time >= t with capacity."""
        end = t
        moved = True
        while moved:
            moved = False
            for a, b in self.stockouts:
                if a <= end < b:
                    end, moved = b, True
        return end

    def usable(self, s: int | None = None) -> bool:
        """Slice `s` (None: every slice the job runs on) is READY, HEALTHY and its hosts are up."""
        for sl in [self.slices[i] for i in self.active] if s is None else (self.slices[s],):
            n = sl.node
            if n is None or n.state != "READY" or n.health != "HEALTHY" or not sl.hosts_up:
                return False
        return True

    def live(self) -> Attempt | None:
        a = self.attempt
        return a if a is not None and not a.ended else None

    def checkpoint(self) -> tuple[int, float | None]:
        """Newest complete checkpoint in the bucket: (step, completion time); step 0 = none."""
        a = self.live()
        if a is not None:
            _, ck, ckt = a.progress(self.now)
            if ck > self.ckpt_step:
                return ck, ckt
        return self.ckpt_step, self.ckpt_time

    def next_change(self, ignore: Callable[..., None] | None = None) -> float:
        """The first time after now at which a supervisor could observe something new: a
        scheduled event (but `ignore`'s: the supervisors' own wake-ups), the live attempt's first
        step (its log starts to grow) or next checkpoint completing, or an audit entry becoming
        readable. Nothing else observable changes before it."""
        t = self.sim.next_time(ignore)
        a = self.live()
        if a is not None and a.frozen is None and not a.bad:
            if self.now < a.run_start:
                t = min(t, a.run_start)
            c = a._cycle()
            n = max(0, math.floor((self.now - a.run_start) / c)) if self.now > a.run_start else 0
            t = min(t, a.run_start + (n + 1) * c)  # the save after this one completes then
        pending = [r.time + self.p.audit_delay for r in self.audit[-8:] if r.time + self.p.audit_delay > self.now]
        return min([t, *pending])

    def step_now(self) -> int:
        a = self.live()
        return a.progress(self.now)[0] if a is not None else self.ckpt_step

    # -- the job ----------------------------------------------------------------------------

    def launch(self, no: int, s0: int | None = None, slices: list[int] | None = None) -> Attempt | None:
        """Start attempt `no` on every worker of every slice from checkpoint `s0` (None: the newest).
        `slices` names the slices to run on (a spare's, or fewer when limping; None: the same
        as last time): from then on they are the job's slices (`active`).

        None when some slice's workers cannot be reached or still run processes (the worker lock).
        """
        if slices is not None:
            self._set_active(slices)
        if not all(self._launchable(s) for s in self.active) or self.done is not None:
            return None
        for s in self.active:
            self._start(s, no)
        self.bad_launches += self.pushed
        a = self._form(s0)
        self._touch()
        return a

    def launch_slice(self, s: int, no: int) -> Procs | None:
        """Start the training command (attempt `no`, its launcher's number) on slice `s` alone.
        It joins an attempt only once every slice runs processes launched since the last
        disruption. None when the slice's workers cannot be reached or still run processes."""
        if not self._launchable(s) or self.done is not None:
            return None
        pr = self._start(s, no)
        self.bad_launches += self.pushed
        self._form(None)
        self._touch()
        return pr

    def _set_active(self, slices: list[int]) -> None:
        floor = self.p.limp_floor if self.p.limp_floor is not None else self.p.slices
        if (len(set(slices)) != len(slices) or not floor <= len(slices) <= self.p.slices
                or not all(0 <= s < len(self.slices) for s in slices)):
            raise ValueError(f"cannot run the job on slices {slices}: {floor} to {self.p.slices} of "
                             f"0..{len(self.slices) - 1}")
        self.active = sorted(slices)
        job = self.roles[:self.p.slices]
        new = [s for s in self.active if s not in job]
        for i in range(self.p.slices):
            if self.roles[i] not in self.active and new:
                j = self.roles.index(new.pop(0))
                self.roles[i], self.roles[j] = self.roles[j], self.roles[i]

    def _state(self, s: int) -> str:
        """Slice `s`'s node state as the API shows it (MISSING: no node; UNHEALTHY: READY, not HEALTHY)."""
        node = self.slices[s].node
        if node is None:
            return "MISSING"
        return "UNHEALTHY" if node.state == "READY" and node.health != "HEALTHY" else node.state

    def _launchable(self, s: int) -> bool:
        sl = self.slices[s]
        node = sl.node
        return (node is not None and node.state == "READY" and sl.hosts_up
                and (sl.procs is None or sl.procs.ended))

    def _start(self, s: int, no: int) -> Procs:
        sl = self.slices[s]
        assert sl.node is not None
        pr = Procs(no, s, sl.node.id, self.now, self.pushed)
        sl.procs = pr
        sl.node.files = {w: no for w in range(self.p.workers)}
        if pr.bad:
            if self.bug_seen is None:
                self.bug_seen = self.now
            self.sim.after(self.p.bug_exit_after, self._bug_exit, pr)
        return pr

    def _form(self, s0: int | None) -> Attempt | None:
        """Every slice runs processes that joined no attempt: they start one together, now."""
        procs = [self.slices[s].procs for s in self.active]
        if not all(pr is not None and not pr.ended and pr.attempt is None for pr in procs):
            return None
        ready = [pr for pr in procs if pr is not None]
        start = self.checkpoint()[0] if s0 is None else s0
        a = Attempt(ready[0].no, ready[0].node_id, self.now, start, any(pr.bad for pr in ready),
                    self.p.on_slices(len(ready)), procs=ready)
        for pr in ready:
            pr.attempt = a
        a.left_out = tuple(self._state(s) for s in self.roles[:self.p.slices] if s not in self.active)
        self.attempt = a
        self.attempts.append(a)
        for hit in self.hits:
            if hit.resumed is None:
                hit.resumed = self.now
        if self._down and self._all_usable_at is not None:
            self.relaunches.append(self.now - self._all_usable_at)
        self._down, self._all_usable_at = False, None
        if not a.bad and a.done_at is not None and a.done_at <= self.p.horizon:
            self.sim.at(a.done_at, self._exit_all, a, 0)
        return a

    def _bug_exit(self, pr: Procs) -> None:
        """The buggy code exits 1 on every worker of the slice."""
        if pr.ended:
            return
        a = pr.attempt
        if a is not None and a.frozen is None:
            a.frozen = self.now
        self._record(pr, range(self.p.workers), 1)
        self._procs_end(pr)

    def _record(self, pr: Procs, workers: range | list[int], code: int | None) -> None:
        """Exit `code` on the slice-local `workers` of `pr` that have none yet (its attempt's too)."""
        base = pr.slice * self.p.workers
        for w in workers:
            pr.exits.setdefault(w, code)
            if pr.attempt is not None:
                pr.attempt.exits.setdefault(base + w, code)

    def _exit_all(self, a: Attempt, code: int) -> None:
        if a.ended or (a.frozen is not None and code == 0):
            return
        if a.frozen is None:
            a.frozen = self.now
        self._end_all(a, code)
        if code == 0:
            self.done = self.now

    def _end_all(self, a: Attempt, code: int) -> None:
        """Every worker of every slice of `a` exits `code` at once."""
        for pr in a.procs:
            self._record(pr, range(self.p.workers), code)
            pr.ended = True
        self._end(a)

    def _exit_one(self, a: Attempt, worker: int, code: int) -> None:
        """Global worker `worker` of attempt `a` exits `code`."""
        s, local = divmod(worker, self.p.workers)
        pr = next(q for q in a.procs if q.slice == s)
        if pr.ended or local in pr.exits:
            return
        self._record(pr, [local], code)
        if len(pr.exits) == self.p.workers:
            self._procs_end(pr)
        else:
            self._touch()

    def _procs_end(self, pr: Procs, lost: bool = False) -> None:
        """A slice's processes are all gone; the attempt ends with the last of its slices'."""
        pr.ended = True
        a = pr.attempt
        if a is not None and not a.ended and all(q.ended for q in a.procs):
            self._end(a, lost)
        else:
            self._touch()

    def _end(self, a: Attempt, lost: bool = False) -> None:
        """The attempt's processes are all gone: commit its checkpoint, wake its ssh session."""
        a.ended, a.end_time = True, self.now
        step, ck, ckt = a.progress(self.now)
        self.steps_run += step - a.s0
        if ck > self.ckpt_step:
            self.ckpt_step, self.ckpt_time = ck, ckt
        a.lost = max(0, step - max(ck, self.ckpt_step))
        if lost:
            rc = SSH_LOST
        else:
            codes = [c for c in a.exits.values() if c]
            rc = codes[0] if codes else 0
        self.sim.fire(a.end_sig, rc)
        self._touch()

    def stop_job(self, slices: list[int] | None = None) -> bool:
        """SIGTERM the processes on every worker of `slices` (None: all; a supervisor's stop).
        Stopping any slice of a live attempt ends its progress. False: nothing ran there."""
        stopped = False
        for s in range(len(self.slices)) if slices is None else slices:
            sl = self.slices[s]
            pr = sl.procs
            if pr is None or pr.ended or not sl.hosts_up:
                continue
            a = pr.attempt
            if a is not None:
                if a.frozen is None:
                    a.frozen = self.now
                self._stopped_now = a
            self._record(pr, range(self.p.workers), EXIT_TERM)
            self._procs_end(pr)
            stopped = True
        return stopped

    def _hosts_down(self, s: int) -> None:
        """Slice `s`'s hosts went away: its processes die with no exit code, ssh sessions drop;
        the attempt they were part of stops making progress on every slice."""
        sl = self.slices[s]
        sl.hosts_up = False
        pr = sl.procs
        if pr is not None and not pr.ended:
            a = pr.attempt
            if a is not None and a.frozen is None:
                a.frozen = self.now
            self._procs_end(pr, lost=True)

    # -- what a supervisor can observe -----------------------------------------------------

    def probe(self) -> list[tuple[int, str, int | None, int | None]]:
        """(worker, state, attempt, exit code) per worker of every slice, as the worker-side probe
        answers; workers numbered globally."""
        out: list[tuple[int, str, int | None, int | None]] = []
        for s in range(len(self.slices)):
            base = s * self.p.workers
            out += [(base + w, state, no, code) for w, state, no, code in self.probe_slice(s)]
        return out

    def probe_slice(self, s: int) -> list[tuple[int, str, int | None, int | None]]:
        """(slice-local worker, state, attempt, exit code) per worker of slice `s`."""
        sl = self.slices[s]
        node = sl.node
        pr = sl.procs
        out: list[tuple[int, str, int | None, int | None]] = []
        for w in range(self.p.workers):
            if node is None or not sl.hosts_up or node.state != "READY":
                out.append((w, "unreachable", None, None))
                continue
            no = node.files.get(w)
            if no is None:
                out.append((w, "absent", None, None))
            elif pr is not None and pr.no == no and pr.node_id == node.id:
                code = pr.exits.get(w)
                if code is not None:
                    out.append((w, "exited", no, code))
                elif w in pr.exits or pr.ended:
                    out.append((w, "absent", no, None))
                else:
                    out.append((w, "running", no, None))
            else:
                out.append((w, "absent", no, None))
        return out

    def audit_since(self, cursor: int) -> tuple[list[AuditRec], int]:
        """Entries readable now, after `cursor` (an index), and the new cursor."""
        limit = self.now - self.p.audit_delay
        end = cursor
        while end < len(self.audit) and self.audit[end].time <= limit:
            end += 1
        return self.audit[cursor:end], end

    # -- cloud operations -------------------------------------------------------------------

    def _op(self, kind: str) -> OpRec:
        self._op_seq += 1
        op = OpRec(f"operations/op-{self._op_seq}", kind)
        self.ops[op.name] = op
        return op

    def _finish_op(self, op: OpRec, code: int = OK, message: str = "") -> None:
        op.done, op.error_code, op.error_message = True, code, message
        self.sim.fire(op.sig, op)
        self._touch()

    def delete_node(self, s: int = 0) -> OpRec | None:
        """Start deleting slice `s`'s node; None when there is none."""
        sl = self.slices[s]
        node = sl.node
        if node is None or node.state == "DELETING":
            return None
        node.state, node.health = "DELETING", "HEALTH_UNSPECIFIED"
        node.epoch += 1
        sl.maintenance, sl.heal_at = False, None
        self._hosts_down(s)
        op = self._op("delete")
        self.sim.after(self.p.delete_time, self._deleted, s, node, op)
        self._touch()
        return op

    def _deleted(self, s: int, node: SliceNode, op: OpRec) -> None:
        sl = self.slices[s]
        if sl.node is node:
            sl.node = None
        self._finish_op(op)

    def create_node(self, s: int = 0) -> OpRec:
        """Start creating slice `s`'s node; the operation fails when the zone has no capacity."""
        sl = self.slices[s]
        op = self._op("create")
        if sl.node is not None:
            self._finish_op(op, ALREADY_EXISTS, f"node {sl.name} already exists")
            return op
        if self.in_stockout(self.now):
            self.sim.after(self.p.create_fail_time, self._finish_op, op, RESOURCE_EXHAUSTED,
                           'There is no more capacity in the zone "us-central2-b"')
            return op
        node = SliceNode(self._new_id(), "CREATING", "HEALTH_UNSPECIFIED", self.now)
        sl.node = node
        sl.hosts_up = False
        self.sim.after(self.p.create_time, self._created, s, node, op)
        self._touch()
        return op

    def _created(self, s: int, node: SliceNode, op: OpRec) -> None:
        sl = self.slices[s]
        if sl.node is node and node.state == "CREATING":
            node.state, node.health = "READY", "HEALTHY"
            sl.hosts_up = True
        self._finish_op(op)

    def delete_queued(self) -> OpRec | None:
        """Delete the queued resource with force: every slice's node goes. None when there is none."""
        if self.queued in ("", "DELETING"):
            return None
        self.queued = "DELETING"
        for s in range(len(self.slices)):
            self.delete_node(s)
        op = self._op("delete")
        self.sim.after(self.p.delete_time, self._queued_gone, op)
        self._touch()
        return op

    def _queued_gone(self, op: OpRec) -> None:
        self.queued = ""
        self._finish_op(op)

    def create_queued(self) -> OpRec | None:
        """Queue a request for every slice (done at once, as the service's operation is): it
        waits while the zone has no capacity, then provisions every node together. None when
        the queued resource still exists."""
        if self.queued:
            return None
        self.queued = "WAITING_FOR_RESOURCES"
        self._queued_gen += 1
        op = self._op("create")
        self._finish_op(op)
        self.sim.at(self.stockout_end(self.now), self._provision)
        return op

    def _provision(self) -> None:
        if self.queued != "WAITING_FOR_RESOURCES":
            return
        if self.in_stockout(self.now):  # a window that began meanwhile
            self.sim.at(self.stockout_end(self.now), self._provision)
            return
        self.queued = "PROVISIONING"
        for s in range(len(self.slices)):
            self.create_node(s)
        self.sim.after(self.p.create_time, self._provisioned)

    def _provisioned(self) -> None:
        if self.queued == "PROVISIONING":
            self.queued = "ACTIVE"
            self._touch()

    # -- faults -----------------------------------------------------------------------------

    def _hit(self, kind: str, interrupted: bool, down: bool = False, s: int | None = None) -> None:
        """Record a fault (on slice `s`); `down`: it takes a slice down (a relaunch waits for it to
        be usable). A fault on a slice the job does not run on (a spare) interrupts nothing."""
        interrupted = interrupted and (s is None or s in self.active)
        self.hits.append(FaultHit(kind, self.now, interrupted))
        if interrupted and down:
            self._down, self._all_usable_at = True, None

    def _running(self) -> bool:
        """A good attempt is making progress (or starting up)."""
        a = self.live()
        return a is not None and a.frozen is None and not a.bad

    def maintenance_event(self, kind: str, heal_after: float | None, stuck: str = "REPAIRING", s: int = 0) -> bool:
        """UNHEALTHY_MAINTENANCE on slice `s`, the job killed, REPAIRING; healed after
        `heal_after` (None: never)."""
        sl = self.slices[s]
        node = sl.node
        if node is None or node.state != "READY" or node.health != "HEALTHY":
            self.skipped.append((kind, self.now))
            return False
        if heal_after is None and self.queued == "ACTIVE":
            return self._replace_slice(s, kind)
        self._hit(kind, self._running(), down=True, s=s)
        node.epoch += 1
        node.health, node.description = "UNHEALTHY_MAINTENANCE", ""
        self.audit.append(AuditRec(self.now, "terminate", node.id, "MAINTENANCE", sl.name))
        self._hosts_down(s)
        sl.maintenance = True
        sl.heal_at = self.now + heal_after if heal_after is not None else None
        epoch = node.epoch
        repair_in = self.p.repairing_after if heal_after is None else min(self.p.repairing_after, heal_after / 10)
        self.sim.after(repair_in, self._set_state, node, epoch, "REPAIRING", None)
        if heal_after is None and stuck == "UNKNOWN":
            self.sim.after(self.p.unknown_after, self._set_state, node, epoch, "UNKNOWN", "HEALTH_UNSPECIFIED")
        if heal_after is not None:
            self.sim.after(heal_after, self._heal, s, node, epoch)
        self._touch()
        return True

    def _replace_slice(self, s: int, kind: str) -> bool:
        """A slice of the ACTIVE multislice request fails for good: Google's multislice autorepair
        "creates a new TPU slice" (waiting for hardware if there is none), then restarts the other
        slices (Cloud TPU Multislice overview, "Autorepair"). Its node goes at once, with a
        terminate entry, while the request stays ACTIVE."""
        sl = self.slices[s]
        node = sl.node
        assert node is not None
        self._hit(kind, self._running(), down=True, s=s)
        self.audit.append(AuditRec(self.now, "terminate", node.id, "HARDWARE_FAILURE", sl.name))
        self._hosts_down(s)
        node.epoch += 1
        sl.node, sl.maintenance, sl.heal_at = None, False, None
        self.sim.after(self.p.autorepair_after, self._autorepair_create, s, self._queued_gen)
        self._touch()
        return True

    def _autorepair_create(self, s: int, gen: int) -> None:
        sl = self.slices[s]
        if sl.node is not None or self.queued != "ACTIVE" or gen != self._queued_gen:
            return  # someone made the slice (or the whole request) again meanwhile
        if self.in_stockout(self.now):
            self.sim.at(self.stockout_end(self.now), self._autorepair_create, s, gen)
            return
        node = SliceNode(self._new_id(), "CREATING", "HEALTH_UNSPECIFIED", self.now)
        sl.node, sl.hosts_up = node, False
        self.sim.after(self.p.create_time, self._autorepaired, s, node)
        self._touch()

    def _autorepaired(self, s: int, node: SliceNode) -> None:
        """The new slice is READY; every other READY slice of the request restarts (its processes
        killed): those the job runs on, also while it limps without the new one."""
        sl = self.slices[s]
        if sl.node is not node or node.state != "CREATING":
            return
        node.state, node.health = "READY", "HEALTHY"
        sl.hosts_up = True
        self.audit.append(AuditRec(self.now, "restart", node.id, "", sl.name))
        # the request's slices: the job's roles (a slice it limps without keeps its role; a spare,
        # not part of the request, restarts nobody)
        request = self.roles[:self.p.slices]
        for i, peer in enumerate(self.slices):
            pn = peer.node
            if i == s or s not in request or i not in request or pn is None or pn.state != "READY":
                continue
            pn.epoch += 1
            pn.state = "RESTARTING"
            self._hosts_down(i)
            self.sim.after(self.p.multislice_restart, self._restarted, i, pn, pn.epoch)
        self._touch()

    def _restarted(self, s: int, node: SliceNode, epoch: int) -> None:
        sl = self.slices[s]
        if sl.node is not node or node.epoch != epoch:
            return
        node.epoch += 1
        node.state, node.health = "READY", "HEALTHY"
        sl.hosts_up = True
        self.audit.append(AuditRec(self.now, "restart", node.id, "", sl.name))
        self._touch()

    def _set_state(self, node: SliceNode, epoch: int, state: str, health: str | None) -> None:
        if node.epoch != epoch or all(sl.node is not node for sl in self.slices):
            return
        node.state = state
        if health is not None:
            node.health = health
        self._touch()

    def _heal(self, s: int, node: SliceNode, epoch: int) -> None:
        sl = self.slices[s]
        if sl.node is not node or node.epoch != epoch:
            return
        node.epoch += 1
        node.state, node.health = "READY", "HEALTHY"
        node.maintenance_time = self.audit[-1].time if self.audit else None
        node.description = "The TPU had a maintenance event"
        self.audit.append(AuditRec(self.now, "restart", node.id, "", sl.name))
        sl.hosts_up = True
        sl.maintenance, sl.heal_at = False, None
        if s == 0:
            self.upcomings = [u for u in self.upcomings if u.status != "ONGOING"]
        self._touch()

    def preempt(self, s: int = 0) -> bool:
        sl = self.slices[s]
        node = sl.node
        if node is None or node.state != "READY":
            self.skipped.append(("preemption", self.now))
            return False
        self._hit("preemption", self._running(), down=True, s=s)
        node.epoch += 1
        node.state, node.health, node.description = "PREEMPTED", "HEALTH_UNSPECIFIED", ""
        self.audit.append(AuditRec(self.now, "terminate", node.id, "PREEMPTED", sl.name))
        sl.maintenance, sl.heal_at = False, None
        self._hosts_down(s)
        self._touch()
        return True

    def crash(self, worker: int, s: int = 0) -> bool:
        """Worker `worker` of slice `s` exits 139 (SIGSEGV); that slice's other workers abort
        (134) after `peer_timeout`; other slices' processes hang in their collectives."""
        a = self.live()
        if a is None or not self._running() or not self.slices[s].hosts_up or s not in self.active:
            self.skipped.append(("crash", self.now))
            return False
        self._hit("crash", True)
        a.frozen = self.now
        base = s * self.p.workers
        self._exit_one(a, base + worker % self.p.workers, 139)
        for w in range(self.p.workers):
            self.sim.after(self.p.peer_timeout, self._exit_one, a, base + w, 134)
        return True

    def hang(self, s: int = 0) -> bool:
        """Every worker stops making progress; the processes live on."""
        a = self.live()
        if a is None or not self._running() or not self.slices[s].hosts_up or s not in self.active:
            self.skipped.append(("hang", self.now))
            return False
        self._hit("hang", True)
        a.frozen = self.now
        if len(self.slices) > 1:
            self.sim.after(self.p.megascale_threshold, self._megascale_hang, a)
        self._touch()
        return True

    def _megascale_hang(self, a: Attempt) -> None:
        """Megascale logs the hang on every live worker; with the abort flags, they abort."""
        if a.ended:
            return
        a.megascale_at = self.now
        if self.megascale_abort:
            for pr in a.procs:
                if not pr.ended:
                    self._record(pr, range(self.p.workers), 134)
                    self._procs_end(pr)
            return
        self._touch()

    # -- announced maintenance ---------------------------------------------------------------

    def announce(self, kind: str, start: float, heal_after: float) -> bool:
        """A maintenance of the node is announced now for `start`: "scheduled" / "unscheduled"
        may be started early (canReschedule) and show in upcomingMaintenance; "notice" gives only
        the metadata server's notice. Then the notice `notice_lead` before, and the host goes down."""
        up = Upcoming(kind, "SCHEDULED" if kind == "scheduled" else "UNSCHEDULED", start, heal_after,
                      can_reschedule=kind != "notice", shown=kind != "notice")
        self.upcomings.append(up)
        self.sim.at(start - self.p.notice_lead, self._notice, up)
        self.sim.at(start, self._announced_start, up)
        self._touch()
        return True

    def _pending(self, up: Upcoming) -> bool:
        return up in self.upcomings and up.status == "PENDING"

    def _notice(self, up: Upcoming) -> None:
        """TERMINATE_ON_HOST_MAINTENANCE on every worker's metadata server. Only a relay passes
        it on: the job then saves (save_on_term) and exits 0, or dies of the signal."""
        if not self._pending(up) or not self.relay or not self.hosts_up or not self._running():
            return
        a = self.live()
        assert a is not None
        a.notice, up.attempt = "TERMINATE_ON_HOST_MAINTENANCE", a
        a.frozen = self.now
        if self.p.save_on_term:
            a.saved_step, a.saved_at = a.progress(self.now)[0], self.now + self.p.ckpt_save
            self.sim.at(a.saved_at, self._saved_exit, a)
        else:
            self._end_all(a, EXIT_TERM)
        self._touch()

    def _saved_exit(self, a: Attempt) -> None:
        """The job saved on the signal and exits 0 (not the job's end: the relay noted why)."""
        if a.ended:
            return
        self._end_all(a, 0)

    def _announced_start(self, up: Upcoming) -> None:
        if self._pending(up):
            self._maintain(up, "down")

    def _maintain(self, up: Upcoming, how: str) -> None:
        """The announced maintenance takes the host down now; record the work it cost a job that
        was making progress when it was announced."""
        up.status = "ONGOING"
        running = self.live() if self._running() else None
        if not self.maintenance_event(up.kind, up.heal_after):
            self.upcomings.remove(up)  # the node was down already: the maintenance happened unseen
            return
        a = up.attempt or running
        if how == "early":
            a = self._stopped_now if self._stopped_now is not None and self._stopped_now.end_time == self.now else a
        if a is not None and a.ended and not up.done:
            up.done = True
            self.announced.append(AnnouncedHit(up.kind, self.now, a.lost, "notice" if up.attempt else how))

    def perform_maintenance(self) -> OpRec | None:
        """v2alpha1 performMaintenance: start the node's announced maintenance now; None when
        there is none that may be started early (the service refuses)."""
        up = self.upcoming
        if self.node is None or up is None or not up.can_reschedule or not self._pending(up):
            return None
        op = self._op("maintenance")
        self._maintain(up, "early")
        self.sim.after(up.heal_after, self._finish_op, op)
        return op

    def push_bug(self) -> bool:
        self.pushed = True
        return True

    # -- the supervisor's end ---------------------------------------------------------------

    def give_up(self, reason: str, short: str = "") -> None:
        if self.stopped is None:
            self.stopped, self.stop_reason, self.stop_short = self.now, reason, short or reason
            self._touch()

    def finish(self) -> None:
        """End of the horizon: count the live attempt's steps."""
        a = self.live()
        if a is not None:
            step = a.progress(self.now)[0]
            self.steps_run += step - a.s0
