"""What a node's state and health mean for the job: the classes that pick the table's handler.

Pure data over the API's enum names (tpuwatch.model keeps them as strings). A state this
tpuwatch does not know is UNRECOGNIZED: waited for like a repair, never deleted.
"""

from __future__ import annotations

from enum import Enum

from tpuwatch.model import UNHEALTHY, NodeSnapshot
from tpuwatch.policy.state import Phase

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
# condition -> the _Tick handler for it
NODE_ROWS: dict[Cond, str] = {
    Cond.USABLE: "usable",
    Cond.REPAIR: "repairing",
    Cond.UNRECOGNIZED: "repairing",
    Cond.DEAD: "dead",
    Cond.PERSON: "person",
    Cond.MISSING: "missing",
    Cond.DELETING: "someone_deleting",
}
# phases with a cloud operation in flight -> the _Tick handler following it
OP_ROWS: dict[Phase, str] = {Phase.DELETING: "deleting", Phase.CREATING: "creating", Phase.QUEUED: "queued"}


def node_condition(node: NodeSnapshot | None) -> Cond:
    if node is None:
        return Cond.MISSING
    cond = STATE_CONDITION.get(node.state, Cond.UNRECOGNIZED)
    if cond is Cond.USABLE and node.health in UNHEALTHY:
        return Cond.REPAIR
    return cond


def failed_repair(node: NodeSnapshot) -> bool:
    """The node, or one slice of a multislice job, is UNKNOWN with no health: "unknown state
    after a failed repair", as the TPU API documents Node.State UNKNOWN."""
    return any(part.state == "UNKNOWN" and part.health in NO_HEALTH for part in node.slices or (node,))
