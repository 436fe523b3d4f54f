"""The simulated workers' metadata server: over HTTP from the test and from the workers themselves."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.sim import metadata as md
from tpuwatch.sim.hosts import Hosts
from tpuwatch.sim.simulator import Simulator

FLAVOR = {"Metadata-Flavor": "Google"}
NO_NOTICE = '{"error": "no notifications have been received yet, try again later"}'


def get(address: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, body, Content-Type) of GET http://address/computeMetadata/v1/<path>."""
    req = urllib.request.Request(f"http://{address}/computeMetadata/v1/{path}", headers=FLAVOR if headers is None
                                 else headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["Metadata-Flavor"] == "Google"
            return resp.status, resp.read().decode(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers["Content-Type"]


def wait_file(path: Path, timeout: float = 20.0) -> str:
    """The file's text once it ends with a newline (the world is not told of files: poll)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.02)
    return path.read_text()


# The startup script asks its own metadata server, found through GCE_METADATA_HOST, as
# startup-scripts/resume-training.sh does.
ASK = """\
md() { curl -sS -f -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
{ md instance/attributes/agent-worker-number; echo " $(md instance/id) $(md instance/attributes/k)"; } > "$HOME/md"
"""


def test_each_worker_reads_its_own_values_and_the_header_is_required(sim: Simulator) -> None:
    rec = sim.create_node("pod", "v4-16", metadata={"k": "v"}, startup_script=ASK)
    key = sim.node_key("pod")
    seen = []
    for w in range(rec.n_workers):
        address = sim.hosts.metadata_address(key, w)
        assert address.split(":")[0] == rec.ips[w]  # its own address, as GCE_METADATA_HOST says
        status, worker, _ = get(address, "instance/attributes/agent-worker-number")
        status_id, ident, _ = get(address, "instance/id")
        assert (status, worker, status_id) == (200, str(w), 200)
        assert wait_file(sim.hosts.worker_home(key, w) / "md") == f"{w} {ident} v\n"
        _, hostname, _ = get(address, "instance/hostname")
        assert hostname.startswith("t1v-n-") and hostname.endswith(f"-w-{w}.{sim.zone}.c.{sim.project}.internal")
        assert get(address, "instance/network-interfaces/0/ip")[1] == rec.ips[w]
        seen.append((ident, hostname))
    assert len(set(seen)) == rec.n_workers  # every worker is its own instance

    address = sim.hosts.metadata_address(key, 0)
    assert get(address, "instance/attributes/startup-script") == (200, ASK, "application/text")
    assert get(address, "instance/attributes/") == (
        200, "accelerator-type\nagent-worker-number\nk\nstartup-script\ntpu-env\n", "application/text")
    status, body, ctype = get(address, "instance/attributes/?recursive=true")
    assert status == 200 and ctype == "application/json"
    # A node made alone: the runtime's tpu-env carries no MEGASCALE_* (nothing to join)
    tpu_env = f"ACCELERATOR_TYPE: 'v4-16'\nNODE_ID: 'pod'\nWORKER_ID: '0'\nZONE: '{sim.zone}'\n"
    assert json.loads(body) == {"accelerator-type": "v4-16", "agent-worker-number": "0", "k": "v",
                                "startup-script": ASK, "tpu-env": tpu_env}
    assert get(address, "instance/attributes/nope")[0] == 404
    assert get(address, "instance/nope")[0] == 404
    assert get(address, "project/project-id")[1] == sim.project
    status, body, _ = get(address, "instance/id", headers={})
    assert status == 403 and "Missing Metadata-Flavor:Google header" in body
    assert get(address, "instance/id", headers={"Metadata-Flavor": "google"})[0] == 403


def test_preempted_flips_to_true_and_the_server_goes_down_with_the_host(sim: Simulator) -> None:
    sim.create_node("spot", "v4-8", spot=True)
    key = sim.node_key("spot")
    address = sim.hosts.metadata_address(key, 0)
    assert get(address, "instance/preempted")[1] == "FALSE"
    sim.world.preempt("spot")
    inst = sim.world.instance_metadata(key, 0)
    assert inst is not None and inst.preempted
    assert md.answer(inst, "/computeMetadata/v1/instance/preempted", FLAVOR).text == "TRUE"
    with pytest.raises(urllib.error.URLError):  # the VM is gone: nothing answers at its address
        get(address, "instance/preempted")
    assert sim.world.instance_metadata(key, 1) is None  # a v4-8 has one worker
    assert sim.world.instance_metadata("no/such/node", 0) is None


def get_etag(address: str, path: str, timeout: float = 30) -> tuple[str, str]:
    """(body, ETag) of a GET, which may wait (wait_for_change)."""
    req = urllib.request.Request(f"http://{address}/computeMetadata/v1/{path}", headers=FLAVOR)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode(), resp.headers["ETag"]


def test_wait_for_change_returns_the_maintenance_notice_before_the_host_stops(sim: Simulator) -> None:
    sim.create_node("maint", "v4-8")
    key = sim.node_key("maint")
    address = sim.hosts.metadata_address(key, 0)
    body, etag = get_etag(address, "instance/maintenance-event")
    assert body == "NONE" and etag
    # no change: timeout_sec gives the same value back; a stale last_etag answers at once
    assert get_etag(address, f"instance/maintenance-event?wait_for_change=true&timeout_sec=0.3&last_etag={etag}") \
        == ("NONE", etag)
    assert get_etag(address, "instance/maintenance-event?wait_for_change=true&last_etag=0000")[0] == "NONE"
    seen: list[tuple[str, str]] = []
    waiter = threading.Thread(target=lambda: seen.append(
        (get_etag(address, f"instance/maintenance-event?wait_for_change=true&last_etag={etag}")[0],
         sim.world.node("maint").health)))
    waiter.start()
    time.sleep(0.3)
    assert not seen  # still waiting
    sim.inject("maintenance", node="maint", notice="60s", heal_after="1h")  # 0.1 s of real time at speed 600
    waiter.join(30)
    # the notice came while the node was still healthy; the host stops after it
    assert seen == [("TERMINATE_ON_HOST_MAINTENANCE", "HEALTHY")]
    sim.world.wait_for(lambda w: w.node("maint").health == "UNHEALTHY_MAINTENANCE", timeout=30, what="the stop")


def test_a_preemption_notice_comes_before_the_preemption(sim: Simulator) -> None:
    sim.create_node("spot", "v4-8", spot=True)
    key = sim.node_key("spot")
    address = sim.hosts.metadata_address(key, 0)
    sim.inject("preempt", node="spot", notice="1h")  # 6 s of real time at speed 600
    assert get(address, "instance/preempted")[1] == "TRUE"
    assert sim.world.node("spot").state == "READY"
    sim.world.wait_for(lambda w: w.node("spot").state == "PREEMPTED", timeout=30, what="the preemption")


def test_a_notice_through_upcoming_maintenance_alone_turns_it_ongoing(sim: Simulator) -> None:
    # A TPU VM is neither set to migrate nor has a GPU: maintenance-event stays NONE and the notice
    # is upcoming-maintenance ONGOING (an unscheduled one when none was announced).
    sim.create_node("maint", "v4-8")
    address = sim.hosts.metadata_address(sim.node_key("maint"), 0)
    sim.inject("maintenance", node="maint", notice="1h", notice_via="upcoming-maintenance")  # 6 s at speed 600
    status, body, _ = get(address, "instance/upcoming-maintenance?alt=json")
    notice = json.loads(body)
    assert status == 200 and (notice["maintenance_status"], notice["type"]) == ("ONGOING", "UNSCHEDULED"), notice
    assert get(address, "instance/maintenance-event")[1] == "NONE"
    assert sim.world.node("maint").health == "HEALTHY"  # the host stops after the notice
    sim.world.wait_for(lambda w: w.node("maint").health == "UNHEALTHY_MAINTENANCE", timeout=30, what="the stop")


def test_the_directory_fault_fails_listings_and_recursive_queries_but_serves_keys(sim: Simulator) -> None:
    sim.create_node("maint", "v4-8")
    address = sim.hosts.metadata_address(sim.node_key("maint"), 0)
    sim.inject("metadata-directories-fail", node="maint")
    assert get(address, "instance/?recursive=true")[0] == 503
    assert get(address, "instance/")[0] == 503
    assert get(address, "instance/maintenance-event") == (200, "NONE", "application/text")
    assert get(address, "instance/upcoming-maintenance")[:2] == (200, NO_NOTICE)
    sim.inject("metadata-directories-fail", node="maint", fails=False)
    assert get(address, "instance/?recursive=true")[0] == 200


def test_upcoming_maintenance_is_the_notice_as_json(sim: Simulator) -> None:
    sim.create_node("maint", "v4-8")
    address = sim.hosts.metadata_address(sim.node_key("maint"), 0)
    assert get(address, "instance/upcoming-maintenance") == (200, NO_NOTICE, "application/json")
    sim.world.upcoming_maintenance("maint", starts_in=7 * 86400.0, kind="SCHEDULED", can_reschedule=True)
    status, body, ctype = get(address, "instance/upcoming-maintenance")
    notice = json.loads(body)
    assert (status, ctype) == (200, "application/json")
    assert set(notice) == {"can_reschedule", "latest_window_start_time", "maintenance_status", "type",
                           "window_end_time", "window_start_time"}
    assert (notice["type"], notice["maintenance_status"], notice["can_reschedule"]) == ("SCHEDULED", "PENDING", True)
    upcoming = sim.world.node("maint").upcoming
    assert upcoming is not None
    start = datetime.strptime(notice["window_start_time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert int(start.timestamp()) == upcoming.window_start_ns // 10**9
    assert notice["window_end_time"] > notice["window_start_time"]


def test_metadata_updated_through_the_api_is_served_at_once(sim: Simulator) -> None:
    sim.create_node("upd", "v4-8", metadata={"k": "v"})
    address = sim.hosts.metadata_address(sim.node_key("upd"), 0)
    assert get(address, "instance/attributes/k")[1] == "v"
    tpu = TpuAdapter(sim.project, sim.zone, retry=RetryPolicy(multiplier=0.005, max_wait=0.05))
    sim.world.wait_operation(tpu.update_node("upd", {"metadata": {"k": "w", "new": "x"}}, ["metadata"]))
    assert get(address, "instance/attributes/k")[1] == "w"
    assert get(address, "instance/attributes/new")[1] == "x"


def test_hosts_without_a_world_serve_the_metadata_given_at_boot(tmp_path: Path) -> None:
    with Hosts(tmp_path / "hosts") as hosts:
        hosts.boot("proj/us-central2-b/solo", "1234", 2, None, metadata={"k": "boot"})
        for w in range(2):
            address = hosts.metadata_address("proj/us-central2-b/solo", w)
            assert get(address, "instance/attributes/k")[1] == "boot"
            assert get(address, "instance/attributes/agent-worker-number")[1] == str(w)
            assert get(address, "instance/zone")[1].endswith("/zones/us-central2-b")


def test_answer_paths_and_methods() -> None:
    inst = md.make_instance(project="p", zone="us-central2-b", node_id=42, worker=3, metadata={"a": "1"},
                            accelerator_type="v4-32")
    assert md.answer(inst, "/", FLAVOR).text == "computeMetadata/\n"
    assert md.answer(inst, "/computeMetadata/v1/", FLAVOR).text == "instance/\nproject/\n"
    listing = md.answer(inst, "/computeMetadata/v1/instance/", FLAVOR).text.splitlines()
    assert {"attributes/", "id", "preempted", "upcoming-maintenance", "hostname"} <= set(listing)
    assert md.answer(inst, "/computeMetadata/v1/instance/attributes/agent-worker-number", FLAVOR).text == "3"
    assert md.answer(inst, "/computeMetadata/v1/instance/id?alt=json", FLAVOR).text == json.dumps(inst.instance_id)
    assert md.answer(inst, "/computeMetadata/v1/instance/id", FLAVOR, method="POST").status == 405
    assert md.answer(inst, "/other", FLAVOR).status == 404
    # the service's own attributes win over the user's metadata
    clash = md.make_instance(project="p", zone="z", node_id=1, worker=0, metadata={"agent-worker-number": "9"})
    assert clash.attributes["agent-worker-number"] == "0"
