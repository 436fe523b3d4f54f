"""A node that cannot carry the job: wait for its repair, recreate it, or leave it to a person.

Handlers for the node conditions other than usable (policy/nodes.py): `repairing`, `dead`
(`stopping` while a Spot VM still stops), `person`, `missing`, `someone_deleting`; `recreate` starts a delete + create (owned nodes only,
within max_recreates).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuwatch.durations import human
from tpuwatch.model import OWNER_LABEL
from tpuwatch.policy import google
from tpuwatch.policy.budgets import RECREATES
from tpuwatch.policy.draft import Draft, secs
from tpuwatch.policy.ending import end_unusable
from tpuwatch.policy.nodes import (
    DEAD_STATES,
    FAILED_REPAIR_GRACE,
    STOPPING_LONG,
    STOPPING_LONG_WAIT,
    Cond,
    failed_repair,
    node_condition,
    still_stopping,
)
from tpuwatch.policy.operations import create, queued_ended
from tpuwatch.policy.state import Evidence, Memory, Phase, merge_evidence, move
from tpuwatch.policy.values import Decision, DeleteNode, StartNode, Wait


def repairing(draft: Draft, mem: Memory) -> Decision:
    """REPAIR (service is working on it) or UNRECOGNIZED (a state this version does not know).

    A node in UNKNOWN with no health is past a failed repair: recreated FAILED_REPAIR_GRACE
    after its first sight (row `failed_repair`) rather than after repair_timeout."""
    node, cfg, now = draft.obs.node, draft.cfg, draft.now
    assert node is not None
    known = node_condition(node) is Cond.REPAIR
    what = node.state if node.state != "READY" else f"READY but {node.health}"
    if node.state in DEAD_STATES:  # waited for only because its MIG repairs it (nodes.node_condition)
        what = f"{node.state} (its MIG repairs it by itself)"
    since = mem.repair.unhealthy_since or now
    unknown = (mem.repair.unknown_since or now) if failed_repair(node) else None
    if mem.phase is Phase.RUNNING:
        probes = draft.obs.probes
        # A slice that is gone takes its workers out of the probes: the others' processes may
        # still run, but they wait in their collectives on hosts that are no more.
        gone = any(part.state == "MISSING" for part in node.slices)
        if probes and not gone and all(p.state == "running" and p.attempt == mem.attempt.number for p in probes):
            seen = replace(mem, repair=replace(mem.repair, unhealthy_since=since, unknown_since=unknown))
            return draft.out(seen, "unhealthy_running",
                             f"node {what} since {since.isoformat()}, but every worker still runs attempt "
                             f"{mem.attempt.number}; following it")
        mem, final = end_unusable(draft, mem)
        if final is not None:
            return final
    settling = (mem.repair.settling_since or now) if node.repair_settling else None
    mem = replace(mem, repair=replace(mem.repair, unknown_since=unknown, settling_since=settling))
    waited = secs(now - since)
    grace = min(FAILED_REPAIR_GRACE, cfg.repair_timeout)
    if unknown is not None and secs(now - unknown) >= grace:
        return recreate(draft, replace(mem,
                                       repair=replace(mem.repair, unhealthy_since=since)), "failed_repair",
                        f"node UNKNOWN with no health (the API's state after a failed repair) for "
                        f"{human(secs(now - unknown))}, not waiting out recovery.repair_timeout "
                        f"({human(cfg.repair_timeout)})")
    if auto := autorepairing(draft, mem):
        # Recreating the request would ask for every slice at once, behind the same shortage
        # the repair waits on, and lose its place: wait as long as a create may queue.
        bound = max(cfg.repair_timeout, cfg.queue_timeout)
        if waited < bound:
            until = since + timedelta(seconds=bound)
            mem = move(mem, Phase.WAITING_NODE, reason=auto,
                       repair=replace(mem.repair, unhealthy_since=since))
            return draft.out(mem, "autorepair_wait", f"{auto} since {since.isoformat()}; waiting for it until "
                             f"{until.isoformat()} (the longer of recovery.repair_timeout and "
                             f"recovery.queue_timeout, {human(bound)}) before recreating the whole request",
                             Wait(until, auto))
        return recreate(draft, mem, "repair_timeout", f"{auto} for {human(waited)}, longer than "
                        f"recovery.queue_timeout ({human(bound)})")
    if waited < cfg.repair_timeout:
        until = since + timedelta(seconds=cfg.repair_timeout)
        if unknown is not None:
            until = min(until, unknown + timedelta(seconds=grace))
        mem = move(mem, Phase.WAITING_NODE, reason=f"node {what}",
                   repair=replace(mem.repair, unhealthy_since=since))
        row = "repair_wait" if known else "unknown_state"
        limit = (f"{human(grace)} in UNKNOWN after a failed repair" if unknown is not None
                 else f"recovery.repair_timeout {human(cfg.repair_timeout)}")
        return draft.out(mem, row, f"node {what} since {since.isoformat()}; waiting for it to heal until "
                                   f"{until.isoformat()} ({limit})", Wait(until, f"node {what}"))
    why = f"node {what} for {human(waited)}, longer than recovery.repair_timeout ({human(cfg.repair_timeout)})"
    under_way = node.repair_under_way
    if settling is not None and secs(now - settling) >= cfg.repair_timeout:
        # a repair ends in seconds: a MIG not stable that long with nothing under way is not one
        under_way = ""
        why += (f"; the MIG not stable for {human(secs(now - settling))} with every VM running and none with an "
                "action: no repair of its own is ending")
    if known and under_way:
        # The MIG is still making its VMs again: a recreate now would recreate what it is
        # recreating. Past its repair (the MIG idle, the slice still down) the next tick recreates.
        mem = move(mem, Phase.WAITING_NODE, reason=f"node {what}", repair=replace(mem.repair, unhealthy_since=since))
        return draft.out(mem, "mig_repair_wait", f"{why}, but {under_way}: waiting for the MIG's own "
                                                 "repair to end before recreating anything",
                         Wait(None, under_way))
    if not known:
        return draft.halt(replace(mem, repair=replace(mem.repair, unhealthy_since=since)), "unknown_state",
                          f"{why}; tpuwatch does not know state {node.state} and will not delete the node")
    return recreate(draft, mem, "repair_timeout", why)


def autorepairing(draft: Draft, mem: Memory) -> str:
    """What Cloud TPU's multislice autorepair is doing, "" when it is not. While the job's
    multislice queued resource stays ACTIVE: a slice is missing or being created (the service
    creates a new one, waiting for hardware if needed), or a slice has a new id since the
    attempt's launch and another is RESTARTING (the service restarts the others after it)."""
    node, q = draft.obs.node, draft.obs.queued
    if not (draft.cfg.slices and draft.cfg.recreatable and node is not None and q is not None
            and q.state == "ACTIVE"):
        return ""
    request = q.name.rsplit("/", 1)[-1]
    parts = list(zip(draft.cfg.slices, node.slices, strict=False))
    gone = [name for name, part in parts if part.state in ("MISSING", "CREATING")]
    if gone:
        return (f"slice {', '.join(gone)} of queued resource {request} is being replaced (Cloud TPU's "
                "multislice autorepair creates a new slice, waiting for hardware if needed, then restarts "
                "the others)")
    before = mem.attempt.node_id.split("+")
    new = [name for i, (name, part) in enumerate(parts) if i < len(before) and part.id != before[i]]
    restarting = [name for name, part in parts if part.state == "RESTARTING"]
    if new and restarting:
        return (f"slice {', '.join(new)} of queued resource {request} was replaced; Cloud TPU's multislice "
                f"autorepair restarts the others ({', '.join(restarting)} RESTARTING)")
    return ""


def dead(draft: Draft, mem: Memory) -> Decision:
    node = draft.obs.node
    assert node is not None
    mem, final = end_unusable(draft, mem)
    if final is None and still_stopping(node):
        return stopping(draft, mem)
    return final or recreate(draft, mem, "dead_node", f"node {node.state}: it does not come back by itself")


def stopping(draft: Draft, mem: Memory) -> Decision:
    """A Compute Engine Spot VM (termination action STOP) still stopping (row `spot_stopping`):
    Google's preemption ends TERMINATED (then `dead_node`), a person's instances.delete ends with
    the VM gone (then `node_missing`), and the two look alike until then. Nothing is sent to it
    meanwhile: a delete beside the person's, then an insert, would make again what a person deleted.
    Google's stop ends in seconds: one stopping past STOPPING_LONG is said (`spot_stopping_long`),
    past recovery.operation_timeout a person is asked (`spot_stopping_timeout`), as for any
    operation that does not end; still nothing sent to it."""
    since = mem.repair.unhealthy_since or draft.now
    mem = replace(mem, repair=replace(mem.repair, unhealthy_since=since))
    node, limit = draft.obs.node, draft.cfg.operation_timeout
    vms = ", ".join(p.name for p in (node.slices or (node,) if node is not None else ()) if p.stopping) or draft.subject
    age = secs(draft.now - since)
    if age >= limit:
        return draft.halt(mem, "spot_stopping_timeout",
                          f"Spot VM {vms} has been stopping for {human(age)} (since {since.isoformat()}), longer than "
                          f"recovery.operation_timeout ({human(limit)}); Google's stop of a Spot VM ends in seconds. "
                          "tpuwatch sends nothing to it (a person's instances.delete looks the same): look at it "
                          "(gcloud compute instances describe), and run tpuwatch again once it is TERMINATED, "
                          "RUNNING or gone", (f"{vms}: STOPPING for {human(age)}",))
    why = (f"{draft.subject} is a Spot VM stopping (since {since.isoformat()}): TERMINATED it is "
           "Google's preemption and is made again; gone it is a person's instances.delete and the job stops "
           "for a person. Waiting to see which, sending nothing to it")
    mem = move(mem, Phase.WAITING_NODE, reason=why)
    if age < min(STOPPING_LONG, limit / 2):
        return draft.out(mem, "spot_stopping", why, Wait(None, "a Spot VM stopping"))
    return draft.out(mem, "spot_stopping_long",
                     f"{why}; {vms} has been stopping for {human(age)}, longer than Google's stop takes (30 s for "
                     "a preempted Spot VM's guest, more only with a graceful shutdown configured): past "
                     f"recovery.operation_timeout ({human(limit)}) a person is asked", Wait(None, STOPPING_LONG_WAIT))


def person(draft: Draft, mem: Memory) -> Decision:
    node = draft.obs.node
    assert node is not None
    mem, final = end_unusable(draft, mem)
    if final is not None:
        return final
    if why := google.stopped(draft, mem):
        return compute_stopped(draft, mem, why)
    why = f"node is {node.state}: a person stopped it; leaving it alone until it is READY again"
    return draft.out(move(mem, Phase.PAUSED, reason=why,
                          repair=mem.repair.over()),
                     "person_stopped", why, Wait(None, why))


def compute_stopped(draft: Draft, mem: Memory, why: str) -> Decision:
    """A VM Compute Engine stopped itself (policy/google.py): a repair, waited for up to
    repair_timeout from first sight. Compute Engine restarts it with automaticRestart; without,
    tpuwatch starts it again once (owned only); still down at repair_timeout, it is recreated."""
    node, cfg, now = draft.obs.node, draft.cfg, draft.now
    assert node is not None
    since = mem.repair.unhealthy_since or mem.google.stopped_since or now
    what = f"Compute Engine stopped {draft.subject} ({why}), not a person"
    waited = secs(now - since)
    if waited >= cfg.repair_timeout:
        return recreate(draft, mem, "repair_timeout", f"{what}; not running again after {human(waited)}, longer than "
                                                      f"recovery.repair_timeout ({human(cfg.repair_timeout)})")
    until = since + timedelta(seconds=cfg.repair_timeout)
    mem = move(mem, Phase.WAITING_NODE, reason=what, repair=replace(mem.repair, unhealthy_since=since))
    limit = f"until {until.isoformat()} (recovery.repair_timeout {human(cfg.repair_timeout)}), then recreating it"
    if node.auto_restart:
        return draft.out(mem, "google_stopped_wait", f"{what}; Compute Engine restarts it (automaticRestart): "
                                                     f"waiting {limit}", Wait(until, what))
    if mem.google.start_asked is None and node.state == "STOPPED" and (node.owned_by(cfg.job) or draft.obs.adopt):
        mem = replace(mem, google=replace(mem.google, start_asked=now))
        return draft.out(mem, "google_stopped_start", f"{what}; it does not restart it (automaticRestart off): "
                                                      f"starting it again, waiting {limit}",
                         StartNode(cfg.tpu_name, what), Wait(until, what))
    return draft.out(mem, "google_stopped_wait", f"{what}; waiting {limit}", Wait(until, what))


def missing(draft: Draft, mem: Memory) -> Decision:
    cfg = draft.cfg
    mem, final = end_unusable(draft, mem)
    if final is not None:
        return final
    if queued_ended(draft):
        # Its request still holds the name: delete it (nothing is left of the node to own or
        # lose), then create it again.
        return recreate(draft, mem, "queued_preempted", queued_why(draft))
    if gone := google.deleted(draft, mem):
        why = f"Google deleted {draft.subject} ({gone}): a preemption or the end of its run, not a person's"
        if not (mem.google.owned or draft.obs.adopt):
            return draft.halt(mem, "not_owned", f"{why}; not owned: it lacked {OWNER_LABEL}={cfg.job} when last "
                                                "seen, so tpuwatch will not make it again; pass --adopt",
                              (f"{OWNER_LABEL}={cfg.job} missing when last seen",))
        return recreate_missing(draft, mem, "google_deleted", f"{why}; not charged")
    if draft.obs.recreate_missing:
        return recreate_missing(draft, mem, "recreate_missing", f"{draft.subject} is missing; "
                                                                "--recreate-missing")
    if (until := google.word_due(draft, mem)) is not None:
        why = (f"{draft.subject} is missing; Google deletes it itself at a preemption or the end of its run, "
               "so tpuwatch waits for the audit log to say whether it did")
        return draft.out(move(mem, Phase.WAITING_NODE, reason=why), "google_delete_wait",
                         f"{why} (until {until.isoformat()}; with no word it is a person's deletion)",
                         Wait(until, "node missing"))
    # one Google may delete, waited for: say what was missing from Google's word
    unsaid = (f" nor Google (no {google.PREEMPTED} about it in the audit log within {human(google.AUDIT_GRACE)} "
              "of it being found gone)" if mem.google.deletes and mem.google.owned and mem.google.missing_since is not None else "")
    return draft.halt(
        mem, "node_missing",
        f"{draft.subject} is missing in {mem.zone} and tpuwatch did not delete it{unsaid}; tpuwatch never "
        "recreates a node a person deleted. Pass --recreate-missing to create it from the saved spec",
        (f"nodes/{cfg.tpu_name}: not found in {mem.zone}",),
    )


def someone_deleting(draft: Draft, mem: Memory) -> Decision:
    mem, final = end_unusable(draft, mem)
    if final is None and queued_ended(draft):
        return recreate(draft, mem, "queued_preempted", queued_why(draft))
    if final is None and (gone := google.going(draft, mem)):
        if (until := google.going_until(draft, mem)) is None:
            if word := google.deleted(draft, mem):  # Google preempted it and has not deleted it yet
                return recreate(draft, mem, "dead_node", f"{draft.subject} is still going ({gone}; {word}) "
                                                         f"{human(google.AUDIT_GRACE)} after it was first seen so")
            # no word from Google: a person's stop (a Spot VM with DELETE a person stopped stays
            # TERMINATED), left alone as any person's stop until it runs again
            why = (f"{draft.subject} is down ({gone}) {human(google.AUDIT_GRACE)} after it was first seen so, with no "
                   "compute.instances.preempted about it in the audit log: a person stopped it; leaving it alone "
                   "until it is READY again")
            return draft.out(move(mem, Phase.PAUSED, reason=why), "person_stopped", why, Wait(None, why))
        why = (f"{draft.subject} is going as Google deletes it ({gone}); once gone it is made again only with "
               "Google's word for it (its preemption in the audit log, or its run's end)")
        return draft.out(move(mem, Phase.WAITING_NODE, reason=why), "google_deleting", why, Wait(until, why))
    return final or draft.halt(
        mem, "someone_deleting",
        f"{draft.subject} is being deleted, not by tpuwatch; once it is gone, pass "
        "--recreate-missing to create it again",
    )


def not_recreatable(draft: Draft, mem: Memory, why: str) -> Decision:
    cfg = draft.cfg
    if cfg.spares:
        how = ("it runs on a pool with spares (tpu.spares), whose dead nodes tpuwatch makes again itself only from "
               f"{cfg.spec_table}, and none is free or on its way" + ("" if cfg.spares_remade else "; the config "
                                                                     f"has no {cfg.spec_table} (tpuwatch init writes it)"))
    else:
        how = (f"the job's slices ({', '.join(cfg.slices)}) were created one by one, not by one multislice queued "
               "resource: tpuwatch does not delete or create across them")
    return draft.halt(mem, "not_recreatable",
                      f"{why}; {how}. Repair or recreate that node: the job is launched again once every slice is "
                      "READY+HEALTHY", (why,))


def recreate_missing(draft: Draft, mem: Memory, row: str, why: str) -> Decision:
    cfg = draft.cfg
    if not cfg.recreatable:
        return not_recreatable(draft, mem, why)
    if (spent := recreate_spent(draft, mem, why)) is not None:
        return spent
    mem = replace(mem,
                  budgets=RECREATES.charge(mem.budgets),
                  recreate=replace(mem.recreate, queued_since=None, queue_tries=0))
    return create(draft, mem, 0, row, f"{why}: creating it in {cfg.zones[0]}")


def queued_why(draft: Draft) -> str:
    q = draft.obs.queued
    assert q is not None
    detail = f" ({q.error_message})" if q.error_message else ""
    if q.kind == "resize_request":  # a flex-start MIG's request stands for its queued resource
        return (f"Compute Engine took {draft.subject} back: its resize request {q.name.rsplit('/', 1)[-1]} "
                f"is {q.state}{detail}; not charged")
    return (f"the Cloud TPU service took {draft.subject} back: its queued resource "
            f"{q.name.rsplit('/', 1)[-1]} is {q.state}{detail} (a spot preemption does this); not charged")


def recreate_spent(draft: Draft, mem: Memory, why: str) -> Decision | None:
    """The job failed (row `recreate_budget_spent`) when a recreate would pass max_recreates."""
    spent = RECREATES.spent(mem.budgets, draft.cfg)
    return None if spent is None else draft.fail(mem, spent.row, f"{why}; {spent.why}", (why,))


ASKED = "a person asked for a recreate (tpuwatch recreate, or check --recreate)"


def asked(draft: Draft, mem: Memory) -> Decision:
    """Row `recreate_asked`: a person's delete + create now, by the same path as the policy's own
    recreates, not charged to max_recreates (a person chose it; the budget bounds tpuwatch's own
    tries). A running attempt ends first, as a disruption: the person, not the job, ends it."""
    node = draft.obs.node
    if node is not None and node.state == "DELETING":
        return someone_deleting(draft, mem)
    if mem.phase is Phase.RUNNING:
        sign = Evidence(draft.now, ASKED)
        mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, [sign])))
        mem, final = end_unusable(draft, mem)
        if final is not None:
            return final
    if node is None and not queued_ended(draft):  # an ended request holds the name: deleted first
        if not draft.cfg.recreatable:
            return not_recreatable(draft, mem, f"{draft.subject} is missing")
        mem = replace(mem, recreate=replace(mem.recreate, queued_since=None, queue_tries=0))
        return create(draft, mem, 0, "recreate_asked", f"{draft.subject} is missing; {ASKED}: creating it in "
                                                       f"{draft.cfg.zones[0]}")
    return recreate(draft, mem, "recreate_asked", ASKED, charge=False)


def recreate(draft: Draft, mem: Memory, row: str, why: str, *, charge: bool = True) -> Decision:
    """Delete the node (or, when it is gone, its ended queued resource) to create it again;
    `charge`: within max_recreates, and counted against it."""
    node, cfg = draft.obs.node, draft.cfg
    if node is not None and not (node.owned_by(cfg.job) or draft.obs.adopt):
        have = node.owner
        label = f"it has {OWNER_LABEL}={have}" if have is not None else "it has no such label"
        return draft.halt(
            mem, "not_owned",
            f"{why}; not owned: will not delete {node.name} (label {OWNER_LABEL}={cfg.job} missing); pass --adopt",
            (label,),
        )
    if not cfg.recreatable:
        return not_recreatable(draft, mem, why)
    if charge and (spent := recreate_spent(draft, mem, why)) is not None:
        return spent
    mem = move(mem, Phase.DELETING,
               budgets=RECREATES.charge(mem.budgets) if charge else mem.budgets,
               recreate=replace(mem.recreate, pending_op=None, op_started=None, deleting_node_id=node.id if node is not None else "",
                                queued_since=None, queue_tries=0, retry_at=None),
               repair=replace(mem.repair, env_failing_since=None))
    count = f"recreate {mem.budgets.recreates} of {cfg.max_recreates}" if charge else "not charged"
    return draft.out(mem, row, f"{why}: deleting it to create it again ({count})",
                     DeleteNode(cfg.tpu_name, mem.zone, why))
