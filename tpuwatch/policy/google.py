"""Google's own stops of a VM made through Compute Engine, told from a person's.

Compute Engine stops a VM itself on a host error and on a host maintenance it does not migrate
(audit `compute.instances.hostError`, `compute.instances.terminateOnHostMaintenance`): TERMINATED,
which reads as a person's stop until that entry is read. Then it is a repair, waited for up to
repair_timeout (rows `google_stopped_wait`, `google_stopped_start`): Compute Engine restarts it
itself with `automaticRestart`; without, tpuwatch starts it again once (`instances.start`), and
recreates it if it does not run again by repair_timeout. No entry (a person's `instances.stop`
is in the admin activity log, not among the system events; `compute.instances.guestTerminate`
is the guest's own shutdown) leaves it a person's stop.

Google deletes a VM itself when its termination action is DELETE: a Spot VM at its preemption
(audit `compute.instances.preempted`), any VM at the end of its run (flex-start, `maxRunDuration`,
`terminationTime`). Such a deletion is a disruption: the VM is made again from the saved spec
(row `google_deleted`), within max_recreates, never charged to max_restarts. Google's word is the
audit log's preemption entry, or the run's end as last read, passed. A sighting of the VM going
is not: a person's `instances.delete` of such a VM shows the same (STOPPING, and with a graceful
shutdown `shutdownDetails.targetState` DELETED) and writes nothing to the system-event log. So a
VM seen going is only waited for (row `google_deleting`); once gone, with no word yet, it is
waited for up to AUDIT_GRACE for the audit log to say (row `google_delete_wait`), then taken for
a person's deletion (row `node_missing`).

`seen` keeps what the sightings and the audit log said in `Memory.google`, since the VM may be
gone by the next tick, which under cron `check` is another process. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.model import AuditEvent, NodeSnapshot
from tpuwatch.policy.draft import Draft
from tpuwatch.policy.state import GoogleStop, IdleWord, Memory

PREEMPTED = "compute.instances.preempted"
# Compute Engine's own stops of a VM (a Spot VM's preemption is PREEMPTED, never restarted)
STOPPED_BY_GOOGLE = ("compute.instances.hostError", "compute.instances.terminateOnHostMaintenance")
# The node states a person's stop reads as (policy/nodes.py PERSON_STATES, as Compute Engine shows them)
STOP_STATES = frozenset({"STOPPED", "STOPPING"})
# Logging may show an entry after the VM it is about is gone (Google does not say how late; it is
# seconds to a minute as a rule): a VM Google may delete, missing with no word yet, is given this
# long before it is taken for a person's deletion.
AUDIT_GRACE = 180.0


def seen(draft: Draft, mem: Memory) -> Memory:
    """Memory that knows this tick's sighting of the node and the audit log's preemptions of it."""
    node, g = draft.obs.node, mem.google
    names = watched(draft, mem)
    if node is not None and not node.google_deletes:
        if node.usable:
            g = GoogleStop()  # nothing to keep: up, and Google does not delete it (most nodes are such)
        else:
            if node.id != g.node_id:
                g = GoogleStop(node_id=node.id)
            g = replace(g, created=node.create_time, owned=node.owned_by(draft.cfg.job), shape=node.accelerator_type)
            if node.state in STOP_STATES and g.stopped_since is None:
                g = replace(g, stopped_since=draft.now)
            booted = mem.boot.booted_at or node.create_time
            for ev in draft.obs.events:
                if (not g.stopped and ev.node in names and ev.method.endswith(STOPPED_BY_GOOGLE)
                        and (booted is None or ev.time >= booted)):
                    g = replace(g, stopped=f"audit {ev.method} at {ev.time.isoformat()}")
    elif node is not None:
        if node.id != g.node_id:
            g = GoogleStop(node_id=node.id)  # another VM: nothing said of the last one holds for it
        g = replace(g, created=node.create_time, owned=node.owned_by(draft.cfg.job), deletes=node.google_deletes,
                    deletes_at=node.google_deletes_at, missing_since=None, shape=node.accelerator_type,
                    going_since=(g.going_since or draft.now) if node.google_deleting else None)
    for ev in draft.obs.events:
        if (g.deletes and not g.deleted and ev.node in names and ev.method.endswith(PREEMPTED)
                and (g.created is None or ev.time >= g.created)):
            g = replace(g, deleted=f"audit {ev.method} at {ev.time.isoformat()}")
    if node is None and g.node_id and g.missing_since is None:
        g = replace(g, missing_since=draft.now)
    return mem if g == mem.google else replace(mem, google=g)


def watched(draft: Draft, mem: Memory) -> frozenset[str]:
    """The names the audit log calls the job's node by: its own, or for a job on one node with
    spares (a pool of one slot) the node its slot is bound to (a spare in its place)."""
    cfg = draft.cfg
    bound = mem.limp.node_of(cfg.slices[0]) if len(cfg.slices) == 1 else ""
    return frozenset({bound or cfg.tpu_name})


def deleted(draft: Draft, mem: Memory) -> str:
    """Why the missing node is Google's deletion ("" when nothing says so)."""
    g = mem.google
    if not g.deletes:
        return ""
    if g.deleted:
        return g.deleted
    if g.deletes_at is not None and draft.now >= g.deletes_at:
        return f"its run ended at {g.deletes_at.isoformat()} (termination action DELETE)"
    return ""


def going(draft: Draft, mem: Memory) -> str:
    """What shows Google deleting the VM now ("" when nothing does): its word, or the sighting of
    it going, which is enough to wait for it to be gone, never to make it again (a person's delete
    looks alike)."""
    node = draft.obs.node
    sighting = node.google_deleting if node is not None and node.id == mem.google.node_id else ""
    return deleted(draft, mem) or (f"seen going: {sighting}" if sighting else "")


def going_until(draft: Draft, mem: Memory) -> datetime | None:
    """Until when to wait for a VM Google is deleting to be gone; None once waited AUDIT_GRACE
    (a Spot VM with DELETE that a person stopped stays TERMINATED: with no preemption in the
    audit log it is then a person's stop, left alone; with one, deleted and made again)."""
    since = mem.google.going_since or draft.now
    until = since + timedelta(seconds=AUDIT_GRACE)
    return until if draft.now < until else None


def word_due(draft: Draft, mem: Memory) -> datetime | None:
    """Until when to wait for the audit log's word on a missing VM that Google may delete; None
    when not waiting (a VM Google never deletes, not the job's, or waited long enough)."""
    g = mem.google
    if not (g.deletes and g.owned) or g.missing_since is None:
        return None
    until = g.missing_since + timedelta(seconds=AUDIT_GRACE)
    return until if draft.now < until else None


def stopped(draft: Draft, mem: Memory) -> str:
    """Why the stopped node is Compute Engine's own stop ("" when nothing says so: a person's)."""
    node = draft.obs.node
    return mem.google.stopped if node is not None and node.id == mem.google.node_id else ""


def stop_word_due(mem: Memory, now: datetime) -> bool:
    """A stopped VM with no word yet on who stopped it, first seen so within AUDIT_GRACE: the
    audit log is worth reading often (policy/observe.py)."""
    g = mem.google
    return not g.stopped and (g.stopped_since is None or (now - g.stopped_since).total_seconds() < AUDIT_GRACE)


def idle_word(was: IdleWord, seen: Mapping[str, NodeSnapshot | None], deletes: Iterable[str],
              names: Collection[str], events: Iterable[AuditEvent], remaking: Collection[str], remade: bool,
              now: datetime) -> tuple[IdleWord, list[str]]:
    """What idle VMs Google may delete itself have shown this tick, and those of them to make
    again. `seen`: the watched names as read (None: gone); `deletes`: those seen so now (termination
    action DELETE, owned, made alone); `names`: those whose preemption in the audit log counts (a
    node the job ran on until this tick too); `remaking`: those already being made again. One last seen
    so and gone now waits for the audit log's word that Google preempted it (a person's delete
    looks alike: stopping, then gone); with that word it is made again, or with no spec to make
    it from (`remade` False) only no longer waited for."""
    up = {n for n, part in seen.items() if part is not None and part.usable}
    # a word is about one VM: forgotten once a VM of that name is seen up (made again, or not gone)
    said = tuple(dict.fromkeys((*(n for n in was.said if n not in up),
                                *(ev.node for ev in events if ev.node in names and ev.method.endswith(PREEMPTED)))))
    since = dict(zip(was.vanished, was.since, strict=True))
    for name in was.deletes:  # last seen so, idle, and gone now
        if name in seen and seen[name] is None and name not in since and name not in remaking:
            since[name] = now
    taken = [n for n in since if n in said and remade]
    since = {n: t for n, t in since.items() if n not in said or n in taken}
    vanished = [(n, t) for n, t in since.items() if n not in taken and n in seen and seen[n] is None]
    return IdleWord(deletes=tuple(n for n in deletes if n not in remaking), said=said,
                    vanished=tuple(n for n, _ in vanished), since=tuple(t for _, t in vanished)), taken


def overdue(word: IdleWord, now: datetime) -> tuple[IdleWord, list[str]]:
    """`word` without the VMs gone AUDIT_GRACE with no word from Google (a person deleted them:
    never made again), and their names."""
    late = [n for n, t in zip(word.vanished, word.since, strict=True) if (now - t).total_seconds() >= AUDIT_GRACE]
    if not late:
        return word, []
    kept = [(n, t) for n, t in zip(word.vanished, word.since, strict=True) if n not in late]
    return IdleWord(deletes=tuple(n for n in word.deletes if n not in late),
                    said=tuple(n for n in word.said if n not in late),
                    vanished=tuple(n for n, _ in kept), since=tuple(t for _, t in kept)), late
