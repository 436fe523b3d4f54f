"""Stops owed on the nodes a job moved off: never two attempts of one job alive at once.

A decision that moves a job off a node it ran on (a swap onto a spare, a move ahead of a
maintenance, a slice left out, a node lent to another job) stops the job there, then launches
elsewhere. The move is journaled before the stop is sent: a watcher killed in between would
leave the older attempt running on the node it left (a MIG's VMs still running beside its
preempted one; a node moved off before its maintenance, whole and READY), while the next tick
launches on the new one. So each such node is owed a stop (`Limp.unstopped`), journaled with the
move, until the tick has done one there (`stopped`); until then every decision stops the job
there first (`carry`). A decision that would launch does those stops alone first, waited for
(`Decision.stop_first`), and launches only once they are done: one that failed (a worker of a
node still READY did not answer, or did not stop) holds the launch (`held`, row
`owed_stop_failed`) and is tried again the next tick, as a launch waits for every worker of the
job's own node to answer. An owed node that no longer runs anything of the job (it cannot be
reached, is gone or made again, holds a slot of the job again) or that the job no longer owns
(lent, claimed: a stop there would also stop the device holders of the job now on it) is dropped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeGuard

from tpuwatch.model import NodeSnapshot
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.state import Memory
from tpuwatch.policy.values import Action, Decision, Launch, StartMaintenance, StopWorkers, Wait

# The hold's wait: its journal event (once, as the row changes) is alert `stop_failed`
STOP_FAILED_WAIT = "the stop owed on a node the job moved off"


def carry(draft: Draft, before: Memory, decision: Decision) -> Decision:
    """`decision` with the stops it owes: the nodes it moves the job off that its own stop of the
    job's workers settles, journaled as owed with it; and, before its other actions, a stop on
    each node an earlier move still owes one (the watcher stopped before that move's stop)."""
    cfg = draft.cfg
    if not cfg.slices:
        return decision
    after = decision.memory.limp
    kept = set(after.kept(cfg.slices))
    seen = _seen(draft, before)
    left = [n for n in before.limp.kept(cfg.slices) if n not in kept and _runs(seen.get(n), cfg.job)]
    owed = [n for n in after.unstopped if n not in kept and n not in left and _runs(seen.get(n), cfg.job)]
    settle = left if any(_stops_job(a) for a in decision.actions) else []
    if not (owed or settle or after.unstopped):
        return decision
    # waited for only before a launch (or a maintenance) that needs it gone, in this decision or
    # the one the tick makes after it: a tick that only follows the job elsewhere is not held up
    # by a node that is slow to answer
    wait = (decision.probe_after or decision.decide_again
            or any(isinstance(a, (Launch, StartMaintenance)) for a in decision.actions))
    # one whose stop failed in this tick is tried again the next (the launch is held meanwhile)
    tried = set(draft.obs.owed_stop_failed)
    first = tuple(StopWorkers(f"the job moved off {n}; the stop there is not done yet (the watcher stopped first, "
                              "or the stop failed)", wait=wait, node=n, settles=(n,)) for n in owed if n not in tried)
    actions = (*first, *(replace(a, settles=tuple(settle)) if settle and _stops_job(a) else a
                         for a in decision.actions))
    summary = decision.summary + (f"; first stopping the older attempt still on {', '.join(a.node for a in first)}"
                                  if first else "")
    mem = replace(decision.memory, limp=replace(after, unstopped=tuple(dict.fromkeys((*owed, *settle)))))
    launches = any(isinstance(a, Launch) for a in decision.actions)
    return replace(decision, actions=actions, memory=mem, summary=summary, stop_first=launches and bool(first))


def held(draft: Draft, mem: Memory) -> Decision | None:
    """Before a launch: a node the job moved off whose owed stop failed in this tick may still run
    the older attempt (it is READY and the job's): launch nothing until a stop there is done
    (row `owed_stop_failed`). None: no such node."""
    seen, kept = _seen(draft, mem), set(mem.limp.kept(draft.cfg.slices))
    failed = [n for n in mem.limp.unstopped if n in draft.obs.owed_stop_failed and n not in kept
              and _runs(seen.get(n), draft.cfg.job)]
    if not failed:
        return None
    return draft.out(mem, "owed_stop_failed",
                     f"the job moved off {', '.join(failed)}, and the stop there failed (a worker did not answer, or "
                     "did not stop) while it is still READY and the job's: the older attempt may still run there; "
                     "launching nothing until a stop there is done (tried again next tick)",
                     Wait(None, STOP_FAILED_WAIT))


def stopped(mem: Memory, nodes: tuple[str, ...]) -> Memory:
    """The memory once the tick has stopped the job on `nodes` (a StopWorkers' `settles`)."""
    left = tuple(n for n in mem.limp.unstopped if n not in nodes)
    return mem if left == mem.limp.unstopped else replace(mem, limp=replace(mem.limp, unstopped=left))


def _stops_job(action: Action) -> TypeGuard[StopWorkers]:
    """`action` stops the job on the nodes it runs on (not on another node), and can."""
    return isinstance(action, StopWorkers) and not action.node and not action.blocked


def _runs(part: NodeSnapshot | None, job: str) -> bool:
    """Something of the job may still run on `part`: it can be reached and is still the job's."""
    return part is not None and part.reachable and part.owned_by(job)


def _seen(draft: Draft, mem: Memory) -> dict[str, NodeSnapshot | None]:
    """The pool's nodes as this tick read them, by name: the job's slices, those left out, spares."""
    obs = draft.obs
    seen: dict[str, NodeSnapshot | None] = dict(obs.spares)
    seen.update((mem.limp.node_of(slot), part) for slot, part in zip(mem.limp.out, obs.left_out, strict=False))
    if obs.node is not None:
        seen.update((p.name, p) for p in obs.node.slices or (obs.node,))
    return seen
