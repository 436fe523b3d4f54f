"""Google's own stops of a VM made through Compute Engine, told from a person's.

Google deletes a VM itself when its termination action is DELETE: a Spot VM at its preemption
(audit `compute.instances.preempted`), any VM at the end of its run (flex-start, `maxRunDuration`,
`terminationTime`). While it goes its `shutdownDetails.targetState` is DELETED. Such a deletion
is a disruption: the VM is made again from the saved spec (row `google_deleted`), within
max_recreates, never charged to max_restarts. A deletion with no such word is a person's (row
`node_missing`): a VM Google may delete that is missing with no word yet is waited for up to
AUDIT_GRACE for the audit log to say (row `google_delete_wait`).

`seen` keeps what the sightings and the audit log said in `Memory.google`, since the VM may be
gone by the next tick, which under cron `check` is another process. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.policy.draft import Draft
from tpuwatch.policy.state import GoogleStop, Memory

PREEMPTED = "compute.instances.preempted"
# Logging may show an entry after the VM it is about is gone (Google does not say how late; it is
# seconds to a minute as a rule): a VM Google may delete, missing with no word yet, is given this
# long before it is taken for a person's deletion.
AUDIT_GRACE = 180.0


def seen(draft: Draft, mem: Memory) -> Memory:
    """Memory that knows this tick's sighting of the node and the audit log's preemptions of it."""
    node, g = draft.obs.node, mem.google
    if node is not None and not node.google_deletes:
        g = GoogleStop()  # nothing to keep: Google does not delete it (and most nodes are such)
    elif node is not None:
        if node.id != g.node_id:
            g = GoogleStop(node_id=node.id)  # another VM: nothing said of the last one holds for it
        g = replace(g, created=node.create_time, owned=node.owned_by(draft.cfg.job), deletes=node.google_deletes,
                    deletes_at=node.google_deletes_at, missing_since=None,
                    deleted=g.deleted or (f"seen going: {node.google_deleting}" if node.google_deleting else ""))
    for ev in draft.obs.events:
        if (g.deletes and not g.deleted and ev.node == draft.cfg.tpu_name and ev.method.endswith(PREEMPTED)
                and (g.created is None or ev.time >= g.created)):
            g = replace(g, deleted=f"audit {ev.method} at {ev.time.isoformat()}")
    if node is None and g.node_id and g.missing_since is None:
        g = replace(g, missing_since=draft.now)
    return mem if g == mem.google else replace(mem, google=g)


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


def word_due(draft: Draft, mem: Memory) -> datetime | None:
    """Until when to wait for the audit log's word on a missing VM that Google may delete; None
    when not waiting (a VM Google never deletes, not the job's, or waited long enough)."""
    g = mem.google
    if not (g.deletes and g.owned) or g.missing_since is None:
        return None
    until = g.missing_since + timedelta(seconds=AUDIT_GRACE)
    return until if draft.now < until else None
