"""Hot spares ([tpu] spares): a job's idle nodes of its shape, swapped in for a lost slice at
once instead of waiting for it to heal or be made again.

The job's slots are tpu.names (a slot's place is its slice id; a job on one node is a pool of
one slot, its own name). `Memory.limp.swapped` binds a slot to the node that runs in its place,
journaled with the decision, before anything is launched there. The tick builds the job's node
from the nodes its slots are bound to (`model.bound_view`) and reads the pool's other nodes apart
(`Observation.spares`): a node swapped out is one of those, a spare again once it can stand in,
so the pool keeps its size and nothing moves back for its own sake.

Rows: `swap` (a lost slice, or one left out while the job limps, onto a free spare), `spare_bad`
(a spare whose launch-time checks fail is not used), `spare_wait` (no spare free, one on its
way), `spare_remake` (a dead idle node deleted and created again from [tpu.spec], in the
background); `early_swap` (policy/early.py) moves the job off a node with an announced
maintenance. A swap itself never deletes or creates a node.

A node Google deletes itself (a Compute Engine VM's termination action DELETE), owned and made
alone, is made again once gone as one tpuwatch deleted. A node a slot runs on that is gone with
no word that Google or tpuwatch removed it (`removed`) was deleted by a person, perhaps to stop
the job: never swapped away from; the job stops for a person (`node_missing`).

A node may stand in only while it is READY+HEALTHY, of the accelerator type the job's slices
have, and carries the job's ownership label: a spare a person deleted, stopped or relabelled is
never used nor made again, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.durations import human
from tpuwatch.model import LENT_BY, CheckItem, NodeSnapshot
from tpuwatch.policy import google
from tpuwatch.policy.backoff import backoff_delay
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.limp import (
    BRIEF_STATES,
    deleted_left_out,
    end_lost,
    foreign_stop,
    gone_node,
    person_deleted,
    removed,
    stop_waited,
)
from tpuwatch.policy.nodes import FAILED_REPAIR_GRACE, Cond, failed_repair, node_condition
from tpuwatch.policy.state import Limp, Memory, Phase, move
from tpuwatch.policy.values import Decision, RemakeSpare, Wait


def unfit(job: str, node: NodeSnapshot | None, part: NodeSnapshot | None, bad: tuple[str, ...] = ()) -> str:
    """Why `part`, a node of job `job`'s pool, cannot stand in for a slice of `node` (the job's
    node as it runs) now; "" when it can. `bad`: Limp.bad."""
    if part is None:
        return "missing"
    if f"{part.name}@{part.id}" in bad:
        return "failed its launch-time checks (not used again until it is made again)"
    if not part.owned_by(job):
        return f"not owned by job {job} (its ownership label says {part.owner or 'nothing'})"
    shapes = {p.accelerator_type for p in (node.slices if node is not None else ()) if p.accelerator_type}
    if shapes and part.accelerator_type not in shapes:
        return f"a {part.accelerator_type}, not the job's {', '.join(sorted(shapes))}"
    # a MIG's shape is its machine type and its size (a multi-host slice of that many VMs)
    sizes = {p.target_size for p in (node.slices if node is not None else ()) if p.kind == "mig"}
    if part.kind == "mig" and sizes and part.target_size not in sizes:
        return f"a MIG of target size {part.target_size}, not the job's {', '.join(str(s) for s in sorted(sizes))}"
    if part.kind == "mig" and part.boots_job:  # its template's: tpuwatch cannot change it on the VMs
        return ("its VMs start the job at boot (tpuwatch-command in its template's metadata without "
                "tpuwatch-launch = \"false\"): an idle spare would run the job on its own")
    if not part.usable:
        return part.state + (f"/{part.health}" if part.health and part.state == "READY" else "")
    return ""


def free(draft: Draft, mem: Memory, loans: bool = False) -> list[str]:
    """The job's spares it may swap in now, in pool order (tpu.names, then tpu.spares). A node
    another job lent it only with `loans`: priority's `take` binds it and keeps its lender, owed
    a node back; a swap onto it would forget whom."""
    job = draft.cfg.job
    return [name for name, part in draft.obs.spares if not unfit(job, draft.obs.node, part, mem.limp.bad)
            and (loans or part is None or part.labels.get(LENT_BY, job) == job)]


def bind(slices: Sequence[str], limp: Limp, pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """`Limp.swapped` with each (slot, node) of `pairs` bound, in slice order; a slot back on its
    own node is no swap."""
    bound = {**dict(limp.swapped), **dict(pairs)}
    return tuple((slot, bound[slot]) for slot in slices if slot in bound and bound[slot] != slot)


def track(draft: Draft, mem: Memory) -> Memory:
    """What the pool's idle nodes have shown: a node swapped out while lost that can stand in
    again (or is no longer in the pool) is no longer away (the tick journals the wait it would
    have cost, `spare_back`); an idle node under repair is noted with when it was first seen so
    (`down`), and forgotten once it is not."""
    seen = dict(draft.obs.spares)
    limp = mem.limp
    if limp.away:
        kept = [(n, t) for n, t in zip(limp.away, limp.away_since, strict=True)
                if n in seen and unfit(draft.cfg.job, draft.obs.node, seen[n], limp.bad)]
        if len(kept) != len(limp.away):
            limp = replace(limp, away=tuple(n for n, _ in kept), away_since=tuple(t for _, t in kept))
    since = dict(zip(limp.down, limp.down_since, strict=True))
    down = [(n, since.get(n, draft.now)) for n, part in (*draft.obs.spares, *left_out(draft, mem))
            if part is not None and node_condition(part) in COMING]
    if [n for n, _ in down] != list(limp.down):
        limp = replace(limp, down=tuple(n for n, _ in down), down_since=tuple(t for _, t in down))
    limp = _google_word(draft, limp)
    limp = _own_deleted(draft, mem, limp)
    return mem if limp == mem.limp else replace(mem, limp=limp)


def _own_deleted(draft: Draft, mem: Memory, limp: Limp) -> Limp:
    """The node a job on one slot runs on, gone with Google's word that it deleted it (a VM whose
    termination action is DELETE: policy/google.py), owned as last seen: journaled in `remaking`
    the tick it is first read so, as an idle one Google deleted is (`_google_word`), so that it is
    inserted again (`remake`) whatever comes next: a swap, a take of another job's node (its slot
    then bound elsewhere, the node it lost no longer the one `Memory.google` follows), a wait, or
    a watcher killed before the insert. Without, only a swap onto a free spare made it again, and
    the rows, which never recreate a pool's node, left it to a person."""
    cfg, g = draft.cfg, mem.google
    if (draft.obs.node is not None or len(cfg.slices) != 1 or not cfg.spares_remade or cfg.spares_in_place
            or not (g.owned and google.deleted(draft, mem))):
        return limp
    name = limp.node_of(cfg.slices[0])
    if not name or name in limp.remaking:  # lent (bound to no node), or already so
        return limp
    return replace(limp, remaking=(*limp.remaking, name), deletes=tuple(n for n in limp.deletes if n != name))


def _google_word(draft: Draft, limp: Limp) -> Limp:
    """The pool's idle nodes Google may delete itself, and Google's word on them
    (`google.idle_word`): one gone with that word is made again (`remaking`)."""
    job = draft.cfg.job
    pool = {*draft.cfg.slices, *draft.cfg.spares, *(n for _, n in limp.swapped if n)}
    deletes = [n for n, part in draft.obs.spares if part is not None and part.google_deletes
               and part.owned_by(job) and not part.multislice_request]
    word, taken = google.idle_word(limp.word, dict(draft.obs.spares), deletes, pool, draft.obs.events,
                                   limp.remaking, draft.cfg.spares_remade, draft.now)
    return replace(limp.with_word(word), remaking=(*limp.remaking, *(n for n in taken if n not in limp.remaking)))


def swap(draft: Draft, mem: Memory) -> Decision | None:
    """Slices the job runs on are lost, or left out while it limps, and a spare is free: bind
    each such slot to a spare (as many as there are) and, for a lost one, end the attempt (a
    disruption, not charged); the launch that follows runs on the spares in the lost slices'
    places. A slice a person stopped is left alone (the job pauses), a slice that restarts is
    waited for (BRIEF_STATES), as a limp does, and so is a Spot VM still stopping (row
    `spot_stopping`: swapped away from once TERMINATED, never once gone). None: nothing to swap."""
    cfg, node, now = draft.cfg, draft.obs.node, draft.now
    spares = free(draft, mem)
    if not spares:
        return None
    if gone := deleted_left_out(draft, mem):  # a person's deletion: never a spare in its place
        return person_deleted(draft, mem, gone)
    out = [slot for slot, part in zip(mem.limp.out, draft.obs.left_out, strict=True)
           if part is None or not part.usable]
    lost: list[tuple[str, NodeSnapshot]] = []
    if node is not None and node.slices and node_condition(node) not in (Cond.USABLE, Cond.PERSON):
        lost = [(slot, part) for slot, part in zip(mem.limp.slots(cfg.slices), node.slices, strict=True)
                if not part.usable]
        # nor a Compute Engine Spot VM still stopping: a person's instances.delete looks so until
        # it is gone (never swapped away from, `node_missing`), a preemption until TERMINATED; one
        # tpuwatch itself deletes to make again (`remaking`) is its own doing
        if any(part.state in BRIEF_STATES or foreign_stop(mem, slot, part) for slot, part in lost):
            lost = []
        if vanished := [(slot, part) for slot, part in lost
                        if part.state == "MISSING" and not removed(draft, mem, slot)]:
            return person_deleted(draft, mem, vanished)
    elif node is None and len(cfg.slices) == 1 and not mem.limp.out and mem.limp.node_of(cfg.slices[0]):
        # a pool of one slot whose node is gone (a VM Google deleted at its preemption; a slot lent
        # to another job, bound to no node, is policy/priority.py's). With no word that Google or
        # tpuwatch removed it, the rows decide as without spares: a wait for the audit log's word
        # (google_delete_wait), else a person's deletion (node_missing), never a swap away from it
        if not removed(draft, mem, cfg.slices[0]):
            return None
        lost = [(cfg.slices[0], gone_node(mem.limp.node_of(cfg.slices[0])))]
    slots = [slot for slot, _ in lost] + out
    if not slots:
        return None
    pairs = list(zip(slots, spares, strict=False))  # as many as there are spares
    taken = {slot for slot, _ in pairs}
    was = {**{slot: f"{mem.limp.node_of(slot)} (left out)" for slot in out},
           **{slot: f"{mem.limp.node_of(slot)} ({part.state})" for slot, part in lost}}
    gone = [(slot, part) for slot, part in lost if slot in taken]
    mem, final = end_lost(draft, mem, gone)
    if final is not None:
        return final
    swapped = bind(cfg.slices, mem.limp, pairs)
    away = [mem.limp.node_of(slot) for slot, _ in gone]
    # the job's VM gone that Google deleted, owned as last seen (policy/google.py), is made again;
    # one swapped out while it goes is, idle, once the audit log says Google deleted it (`track`)
    g = mem.google
    deleted = [name for name in away
               if cfg.spares_remade and name not in mem.limp.remaking and node is None and g.owned
               and bool(google.deleted(draft, mem))]
    # one Google is deleting as it is swapped out is watched as an idle one so from the swap on
    # (`deletes`, journaled with it): a watcher that next reads it gone (killed in between, or slow
    # to look again) still makes it again on the audit log's word, instead of forgetting it
    going = [name for name, (_, part) in zip(away, gone, strict=True)
             if cfg.spares_remade and name not in deleted and name not in mem.limp.deletes
             and google_deletes(cfg.job, part)]
    mem = replace(mem, limp=replace(mem.limp, swapped=swapped, away=(*mem.limp.away, *away),
                                    away_since=(*mem.limp.away_since, *(now for _ in away)),
                                    remaking=(*mem.limp.remaking, *deleted), deletes=(*mem.limp.deletes, *going)))
    said = "; ".join(
        f"slice {cfg.slices.index(slot)} ({slot}) on {spare} instead of {was[slot]}"
        for slot, spare in pairs)
    if gone:
        then = "the job relaunches there from its newest complete checkpoint"
    else:
        then = "the job grows back onto it at its next complete checkpoint"
    rest = [slot for slot in slots if slot not in taken]
    more = f"; no spare left for {', '.join(rest)}" if rest else ""
    return stop_waited(draft.out(mem, "swap", f"swapped for a spare: {said}{more}; {then}; the slice it "
                                                      "replaces is a spare once READY+HEALTHY again"))


def remake(draft: Draft, before: Memory, decision: Decision) -> Decision:
    """A decision that does nothing (the job runs on, or waits) with a spare to make again: the
    same decision under row `spare_remake`, with the delete or create of that spare.
    - An idle spare that will not come back by itself (PREEMPTED, TERMINATED), or has been under
      repair longer than recovery.repair_timeout, owned by the job, made alone (not one slice of a
      multislice queued resource), when [tpu.spec] can make it again: journaled as one tpuwatch
      makes again (`Limp.remaking`), then deleted. So is such a lost slice of the job itself while
      the job waits for a spare (row `spare_wait`). One so journaled still PREEMPTED / TERMINATED,
      not DELETING, past `remake_at` (a backoff after the delete was decided) is deleted again: its
      delete never started (the watcher killed between its journal line and the call, or refused).
    - So is a slice the job limps without ([job] min_slices), of a job over slices made one by
      one with [tpu.spec] (`slices_remade`): the job grows back onto it once it is READY.
    - Not one under repair while a create of another has come to nothing (a stockout): it may
      still heal, and a node deleted then could come back only through a create.
    - Not a Compute Engine VM still stopping: a person's instances.delete shows so until it is gone
      (a Spot VM's preemption until TERMINATED), and tpuwatch would then make again what a person
      deleted; nor, so, a delete sent again while tpuwatch's own is under way.
    - A MIG (`spares_in_place`) is made again in place: its instances recreated, never the MIG
      deleted; one gone (a person deleted it) is dropped, never inserted; an idle one whose VMs
      start the job at boot (its template's metadata) is not recreated at all.
    - One of those gone: created again from [tpu.spec], no sooner than `remake_at`: a create that
      came to nothing (a stockout, quota) is tried again as a queued create is, after
      recovery.backoff_base, doubling up to recovery.backoff_max.
    - Back (it exists again): no longer remade. A node tpuwatch did not delete is never created.
    `before`: the memory the observation's binding is from; a decision that changes the binding
    is left as it is (the tick looks again first)."""
    cfg, now, node = draft.cfg, draft.now, draft.obs.node
    out = left_out(draft, before)
    # a job over slices made one by one has no idle node, only its own slices to make again
    own = bool(out or decision.memory.limp.remaking) or (cfg.slices_remade and decision.row == "spare_wait")
    if (any(not isinstance(a, Wait) for a in decision.actions) or decision.ended
            or not (draft.obs.spares or own or cfg.priority is not None or cfg.spare_pool)
            or (decision.memory.limp.out, decision.memory.limp.swapped) != (before.limp.out, before.limp.swapped)):
        return decision
    mem = decision.memory
    limp = mem.limp
    # the pool as read: its idle nodes, and the nodes the job's slices hold (None: missing)
    held: dict[str, NodeSnapshot | None] = {}
    if node is not None and node.slices:
        held = {name: None if part.state == "MISSING" else part
                for name, part in zip(limp.kept(cfg.slices), node.slices, strict=True)}
    elif cfg.slices:  # a pool whose every slot's node is gone (a pool of one slot, its node deleted)
        held = {name: None for name in limp.kept(cfg.slices) if name}
    seen = {**held, **dict(out), **dict(draft.obs.spares)}
    # a bad spare is forgotten once it is seen idle as another node (made again), or gone
    other = {name for name, part in draft.obs.spares if part is None or f"{name}@{part.id}" not in limp.bad}
    bad = tuple(b for b in limp.bad if b.split("@")[0] not in other)
    if bad != limp.bad:
        limp = replace(limp, bad=bad)
    # still on its way out (or gone, to create): kept; made again (or no longer the job's): done with it
    made = tuple(n for n in limp.remaking if n in seen and ((part := seen[n]) is None or _going(part)))
    if made != limp.remaking:
        limp = replace(limp, remaking=made, remake_tries=limp.remake_tries if made else 0,
                       remake_at=limp.remake_at if made else None)
    gone = [n for n in made if seen[n] is None]
    if cfg.spares_in_place and gone:  # a MIG made again in place, gone since: a person's deletion, never inserted
        made = tuple(n for n in made if n not in gone)
        limp = replace(limp, remaking=made, remake_tries=limp.remake_tries if made else 0,
                       remake_at=limp.remake_at if made else None)
        gone = []
    # idle nodes dead, or under repair past repair_timeout; while the job waits for a spare, its
    # own lost slices too (their repair timed as the job's rows time it: `_repair_since`)
    down = dict(zip(limp.down, limp.down_since, strict=True))
    # (not an idle MIG whose VMs start the job at boot: recreated, it would run the job on its own)
    candidates = [(name, part, down.get(name)) for name, part in (*draft.obs.spares, *out)
                  if part is None or not (part.kind == "mig" and part.boots_job)]
    if decision.row in ("spare_wait", "take_wait"):
        candidates += [(name, part, _repair_since(before, part) if part is not None else None)
                       for name, part in held.items()]
    # creates come to nothing (a stockout, quota): a node under repair may still come back by
    # itself, a deleted one only through a create, so none is deleted for being slow to heal
    refused = bool(gone) and limp.remake_tries > 0
    dead = [(name, part) for name, part, since in candidates
            if part is not None and name not in limp.remaking and remakable(cfg.job, part, since, now,
                                                                             cfg.repair_timeout)
            and not (refused and node_condition(part) is not Cond.DEAD)]
    # one Google deletes itself (a Spot VM's termination action DELETE) is never deleted by
    # tpuwatch beside Google: made again once gone with the audit log's word for it (`track`)
    dead = [(name, part) for name, part in dead if not google_deletes(cfg.job, part)]
    # nor one still stopping (a Compute Engine VM): a Spot preemption ends TERMINATED, deleted
    # then, but a person's instances.delete looks alike until the VM is gone, never to be made again
    dead = [(name, part) for name, part in dead if not part.stopping]
    # one journaled to be made again and still PREEMPTED / TERMINATED, not being deleted, once
    # `remake_at` is past: its delete never started (the watcher killed between its journal line
    # and the call, or the call refused); deleted again, never left dead (a node lent in its place
    # would never be handed back). So is a MIG made again in place: one recreated reads REPAIRING
    # (its instances RECREATING) until they run, not DEAD; the adapter sends none while it acts.
    unsent = [(name, part) for name, part, _ in candidates
              if part is not None and name in limp.remaking
              and node_condition(part) is Cond.DEAD and part.owned_by(cfg.job) and not part.multislice_request
              and not google_deletes(cfg.job, part) and not part.stopping
              and (limp.remake_at is None or now >= limp.remake_at)]
    # gone with no word from Google within its grace: a person deleted it; dropped, never made again
    word, late = google.overdue(limp.word, now)
    if late:
        limp = limp.with_word(word)
    action: RemakeSpare | None = None
    if gone and (limp.remake_at is None or now >= limp.remake_at):
        wait = backoff_delay(limp.remake_tries + 1, cfg.backoff_base, cfg.backoff_max, draft.obs.jitter)
        limp = replace(limp, remake_tries=limp.remake_tries + 1, remake_at=now + timedelta(seconds=wait))
        action = RemakeSpare(gone[0], True, f"{gone[0]} was deleted (by tpuwatch, or Google) to be made again: "
                                            f"creating it from {draft.cfg.spec_table} (try {limp.remake_tries}; the "
                                            f"next no sooner than {human(wait)} from now)")
    elif (cfg.spares_remade or cfg.slices_remade) and (dead or unsent):
        name, part = (dead or unsent)[0]
        # a delete that has not started by then is sent again (`unsent`)
        wait = backoff_delay(limp.remake_tries + 1, cfg.backoff_base, cfg.backoff_max, draft.obs.jitter)
        limp = replace(limp, remaking=tuple(dict.fromkeys((*limp.remaking, name))),
                       remake_at=now + timedelta(seconds=wait))
        why = ("will not come back by itself" if node_condition(part) is Cond.DEAD else
               f"has been under repair longer than recovery.repair_timeout ({human(cfg.repair_timeout)})")
        if not dead:
            why += " (journaled to be made again, its delete never started)"
        then = ("the job grows back onto it at its next complete checkpoint once it is READY"
                if name in dict(out) else "a spare of the job's once READY")
        how = ("recreating its instances (recreateInstances: the MIG, its template and workload policy stay)"
               if cfg.spares_in_place else f"deleting it to create it again from {draft.cfg.spec_table}")
        action = RemakeSpare(name, False, f"{name} is {part.state} and {why}: {how}, {then}")
    if limp == mem.limp:
        return decision
    mem = replace(mem, limp=limp)
    if action is None and late:
        return replace(decision, memory=mem, row="spare_gone",
                       summary=f"{decision.summary}; {', '.join(late)} gone with no word from Google that it deleted "
                               f"it (no compute.instances.preempted in the audit log within "
                               f"{human(google.AUDIT_GRACE)}): a person deleted it; not made again")
    if action is None:
        return replace(decision, memory=mem)
    return replace(decision, memory=mem, row="spare_remake", actions=(*decision.actions, action),
                   summary=f"{decision.summary}; {action.reason}")


def left_out(draft: Draft, mem: Memory) -> list[tuple[str, NodeSnapshot | None]]:
    """The nodes of the slices a job over slices made one by one with [tpu.spec] limps without
    (`slices_remade`), as read: those `remake` makes again when dead; none for any other job."""
    if not draft.cfg.slices_remade or len(draft.obs.left_out) != len(mem.limp.out):
        return []
    return [(mem.limp.node_of(slot), part) for slot, part in zip(mem.limp.out, draft.obs.left_out, strict=True)]


def remakable(job: str, part: NodeSnapshot, since: datetime | None, now: datetime, timeout: float) -> bool:
    """A node of the pool tpuwatch may delete and create again: it carries the job's label, was
    made alone, and will not come back by itself (PREEMPTED, TERMINATED) or has been under repair
    since `since` for `timeout` seconds or longer (past a failed repair, FAILED_REPAIR_GRACE at
    most, as the rows recreate such a node)."""
    cond = node_condition(part)
    limit = min(timeout, FAILED_REPAIR_GRACE) if failed_repair(part) else timeout
    stuck = cond in COMING and since is not None and (now - since).total_seconds() >= limit
    return (cond is Cond.DEAD or stuck) and part.owned_by(job) and not part.multislice_request


def google_deletes(job: str, part: NodeSnapshot) -> bool:
    """Google is deleting node `part` of the job's pool itself (a Compute Engine VM's termination
    action DELETE: a Spot preemption, the end of its run), and it carries the job's label and was
    made alone: tpuwatch makes it again once gone, as one it deleted."""
    return bool(part.google_deleting) and part.owned_by(job) and not part.multislice_request


# An idle spare in one of these conditions is on its way back by itself
COMING = frozenset({Cond.REPAIR, Cond.UNRECOGNIZED})


def wait(draft: Draft, mem: Memory) -> Decision | None:
    """A slice the job runs on is dead, missing, being deleted (or repairing past
    recovery.repair_timeout), no spare is free and the job may not limp on the others, but a
    spare is on its way (tpuwatch makes one again, or one heals), or the lost slice itself is
    being made again or can be ([tpu.spec], owned, made alone): end the attempt (a disruption,
    not charged) and wait for it (row `spare_wait`), rather than stop for a person or recreate
    the job's queued resource; the nodes are made again meanwhile (`remake`). None: nothing on
    its way."""
    cfg, node, now = draft.cfg, draft.obs.node, draft.now
    if node is None and cfg.slices and (gone := [n for n in mem.limp.kept(cfg.slices) if n in mem.limp.remaking]):
        # a pool of one slot whose node tpuwatch deleted to make again (or Google did, on the audit
        # log's word): nothing left to see but that; a watcher that read it running, then gone,
        # ends the attempt here
        mem, final = end_lost(draft, mem, [(slot, None) for slot in mem.limp.slots(cfg.slices)
                                           if mem.limp.node_of(slot) in gone])
        if final is not None:
            return final
        why = f"slice(s) lost ({', '.join(gone)} deleted) and no spare free: waiting for {', '.join(gone)} to be made again"
        if mem.phase is not Phase.WAITING_NODE or mem.reason != why:
            mem = move(mem, Phase.WAITING_NODE, reason=why)
        return draft.out(mem, "spare_wait", f"{why}; then the job relaunches from its newest complete checkpoint",
                         Wait(None, "a spare on its way"))
    if not (cfg.spares or cfg.priority is not None or cfg.slices_remade or cfg.spare_pool) or node is None \
            or not node.slices:
        return None
    cond, since = node_condition(node), mem.repair.unhealthy_since
    waited_out = since is not None and (now - since).total_seconds() >= cfg.repair_timeout
    slots = mem.limp.slots(cfg.slices)
    lost = [(slot, part) for slot, part in zip(slots, node.slices, strict=True) if not part.usable]
    if any(foreign_stop(mem, slot, part) for slot, part in lost):  # not yet told from a person's delete
        return None
    itself = [name for slot, part in lost
              if (name := mem.limp.node_of(slot)) in mem.limp.remaking
              or ((cfg.spares_remade or cfg.slices_remade) and part.state != "MISSING"
                  and remakable(cfg.job, part, _repair_since(mem, part), now, cfg.repair_timeout))]
    if (cond not in (Cond.DEAD, Cond.MISSING, Cond.DELETING) and not (cond in COMING and waited_out)
            and not itself):
        return None
    coming = [name for name, part in draft.obs.spares
              if name in mem.limp.remaking or (part is not None and node_condition(part) in COMING)]
    if not coming and not itself:
        return None
    said = ", ".join(f"{mem.limp.node_of(slot)} {part.state}" for slot, part in lost)
    mem, final = end_lost(draft, mem, lost)
    if final is not None:
        return final
    why = f"slice(s) lost ({said}) and no spare free: waiting for " + "; ".join(
        [*([f"{', '.join(coming)} on its way back"] if coming else []),
         *([f"{', '.join(itself)} to be made again"] if itself else [])])
    if mem.phase is not Phase.WAITING_NODE or mem.reason != why:
        mem = move(mem, Phase.WAITING_NODE, reason=why)
    return stop_waited(draft.out(mem, "spare_wait", f"{why}; then the job relaunches from its newest complete "
                                                    "checkpoint", Wait(None, "a spare on its way")))


def _repair_since(mem: Memory, part: NodeSnapshot) -> datetime | None:
    """Since when the job has seen its slice `part` under repair: past a failed repair, since it
    first saw it so (`repair.unknown_since`), as the rows time it."""
    return mem.repair.unknown_since if failed_repair(part) else mem.repair.unhealthy_since


def _going(part: NodeSnapshot) -> bool:
    """A node tpuwatch deletes, not yet gone (or, made again, not yet READY+HEALTHY)."""
    return part.state == "DELETING" or node_condition(part) in (Cond.DEAD, *COMING)


def bad_spare(draft: Draft, mem: Memory, failing: tuple[CheckItem, ...]) -> Decision | None:
    """Launch-time checks fail on the workers of spares just swapped in (a hardware item, or
    anything the cleanup cannot fix): those spares are not used (`Limp.bad`, by node id) and
    their slots go back to their own nodes; the next decision swaps another spare in, limps, or
    waits. None when no failing worker is on a spare."""
    node, cfg = draft.obs.node, draft.cfg
    if node is None or not mem.limp.swapped:
        return None
    slots = mem.limp.slots(cfg.slices)
    on_spare: dict[str, str] = {}  # slot -> "<node>@<id>" of the spare it runs on
    for item in failing:
        if not 0 <= item.worker < len(node.workers):
            continue
        i = node.workers[item.worker].slice
        if 0 <= i < len(slots) and mem.limp.node_of(slots[i]) != slots[i]:
            on_spare[slots[i]] = f"{node.slices[i].name}@{node.slices[i].id}"
    if not on_spare:
        return None
    shown = "; ".join(i.line() for i in failing[:4])
    swapped = tuple((slot, n) for slot, n in mem.limp.swapped if slot not in on_spare)
    mem = replace(mem, limp=replace(mem.limp, swapped=swapped, bad=(*mem.limp.bad, *on_spare.values())))
    said = ", ".join(f"{b.split('@')[0]} (slice {cfg.slices.index(slot)}, {slot})" for slot, b in on_spare.items())
    return draft.out(mem, "spare_bad", f"launch-time checks fail on spare {said}: {shown}; not launching there, "
                                       "not charged; the spare is not used again until it is made again, and the "
                                       "slice goes back to its own node (another spare, a limp, or a wait follows)")
