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

from dataclasses import replace

from tpuwatch.model import OWNER_LABEL, NodeSnapshot
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.limp import end_lost, stop_waited
from tpuwatch.policy.priority import lost_slots
from tpuwatch.policy.state import Memory, Phase, move
from tpuwatch.policy.values import Decision, Relabel, Wait

POOL_LABEL = "tpuwatch-pool"


def idle_in(pool: str, node: NodeSnapshot) -> bool:
    """`node` is an idle spare of spare pool `pool`: its pool label, and no job's."""
    return bool(pool) and node.labels.get(POOL_LABEL) == pool and node.owner is None


def _shapes(draft: Draft) -> set[str]:
    node = draft.obs.node
    shapes = {p.accelerator_type for p in (node.slices if node is not None else ()) if p.accelerator_type and p.name}
    return shapes or {n.accelerator_type for n in draft.obs.zone if n.owned_by(draft.cfg.job) and n.accelerator_type}


def claim(draft: Draft, mem: Memory) -> Decision | None:
    """A job of a spare pool has slots with no usable node (none of its own spares free, `swap`
    came first): claim an idle READY+HEALTHY spare of the pool of the job's accelerator type (the
    first by name) for the first such slot, and wait for the label to say so (row `pool_claim`).
    None: no pool, nothing lost, or no spare of the pool free."""
    cfg = draft.cfg
    if not cfg.spare_pool:
        return None
    lost = lost_slots(draft, mem)
    shapes = _shapes(draft)
    found = sorted((n for n in draft.obs.zone if idle_in(cfg.spare_pool, n) and n.usable
                    and (not shapes or n.accelerator_type in shapes)), key=lambda n: n.name)
    if not lost or not found:
        return None
    target = found[0]
    mem, final = end_lost(draft, mem, [(s, p) for s, p in lost if p is not None])
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


def said(pool: str, zone: tuple[NodeSnapshot, ...]) -> dict[str, str]:
    """The pool's nodes as listed: name -> "" (idle) or the job that holds it."""
    return {n.name: n.owner or "" for n in sorted(zone, key=lambda n: n.name)
            if pool and n.labels.get(POOL_LABEL) == pool}
