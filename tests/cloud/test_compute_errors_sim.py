"""A 403 from Compute Engine is read by its reason, through the real google-cloud-compute client
and google-api-core's own parsing of the simulator's REST error bodies: `rateLimitExceeded` is
retried (reads and writes) until served, `quotaExceeded` on an insert is RESOURCE_EXHAUSTED
for the policy to queue (never retried here, never a permission), and only a 403 with no such
reason is PERMISSION_DENIED (exit 3, the permission named)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tpuwatch import recreate
from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.errors import ApiError, Call, is_transient, shortage, translate
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.errors import EXIT_CLOUD, HostKeysRefused
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

GET = "compute.v1.Instances/Get"
INSERT = "compute.v1.Instances/Insert"
# One try only: what is retried past it is retried by the rate-limit rule alone.
ONE_TRY = RetryPolicy(max_attempts=1, max_delay=30.0, multiplier=0.0, max_wait=0.0)
CALL = Call("Compute Engine API", "get_instances", "projects/p/zones/z/instances/vm", "compute.instances.get",
            "compute.googleapis.com", "roles/compute.viewer")


@pytest.fixture
def rest(sim_api: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        yield face


def instances_client(rest: RestFace) -> compute_v1.InstancesClient:
    return compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest",
                                      client_options=ClientOptions(api_endpoint=rest.url.rstrip("/")))


def spot_body(name: str, zone: str) -> dict[str, Any]:
    return {"name": name, "machineType": f"zones/{zone}/machineTypes/tpu7x-standard-4t",
            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP",
                           "onHostMaintenance": "TERMINATE"}}


def test_a_rate_limited_request_is_a_403_rate_limit_exceeded_retried_until_served(
        sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.add_instance("vm")
    world.api_errors(1.0, ["RESOURCE_EXHAUSTED"], methods=[GET])
    with pytest.raises(gexc.Forbidden) as raw:  # Google's shape: 403, not 429
        instances_client(rest).get(project=world.project, zone=world.zone, instance="vm")
    assert raw.value.code == 403 and raw.value.errors[0]["reason"] == "rateLimitExceeded", raw.value.errors
    assert shortage(raw.value) == "rate" and is_transient(raw.value, read=False)
    assert translate(raw.value, CALL, project="p").code == "RESOURCE_EXHAUSTED"  # not a permission
    world.clear_errors()
    world.api_errors(0.5, ["RESOURCE_EXHAUSTED"], methods=[GET, INSERT])
    world.reset_calls()
    api = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)
    for _ in range(12):  # each read served in the end, however many tries it took
        node = api.get_node("vm")
        assert node is not None and node.state == "READY"
    assert world.injected[GET] >= 3, world.injected  # refused, and retried past the one try
    # a write refused by a rate limit did nothing, and is sent again
    op = api.create_node("vm2", spot_body("vm2", world.zone))
    assert op and world.call_count("Instances/Insert") == 1 + world.injected[INSERT]
    world.clear_errors()


def test_an_insert_beyond_quota_is_a_403_quota_exceeded_queued_as_resource_exhausted(
        sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.quota()
    with pytest.raises(gexc.Forbidden) as raw:
        instances_client(rest).insert(project=world.project, zone=world.zone,
                                      instance_resource=compute_v1.Instance.from_json(
                                          json.dumps(spot_body("vm", world.zone))))
    assert raw.value.errors[0]["reason"] == "quotaExceeded", raw.value.errors
    region = world.zone.rsplit("-", 1)[0]
    assert f"Quota 'PREEMPTIBLE_TPU_V7X_CHIPS' exceeded. Limit: 0.0 in region {region}." in raw.value.message
    world.reset_calls()
    api = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)
    with pytest.raises(ApiError) as err:
        api.create_node("vm", spot_body("vm", world.zone))
    assert err.value.code == "RESOURCE_EXHAUSTED" and err.value.exit_code == EXIT_CLOUD
    assert "out of quota" in err.value.message and "permission" not in err.value.message, err.value.message
    assert world.call_count("Instances/Insert") == 1  # not retried: the policy queues it
    failure = recreate.classify_exception(err.value, started_by_us=False)
    assert failure.queueable and failure.reason == "quota", failure
    world.clear_errors()


def test_an_insert_refused_at_once_for_a_stockout_is_no_capacity_not_retried(
        sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.stockout(at_insert=True)
    with pytest.raises(gexc.ServiceUnavailable) as raw:
        instances_client(rest).insert(project=world.project, zone=world.zone,
                                      instance_resource=compute_v1.Instance.from_json(
                                          json.dumps(spot_body("vm", world.zone))))
    assert raw.value.errors[0]["reason"] == "ZONE_RESOURCE_POOL_EXHAUSTED", raw.value.errors
    assert "does not have enough resources available" in raw.value.message
    world.reset_calls()
    api = ComputeAdapter(world.project, world.zone, "instance", retry=RetryPolicy(max_attempts=4, multiplier=0.0,
                                                                                  max_wait=0.0))
    with pytest.raises(ApiError) as err:
        api.create_node("vm", spot_body("vm", world.zone))
    assert err.value.code == "RESOURCE_EXHAUSTED" and "no capacity" in err.value.message, err.value.message
    assert world.call_count("Instances/Insert") == 1  # not a transient 503: the policy queues it
    failure = recreate.classify_exception(err.value, started_by_us=False)
    assert failure.queueable and failure.reason == "no_capacity", failure
    world.clear_errors()
    assert api.create_node("vm", spot_body("vm", world.zone))  # served once the stockout ends


def test_only_a_403_without_a_shortage_reason_is_a_missing_permission(sim_api: Simulator, rest: RestFace) -> None:
    world = sim_api.world
    world.add_instance("vm")
    world.deny(methods=[GET])
    world.reset_calls()
    api = ComputeAdapter(world.project, world.zone, "instance", retry=RetryPolicy(max_attempts=4, multiplier=0.0,
                                                                                  max_wait=0.0))
    with pytest.raises(ApiError) as err:
        api.get_node("vm")
    assert err.value.code == "PERMISSION_DENIED" and err.value.permission == "compute.instances.get"
    assert err.value.exit_code == EXIT_CLOUD and world.call_count("Instances/Get") == 1
    world.clear_errors()


def test_a_refused_guest_attributes_read_is_said_not_taken_for_no_keys(
        sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    world = sim.world
    with RestFace(world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        world.add_instance("vm")  # a VM with a host: its guest agent publishes its keys
        api = ComputeAdapter(world.project, world.zone, "instance", retry=ONE_TRY)
        assert api.host_keys("vm"), "the instance publishes its host keys"
        world.api_errors(0.5, ["RESOURCE_EXHAUSTED"], methods=["GetGuestAttributes"])
        for _ in range(4):  # throttled: retried, never mistaken for a refusal or for no keys
            assert api.host_keys("vm")
        world.clear_errors()
        world.deny(methods=["GetGuestAttributes"])
        with pytest.raises(HostKeysRefused) as err:
            api.host_keys("vm")
        assert err.value.permission == "compute.instances.getGuestAttributes", err.value
        world.clear_errors()


def _rest_error(status: int, body: dict[str, Any]) -> gexc.GoogleAPICallError:
    """google-api-core's own exception for a REST answer with this status and JSON body."""
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(body).encode()
    response.request = requests.Request("POST", "https://compute.googleapis.com/compute/v1/x").prepare()
    return gexc.from_http_response(response)


def test_a_synchronous_stockout_is_no_capacity_not_a_retry_or_a_permission() -> None:
    text = ("The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill "
            "the request.  Try a different zone, or try again later.")
    for status, reason in ((503, "ZONE_RESOURCE_POOL_EXHAUSTED"), (503, "insufficientCapacity"),
                           (403, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")):
        exc = _rest_error(status, {"error": {"code": status, "message": text,
                                             "errors": [{"message": text, "domain": "global", "reason": reason}]}})
        assert not is_transient(exc, read=False), reason  # the policy queues it, within queue_timeout
        err = translate(exc, CALL, project="p")
        assert err.code == "RESOURCE_EXHAUSTED" and "no capacity" in err.message, err.message
        failure = recreate.classify_exception(err, started_by_us=False)
        assert failure.queueable and failure.reason == "no_capacity", (reason, failure)
    denied = _rest_error(403, {"error": {"code": 403, "message": "Required 'compute.instances.create' permission",
                                         "errors": [{"message": "x", "domain": "global", "reason": "forbidden"}]}})
    assert not is_transient(denied, read=True)
    assert translate(denied, CALL, project="p").code == "PERMISSION_DENIED"
