"""Ownership and create-error classification (pure parts of tpuwatch.recreate)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from google.api_core import exceptions as gexc

from tpuwatch import recreate as rc
from tpuwatch.cloud.errors import Call, translate
from tpuwatch.model import NodeSnapshot, OperationStatus

NO_CAPACITY = ('There is no more capacity in the zone "us-central1-c"; you can try in another zone where '
               "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1a2b]")
QUOTA = ("Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
         "Limit: 0 in region us-east5.")
RESERVATION = "Insufficient reserved capacity. Contact customer support to increase your reservation."


def snap(labels: dict[str, str]) -> NodeSnapshot:
    return NodeSnapshot(name="pod", project="p", zone="us-central2-b", id="1",
                        create_time=datetime(2024, 1, 1, tzinfo=timezone.utc), state="READY", health="HEALTHY",
                        health_description="", maintenance_time=None, labels=labels)


@pytest.mark.parametrize(
    ("labels", "job", "expected"),
    [
        ({"tpuwatch-job": "myjob"}, "myjob", True),
        ({"tpuwatch-job": "myjob-2"}, "myjob", False),  # a value that starts with the job name
        ({"tpuwatch-job": "my"}, "myjob", False),
        ({"tpuwatch-job": "MYJOB"}, "myjob", False),
        ({"tpuwatch-job": ""}, "", False),
        ({"team": "myjob"}, "myjob", False),
        ({}, "myjob", False),
    ],
)
def test_owned_means_the_label_value_is_exactly_the_job(labels: dict[str, str], job: str, expected: bool) -> None:
    assert snap(labels).owned_by(job) is expected


def test_ownership_error_names_the_label_and_the_ways_out() -> None:
    err = rc.ownership_error(snap({"tpuwatch-job": "myjob-2"}), "myjob")
    assert err.exit_code == 1
    assert "has tpuwatch-job=myjob-2, not tpuwatch-job=myjob" in err.message
    assert "tpuwatch init pod --adopt" in err.message
    assert "--update-labels tpuwatch-job=myjob" in err.message


@pytest.mark.parametrize(
    ("code", "message", "ours", "kind", "reason"),
    [
        (8, NO_CAPACITY, False, "queueable", "no_capacity"),
        ("RESOURCE_EXHAUSTED", QUOTA, False, "queueable", "quota"),
        ("429", QUOTA, False, "queueable", "quota"),
        (9, RESERVATION, False, "queueable", "reservation"),
        (8, RESERVATION, False, "queueable", "reservation"),  # as users see it: the text decides
        (14, "The service is currently unavailable.", False, "queueable", "unavailable"),
        (6, "Resource 'projects/p/locations/z/nodes/pod' already exists", True, "exists", "already_exists"),
        (6, "Resource 'projects/p/locations/z/nodes/pod' already exists", False, "fatal", "already_exists"),
        (3, 'Accelerator type "v9-8" is not available in zone "us-central2-b".', False, "fatal", "other"),
        (7, "Permission 'tpu.nodes.create' denied", False, "fatal", "other"),
        (9, "update is not supported while in state PREEMPTED", False, "fatal", "other"),
    ],
)
def test_classify_create_error(code: int | str, message: str, ours: bool, kind: str, reason: str) -> None:
    failure = rc.classify_create_error(code, message, started_by_us=ours)
    assert (failure.kind, failure.reason) == (kind, reason)
    assert failure.message == message


def test_classify_operation_keeps_the_api_text() -> None:
    assert rc.classify_operation(OperationStatus("op", done=False)) is None
    assert rc.classify_operation(OperationStatus("op", done=True)) is None
    failure = rc.classify_operation(OperationStatus("op", done=True, error_code=8, error_message=NO_CAPACITY))
    assert failure is not None and failure.queueable and failure.message == NO_CAPACITY
    assert failure.code == "RESOURCE_EXHAUSTED"


def test_classify_exception_reads_through_the_adapters_wrapper() -> None:
    call = Call("TPU API", "create_node", "projects/p/locations/z/nodes/pod", "tpu.nodes.create", "tpu.googleapis.com")
    original = gexc.ResourceExhausted(QUOTA)
    try:
        try:
            raise original
        except gexc.ResourceExhausted as exc:
            raise translate(exc, call, project="p") from None
    except Exception as wrapped:
        failure = rc.classify_exception(wrapped, started_by_us=False)
    assert failure.reason == "quota" and failure.message == QUOTA
    direct = rc.classify_exception(gexc.FailedPrecondition(RESERVATION), started_by_us=False)
    assert direct.reason == "reservation"
    assert rc.classify_exception(ValueError("boom"), started_by_us=False).kind == "fatal"


def _cfg(**job: object) -> object:
    from tpuwatch.config import Config, validate

    raw = {"tpu": {"name": "pod", "zone": "us-central2-b"}, "job": {"command": "python3 train.py", **job},
           "ssh": {"user": "me"}}
    return Config(values=validate(raw))


def test_job_env_stays_out_of_node_metadata_unless_asked() -> None:
    """Node metadata is readable by anyone with tpu.nodes.get: an API key in [job] env must not
    land there by default. The startup script then only sets up; the watcher starts the job."""
    launch = {"attempt": "4", "checkpoint": "gs://b/ck/900", "step": "900"}
    meta = rc.launch_metadata(_cfg(env={"WANDB_API_KEY": "s3cret"}), launch)  # type: ignore[arg-type]
    assert "s3cret" not in repr(meta) and "tpuwatch-env" not in meta
    assert meta["tpuwatch-env-withheld"] == "true"
    assert not {"tpuwatch-attempt", "tpuwatch-checkpoint", "tpuwatch-step"} & set(meta)
    opted = rc.launch_metadata(_cfg(env={"WANDB_API_KEY": "s3cret"}, env_in_metadata=True), launch)  # type: ignore[arg-type]
    assert opted["tpuwatch-env"] == "WANDB_API_KEY=s3cret\n" and "tpuwatch-env-withheld" not in opted
    assert (opted["tpuwatch-attempt"], opted["tpuwatch-step"]) == ("4", "900")
    plain = rc.launch_metadata(_cfg(), launch)  # type: ignore[arg-type]
    assert "tpuwatch-env-withheld" not in plain and plain["tpuwatch-attempt"] == "4"
