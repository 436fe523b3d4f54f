"""A maintenance is never charged, whatever order the watcher sees it in.

A tick reads the node, then probes the workers. A maintenance that begins between the two kills
the job on a node the tick saw READY+HEALTHY, and the audit log says so minutes later: the
tick sees a worker's process gone and nothing to explain it. Slower watchers widen the gap; a
watcher paused or killed long enough finds the node healed, READY+HEALTHY again, its health
description the only trace ("The TPU had a maintenance event at <time>"). The end is charged
and the job relaunched at once; the next node read, however late, and those within a minute
refund it when they show the host going away. These tests replay each ordering against the pure
policy.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from policy_support import at, ckpt, event, kinds, last_end, node, obs, probe, run_mem, tick

from tpuwatch.model import NodeSnapshot
from tpuwatch.policy import Budgets, Memory, Phase

# attempt 1 started at 0; the maintenance takes the hosts down at 495, while the tick of 500
# (its `now`) runs: the node read first (still healthy), then the probe (the job gone)
VANISHED = (probe(0, "absent", 1), probe(1, "absent", 1))
KILLED = (probe(0, "absent", 1), probe(1, "exited", 1, 143))


def healed(t: datetime) -> NodeSnapshot:
    return replace(node(), health_description=f"The TPU had a maintenance event at {t.isoformat()}",
                   maintenance_time=t)


def first_sighting(probes: tuple = VANISHED) -> Memory:
    """Charged on sight, relaunched at once (backoff over now), the charge open to the next reads."""
    d = tick(obs(probes=probes, checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "failure" and [e.charged for e in d.ended] == [True] and d.memory.budgets.restarts == 1
    assert d.memory.budgets.backoff_until == at(500) and d.memory.budgets.confirm_by == at(560)
    return d.memory


@pytest.mark.parametrize("probes", [VANISHED, KILLED], ids=["vanished", "sigterm"])
@pytest.mark.parametrize("later", [
    pytest.param(lambda: node("READY", "UNHEALTHY_MAINTENANCE"), id="under-maintenance"),
    pytest.param(lambda: node("REPAIRING", "UNHEALTHY_MAINTENANCE"), id="repairing"),
    # the watcher was slow (or killed and started again) past the heal: the description is left
    pytest.param(lambda: healed(at(502)), id="healed-maintenance-after-the-tick-began"),
    pytest.param(lambda: healed(at(495)), id="healed"),
])
def test_an_end_seen_before_the_node_shows_the_maintenance_is_not_charged(probes: tuple, later: object) -> None:
    mem = first_sighting(probes)
    # a watcher killed between the two ticks resumes from the journal's copy of the memory
    mem = Memory.from_dict(mem.to_dict())
    n = later()  # type: ignore[operator]
    d = tick(obs(n, probes=VANISHED if n.state == "READY" else None, checkpoint=ckpt(150)), mem, now=900)
    assert [e.outcome for e in d.ended] == ["disruption"], d.summary
    assert not d.ended[0].charged and d.memory.budgets.restarts == 0 and d.memory.budgets.disruptions == 1
    assert d.memory.attempt.end_seen is None and d.memory.budgets.confirm_by is None


@pytest.mark.parametrize("later", [
    pytest.param(lambda: node("READY", "UNHEALTHY_MAINTENANCE"), id="under-maintenance"),
    pytest.param(lambda: node("REPAIRING", "UNHEALTHY_MAINTENANCE"), id="repairing"),
    pytest.param(lambda: node(id="n2"), id="recreated"),
])
def test_the_host_going_away_after_the_relaunch_refunds_the_end(later: object) -> None:
    # The relaunch's tick saw the node fine and launched attempt 2; a read 30 s later shows the
    # host going away: attempt 1's charge is refunded, and attempt 2 ends uncharged.
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, checkpoint=ckpt(150)), mem, now=501)
    assert d.row == "launch" and d.memory.budgets.restarts == 1 and d.memory.budgets.confirm_by == at(560)
    n = later()  # type: ignore[operator]
    gone = (probe(0, "absent", 2), probe(1, "absent", 2))
    after = tick(obs(n, probes=gone if n.state == "READY" else None, checkpoint=ckpt(150)), d.memory, now=530)
    assert [(e.attempt, e.outcome, e.charged) for e in after.ended] == [(1, "disruption", False),
                                                                        (2, "disruption", False)], after.summary
    assert after.memory.budgets.restarts == 0 and after.memory.budgets.disruptions == 2 and after.memory.budgets.confirm_by is None


def test_the_host_going_away_after_the_window_refunds_nothing() -> None:
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, checkpoint=ckpt(150)), mem, now=501)
    running = tick(obs(probes=(probe(0, "running", 2), probe(1, "running", 2)), checkpoint=ckpt(150)),
                   d.memory, now=570)
    assert running.row == "running" and running.memory.budgets.confirm_by is None and running.memory.budgets.restarts == 1
    later = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=None, checkpoint=ckpt(150)), running.memory,
                 now=600)
    assert [(e.attempt, e.charged) for e in later.ended] == [(2, False)] and later.memory.budgets.restarts == 1


def test_an_end_that_would_fail_the_job_waits_for_the_next_read() -> None:
    # max_restarts spent: charging the end fails the job, so the next read comes first
    d = tick(obs(probes=VANISHED, checkpoint=ckpt(150)), run_mem(budgets=Budgets(restarts=2)), now=500)
    assert d.row == "end_confirm" and d.ended == () and d.memory.attempt.end_seen == at(500)
    later = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=None, checkpoint=ckpt(150)), d.memory, now=505)
    assert [e.outcome for e in later.ended] == ["disruption"] and later.memory.phase is not Phase.FAILED
    fine = tick(obs(probes=VANISHED, checkpoint=ckpt(150)), d.memory, now=505)
    assert fine.row == "budget_spent" and fine.memory.phase is Phase.FAILED


def test_a_healed_node_description_is_evidence_at_the_first_sighting_too() -> None:
    d = tick(obs(healed(at(495)), probes=VANISHED, checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "disruption" and not d.ended[0].charged
    assert "maintenance event" in d.ended[0].reason


def test_the_maintenance_the_attempt_was_launched_after_explains_nothing() -> None:
    # the node healed at -10, the attempt launched on it at 0; its crash at 500 stays charged
    mem = first_sighting()
    d = tick(obs(healed(at(-10)), probes=VANISHED, checkpoint=ckpt(150)), mem, now=510)
    assert d.row == "launch" and d.ended == () and d.memory.budgets.restarts == 1


def test_a_maintenance_long_after_the_end_explains_nothing() -> None:
    # charged at 510; a maintenance at 3000 is a new story, not a late report of that end
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, checkpoint=ckpt(150), jitter=0.0), mem, now=570)
    assert d.row == "launch" and d.memory.budgets.restarts == 1 and d.memory.budgets.confirm_by is None
    after = tick(obs(healed(at(3000)), probes=VANISHED, checkpoint=ckpt(150)), d.memory, now=3100)
    assert after.memory.budgets.restarts == 1 and after.memory.budgets.last_end is not None and after.memory.budgets.last_end.charged


def test_a_charged_end_is_refunded_by_the_maintenance_time_a_healed_node_shows() -> None:
    # Charged at 500 (the API still said HEALTHY at the confirming tick); the node, healed, says
    # its maintenance began at 490: inside the attempt, so the restart is refunded.
    mem = run_mem(phase=Phase.BACKOFF,
                  budgets=Budgets(restarts=1, backoff_level=1, backoff_until=at(520),
                                  last_end=last_end(end=500.0)))
    d = tick(obs(healed(at(490)), probes=VANISHED, checkpoint=ckpt(150)), mem, now=530)
    assert [e.outcome for e in d.ended] == ["disruption"] and not d.ended[0].charged
    assert d.memory.budgets.restarts == 0 and d.memory.budgets.disruptions == 1
    assert "maintenance event" in d.ended[0].reason and "arrived late" in d.ended[0].reason
    # the same node after a recreate (another id) refunds nothing
    other = tick(obs(replace(healed(at(490)), id="n2"), probes=VANISHED, checkpoint=ckpt(150)), mem, now=530)
    assert other.memory.budgets.restarts == 1


def test_an_audit_entry_still_explains_the_confirmed_end() -> None:
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, events=(event("terminate", at(497), "MAINTENANCE"),), checkpoint=ckpt(150)),
             mem, now=510)
    assert [e.outcome for e in d.ended] == ["disruption"] and not d.ended[0].charged and d.memory.budgets.restarts == 0
    assert d.row == "launch" and kinds(d) == ["launch"]
