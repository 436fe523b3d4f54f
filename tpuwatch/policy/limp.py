"""Limping: a multislice job that can train on fewer slices ([job] min_slices) runs on the
slices left when one is lost, and grows back onto it at its next complete checkpoint.

Rows `limp`, `grow_wait`, `grow`. The slices left out are the memory's (`Memory.limp.out`),
journaled with the decision that leaves them out, before anything is launched without them; the
tick then builds the job's node from the slices kept (`Observation.node`) and reads the others
apart (`Observation.left_out`), so every other row judges only the slices the job runs on.
Limping itself never deletes or creates: a lost slice comes back by itself (a repair, Google's
own autorepair) or through a person; one that never will, of a job whose multislice queued
resource can be made again, is taken back at a checkpoint for the rows to recreate the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tpuwatch.model import NodeSnapshot
from tpuwatch.policy import google
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.ending import end_unusable, finish
from tpuwatch.policy.nodes import Cond, node_condition
from tpuwatch.policy.state import Evidence, Memory, Phase, merge_evidence
from tpuwatch.policy.values import Decision, StopWorkers, Wait

# A slice in these states is back within minutes (Google restarts a multislice request's other
# slices once a lost one is back): less than a limp and the grow back would cost; waited for.
BRIEF_STATES = frozenset({"RESTARTING"})


def foreign_stop(mem: Memory, slot: str, part: NodeSnapshot) -> bool:
    """The node slot `slot` runs on is a Compute Engine VM stopping that tpuwatch is not deleting
    to make again: a Spot preemption (it ends TERMINATED) or a person's instances.delete (it ends
    gone), waited for (row `spot_stopping`). One tpuwatch deletes (Compute Engine shows a delete
    as STOPPING) is lost."""
    return part.stopping and mem.limp.node_of(slot) not in mem.limp.remaking


def shift(draft: Draft, mem: Memory) -> Decision | None:
    """Leave lost slices out (`limp`), or take back the slices that are back (`grow`); None when
    the job's slices stay as they are. A slice left out that a person deleted since stops the job
    for a person, as one it runs on does."""
    if gone := deleted_left_out(draft, mem):
        return person_deleted(draft, mem, gone)
    if mem.limp.out and (d := grow(draft, mem)) is not None:
        return d
    return limp(draft, mem)


def deleted_left_out(draft: Draft, mem: Memory) -> list[tuple[str, NodeSnapshot]]:
    """The slices left out while the job limps that are gone with no word that Google or tpuwatch
    removed them: a person deleted them (neither grown back onto, nor swapped for a spare)."""
    return [(slot, gone_node(mem.limp.node_of(slot))) for slot, part in zip(mem.limp.out, draft.obs.left_out, strict=True)
            if part is None and slot in draft.cfg.slices and not removed(draft, mem, slot)]


def limp(draft: Draft, mem: Memory) -> Decision | None:
    """Slices the job runs on are not READY+HEALTHY, and at least min_slices others are: end the
    attempt (a disruption, not charged) and leave the lost slices out; the launch that follows
    runs on the slices left. A node a person stopped is left alone (the job pauses), and a slice
    that restarts is waited for (BRIEF_STATES)."""
    cfg, node, now = draft.cfg, draft.obs.node, draft.now
    if not cfg.min_slices or node is None or not node.slices or node_condition(node) in (Cond.USABLE, Cond.PERSON):
        return None
    names = mem.limp.slots(cfg.slices)
    lost = [(name, part) for name, part in zip(names, node.slices, strict=True) if not part.usable]
    left = len(names) - len(lost)
    if (not lost or left < cfg.min_slices or any(part.state in BRIEF_STATES or foreign_stop(mem, name, part)
                                                  for name, part in lost)
            or any(name in mem.limp.recreate for name, _ in lost)):  # taken back to be made again
        return None
    # a slice gone with no word that Google or tpuwatch removed it: a person deleted it, perhaps to
    # stop the job; the job stops for a person rather than train on without it (as a swap does)
    if vanished := [(name, part) for name, part in lost if part.state == "MISSING" and not removed(draft, mem, name)]:
        return person_deleted(draft, mem, vanished)
    said = ", ".join(f"{name} {part.state}" + (f"/{part.health}" if part.health and part.state == "READY" else "")
                     for name, part in lost)
    mem, final = end_lost(draft, mem, lost)
    if final is not None:
        return final
    out = (*mem.limp.out, *(name for name, _ in lost))
    mem = replace(mem, limp=replace(mem.limp, out=out, since=mem.limp.since or now, back_since=None, back_step=None))
    return _out(draft, mem, "limp", f"slice(s) lost ({said}): limping on {left} of {len(cfg.slices)} slices "
                                    f"(job.min_slices {cfg.min_slices}), {', '.join(out)} left out; the job "
                                    "relaunches on the slices left from its newest complete checkpoint")


def end_lost(draft: Draft, mem: Memory, lost: Sequence[tuple[str, NodeSnapshot | None]]) -> tuple[Memory, Decision | None]:
    """End the running attempt (a disruption, not charged) for the slots `lost` (each with its
    node as read; None: gone, as a VM Google deleted is when the watcher missed its stop),
    naming each node lost in its evidence; the memory as it is while none runs, or with none
    lost. A slot bound to no node (lent away) ran nothing to end."""
    read = [(slot, part if part is not None else gone_node(mem.limp.node_of(slot))) for slot, part in lost
            if part is not None or mem.limp.node_of(slot)]
    if mem.phase is not Phase.RUNNING or not read:
        return mem, None
    sign = [Evidence(draft.now, f"slice {mem.limp.node_of(slot)} lost ({part.state})") for slot, part in read]
    mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, sign)))
    return end_unusable(draft, mem)


def removed(draft: Draft, mem: Memory, slot: str) -> bool:
    """Whether the node slot `slot` runs on, found gone, was removed by Google or tpuwatch: one
    tpuwatch deletes to make again, a slice of a multislice queued resource (Google's autorepair
    replaces it), a node whose queued resource the service took back, a VM Google says it deleted
    (policy/google.py); a slot lent to another job is bound to none (policy/priority.py). Anything
    else gone was deleted by a person."""
    cfg, name = draft.cfg, mem.limp.node_of(slot)
    return (not name or name in mem.limp.remaking or (bool(cfg.queued_resource) and len(cfg.slices) > 1)
            or (draft.obs.queued is not None and draft.obs.queued.ended) or bool(google.deleted(draft, mem)))


def person_deleted(draft: Draft, mem: Memory, deleted: Sequence[tuple[str, NodeSnapshot]]) -> Decision:
    """Slices the job runs on are gone and neither Google nor tpuwatch removed them (slices made
    one by one): a person deleted them, perhaps to stop the job. As for a job on one node (row
    `node_missing`), the attempt ends and a person decides; no spare is swapped in, and a job
    that may limp does not limp around them."""
    mem, final = end_lost(draft, mem, deleted)
    if final is not None:
        return final
    said = ", ".join(f"slice {draft.cfg.slices.index(slot)} ({slot}) on {mem.limp.node_of(slot)}"
                     for slot, _ in deleted)
    return draft.halt(mem, "node_missing",
                      f"{said} is missing in {mem.zone} and tpuwatch did not delete it: a person did; tpuwatch never "
                      "swaps a spare in for, nor limps around, a node a person deleted. Create it again (or take it "
                      "out of tpu.names) and run tpuwatch again",
                      tuple(f"nodes/{mem.limp.node_of(slot)}: not found" for slot, _ in deleted))


def gone_node(name: str) -> NodeSnapshot:
    """Node `name` as a slot's node that is gone."""
    return NodeSnapshot(name=name, project="", zone="", id="", create_time=None, state="MISSING", health="",
                        health_description="", maintenance_time=None)


def returning(draft: Draft, mem: Memory) -> tuple[list[str], list[str]]:
    """The slices left out to take back: those READY+HEALTHY again, and those that will not come
    back by themselves (PREEMPTED, TERMINATED) when the job's queued resource can be made again as
    a whole (the rows then recreate it: limping on without them would last for good)."""
    back, dead = [], []
    for name, part in zip(mem.limp.out, draft.obs.left_out, strict=True):
        if part is not None and part.usable:
            back.append(name)
        elif draft.cfg.recreatable and part is not None and node_condition(part) is Cond.DEAD:
            dead.append(name)
    return back, dead


def grow(draft: Draft, mem: Memory) -> Decision | None:
    """Slices left out are READY+HEALTHY again, or dead in a job that can be recreated. While an
    attempt runs on the others, wait for its next complete checkpoint (`back_step` marks the one
    before), then end it (not charged) and take them back; with no attempt running, take them
    back at once. A dead one taken back is then recreated by the rows (`dead_node`), not limped
    around again (`Limp.recreate`). None: not yet."""
    cfg, now, ckpt = draft.cfg, draft.now, draft.obs.checkpoint
    healed, dead = returning(draft, mem)
    back = healed + dead
    gone = [name for name in mem.limp.out if name not in cfg.slices]  # no longer one of the job's (config edited)
    if not back and not gone:
        return None
    view = draft.obs.node
    if mem.phase is Phase.RUNNING and back and not gone:
        n = mem.attempt.number
        if view is None or not view.usable or not all(p.state == "running" and p.attempt == n
                                                      for p in draft.obs.probes or ()):
            return None  # the attempt ended, or its slices went down too: that is decided first
        if mem.limp.back_since is None:
            return None  # `track` notes it first; the attempt trains on
        saved = ckpt is not None and (mem.limp.back_step is None or ckpt.step > mem.limp.back_step)
        if not saved and not undone(draft, mem):
            return None
        sign = Evidence(now, f"stopped by tpuwatch to grow back onto {', '.join(back)} (checkpoint step {ckpt.step})"
                        if ckpt is not None else f"stopped by tpuwatch to grow back onto {', '.join(back)}")
        mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, [sign])))
        mem, line, final = finish(draft, mem, {p.worker: None for p in draft.obs.probes or ()}, reachable=True)
        if final is not None:
            return final
        draft.notes.append(line)
    out = tuple(name for name in mem.limp.out if name not in back and name not in gone)
    mem = replace(mem, limp=replace(mem.limp, out=out, since=mem.limp.since if out else None, back_since=None,
                                    back_step=None, recreate=(*mem.limp.recreate, *dead)))
    runs = len(cfg.slices) - len(out)
    where = f"{runs} of {len(cfg.slices)} slices" if out else f"all {runs} slices"
    why = "; ".join([*([f"{', '.join(healed)} READY+HEALTHY again"] if healed else []),
                     *([f"{', '.join(dead)} will not come back by itself: taken back for {draft.subject} to be "
                        "recreated as a whole"] if dead else []),
                     *([f"{', '.join(gone)} no longer in tpu.names"] if gone else [])])
    return _out(draft, mem, "grow", f"{why}: growing back onto {where}; the job relaunches on them from its "
                                    "newest complete checkpoint")


def undone(draft: Draft, mem: Memory) -> bool:
    """The running attempt limps, has saved no checkpoint yet, and is younger than (n-k)/n of the
    job's checkpoint interval (`hang.ckpt_gap`, the longest seen): growing back now discards its
    few minutes on k of n slices, less than the (n-k)/n of an interval limping on to its first
    checkpoint would lose. So a limp whose slice is back within minutes (a short heal) is undone
    at once, and cost about what waiting for the slice would have."""
    cfg, ckpt, gap, start = draft.cfg, draft.obs.checkpoint, mem.hang.ckpt_gap, mem.attempt.start
    if gap <= 0 or start is None or not mem.limp.out or not cfg.slices:
        return False
    if ckpt is not None and (mem.attempt.start_step is None or ckpt.step > mem.attempt.start_step):
        return False  # it saved progress: grown back at its next checkpoint
    left = len(mem.limp.out) / len(cfg.slices)
    return (draft.now - start).total_seconds() < left * gap


def track(draft: Draft, mem: Memory) -> Memory:
    """While the job limps: when a slice left out is first seen back, the newest checkpoint step
    then (the job grows back at the next one); forgotten when none is back any more."""
    view = draft.obs.node
    if mem.limp.recreate and view is not None and view.usable:  # made again: limped around as any slice
        mem = replace(mem, limp=replace(mem.limp, recreate=()))
    if not mem.limp.out:
        return mem
    healed, dead = returning(draft, mem)
    back = bool(healed or dead)
    if back and mem.limp.back_since is None and mem.phase is Phase.RUNNING:
        ckpt = draft.obs.checkpoint
        return replace(mem, limp=replace(mem.limp, back_since=draft.now,
                                         back_step=ckpt.step if ckpt is not None else None))
    if not back and mem.limp.back_since is not None:
        return replace(mem, limp=replace(mem.limp, back_since=None, back_step=None))
    return mem


def grow_wait(draft: Draft, mem: Memory, decision: Decision) -> Decision:
    """A steady running decision while a slice left out is back: the same, under row `grow_wait`,
    not steady, so the next checkpoint is looked for every sixth of a poll (loop.next_delay):
    the checkpoint interval hang detection learns is sampled at the poll, too coarse to wait on."""
    if decision.row != "running" or mem.limp.back_since is None:
        return decision
    after = f"newer than step {mem.limp.back_step}" if mem.limp.back_step is not None else "its first"
    healed, dead = returning(draft, mem)
    said = "; ".join([*([f"{', '.join(healed)} back: growing onto it"] if healed else []),
                      *([f"{', '.join(dead)} will not come back by itself: taking it back for the request to be "
                         "recreated"] if dead else [])])
    return replace(decision, row="grow_wait",
                   summary=f"{decision.summary}; {said} at the next complete checkpoint ({after})",
                   actions=(*decision.actions, Wait(None, "the next checkpoint, to grow back")))


def _out(draft: Draft, mem: Memory, row: str, summary: str) -> Decision:
    return stop_waited(draft.out(mem, row, summary))


def stop_waited(d: Decision) -> Decision:
    """The decision, its stop waited for: the tick looks at the slices the job runs on again and
    launches there."""
    return replace(d, actions=tuple(replace(a, wait=True) if isinstance(a, StopWorkers) else a for a in d.actions))
