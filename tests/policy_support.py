"""Builders shared by the policy tests: nodes, probes, observations and memories in a few words.

No tests here; the policy is pure, so these are plain values and no simulator is needed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from tpuwatch.model import (
    AuditEvent,
    CheckItem,
    Checkpoint,
    NodeSnapshot,
    OperationStatus,
    PrecheckReport,
    Symptom,
    UpcomingMaintenance,
    WorkerEndpoint,
    WorkerProbe,
    bound_view,
)
from tpuwatch.policy import (
    Attempt,
    AttemptEnd,
    Boot,
    Decision,
    Memory,
    Observation,
    Phase,
    PolicyConfig,
    decide,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
NAME = "pod"
JOB = "job"
ZONES = ("us-central2-b", "us-east1-d")

CFG = PolicyConfig(
    job=JOB,
    tpu_name=NAME,
    zones=ZONES,
    repair_timeout=600.0,
    max_restarts=2,
    max_recreates=2,
    no_progress_limit=3,
    min_uptime=60.0,
    queue_timeout=3600.0,
    fail_fast_exit_codes=frozenset({42}),
    backoff_base=10.0,
    backoff_max=80.0,
    stable_run=1000.0,
    poll_interval=10.0,
    unreachable_grace=30.0,
    evidence_window=1800.0,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(state: str = "READY", health: str = "HEALTHY", id: str = "n1", owned: bool = True,
         **kw: Any) -> NodeSnapshot:
    return NodeSnapshot(
        name=NAME, project="proj", zone=ZONES[0], id=id, create_time=T0, state=state, health=health,
        health_description="", maintenance_time=None,
        labels={"tpuwatch-job": JOB} if owned else {}, **kw,
    )


def ckpt(step: int) -> Checkpoint:
    return Checkpoint(path=f"/ckpt/{step}", step=step, layout="orbax", time=None)


def running(attempt: int, workers: int = 2) -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(w, "running", attempt=attempt, pid=100 + w) for w in range(workers))


def absent(workers: int = 2) -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(w, "absent") for w in range(workers))


def probe(worker: int, state: str, attempt: int | None = 1, code: int | None = None) -> WorkerProbe:
    return WorkerProbe(worker, state, attempt=attempt, exit_code=code)  # type: ignore[arg-type]


def exited(codes: dict[int, int], attempt: int = 1, workers: int = 2) -> tuple[WorkerProbe, ...]:
    """Workers in `codes` exited with their code; the others still run `attempt`."""
    return tuple(
        probe(w, "exited", attempt, codes[w]) if w in codes else probe(w, "running", attempt)
        for w in range(workers)
    )


def event(kind: str, t: datetime, reason: str = "") -> AuditEvent:
    method = {"terminate": "tpu.nodes.terminate", "restart": "tpu.nodes.restart"}.get(kind, "x")
    return AuditEvent(time=t, kind=kind, node=NAME, worker=None, method=method,  # type: ignore[arg-type]
                      reason=reason, insert_id=f"{kind}-{t.isoformat()}", resource_name=f"nodes/{NAME}")


def symptom(t: datetime) -> Symptom:
    return Symptom(type="EXECUTE_TIMED_OUT", worker_id="1", time=t, details="")


def ongoing() -> UpcomingMaintenance:
    return UpcomingMaintenance("UNSCHEDULED", "ONGOING", False, None, None, None)


def op(name: str, done: bool = True, code: int = 0, message: str = "") -> OperationStatus:
    return OperationStatus(name=name, done=done, error_code=code, error_message=message)


def obs(n: NodeSnapshot | None = None, *, missing: bool = False, **kw: Any) -> Observation:
    """An observation of node `n` (default READY+HEALTHY, owned), or of no node when `missing`."""
    the_node = None if missing else (n if n is not None else node())
    return Observation(node=the_node, **kw)


def idle(**records: Any) -> Memory:
    """Memory with no attempt alive, that has seen node n1 before (no boot of its own to count);
    `records`: fields of Memory to set (budgets=Budgets(restarts=2), ...)."""
    return replace(Memory.initial(ZONES[0]), **{"boot": Boot(node_seen="n1"), **records})


def run_mem(attempt: int = 1, start: float = 0.0, step: int | None = 100, seen: bool = True,
            **records: Any) -> Memory:
    """Memory following attempt `attempt`, started at at(start) from checkpoint `step` on node n1;
    `records`: other fields of Memory to set (budgets=Budgets(restarts=2), ...)."""
    base = {"phase": Phase.RUNNING, "attempt": Attempt(attempt, at(start), "n1", step, seen),
            "boot": Boot(node_seen="n1")}
    return replace(Memory.initial(ZONES[0]), **{**base, **records})


def last_end(attempt: int = 1, outcome: str = "failure", charged: bool = True, start: float = 0.0,
             end: float = 500.0, streak_added: bool = False) -> AttemptEnd:
    return AttemptEnd(attempt, at(start), at(end), "n1", 100, 100, outcome, charged, 1, "test end", streak_added)


def tick(o: Observation, m: Memory, now: float, cfg: PolicyConfig = CFG) -> Decision:
    d = decide(o, m, cfg, at(now))
    ends_what_it_leaves(m, d)
    return d


def ends_what_it_leaves(before: Memory, d: Decision) -> None:
    """Every decision a policy test makes holds the journal to this: a decision that moves a job
    off a running attempt ends that attempt, else its journal row stays open under the next
    one. Only a halt with the workers out of reach (row `login_refused`) leaves it: it may run."""
    if before.phase is Phase.RUNNING and d.memory.phase is not Phase.RUNNING and d.row != "login_refused":
        assert before.attempt.number in {e.attempt for e in d.ended}, (d.row, d.summary)


def kinds(d: Decision) -> list[str]:
    return [a.kind for a in d.actions]


def pre(*failing: tuple[str, int, bool], context: str = "launch", t: float = 0.0, node_id: str = "n1",
        workers: int = 2, unreachable: tuple[int, ...] = ()) -> PrecheckReport:
    """Environment checks: every check passes on every worker but the (check, worker, fixable) given."""
    bad = {(c, w): f for c, w, f in failing}
    items = []
    for w in range(workers):
        if w in unreachable:
            continue
        for c in ("disk", "devices", "libtpu_lock"):
            if (c, w) in bad:
                items.append(CheckItem(c, w, "fail", f"bad {c}", f"good {c}", fixable=bad[(c, w)]))
            else:
                items.append(CheckItem(c, w, "pass", f"good {c}", f"good {c}"))
    return PrecheckReport(time=at(t), context=context, node_id=node_id,  # type: ignore[arg-type]
                          items=tuple(items), unreachable=tuple((w, "ssh: connection refused") for w in unreachable))


# A multislice job of 4 slices that may limp on 3 (policy/limp.py)
LIMP_SLICES = ("s0", "s1", "s2", "s3")
LIMPS = replace(CFG, slices=LIMP_SLICES, recreatable=False, min_slices=3)


def limp_part(name: str, state: str = "READY", health: str = "HEALTHY") -> NodeSnapshot:
    """One slice with 2 workers."""
    return replace(node(state, health, id=f"id-{name}"), name=name, accelerator_type="v5p-16",
                   workers=(WorkerEndpoint(0, "10.0.0.1", ""), WorkerEndpoint(1, "10.0.0.2", "")))


def limp_look(states: dict[str, str], mem: Memory, spares: tuple[str, ...] = (),
              parts: dict[str, NodeSnapshot | None] | None = None, **kw: object) -> Observation:
    """What the tick sees: every node of the pool (LIMP_SLICES, then `spares`) READY+HEALTHY but
    those in `states` (or as `parts` gives them), combined as the tick combines them for `mem`
    (the slices it runs on, those left out, and its idle spares)."""
    read: dict[str, NodeSnapshot | None] = {s: limp_part(s, states.get(s, "READY")) for s in (*LIMP_SLICES, *spares)}
    read.update(parts or {})
    view, left = bound_view(NAME, LIMP_SLICES, read, mem.limp.out, dict(mem.limp.swapped))
    assert view is not None
    idle = tuple((n, read[n]) for n in mem.limp.idle(LIMP_SLICES, spares))
    return Observation(node=view, left_out=left, spares=idle, **kw)  # type: ignore[arg-type]
