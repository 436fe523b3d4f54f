"""What tpuwatch does about announced maintenance, said once for `status`, the dashboard and `events`.

Pure: the node's upcoming-maintenance notice (v2alpha1 `upcomingMaintenance`) and whether
tpuwatch watches the node in, one line for people out. The acts themselves are elsewhere:
policy/early.py starts a reschedulable maintenance after the next checkpoint (start_early), and
the relay beside each attempt (tpuwatch/workers/remote.sh) passes the metadata server's
last-minute notice to the job otherwise.
"""

from __future__ import annotations

from tpuwatch.durations import human
from tpuwatch.model import UpcomingMaintenance


def can_start_early(um: UpcomingMaintenance) -> bool:
    """The service lets the maintenance start before its window (`canReschedule`, still PENDING)."""
    return um.can_reschedule and um.status == "PENDING"


def maintenance_plan(um: UpcomingMaintenance, *, watched: bool, start_early: bool = True,
                     next_checkpoint_in: float | None = None) -> str:
    """What tpuwatch will do about this maintenance, in one line. `start_early` is the job's
    [maintenance] start_early (on unless known otherwise); `next_checkpoint_in`, seconds to the
    job's next checkpoint when its interval is known."""
    if not watched:
        return "nothing: the node has no tpuwatch-job label, so no tpuwatch watches it"
    if um.status == "ONGOING":
        return "waits for the node (recovery.repair_timeout), resumes the job from its checkpoint; not charged"
    if start_early and can_start_early(um):
        soon = f" (~{human(next_checkpoint_in)})" if next_checkpoint_in is not None else ""
        return f"starts it after the job's next checkpoint{soon}, then resumes the job from there; not charged"
    return "signals the job on the ~60 s notice (maintenance.notify_signal), resumes it after; not charged"
