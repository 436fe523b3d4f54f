"""Which API errors are retried, and what the user is told about the others."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc
from google.rpc import error_details_pb2

from tpuwatch.cloud.errors import Call, is_transient, translate
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import EXIT_CLOUD, UsageError

CALL = Call("TPU API", "get_node", "projects/p/locations/z/nodes/n", "tpu.nodes.get", "tpu.googleapis.com")


def test_transient_codes() -> None:
    for exc in (gexc.ServiceUnavailable("x"), gexc.DeadlineExceeded("x"), gexc.InternalServerError("x")):
        assert is_transient(exc, read=True) and is_transient(exc, read=False)
    assert is_transient(gexc.ResourceExhausted("quota"), read=True)
    assert not is_transient(gexc.ResourceExhausted("no capacity"), read=False)
    for exc in (gexc.PermissionDenied("x"), gexc.NotFound("x"), gexc.InvalidArgument("x"), gexc.Unauthenticated("x")):
        assert not is_transient(exc, read=True)


def test_permission_named_from_text_or_error_info() -> None:
    err = translate(gexc.PermissionDenied("Permission 'tpu.nodes.list' denied on resource '//tpu...'"), CALL, project="p")
    assert err.exit_code == EXIT_CLOUD
    assert "missing permission tpu.nodes.list" in err.message and "get_node(projects/p" in err.message
    info = error_details_pb2.ErrorInfo(reason="IAM_PERMISSION_DENIED", metadata={"permission": "tpu.nodes.get"})
    err = translate(gexc.PermissionDenied("denied", details=[info], error_info=info), CALL, project="p")
    assert "missing permission tpu.nodes.get" in err.message
    err = translate(gexc.PermissionDenied("The caller does not have permission"), CALL, project="p")
    assert "this call needs tpu.nodes.get" in err.message


def test_service_disabled_says_how_to_enable() -> None:
    info = error_details_pb2.ErrorInfo(reason="SERVICE_DISABLED", domain="googleapis.com")
    for exc in (
        gexc.PermissionDenied("Cloud TPU API has not been used in project 123 before or it is disabled."),
        gexc.PermissionDenied("nope", details=[info], error_info=info),
    ):
        err = translate(exc, CALL, project="p")
        assert "gcloud services enable tpu.googleapis.com --project p" in err.message


def test_unauthenticated_says_how_to_log_in() -> None:
    err = translate(gexc.Unauthenticated("Request had invalid authentication credentials."), CALL, project="p")
    assert "gcloud auth application-default login" in err.message


def test_policy_retries_transient_only() -> None:
    fast = RetryPolicy(max_attempts=4, multiplier=0.0, max_wait=0.0)
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise gexc.ServiceUnavailable("try again")
        return "ok"

    assert fast.call(flaky, transient=lambda e: is_transient(e, read=True)) == "ok"
    assert len(tries) == 3

    def denied() -> str:
        tries.append(1)
        raise gexc.PermissionDenied("no")

    tries.clear()
    with pytest.raises(gexc.PermissionDenied):
        fast.call(denied, transient=lambda e: is_transient(e, read=True))
    assert len(tries) == 1

    def down() -> str:
        tries.append(1)
        raise gexc.ServiceUnavailable("down")

    tries.clear()
    with pytest.raises(gexc.ServiceUnavailable):
        fast.call(down, transient=lambda e: is_transient(e, read=True))
    assert len(tries) == 4  # bounded


def test_backoff_scale_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUWATCH_API_BACKOFF_SCALE", "0.01")
    p = RetryPolicy.from_env()
    assert p.multiplier == pytest.approx(0.005) and p.max_wait == pytest.approx(0.1)
    monkeypatch.setenv("TPUWATCH_API_BACKOFF_SCALE", "fast")
    with pytest.raises(UsageError, match="TPUWATCH_API_BACKOFF_SCALE"):
        RetryPolicy.from_env()


def test_zone_not_found_is_told_from_resource_not_found() -> None:
    from tpuwatch.cloud.tpu.adapter import _zone_not_found

    assert _zone_not_found(gexc.NotFound("Location 'projects/p/locations/us-x1-a' is not found or access is unauthorized."))
    assert _zone_not_found(gexc.NotFound("Location us-x1-a is not found or access is unauthorized."))
    assert not _zone_not_found(gexc.NotFound("Resource 'projects/p/locations/us-central2-b/nodes/n' was not found"))
    assert not _zone_not_found(gexc.NotFound("Resource 'projects/p/locations/z/queuedResources/q' was not found"))


def test_a_tpu_api_rate_limit_is_retried_on_writes_too_and_its_quota_is_not() -> None:
    """gRPC: Google's ErrorInfo reason says which RESOURCE_EXHAUSTED a create may send again."""
    rate = error_details_pb2.ErrorInfo(reason="RATE_LIMIT_EXCEEDED", domain="googleapis.com")
    quota = error_details_pb2.ErrorInfo(reason="RESOURCE_QUOTA_EXCEEDED", domain="googleapis.com")
    limited = gexc.ResourceExhausted("Quota exceeded for quota metric 'Write requests'", details=[rate],
                                     error_info=rate)
    assert is_transient(limited, read=False) and is_transient(limited, read=True)
    refused = gexc.ResourceExhausted("Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been "
                                     "exceeded. Limit: 0 in region us-east5.", details=[quota], error_info=quota)
    assert not is_transient(refused, read=False)  # the create's caller queues it
    assert not is_transient(gexc.ResourceExhausted("no reason"), read=False)
    assert translate(refused, CALL, project="p").code == "RESOURCE_EXHAUSTED"
    denied = translate(gexc.PermissionDenied("The caller does not have permission"), CALL, project="p")
    assert denied.code == "PERMISSION_DENIED" and denied.permission == "tpu.nodes.get"
