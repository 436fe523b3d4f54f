"""The simulator's REST face over plain HTTP (no gcloud): routes, JSON shape, errors, one world.

gcloud itself against this face is tested in tests/e2e/test_gcloud_sim.py.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import create_through_queued_resource
from google.cloud import tpu_v2

from tpuwatch.cloud.clients import tpu_client
from tpuwatch.errors import UsageError
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator


class Http:
    """A tiny JSON client for one RestFace."""

    def __init__(self, rest: RestFace, sim: Simulator) -> None:
        self.base = rest.url.rstrip("/")
        self.loc = f"/v2/projects/{sim.project}/locations/{sim.zone}"

    def __call__(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_op(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, op = self("GET", f"/v2/{name}")
            assert status == 200, op
            if op.get("done"):
                return dict(op)
            assert time.monotonic() < deadline, f"operation {name} not done"
            time.sleep(0.02)


@pytest.fixture
def http(sim_api: Simulator) -> Iterator[Http]:
    with RestFace(sim_api.world) as rest:
        yield Http(rest, sim_api)


def test_node_json_has_enum_names_and_no_default_fields(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-32", labels={"team": "ml"})
    status, node = http("GET", f"{http.loc}/nodes/pod")
    assert status == 200
    assert node["name"] == f"projects/{sim_api.project}/locations/{sim_api.zone}/nodes/pod"
    # gcloud's apitools reads enum names; an integer makes it crash
    assert (node["state"], node["health"], node["apiVersion"]) == ("READY", "HEALTHY", "V2")
    assert node["acceleratorType"] == "v4-32" and node["labels"] == {"team": "ml"}
    assert isinstance(node["id"], str) and node["id"].isdigit()  # int64 as a string
    assert len(node["networkEndpoints"]) == 4 and all(e["accessConfig"]["externalIp"] for e in node["networkEndpoints"])
    # default-valued fields are left out, as the real API leaves them out
    for absent in ("healthDescription", "symptoms", "description", "queuedResource", "tags"):
        assert absent not in node, absent
    assert node["cidrBlock"] == "10.128.0.0/20"  # filled in by the API, from the subnetwork


def test_list_pages_and_a_change_through_grpc_is_seen_through_rest(sim_api: Simulator, http: Http) -> None:
    for name in ("a", "b", "c"):
        sim_api.create_node(name, "v4-8")
    status, page = http("GET", f"{http.loc}/nodes?pageSize=2")
    assert status == 200 and [n["name"].rsplit("/", 1)[1] for n in page["nodes"]] == ["a", "b"]
    status, rest = http("GET", f"{http.loc}/nodes?pageSize=2&pageToken={page['nextPageToken']}")
    assert [n["name"].rsplit("/", 1)[1] for n in rest["nodes"]] == ["c"] and "nextPageToken" not in rest
    tpu_client().delete_node(name=f"projects/{sim_api.project}/locations/{sim_api.zone}/nodes/b")
    assert http("GET", f"{http.loc}/nodes/b")[1]["state"] == "DELETING"


def test_create_and_delete_through_rest_are_seen_through_grpc(sim_api: Simulator, http: Http) -> None:
    body = {"acceleratorType": "v4-16", "runtimeVersion": "tpu-ubuntu2204-base",
            "metadata": {"startup-script": "echo hi"}, "schedulingConfig": {"spot": True},
            "networkConfig": {"enableExternalIps": True}}
    status, op = http("POST", f"{http.loc}/nodes?nodeId=fresh", body)
    assert status == 200, op
    assert op["name"].startswith(f"projects/{sim_api.project}/locations/{sim_api.zone}/operations/")
    assert op["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    assert op["metadata"]["verb"] == "create" and "done" not in op  # false is a default: left out
    grpc_node = tpu_client().get_node(name=f"projects/{sim_api.project}/locations/{sim_api.zone}/nodes/fresh")
    assert grpc_node.state == tpu_v2.Node.State.CREATING
    done = http.wait_op(op["name"])
    assert done["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert done["response"]["state"] == "READY" and "endTime" in done["metadata"] and "error" not in done
    grpc_node = tpu_client().get_node(name=grpc_node.name)
    assert grpc_node.state == tpu_v2.Node.State.READY and grpc_node.scheduling_config.spot
    assert grpc_node.metadata["startup-script"] == "echo hi" and len(grpc_node.network_endpoints) == 2

    status, op = http("DELETE", f"{http.loc}/nodes/fresh")
    assert status == 200 and op["metadata"]["verb"] == "delete"
    done = http.wait_op(op["name"])
    assert done["response"] == {"@type": "type.googleapis.com/google.protobuf.Empty"}
    assert not sim_api.world.has_node("fresh")
    # both faces counted under one method name
    assert sim_api.world.calls["google.cloud.tpu.v2.Tpu/CreateNode"] == 1
    assert sim_api.world.calls["google.cloud.tpu.v2.Tpu/GetNode"] == 2


def test_patch_updates_the_masked_fields_only(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-8", labels={"team": "x"}, metadata={"k": "v"})
    body = {"labels": {"team": "x", "tpuwatch-job": "pod"}, "metadata": {"k": "changed"}}
    status, op = http("PATCH", f"{http.loc}/nodes/pod?updateMask=labels", body)
    assert status == 200 and op["metadata"]["verb"] == "update", op
    done = http.wait_op(op["name"])
    assert done["response"]["labels"] == {"team": "x", "tpuwatch-job": "pod"}
    assert sim_api.world.node("pod").spec.metadata == {"k": "v"}  # not in the mask
    assert sim_api.world.calls["google.cloud.tpu.v2.Tpu/UpdateNode"] == 1
    status, err = http("PATCH", f"{http.loc}/nodes/pod", body)
    assert status == 400 and "update_mask is required" in err["error"]["message"]
    status, err = http("PATCH", f"{http.loc}/nodes/pod?updateMask=acceleratorType", body)
    assert status == 400 and "accelerator_type cannot be updated" in err["error"]["message"]


def test_errors_have_the_google_api_shape(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-8")
    status, err = http("GET", f"{http.loc}/nodes/nope")
    assert status == 404
    assert err == {"error": {"code": 404, "status": "NOT_FOUND", "message":
                             f"Resource 'projects/{sim_api.project}/locations/{sim_api.zone}/nodes/nope' was not found"}}
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    status, err = http("POST", f"{http.loc}/nodes?nodeId=pod", body)
    assert (status, err["error"]["status"], err["error"]["code"]) == (409, "ALREADY_EXISTS", 409)
    status, err = http("POST", f"{http.loc}/nodes?nodeId=x", {"acceleratorType": "v9-9", "runtimeVersion": "r"})
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT") and "v9-9" in err["error"]["message"]
    status, err = http("POST", f"{http.loc}/nodes?nodeId=x", raw=b"{not json")
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    status, err = http("POST", f"{http.loc}/nodes?nodeId=x", {"acceleratorType": 5, "state": "NOPE"})
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    status, err = http("GET", f"/v2/projects/{sim_api.project}/locations/mars-central1-z/nodes/pod")
    assert status == 404 and "mars-central1-z" in err["error"]["message"]
    status, err = http("GET", "/v1/projects/p/whatever")
    assert (status, err["error"]["status"]) == (404, "NOT_FOUND")
    status, err = http("DELETE", f"{http.loc}/nodes")  # no method of Google's (discovery document)
    assert (status, err["error"]["status"]) == (404, "NOT_FOUND")


def test_injected_api_errors_reach_rest_clients_too(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-8")
    sim_api.world.api_errors(1.0, ["UNAVAILABLE"], methods=["GetNode"])
    status, err = http("GET", f"{http.loc}/nodes/pod")
    assert (status, err["error"]["status"], err["error"]["code"]) == (503, "UNAVAILABLE", 503)
    assert http("GET", f"{http.loc}/nodes")[0] == 200  # other methods unaffected
    sim_api.world.deny(methods=["ListNodes"])
    status, err = http("GET", f"{http.loc}/nodes")
    assert (status, err["error"]["status"]) == (403, "PERMISSION_DENIED")
    assert "tpu.nodes.list" in err["error"]["message"]
    assert sim_api.world.injected["google.cloud.tpu.v2.Tpu/GetNode"] == 1


def test_failed_create_operation_carries_the_error(sim_api: Simulator, http: Http) -> None:
    sim_api.world.stockout()
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    status, op = http("POST", f"{http.loc}/nodes?nodeId=pod", body)
    assert status == 200
    done = http.wait_op(op["name"])
    assert done["error"]["code"] == 8 and "no more capacity" in done["error"]["message"]
    assert "response" not in done


def test_v2alpha1_shows_upcoming_maintenance_and_simulates_it(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-8")
    sim_api.world.upcoming_maintenance("pod", starts_in=86400)
    loc = http.loc.replace("/v2/", "/v2alpha1/")
    status, node = http("GET", f"{loc}/nodes/pod")
    assert status == 200 and node["apiVersion"] == "V2_ALPHA1"
    assert node["upcomingMaintenance"]["type"] == "SCHEDULED"
    assert node["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"
    status, op = http("POST", f"{loc}/nodes/pod:simulateMaintenanceEvent", {"workerIds": ["0"]})
    assert status == 200 and op["metadata"]["@type"].endswith("v2alpha1.OperationMetadata")
    assert http("GET", f"{http.loc}/nodes/pod")[1]["health"] == "UNHEALTHY_MAINTENANCE"
    status, err = http("POST", f"{http.loc}/nodes/pod:simulateMaintenanceEvent", {})
    assert status == 404


def test_v2alpha1_performs_maintenance_of_a_node_and_refuses_as_grpc_does(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v6e-16")
    sim_api.create_node("old", "v3-32")
    for n in ("pod", "old"):
        sim_api.world.upcoming_maintenance(n, starts_in=7 * 86400)
    loc = http.loc.replace("/v2/", "/v2alpha1/")
    status, err = http("POST", f"{loc}/nodes/old:performMaintenance", {})
    assert (status, err["error"]["status"]) == (501, "UNIMPLEMENTED")
    assert "v3-32" in err["error"]["message"]
    assert http("POST", f"{http.loc}/nodes/pod:performMaintenance", {})[0] == 404  # v2 has no such method
    status, op = http("POST", f"{loc}/nodes/pod:performMaintenance", {})
    assert status == 200 and op["metadata"]["verb"] == "performMaintenance"
    assert op["metadata"]["@type"].endswith("v2alpha1.OperationMetadata")
    assert http("GET", f"{loc}/nodes/pod")[1]["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    status, err = http("POST", f"{loc}/nodes/pod:performMaintenance", {})  # nothing PENDING any more
    assert (status, err["error"]["status"]) == (400, "FAILED_PRECONDITION")
    assert status == 400 and "no pending maintenance" in err["error"]["message"]
    assert http("POST", f"{loc}/nodes/absent:performMaintenance", {})[0] == 404


def test_v2alpha1_performs_maintenance_of_a_queued_resources_node(sim_api: Simulator, http: Http) -> None:
    create_through_queued_resource(sim_api, "qr", "v6e-16", {}, spot=False)
    sim_api.world.delays["simulated_maintenance_heal"] = 120.0
    sim_api.world.upcoming_maintenance("pod", starts_in=7 * 86400)
    loc = http.loc.replace("/v2/", "/v2alpha1/")
    url = f"{loc}/queuedResources/qr:performMaintenanceQueuedResource"
    status, err = http("POST", url, {"nodeNames": ["projects/x/locations/y/nodes/other"]})
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert http("POST", url, {"nodeNames": "pod"})[1]["error"]["status"] == "INVALID_ARGUMENT"
    assert http("POST", f"{loc}/queuedResources/none:performMaintenanceQueuedResource",
                {"nodeNames": ["pod"]})[0] == 404
    assert sim_api.world.node("pod").upcoming.status == "PENDING"  # type: ignore[union-attr]
    status, err = http("POST", url, {"nodeNames": [f"{http.loc[4:]}/nodes/pod"]})  # a full name: refused
    assert (status, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    status, op = http("POST", url, {"nodeNames": ["pod"]})
    assert status == 200 and op["metadata"]["verb"] == "performMaintenanceQueuedResource"
    assert http("GET", f"{loc}/nodes/pod")[1]["health"] == "UNHEALTHY_MAINTENANCE"
    done = http.wait_op(op["name"], timeout=30)
    assert "error" not in done and done["response"]["@type"].endswith("QueuedResource")
    healed = http("GET", f"{loc}/nodes/pod")[1]
    assert healed["health"] == "HEALTHY" and "upcomingMaintenance" not in healed


def test_operations_list_and_stop_start(sim_api: Simulator, http: Http) -> None:
    sim_api.create_node("pod", "v4-8")
    status, op = http("POST", f"{http.loc}/nodes/pod:stop", {})
    assert status == 200 and http.wait_op(op["name"])["response"]["state"] == "STOPPED"
    status, op = http("POST", f"{http.loc}/nodes/pod:start", {})
    assert status == 200 and http.wait_op(op["name"])["response"]["state"] == "READY"
    status, ops = http("GET", f"{http.loc}/operations")
    assert status == 200 and [o["metadata"]["verb"] for o in ops["operations"]] == ["stop", "start"]


def test_guest_attributes_and_compute_project_carry_the_workers_keys(sim: Simulator) -> None:
    sim.create_node("pod", "v4-16")
    with RestFace(sim.world) as rest:
        http = Http(rest, sim)
        status, ga = http("POST", f"{http.loc}/nodes/pod:getGuestAttributes", {})
        assert status == 200 and len(ga["guestAttributes"]) == 2
        key = sim.node_key("pod")
        for i, attrs in enumerate(ga["guestAttributes"]):
            items = {(e["namespace"], e["key"]): e["value"] for e in attrs["queryValue"]["items"]}
            assert items[("guestInventory", "InternalIP")] == sim.world.node("pod").ips[i]
            host_pub = (sim.hosts.worker_home(key, i).parent / "ssh_host_ed25519_key.pub").read_text().split()[1]
            # gcloud pins the worker's host key under an alias ending in this value's last 6 chars
            assert items[("hostkeys", "ssh-ed25519")] == host_pub
        status, one = http("POST", f"{http.loc}/nodes/pod:getGuestAttributes", {"workerIds": ["1"]})
        assert len(one["guestAttributes"]) == 1
        assert one["guestAttributes"][0] == ga["guestAttributes"][1]

        status, project = http("GET", f"/compute/v1/projects/{sim.project}")
        assert status == 200 and project["name"] == sim.project
        items = {i["key"]: i["value"] for i in project["commonInstanceMetadata"]["items"]}
        kind, data = Path(str(sim.ssh_key) + ".pub").read_text().split()[:2]
        # exactly what gcloud looks for, so it does not try to add its key to the node
        assert items["ssh-keys"] == f"{sim.ssh_user}:{kind} {data} {sim.ssh_user}"
        assert rest.compute_url == rest.url + "compute/v1/"


def test_set_common_instance_metadata_replaces_the_projects_metadata_with_its_fingerprint(
        sim_api: Simulator, http: Http) -> None:
    """What `gcloud compute ssh` calls to add its key to the project's `ssh-keys`: the
    fingerprint of the metadata read must be the current one, as for instances.setMetadata."""
    path = f"/compute/v1/projects/{sim_api.project}"
    status, project = http("GET", path)
    meta = project["commonInstanceMetadata"]
    items = {i["key"]: i["value"] for i in meta["items"]}
    assert items["enable-guest-attributes"] == "TRUE"  # the instances publish their host keys
    added = [*meta["items"], {"key": "ssh-keys", "value": items["ssh-keys"] + "\nbob:ssh-ed25519 AAAA bob"}][1:]
    status, op = http("POST", f"{path}/setCommonInstanceMetadata",
                      {"fingerprint": meta["fingerprint"], "items": added})
    assert status == 200 and op["status"] == "DONE" and op["operationType"] == "setCommonInstanceMetadata"
    status, done = http("GET", f"{path}/global/operations/{op['name']}")
    assert status == 200 and done["status"] == "DONE"
    status, now = http("GET", path)
    assert {i["key"]: i["value"] for i in now["commonInstanceMetadata"]["items"]}["ssh-keys"].endswith("bob")
    assert now["commonInstanceMetadata"]["fingerprint"] != meta["fingerprint"]
    status, stale = http("POST", f"{path}/setCommonInstanceMetadata", {"fingerprint": meta["fingerprint"], "items": []})
    assert status >= 400 and "fingerprint" in stale["error"]["message"]


def test_a_port_in_use_is_a_one_line_usage_error(sim_api: Simulator) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        face = RestFace(sim_api.world, port=port)
        with pytest.raises(UsageError) as info:
            face.start()
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message and f"127.0.0.1:{port}" in info.value.message


def test_close_stops_serving(sim_api: Simulator) -> None:
    rest = RestFace(sim_api.world).start()
    port = rest.port
    assert port > 0 and rest.url == f"http://127.0.0.1:{port}/"
    rest.close()
    rest.close()  # twice is harmless
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(2)
        s.connect(("127.0.0.1", port))
