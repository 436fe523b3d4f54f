"""policy/settle.py: one path for deciding again in a tick, bounded; and the rules the tick used to hold."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_support import (
    CFG,
    ZONES,
    at,
    ckpt,
    event,
    idle,
    kinds,
    node,
    obs,
    op,
    probe,
    run_mem,
    running,
    tick,
)

from tpuwatch.model import QueuedStatus
from tpuwatch.policy import (
    MAX_DECIDES,
    Again,
    Attempt,
    Budgets,
    ClearQueued,
    CreateNode,
    Decision,
    Memory,
    Observation,
    Phase,
    Recreate,
    StopWorkers,
    UnsettledTick,
    decide_until_settled,
)


def _creating() -> Memory:
    return idle(phase=Phase.CREATING, recreate=Recreate(pending_op="op-c"), budgets=Budgets(recreates=1))


def test_each_decision_goes_to_settle_with_what_it_was_decided_from() -> None:
    seen: list[tuple[str, Phase]] = []

    def settle(d: Decision, o: Observation, m: Memory) -> Again | None:
        seen.append((d.row, m.phase))
        return None

    d = decide_until_settled(obs(probes=running(1)), idle(), CFG, at(10), settle)
    assert seen == [(d.row, Phase.IDLE)]


def test_a_tick_decides_again_up_to_the_bound() -> None:
    calls: list[Decision] = []

    def settle(d: Decision, o: Observation, m: Memory) -> Again | None:
        calls.append(d)
        return Again(o, d.memory) if len(calls) < MAX_DECIDES else None

    last = decide_until_settled(obs(probes=running(1)), idle(), CFG, at(10), settle)
    assert len(calls) == MAX_DECIDES and last is calls[-1]


def test_past_the_bound_is_a_policy_bug() -> None:
    calls: list[Decision] = []

    def settle(d: Decision, o: Observation, m: Memory) -> Again | None:
        calls.append(d)
        return Again(o, m)  # never settles

    with pytest.raises(UnsettledTick, match=f"{MAX_DECIDES} decisions in one tick"):
        decide_until_settled(obs(probes=running(1)), idle(), CFG, at(10), settle)
    assert MAX_DECIDES == 4 and len(calls) == MAX_DECIDES


def test_a_refused_create_decided_again_is_queued_and_clears_an_ended_queued_resource() -> None:
    # The create the first decision makes is refused at the call: fed back as a failed create,
    # the decision queues it, and (the job has a queued resource) deletes the ended request.
    qr = QueuedStatus("projects/p/locations/z/queuedResources/qr", "FAILED")
    first = tick(obs(missing=True, queued=qr), idle(phase=Phase.QUEUED,
                                                    recreate=Recreate(queued_since=at(0), retry_at=at(5),
                                                                      queue_tries=1),
                                                    budgets=Budgets(recreates=1)), now=10)
    assert first.row == "queue_retry" and kinds(first) == ["create"]
    refused = obs(missing=True, queued=qr, operation=op("", code=8, message="no capacity"),
                  create_failure="queueable")
    again = tick(refused, first.memory, now=10)
    assert again.row == "no_capacity" and kinds(again) == ["wait", "clear_queued"]
    assert again.actions[1] == ClearQueued(ZONES[0], again.actions[1].reason)  # type: ignore[union-attr]
    plain = tick(replace(refused, queued=None), first.memory, now=10)
    assert kinds(plain) == ["wait"]  # a plain node: no queued resource to clear


def test_a_create_carries_what_the_startup_script_needs() -> None:
    d = tick(obs(missing=True, recreate_missing=True, checkpoint=ckpt(300)),
             idle(attempt=Attempt(number=2)), now=5)
    create = d.actions[0]
    assert isinstance(create, CreateNode) and not create.resumed
    assert dict(create.startup) == {"attempt": "3", "checkpoint": "/ckpt/300", "step": "300"}
    multi = replace(CFG, slices=("np-0", "np-1"), recreatable=True)
    d = tick(obs(missing=True, recreate_missing=True, checkpoint=ckpt(300)), idle(), now=5, cfg=multi)
    assert isinstance(d.actions[0], CreateNode) and dict(d.actions[0].startup) == {"launch": "false"}
    resume = tick(obs(missing=True), replace(_creating(),
                                             recreate=replace(_creating().recreate, pending_op=None)), now=5)
    assert resume.row == "create_resume" and isinstance(resume.actions[0], CreateNode)
    assert resume.actions[0].resumed


def test_a_stop_the_workers_cannot_take_says_why() -> None:
    # The attempt ends under a maintenance that refuses SSH: a stop would fail the same way.
    down = (probe(0, "unreachable", None), probe(1, "unreachable", None))
    d = tick(obs(node("READY", "UNHEALTHY_MAINTENANCE"), probes=down, checkpoint=ckpt(100)), run_mem(), now=1000)
    assert [a.blocked for a in d.actions if isinstance(a, StopWorkers)] == ["none answered this tick's probe"]
    done = idle(phase=Phase.DONE, reason="x")
    for n, blocked in ((node("REPAIRING", "UNHEALTHY_MAINTENANCE"), "node is REPAIRING, its workers cannot be reached"),
                       (None, "node is missing, its workers cannot be reached"),
                       (node(), "")):
        d = tick(obs(n, missing=n is None, probes=(probe(0, "running", 1), probe(1, "unreachable", None))), done, now=5)
        assert [a.blocked for a in d.actions if isinstance(a, StopWorkers)] == [blocked]


def test_an_end_whose_relaunch_is_due_is_relaunched_in_the_same_tick() -> None:
    """The stop after the end, then a fresh look at the workers, then the launch: one tick."""
    ended = (probe(0, "exited", 1, 139), probe(1, "running", 1))
    stopped = (probe(0, "exited", 1, 139), probe(1, "exited", 1, 143))
    seen: list[tuple[str, list[str]]] = []

    def settle(d: Decision, o: Observation, m: Memory) -> Again | None:
        seen.append((d.row, kinds(d)))
        return Again(replace(o, probes=stopped), d.memory) if d.probe_after else None

    d = decide_until_settled(obs(probes=ended, checkpoint=ckpt(150)), run_mem(), CFG, at(500), settle)
    assert seen == [("failure", ["stop", "wait"]), ("launch", ["launch"])]
    assert d.memory.attempt.number == 2 and d.memory.budgets.restarts == 1
    # with a backoff to wait (the second charged end in a row), or a notice to hold for, no look
    backoff = tick(obs(probes=ended, checkpoint=ckpt(150)), run_mem(budgets=Budgets(backoff_level=1)), now=500)
    assert backoff.row == "failure" and not backoff.probe_after
    # the node gone: nothing to relaunch on
    gone = tick(obs(node("PREEMPTED"), probes=None), run_mem(), now=500)
    assert gone.ended and not gone.probe_after
    # a disruption on a usable node (a late audit entry) relaunches at once too
    dis = tick(obs(probes=ended, checkpoint=ckpt(150), events=(event("terminate", at(490)),)), run_mem(), now=500)
    assert dis.row == "disruption" and dis.probe_after


def test_an_end_with_nothing_left_to_stop_is_relaunched_from_the_same_look() -> None:
    """Every worker's command ended or its host rebooted: no stop, no second look; the launch
    is decided from what the probe saw, in the same tick. A process left over still means a stop."""
    rebooted = (probe(0, "absent", 1), probe(1, "absent", 1))
    crashed = (probe(0, "exited", 1, 1), probe(1, "exited", 1, 1))
    for probes in (rebooted, crashed):
        seen: list[tuple[str, list[str], Observation]] = []

        def settle(d: Decision, o: Observation, m: Memory,
                   seen: list[tuple[str, list[str], Observation]] = seen) -> Again | None:
            seen.append((d.row, kinds(d), o))
            assert not d.probe_after
            return Again(o, d.memory) if d.decide_again else None

        first = obs(probes=probes, checkpoint=ckpt(150))
        d = decide_until_settled(first, run_mem(), CFG, at(500), settle)
        assert [(row, k) for row, k, _ in seen][1:] == [("launch", ["launch"])]
        assert "stop" not in seen[0][1] and seen[0][0] in ("failure", "disruption")
        assert all(o is first for _, _, o in seen)  # nothing looked at again
        assert d.memory.attempt.number == 2
    # one worker's command ended but a process of it lives on: stopped, then looked at again
    lingering = (replace(probe(0, "exited", 1, 1), lingering=True), probe(1, "exited", 1, 1))
    d = tick(obs(probes=lingering, checkpoint=ckpt(150)), run_mem(), now=500)
    assert d.probe_after and not d.decide_again and "stop" in kinds(d)
    # a worker that did not answer: nothing is known of it, so the stop and the look stay
    unknown = (probe(0, "exited", 1, 1), probe(1, "unreachable", None))
    d = tick(obs(probes=unknown, checkpoint=ckpt(150)), run_mem(), now=500)
    assert not d.decide_again
