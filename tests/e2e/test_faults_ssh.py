"""SSH faults end to end: `tpuwatch watch`/`check` over the real OpenSSH client
against simulated workers whose SSH servers refuse, hang (accept and never answer), drop the
connection mid-command, or present a host key their node does not publish.

While the TPU API says READY/HEALTHY, an unreachable worker ends the attempt after
`unreachable_grace` (the poll interval) and nothing is launched until every worker answers, so
a worker that still runs the old attempt is stopped first: never two trainers on a worker.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from chaos.harness import Watched

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.config import load_config
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers.sshworkers import SshWorkers

pytestmark = pytest.mark.slow


def _attempt_end_after(job: Watched, t0: float, timeout: float) -> tuple[float, dict[str, object]]:
    """Seconds from t0 until the journal records the end of attempt 1, and that row."""
    found: dict[str, object] = {}

    def ended() -> bool:
        with job.journal() as j:
            rows = [a for a in j.attempts() if a.number == 1 and a.end is not None]
        if rows:
            found.update(vars(rows[0]))
        return bool(rows)

    at = job.wait(ended, timeout, "attempt 1 to end")
    return at - t0, found


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_one_worker_unreachable_while_the_api_says_healthy(sim: Simulator, tmp_path: Path, mode: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # 600 steps (12 s): the job outlives two ticks' probes of the hanging worker (2 s each), so
    # its end cannot come first and be read as the job's own
    job = Watched(sim, tmp_path, "pod", seed=7, steps=600)
    try:
        job.start()
        job.running_with_progress()
        t0 = time.monotonic()
        sim.inject("ssh", node="pod", worker=1, mode=mode)
        took, row = _attempt_end_after(job, t0, timeout=30)
        # Bounded: the grace (poll interval, 0.3 s) plus a few ticks, each at most one ssh
        # ConnectTimeout (2 s in this config) long when the worker hangs.
        assert took < 12, took
        assert "unreachable" in str(row["reason"]), row
        # Nothing is launched while worker 1 cannot be reached; its trainer (still alive behind
        # the broken SSH server) is the only one of attempt 1 left.
        time.sleep(1.0)
        assert job.sampler.max_attempts <= 1 and job.sampler.max_per_worker <= 1
        with job.journal() as j:
            assert [a.number for a in j.attempts()] == [1], "launched while a worker was unreachable"
        if mode == "hang":
            # What each tick meets: a probe of the hanging worker ends within ssh.connect_timeout.
            monkeypatch.setenv("TPUWATCH_STATE_DIR", str(job.state_dir))  # the job's known_hosts
            probe = SshWorkers.from_config(load_config(job.cfg))
            node = TpuAdapter(sim.project, sim.zone).get_node("pod")
            assert node is not None
            t = time.monotonic()
            probes = probe.probe(node)
            assert time.monotonic() - t < 2 + 3
            assert probes[1].state == "unreachable" and "timed out" in probes[1].detail, probes[1]
            assert probes[0].state != "unreachable", probes[0]
        sim.inject("ssh", node="pod", worker=1, mode="serve")
        job.set_steps(job.steps)  # unchanged: the job runs on to its end
        rc = job.finish(timeout=60)
        job.assert_invariants(rc)
        out = job.output()
        assert "worker 1 of pod is unreachable" in out or "cannot reach workers 1" in out, out[-3000:]
    finally:
        job.close()


def test_connections_reset_mid_command_never_start_a_second_copy(sim: Simulator, tmp_path: Path) -> None:
    """For 4 s at least, the network to worker 1 flaps: now and then its open connections drop (the
    follow channel, which would carry the probe, with them), and SSH sessions run their command
    but lose the connection before the exit status (ssh exit 255): probes, stops and launches
    run on the worker while tpuwatch hears nothing back, and retries them."""
    job = Watched(sim, tmp_path, "pod", seed=8, steps=1000)
    key = sim.node_key("pod")
    worker = sim.hosts._worker(key, 1)  # to see whether an armed reset was used
    stop = threading.Event()
    fired = 0

    def flap() -> None:
        nonlocal fired
        while not stop.is_set():
            sim.hosts.ssh_fault(key, 1, "drop")
            if worker.reset is None:
                sim.hosts.reset_connections(key, 1, None)
                fired += 1
            stop.wait(job.rng.uniform(0.05, 0.4))

    try:
        job.start()
        job.running_with_progress()
        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        time.sleep(4.0)
        deadline = time.monotonic() + 60  # and until the resets hit five sessions (a busy box ticks slower)
        while fired < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        flapper.join(2)
        rc = job.finish(timeout=90)
        result = job.assert_invariants(rc)  # never two trainers on a worker, never two attempts
        assert fired >= 5, fired  # the resets did hit sessions
        print(f"\n{fired} sessions reset; attempts: "
              + "; ".join(f"{a['attempt']} {a['outcome']} ({a['reason'][:80]})" for a in result["attempts"]))
    finally:
        stop.set()
        job.close()


def test_a_host_key_its_node_does_not_publish_is_refused_with_exit_1(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=9, steps=10_000)
    try:
        first = job.cli("check", "-c", str(job.cfg))
        assert first.returncode == 0, first.stdout + first.stderr
        node = sim.world.node("pod")
        # Same node id, same addresses, a key its guest attributes do not publish: what a
        # hijacked VM or a man in the middle looks like. (New keys the API publishes are accepted:
        # test_ssh_keys_e2e.py.)
        sim.inject("wrong-host-key", node="pod", worker=0)
        before = job.cli("history", "-c", str(job.cfg), "--json").stdout
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        msg = r.stderr
        assert "host keys its guest attributes publish" in msg and f"node id {node.id}" in msg, msg
        assert job.cli("history", "-c", str(job.cfg), "--json").stdout == before, "the refused tick wrote"
        w = job.cli("watch", "-c", str(job.cfg))  # watch stops at once too, with the same words
        assert w.returncode == 1 and "guest attributes publish" in w.stderr, w.stdout + w.stderr
    finally:
        job.close()
