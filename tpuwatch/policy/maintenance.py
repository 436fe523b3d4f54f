"""What tpuwatch does about announced maintenance, said once for `status`, the dashboard and `events`.

Pure: the node's upcoming-maintenance notice (v2alpha1 `upcomingMaintenance`) and whether
tpuwatch watches the node in, one line for people out. The acts themselves are elsewhere: the
relay beside each attempt (tpuwatch/workers/remote.sh) passes the metadata server's last-minute
notice to the job, and policy/table.py classifies the end and waits for the node.
"""

from __future__ import annotations

from tpuwatch.model import UpcomingMaintenance


def can_start_early(um: UpcomingMaintenance) -> bool:
    """The service lets the maintenance start before its window (`canReschedule`, still PENDING)."""
    return um.can_reschedule and um.status == "PENDING"


def maintenance_plan(um: UpcomingMaintenance, *, watched: bool) -> str:
    """What tpuwatch will do about this maintenance, in one line."""
    if not watched:
        return "nothing: the node has no tpuwatch-job label, so no tpuwatch watches it"
    if um.status == "ONGOING":
        return "waits for the node (recovery.repair_timeout), resumes the job from its checkpoint; not charged"
    return "signals the job on the ~60 s notice (maintenance.notify_signal), resumes it after; not charged"
