"""What a node's state and health mean for the job (the classes that pick `decide`'s handler,
policy/table.py), and when the policy saw it boot.

Pure data over the API's enum names (tpuwatch.model keeps them as strings). A state this
tpuwatch does not know is UNRECOGNIZED: waited for like a repair, never deleted.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from enum import Enum

from tpuwatch.model import UNHEALTHY, NodeSnapshot
from tpuwatch.policy.state import Memory

# Node.State names that mean "the service is working on it; wait up to repair_timeout". MISSING
# is a multislice job with one slice gone while others stand (model.combine_slices): the service
# makes a multislice request's failed slice again by itself.
REPAIR_STATES = frozenset({"REPAIRING", "RESTARTING", "UNKNOWN", "REIMAGING", "STARTING", "CREATING", "MISSING"})
# Healths that say nothing: a node in UNKNOWN with one of these is past a failed repair (the
# API's words for UNKNOWN); with a health that names a cause (UNHEALTHY_MAINTENANCE) it is waited for.
NO_HEALTH = frozenset({"", "HEALTH_UNSPECIFIED"})
# States a person caused; tpuwatch leaves the node alone.
PERSON_STATES = frozenset({"STOPPED", "STOPPING", "HIDDEN", "HIDING", "UNHIDING"})
# States from which the node never comes back by itself.
DEAD_STATES = frozenset({"PREEMPTED", "TERMINATED"})


class Cond(str, Enum):
    """What the node's state and health mean for the job."""

    MISSING = "missing"
    USABLE = "usable"
    REPAIR = "repair"
    DEAD = "dead"
    PERSON = "person"
    DELETING = "deleting"
    UNRECOGNIZED = "unrecognized"


STATE_CONDITION: dict[str, Cond] = {
    "READY": Cond.USABLE,
    "DELETING": Cond.DELETING,
    **{s: Cond.REPAIR for s in REPAIR_STATES},
    **{s: Cond.DEAD for s in DEAD_STATES},
    **{s: Cond.PERSON for s in PERSON_STATES},
}
def node_condition(node: NodeSnapshot | None) -> Cond:
    if node is None:
        return Cond.MISSING
    cond = STATE_CONDITION.get(node.state, Cond.UNRECOGNIZED)
    if cond is Cond.USABLE and node.health in UNHEALTHY:
        return Cond.REPAIR
    if cond is Cond.DEAD and node.repairs_itself:
        # a MIG that repairs (defaultActionOnFailure REPAIR) recreates a preempted Spot VM by
        # itself: recreating it too would race that repair and throw away the healthy VMs
        return Cond.REPAIR
    return cond


# Google's stop of a Spot VM ends in seconds: a preempted VM's guest has 30 s before the hard off
# (longer only with a graceful shutdown configured). One still stopping this long (or half of
# recovery.operation_timeout, when shorter) is said, once, as a wait of its own (row
# `spot_stopping_long`, alert `stopping_long`); past recovery.operation_timeout a person is asked.
STOPPING_LONG = 5 * 60.0
STOPPING_LONG_WAIT = "a Spot VM stopping for long"


def still_stopping(node: NodeSnapshot) -> bool:
    """A Compute Engine VM of the node (or of one of its slices) is still stopping: a Spot VM's
    preemption ends TERMINATED, a person's instances.delete ends with it gone (row `spot_stopping`)."""
    return any(part.stopping for part in node.slices or (node,))


# A node in UNKNOWN with no health is past a failed repair (the API's own words): the repair
# that repair_timeout waits for is over. It is recreated once it has stayed so this long, the
# service's diagnosis that UNKNOWN covers (its length is not published) given a few polls to
# bring it back; a recreate costs a delete, a create and a chance of meeting no capacity.
FAILED_REPAIR_GRACE = 5 * 60.0


def failed_repair(node: NodeSnapshot) -> bool:
    """The node, or one slice of a multislice job, is UNKNOWN with no health: "unknown state
    after a failed repair", as the TPU API documents Node.State UNKNOWN."""
    return any(part.state == "UNKNOWN" and part.health in NO_HEALTH for part in node.slices or (node,))


def boots_seen(node: NodeSnapshot | None, mem: Memory, now: datetime) -> Memory:
    """Memory that knows when this policy last saw the node boot: a node id other than the one it
    knew (not the first one it sees), or usable again after it saw it not usable."""
    if node is None:
        return mem
    up = node.usable
    if node.id != mem.boot.node_seen:
        return replace(mem,
                       boot=replace(mem.boot, node_seen=node.id, node_down=not up,
                                    booted_at=now if mem.boot.node_seen else None))
    if up == mem.boot.node_down:  # a change: down now, or up again
        return replace(mem,
                       boot=replace(mem.boot, node_down=not up, booted_at=now if up else mem.boot.booted_at))
    return mem


def maintained_since(node: NodeSnapshot, since: datetime) -> bool:
    """The node reports a maintenance event (its health description's time) after `since`.

    A maintenance shorter than a poll goes down and comes back between two ticks; this is how
    the node says it happened all the same."""
    return node.maintenance_time is not None and node.maintenance_time > since


def boot_time(node: NodeSnapshot, mem: Memory) -> datetime | None:
    """The node's latest boot known: its create time, its last maintenance, or a boot seen."""
    times = [t for t in (node.create_time, node.maintenance_time, mem.boot.booted_at) if t is not None]
    return max(times) if times else None
