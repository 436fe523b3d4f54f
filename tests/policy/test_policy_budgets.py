"""policy/budgets.py: the budgets compose, and the rows that fail the job read them."""

from __future__ import annotations

from dataclasses import replace

from tpuwatch.policy import Budgets, PolicyConfig
from tpuwatch.policy.budgets import CHARGED_END, NO_PROGRESS, RECREATES, RESTARTS, AnyOf

CFG = PolicyConfig(job="j", tpu_name="t", zones=("us-central2-b",), max_restarts=2, no_progress_limit=3,
                   max_recreates=1)


def test_a_limit_is_spent_at_its_setting_and_says_which_row_fails_the_job() -> None:
    assert RESTARTS.spent(Budgets(restarts=1), CFG) is None
    spent = RESTARTS.spent(Budgets(restarts=2), CFG)
    assert spent is not None and spent.row == "budget_spent"
    assert spent.why == "restart budget spent: 2 of recovery.max_restarts = 2 used"
    assert RECREATES.charge(Budgets(recreates=0)) == Budgets(recreates=1)
    assert RECREATES.spent(RECREATES.charge(Budgets()), CFG) is not None


def test_or_is_spent_when_either_is_the_first_in_order_speaking() -> None:
    assert isinstance(CHARGED_END, AnyOf)
    assert CHARGED_END.spent(Budgets(restarts=1, no_progress=2), CFG) is None
    only_restarts = CHARGED_END.spent(Budgets(restarts=2), CFG)
    assert only_restarts is not None and only_restarts.row == "budget_spent"
    both = CHARGED_END.spent(Budgets(restarts=2, no_progress=3), CFG)
    assert both is not None and both.row == "no_progress"  # a bug is said as one before the budget
    three = NO_PROGRESS | RESTARTS | RECREATES
    assert isinstance(three, AnyOf) and len(three.parts) == 3
    spent = three.spent(replace(Budgets(), recreates=1), CFG)
    assert spent is not None and spent.row == "recreate_budget_spent"


def test_a_restart_budget_of_zero_is_spent_at_the_first_charged_end() -> None:
    run = replace(CFG, max_restarts=0)  # `tpuwatch run`: one attempt, no recovery
    spent = CHARGED_END.spent(Budgets(), run)
    assert spent is not None and spent.row == "budget_spent"
