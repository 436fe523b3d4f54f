"""The recovery policy: a pure function from what tpuwatch sees to what it does.

Rules of this package:
- Everything that decides recovery lives here: the table's rows as data (`rows.ROWS`) and
  `decide`, which walks them (`table`), what a node's state means (`nodes`), the phases and their
  legal moves (`state.TRANSITIONS`), how an attempt's end is classified (`classify`), backoff
  (`backoff`), and what the tick must observe before deciding (`observe`).
- No I/O, no clock, no randomness of its own: nothing here imports google, ssh, subprocess or
  time. `now` and a `jitter` in [0, 1) come in as arguments, so the same inputs always give the
  same Decision.
- Every Decision carries a one-line reason (`summary`, and each action's `reason`) and names
  its table row (`row`). An observation that contradicts the memory raises
  ImpossibleObservation naming the phase and the evidence.

The API the tick uses (observe -> decide -> act -> journal):

    cfg = PolicyConfig.from_config(config, zone=resolved_zone)
    mem = journal.load_memory() or Memory.initial(cfg.zones[0])   # mem.zone: where to look
    obs = Observation(node=..., events=..., probes=..., checkpoint=...,
                      operation=<status of mem.pending_op, if any>,
                      create_failure=<recreate.classify_operation(op).kind when it failed>,
                      queued=<the queued resource's state while it matters>, jitter=random.random(),
                      checks=<environment checks available>, adopt=..., ...)
    d = decide(obs, mem, cfg, now)
    journal.record(now, d, obs.operation)     # write-ahead: memory, events, attempts; one transaction
    for action in d.actions:                  # in order: Launch, StopWorkers, Wait, DeleteNode,
        ...                                   # CreateNode, FollowOperation, MarkDone, Fail, NeedsPerson
        # after DeleteNode / CreateNode returned an operation name:
        mem = journal.record_operation(now, d.memory, name, action.kind, action.zone)
    exit with d.exit_code; `watch` returns when d.terminal.

`--dry-run`: set `Observation.dry_run`; the Decision then keeps the old memory, and the tick
prints the actions instead of taking them (and records nothing). A create refused at the call
(recreate.CreateRejected) is fed back in the same tick: decide again with
`operation=OperationStatus(name="", done=True, error_code=..., error_message=...)` and
`create_failure=exc.failure.kind`.
"""

from tpuwatch.policy.backoff import backoff_delay, next_level, restart_delay
from tpuwatch.policy.classify import (
    OUTCOMES,
    AttemptFacts,
    Outcome,
    Verdict,
    classify,
    describe_exit,
)
from tpuwatch.policy.nodes import Cond, node_condition
from tpuwatch.policy.rows import ROWS, Row
from tpuwatch.policy.state import (
    TRANSITIONS,
    AttemptEnd,
    Evidence,
    IllegalTransition,
    Memory,
    Phase,
)
from tpuwatch.policy.table import decide, hang_limit, operation_started
from tpuwatch.policy.values import (
    Action,
    CreateNode,
    Decision,
    DeleteNode,
    Fail,
    FollowOperation,
    ImpossibleObservation,
    Launch,
    MarkDone,
    NeedsPerson,
    Observation,
    PolicyConfig,
    StartMaintenance,
    StopWorkers,
    Wait,
    action_dict,
)

__all__ = [
    "OUTCOMES", "ROWS", "TRANSITIONS", "Action", "AttemptEnd", "AttemptFacts", "Cond", "CreateNode",
    "Decision", "DeleteNode", "Evidence", "Fail", "FollowOperation", "IllegalTransition",
    "ImpossibleObservation", "Launch", "MarkDone", "Memory", "NeedsPerson", "Observation", "Outcome",
    "Phase", "PolicyConfig", "Row", "StartMaintenance", "StopWorkers", "Verdict", "Wait", "action_dict", "backoff_delay",
    "classify", "decide", "describe_exit", "hang_limit", "next_level", "node_condition", "operation_started",
    "restart_delay",
]
