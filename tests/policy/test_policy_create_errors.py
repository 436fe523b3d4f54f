"""policy/create_errors.py: which create errors are queued, fallen back from or fatal is data,
and tpuwatch.recreate classifies by it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpuwatch import recreate as rc
from tpuwatch.policy import create_errors
from tpuwatch.policy.create_errors import CREATE_RULES, OTHER, kind_of, rule_for

NO_CAPACITY = 'There is no more capacity in the zone "us-central2-b"; you can try in another zone'


@pytest.mark.parametrize(("code", "text", "reason", "kind", "falls_back"), [
    ("RESOURCE_EXHAUSTED", NO_CAPACITY, "no_capacity", "queueable", True),
    ("429", "Quota limit 'TPUV4PerProjectPerRegionForTPUAPI' has been exceeded", "quota", "queueable", True),
    ("FAILED_PRECONDITION", "Insufficient reserved capacity", "reservation", "queueable", True),
    ("INTERNAL", "Internal error. Please try again.", "unavailable", "queueable", True),
    ("INTERNAL", "Internal error.", "other", "fatal", False),
    ("PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied", "other", "fatal", False),
])
def test_the_first_matching_rule_decides(code: str, text: str, reason: str, kind: str, falls_back: bool) -> None:
    rule = rule_for(code, text)
    assert (rule.reason, kind_of(rule, started_by_us=False), rule.falls_back) == (reason, kind, falls_back)


def test_already_exists_is_ours_only_when_tpuwatch_started_the_create() -> None:
    rule = rule_for("409", "Resource 'projects/p/locations/z/nodes/pod' already exists")
    assert rule.reason == "already_exists"
    assert kind_of(rule, started_by_us=True) == "exists" and kind_of(rule, started_by_us=False) == "fatal"


def test_recreate_classifies_by_the_policys_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing the table changes what the act side does: the classification is not code there."""
    failure = rc.classify_create_error(8, NO_CAPACITY, started_by_us=False)
    assert (failure.kind, failure.reason, failure.falls_back) == ("queueable", "no_capacity", True)
    stockout_fatal = tuple(replace(r, kind="fatal", falls_back=False) if r.reason == "no_capacity" else r
                           for r in CREATE_RULES)
    monkeypatch.setattr(create_errors, "CREATE_RULES", stockout_fatal)
    failure = rc.classify_create_error(8, NO_CAPACITY, started_by_us=False)
    assert (failure.kind, failure.reason, failure.falls_back) == ("fatal", "no_capacity", False)
    assert "no capacity in us-east5-a" in str(rc.CreateRejected(failure, "us-east5-a"))
    assert OTHER.what.format(zone="z") == "the create in z failed"
