"""The policy's memory: its phases, the legal moves between them, and what it must remember.

Memory holds only what cannot be observed again (the tick is level-triggered: docs/design.md):
the phase, and one frozen record per concern: the attempt followed (`Attempt`: when it started,
from which checkpoint, disruption evidence seen during it), what recovery has spent (`Budgets`),
maintenance (`Maintenance`), a node under repair (`Repair`), a delete + create in flight
(`Recreate`), what hang detection learned (`HangLearning`), the node's boots (`Boot`), the
evidence against one worker's host (`Host`), Google's own stops of a Compute Engine VM
(`GoogleStop`), the slices a multislice job runs on where they are not tpu.names (`Limp`:
swapped for spares, or left out while it limps), and when the tick last did
what it does on a schedule (`Marks`: the audit log
read, the environment checks run, the stale-checkpoint warning raised), so a cron `check`, a
fresh process each time, keeps their cadence.
Everything else is re-observed every tick. The journal stores it with `to_dict` / `from_dict`,
each field read back by its declared type; memory saved flat (version 1) is read into the
records. Version 2 kept the times of `Marks` and `Recreate.op_started` in the journal's other
tables; the journal fills them in from there when it reads such a memory. This module does no
I/O itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from datetime import datetime
from enum import Enum
from functools import cache
from types import UnionType
from typing import TYPE_CHECKING, Any, TypeVar, get_args, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MEMORY_VERSION = 3
MAX_EVIDENCE = 16  # evidence kept per attempt; the newest of each kind wins


class Phase(str, Enum):
    """Where the job is. Small and named, as h11's connection states are."""

    IDLE = "idle"  # no attempt alive; launch when the node is usable
    RUNNING = "running"  # attempt `attempt` was launched and is followed
    BACKOFF = "backoff"  # a charged end; launch again after `budgets.backoff_until`
    WAITING_NODE = "waiting_node"  # the node is repairing/unhealthy; wait up to repair_timeout
    PAUSED = "paused"  # a person stopped or hid the node; left alone
    HALTED = "halted"  # needs a person now (node missing, not owned, ...); re-checked every tick
    DELETING = "deleting"  # tpuwatch is deleting the node to recreate it
    CREATING = "creating"  # tpuwatch is creating the node
    QUEUED = "queued"  # a create found no capacity/quota; retry at `recreate.retry_at`
    DONE = "done"  # worker 0 exited 0 (terminal)
    FAILED = "failed"  # the job failed; a person must look (terminal)


P = Phase
TERMINAL = frozenset({P.DONE, P.FAILED})
# Phases a node row may send a live job to, whatever it was doing.
_NODE_ROW_PHASES = {P.WAITING_NODE, P.PAUSED, P.HALTED, P.DELETING, P.CREATING, P.FAILED}
# Every legal move. A move not listed is a policy bug and raises (see `move`).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    P.IDLE: frozenset({P.IDLE, P.RUNNING} | _NODE_ROW_PHASES),
    P.BACKOFF: frozenset({P.BACKOFF, P.IDLE, P.RUNNING} | _NODE_ROW_PHASES),
    P.RUNNING: frozenset({P.RUNNING, P.IDLE, P.BACKOFF, P.DONE} | _NODE_ROW_PHASES),
    P.WAITING_NODE: frozenset({P.IDLE} | _NODE_ROW_PHASES),
    P.PAUSED: frozenset({P.IDLE} | _NODE_ROW_PHASES),
    P.HALTED: frozenset({P.IDLE} | _NODE_ROW_PHASES),
    P.DELETING: frozenset({P.DELETING, P.CREATING, P.IDLE, P.FAILED}),
    P.CREATING: frozenset({P.CREATING, P.QUEUED, P.IDLE, P.FAILED}),
    P.QUEUED: frozenset({P.QUEUED, P.CREATING, P.IDLE, P.FAILED}),
    P.DONE: frozenset(),
    P.FAILED: frozenset(),
}
# The exit code a tick reports in each phase: 1 when the job failed or needs a person.
PHASE_EXIT: dict[Phase, int] = {p: (1 if p in (P.FAILED, P.HALTED) else 0) for p in Phase}


class IllegalTransition(RuntimeError):
    """A policy bug: a move the transition table does not allow."""


@dataclass(frozen=True)
class Evidence:
    """One sign that the infrastructure, not the job, ended an attempt."""

    time: datetime
    what: str


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended; the journal's attempts row, and the memory of the last end."""

    attempt: int
    start: datetime
    end: datetime
    node_id: str
    start_step: int | None
    end_step: int | None
    outcome: str  # an Outcome value: success, disruption, fail_fast, failed_start, failure
    charged: bool  # counted against max_restarts
    exit_code: int | None
    reason: str
    streak_added: bool = False  # this end added one to the no-progress streak


@dataclass(frozen=True)
class Attempt:
    """The current (or last) attempt, while it is followed."""

    number: int = 0  # the latest attempt launched; 0 = none yet
    start: datetime | None = None
    node_id: str = ""
    start_step: int | None = None  # checkpoint step it resumed from
    seen: bool = False  # a worker has shown this attempt's files
    launch_tries: int = 0  # launches of this attempt number that left no trace
    evidence: tuple[Evidence, ...] = ()
    unreachable_since: datetime | None = None
    # when a tick first saw the attempt end with nothing yet to explain it; the end is charged
    # only on a later tick, whose node read comes after that sighting (ending.confirm_end)
    end_seen: datetime | None = None


@dataclass(frozen=True)
class Budgets:
    """What recovery has spent, and the last end, whose charge a late sign refunds."""

    restarts: int = 0  # charged restarts used (<= max_restarts)
    disruptions: int = 0
    recreates: int = 0  # delete + create cycles started (<= max_recreates)
    no_progress: int = 0  # charged attempts in a row that added no checkpoint
    backoff_level: int = 0
    backoff_until: datetime | None = None
    last_end: AttemptEnd | None = None
    # the last end was charged on first sight, though no worker exited with a code of its own
    # (the relaunch does not wait): until then, a node read showing a host going away refunds
    # it (ending.END_CONFIRM_WINDOW)
    confirm_by: datetime | None = None


@dataclass(frozen=True)
class Maintenance:
    """Maintenance announced or under way: the hold after a notice, and an early start."""

    # after an attempt ended by a maintenance or preemption notice: no launch on that node until
    # then, or until it has gone down and come back (the notice says it is about to stop)
    notice_hold: datetime | None = None
    # [maintenance] start_early: the announced window being acted on (its start), the newest
    # checkpoint step when it was first seen while running (the next newer one is the moment),
    # and the window whose early start the service refused (noted once; the notice still reaches the job)
    early_window: datetime | None = None
    early_step: int | None = None
    early_refused: datetime | None = None
    # the idle spares whose announced maintenance tpuwatch started early, as "<node>@<window
    # start>": journaled before the call, so each is asked once (a refusal leaves it to its window)
    idle_started: tuple[str, ...] = ()


@dataclass(frozen=True)
class Repair:
    """Since when the node (or its environment) has been failing, waited for up to repair_timeout."""

    unhealthy_since: datetime | None = None
    # when a tick first saw the node in UNKNOWN with no health, the API's state after a failed repair
    unknown_since: datetime | None = None
    # when a tick first saw a MIG's repair only settling (not stable, every VM running, no action)
    settling_since: datetime | None = None
    # environment checks (tpuwatch.workers.precheck) failing before a launch, since when (not charged)
    env_failing_since: datetime | None = None

    def over(self) -> Repair:
        """The node's repair over (healed, or replaced): its times forgotten, the environment's kept."""
        return Repair(env_failing_since=self.env_failing_since)


@dataclass(frozen=True)
class Recreate:
    """A delete + create cycle: the operation in flight, and a create queued for capacity."""

    zone_try: int = 0  # index into PolicyConfig.zones during a create cycle
    pending_op: str | None = None  # the DELETING / CREATING operation's name; None until known
    # when tpuwatch started `pending_op` (set with it; read only with it): its age, for
    # recovery.operation_timeout
    op_started: datetime | None = None
    deleting_node_id: str = ""
    queued_since: datetime | None = None
    queue_tries: int = 0
    retry_at: datetime | None = None


@dataclass(frozen=True)
class HangLearning:
    """What hang detection (recovery.hang_timeout) has seen of the attempt and learned of the job."""

    # the newest checkpoint step seen during the attempt, when a tick first saw it (for stores
    # that give no checkpoint time), and its time
    progress_step: int | None = None
    progress_at: datetime | None = None
    progress_time: datetime | None = None
    # what hang_timeout = "auto" learns of the job (longest seen, in seconds): the interval
    # between two checkpoints of one attempt, and an attempt's start to its first checkpoint
    ckpt_gap: float = 0.0
    ckpt_first: float = 0.0
    # the attempt's output: its workers' total log size, and when a tick last saw it grow
    # (recorded at most every LOG_GRAIN, so the memory does not change on every tick)
    log_bytes: int | None = None
    log_at: datetime | None = None
    # the job's log cadence (policy/cadence.py): when the attempt's log was last written as the
    # workers last said, the longest silence a tick saw since then, and the longest silence the
    # job has shown once past its first checkpoint of an attempt (kept across attempts)
    log_last: datetime | None = None
    log_peak: float = 0.0
    log_gap: float = 0.0


@dataclass(frozen=True)
class Boot:
    """When this policy saw the node boot (a node id other than the one it knew, or usable again
    after it saw it not usable): a login refused soon after a boot is keys not there yet."""

    node_seen: str = ""  # the node id last seen
    node_down: bool = False  # that node was last seen not usable
    booted_at: datetime | None = None


@dataclass(frozen=True)
class Host:
    """Evidence against one worker's host (policy/faulty.py): its attempts that ended with a
    dirty-host signature in a row, the launch-time checks that found its TPU devices missing in a
    row, and the incident already reported or told to a person."""

    worker: int | None = None  # the worker whose attempts ended dirty in a row
    last_attempt: int = 0  # the newest of those attempts
    streak: int = 0
    # launch-time check rounds in a row whose hardware items failed on one worker, on one boot of
    # the node: the incident they point at ("<node id>/w<worker>@<boot>"), its worker, how many
    checks_on: str = ""
    checks_worker: int | None = None
    checks_failed: int = 0
    checked_at: datetime | None = None  # the newest round counted: a round counts once
    # the incident reported (or told, when tpuwatch may not report it): "<node id>/w<worker>@<boot>",
    # so one host on one boot of the node is reported once, however often it fails after
    incident: str = ""
    suspect: int | None = None  # the worker of that incident
    node_id: str = ""  # the node of the host reported (its hold is over once another node is there)
    reported_at: datetime | None = None  # when tpuwatch asked Google to repair it
    # no launch on the node until it has gone down and come back after the report, or until then
    hold_until: datetime | None = None


@dataclass(frozen=True)
class GoogleStop:
    """What the last sighting of a VM made through Compute Engine and the audit log said of
    Google's own stops (policy/google.py): kept because the VM may be gone by the next tick (a
    cron `check` is a fresh process each time)."""

    node_id: str = ""  # the node last seen
    created: datetime | None = None  # its create time: audit entries older than it are another VM's
    owned: bool = False  # it carried the job's ownership label then
    deletes: bool = False  # Google deletes it itself (termination action DELETE: Spot, flex-start, run end)
    deletes_at: datetime | None = None  # when its run ends (the termination action runs then)
    deleted: str = ""  # what says Google deleted it (its audit entry; a sighting of it going is no word)
    missing_since: datetime | None = None  # first seen missing with no such word yet
    going_since: datetime | None = None  # first seen going (DELETING), for the bound on waiting for it
    # its accelerator (machine) type, of one down when last seen: what a job with a priority asks
    # for once it is gone (deleted by Google, or by tpuwatch to be made again)
    shape: str = ""
    # A VM Compute Engine stopped itself (host error, terminate on maintenance): the audit entry
    # that says so, when it was first seen stopped (with or without that word), and when tpuwatch
    # asked to start it again (once per stop)
    stopped: str = ""
    stopped_since: datetime | None = None
    start_asked: datetime | None = None


@dataclass(frozen=True)
class IdleWord:
    """Idle VMs Google may delete itself (a Compute Engine VM's termination action DELETE) as
    last seen (`deletes`), those the audit log said Google preempted (`said`, read while one ran
    or since), and those gone with no such word yet, since when (`vanished`, `since`): one gone is
    made again only once that word comes (policy/google.py `idle_word`)."""

    deletes: tuple[str, ...] = ()
    said: tuple[str, ...] = ()
    vanished: tuple[str, ...] = ()
    since: tuple[datetime, ...] = ()


@dataclass(frozen=True)
class Limp:
    """The slices a multislice job runs on (policy/limp.py, policy/spares.py), where they differ
    from tpu.names: each slot (a name of tpu.names, the job's slice id by its place) swapped for
    a spare (`swapped`, slot -> the node it runs on now), and the slots a job that may limp ([job]
    min_slices) is left without (`out`), both journaled before anything is launched on them.
    Once a slot left out is back: since when, and the newest checkpoint step then (the job grows
    back at the first complete checkpoint newer than it)."""

    out: tuple[str, ...] = ()
    since: datetime | None = None
    back_since: datetime | None = None
    back_step: int | None = None
    # dead slices taken back for the rows to recreate the job's queued resource: not limped
    # around again until it is made (the job's node usable)
    recreate: tuple[str, ...] = ()
    swapped: tuple[tuple[str, str], ...] = ()
    # idle spares tpuwatch deleted to make again (policy/spares.py `remake`): only these are ever
    # created; the next create no sooner than `remake_at` (`remake_tries` so far)
    remaking: tuple[str, ...] = ()
    remake_tries: int = 0
    remake_at: datetime | None = None
    # spares whose launch-time checks failed ("<node>@<node id>"): not used again on that node
    bad: tuple[str, ...] = ()
    # nodes swapped out of a slot while lost, and since when: once each can stand in again, the
    # wait the swap spared the job is journaled (`tpuwatch report`)
    away: tuple[str, ...] = ()
    away_since: tuple[datetime, ...] = ()
    # idle nodes of the pool under repair (or in a state this version does not know), since when
    # first seen so: past recovery.repair_timeout, one is made again as a dead one is
    down: tuple[str, ...] = ()
    down_since: tuple[datetime, ...] = ()
    # idle nodes of the pool Google may delete itself (a Compute Engine VM's termination action
    # DELETE), owned and made alone, as last seen; those the audit log said Google preempted; and
    # those gone with no such word yet, since when: made again only once that word comes
    deletes: tuple[str, ...] = ()
    said: tuple[str, ...] = ()
    vanished: tuple[str, ...] = ()
    vanished_since: tuple[datetime, ...] = ()
    # [job] priority (policy/priority.py): slots whose node was lent to a job of higher priority
    # (slot -> that job; the slot is bound to no node, "" in `swapped`, until one is free), nodes
    # taken from a job of lower priority (node -> that job, until it is given one back), label
    # writes that hand a node to another job (node -> that job, until its label says so: one it
    # lends, one it hands back), and the node asked for and when
    lent: tuple[tuple[str, str], ...] = ()
    took: tuple[tuple[str, str], ...] = ()
    giving: tuple[tuple[str, str], ...] = ()
    handing: tuple[tuple[str, str], ...] = ()
    wants: str = ""
    wants_at: datetime | None = None
    # the keeper of a spare pool (policy/pool.py `keep`): its dead idle spares it deleted to make
    # again (only these are ever created), the next create no sooner than `pool_remake_at`
    pool_remaking: tuple[str, ...] = ()
    pool_remake_at: datetime | None = None
    # and the pool's idle VMs Google may delete itself, as the keeper watches them
    pool_word: IdleWord = IdleWord()
    # nodes the job moved off while an attempt of it may still run there, until the tick has
    # stopped it there (policy/owed.py): journaled with the move, so a watcher killed before
    # that stop stops it there before anything else
    unstopped: tuple[str, ...] = ()

    @property
    def word(self) -> IdleWord:
        """What the job's own idle nodes Google may delete itself have shown (`deletes`, `said`,
        `vanished`, `vanished_since`)."""
        return IdleWord(self.deletes, self.said, self.vanished, self.vanished_since)

    def with_word(self, word: IdleWord) -> Limp:
        """This record with `word` as what the job's own idle nodes Google may delete have shown."""
        return replace(self, deletes=word.deletes, said=word.said, vanished=word.vanished, vanished_since=word.since)

    def node_of(self, slot: str) -> str:
        """The node slot `slot` runs on: its spare when swapped, else the slot's own node."""
        return dict(self.swapped).get(slot, slot)

    def slots(self, slices: Sequence[str]) -> tuple[str, ...]:
        """Of the job's `slices` (tpu.names), the slots its attempts run on now, in slice order."""
        return tuple(s for s in slices if s not in self.out)

    def kept(self, slices: Sequence[str]) -> tuple[str, ...]:
        """The nodes the job's attempts run on now, in slice order."""
        return tuple(self.node_of(s) for s in self.slots(slices))

    def idle(self, slices: Sequence[str], spares: Sequence[str]) -> tuple[str, ...]:
        """The nodes of the job's pool (its slices and spares) that no slot holds: its spares."""
        held = {self.node_of(s) for s in slices}
        return tuple(n for n in dict.fromkeys((*slices, *spares)) if n not in held)


@dataclass(frozen=True)
class Marks:
    """When the tick last did what it does on a schedule, and since when a warning stands: times
    later decisions read (policy/observe.py, policy/alerts.py) and no later tick can observe."""

    audit_read_at: datetime | None = None  # the audit log last read (observe.audit_due)
    precheck_at: datetime | None = None  # the environment checks last ran (observe.precheck_due)
    # since when the running attempt has shown no new checkpoint for job.checkpoint_warn_age
    # (alerts.checkpoint_stale): the warning is journaled (and alerted) once per such stretch
    checkpoint_warned: datetime | None = None


@dataclass(frozen=True)
class Memory:
    """What the policy remembers between ticks. `Memory.initial(zone)` starts a job."""

    phase: Phase = P.IDLE
    reason: str = ""  # why the job is FAILED / HALTED / PAUSED
    zone: str = ""  # where the node lives (or is being created)
    attempt: Attempt = Attempt()
    budgets: Budgets = Budgets()
    maintenance: Maintenance = Maintenance()
    repair: Repair = Repair()
    recreate: Recreate = Recreate()
    hang: HangLearning = HangLearning()
    boot: Boot = Boot()
    host: Host = Host()
    google: GoogleStop = GoogleStop()
    marks: Marks = Marks()
    limp: Limp = Limp()

    @classmethod
    def initial(cls, zone: str) -> Memory:
        return cls(zone=zone)

    @property
    def pending_kind(self) -> str:
        """The kind of cloud operation in flight: "delete", "create", or ""."""
        return {P.DELETING: "delete", P.CREATING: "create"}.get(self.phase, "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, one object per record; `from_dict(to_dict(m)) == m`."""
        return {"version": MEMORY_VERSION, **_dump(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        """Rebuild memory saved by `to_dict`, or by a tpuwatch that kept it flat (version 1) or
        kept some times elsewhere (version 2: those are left unset, for the journal to fill in);
        ValueError naming the field when it is not."""
        if not isinstance(data, dict):
            raise ValueError("memory: expected a JSON object")
        version = data.get("version")
        if version not in (1, 2, MEMORY_VERSION):
            raise ValueError(f"memory: version {version!r}, this tpuwatch reads version {MEMORY_VERSION}")
        body = {k: v for k, v in data.items() if k != "version"}
        return _load(cls, _nest(body) if version == 1 else body)


def move(mem: Memory, phase: Phase, **changes: Any) -> Memory:
    """`mem` in `phase` with `changes`; IllegalTransition when the table forbids the move."""
    if phase not in TRANSITIONS[mem.phase]:
        raise IllegalTransition(f"policy bug: no transition {mem.phase.value} -> {phase.value}")
    return replace(mem, phase=phase, **changes)


def merge_evidence(old: tuple[Evidence, ...], new: list[Evidence]) -> tuple[Evidence, ...]:
    """Old and new evidence, one entry per kind of sign (the latest time), newest last."""
    latest: dict[str, datetime] = {}
    for ev in (*old, *new):
        if ev.what not in latest or ev.time > latest[ev.what]:
            latest[ev.what] = ev.time
    ordered = sorted((Evidence(t, w) for w, t in latest.items()), key=lambda e: (e.time, e.what))
    return tuple(ordered[-MAX_EVIDENCE:])


# ---------------------------------------------------------------------------------------------
# serialisation: datetimes as ISO 8601 text, records as objects (evidence as [time, what]), each
# field read by its declared type


def _dump(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Phase):
        return value.value
    if isinstance(value, Evidence):
        return [value.time.isoformat(), value.what]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _dump(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value


def _time(v: Any) -> datetime:
    if not isinstance(v, str):
        raise TypeError(f"expected an ISO time, got {v!r}")
    t = datetime.fromisoformat(v)
    if t.tzinfo is None:
        raise ValueError(f"time {v!r} has no time zone")
    return t


def _opt_time(v: Any) -> datetime | None:
    return None if v is None else _time(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"expected a whole number >= 0, got {v!r}")
    return v


def _opt_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected a whole number, got {v!r}")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise TypeError(f"expected seconds >= 0, got {v!r}")
    return float(v)


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, got {v!r}")
    return v


def _opt_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected true/false, got {v!r}")
    return v


def _evidence(v: Any) -> tuple[Evidence, ...]:
    if not isinstance(v, list):
        raise TypeError(f"expected a list, got {v!r}")
    return tuple(Evidence(_time(t), _text(w)) for t, w in v)


# How a saved value of each declared field type is read (whole numbers are counts, >= 0; an
# optional one may be any whole number, as a checkpoint step). A record (or an optional one) is
# read field by field.
def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of names, got {value!r}")
    return tuple(value)


def _times(value: Any) -> tuple[datetime, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of times, got {value!r}")
    return tuple(_time(v) for v in value)


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)
                                              for v in value):
        raise ValueError(f"expected a list of [name, name] pairs, got {value!r}")
    return tuple((a, b) for a, b in value)


_READ: dict[object, Callable[[Any], Any]] = {
    Phase: Phase,
    str: _text,
    str | None: _opt_text,
    int: _int,
    int | None: _opt_int,
    float: _seconds,
    bool: _flag,
    datetime: _time,
    datetime | None: _opt_time,
    tuple[Evidence, ...]: _evidence,
    tuple[str, ...]: _names,
    tuple[tuple[str, str], ...]: _pairs,
    tuple[datetime, ...]: _times,
}

R = TypeVar("R", bound="DataclassInstance")


def _record_type(kind: object) -> type[DataclassInstance] | None:
    """The record type `kind` declares, alone or optional; None for any other type."""
    options = [t for t in get_args(kind) if t is not type(None)] if isinstance(kind, UnionType) else [kind]
    if len(options) == 1 and isinstance(options[0], type) and is_dataclass(options[0]):
        return options[0]
    return None


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


@dataclass(frozen=True)
class _Field:
    """How one field of a record is read back: as a record of its own (`record`, `optional`
    when it may be None), or by `read`; `required` when it has no default."""

    name: str
    required: bool
    record: type[DataclassInstance] | None
    optional: bool
    read: Callable[[Any], Any] | None


@cache
def _plan(cls: type) -> tuple[_Field, ...]:
    """The fields of record `cls` and how each is read, worked out once per class: a tick reads
    the memory back at least once, and the type lookups cost more than the reading."""
    types = _hints(cls)
    out = []
    for f in fields(cls):
        kind = types[f.name]
        record = _record_type(kind)
        out.append(_Field(f.name, f.default is MISSING and f.default_factory is MISSING, record,
                          record is not None and kind is not record, None if record is not None else _READ[kind]))
    return tuple(out)


def _load(cls: type[R], data: Any, path: str = "") -> R:
    """A record of type `cls` from its saved object (at `path` in the memory): each field read
    by its declared type, a missing one left at its default (one without a default is required).
    ValueError naming the field when a value does not fit."""
    if not isinstance(data, dict):
        raise ValueError(f"memory: field {path.rstrip('.')!r}: expected an object, got {data!r}")
    unknown = data.keys() - _names_of(cls)
    if unknown:
        raise ValueError(f"memory: unknown field {path + min(unknown)!r}")
    values: dict[str, Any] = {}
    for f in _plan(cls):
        if f.name not in data:
            if f.required:
                raise ValueError(f"memory: field {path + f.name!r} is missing")
            continue
        value = data[f.name]
        if f.record is not None:  # a record, or an optional one
            values[f.name] = None if value is None and f.optional else _load(f.record, value, f"{path}{f.name}.")
            continue
        assert f.read is not None
        try:
            values[f.name] = f.read(value)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"memory: field {path + f.name!r}: {exc}") from None
    return cls(**values)


@cache
def _names_of(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


# Version 1 kept every field of memory at the top level. Each now sits in one record under the
# same name, except the attempt's, which the record names without their prefix.
_V1_ATTEMPT = {"attempt": "number", "attempt_start": "start", "attempt_node_id": "node_id",
               "attempt_start_step": "start_step", "attempt_seen": "seen"}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """A version 1 (flat) memory object in the nested layout."""
    types = _hints(Memory)
    records = {f.name: types[f.name] for f in fields(Memory) if is_dataclass(types[f.name])}
    home = {g.name: record for record, kind in records.items() for g in fields(kind)
            if g.name not in _V1_ATTEMPT.values()}
    home.update(dict.fromkeys(_V1_ATTEMPT, "attempt"))
    out: dict[str, Any] = {}
    for name, value in flat.items():
        record = home.get(name)
        if record is None:
            out[name] = value  # a field of Memory itself, or unknown (refused by _load)
        else:
            out.setdefault(record, {})[_V1_ATTEMPT.get(name, name) if record == "attempt" else name] = value
    return out
