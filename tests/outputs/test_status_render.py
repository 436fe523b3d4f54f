"""The node panel and the JSON shape, for every Node.State and Node.Health value."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from google.cloud import tpu_v2alpha1
from rich.console import Console

from tpuwatch.cloud.tpu.adapter import snapshot
from tpuwatch.model import AuditEvent, NodeSnapshot, Symptom, UpcomingMaintenance, WorkerEndpoint
from tpuwatch.ui.node import BAD, OK, WAIT, health_style, node_panel, state_style
from tpuwatch.ui.serialize import node_json

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
STATES = list(tpu_v2alpha1.Node.State.__members__)
HEALTHS = list(tpu_v2alpha1.Node.Health.__members__)


def render(node: NodeSnapshot, events: Sequence[AuditEvent] = (), width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(node_panel(node, now=NOW, events=events))
    return console.export_text()


def full_node(state: str, health: str) -> NodeSnapshot:
    return NodeSnapshot(
        name="llm-pod-with-a-rather-long-name-0123456789",
        project="my-project-123456",
        zone="us-central2-b",
        id="7215436281987654321",
        create_time=NOW - timedelta(days=3),
        state=state,
        health=health,
        health_description="The TPU had a maintenance event at 2024-05-01T11:00:00.123456789Z",
        maintenance_time=NOW - timedelta(hours=1),
        symptoms=(Symptom("EXECUTE_TIMED_OUT", "3", NOW - timedelta(minutes=5), "x" * 150),),
        upcoming_maintenance=UpcomingMaintenance("SCHEDULED", "PENDING", True, NOW + timedelta(hours=3),
                                                 NOW + timedelta(hours=4), NOW + timedelta(days=2)),
        workers=tuple(WorkerEndpoint(i, f"10.130.0.{i + 2}", f"34.125.77.{i + 10}") for i in range(4)),
        accelerator_type="v4-32",
        topology="2x2x4",
        runtime_version="tpu-ubuntu2204-base",
        spot=True,
    )


@pytest.mark.parametrize("state", STATES + ["UNKNOWN_ENUM_42"])
def test_every_state_renders_and_serialises(state: str) -> None:
    health = HEALTHS[STATES.index(state) % len(HEALTHS)] if state in STATES else "UNKNOWN_ENUM_9"
    node = full_node(state, health)
    text = render(node)
    assert state in text and health in text
    assert all(len(line) <= 80 for line in text.splitlines())
    out = json.loads(json.dumps(node_json(node)))
    assert out["state"] == state and out["health"] == health
    assert out["maintenance_time"] == "2024-05-01T11:00:00.000000Z"
    assert out["upcoming_maintenance"]["window_start"] == "2024-05-01T15:00:00.000000Z"


@pytest.mark.parametrize("health", HEALTHS + ["UNKNOWN_ENUM_9"])
def test_every_health_renders(health: str) -> None:
    assert health in render(full_node("READY", health))


def test_one_colour_per_meaning() -> None:
    assert state_style("READY") == OK and health_style("HEALTHY") == OK
    for s in ("CREATING", "REPAIRING", "RESTARTING", "UNKNOWN"):
        assert state_style(s) == WAIT
    assert health_style("UNHEALTHY_MAINTENANCE") == WAIT
    for s in ("PREEMPTED", "TERMINATED", "STOPPED", "UNKNOWN_ENUM_77"):
        assert state_style(s) == BAD
    assert health_style("UNHEALTHY_TENSORFLOW") == BAD
    assert state_style("STATE_UNSPECIFIED") == "" and health_style("HEALTH_UNSPECIFIED") == ""
    # every value the client knows has a deliberate colour (or deliberately none)
    assert {s for s in STATES if state_style(s) == ""} == {"STATE_UNSPECIFIED"}
    assert {h for h in HEALTHS if health_style(h) == ""} == {"HEALTH_UNSPECIFIED"}


def test_panel_shows_the_facts_with_countdowns() -> None:
    ev = [
        AuditEvent(NOW - timedelta(hours=1), "terminate", "n", "0", "tpu.nodes.terminate", "MAINTENANCE", "i1", "r"),
        AuditEvent(NOW - timedelta(minutes=30), "restart", "n", "0", "tpu.nodes.restart", "", "i2", "r"),
    ]
    text = render(full_node("READY", "HEALTHY"), ev)
    assert "2024-05-01 11:00:00Z (1h00m ago)" in text  # parsed maintenance time
    assert "(in 3h00m)" in text  # upcoming window countdown
    assert "SCHEDULED PENDING" in text and "may be started early" in text
    assert "tpuwatch: nothing: the node has no" in text  # no tpuwatch-job label: nobody acts on it
    watched = render(replace(full_node("READY", "HEALTHY"), labels={"tpuwatch-job": "llm"}), ev)
    assert "tpuwatch: starts it after the job's next" in watched
    assert "10.130.0.5" in text and "34.125.77.13" in text
    assert "EXECUTE_TIMED_OUT worker 3" in text
    lines = text.splitlines()
    term = next(i for i, line in enumerate(lines) if "terminate" in line)
    rest = next(i for i, line in enumerate(lines) if "restart " in line)
    assert term < rest and "MAINTENANCE" in lines[term]
    assert "v4-32 (2x2x4) · tpu-ubuntu2204-base · spot" in text
    assert "llm-pod-with-a-rather-long-name-0123456789" in text.splitlines()[0]


def test_unknown_enum_from_the_wire_renders() -> None:
    pb = tpu_v2alpha1.Node.pb()(name="projects/p/locations/us-central2-b/nodes/n")
    pb.state, pb.health = 42, 17
    node = snapshot(pb)
    text = render(node)
    assert "UNKNOWN_ENUM_42" in text and "UNKNOWN_ENUM_17" in text
    assert node_json(node)["state"] == "UNKNOWN_ENUM_42"


def test_a_compute_engine_vms_pending_stop_is_in_the_json() -> None:
    node = full_node("READY", "HEALTHY")
    assert node_json(node)["pending_stop"] is False
    assert node_json(replace(node, pending_stop=True))["pending_stop"] is True
