"""A bad host: the same worker's attempts keep ending with a dirty-host signature (its TPU cannot
be opened, though every stop cleaned it up), or the launch-time environment checks keep finding
its TPU devices missing, so the evidence points at that worker's host.

Rows `faulty_host` (report it: recovery.report_faulty_hosts), `faulty_host_told` (say what a
person should do), `faulty_host_hold` (no launch there until the reported host has gone down and
come back) and `faulty_host_refused`. One host on one boot of the node is one incident: it is
reported, or told, once (`Host.incident`), however often it fails after.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuwatch.durations import human
from tpuwatch.model import CheckItem, PrecheckReport
from tpuwatch.policy.draft import Draft, secs
from tpuwatch.policy.nodes import boot_time
from tpuwatch.policy.state import Memory
from tpuwatch.policy.values import Action, Decision, ReportHost, Wait

# Attempts in a row that end with a dirty-host signature on the same worker before its host is
# called bad: the first is cleaned up and relaunched uncharged, the second is charged (the cleanup
# did not help), the third points at the host. A report stops the VM for days, so not sooner.
# Launch-time check rounds (one a tick) that find the same worker's TPU devices missing count
# the same: a healthy host has them from its boot, before SSH lets tpuwatch in, so three looks a
# poll apart on one boot are not a driver still loading.
HOST_STREAK = 3
# The environment checks that measure the host's hardware: a failure there points at the host.
# The others (disk, shm, cache, ulimit, dns, device holders, the libtpu lockfile, the
# interpreter, custom checks) are the VM's software or configuration, which a new host does not fix.
HOST_CHECKS = frozenset({"devices"})
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
    h = mem.host
    if h.worker != worker or h.streak < HOST_STREAK:
        return None
    why = f"worker {worker}'s TPU could not be opened in {h.streak} attempts in a row, each after a cleanup ({what})"
    return faulty(draft, mem, worker, why)


def points_at_host(item: CheckItem) -> bool:
    """A failing measurement of the host's hardware. A check the worker did not answer fails
    with no value measured: that is the SSH session's or the script's failure, not the host's."""
    return item.check in HOST_CHECKS and item.verdict == "fail" and bool(item.value)


def count_checks(draft: Draft, mem: Memory, report: PrecheckReport) -> Memory:
    """Memory after a round of launch-time checks (each round counted once): one more in the
    streak when a hardware item fails again on the streak's worker on the same boot of the node,
    else the first on the lowest worker whose hardware item fails; no streak when none does, nor
    when every worker of a slice of several misses its devices (that is the image or its driver,
    not one host)."""
    h = mem.host
    if draft.obs.node is None or h.checked_at == report.time:
        return mem
    bad = sorted({i.worker for i in report.failing if points_at_host(i)})
    everyone = {i.worker for i in report.items}
    if len(everyone) > 1 and set(bad) == everyone:
        bad = []
    w = h.checks_worker
    if w is not None and w in bad and h.checks_on == incident(draft, mem, w):
        return replace(mem, host=replace(h, checks_failed=h.checks_failed + 1, checked_at=report.time))
    if not bad:  # the streak, if any, is over (a memory with none is left as it is)
        return mem if h.checks_worker is None else replace(
            mem, host=replace(h, checks_on="", checks_worker=None, checks_failed=0, checked_at=report.time))
    return replace(mem, host=replace(h, checks_on=incident(draft, mem, bad[0]), checks_worker=bad[0],
                                     checks_failed=1, checked_at=report.time))


def checks_bad_host(draft: Draft, mem: Memory,
                    report: PrecheckReport) -> tuple[Memory, str, tuple[Action, ...], str] | None:
    """After the round was counted (`count_checks`): when the checks' streak points at the host of
    one worker and this incident was not reported yet, (memory, row, actions, line) for it."""
    h = mem.host
    worker = h.checks_worker
    if worker is None or h.checks_failed < HOST_STREAK:
        return None
    seen = next((i.line() for i in report.failing if i.worker == worker and points_at_host(i)), "")
    why = (f"worker {worker}'s TPU devices were missing in {h.checks_failed} environment checks in a row on this "
           f"boot of the node ({seen})")
    return faulty(draft, mem, worker, why)


def faulty(draft: Draft, mem: Memory, worker: int, why: str) -> tuple[Memory, str, tuple[Action, ...], str] | None:
    """The evidence `why` points at the host of `worker`: unless this incident was reported or
    told already, report it (row `faulty_host`: recovery.report_faulty_hosts, node owned) or
    say what a person should do (`faulty_host_told`); (memory, row, actions, line)."""
    h, node, cfg = mem.host, draft.obs.node, draft.cfg
    if node is None:
        return None
    key = incident(draft, mem, worker)
    if h.incident == key:
        return None
    owned = draft.obs.adopt or node.owned_by(cfg.job)
    if cfg.report_faulty_hosts and owned:
        until = draft.now + timedelta(seconds=REPORT_HOLD)
        mem = replace(mem, host=replace(h, incident=key, suspect=worker, node_id=node.id, reported_at=draft.now,
                                        hold_until=until))
        line = (f"the host of worker {worker} looks faulty: {why}; reporting it for repair (recovery.report_faulty_hosts); "
                f"no launch on node {node.name} until it has gone down and come back, or {human(REPORT_HOLD)}")
        return mem, "faulty_host", (ReportHost(worker, f"tpuwatch job {cfg.job}: {why}"[:500],
                                               f"the host of worker {worker} looks faulty: {why}"),), line
    mem = replace(mem, host=replace(h, incident=key, suspect=worker))
    unsaid = ("not reported: the node lacks the job's ownership label" if cfg.report_faulty_hosts
              else "not reported (recovery.report_faulty_hosts is off)")
    return mem, "faulty_host_told", (), f"the host of worker {worker} looks faulty: {why}; {unsaid}; {ADVICE}"


def report_hold(draft: Draft, mem: Memory) -> Decision | None:
    """No live attempt: the host tpuwatch reported has not gone down yet (row `faulty_host_hold`)."""
    h, node, now = mem.host, draft.obs.node, draft.now
    if node is None or h.hold_until is None or now >= h.hold_until or h.reported_at is None:
        return None
    if h.node_id != node.id or (mem.boot.booted_at is not None and mem.boot.booted_at > h.reported_at):
        return None
    return draft.out(mem, "faulty_host_hold", f"reported the host of worker {h.suspect} as faulty: node {node.name} "
                                              "is about to stop for its repair; not launching there until it has "
                                              f"gone down and come back, or {human(secs(h.hold_until - now))}",
                     Wait(h.hold_until, "the reported host to go down for repair"))


def report_refused(draft: Draft, mem: Memory) -> Decision:
    """The cloud refused the report: noted once for this incident (it stays recorded), the hold
    is lifted, and a person is told what to do."""
    h = mem.host
    mem = replace(mem, host=replace(h, hold_until=None, reported_at=None))
    return draft.out(mem, "faulty_host_refused",
                     f"the report of worker {h.suspect}'s host was refused ({draft.obs.host_report_refused}); {ADVICE}",
                     Wait(None, "relaunch after the refused host report"))

