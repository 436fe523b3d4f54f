"""The simulator at pod scale, and what a tick costs per worker as the node grows.

Real OpenSSH against the simulated workers (one asyncssh server process for all of them, each
on its own loopback address with its own host key). No timing is asserted: the counts are the
simulator's own (connections accepted, sessions opened) and its API call counters.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from e2e_helpers import wait_for, write_config

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.journal import Journal
from tpuwatch.loop import Pacer
from tpuwatch.ports import Flags
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler
from tpuwatch.wiring import load_job, real_ports
from tpuwatch.workers import hostkeys
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client")


def counters(sim: Simulator, name: str, n: int) -> tuple[int, int]:
    """(SSH connections accepted, sessions opened) by the node's workers so far."""
    key = sim.node_key(name)
    return (sum(sim.hosts.accepted(key, w) for w in range(n)), sum(sim.hosts.sessions(key, w) for w in range(n)))


def calls(sim: Simulator) -> Counter[str]:
    with sim.world._lock:
        return Counter({m.rsplit("/", 1)[-1]: n for m, n in sim.world.calls.items()})


# Slow: 256 SSH handshakes (key exchange in the client and in the Python server, a bash per
# probe) take several seconds of CPU on a small machine; nothing smaller shows a v5p-2048.
@pytest.mark.slow
def test_a_256_worker_node_is_probed_through_real_ssh_with_each_workers_pinned_key(
        sim: Simulator, tmp_path: Path) -> None:
    sim.create_node("pod", "v5p-2048")
    tpu = TpuAdapter(sim.project, sim.zone)
    node = tpu.get_node("pod")
    assert node is not None and len(node.workers) == 256
    assert len({w.address(True) for w in node.workers}) == 256  # one loopback address per worker
    transport = OpenSsh(known_hosts=tmp_path / "known_hosts", user=sim.ssh_user or "",
                        identity_file=str(sim.ssh_key), port=sim.ssh_port or 22, internal_ip=True,
                        control_dir=tmp_path / "ssh", host_keys=lambda n: tpu.host_keys(n.name))
    workers = SshWorkers(transport, job="scale", command="true")
    try:
        probes = workers.probe(node)
        assert [p.worker for p in probes] == list(range(256))
        assert {(p.state, p.detail) for p in probes} == {("absent", "no job directory")}, \
            [p for p in probes if p.state != "absent"][:3]
        # every worker was checked against the key its guest attributes publish, not trusted on first use
        assert all(transport.pins.strict(hostkeys.alias(node, w)) for w in node.workers)
        assert counters(sim, "pod", 256) == (256, 256)
        workers.probe(node)  # over the open connections: a channel each, no handshake
        assert counters(sim, "pod", 256) == (256, 512)
    finally:
        workers.close()


def tick_costs(sim: Simulator, tmp: Path, name: str, accelerator: str, n: int, ticks: int = 2) -> dict[str, float]:
    """Per-tick costs of the real Reconciler (real adapters, OpenSSH) on a node of `n` workers,
    after a first tick that opened the connections: handshakes, channels, API calls by method."""
    sim.create_node(name, accelerator, labels={"tpuwatch-job": name})
    d = tmp / name
    d.mkdir()
    cfg = write_config(d / "tpuwatch.toml", sim, "exec sleep 600", d / "ck", tpu={"name": name})
    # The launch-time environment checks scan every process's open files on each worker: on a
    # real pod that is one VM's processes, here every worker shares one machine (n² work). They
    # are not what a tick costs once the job runs, so they are off here.
    cfg.write_text(cfg.read_text().replace('name = "pod"\n', "", 1) + "[precheck]\nenabled = false\n")
    os.environ["TPUWATCH_STATE_DIR"] = str(d / "state")
    job = load_job(cfg)
    ports = real_ports(job)
    try:
        with Journal.open(job.cfg.state_dir, job.name, job.pcfg.tpu_name) as journal:
            # dry run: every tick observes the whole node (probes every worker, reads the API)
            # and launches nothing, so each tick is the same work
            rec = Reconciler(job.cfg, job.pcfg, ports, journal, Flags(dry_run=True))
            first = rec.tick()
            assert first.probes is not None and len(first.probes) == n
            c0, a0 = counters(sim, name, n), calls(sim)
            states: Counter[str] = Counter()
            for _ in range(ticks):
                states.update(p.state for p in rec.tick().probes or ())
            c1, a1 = counters(sim, name, n), calls(sim)
    finally:
        ports.workers.close()
    api = {m: (a1[m] - a0.get(m, 0)) / ticks for m in a1 if a1[m] != a0.get(m, 0)}
    assert states == {"absent": n * ticks}, states  # every worker answered every tick
    return {"handshakes": (c1[0] - c0[0]) / ticks, "channels": (c1[1] - c0[1]) / ticks, **api}


@pytest.mark.slow
def test_a_ticks_cost_per_worker_does_not_grow_with_the_node(sim: Simulator, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "unused"))  # restored after the test
    small = tick_costs(sim, tmp_path, "small", "v5p-32", 4)
    # 8 times the workers shows a cost that grows with the node as well as 32 times did, for a
    # quarter of the handshakes; the 256 handshakes of a v5p-2048 are the test above's
    big = tick_costs(sim, tmp_path, "big", "v5p-256", 32)
    # One channel per worker on the connection it already has: no handshake, nothing reopened
    assert small["handshakes"] == big["handshakes"] == 0
    assert small["channels"] == 4 and big["channels"] == 32
    # The TPU API is asked the same whatever the node's size: one node get a tick (the host keys
    # were read once, on the first tick). The audit log is the shared cache's to pace (by age,
    # so by time): at most one query a tick here.
    def tpu(costs: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in costs.items() if k not in ("handshakes", "channels", "ListLogEntries")}

    assert tpu(big) == tpu(small) == {"GetNode": 1}, (small, big)
    assert big.get("ListLogEntries", 0) <= 1 and small.get("ListLogEntries", 0) <= 1


@pytest.mark.slow
def test_a_steady_tick_with_the_follow_channels_held_opens_no_channel_and_runs_no_ssh(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop of `watch` (Reconciler, then Pacer.wait holding a follow channel per worker):
    once the job runs, a tick's probe is carried on those channels, and it says what a probe
    over SSH says."""
    name, n = "held", 16
    sim.create_node(name, "v5p-128", labels={"tpuwatch-job": name})
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, "exec sleep 600", tmp_path / "ck", tpu={"name": name})
    cfg.write_text(cfg.read_text().replace('name = "pod"\n', "", 1) + "[precheck]\nenabled = false\n")
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    runs = tmp_path / "ssh-runs"
    runs.write_text("")
    counting = tmp_path / "ssh-counted"  # the real ssh, each run counted
    counting.write_text(f"#!/bin/sh\necho x >> '{runs}'\nexec /usr/bin/ssh \"$@\"\n")
    counting.chmod(0o755)
    job = load_job(cfg)
    ports = real_ports(job)
    workers = ports.workers
    assert isinstance(workers, SshWorkers) and isinstance(workers.transport, OpenSsh)
    workers.transport.binary = str(counting)
    pacer = Pacer(ports, 3600)
    try:
        with Journal.open(job.cfg.state_dir, job.name, job.pcfg.tpu_name) as journal:
            rec = Reconciler(job.cfg, job.pcfg, ports, journal, Flags())
            for _ in range(30):  # launch, then ticks until every worker runs it
                report = rec.tick()
                if report.probes and all(p.state == "running" for p in report.probes):
                    break
                pacer.wait(report, 0.2)
            assert report.probes and all(p.state == "running" for p in report.probes), report.probes
            pacer.wait(report, 0)  # holds the channels, as the wait after a steady tick does
            wait_for(lambda: workers.ends.opened == n and all(
                c is not None and c.stream._writable and c.reader.ready for c in workers.ends._open.values()), 60,
                "the channels, ready (their wait said so)")
            c0, r0, a0 = counters(sim, name, n), len(runs.read_text().splitlines()), workers.ends.answered
            for _ in range(2):
                report = rec.tick()
                pacer.wait(report, 0)
            c1, r1 = counters(sim, name, n), len(runs.read_text().splitlines())
            steady = report.probes
            assert steady is not None and len(steady) == n
            assert (c1[0] - c0[0], c1[1] - c0[1], r1 - r0) == (0, 0, 0)  # handshakes, channels, ssh processes
            assert workers.ends.answered - a0 == 2 * n
            workers.unfollow()
            assert report.node is not None
            # over ssh: the same answers (but the log's age, which ticks on between the two)
            assert [replace(p, log_age=None) for p in workers.probe(report.node)] == \
                [replace(p, log_age=None) for p in steady]
            assert len(runs.read_text().splitlines()) == r1 + n
    finally:
        workers.close()
