"""policy/observe.py `follow_workers`: when the watcher holds follow channels, as a table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpuwatch.model import NodeSnapshot, WorkerEndpoint, WorkerProbe
from tpuwatch.policy.observe import follow_workers
from tpuwatch.policy.state import Memory, Phase

NODE = NodeSnapshot(name="pod", project="p", zone="z", id="1", create_time=None, state="READY", health="HEALTHY",
                    health_description="", maintenance_time=None,
                    workers=(WorkerEndpoint(0, "10.0.0.1", ""), WorkerEndpoint(1, "10.0.0.2", "")))
SICK = replace(NODE, health="UNHEALTHY_MAINTENANCE")
RUN = WorkerProbe(0, "running", attempt=3)


def probes(*states: tuple[str, int | None]) -> tuple[WorkerProbe, ...]:
    return tuple(WorkerProbe(i, s, attempt=a) for i, (s, a) in enumerate(states))  # type: ignore[arg-type]


CASES = [
    # (why, phase, node, probes, followed)
    ("every worker runs the attempt", Phase.RUNNING, NODE, probes(("running", 3), ("running", 3)), (0, 1)),
    ("launched this tick: the probe saw the attempt before", Phase.RUNNING, NODE,
     probes(("exited", 2), ("absent", None)), (0, 1)),
    ("one worker's end already seen by the probe: the others still wake it", Phase.RUNNING, NODE,
     probes(("exited", 3), ("running", 3)), (1,)),
    ("a worker killed: the probe saw it; the others still wake it", Phase.RUNNING, NODE,
     probes(("absent", 3), ("running", 3)), (1,)),
    ("every worker's end already seen", Phase.RUNNING, NODE, probes(("exited", 3), ("exited", 3)), ()),
    ("a worker unreachable", Phase.RUNNING, NODE, probes(("unreachable", None), ("running", 3)), ()),
    ("a newer attempt than the journal's", Phase.RUNNING, NODE, probes(("running", 4), ("running", 3)), ()),
    ("node not usable", Phase.RUNNING, SICK, probes(("running", 3), ("running", 3)), ()),
    ("no node", Phase.RUNNING, None, probes(("running", 3), ("running", 3)), ()),
    ("not probed", Phase.RUNNING, NODE, None, ()),
    ("backoff", Phase.BACKOFF, NODE, probes(("exited", 3), ("exited", 3)), ()),
    ("waiting for the node", Phase.WAITING_NODE, NODE, probes(("running", 3), ("running", 3)), ()),
]


@pytest.mark.parametrize(("why", "phase", "node", "seen", "followed"), CASES, ids=[c[0] for c in CASES])
def test_follow_workers(why: str, phase: Phase, node: NodeSnapshot | None, seen: tuple[WorkerProbe, ...] | None,
                        followed: tuple[int, ...]) -> None:
    mem = replace(Memory.initial("z"), phase=phase, attempt=replace(Memory.initial("z").attempt, number=3))
    assert follow_workers(mem, node, seen) == followed, why
