"""What the tick must observe before it decides, and what the loop watches between ticks.

The policy decides with what it is shown; these say what is worth the cost of showing it.
Pure functions of the memory and this tick's cheap observations: no I/O, no clock of their own.

What more a decision asks for in the same tick, and the bound on it, is `settle.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Literal

from tpuwatch.model import NodeSnapshot, WorkerProbe
from tpuwatch.policy.google import STOP_STATES, stop_word_due
from tpuwatch.policy.state import TERMINAL, Marks, Memory, Phase
from tpuwatch.policy.values import Observation

# The audit log is read at least this often (seconds), whatever the job looks like: evidence of
# a maintenance or a preemption ahead is in it, and a minute is soon enough for that.
AUDIT_INTERVAL = 60.0
# The audit log is read at most this often while something looks wrong: 30 reads a minute at
# most, half the Logging API's default read quota per project.
MIN_AUDIT_GAP = 2.0


def probes_due(mem: Memory, recreate_asked: bool) -> bool:
    """Whether the workers are worth probing this tick: not while tpuwatch deletes or creates
    the node (no attempt of the job runs, and those phases' rows do not read the workers), nor
    for a person's recreate when no attempt runs (nothing to stop before the delete)."""
    if mem.phase in (Phase.DELETING, Phase.CREATING, Phase.QUEUED):
        return False
    return not (recreate_asked and mem.phase is not Phase.RUNNING)


def launch_likely(mem: Memory, node: NodeSnapshot | None, now: datetime) -> bool:
    """No attempt is alive and the node is usable: the launch-time checks should ride in the probe's
    connection, so a relaunch costs two SSH rounds (probe + checks, then launch), not four."""
    if node is None or not node.usable:
        return False
    return mem.phase in (Phase.IDLE, Phase.WAITING_NODE) or (
        mem.phase is Phase.BACKOFF and (mem.budgets.backoff_until is None or mem.budgets.backoff_until <= now))


def _since(then: datetime | None, now: datetime) -> float | None:
    return None if then is None else (now - then).total_seconds()


def precheck_due(mem: Memory, node: NodeSnapshot | None, probes: Sequence[WorkerProbe] | None,
                 now: datetime, interval: float) -> bool:
    """The periodic environment checks while the attempt runs: every `interval` seconds since
    they last ran (`Memory.marks.precheck_at`)."""
    if mem.phase is not Phase.RUNNING or node is None or not node.usable or not probes:
        return False
    if not any(p.state == "running" for p in probes):
        return False
    since_last = _since(mem.marks.precheck_at, now)
    return since_last is None or since_last >= interval


def audit_due(mem: Memory, node: NodeSnapshot | None, probes: Sequence[WorkerProbe] | None,
              now: datetime) -> bool:
    """Read the audit log now: once per AUDIT_INTERVAL since it was last read
    (`Memory.marks.audit_read_at`), or sooner when something looks wrong.

    Sooner while an attempt runs and a worker is not running on a node that looks fine: that is
    when a terminate/restart entry decides whether the end is charged; and while a VM that Google
    deletes itself is missing: a preemption entry decides whether it is made again. A node that
    is down, being repaired or recreated is evidence enough by its state; the log can wait.
    """
    if mem.phase in TERMINAL:  # an ended job's memory stays as it ended: no evidence can change it
        return False
    since_last = _since(mem.marks.audit_read_at, now)
    if since_last is None or since_last >= AUDIT_INTERVAL:
        return True
    wrong = mem.phase is Phase.RUNNING and (
        node is None or (node.usable and any(p.state != "running" for p in probes or ())))
    # A missing VM that Google deletes itself: the log says whether it did (policy/google.py)
    gone = node is None and mem.google.deletes and mem.phase not in (Phase.DELETING, Phase.CREATING, Phase.QUEUED)
    # an idle node of the job's pool or of its spare pool Google may delete, gone: the log says
    # whether it did (policy/spares.py, policy/pool.py)
    gone = gone or bool(mem.limp.vanished) or bool(mem.limp.pool_word.vanished)
    # A stopped VM, for a while: the log says whether Compute Engine stopped it (a repair) or a person
    stopped = (node is not None and node.state in STOP_STATES
               and mem.phase not in (Phase.DELETING, Phase.CREATING, Phase.QUEUED) and stop_word_due(mem, now))
    return (wrong or gone or stopped) and since_last >= MIN_AUDIT_GAP


def stamped(mem: Memory, obs: Observation, now: datetime, stale: bool) -> Memory:
    """`mem` with this tick's marks, journaled with its decision: the audit log read now
    (`obs.audit_read`), the environment checks whose report it decides with, and since when the
    stale-checkpoint warning stands (`stale`: alerts.checkpoint_stale warns now)."""
    marks = mem.marks
    checked = marks.precheck_at
    if obs.precheck is not None and (checked is None or obs.precheck.time > checked):
        checked = obs.precheck.time
    new = Marks(audit_read_at=now if obs.audit_read else marks.audit_read_at, precheck_at=checked,
                checkpoint_warned=(marks.checkpoint_warned or now) if stale else None)
    return mem if new == marks else replace(mem, marks=new)


def operation_due(mem: Memory) -> Literal["delete", "create"] | None:
    """Which operation to read now: tpuwatch's delete or create in flight (its failure, for a
    create, is classified for the policy), else None."""
    if not mem.recreate.pending_op or mem.phase not in (Phase.DELETING, Phase.CREATING):
        return None
    return "create" if mem.phase is Phase.CREATING else "delete"


def queued_due(mem: Memory, node: NodeSnapshot | None) -> bool:
    """Read the node's queued resource (a job that has one): only while it can change the
    decision, i.e. the node is missing or being deleted, a slice is missing, being created or
    restarting (Google's multislice autorepair), or tpuwatch follows a delete or create."""
    return (node is None or node.state in ("DELETING", "MISSING")
            or any(s.state in ("CREATING", "RESTARTING") for s in node.slices)  # a multislice autorepair
            or mem.phase in (Phase.DELETING, Phase.CREATING))


def probe_port_due(mem: Memory, node: NodeSnapshot | None) -> bool:
    """Between ticks, TCP-probe worker 0's SSH port: while the job waits for a down node that
    has workers, so the moment it answers the next tick looks (no API quota spent)."""
    return (node is not None and not node.usable and bool(node.workers)
            and mem.phase is Phase.WAITING_NODE)


def follow_workers(mem: Memory, node: NodeSnapshot | None, probes: Sequence[WorkerProbe] | None) -> tuple[int, ...]:
    """The workers whose end of the running attempt should wake the watcher between ticks.

    Only while the attempt runs on a usable node: every probed worker still running it, or probed
    before this tick launched it. A worker whose end the probe already saw is not followed (its
    end must not be reported again), but the others are: a worker other than the primary may end
    first (exit 0) while the job runs on, and the primary's end must still wake the watcher.
    Anything else already has the watcher's attention (it ticks sooner, or waits for a node).
    """
    if mem.phase is not Phase.RUNNING or node is None or not node.usable or not probes:
        return ()
    if any(p.state == "unreachable" or (p.attempt is not None and p.attempt > mem.attempt.number) for p in probes):
        return ()
    return tuple(p.worker for p in probes if not (p.attempt == mem.attempt.number and p.state != "running"))
