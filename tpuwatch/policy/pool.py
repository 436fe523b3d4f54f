"""A watcher-wide spare pool ([tpu] spare_pool): idle nodes shared by the jobs of one shape
that name the pool, instead of spares each job keeps for itself (policy/spares.py).

An idle pool spare carries `tpuwatch-pool=<pool>` and no ownership label, so no job launches
on it, deletes it or makes it again. Labels are the truth every job reads:
- claim (row `pool_claim`): a job's slot has no usable node and none of its own spares is free;
  it ends the attempt (a disruption, not charged), journals the claim, then labels a READY+HEALTHY
  idle pool spare of its accelerator type `tpuwatch-job=<job>` (the tick reads it again and
  writes under the pool's lock in the state dir, and waits for the write to land, so two jobs of
  one watcher, or of watchers sharing a state dir, never both take it). The node is then the
  job's, labelled so, and `swap` binds the slot to it on the next decision as to any spare.
- return (row `pool_return`): a job that holds a node of the pool (bound to a slot, still
  carrying `tpuwatch-pool=<pool>`) and has a node of its own idle and READY+HEALTHY (its lost
  node healed, or made again: `spare_remake`), not one of its own tpu.spares, relabels that
  node to the pool (`tpuwatch-pool=<pool>`, no `tpuwatch-job`): a trade, as a priority's hand-back
  is, so the pool keeps its size and the job does not move back.
A `kill -9` between any two steps loses nothing: the claim is journaled before the label write,
and a write that did not land is decided again from the labels as read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta

from tpuwatch.durations import human
from tpuwatch.model import OWNER_LABEL, POOL_BAD_LABEL, POOL_LABEL, NodeSnapshot
from tpuwatch.policy import google
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.limp import end_lost, person_deleted, removed, stop_waited
from tpuwatch.policy.nodes import Cond, node_condition
from tpuwatch.policy.priority import job_shapes, lost_slots
from tpuwatch.policy.state import IdleWord, Limp, Memory, Phase, move
from tpuwatch.policy.values import Decision, Relabel, RemakeSpare, Wait


def idle_in(pool: str, node: NodeSnapshot) -> bool:
    """`node` is an idle spare of spare pool `pool`: its pool label, and no job's."""
    return bool(pool) and node.labels.get(POOL_LABEL) == pool and node.owner is None


def claim(draft: Draft, mem: Memory) -> Decision | None:
    """A job of a spare pool has slots with no usable node (none of its own spares free, `swap`
    came first): claim an idle READY+HEALTHY spare of the pool of the job's accelerator type (the
    first by name) for the first such slot, and wait for the label to say so (row `pool_claim`).
    None: no pool, nothing lost, or no spare of the pool free."""
    cfg = draft.cfg
    if not cfg.spare_pool:
        return None
    lost = lost_slots(draft, mem)
    shapes = job_shapes(draft, mem)
    found = sorted((n for n in draft.obs.zone if idle_in(cfg.spare_pool, n) and not unclaimable(n)
                    and (not shapes or n.accelerator_type in shapes)), key=lambda n: n.name)
    if not lost or not found:
        return None
    # a node gone with no word that Google or tpuwatch removed it: a person's deletion, never
    # replaced by a pool spare (a job on one node: the rows decide as without a pool, node_missing)
    if vanished := {s for s, p in lost if (p is None or p.state == "MISSING") and not removed(draft, mem, s)}:
        node = draft.obs.node
        if node is None or not node.slices:
            return None
        return person_deleted(draft, mem, [(s, p) for s, p in zip(mem.limp.slots(cfg.slices), node.slices, strict=True)
                                           if s in vanished])
    target = found[0]
    mem, final = end_lost(draft, mem, lost)
    if final is not None:
        return final
    said = ", ".join(f"{mem.limp.node_of(s)} {p.state if p is not None else 'MISSING'}" for s, p in lost)
    why = (f"slice(s) lost ({said}) and no spare of its own free: claiming {target.name} from spare pool "
           f"{cfg.spare_pool}")
    if mem.phase is not Phase.WAITING_NODE or mem.reason != why:
        mem = move(mem, Phase.WAITING_NODE, reason=why)
    label = Relabel(target.name, "", ((OWNER_LABEL, cfg.job),), (),
                    f"job {cfg.job} claims {target.name} from spare pool {cfg.spare_pool}", pool=cfg.spare_pool)
    return stop_waited(draft.out(mem, "pool_claim", f"{why}; the job relaunches there from its newest complete "
                                                    "checkpoint once it is labelled the job's", label,
                                 Wait(None, "the claimed spare")))


def give_back(draft: Draft, before: Memory, decision: Decision) -> Decision:
    """A decision that does nothing (the job runs on, or waits) of a job that holds a node of its
    spare pool: with the return of a node of its own idle and READY+HEALTHY to the pool (row
    `pool_return`), one per decision, journaled with it."""
    cfg, node = draft.cfg, draft.obs.node
    if (not cfg.spare_pool or decision.ended or any(not isinstance(a, Wait) for a in decision.actions)
            or (decision.memory.limp.swapped, decision.memory.limp.out) != (before.limp.swapped, before.limp.out)
            or node is None or not node.slices):
        return decision
    held = [p for p in node.slices if p.name and p.owned_by(cfg.job) and p.labels.get(POOL_LABEL) == cfg.spare_pool]
    names = {p.name for p in node.slices}
    # a claimed spare whose launch-time checks failed (spare_bad) goes back to the pool marked so:
    # no job claims it again, the keeper makes it again
    if bad := [p for n, p in draft.obs.spares if p is not None and p.owned_by(cfg.job) and n not in names
               and p.labels.get(POOL_LABEL) == cfg.spare_pool and f"{p.name}@{p.id}" in decision.memory.limp.bad]:
        action = Relabel(bad[0].name, cfg.job, ((POOL_BAD_LABEL, cfg.job),), (OWNER_LABEL,),
                         f"{bad[0].name} of spare pool {cfg.spare_pool} failed its launch-time checks on job "
                         f"{cfg.job}: back to the pool marked {POOL_BAD_LABEL}, never claimed again until its keeper "
                         "makes it again")
        return replace(decision, row="pool_return", actions=(*decision.actions, action),
                       summary=f"{decision.summary}; {action.reason}")
    back = [n for n, p in draft.obs.spares if p is not None and p.owned_by(cfg.job) and p.usable
            and n not in cfg.spares and n not in names]
    if not held or not back:
        return decision
    name = back[0]
    action = Relabel(name, cfg.job, ((POOL_LABEL, cfg.spare_pool),), (OWNER_LABEL,),
                     f"{name} is back and job {cfg.job} runs on {held[0].name} of spare pool {cfg.spare_pool}: "
                     f"{name} goes to the pool in its place")
    return replace(decision, row="pool_return", actions=(*decision.actions, action),
                   summary=f"{decision.summary}; {action.reason}")


def keep(draft: Draft, before: Memory, decision: Decision) -> Decision:
    """A decision that does nothing, of the pool's keeper (one job at a time: `Observation.pool_keeper`):
    with the remake of a dead idle spare of the pool (row `spare_remake`, as a job's own spare):
    - an idle spare of the pool (its label, no job's) PREEMPTED or TERMINATED, made alone: journaled
      as one the keeper makes again (`Limp.pool_remaking`), then deleted;
    - one of those gone: created again from the keeper's [tpu.spec] with the pool's label and no
      job's, no sooner than `pool_remake_at` (a create that came to nothing tried again after
      recovery.backoff_base);
    - an idle VM of the pool Google deletes itself (termination action DELETE) gone with the audit
      log's word that Google preempted it: journaled so too, and created again as those are; gone
      with no such word within AUDIT_GRACE, a person deleted it: never made again (row `spare_gone`).
      Every job of the pool with a [tpu.spec] watches these, keeper or not: the one that becomes
      the keeper makes again those Google deleted while another kept the pool, or none did;
    - one of those back (READY, or on its way: CREATING) or no longer the pool's idle spare: done.
    A node of the pool neither a keeper nor Google deleted is never created."""
    cfg, now = draft.cfg, draft.now
    if not cfg.spare_pool or decision.ended or any(not isinstance(a, Wait) for a in decision.actions):
        return decision
    listed = {n.name: n for n in draft.obs.zone}
    limp = decision.memory.limp
    # the state dir's record, read by every keeper: a spare an earlier keeper (a job since ended,
    # or no longer the keeper) deleted is created by this one, so the pool keeps its size
    known = (*limp.pool_remaking, *(n for n in draft.obs.pool_remaking if n not in limp.pool_remaking)
             ) if draft.obs.pool_keeper else limp.pool_remaking
    if (still := still_remaking(cfg.spare_pool, known, listed)) != limp.pool_remaking:
        limp = replace(limp, pool_remaking=still, pool_remake_at=limp.pool_remake_at if still else None)
    # every job that may keep the pool watches its idle VMs Google may delete, so one that becomes
    # the keeper (the keeper ended) makes again those Google deleted before; the keeper alone says a
    # person's deletion (one voice for the pool, as one job acts for it)
    watches = draft.obs.pool_keeper or cfg.spares_remade
    limp, late = _google_word(draft, limp, listed) if watches else (replace(limp, pool_word=IdleWord()), [])
    late = late if draft.obs.pool_keeper else []
    made = limp.pool_remaking  # with those Google deleted, on its word
    action: RemakeSpare | None = None
    gone = [n for n in made if n not in listed]
    dead = [n for n in sorted(listed) if n not in made and idle_in(cfg.spare_pool, listed[n])
            and (node_condition(listed[n]) is Cond.DEAD or POOL_BAD_LABEL in listed[n].labels)
            and not listed[n].multislice_request]
    if draft.obs.pool_keeper and cfg.spares_remade:
        if gone and (limp.pool_remake_at is None or now >= limp.pool_remake_at):
            limp = replace(limp, pool_remake_at=now + timedelta(seconds=cfg.backoff_base))
            action = RemakeSpare(gone[0], True, f"{gone[0]}, a spare of pool {cfg.spare_pool}, is gone (deleted "
                                                "by a keeper to be made again, or by Google at its preemption): "
                                                f"creating it from {draft.cfg.spec_table} of job {cfg.job}, the pool's "
                                                "keeper, labelled the pool's", pool=cfg.spare_pool)
        elif dead:
            limp = replace(limp, pool_remaking=(*limp.pool_remaking, dead[0]))
            state = (f"marked {POOL_BAD_LABEL} (its launch-time checks failed)" if POOL_BAD_LABEL in listed[dead[0]].labels
                     else listed[dead[0]].state)
            action = RemakeSpare(dead[0], False, f"{dead[0]}, an idle spare of pool {cfg.spare_pool}, is "
                                                 f"{state} and will not come back by itself: job "
                                                 f"{cfg.job}, the pool's keeper, deletes it to create it again",
                                 pool=cfg.spare_pool)
    if limp == decision.memory.limp:
        return decision
    mem = replace(decision.memory, limp=limp)
    if action is None and late:
        return replace(decision, memory=mem, row="spare_gone",
                       summary=f"{decision.summary}; {', '.join(late)}, of spare pool {cfg.spare_pool}, gone with no "
                               "word from Google that it deleted it (no compute.instances.preempted in the audit log "
                               f"within {human(google.AUDIT_GRACE)}): a person deleted it; not made again")
    if action is None:
        return replace(decision, memory=mem)
    return replace(decision, memory=mem, row="spare_remake", actions=(*decision.actions, action),
                   summary=f"{decision.summary}; {action.reason}")


def _google_word(draft: Draft, limp: Limp, listed: Mapping[str, NodeSnapshot]) -> tuple[Limp, list[str]]:
    """The keeper's watch on the pool's idle VMs Google may delete itself (a Compute Engine VM's
    termination action DELETE, made alone): one gone is made again (`pool_remaking`) once the
    audit log says Google preempted it; one gone AUDIT_GRACE with no such word is a person's
    deletion, dropped (its name returned), never made again."""
    pool, was = draft.cfg.spare_pool, limp.pool_word
    deletes = [n for n, part in sorted(listed.items()) if idle_in(pool, part) and part.google_deletes
               and not part.multislice_request]
    seen = {n: listed.get(n) for n in (*was.deletes, *was.vanished, *deletes)}
    word, taken = google.idle_word(was, seen, deletes, seen.keys(), draft.obs.events, limp.pool_remaking,
                                   draft.cfg.spares_remade, draft.now)
    word, late = google.overdue(word, draft.now)
    return replace(limp, pool_word=word, pool_remaking=(*limp.pool_remaking, *(
        n for n in taken if n not in limp.pool_remaking))), late


def still_remaking(pool: str, names: Iterable[str], listed: Mapping[str, NodeSnapshot]) -> tuple[str, ...]:
    """Of the spares of `pool` tpuwatch deleted to make again, those not made yet: still on their
    way out (an idle spare of the pool, DELETING or dead) or gone (to create). One back (READY, or
    on its way: CREATING) or no longer the pool's idle spare is done with."""
    return tuple(n for n in names if (p := listed.get(n)) is None or (idle_in(pool, p) and (
        p.state == "DELETING" or node_condition(p) is Cond.DEAD or POOL_BAD_LABEL in p.labels)))


def unclaimable(node: NodeSnapshot) -> str:
    """Why an idle spare of a pool cannot be claimed now; "" when it can (READY+HEALTHY, not
    marked as failing its checks, and, a Compute Engine instance, not one whose metadata starts a
    job at boot)."""
    if bad := node.labels.get(POOL_BAD_LABEL):
        return f"failed its launch-time checks on job {bad}; the pool's keeper makes it again"
    if not node.usable:
        return node.state + (f"/{node.health}" if node.health and node.state == "READY" else "")
    if node.boots_job:  # an instance made by a person with the job's startup metadata
        return ("its metadata starts a job at boot (tpuwatch-command without tpuwatch-launch = \"false\"): a restart "
                "would run that job beside the claimer's; set tpuwatch-launch = \"false\" in its metadata")
    return ""


def said(pool: str, zone: tuple[NodeSnapshot, ...]) -> dict[str, tuple[str, str]]:
    """The pool's nodes as listed: name -> (the job that holds it, "" when idle; for an idle one,
    why it cannot be claimed now, "" when it can)."""
    return {n.name: (n.owner or "", "" if n.owner else unclaimable(n)) for n in sorted(zone, key=lambda n: n.name)
            if pool and n.labels.get(POOL_LABEL) == pool}
