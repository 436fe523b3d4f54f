"""The delete, create and queued create that tpuwatch has in flight, followed tick after tick.

Handlers for the phases with a cloud operation (DELETING, CREATING, QUEUED); a create that meets
no capacity is queued and retried, in the fallback zones after queue_timeout.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tpuwatch.durations import human
from tpuwatch.model import Checkpoint, NodeSnapshot
from tpuwatch.policy.backoff import backoff_delay
from tpuwatch.policy.create_errors import SHORTFALLS
from tpuwatch.policy.draft import Draft, secs
from tpuwatch.policy.nodes import still_stopping
from tpuwatch.policy.state import Memory, Phase, move
from tpuwatch.policy.values import (
    ClearQueued,
    CreateNode,
    Decision,
    FollowOperation,
    ImpossibleObservation,
    PolicyConfig,
    Wait,
)

NOT_FOUND = 5  # google.rpc.Code: a delete that finds nothing has done its job
RESOURCE_EXHAUSTED = 8  # google.rpc.Code: how a given-up queued resource is shown when it gave none


def queued_ended(draft: Draft) -> bool:
    """The node's queued resource was given up by the service (FAILED, SUSPENDING, SUSPENDED)."""
    return draft.obs.queued is not None and draft.obs.queued.ended


def create(draft: Draft, mem: Memory, zone_try: int, row: str, why: str) -> Decision:
    zone = draft.cfg.zones[zone_try]
    mem = move(mem, Phase.CREATING, zone=zone,
               recreate=replace(mem.recreate, pending_op=None, op_started=None, zone_try=zone_try, retry_at=None),
               repair=mem.repair.over())
    return draft.out(mem, row, why, create_node(draft, mem, zone, why))


def create_node(draft: Draft, mem: Memory, zone: str, why: str, *, resumed: bool = False) -> CreateNode:
    """The create, with what the new node's startup script needs (`startup`)."""
    return CreateNode(draft.cfg.tpu_name, zone, why, startup(draft.cfg, mem, draft.obs.checkpoint), resumed)


def startup(cfg: PolicyConfig, mem: Memory, checkpoint: Checkpoint | None) -> dict[str, str]:
    """What a create tells the new node's startup script. It can start the job at boot, before
    the watcher reconnects: as the next attempt, from the newest complete checkpoint, which the
    policy then follows instead of launching it a second time. It only sets up when the watcher
    must launch: a multislice job starts on every slice at once, with the slices' ids and the
    coordinator; a checkpoint_dir on the VM whose newest checkpoint is not known here is read on
    the new node first."""
    if cfg.slices or (cfg.checkpoints_on_vm and checkpoint is None):
        return {"launch": "false"}
    out = {"attempt": str(mem.attempt.number + 1)}
    if checkpoint is not None:
        out.update(checkpoint=checkpoint.path, step=str(checkpoint.step))
    return out


def delete_unstarted(draft: Draft, mem: Memory) -> Memory | None:
    """The memory to decide afresh from, when the tick stopped between journaling its delete and
    the call (row `delete_resume`, decided from the node as it is now: it may have healed, or
    lost its label); None when `deleting` follows the delete: started, or the node is gone or
    replaced."""
    op, node = draft.obs.operation, draft.obs.node
    # a Compute Engine VM stopping: the delete may have started (it stops the VM first); followed
    if (op is not None or node is None or mem.recreate.pending_op is not None or node.state == "DELETING"
            or still_stopping(node)):
        return None
    if mem.recreate.deleting_node_id and node.id != mem.recreate.deleting_node_id:
        return None
    draft.notes.append(f"no delete of {draft.cfg.tpu_name} was started")
    return move(mem, Phase.IDLE,
                recreate=replace(mem.recreate, deleting_node_id=""),
                budgets=replace(mem.budgets, recreates=max(0, mem.budgets.recreates - 1)))


def deleting(draft: Draft, mem: Memory) -> Decision:
    op, node = draft.obs.operation, draft.obs.node
    if op is not None and op.done:
        draft.op_done = op.name or None
        if op.error_code not in (0, NOT_FOUND):
            return draft.fail(mem, "delete_failed", f"deleting {draft.subject} failed: code {op.error_code}: "
                                                    f"{op.error_message}")
    queued = draft.obs.queued
    if node is None and queued is not None and queued.state and not (op is not None and op.done):
        # The node is gone and its queued resource is still being deleted: a create now
        # would be refused (the name is taken), so follow the delete to its end.
        return draft.out(mem, "deleting", f"{draft.subject} is deleted; its queued resource is {queued.state}, "
                                          f"still being deleted (operation {mem.recreate.pending_op or 'not recorded'})",
                         FollowOperation(mem.recreate.pending_op, "delete", "queued resource delete in flight"))
    if node is None:
        draft.op_done = draft.op_done or mem.recreate.pending_op
        return create(draft, mem, 0, "create_after_delete", f"{draft.subject} is deleted; creating it in {draft.cfg.zones[0]}")
    if mem.recreate.deleting_node_id and node.id != mem.recreate.deleting_node_id:
        # a new node: its repair, if any, is timed from now, not from the one deleted
        mem = move(mem, Phase.IDLE, recreate=replace(mem.recreate, pending_op=None, op_started=None, deleting_node_id=""),
                   repair=mem.repair.over())
        return draft.out(mem, "deleting", f"{draft.subject} was replaced (id {node.id}) while tpuwatch deleted it; "
                                          "following the new node", Wait(None, "node replaced"))
    overdue = operation_overdue(draft, mem, "delete")
    if overdue is not None:
        return overdue
    op_name = mem.recreate.pending_op or "not recorded"
    return draft.out(mem, "deleting", f"deleting {draft.subject} (operation {op_name}, state {node.state})",
                     FollowOperation(mem.recreate.pending_op, "delete", "delete in flight"))


def creating(draft: Draft, mem: Memory) -> Decision:
    op, node, name = draft.obs.operation, draft.obs.node, draft.cfg.tpu_name
    if op is not None and op.done:
        draft.op_done = op.name or None
        if op.error_code != 0:
            kind = draft.obs.create_failure
            if kind is None:
                raise ImpossibleObservation(
                    mem.phase, f"create operation {op.name!r} failed (code {op.error_code}) and the observation "
                               "has no create_failure (recreate.classify_operation(op).kind)")
            if kind == "queueable":
                return queue(draft, mem, op.error_code, op.error_message)
            if kind == "fatal":
                return draft.fail(mem, "create_failed", f"creating {draft.subject} in {mem.zone} failed: code "
                                                        f"{op.error_code}: {op.error_message}")
            # "exists": tpuwatch's own earlier create made it
        if node is None and queued_ended(draft):
            # The request was accepted and then given up (FAILED, or SUSPENDED before its node
            # came): it never makes the node. Queue and retry, as for no capacity.
            q = draft.obs.queued
            assert q is not None
            return queue(draft, mem, q.error_code or RESOURCE_EXHAUSTED,
                         f"queued resource {q.name.rsplit('/', 1)[-1]} {q.state}: "
                         f"{q.error_message or 'no detail given'}")
        if node is not None:
            return created(draft, mem, node)
        return draft.out(mem, "creating", f"create of {name} done; waiting for the node to appear",
                         FollowOperation(mem.recreate.pending_op, "create", "create done, node not listed yet"))
    if op is None and node is not None:
        if node.state == "CREATING" and not create_overdue(draft, node):
            # This job's create whose operation name was never journaled (a watcher killed
            # right after the call): the node is on its way, not unhealthy; judging it
            # against repair_timeout would delete it mid-create and create it again.
            return draft.out(mem, "creating", f"{draft.subject} is being created in {mem.zone} (its create "
                                              "operation was not recorded); waiting for it",
                             Wait(None, "node creating"))
        return created(draft, mem, node)
    if op is None and mem.recreate.pending_op is None:
        return draft.out(mem, "create_resume", f"no create operation recorded and {draft.subject} is missing: "
                                               f"creating it in {mem.zone}", create_node(draft, mem, mem.zone, "create not started", resumed=True))
    overdue = operation_overdue(draft, mem, "create")
    if overdue is not None:
        return overdue
    return draft.out(mem, "creating",
                     f"creating {draft.subject} in {mem.zone} (operation {mem.recreate.pending_op})",
                     FollowOperation(mem.recreate.pending_op, "create", "create in flight"))


def create_overdue(draft: Draft, node: NodeSnapshot) -> bool:
    """A node still CREATING for longer than recovery.operation_timeout (or of unknown age)."""
    return node.create_time is None or secs(draft.now - node.create_time) >= draft.cfg.operation_timeout


def operation_overdue(draft: Draft, mem: Memory, kind: str) -> Decision | None:
    """Fail when the operation in flight is older than recovery.operation_timeout.

    An operation that never ends would keep the job waiting forever; starting another one
    beside it could give two nodes, so the job stops and says which operation to look at.
    """
    op, cfg = draft.obs.operation, draft.cfg
    if op is None or op.done or op.started is None:
        return None
    age = secs(draft.now - op.started)
    if age < cfg.operation_timeout:
        return None
    return draft.fail(mem, "operation_timeout",
                      f"the {kind} of {draft.subject} in {mem.zone} (operation {op.name}) is not done after "
                      f"{human(age)}, longer than recovery.operation_timeout ({human(cfg.operation_timeout)}); "
                      f"tpuwatch stops following it and starts no other {kind}. See `gcloud compute tpus "
                      f"operations describe {op.name.rsplit('/', 1)[-1]} --zone {mem.zone}`")


def created(draft: Draft, mem: Memory, node: NodeSnapshot) -> Decision:
    mem = move(mem, Phase.IDLE, zone=node.zone or mem.zone,
               recreate=replace(mem.recreate, pending_op=None, op_started=None, zone_try=0, queued_since=None, queue_tries=0,
                                retry_at=None, deleting_node_id=""),
               repair=mem.repair.over())
    return draft.out(mem, "created", f"{draft.subject} exists in {mem.zone} (id {node.id}, {node.state}); "
                                     "the job resumes once it is READY+HEALTHY", Wait(None, "node created"))


def queue(draft: Draft, mem: Memory, code: int, message: str) -> Decision:
    cfg, now = draft.cfg, draft.now
    since = mem.recreate.queued_since or now
    tries = mem.recreate.queue_tries + 1
    delay = backoff_delay(tries, cfg.backoff_base, cfg.backoff_max, draft.obs.jitter)
    retry_at = now + timedelta(seconds=delay)
    mem = move(mem, Phase.QUEUED,
               recreate=replace(mem.recreate, pending_op=None, op_started=None, queued_since=since, queue_tries=tries,
                                retry_at=retry_at))
    what = SHORTFALLS.get(draft.obs.create_reason, "no capacity or quota")
    # A queued resource the service gave up on keeps the name: delete it now, so it is gone
    # by the retry's create.
    clear = (ClearQueued(mem.zone, "free the name for the retry's create"),) if draft.obs.queued is not None else ()
    return draft.out(mem, "no_capacity", f"{what} in {mem.zone} (code {code}: {message}); "
                                         f"queued {human(secs(now - since))} of {human(cfg.queue_timeout)}, next "
                                         f"create in {human(delay)}", Wait(retry_at, "no capacity"), *clear)


def queued(draft: Draft, mem: Memory) -> Decision:
    cfg, now, node = draft.cfg, draft.now, draft.obs.node
    if node is not None:
        return created(draft, mem, node)
    assert mem.recreate.retry_at is not None and mem.recreate.queued_since is not None  # checked in _check
    if now < mem.recreate.retry_at:
        return draft.out(mem, "queued", f"no capacity in {mem.zone}; next create in "
                                        f"{human(secs(mem.recreate.retry_at - now))}",
                         Wait(mem.recreate.retry_at, "no capacity"))
    waited = secs(now - mem.recreate.queued_since)
    if waited < cfg.queue_timeout and mem.recreate.zone_try < len(cfg.zones):
        return create(draft, mem, mem.recreate.zone_try, "queue_retry",
                      f"retrying the create in {mem.zone} (try {mem.recreate.queue_tries + 1})")
    nxt = mem.recreate.zone_try + 1
    if nxt >= len(cfg.zones):
        return draft.fail(mem, "queue_exhausted", f"no capacity for {draft.subject} in "
                          f"{', '.join(cfg.zones)}: each zone tried for recovery.queue_timeout "
                          f"({human(cfg.queue_timeout)})")
    mem = replace(mem, recreate=replace(mem.recreate, queued_since=None, queue_tries=0))
    return create(draft, mem, nxt, "queue_retry", f"no capacity in {mem.zone} for {human(waited)}: trying "
                                                  f"fallback zone {cfg.zones[nxt]}")
