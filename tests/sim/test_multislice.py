"""Multislice queued resources in the simulator: the real google-cloud-tpu clients (gRPC), plain
HTTP against the REST face, scenario files and `tpuwatch sim inject`.

Google documents `QueuedResource.Tpu.NodeSpec.MultisliceParams` (v2; `MultiNodeParams` in v2alpha1):
`node_count` > 1 nodes named `<node_id_prefix>-0` …, the prefix defaulting to the request's id.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpuwatch.cloud.clients import tpu_client
from tpuwatch.errors import UsageError
from tpuwatch.sim import faults, scenario
from tpuwatch.sim.records import NodeSpec
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator


def parent(sim: Simulator) -> str:
    return f"projects/{sim.project}/locations/{sim.zone}"


def multislice(sim: Simulator, count: int, prefix: str = "", *, spot: bool = False) -> Any:
    ns = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=parent(sim),
        node=tpu_v2.Node(accelerator_type="v5litepod-16", runtime_version="v2-alpha-tpuv5-lite"),
    )
    if count:
        ns.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=count, node_id_prefix=prefix
        )
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[ns]))
    if spot:
        qr.spot = tpu_v2.QueuedResource.Spot()
    return qr


def qr_state(sim: Simulator, name: str = "ms") -> str:
    """The request's state, or "" before it exists."""
    found = [q for q in sim.world.list_queued_resources(sim.project, sim.zone) if q.name == name]
    return found[0].state if found else ""


def active(sim: Simulator, name: str = "ms") -> None:
    sim.world.wait_for(lambda w: qr_state(sim, name) == "ACTIVE", what=f"queued resource {name} ACTIVE")


def test_multislice_provisions_prefixed_nodes_and_force_delete_removes_all(
    sim_api: Simulator, lro_polling: Any
) -> None:
    c = tpu_client()
    c.create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                             queued_resource=multislice(sim_api, 3, "np")).result(polling=lro_polling)
    active(sim_api)
    qname = f"{parent(sim_api)}/queuedResources/ms"
    nodes = {n.name.rsplit("/", 1)[-1]: n for n in c.list_nodes(parent=parent(sim_api))}
    assert sorted(nodes) == ["np-0", "np-1", "np-2"]
    assert all(n.queued_resource == qname and n.multislice_node and len(n.network_endpoints) == 4
               and n.state == tpu_v2.Node.State.READY for n in nodes.values())
    got = c.get_queued_resource(name=qname).tpu.node_spec[0]
    assert (got.multislice_params.node_count, got.multislice_params.node_id_prefix) == (3, "np")
    alpha = tpu_client("v2alpha1").get_queued_resource(name=qname).tpu.node_spec[0]
    assert (alpha.multi_node_params.node_count, alpha.multi_node_params.node_id_prefix) == (3, "np")
    # Each slice's workers read how to join the others from the runtime's tpu-env metadata
    coordinator = sim_api.world.node("np-0").ips[0]
    for i in range(3):
        inst = sim_api.world.instance_metadata(sim_api.node_key(f"np-{i}"), 1)
        assert inst is not None
        assert (f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}'\nMEGASCALE_NUM_SLICES: '3'\n"
                f"MEGASCALE_SLICE_ID: '{i}'\n") in inst.attributes["tpu-env"]

    with pytest.raises(exceptions.FailedPrecondition):
        c.delete_queued_resource(name=qname)
    c.delete_queued_resource(request={"name": qname, "force": True}).result(polling=lro_polling)
    assert list(c.list_nodes(parent=parent(sim_api))) == []
    assert list(c.list_queued_resources(parent=parent(sim_api))) == []


def test_prefix_defaults_to_the_request_id_and_bad_params_are_refused(
    sim_api: Simulator, lro_polling: Any
) -> None:
    c = tpu_client()
    c.create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                             queued_resource=multislice(sim_api, 2)).result(polling=lro_polling)
    active(sim_api)
    assert sorted(n.name for n in sim_api.world.nodes()) == ["ms-0", "ms-1"]
    assert c.get_queued_resource(name=f"{parent(sim_api)}/queuedResources/ms"
                                 ).tpu.node_spec[0].multislice_params.node_id_prefix == "ms"
    with pytest.raises(exceptions.InvalidArgument, match="greater than 1"):
        c.create_queued_resource(parent=parent(sim_api), queued_resource_id="one",
                                 queued_resource=multislice(sim_api, 1, "x"))
    with pytest.raises(exceptions.InvalidArgument, match="node_id_prefix"):
        c.create_queued_resource(parent=parent(sim_api), queued_resource_id="bad",
                                 queued_resource=multislice(sim_api, 2, "a/b"))


def test_provisioning_is_all_or_nothing(sim_api: Simulator, lro_polling: Any) -> None:
    """One node of the request cannot be made (its name is taken): the request FAILS and
    gives back the nodes it did get."""
    sim_api.create_node("np-1", "v4-8")
    tpu_client().create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                                        queued_resource=multislice(sim_api, 3, "np")).result(polling=lro_polling)
    sim_api.world.wait_for(lambda w: qr_state(sim_api) == "FAILED", what="the request FAILED")
    assert "already exists" in sim_api.world.get_queued_resource(sim_api.project, sim_api.zone, "ms").error
    sim_api.world.wait_for(lambda w: sorted(n.name for n in w.nodes()) == ["np-1"],
                           what="the request's own nodes given back")
    assert sim_api.world.node("np-1").queued_resource == ""


def test_a_stockout_during_provisioning_fails_the_whole_request(sim_api: Simulator, lro_polling: Any) -> None:
    sim_api.world.delays["create"] = 600.0  # long enough to start a stockout while it provisions
    tpu_client().create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                                        queued_resource=multislice(sim_api, 2, "np")).result(polling=lro_polling)
    sim_api.world.wait_for(lambda w: qr_state(sim_api) == "PROVISIONING", what="provisioning")
    # The first node's create goes through; the second is doomed by a stockout.
    sim_api.world.stockout()
    sim_api.world.delete_node(sim_api.project, sim_api.zone, "np-1")
    sim_api.world.wait_for(lambda w: qr_state(sim_api) == "FAILED", what="the request FAILED", timeout=30)
    sim_api.world.wait_for(lambda w: not w.nodes(), what="every node given back", timeout=30)


def test_one_slice_preempted_suspends_the_whole_request(sim_api: Simulator, lro_polling: Any) -> None:
    tpu_client().create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                                        queued_resource=multislice(sim_api, 3, "np", spot=True)
                                        ).result(polling=lro_polling)
    active(sim_api)
    sim_api.world.delays["delete"] = 300.0  # the other slices stay visible for a while
    faults.apply(sim_api.world, "preempt", faults.normalize("preempt", {"node": "np-1"}))
    assert sim_api.world.node("np-1").state == "PREEMPTED"
    assert qr_state(sim_api) == "SUSPENDING"
    assert {sim_api.world.node(n).state for n in ("np-0", "np-2")} <= {"READY", "DELETING"}
    sim_api.world.wait_for(lambda w: qr_state(sim_api) == "SUSPENDED", what="SUSPENDED", timeout=30)
    assert sim_api.world.nodes() == []
    state = tpu_client().get_queued_resource(name=f"{parent(sim_api)}/queuedResources/ms").state.state
    assert state == tpu_v2.QueuedResourceState.State.SUSPENDED


def test_maintenance_of_one_slice_leaves_the_others_and_can_start_per_slice(
    sim_api: Simulator, lro_polling: Any
) -> None:
    tpu_client().create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                                        queued_resource=multislice(sim_api, 2, "np")).result(polling=lro_polling)
    active(sim_api)
    faults.apply(sim_api.world, "maintenance",
                 faults.normalize("maintenance", {"node": "np-0", "stuck": "REPAIRING"}))
    sim_api.world.wait_node("np-0", "REPAIRING")
    assert (sim_api.world.node("np-1").state, sim_api.world.node("np-1").health) == ("READY", "HEALTHY")
    assert qr_state(sim_api) == "ACTIVE"

    sim_api.world.delays["simulated_maintenance_heal"] = 120.0
    sim_api.world.upcoming_maintenance("np-1", starts_in=7 * 86400)
    alpha = tpu_client("v2alpha1")
    op = alpha.perform_maintenance_queued_resource(request={
        "name": f"{parent(sim_api)}/queuedResources/ms", "node_names": ["np-1"]})
    assert sim_api.world.node("np-1").health == "UNHEALTHY_MAINTENANCE"
    op.result(polling=lro_polling)
    assert sim_api.world.node("np-1").health == "HEALTHY"


class Http:
    def __init__(self, rest: RestFace) -> None:
        self.base = rest.url.rstrip("/")

    def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def test_rest_face_serves_multislice_queued_resources(sim_api: Simulator) -> None:
    """What `gcloud compute tpus queued-resources create --node-count 2 --node-prefix np` sends
    (v2: multisliceParams; v2alpha1: multiNodeParams), then describe, list, delete --force."""
    with RestFace(sim_api.world) as rest:
        http = Http(rest)
        loc = f"/v2/projects/{sim_api.project}/locations/{sim_api.zone}"
        body = {"tpu": {"nodeSpec": [{"parent": parent(sim_api), "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "np"},
                                      "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]},
                "spot": {}}
        status, op = http("POST", f"{loc}/queuedResources?queuedResourceId=ms", body)
        assert status == 200 and op["done"] and op["response"]["name"].endswith("/queuedResources/ms")
        active(sim_api)
        status, got = http("GET", f"{loc}/queuedResources/ms")
        assert status == 200 and got["state"]["state"] == "ACTIVE" and "spot" in got
        assert got["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "np"}
        alpha = "/v2alpha1" + loc[3:]
        status, got = http("GET", f"{alpha}/queuedResources/ms")
        assert got["tpu"]["nodeSpec"][0]["multiNodeParams"] == {"nodeCount": 2, "nodeIdPrefix": "np"}
        status, node = http("GET", f"{loc}/nodes/np-1")
        assert status == 200 and node["multisliceNode"] is True and node["queuedResource"].endswith("/ms")
        status, listed = http("GET", f"{loc}/queuedResources")
        assert [q["name"].rsplit("/", 1)[-1] for q in listed["queuedResources"]] == ["ms"]

        sim_api.world.delays["simulated_maintenance_heal"] = 120.0
        sim_api.world.upcoming_maintenance("np-0", starts_in=86400)
        status, op = http("POST", f"{alpha}/queuedResources/ms:performMaintenanceQueuedResource",
                          {"nodeNames": ["np-0"]})
        assert status == 200 and sim_api.world.node("np-0").health == "UNHEALTHY_MAINTENANCE"
        sim_api.world.wait_for(lambda w: w.node("np-0").health == "HEALTHY", what="np-0 healed")

        status, err = http("DELETE", f"{loc}/queuedResources/ms")
        assert status == 400 and err["error"]["status"] == "FAILED_PRECONDITION"
        status, op = http("DELETE", f"{loc}/queuedResources/ms?force=true")
        assert status == 200
        sim_api.world.wait_for(lambda w: not w.nodes() and not w.list_queued_resources(sim_api.project, sim_api.zone),
                               what="all gone")
        status, err = http("POST", f"{loc}/queuedResources?queuedResourceId=one",
                           {"tpu": {"nodeSpec": [{**body["tpu"]["nodeSpec"][0], "multisliceParams": {"nodeCount": 1}}]}})
        assert status == 400 and "greater than 1" in err["error"]["message"]


def test_scenario_queues_a_multislice_and_preempts_one_slice(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[[step]]\nat = "0s"\nfault = "create-queued-resource"\nname = "ms"\n'
        'accelerator_type = "v4-32"\nnode_count = 2\nnode_prefix = "np"\nspot = true\n'
        '[[step]]\nat = "10m"\nfault = "preempt"\nnode = "np-0"\n'
    )
    sc = scenario.load(path)
    with Simulator(root=tmp_path / "r", workers=False, scenario=sc) as sim:
        sim.world.wait_for(lambda w: qr_state(sim) == "SUSPENDED", what="suspended by the step", timeout=60)
        assert sim.step_errors == [] and sim.world.nodes() == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"name": "ms", "node_count": 1}, "node_count"),
        ({"name": "ms", "node_prefix": "np"}, "node_prefix"),
        ({"name": "ms", "node_count": 2, "accelerator_type": "v9-8"}, "accelerator_type"),
    ],
)
def test_bad_queued_resource_fault_options_name_the_key(params: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        faults.normalize("create-queued-resource", params, where="step[0]")


def test_inject_queues_a_multislice(sim_api: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["sim", "inject", "--host", sim_api.address, "create-queued-resource", "ms",
                            "--type", "v4-8", "--node-count", "2", "--node-prefix", "np"], capsys)
    assert code == 0 and json.loads(out)["nodes"] == ["np-0", "np-1"]
    active(sim_api)
    assert all(n.multislice_node for n in sim_api.world.nodes())
    code, _, err = run_cli(["sim", "inject", "--host", sim_api.address, "create-queued-resource", "ms",
                            "--node-count", "2"], capsys)
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1


def test_world_queue_resource_of_one_node_keeps_the_single_node_shape(sim_api: Simulator) -> None:
    qr = sim_api.world.queue_resource("pod", NodeSpec(accelerator_type="v4-8"))
    assert qr.node_ids == ["pod"] and qr.node_count == 0
    active(sim_api, "pod")
    assert not sim_api.world.node("pod").multislice_node


def test_a_slice_back_from_maintenance_restarts_the_other_slices(sim_api: Simulator, lro_polling: Any) -> None:
    """Google's multislice autorepair: "all other slices in the Multislice environment are
    restarted so training can continue" once a slice is back. RESTARTING in the same instant the
    slice is READY again, then READY with a restart entry; `multislice_restart` 0 turns it off."""
    tpu_client().create_queued_resource(parent=parent(sim_api), queued_resource_id="ms",
                                        queued_resource=multislice(sim_api, 3, "np")).result(polling=lro_polling)
    active(sim_api)
    w = sim_api.world
    w.delays["multislice_restart"] = 1200.0  # 2 s
    faults.apply(w, "maintenance", faults.normalize("maintenance", {"node": "np-1", "heal_after": "60s"}))
    w.wait_for(lambda w: w.node("np-1").state == "READY" and w.node("np-1").health == "HEALTHY",
               what="np-1 healed", timeout=30)
    assert {w.node("np-0").state, w.node("np-2").state} == {"RESTARTING"}
    w.wait_for(lambda w: all(w.node(n).state == "READY" for n in ("np-0", "np-2")), what="the others back",
               timeout=30)
    restarts = [e.node for e in w.audit_entries() if e.method.endswith("restart")]
    assert sorted(restarts) == ["np-0", "np-1", "np-2"], restarts
    w.delays["multislice_restart"] = 0.0
    faults.apply(w, "maintenance", faults.normalize("maintenance", {"node": "np-1", "heal_after": "60s"}))
    w.wait_for(lambda w: w.node("np-1").state == "READY" and w.node("np-1").health == "HEALTHY",
               what="np-1 healed again", timeout=30)
    assert {w.node("np-0").state, w.node("np-2").state} == {"READY"}
