"""Host keys and late keys against the simulator: the faults (scenario files and `sim inject`),
the TPU adapter's `host_keys` over gRPC, and what pinning costs (one API read per node id)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.errors import JobFailed, UsageError
from tpuwatch.sim import faults, scenario
from tpuwatch.sim.records import NodeSpec
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers import hostkeys
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers


def _workers(sim: Simulator, tmp_path: Path, tpu: TpuAdapter) -> SshWorkers:
    transport = OpenSsh(known_hosts=tmp_path / "known_hosts", user=sim.ssh_user or "",
                        identity_file=str(sim.ssh_key), port=sim.ssh_port or 22, internal_ip=True,
                        connect_timeout=5, host_keys=lambda n: tpu.host_keys(n.name))
    return SshWorkers(transport, job="j", command="true")


def test_ssh_key_faults_in_scenario_files_and_their_bad_options() -> None:
    s = scenario.parse({
        "node": [{"name": "pod", "accelerator_type": "v4-16"}],
        "step": [{"at": "1m", "fault": "keys-late", "node": "pod", "delay": "2m"},
                 {"at": "2m", "fault": "rotate-host-keys", "node": "pod"},
                 {"at": "3m", "fault": "wrong-host-key", "node": "pod", "worker": 1}],
    })
    assert [(st.fault, st.params.get("delay"), st.params.get("worker")) for st in s.steps] == [
        ("keys-late", 120.0, None), ("rotate-host-keys", None, None), ("wrong-host-key", None, 1)]
    with pytest.raises(UsageError, match="delay"):
        faults.normalize("keys-late", {"node": "pod", "delay": "soon"})
    with pytest.raises(UsageError, match="worker"):
        faults.normalize("wrong-host-key", {"node": "pod", "worker": "two"})


def test_guest_attributes_publish_each_workers_host_key_and_faults_change_what_ssh_sees(
        sim: Simulator, tmp_path: Path) -> None:
    sim.create_node("pod", "v4-16")
    key = sim.node_key("pod")
    tpu = TpuAdapter(sim.project, sim.zone)
    published = tpu.host_keys("pod")
    assert published == {w: (f"ssh-ed25519 {sim.hosts.published_host_keys(key, w)['ssh-ed25519']}",)
                         for w in (0, 1)}
    workers = _workers(sim, tmp_path, tpu)
    node = tpu.get_node("pod")
    assert node is not None
    assert [p.state for p in workers.probe(node)] == ["absent", "absent"]

    # `sim inject` from the command line: a worker presenting a key it does not publish
    r = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "sim", "inject", "wrong-host-key", "pod",
                        "--worker", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "sim", "inject", "wrong-host-key", "pod",
                        "--worker", "5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "workers 0..1" in r.stderr, r.stderr
    assert tpu.host_keys("pod") == published  # the attributes still publish the real key
    with pytest.raises(JobFailed, match="not among the host keys its guest attributes publish"):
        workers.probe(node)

    # a heal with rotate-host-keys gives new keys, published: read again and accepted, no error
    sim.inject("rotate-host-keys", node="pod")
    sim.inject("maintenance", node="pod", heal_after="60s")
    sim.world.wait_node("pod", "READY", health="HEALTHY", timeout=30)
    rotated = tpu.host_keys("pod")
    assert all(rotated[w] != published[w] for w in (0, 1))
    assert [p.state for p in workers.probe(node)] == ["absent", "absent"]

    # keys that arrive late after a boot: refused until they do (delay 0: they arrive now)
    sim.inject("keys-late", node="pod", delay="10h")
    sim.inject("maintenance", node="pod", heal_after="60s")
    sim.world.wait_node("pod", "READY", health="HEALTHY", timeout=30)
    probes = workers.probe(node)
    assert all(p.state == "unreachable" and p.login_refused for p in probes), probes
    sim.inject("keys-late", node="pod", delay="0s")
    assert [p.state for p in workers.probe(node)] == ["absent", "absent"]


def test_pinning_costs_one_api_read_per_node_id_and_none_once_the_file_holds_the_keys(
        sim: Simulator, tmp_path: Path) -> None:
    sim.create_node("pod", "v4-16")
    tpu = TpuAdapter(sim.project, sim.zone)
    node = tpu.get_node("pod")
    assert node is not None
    reads = lambda: sim.world.call_count("GetGuestAttributes")  # noqa: E731
    first = _workers(sim, tmp_path, tpu)
    first.probe(node)
    first.probe(node)
    assert reads() == 1
    # a new process (a `check` from cron) finds the published keys in the file: no read
    _workers(sim, tmp_path, tpu).probe(node)
    assert reads() == 1
    lines = (tmp_path / "known_hosts").read_text().splitlines()
    assert sorted(ln.split()[0] for ln in lines) == [f"tpuwatch-{node.id}-w0", f"tpuwatch-{node.id}-w1"]
    assert all(ln.endswith(hostkeys.MARK) for ln in lines)


def test_a_node_on_two_networks_has_one_worker_per_vm_on_its_first_network(sim: Simulator, tmp_path: Path) -> None:
    # Google lists each worker's interfaces side by side (workers x networks endpoints), as
    # gcloud's TPU VM ssh reads them; the second interface of each is not a worker.
    spec = NodeSpec(accelerator_type="v4-16", spec_json=json.dumps({"networkConfigs": [
        {"network": "default", "subnetwork": "default"}, {"network": "data", "subnetwork": "data"}]}))
    rec = sim.world.add_node("pod", spec)
    tpu = TpuAdapter(sim.project, sim.zone)
    raw = tpu.get_node_message("pod")
    assert raw is not None and len(raw.network_endpoints) == 4  # the shape this guards against
    node = tpu.get_node("pod")
    assert node is not None
    assert [(w.index, w.internal_ip) for w in node.workers] == list(enumerate(rec.ips))
    assert set(tpu.host_keys("pod")) == {0, 1}
    workers = _workers(sim, tmp_path, tpu)
    assert [(p.worker, p.state) for p in workers.probe(node)] == [(0, "absent"), (1, "absent")]
