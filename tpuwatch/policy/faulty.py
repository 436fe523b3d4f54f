"""A bad host: the same worker's attempts keep ending with a dirty-host signature (its TPU cannot
be opened, though every stop cleaned it up), so the evidence points at that worker's host.

Rows `faulty_host` (report it: recovery.report_faulty_hosts), `faulty_host_told` (say what a
person should do), `faulty_host_hold` (no launch there until the reported host has gone down and
come back) and `faulty_host_refused`. One host on one boot of the node is one incident: it is
reported, or told, once (`Host.incident`), however often it fails after.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuwatch.durations import human
from tpuwatch.policy.draft import Draft, secs
from tpuwatch.policy.nodes import boot_time
from tpuwatch.policy.state import Memory
from tpuwatch.policy.values import Action, Decision, ReportHost, Wait

# Attempts in a row that end with a dirty-host signature on the same worker before its host is
# called bad: the first is cleaned up and relaunched uncharged, the second is charged (the cleanup
# did not help), the third points at the host. A report stops the VM for days, so not sooner.
HOST_STREAK = 3
# After a report, no launch on the node until it has gone down and come back, or this long:
# Google's report operation takes 10 to 12 minutes and the repair begins within a minute of it.
REPORT_HOLD = 20 * 60.0
# What a person can do about a host tpuwatch does not report.
ADVICE = ("a person should move the job off that host: delete and create the VM again (new hardware), or, for a "
          "Compute Engine TPU VM in All Capacity mode, report it (`gcloud compute instances report-host-as-faulty "
          "INSTANCE --fault-reasons=behavior=BEHAVIOR_UNSPECIFIED --disruption-schedule=IMMEDIATE`, or "
          "[recovery] report_faulty_hosts = true); else open a support case naming the VM")


def count_dirty(mem: Memory, worker: int, attempt: int) -> Memory:
    """Memory after attempt `attempt` ended dirty on `worker`: one more in the streak when the
    attempt before ended so on the same worker, else the first."""
    h = mem.host
    streak = h.streak + 1 if h.worker == worker and h.last_attempt == attempt - 1 else 1
    return replace(mem, host=replace(h, worker=worker, last_attempt=attempt, streak=streak))


def incident(draft: Draft, mem: Memory, worker: int) -> str:
    node = draft.obs.node
    assert node is not None
    boot = boot_time(node, mem)
    return f"{node.id}/w{worker}@{boot.isoformat() if boot is not None else ''}"


def bad_host(draft: Draft, mem: Memory, worker: int, what: str) -> tuple[Memory, str, tuple[Action, ...], str] | None:
    """After the attempt's end was counted (`count_dirty`): when the streak points at the host of
    `worker` and this incident was not reported yet, (memory, row, actions, line) for it."""
    h, node, cfg = mem.host, draft.obs.node, draft.cfg
    if node is None or h.worker != worker or h.streak < HOST_STREAK:
        return None
    key = incident(draft, mem, worker)
    if h.incident == key:
        return None
    why = f"worker {worker}'s TPU could not be opened in {h.streak} attempts in a row, each after a cleanup ({what})"
    owned = draft.obs.adopt or node.owned_by(cfg.job)
    if cfg.report_faulty_hosts and owned:
        until = draft.now + timedelta(seconds=REPORT_HOLD)
        mem = replace(mem, host=replace(h, incident=key, reported_at=draft.now, hold_until=until))
        line = (f"the host of worker {worker} looks faulty: {why}; reporting it for repair (recovery.report_faulty_hosts); "
                f"no launch on node {node.name} until it has gone down and come back, or {human(REPORT_HOLD)}")
        return mem, "faulty_host", (ReportHost(worker, f"tpuwatch job {cfg.job}: {why}"[:500],
                                               f"the host of worker {worker} looks faulty: {why}"),), line
    mem = replace(mem, host=replace(h, incident=key))
    unsaid = ("not reported: the node lacks the job's ownership label" if cfg.report_faulty_hosts
              else "not reported (recovery.report_faulty_hosts is off)")
    return mem, "faulty_host_told", (), f"the host of worker {worker} looks faulty: {why}; {unsaid}; {ADVICE}"


def report_hold(draft: Draft, mem: Memory) -> Decision | None:
    """No live attempt: the host tpuwatch reported has not gone down yet (row `faulty_host_hold`)."""
    h, node, now = mem.host, draft.obs.node, draft.now
    last = mem.budgets.last_end
    if node is None or h.hold_until is None or now >= h.hold_until or h.reported_at is None or last is None:
        return None
    if last.node_id != node.id or (mem.boot.booted_at is not None and mem.boot.booted_at > h.reported_at):
        return None
    return draft.out(mem, "faulty_host_hold", f"reported the host of worker {h.worker} as faulty: node {node.name} "
                                              "is about to stop for its repair; not launching there until it has "
                                              f"gone down and come back, or {human(secs(h.hold_until - now))}",
                     Wait(h.hold_until, "the reported host to go down for repair"))


def report_refused(draft: Draft, mem: Memory) -> Decision:
    """The cloud refused the report: noted once for this incident (it stays recorded), the hold
    is lifted, and a person is told what to do."""
    h = mem.host
    mem = replace(mem, host=replace(h, hold_until=None, reported_at=None))
    return draft.out(mem, "faulty_host_refused",
                     f"the report of worker {h.worker}'s host was refused ({draft.obs.host_report_refused}); {ADVICE}",
                     Wait(None, "relaunch after the refused host report"))

