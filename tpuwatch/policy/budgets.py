"""The job's budgets as small values that compose: `RESTARTS | NO_PROGRESS`.

Each budget reads one count in Memory's `Budgets` against one [recovery] limit and says, when
it is spent, which row fails the job and why. `a | b` is spent when either is (the first one
spent speaks), in the style of tenacity's `stop_after_attempt(3) | stop_after_delay(60)`, so a
rule such as "a charged end fails the job past its restart budget or its no-progress limit" is
written once and read by every row that needs it (ending.finish and ending.ends_job;
recovery.recreate and recovery.recreate_missing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpuwatch.policy.state import Budgets

if TYPE_CHECKING:
    from tpuwatch.policy.values import PolicyConfig


@dataclass(frozen=True)
class Spent:
    """A spent budget: the row that fails the job, the count used and its limit, and why."""

    row: str
    used: int
    limit: int
    why: str


class Budget:
    """Spent or not, for the counts in `Budgets` and the limits in a PolicyConfig."""

    def spent(self, budgets: Budgets, cfg: PolicyConfig) -> Spent | None:
        raise NotImplementedError

    def __or__(self, other: Budget) -> Budget:
        return AnyOf((self, other))


@dataclass(frozen=True)
class Limit(Budget):
    """One count (a `Budgets` field) against one limit (a PolicyConfig field, [recovery] key)."""

    row: str  # the row that fails the job once it is spent
    count: str  # the Budgets field
    setting: str  # the PolicyConfig field, named as the [recovery] key
    what: str  # how the reason names it

    def used(self, budgets: Budgets) -> int:
        return int(getattr(budgets, self.count))

    def spent(self, budgets: Budgets, cfg: PolicyConfig) -> Spent | None:
        used, limit = self.used(budgets), int(getattr(cfg, self.setting))
        if used < limit:
            return None
        return Spent(self.row, used, limit, f"{self.what} spent: {used} of recovery.{self.setting} = {limit} used")

    def charge(self, budgets: Budgets) -> Budgets:
        """One more used."""
        more: dict[str, object] = {self.count: self.used(budgets) + 1}
        return replace(budgets, **more)  # type: ignore[arg-type]  # count names an int field


@dataclass(frozen=True)
class AnyOf(Budget):
    """Spent when any of its budgets is: the first spent one, in order."""

    parts: tuple[Budget, ...]

    def spent(self, budgets: Budgets, cfg: PolicyConfig) -> Spent | None:
        return next((s for part in self.parts if (s := part.spent(budgets, cfg)) is not None), None)

    def __or__(self, other: Budget) -> Budget:
        return AnyOf((*self.parts, other))


# Charged attempts in a row that added no checkpoint: the same failure again and again is a
# deterministic bug, not retried forever (row `no_progress`).
NO_PROGRESS = Limit("no_progress", "no_progress", "no_progress_limit", "no-progress limit")
RESTARTS = Limit("budget_spent", "restarts", "max_restarts", "restart budget")
RECREATES = Limit("recreate_budget_spent", "recreates", "max_recreates", "recreate budget")

# What a charged end may not pass: checked in this order (a bug is said as one before the budget).
CHARGED_END = NO_PROGRESS | RESTARTS
