"""Job priorities ([job] priority): a job that lost a slice, with no spare free and no limp,
takes a node of its shape from the job of lowest priority; that job is handed the first node of
the taker's own that comes back.

The cloud's labels are the truth both jobs read, so a hand-over survives a killed watcher and
works between watchers; each job journals each step before its label write, and every write
is idempotent (the tick sends none that changes nothing).
- want (H, row `take_wait`): H's slot has no usable node; H picks a READY+HEALTHY node of its
  accelerator type whose `tpuwatch-priority` is lower than its own (the lowest first) and
  writes `tpuwatch-wanted-by=H`, `tpuwatch-wanted-priority=<p_H>` on it, then waits.
- give (L, row `give`): L sees a node it holds wanted by a higher priority than its own. Bound
  to a slot: journaled as given, the attempt ends (a disruption, not charged; the stop is waited
  for, so a SIGTERM save lands) while the slot stays bound, so its workers are still probed; once
  no process of L is left there, the slot is journaled lent (bound to no node) and L relabels the
  node `tpuwatch-job=H`, `tpuwatch-lent-by=L`. L then goes on as after any lost slice:
  a spare, a limp, or it waits (row `lent_wait`), never stopping for a person.
- take (H, row `take`): the node labelled H's is in H's pool; H binds its lost slot to it, as a
  swap does. H never launches on a node whose ownership label is not its own.
- hand back (H, row `hand_back`): H's own node of that slot is READY+HEALTHY again: H relabels it
  `tpuwatch-job=L`, `tpuwatch-returned-by=H` (a trade: H stays on the node it took), and L binds
  its lent slot to it (row `lent_back`) and resumes from its own newest complete checkpoint.
- labels (row `priority_label`): the nodes a job holds carry its priority; a node it took and
  traded for carries no `tpuwatch-lent-by` any more, and one handed back to it no
  `tpuwatch-returned-by` once a slot of it runs there.
A job without a priority never takes and never gives. Ownership stays the guard: a node is
deleted or made again only by the job its label names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from tpuwatch.model import (
    IDLE_LABEL,
    LENT_BY,
    OWNER_LABEL,
    PRIORITY_LABEL,
    RETURNED_BY,
    WANTED_BY,
    WANTED_PRIORITY,
    NodeSnapshot,
    WorkerProbe,
)
from tpuwatch.policy import spares
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.ending import end_unusable
from tpuwatch.policy.limp import BRIEF_STATES, end_lost, foreign_stop, removed, stop_waited
from tpuwatch.policy.nodes import Cond, node_condition
from tpuwatch.policy.state import TERMINAL, Evidence, Memory, Phase, merge_evidence, move
from tpuwatch.policy.values import Decision, Relabel, StopWorkers, Wait

# A want whose label is not seen this many polls after it was written is written again (a
# watcher killed between its journal line and the write, or a write another one overwrote)
WANT_AGAIN = 3


def label_priority(node: NodeSnapshot, key: str = PRIORITY_LABEL) -> int | None:
    """The whole number a priority label holds, or None."""
    try:
        return int(node.labels.get(key, ""))
    except ValueError:
        return None


def wanted(node: NodeSnapshot) -> tuple[str, int] | None:
    """(job, priority) that asked for `node`, or None."""
    by, p = node.labels.get(WANTED_BY), label_priority(node, WANTED_PRIORITY)
    return (by, p) if by and p is not None else None


def _pool(draft: Draft, mem: Memory) -> tuple[list[tuple[str, NodeSnapshot]], dict[str, NodeSnapshot | None]]:
    """The slots' nodes as read (slot, part), and every node of the job's pool and zone by name."""
    node = draft.obs.node
    bound: list[tuple[str, NodeSnapshot]] = []
    if node is not None and node.slices:
        bound = [(slot, part) for slot, part in zip(mem.limp.slots(draft.cfg.slices), node.slices, strict=True)
                 if part.name]
    seen: dict[str, NodeSnapshot | None] = {n.name: n for n in draft.obs.zone}
    seen.update(dict(draft.obs.spares))
    seen.update({part.name: part for _, part in bound})
    return bound, seen


def lost_slots(draft: Draft, mem: Memory, lent: bool = False) -> list[tuple[str, NodeSnapshot | None]]:
    """The job's slots with no usable node (slot, its node as read; None: missing), a person's
    stop and a brief restart left alone; with `lent`, the slots it lent away too."""
    node, cfg = draft.obs.node, draft.cfg
    away = dict(mem.limp.lent)
    slots = mem.limp.slots(cfg.slices)
    if node is None or not node.slices:
        out: list[tuple[str, NodeSnapshot | None]] = [(s, None) for s in slots]
    else:
        if node_condition(node) is Cond.PERSON:
            return [(s, None) for s in slots if s in away] if lent else []
        parts = list(zip(slots, node.slices, strict=True))
        if any(p.state in BRIEF_STATES or foreign_stop(mem, s, p) for s, p in parts if not p.usable):
            return []
        # a node whose label names another job is not the job's to run on, however usable (a
        # late label write can hand it back for a moment: it is asked for again)
        guard = cfg.priority is not None
        out = [(s, p if p.name else None) for s, p in parts
               if not p.usable or (guard and p.name and not p.owned_by(cfg.job))]
    return [(s, p) for s, p in out if lent or s not in away]


def job_shapes(draft: Draft, mem: Memory) -> set[str]:
    """The accelerator types of the job's slices as read, else of its own nodes in the zone, else
    of its node as last seen (gone, and the job's only one: a VM Google deleted at its preemption,
    or one tpuwatch deleted to make again). What a job asks for, or claims from a spare pool."""
    node = draft.obs.node
    shapes = {p.accelerator_type for p in (node.slices if node is not None else ()) if p.accelerator_type and p.name}
    shapes = shapes or {n.accelerator_type for n in draft.obs.zone if n.owned_by(draft.cfg.job) and n.accelerator_type}
    return shapes or ({mem.google.shape} if node is None and mem.google.shape else set())


def _candidates(draft: Draft, mem: Memory) -> list[NodeSnapshot]:
    """Nodes the job may ask for, best first: READY+HEALTHY, of its shape, held by a job of lower
    priority, not asked for by one of higher or the same priority; the lowest priority first,
    the node asked for already before another, then an idle one (`tpuwatch-idle`) before one
    its job trains on."""
    cfg = draft.cfg
    assert cfg.priority is not None
    shapes = job_shapes(draft, mem)
    out = []
    for n in draft.obs.zone:
        p = label_priority(n)
        if (not n.usable or n.owner in (None, cfg.job) or p is None or p >= cfg.priority
                or (shapes and n.accelerator_type not in shapes) or not shapes or n.labels.get(LENT_BY)
                # (a Compute Engine instance whose metadata starts its job at boot: a restart
                # after the hand-over would run that job beside the taker's)
                or n.boots_job):
            continue
        w = wanted(n)
        if w is not None and w[0] != cfg.job and w[1] >= cfg.priority:
            continue
        out.append(n)
    return sorted(out, key=lambda n: (label_priority(n) or 0, n.name != mem.limp.wants,
                                      n.labels.get(IDLE_LABEL) != "true", n.name))


def want(draft: Draft, mem: Memory) -> Decision | None:
    """A job with a priority has slots with no usable node (no spare free, no limp): ask for a
    node of a job of lower priority (its labels), end the attempt (a disruption, not charged)
    and wait for the node to be handed over (row `take_wait`). None: no priority, nothing lost,
    or nothing to ask for."""
    cfg, now = draft.cfg, draft.now
    if cfg.priority is None:
        return None
    lost = lost_slots(draft, mem)
    # a node gone with no word that Google or tpuwatch removed it: a person's deletion, or one
    # the audit log has yet to speak of (rows google_delete_wait, node_missing), never a take
    if not lost or (draft.obs.node is None and not all(removed(draft, mem, s) for s, _ in lost)):
        return None
    found = _candidates(draft, mem)
    if not found:
        return None
    target = found[0]
    mem, final = end_lost(draft, mem, lost)
    if final is not None:
        return final
    asked = wanted(target) == (cfg.job, cfg.priority)
    recent = (mem.limp.wants == target.name and mem.limp.wants_at is not None
              and now - mem.limp.wants_at < timedelta(seconds=WANT_AGAIN * cfg.poll_interval))
    actions = []
    if not asked and not recent:
        mem = replace(mem, limp=replace(mem.limp, wants=target.name, wants_at=now))
        actions.append(Relabel(target.name, target.owner or "", ((WANTED_BY, cfg.job), (WANTED_PRIORITY, str(cfg.priority))),
                               (), f"job {cfg.job} (priority {cfg.priority}) asks job {target.owner} "
                                   f"(priority {label_priority(target)}) for {target.name}"))
    said = ", ".join(f"{mem.limp.node_of(s)} {p.state if p is not None else 'MISSING'}" for s, p in lost)
    why = (f"slice(s) lost ({said}) and no spare free: took {target.name} from job {target.owner} "
           f"(priority {label_priority(target)}, below this job's {cfg.priority}); waiting for it to be handed over")
    if mem.phase is not Phase.WAITING_NODE or mem.reason != why:
        mem = move(mem, Phase.WAITING_NODE, reason=why)
    return stop_waited(draft.out(mem, "take_wait", f"{why}; then the job relaunches there from its newest complete "
                                                   "checkpoint", *actions, Wait(None, "a node handed over")))


def take(draft: Draft, mem: Memory) -> Decision | None:
    """Slots with no usable node, and nodes of the job's pool free for them: a node another job
    lent it (labelled the job's, `tpuwatch-lent-by` that job) for any such slot (row `take`), or
    any free node of the pool for a slot the job lent away (row `lent_back`: a node handed back,
    or a spare). Journaled as a swap is, before any launch there; the lender is remembered for
    the hand-back. None: nothing to bind."""
    cfg = draft.cfg
    # and the slots lent while the job limps, left out (it grows back onto them)
    lost = [*lost_slots(draft, mem, lent=True),
            *((s, None) for s, _ in mem.limp.lent if s in mem.limp.out and mem.limp.node_of(s) == "")]
    if not lost or (cfg.priority is None and not mem.limp.lent):
        return None
    seen = dict(draft.obs.spares)
    # a node handed to another job that it lent to this one since (labelled so by it) is not
    # busy: that hand-back landed between two looks, and its entry is done with
    back = {n for n, _ in mem.limp.handing if (p := seen.get(n)) is not None and p.labels.get(LENT_BY, cfg.job) != cfg.job}
    busy = {n for n, _ in (*mem.limp.giving, *mem.limp.handing)} - back
    # a node asked for by a job of higher priority is given, never taken (a label write that
    # landed late can give it back to the lender for a moment)
    free = [n for n in spares.free(draft, mem, loans=True) if n not in busy and not _asked_above(seen.get(n), cfg.priority)]
    lender = {n: by for n in free if (part := seen.get(n)) is not None
              and (by := part.labels.get(LENT_BY, "")) and by != cfg.job}
    loans, own = [n for n in free if n in lender], [n for n in free if n not in lender]
    away = dict(mem.limp.lent)
    pairs: list[tuple[str, str]] = []
    for slot, _ in lost:
        pick = loans or (own if slot in away else [])
        if pick:
            pairs.append((slot, pick.pop(0)))
    if not pairs:
        return None
    taken = dict(pairs)
    gone = [(s, p) for s, p in lost if s in taken and s not in away]
    mem, final = end_lost(draft, mem, gone)
    if final is not None:
        return final
    took = [(n, lender[n]) for _, n in pairs if n in lender]
    on = set(taken.values())
    limp = replace(mem.limp, swapped=spares.bind(cfg.slices, mem.limp, pairs),
                   lent=tuple((s, j) for s, j in mem.limp.lent if s not in taken),
                   took=(*mem.limp.took, *took), wants="" if took else mem.limp.wants,
                   wants_at=None if took else mem.limp.wants_at,
                   handing=tuple((n, j) for n, j in mem.limp.handing if n not in on))
    mem = replace(mem, limp=limp)
    said = "; ".join(f"slice {cfg.slices.index(s)} ({s}) on {n}" + (f", taken from job {lender[n]}" if n in lender
                                                                      else f", its node lent to job {away[s]}")
                     for s, n in pairs)
    row = "take" if took else "lent_back"
    return stop_waited(draft.out(mem, row, f"{said}; the job relaunches there from its newest complete checkpoint"))


def give(draft: Draft, mem: Memory) -> Decision | None:
    """A job with a priority runs on a node a job of higher priority asked for. First (row
    `give`): journal the node as one it gives, end the attempt (a disruption, not charged) and
    stop it on every worker, waited for; the slot stays bound to the node, so its workers are
    still probed and nothing is launched there. Then, once no worker has a process of the job
    left: journal the slot lent (bound to no node) and relabel the node the taker's; while one
    has, stop again. None: nothing asked for, nor being given."""
    cfg = draft.cfg
    if cfg.priority is None:
        return None
    bound, _ = _pool(draft, mem)
    giving = dict(mem.limp.giving)
    asked = [(slot, part, w) for slot, part in bound
             if (w := wanted(part)) is not None and w[0] != cfg.job and w[1] > cfg.priority and part.owned_by(cfg.job)
             and part.usable and part.name not in giving]
    held = [(slot, part) for slot, part in bound if part.name in giving and part.owned_by(cfg.job)]
    if not asked and not held:
        return None
    if asked:
        sign = [Evidence(draft.now, f"slice {part.name} lent to job {w[0]} (priority {w[1]})") for _, part, w in asked]
        if mem.phase is Phase.RUNNING:
            mem = replace(mem, attempt=replace(mem.attempt, evidence=merge_evidence(mem.attempt.evidence, sign)))
        mem, final = end_unusable(draft, mem)
        if final is not None:
            return final
        mem = replace(mem, limp=replace(mem.limp, giving=(*mem.limp.giving, *((p.name, w[0]) for _, p, w in asked))))
        said = "; ".join(f"{part.name} (slice {cfg.slices.index(slot)}, {slot}) to job {w[0]} (priority {w[1]}, above "
                         f"this job's {cfg.priority})" for slot, part, w in asked)
        stop = () if any(isinstance(a, StopWorkers) for a in draft.actions) else (StopWorkers(f"lending {said}"),)
        return stop_waited(draft.out(mem, "give", f"lending {said}: a disruption, not charged; the job is stopped "
                                                  "there, then the node is handed over; it goes on as after a lost "
                                                  "slice", *stop))
    names = ", ".join(part.name for _, part in held)
    if not _stopped(draft.obs.probes):
        return stop_waited(draft.out(mem, "give", f"lending {names}: a process of the job may be left on its workers; "
                                                  "stopping it before the node is handed over",
                                     StopWorkers(f"lending {names}")))
    slots = {slot for slot, _ in held}
    swapped = {**dict(mem.limp.swapped), **{slot: "" for slot in slots}}
    limp = replace(mem.limp, swapped=tuple((s, swapped[s]) for s in cfg.slices if s in swapped),
                   lent=(*mem.limp.lent, *((slot, giving[part.name]) for slot, part in held)))
    mem = replace(mem, limp=limp)
    slot, part = held[0]
    to = giving[part.name]
    return draft.out(mem, "give", f"lending {names}: the job is stopped there; the slot is lent, bound to no node",
                     _give_label(cfg.job, part.name, to))


def _stopped(probes: Sequence[WorkerProbe] | None) -> bool:
    """Every worker answered, and none has a process of the job left."""
    return bool(probes) and all(p.state in ("absent", "exited") and not p.lingering for p in probes or ())


def _give_label(job: str, name: str, to: str) -> Relabel:
    return Relabel(name, job, ((OWNER_LABEL, to), (LENT_BY, job)),
                   (WANTED_BY, WANTED_PRIORITY, PRIORITY_LABEL, IDLE_LABEL, RETURNED_BY),
                   f"handing {name} to job {to}, which asked for it with a higher priority; no process of this job "
                   "is left there")


def _hand_label(name: str, job: str, to: str, reason: str) -> Relabel:
    """Hand `name`, held by `job`, to job `to`: a hand-back (row `hand_back`), the marks of a
    hand-over dropped."""
    return Relabel(name, job, ((OWNER_LABEL, to), (RETURNED_BY, job)),
                   (LENT_BY, WANTED_BY, WANTED_PRIORITY, PRIORITY_LABEL, IDLE_LABEL), reason)


def lent_wait(draft: Draft, mem: Memory) -> Decision | None:
    """Slots the job lent away, not left out, with no node free for them: wait (row
    `lent_wait`) for a node handed back or a spare, never stopping for a person."""
    away = [(s, j) for s, j in mem.limp.lent if s not in mem.limp.out and mem.limp.node_of(s) == ""]
    if not away:
        return None
    mem, final = end_unusable(draft, mem)
    if final is not None:
        return final
    why = "; ".join(f"slice {draft.cfg.slices.index(s)} ({s}) lent to job {j}" for s, j in away) + (
        ": waiting for a node handed back or a spare")
    if mem.phase is not Phase.WAITING_NODE or mem.reason != why:
        mem = move(mem, Phase.WAITING_NODE, reason=why)
    return draft.out(mem, "lent_wait", f"{why}; then the job resumes from its newest complete checkpoint",
                     Wait(None, "a node handed back"))


def relabel(draft: Draft, before: Memory, decision: Decision) -> Decision:
    """A decision that does nothing (the job runs on, or waits), with the label writes a job
    with a priority owes: a node it lends, once idle (row `give`); a node of its own back while
    it runs on one it took, or a node lent to it it does not run on (row `hand_back`); its
    priority on the nodes it holds, and no `tpuwatch-lent-by` left on one it traded for (row
    `priority_label`). One such step per decision, journaled with it."""
    cfg = draft.cfg
    if (cfg.priority is None and not before.limp.giving and not before.limp.handing) or decision.ended \
            or any(not isinstance(a, Wait) for a in decision.actions) \
            or (decision.memory.limp.swapped, decision.memory.limp.out) != (before.limp.swapped, before.limp.out):
        return decision
    mem = decision.memory
    bound, seen = _pool(draft, mem)
    held = {part.name for _, part in bound}
    job = cfg.job
    # the writes in flight: done once the label names the other job; dropped if the node went
    giving = tuple((n, to) for n, to in mem.limp.giving if (p := seen.get(n)) is not None and p.owned_by(job))
    handing = tuple((n, to) for n, to in mem.limp.handing if (p := seen.get(n)) is not None and p.owned_by(job))
    if (giving, handing) != (mem.limp.giving, mem.limp.handing):
        mem = replace(mem, limp=replace(mem.limp, giving=giving, handing=handing))
    out = replace(decision, memory=mem)
    if cfg.priority is None:
        return out
    # a node asked for by a higher priority that no slot holds: give it
    idle = [(n, p) for n, p in draft.obs.spares if p is not None and p.owned_by(job) and n not in held]
    for n, p in idle:
        w = wanted(p)
        if w is not None and w[0] != job and w[1] > cfg.priority and p.usable and n not in dict(giving):
            mem = replace(mem, limp=replace(mem.limp, giving=(*mem.limp.giving, (n, w[0]))))
            giving = mem.limp.giving
    pending = [(n, to) for n, to in giving if n not in held and (p := seen.get(n)) is not None and p.state == "READY"]
    if pending:
        n, to = pending[0]
        return _with(out, mem, "give", _give_label(job, n, to))
    # a node of the job's own back (its node, or one an earlier trade gave it; not a spare of
    # tpu.spares) while it runs on one it took: trade
    back = [(n, p) for n, p in idle if n not in cfg.spares and p.usable and n not in dict(handing)
            and not p.labels.get(LENT_BY)]
    trade = [(x, by) for x, by in mem.limp.took if x in held]
    if back and trade:
        (y, _), (x, by) = back[0], trade[0]
        mem = replace(mem, limp=replace(mem.limp, took=tuple(t for t in mem.limp.took if t != (x, by)),
                                        handing=(*mem.limp.handing, (y, by))))
        handing = mem.limp.handing
        return _with(out, mem, "hand_back", _hand_label(
            y, job, by,
            f"{y} is READY+HEALTHY again: handing it to job {by} for {x}, taken from it (the job stays on {x})"))
    # nothing lost any more (its own node back first): the node asked for is not wanted now
    if not lost_slots(draft, mem) and mem.limp.wants:
        asked = seen.get(mem.limp.wants)
        mem = replace(mem, limp=replace(mem.limp, wants="", wants_at=None))
        if asked is not None and asked.owner not in (None, job) and asked.labels.get(WANTED_BY) == job:
            return _with(out, mem, "priority_label", Relabel(
                asked.name, asked.owner or "", (), (WANTED_BY, WANTED_PRIORITY),
                f"the job no longer needs {asked.name} (its own node is back): no longer asking job {asked.owner}"))
        out = replace(out, memory=mem)
    # a node lent to the job that it does not run on, with nothing lost: back to its lender
    if not lost_slots(draft, mem):
        spare = [(n, p.labels[LENT_BY]) for n, p in idle if p.labels.get(LENT_BY) and p.labels[LENT_BY] != job
                 and n not in dict(handing)]
        if spare:
            n, by = spare[0]
            mem = replace(mem, limp=replace(mem.limp, handing=(*mem.limp.handing, (n, by))))
            handing = mem.limp.handing
            return _with(out, mem, "hand_back", _hand_label(
                n, job, by,
                f"{n} was lent to this job, which no longer needs it: handing it back to job {by}"))
    pend = [(n, to) for n, to in handing if (p := seen.get(n)) is not None and p.state == "READY"]
    if pend:
        n, to = pend[0]
        return _with(out, mem, "hand_back", _hand_label(
            n, job, to,
            f"handing {n} to job {to} (again: its label does not say so yet)"))
    # the job's priority on the nodes it holds, and whether it trains there (a taker asks for an
    # idle node first); no lender left on a node traded for
    took = dict(mem.limp.took)
    for p in (*(part for _, part in bound), *(p for _, p in idle)):
        if not p.owned_by(job) or p.state != "READY":
            continue
        put: list[tuple[str, str]] = []
        drop: list[str] = []
        if p.labels.get(PRIORITY_LABEL) != str(cfg.priority):
            put.append((PRIORITY_LABEL, str(cfg.priority)))
        if p.name in held and IDLE_LABEL in p.labels:
            drop.append(IDLE_LABEL)
        elif p.name not in held and p.labels.get(IDLE_LABEL) != "true":
            put.append((IDLE_LABEL, "true"))
        if p.labels.get(LENT_BY) and p.name in held and p.name not in took:
            drop.append(LENT_BY)
        if RETURNED_BY in p.labels and p.name in held:  # the hand-back is done once a slot runs there
            drop.append(RETURNED_BY)
        if put or drop:
            said = [*(f"{k}={v}" for k, v in put), *(f"-{k}" for k in drop)]
            return _with(out, mem, "priority_label", Relabel(
                p.name, job, tuple(put), tuple(drop),
                f"{p.name} is held by job {job} (priority {cfg.priority}, "
                f"{'a slot runs on it' if p.name in held else 'idle'}): {', '.join(said)}"))
    return out


def ended(draft: Draft, decision: Decision) -> Decision:
    """A decision that leaves the job DONE or FAILED while it holds nodes it took from a job of
    lower priority (its own lost node not yet back to trade): each still labelled its own goes
    back to its lender (row `hand_back`), after the job's workers are stopped (waited for); the
    watch ends, and the lender would otherwise wait for a hand-back that never comes. The
    terminal row repeats it until the labels say so."""
    mem, job = decision.memory, draft.cfg.job
    if mem.phase not in TERMINAL or not mem.limp.took:
        return decision
    _, seen = _pool(draft, mem)
    back = [(x, by) for x, by in mem.limp.took if (p := seen.get(x)) is not None and p.owned_by(job)]
    if not back:
        return decision
    writes = tuple(_hand_label(x, job, by, f"the job has ended: handing {x}, taken from job {by}, back to it")
                   for x, by in back)
    stops = tuple(replace(a, wait=True) if isinstance(a, StopWorkers) else a for a in decision.actions)
    return replace(decision, actions=(*stops, *writes),
                   summary=f"{decision.summary}; " + "; ".join(w.reason for w in writes))


def _asked_above(node: NodeSnapshot | None, priority: int | None) -> bool:
    w = wanted(node) if node is not None else None
    return w is not None and priority is not None and w[1] > priority


def _with(decision: Decision, mem: Memory, row: str, action: Relabel) -> Decision:
    return replace(decision, memory=mem, row=row, actions=(*decision.actions, action),
                   summary=f"{decision.summary}; {action.reason}")



def said(mem: Memory) -> list[str]:
    """What the job took, lent, asked for and hands over, and why, one line each, for people
    (`status`, `check --json`)."""
    limp = mem.limp
    return [*(f"slice {slot} lent to job {to}, which asked for its node with a higher priority; waiting for a node "
              "handed back or a spare" for slot, to in limp.lent),
            *(f"runs on {node}, taken from job {by} of a lower priority (its own node was lost); {node} is traded "
              f"for its own node once that is back" for node, by in limp.took),
            *(f"asked for {limp.wants} (tpuwatch-wanted-by), a node of a job of lower priority" for _ in (1,)
              if limp.wants),
            *(f"handing {node} to job {to} (lent to it; the label write is repeated until it says so)"
              for node, to in limp.giving),
            *(f"handing {node} back to job {to} (the node it lent this job was kept)" for node, to in limp.handing)]
