"""Faults and lifecycle through the API reach the SSH workers: the real TPU client and real ssh."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from google.cloud import tpu_v2

from tpuwatch.cloud.clients import tpu_client
from tpuwatch.sim.simulator import Simulator

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client"),
]

SCRIPT = 'echo "$(date +%s%N)" >> "$HOME/boots"\n'


def ssh(
    sim: Simulator, ip: str, command: str, known_hosts: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(sim.ssh_key),
            "-p",
            str(sim.ssh_port),
            "-l",
            str(sim.ssh_user),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            ip,
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def host_key(sim: Simulator, ip: str) -> str:
    out = subprocess.run(
        ["ssh-keyscan", "-p", str(sim.ssh_port), "-t", "ed25519", ip],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return out.split()[-1]


def refused(sim: Simulator, ip: str) -> bool:
    try:
        socket.create_connection((ip, int(sim.ssh_port or 0)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_create_preempt_recreate_through_the_api(
    sim: Simulator, lro_polling: Any, tmp_path: Path
) -> None:
    c = tpu_client()
    parent = f"projects/{sim.project}/locations/{sim.zone}"
    node = tpu_v2.Node(
        accelerator_type="v4-32",
        runtime_version="tpu-ubuntu2204-base",
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        metadata={"startup-script": SCRIPT},
    )
    first = c.create_node(parent=parent, node_id="pod", node=node).result(polling=lro_polling)
    ips = [e.ip_address for e in first.network_endpoints]
    kh = tmp_path / "known_hosts"
    for ip in ips:
        res = ssh(sim, ip, "sleep 600 >/dev/null 2>&1 </dev/null & echo $!", kh)
        assert res.returncode == 0, res.stderr
    keys = [host_key(sim, ip) for ip in ips]
    key = sim.node_key("pod")
    assert sim.hosts.pids(key)
    sim.world.wait_for(
        lambda w: all(sim.hosts.startup_status(key, i) == 0 for i in range(4)),
        what="startup scripts",
    )

    sim.world.preempt("pod")
    assert c.get_node(name=first.name).state == tpu_v2.Node.State.PREEMPTED
    assert all(refused(sim, ip) for ip in ips)
    assert sim.hosts.pids(key) == []

    c.delete_node(name=first.name).result(polling=lro_polling)
    second = c.create_node(parent=parent, node_id="pod", node=node).result(polling=lro_polling)
    assert second.id != first.id
    assert [e.ip_address for e in second.network_endpoints] == ips  # same IPs, new host keys
    assert all(host_key(sim, ip) != k for ip, k in zip(ips, keys, strict=True))
    sim.world.wait_for(
        lambda w: all(sim.hosts.startup_status(key, i) == 0 for i in range(4)),
        what="startup scripts",
    )
    res = ssh(sim, ips[3], "wc -l < ~/boots", tmp_path / "kh2")
    assert res.stdout.strip() == "1"  # fresh home: only this incarnation's boot


def test_maintenance_kills_the_job_refuses_ssh_and_heals(sim: Simulator, tmp_path: Path) -> None:
    sim.create_node("pod", "v4-16", startup_script=SCRIPT)
    w = sim.world
    key = sim.node_key("pod")
    ips = w.node("pod").ips
    assert (
        ssh(sim, ips[1], "sleep 600 >/dev/null 2>&1 & echo ok", tmp_path / "kh").stdout.strip()
        == "ok"
    )
    # the shell forks `sleep` before it echoes, but its environment (the worker's mark) reads
    # empty while the kernel runs its exec: wait for the mark, not for the echo
    w.wait_for(lambda _: len(sim.hosts.pids(key)) >= 1, what="the sleep started on worker 1")
    w.maintenance("pod", stuck="REPAIRING")
    assert all(refused(sim, ip) for ip in ips) and sim.hosts.pids(key) == []
    w.heal("pod")
    assert ssh(sim, ips[0], "echo back", tmp_path / "kh").stdout.strip() == "back"
    w.wait_for(
        lambda _: sim.hosts.startup_status(key, 0) is not None, what="startup script after reboot"
    )
    assert (
        ssh(sim, ips[0], "wc -l < ~/boots", tmp_path / "kh").stdout.strip() == "2"
    )  # ran again on reboot

    w.maintenance("pod", heal_after=60)  # timed: back by itself, SSH first, then READY
    w.wait_node("pod", "READY", health="HEALTHY")
    assert w.node("pod").health_description.startswith("The TPU had a maintenance event at ")
    assert ssh(sim, ips[1], "echo back", tmp_path / "kh").stdout.strip() == "back"

    w.maintenance("pod", heal_after=0)  # a repair that ends at once still goes down first
    w.wait_node("pod", "READY", health="HEALTHY")
    assert not refused(sim, ips[0])
    assert [e.method for e in w.audit_entries()][-2:] == ["tpu.nodes.terminate", "tpu.nodes.restart"]


def test_kill_worker_and_hang(sim: Simulator, tmp_path: Path) -> None:
    sim.create_node("pod", "v4-16")
    ips = sim.world.node("pod").ips
    key = sim.node_key("pod")
    for ip in ips:
        ssh(sim, ip, "sleep 600 >/dev/null 2>&1 </dev/null &", tmp_path / "kh")
    sim.world.kill_worker("pod", 1)
    # SIGKILLed, a process can still be listed until the kernel has torn it down (once seen in a
    # fresh-clone run): wait for it to go, bounded, and name what is left if it does not
    end = time.monotonic() + 20
    while (left := sim.hosts.pids(key, 1)) and time.monotonic() < end:
        time.sleep(0.05)
    assert left == [], [(p, _cmdline(p)) for p in left]
    assert sim.hosts.pids(key, 0)
    sim.world.hang("pod", 0)
    (pid,) = sim.hosts.pids(key, 0)
    deadline = time.monotonic() + 10  # SIGSTOP is delivered asynchronously

    def state() -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    while state() != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state() == "T"
    assert sim.world.node("pod").state == "READY"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"
