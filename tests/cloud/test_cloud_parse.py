"""Pure parts of the cloud adapters: times, enums, snapshots, the audit filter and cursor."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from google.cloud import tpu_v2, tpu_v2alpha1
from google.protobuf import timestamp_pb2

from tpuwatch.cloud import logs
from tpuwatch.cloud.tpu.adapter import enum_name, parse_maintenance_time, parse_rfc3339, snapshot
from tpuwatch.errors import UsageError
from tpuwatch.model import AuditEvent

UTC = timezone.utc


def test_maintenance_time_from_the_documented_text() -> None:
    t = parse_maintenance_time("The TPU had a maintenance event at 2022-01-26T03:44:36.265703305Z")
    assert t == datetime(2022, 1, 26, 3, 44, 36, 265703, tzinfo=UTC)


@pytest.mark.parametrize(
    "text",
    ["", "The TPU is unhealthy", "maintenance at some point", "The TPU had a maintenance event at 2022-13-45T99:00:00Z"],
)
def test_other_texts_give_no_time(text: str) -> None:
    assert parse_maintenance_time(text) is None


def test_rfc3339_offsets_and_precision() -> None:
    assert parse_rfc3339("2024-05-01T02:00:00+02:00") == datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_rfc3339("x 2024-05-01T00:00:00.5Z y") == datetime(2024, 5, 1, 0, 0, 0, 500000, tzinfo=UTC)
    assert parse_rfc3339("2024-05-01") is None


def test_unknown_enum_numbers_are_named_not_raised() -> None:
    pb = tpu_v2alpha1.Node.pb()(name="projects/p/locations/us-central2-b/nodes/n")
    pb.state = 42
    pb.health = 99
    assert enum_name(pb, "state") == "UNKNOWN_ENUM_42"
    snap = snapshot(pb)
    assert (snap.state, snap.health) == ("UNKNOWN_ENUM_42", "UNKNOWN_ENUM_99")
    assert not snap.usable


def test_snapshot_reads_every_field() -> None:
    def ts(t: datetime) -> timestamp_pb2.Timestamp:
        out = timestamp_pb2.Timestamp()
        out.FromDatetime(t)
        return out

    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    node = tpu_v2alpha1.Node(
        name="projects/p-1/locations/us-central2-b/nodes/llm-pod",
        id=1234,
        create_time=ts(t0),
        state=tpu_v2alpha1.Node.State.READY,
        health=tpu_v2alpha1.Node.Health.UNHEALTHY_MAINTENANCE,
        health_description="The TPU had a maintenance event at 2024-05-01T12:30:00.000000001Z",
        accelerator_config=tpu_v2alpha1.AcceleratorConfig(type_=tpu_v2alpha1.AcceleratorConfig.Type.V4, topology="2x2x2"),
        runtime_version="tpu-ubuntu2204-base",
        scheduling_config=tpu_v2alpha1.SchedulingConfig(spot=True),
        network_endpoints=[
            tpu_v2alpha1.NetworkEndpoint(ip_address="10.0.0.2", access_config=tpu_v2alpha1.AccessConfig(external_ip="34.1.1.1")),
            tpu_v2alpha1.NetworkEndpoint(ip_address="10.0.0.3"),
        ],
        symptoms=[tpu_v2alpha1.Symptom(symptom_type=tpu_v2alpha1.Symptom.SymptomType.OUT_OF_MEMORY,
                                       worker_id="1", details="oom", create_time=ts(t0))],
        upcoming_maintenance=tpu_v2alpha1.UpcomingMaintenance(
            type_=tpu_v2alpha1.UpcomingMaintenance.MaintenanceType.SCHEDULED,
            maintenance_status=tpu_v2alpha1.UpcomingMaintenance.MaintenanceStatus.PENDING,
            can_reschedule=True, window_start_time="2024-05-08T12:00:00Z",
        ),
        labels={"tpuwatch-job": "run1"},
        metadata={"startup-script": "#!/bin/sh", "a": "b"},
    )
    s = snapshot(node)
    assert (s.project, s.zone, s.name, s.id) == ("p-1", "us-central2-b", "llm-pod", "1234")
    assert s.create_time == t0
    assert (s.state, s.health) == ("READY", "UNHEALTHY_MAINTENANCE")
    assert s.maintenance_time == datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    assert (s.accelerator_type, s.topology, s.spot, s.preemptible) == ("v4", "2x2x2", True, False)
    assert [(w.index, w.internal_ip, w.external_ip) for w in s.workers] == [(0, "10.0.0.2", "34.1.1.1"), (1, "10.0.0.3", "")]
    assert s.symptoms[0].type == "OUT_OF_MEMORY" and s.symptoms[0].worker_id == "1"
    um = s.upcoming_maintenance
    assert um is not None and (um.type, um.status, um.can_reschedule) == ("SCHEDULED", "PENDING", True)
    assert um.window_start == t0 + timedelta(days=7) and um.window_end is None
    assert s.labels == {"tpuwatch-job": "run1"} and s.metadata_keys == ("a", "startup-script")
    # A v2 node (no upcoming_maintenance field) works too.
    v2 = snapshot(tpu_v2.Node(name="projects/p-1/locations/us-central2-b/nodes/x", accelerator_type="v4-8"))
    assert v2.upcoming_maintenance is None and v2.accelerator_type == "v4-8" and v2.state == "STATE_UNSPECIFIED"


def test_filter_has_the_documented_shape() -> None:
    start = logs.to_ns(datetime(2024, 5, 1, tzinfo=UTC)) + 5
    assert logs.build_filter("p", ["b", "a", "a"], start) == (
        'logName="projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event" '
        'AND protoPayload.methodName=("tpu.nodes.terminate" OR "tpu.nodes.restart" OR '
        '"compute.instances.upcomingMaintenance" OR "compute.instances.hostError" OR "compute.instances.preempted" '
        'OR "compute.instances.terminateOnHostMaintenance" OR "compute.instances.repair.recreateInstance" '
        'OR "compute.instances.automaticRestart") '
        'AND timestamp>="2024-05-01T00:00:00.000000005Z" '
        'AND (protoPayload.resourceName:"nodes/a" OR protoPayload.resourceName:"nodes/b")'
    )
    with pytest.raises(UsageError):
        logs.build_filter("p", ['a" OR "x'], start)


def test_resource_names_match_exactly() -> None:
    base = "projects/p/locations/us-central2-b/nodes/"
    assert logs.match_resource(base + "a", ["a"]) == ("a", None)
    assert logs.match_resource(base + "a/workers/3", ["a"]) == ("a", "3")
    assert logs.match_resource(base + "ab", ["a"]) is None
    assert logs.match_resource(base + "ab/workers/0", ["a"]) is None
    assert logs.match_resource(base + "a", ["a"], zone="us-central2-b") == ("a", None)
    assert logs.match_resource(base + "a", ["a"], zone="europe-west4-a") is None


def test_upcoming_maintenance_entries_name_a_worker_vm_and_match_through_its_instance_name() -> None:
    # The shape of Google's example entry: a Compute Engine instance, not nodes/<name>.
    vm = "projects/p/zones/us-central2-b/instances/t1v-n-9472280f-w-1"
    instances = {"t1v-n-9472280f-w-0": ("a", "0"), "t1v-n-9472280f-w-1": ("a", "1")}
    assert logs.match_resource(vm, ["a"], "us-central2-b", instances) == ("a", "1")
    assert logs.match_resource(vm, ["a"]) is None  # without the node's instance names: nobody's
    assert logs.match_resource(vm, ["b"], None, instances) is None
    assert logs.match_resource(vm, ["a"], "europe-west4-a", instances) is None
    start = logs.to_ns(datetime(2024, 5, 1, tzinfo=UTC))
    assert logs.build_filter("p", ["a"], start, ["t1v-n-9472280f-w-0"]).endswith(
        '(protoPayload.resourceName:"nodes/a" OR protoPayload.resourceName:"instances/t1v-n-9472280f-w-0")')
    assert logs.build_filter("p", None, start).endswith(
        '(protoPayload.resourceName:"nodes/" OR protoPayload.resourceName:"instances/t1v-n-" '
        'OR resource.type="gce_instance")')
    scoped = logs.build_filter("p", None, start, scope=["zones/z-1/instances/b", "zones/z-1/instances/a", 'x" OR "y'])
    assert scoped.endswith('OR protoPayload.resourceName=("projects/p/zones/z-1/instances/a" OR '
                           '"projects/p/zones/z-1/instances/b"))') and "gce_instance" not in scoped
    assert "instances/t1v-n-\")" in logs.build_filter("p", None, start, scope=[])  # no instance watched: none
    many = [f"zones/z-1/instances/vm-{i}" for i in range(400)]  # too long for one filter: every instance's
    assert logs.build_filter("p", None, start, scope=many).endswith('OR resource.type="gce_instance")')


def test_cursor_round_trips_and_tolerates_garbage() -> None:
    c = logs.encode_cursor(123, [(120, "x"), (123, "y")])
    assert logs.decode_cursor(c) == (123, {(120, "x"), (123, "y")})
    for bad in (None, "", "v0:{}", "v1:{not json", 'v1:{"t": "a", "seen": []}'):
        assert logs.decode_cursor(bad) is None


def test_ns_conversions() -> None:
    t = datetime(2024, 5, 1, 0, 0, 1, 250000, tzinfo=UTC)
    ns = logs.to_ns(t)
    assert ns == 1714521601_250000000
    assert logs.from_ns(ns) == t
    assert logs.rfc3339_ns(ns + 7) == "2024-05-01T00:00:01.250000007Z"


def _ev(ns: int, iid: str) -> tuple[int, AuditEvent]:
    return ns, AuditEvent(logs.from_ns(ns), "terminate", "a", None, "tpu.nodes.terminate", "", iid, "nodes/a")


def test_cursor_catches_late_entries_and_never_repeats() -> None:
    overlap = 100
    # poll 1 sees entries at 1000 and 1050
    fresh, high, seen = logs.take_new([_ev(1000, "x"), _ev(1050, "y")], 0, set(), overlap)
    assert [e.insert_id for e in fresh] == ["x", "y"] and high == 1050
    # poll 2 queries from high - overlap = 950: x and y come again, plus z (1020) that
    # reached the log late, and w (1100) that is simply new
    fresh, high, seen = logs.take_new([_ev(1000, "x"), _ev(1020, "z"), _ev(1050, "y"), _ev(1100, "w")], high, seen, overlap)
    assert [e.insert_id for e in fresh] == ["z", "w"] and high == 1100
    # keys older than the next query's start (1000) are forgotten; the rest are kept
    assert seen == {(1000, "x"), (1020, "z"), (1050, "y"), (1100, "w")}
    fresh, high, seen = logs.take_new([_ev(1020, "z"), _ev(1050, "y"), _ev(1100, "w")], high, seen, overlap)
    assert fresh == [] and high == 1100
    fresh, high, seen = logs.take_new([_ev(1500, "v")], high, seen, overlap)
    assert seen == {(1500, "v")}
    # same insertId at another time is another entry
    fresh, _, _ = logs.take_new([_ev(1501, "v")], high, seen, overlap)
    assert [e.insert_id for e in fresh] == ["v"]


def test_compute_engine_system_events_match_the_jobs_instances() -> None:
    instances = {"slice-a": ("slice", "0"), "slice-b": ("slice", "1")}
    for method, kind in (("compute.instances.hostError", "terminate"), ("compute.instances.preempted", "terminate"),
                         ("compute.instances.automaticRestart", "restart"),
                         ("compute.instances.repair.recreateInstance", "terminate"),
                         ("compute.instances.terminateOnHostMaintenance", "terminate")):
        raw = logs.RawEntry(ns=5, insert_id="i", method=method, worker_label=None, reason="",
                            resource_name="projects/p/zones/us-central1-c/instances/slice-b")
        ev = logs.event_of(raw, ["slice"], "us-central1-c", instances)
        assert ev is not None and (ev.kind, ev.node, ev.worker) == (kind, "slice", "1")
        foreign = raw._replace(resource_name="projects/p/zones/us-central1-c/instances/other-vm")
        assert logs.event_of(foreign, ["slice"], "us-central1-c", instances) is None
    flt = logs.build_filter("p", ["slice"], 0, instances)
    assert 'protoPayload.resourceName:"instances/slice-a"' in flt and '"compute.instances.hostError"' in flt
