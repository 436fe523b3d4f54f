"""One decision in the making, shared by the handlers that `decide` (policy/table.py) calls.

A handler is a function of a `Draft` and the memory so far that returns the Decision; on the way
it may end an attempt, note what it saw, or add actions, which the Draft gathers until `out`
turns them into the Decision, naming its row. The handlers live by what they decide about:
`usable` (a usable node: the attempt followed, launched), `ending` (an attempt's end), `hang`,
`early` (maintenance started early), `recovery` (a node that needs repair, recreating or a
person) and `operations` (the delete, create or queued create in flight); `evidence` holds the
signs of a disruption. Pure, like the whole policy.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpuwatch.model import WorkerProbe
from tpuwatch.policy.rows import ROW_IDS
from tpuwatch.policy.state import PHASE_EXIT, AttemptEnd, Memory, Phase, move
from tpuwatch.policy.values import (
    Action,
    Decision,
    Fail,
    Launch,
    NeedsPerson,
    Observation,
    PolicyConfig,
    StartMaintenance,
    StopWorkers,
)


def secs(d: timedelta) -> float:
    return d.total_seconds()


def worker_list(probes: list[WorkerProbe]) -> str:
    return ", ".join(str(p.worker) for p in probes)


def worker_exits(probes: tuple[WorkerProbe, ...], attempt: int) -> dict[int, int | None]:
    """worker -> exit code, for each worker no longer running `attempt` (None: no code)."""
    out: dict[int, int | None] = {}
    for p in probes:
        if p.state == "running" and p.attempt == attempt:
            continue
        # exited with its code; absent, unreachable or showing another attempt: gone, no code
        out[p.worker] = p.exit_code if p.state == "exited" and p.attempt == attempt else None
    return out


class Draft:
    """One decision in the making: the actions, ended attempts and notes so far."""

    def __init__(self, obs: Observation, cfg: PolicyConfig, now: datetime) -> None:
        self.obs = obs
        self.cfg = cfg
        self.now = now
        self.actions: list[Action] = []
        self.ended: list[AttemptEnd] = []
        self.notes: list[str] = []
        self.op_done: str | None = None

    def out(self, mem: Memory, row: str, summary: str, *actions: Action) -> Decision:
        if row not in ROW_IDS:
            raise KeyError(f"policy bug: unknown row {row!r}")
        self.actions.extend(actions)
        acts = [self._stoppable(a) for a in self.actions]
        if any(isinstance(a, (StartMaintenance, Launch)) for a in acts):
            # What comes next needs the job gone first (a job saving on SIGTERM before its
            # host goes down, a launch): the stop is waited for.
            acts = [replace(a, wait=True) if isinstance(a, StopWorkers) else a for a in acts]
        return Decision(
            actions=tuple(acts),
            memory=mem,
            summary="; ".join([*self.notes, summary]),
            exit_code=PHASE_EXIT[mem.phase],
            row=row,
            ended=tuple(self.ended),
            operation_done=self.op_done,
        )

    def _stoppable(self, action: Action) -> Action:
        """A stop the workers can take: one that cannot reach them says why, and is not tried."""
        if not isinstance(action, StopWorkers) or action.blocked:
            return action
        node, probes = self.obs.node, self.obs.probes
        if node is None or not node.reachable:
            state = "missing" if node is None else node.state
            return replace(action, blocked=f"node is {state}, its workers cannot be reached")
        if probes and all(p.state == "unreachable" for p in probes):
            # This tick's probe reached none of them (a node under maintenance refuses SSH): a
            # stop would fail the same way.
            return replace(action, blocked="none answered this tick's probe")
        return action

    def fail(self, mem: Memory, row: str, reason: str, evidence: tuple[str, ...] = ()) -> Decision:
        return self.out(move(mem, Phase.FAILED, reason=reason), row, f"job failed: {reason}", Fail(reason, evidence))

    def halt(self, mem: Memory, row: str, reason: str, evidence: tuple[str, ...] = ()) -> Decision:
        return self.out(move(mem, Phase.HALTED, reason=reason), row, f"needs a person: {reason}",
                        NeedsPerson(reason, evidence))

    @property
    def subject(self) -> str:
        """What the job runs on, as the person who made it calls it: its node, or a multislice
        job's queued resource (or its slices, when they were created one by one)."""
        cfg = self.cfg
        if len(cfg.slices) < 2:  # one node (with spares, a pool of one slot)
            return f"node {cfg.tpu_name}"
        if cfg.queued_resource:
            return f"queued resource {cfg.queued_resource}"
        return f"slices {', '.join(cfg.slices)}"
