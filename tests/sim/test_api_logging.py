"""The real Logging GAPIC client reading the simulator's system-event audit log; the filter subset."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.audit import audit_log_pb2

from tpuwatch.cloud.clients import logging_client
from tpuwatch.sim import logfilter
from tpuwatch.sim.metadata import worker_hostname
from tpuwatch.sim.records import rfc3339_ns
from tpuwatch.sim.simulator import Simulator

LOG = "cloudaudit.googleapis.com%2Fsystem_event"


def read(
    sim: Simulator, flt: str, *, page_size: int = 0, order_by: str = "timestamp asc"
) -> list[Any]:
    client = logging_client()
    return list(
        client.list_log_entries(
            request={
                "resource_names": [f"projects/{sim.project}"],
                "filter": flt,
                "order_by": order_by,
                "page_size": page_size,
            }
        )
    )


def payload(entry: Any) -> audit_log_pb2.AuditLog:
    out = audit_log_pb2.AuditLog()
    assert entry.proto_payload.Unpack(out)
    return out


def test_maintenance_entries_read_by_time_with_paging(sim_api: Simulator) -> None:
    sim_api.create_node("pod", "v4-32")
    sim_api.create_node("other")
    w = sim_api.world
    w.maintenance("other", heal_after=60)  # before the cut: must not be returned
    w.wait_node("other", "READY", health="HEALTHY")
    cut = time.time_ns()
    w.maintenance("pod", heal_after=60, reason="MAINTENANCE")
    w.wait_node("pod", "READY", health="HEALTHY")

    w.reset_calls()
    flt = f'"tpu.nodes.terminate" OR "tpu.nodes.restart" timestamp>="{rfc3339_ns(cut)}"'
    entries = read(sim_api, flt, page_size=1)
    assert w.call_count("ListLogEntries") == 2  # one page per entry, no empty last page
    assert len({e.insert_id for e in entries}) == len(entries) == 2
    terminate, restart = entries
    node = f"projects/{sim_api.project}/locations/{sim_api.zone}/nodes/pod"
    t, r = payload(terminate), payload(restart)
    assert (t.method_name, t.resource_name, t.service_name) == (
        "tpu.nodes.terminate",
        node,
        "tpu.googleapis.com",
    )
    assert t.metadata["terminateReason"] == "MAINTENANCE"
    assert (r.method_name, r.resource_name) == ("tpu.nodes.restart", node)
    assert terminate.log_name == f"projects/{sim_api.project}/logs/{LOG}"
    assert terminate.resource.type == "tpu_worker"
    assert dict(terminate.resource.labels) == {
        "project_id": sim_api.project,
        "zone": sim_api.zone,
        "node_id": "pod",
    }
    assert terminate.timestamp < restart.timestamp
    desc = read(sim_api, flt, order_by="timestamp desc")
    assert [e.insert_id for e in desc] == [restart.insert_id, terminate.insert_id]
    # The healthDescription names the terminate entry's time to the nanosecond.
    t_ns = terminate.timestamp.timestamp_pb().ToNanoseconds()
    assert (
        w.node("pod").health_description == f"The TPU had a maintenance event at {rfc3339_ns(t_ns)}"
    )


def test_the_audit_adapters_filter_form(sim_api: Simulator) -> None:
    for n in ("a", "b", "c", "ab"):
        sim_api.create_node(n, spot=True)
    w = sim_api.world
    start = time.time_ns()
    w.preempt("a")
    w.terminate("b", reason="HOST_ERROR")
    w.preempt("c")
    w.system_event("ab", "tpu.nodes.restart")
    w.upcoming_maintenance("ab", starts_in=86400)  # Compute Engine entries: instances/, not nodes/
    project = sim_api.project
    flt = (
        f'logName="projects/{project}/logs/{LOG}" AND protoPayload.methodName=("tpu.nodes.terminate" OR '
        f'"tpu.nodes.restart" OR "compute.instances.upcomingMaintenance") AND timestamp>="{rfc3339_ns(start)}" '
        'AND (protoPayload.resourceName:"nodes/a" OR protoPayload.resourceName:"nodes/b")'
    )
    got = [
        (payload(e).resource_name.rsplit("/", 1)[1], payload(e).method_name)
        for e in read(sim_api, flt)
    ]
    # "nodes/a" is a substring match, so node "ab" matches too, as it would in Cloud Logging.
    assert got == [
        ("a", "tpu.nodes.terminate"),
        ("b", "tpu.nodes.terminate"),
        ("ab", "tpu.nodes.restart"),
    ]
    # Upcoming maintenance is about each worker VM, in the shape of Google's example entry.
    hostname = worker_hostname(w.node("ab").id, 0)
    flt_vm = (f'protoPayload.methodName="compute.instances.upcomingMaintenance" AND '
              f'protoPayload.resourceName:"instances/{hostname}"')
    (entry,) = read(sim_api, flt_vm)
    assert payload(entry).resource_name == f"projects/{project}/zones/{sim_api.zone}/instances/{hostname}"
    assert payload(entry).service_name == "compute.googleapis.com" and entry.resource.type == "gce_instance"
    assert set(payload(entry).metadata) >= {"type", "windowStartTime", "windowEndTime", "latestWindowStartTime",
                                            "canReschedule", "maintenanceStatus"}
    reasons = [
        payload(e).metadata["terminateReason"]
        for e in read(sim_api, flt + ' AND protoPayload.methodName="tpu.nodes.terminate"')
    ]
    assert reasons == ["PREEMPTED", "HOST_ERROR"]
    later = read(sim_api, f'timestamp>"{rfc3339_ns(time.time_ns())}"')
    assert later == []


def test_unsupported_filter_is_invalid_argument_naming_the_token(sim_api: Simulator) -> None:
    with pytest.raises(exceptions.InvalidArgument, match="jsonPayload.foo"):
        read(sim_api, 'jsonPayload.foo="x"')
    with pytest.raises(exceptions.InvalidArgument, match="RFC 3339"):
        read(sim_api, 'timestamp>="yesterday"')
    with pytest.raises(exceptions.InvalidArgument, match="order_by"):
        read(sim_api, "", order_by="severity")


def test_log_read_quota_and_call_window(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with Simulator(root=tmp_path, workers=False, log_read_quota=3) as sim:
        monkeypatch.setenv("TPUWATCH_EMULATOR_HOST", sim.address)
        client = logging_client()
        for _ in range(3):
            client.list_log_entries(
                request={"resource_names": [f"projects/{sim.project}"]}, retry=None
            )
        with pytest.raises(exceptions.ResourceExhausted, match="Read requests per minute"):
            client.list_log_entries(
                request={"resource_names": [f"projects/{sim.project}"]}, retry=None
            )
        assert sim.world.max_calls_per_window("ListLogEntries", 60.0) == 4


def test_log_latency_hides_fresh_entries(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with Simulator(root=tmp_path, workers=False, log_latency=3600.0) as sim:  # 6 s real
        monkeypatch.setenv("TPUWATCH_EMULATOR_HOST", sim.address)
        sim.create_node("pod")
        sim.world.terminate("pod")
        assert len(sim.world.audit_entries()) == 1
        assert read(sim, "") == []


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ('protoPayload.methodName="tpu.nodes.terminate"', [0]),
        ('protoPayload.methodName=("tpu.nodes.terminate" OR "tpu.nodes.restart")', [0, 1]),
        ('"tpu.nodes.terminate" OR "tpu.nodes.restart"', [0, 1]),
        # OR binds tighter than AND, as in Cloud Logging.
        (
            'resource.labels.node_id="b" OR resource.labels.node_id="a" AND protoPayload.methodName:"restart"',
            [1],
        ),
        ('NOT protoPayload.methodName="tpu.nodes.terminate"', [1, 2]),
        ('-protoPayload.resourceName:"nodes/a"', [2]),
        (
            'timestamp>="1970-01-01T00:00:00.000000002Z" timestamp<"1970-01-01T00:00:00.000000003Z"',
            [1],
        ),
        ('timestamp<="1969-12-31T23:00:00.000000002-01:00"', [0, 1]),
        ('protoPayload.metadata.terminateReason="PREEMPTED"', [0]),
        ("severity>=NOTICE", [0]),
        (
            '(protoPayload.resourceName:"nodes/a" OR protoPayload.resourceName:"nodes/b") upcoming',
            [2],
        ),
        ("", [0, 1, 2]),
    ],
)
def test_filter_subset(flt: str, expected: list[int]) -> None:
    rows: list[dict[str, str | int]] = [
        {
            "protoPayload.methodName": "tpu.nodes.terminate",
            "timestamp": 1,
            "severity": "NOTICE",
            "protoPayload.resourceName": "projects/p/locations/z/nodes/a",
            "resource.labels.node_id": "a",
            "protoPayload.metadata.terminateReason": "PREEMPTED",
        },
        {
            "protoPayload.methodName": "tpu.nodes.restart",
            "timestamp": 2,
            "severity": "INFO",
            "protoPayload.resourceName": "projects/p/locations/z/nodes/a/workers/0",
            "resource.labels.node_id": "a",
        },
        {
            "protoPayload.methodName": "compute.instances.upcomingMaintenance",
            "timestamp": 3,
            "severity": "INFO",
            "protoPayload.resourceName": "projects/p/locations/z/nodes/b",
            "resource.labels.node_id": "b",
        },
    ]
    assert logfilter.select(logfilter.parse(flt), rows) == expected


@pytest.mark.parametrize(
    ("flt", "token"),
    [
        ('foo.bar="x"', "foo.bar"),
        ('logName="x" AND', "term"),
        ('(logName="x"', "')'"),
        ('logName="x', "unterminated"),
        ('timestamp:"2020"', "':'"),
        ("OR x", "OR"),
    ],
)
def test_filter_errors_name_the_token(flt: str, token: str) -> None:
    with pytest.raises(logfilter.FilterError, match=re.escape(token)):
        logfilter.parse(flt)
