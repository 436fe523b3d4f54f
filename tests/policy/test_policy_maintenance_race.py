"""A maintenance is never charged, whatever order the watcher sees it in.

A tick reads the node, then probes the workers. A maintenance that begins between the two kills
the job on a node the tick saw READY+HEALTHY, and the audit log says so minutes later: the
tick sees a worker's process gone and nothing to explain it. Slower watchers widen the gap; a
watcher paused or killed long enough finds the node healed, READY+HEALTHY again, its health
description the only trace ("The TPU had a maintenance event at <time>"). These tests replay
each ordering against the pure policy.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from policy_support import at, ckpt, event, kinds, last_end, node, obs, probe, run_mem, tick

from tpuwatch.model import NodeSnapshot
from tpuwatch.policy import Memory, Phase

# attempt 1 started at 0; the maintenance takes the hosts down at 495, while the tick of 500
# (its `now`) runs: the node read first (still healthy), then the probe (the job gone)
VANISHED = (probe(0, "absent", 1), probe(1, "absent", 1))
KILLED = (probe(0, "absent", 1), probe(1, "exited", 1, 143))


def healed(t: datetime) -> NodeSnapshot:
    return replace(node(), health_description=f"The TPU had a maintenance event at {t.isoformat()}",
                   maintenance_time=t)


def first_sighting(probes: tuple = VANISHED) -> Memory:
    d = tick(obs(probes=probes, checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "end_confirm" and d.ended == () and d.memory.restarts == 0
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
    assert not d.ended[0].charged and d.memory.restarts == 0 and d.memory.disruptions == 1
    assert d.memory.end_seen is None


def test_a_healed_node_description_is_evidence_at_the_first_sighting_too() -> None:
    d = tick(obs(healed(at(495)), probes=VANISHED, checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.row == "disruption" and not d.ended[0].charged
    assert "maintenance event" in d.ended[0].reason


def test_the_maintenance_the_attempt_was_launched_after_explains_nothing() -> None:
    # the node healed at -10, the attempt launched on it at 0; its crash at 500 is charged
    mem = first_sighting()
    d = tick(obs(healed(at(-10)), probes=VANISHED, checkpoint=ckpt(150)), mem, now=510)
    assert d.row == "failure" and d.ended[0].charged and d.memory.restarts == 1


def test_a_maintenance_long_after_the_end_explains_nothing() -> None:
    # charged at 510; a maintenance at 3000 is a new story, not a late report of that end
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, checkpoint=ckpt(150), jitter=0.0), mem, now=510)
    assert d.ended[0].charged
    after = tick(obs(healed(at(3000)), probes=VANISHED, checkpoint=ckpt(150)), d.memory, now=3100)
    assert after.memory.restarts == 1 and after.memory.last_end is not None and after.memory.last_end.charged


def test_a_charged_end_is_refunded_by_the_maintenance_time_a_healed_node_shows() -> None:
    # Charged at 500 (the API still said HEALTHY at the confirming tick); the node, healed, says
    # its maintenance began at 490: inside the attempt, so the restart is refunded.
    mem = run_mem(phase=Phase.BACKOFF, restarts=1, backoff_level=1, backoff_until=at(520),
                  last_end=last_end(end=500.0))
    d = tick(obs(healed(at(490)), probes=VANISHED, checkpoint=ckpt(150)), mem, now=530)
    assert [e.outcome for e in d.ended] == ["disruption"] and not d.ended[0].charged
    assert d.memory.restarts == 0 and d.memory.disruptions == 1
    assert "maintenance event" in d.ended[0].reason and "arrived late" in d.ended[0].reason
    # the same node after a recreate (another id) refunds nothing
    other = tick(obs(replace(healed(at(490)), id="n2"), probes=VANISHED, checkpoint=ckpt(150)), mem, now=530)
    assert other.memory.restarts == 1


def test_an_audit_entry_still_explains_the_confirmed_end() -> None:
    mem = first_sighting()
    d = tick(obs(probes=VANISHED, events=(event("terminate", at(497), "MAINTENANCE"),), checkpoint=ckpt(150)),
             mem, now=510)
    assert d.row == "disruption" and kinds(d) == ["stop"] and not d.ended[0].charged
