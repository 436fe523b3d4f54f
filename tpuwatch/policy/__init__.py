"""The recovery policy: a pure function from what tpuwatch sees to what it does.

Rules of this package:
- Everything that decides recovery lives here: the table's rows as data (`rows.ROWS`) and
  `decide`, which walks them (`table`) through one handler per node condition or operation
  phase (`usable`, `recovery`, `operations`, helped by `ending`, `hang`, `early`, `faulty`, `evidence`;
  a decision in the making is a `draft.Draft`), what a node's state means (`nodes`), the phases
  and their legal moves (`state.TRANSITIONS`), how an attempt's end is classified (`classify`),
  backoff (`backoff`), what the tick must observe before deciding (`observe`), and when it
  decides again in the same tick (`settle`).
- No I/O, no clock, no randomness of its own: nothing here imports google, ssh, subprocess or
  time. `now` and a `jitter` in [0, 1) come in as arguments, so the same inputs always give the
  same Decision.
- Every Decision carries a one-line reason (`summary`, and each action's `reason`) and names
  its table row (`row`). An observation that contradicts the memory raises
  ImpossibleObservation naming the phase and the evidence.

The API the tick uses (observe -> decide -> journal -> act):

    cfg = PolicyConfig.from_config(config, zone=resolved_zone)
    mem = journal.load_memory() or Memory.initial(cfg.zones[0])   # mem.zone: where to look
    obs = Observation(node=<the slices the job runs on, model.bound_view of mem.limp.out>,
                      left_out=<the slices mem.limp.out leaves out>, events=..., probes=..., checkpoint=...,
                      operation=<status of mem.recreate.pending_op, when observe.operation_due>,
                      create_failure=<recreate.classify_operation(op).kind when it failed>,
                      queued=<the queued resource's state, when observe.queued_due>, jitter=random.random(),
                      checks=<environment checks available>, audit_read=<this tick read the audit log>,
                      adopt=..., ...)   # when to read the log or check: observe.audit_due, precheck_due
    d = decide_until_settled(obs, mem, cfg, now, settle)
    # settle(d, obs, mem), for each decision: journal.record(now, d, obs.operation) (write-ahead:
    # memory, events, attempts; one transaction), then its actions in order: Launch, StopWorkers,
    # Wait, DeleteNode, CreateNode, ClearQueued, FollowOperation, MarkDone, Fail, NeedsPerson,
    # StartMaintenance, ReportHost; after DeleteNode / CreateNode returned an operation name:
    #     mem = journal.record_operation(now, d.memory, name, action.kind, action.zone)  # operation_started
    # and returns Again(obs, memory) when the decision asked for more (settle.py), or changed the
    # slices the job runs on (the tick then looks at the new set: node, left_out, probes), else None.
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
from tpuwatch.policy.hang import effective_hang_limit
from tpuwatch.policy.nodes import Cond, node_condition
from tpuwatch.policy.rows import ROWS, Row
from tpuwatch.policy.settle import MAX_DECIDES, Again, UnsettledTick, decide_until_settled
from tpuwatch.policy.state import (
    TRANSITIONS,
    Attempt,
    AttemptEnd,
    Boot,
    Budgets,
    Evidence,
    GoogleStop,
    HangLearning,
    Host,
    IllegalTransition,
    Limp,
    Maintenance,
    Marks,
    Memory,
    Phase,
    Recreate,
    Repair,
)
from tpuwatch.policy.table import decide, operation_started
from tpuwatch.policy.values import (
    Action,
    ClearQueued,
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
    Relabel,
    RemakeSpare,
    ReportHost,
    StartMaintenance,
    StartNode,
    StopWorkers,
    Wait,
    action_dict,
)

__all__ = [
    "MAX_DECIDES", "OUTCOMES", "ROWS", "TRANSITIONS", "Action", "Again", "Attempt", "AttemptEnd", "AttemptFacts",
    "Boot", "Budgets", "ClearQueued", "Cond", "CreateNode",
    "Decision", "DeleteNode", "Evidence", "Fail", "FollowOperation", "GoogleStop", "HangLearning", "Host", "IllegalTransition",
    "ImpossibleObservation", "Launch", "Limp", "Maintenance", "MarkDone", "Marks", "Memory", "NeedsPerson", "Observation", "Outcome",
    "Phase", "PolicyConfig", "Recreate", "Relabel", "Repair", "RemakeSpare", "ReportHost", "Row", "StartMaintenance", "StartNode", "StopWorkers", "Verdict", "Wait", "action_dict", "backoff_delay",
    "UnsettledTick", "classify", "decide", "decide_until_settled", "describe_exit", "effective_hang_limit", "next_level", "node_condition", "operation_started",
    "restart_delay",
]
