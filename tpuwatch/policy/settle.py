"""Deciding again in the same tick, with what the tick observed after a decision: bounded.

A decision may ask for more before it is final, and the tick comes back with it:
- `Decision.check_first`: it would launch without the launch-time checks; the tick runs them
  and does none of its actions; decide again from the same memory with their report.
- `Decision.check_after`: do its actions (the cleanup of fixable items), then check again and
  decide from the memory they left.
- `Decision.probe_after`: do its actions (the stop after an attempt's end whose relaunch is due
  at once), then probe the workers again, with the launch-time checks, and decide from the
  memory they left: the relaunch in the same tick. That decision ends no attempt.
- `Decision.decide_again`: the same, when the probe found nothing of the attempt left on any
  worker: no stop and no second look; decide again from the memory it left with the same
  observation (the launch-time checks first, when they did not ride in the probe).
- `Decision.stop_first`: it would launch while nodes the job moved off owe a stop
  (policy/owed.py); the tick does those stops alone, waited for, and none of its other actions;
  decide again from the memory they left, with the ones that failed
  (`Observation.owed_stop_failed`: the launch waits, row `owed_stop_failed`). The tick passes
  those on to every later decision of the tick, so none is tried twice in one tick.
- a create or a maintenance start refused at the call: fed back as a failed create
  (`Observation.operation`, `create_failure`) or `Observation.maintenance_refused`; decide
  again from the memory the refused decision left. That decision queues or fails a create, or
  waits, and asks for no second call of the same kind.

So a tick decides at most MAX_DECIDES times (check first, a refusal, check after, and the
decision that follows; or an end, the look after its stop, check after, and the launch; or
check first, stop first, and the launch); one
more is a policy bug, and `decide_until_settled` raises it rather
than loop. Pure: it calls `decide` and the tick's `settle`, which journals and acts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from tpuwatch.policy.state import Memory
from tpuwatch.policy.table import decide
from tpuwatch.policy.values import Decision, Observation, PolicyConfig

MAX_DECIDES = 4


class UnsettledTick(RuntimeError):
    """A tick asked for more decisions than MAX_DECIDES: a bug in the policy, not in the job."""


@dataclass(frozen=True)
class Again:
    """Decide once more in this tick: with `obs`, from `memory`."""

    obs: Observation
    memory: Memory


# The tick's part: journal and act on a decision (or not, for check_first), and say what to
# decide again with; None when the decision is final. Called with the decision, the observation
# and the memory it was decided from.
Settle = Callable[[Decision, Observation, Memory], "Again | None"]


def decide_until_settled(obs: Observation, mem: Memory, cfg: PolicyConfig, now: datetime,
                         settle: Settle) -> Decision:
    """Decide, hand each decision to `settle`, and decide again while it asks; the last decision.

    Raises UnsettledTick when `settle` still asks after MAX_DECIDES decisions.
    """
    decision = decide(obs, mem, cfg, now)
    for _ in range(MAX_DECIDES - 1):
        again = settle(decision, obs, mem)
        if again is None:
            return decision
        obs, mem = again.obs, again.memory
        decision = decide(obs, mem, cfg, now)
    if settle(decision, obs, mem) is not None:
        raise UnsettledTick(
            f"policy bug: {MAX_DECIDES} decisions in one tick and still not settled (last row "
            f"{decision.row!r}, phase {decision.memory.phase.value}); the tick stops here")
    return decision
