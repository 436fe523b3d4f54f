"""SSH keys on real Cloud TPU VMs, end to end with the real OpenSSH client against the simulator.

- Keys reach a new VM after sshd listens: right after a create or a heal the workers answer
  `Permission denied (publickey)` for a while (simulator fault `keys-late`). tpuwatch waits
  ("keys not there yet") within `ssh.login_grace` of the boot and relaunches once they are in;
  past the grace it stops for a person (exit 1) naming user and key, never exit 2.
- Host keys come from the API: each worker publishes its keys as guest attributes; tpuwatch
  accepts a key the API publishes even when it changed (fault `rotate-host-keys` on a heal),
  refuses one it does not (fault `wrong-host-key`) before anything runs there, and trusts on
  first use only where no keys are published, saying so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from chaos.harness import Watched

from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers import hostkeys

pytestmark = pytest.mark.slow


def _login_grace(job: Watched, grace: str) -> None:
    text = job.cfg.read_text()
    job.cfg.write_text(text.replace('connect_timeout = "2s"', f'connect_timeout = "2s"\nlogin_grace = "{grace}"'))


@pytest.mark.parametrize("how", ["heal", "recreate"])
def test_keys_not_there_yet_after_a_boot_are_waited_for_then_the_job_resumes(
        sim: Simulator, tmp_path: Path, how: str) -> None:
    recreate = how == "recreate"
    job = Watched(sim, tmp_path, "pod", seed=21, steps=400, recreatable=recreate, spot=recreate)
    first_id = job.node().id
    try:
        job.start()
        job.running_with_progress()
        # From the next boot on, every key is refused until the test lets them in: however slow
        # the machine, the watcher meets the refusal first.
        sim.inject("keys-late", node="pod", delay="10h")
        if recreate:
            sim.inject("preempt", node="pod")
        else:
            # down for 2 s, not a 0.1 s blip that a connection opened before it could cross
            sim.inject("maintenance", node="pod", heal_after="20m")
        job.wait(lambda: "keys not there yet" in job.output(), 90, "the watcher to wait for the keys")
        sim.inject("keys-late", node="pod", delay="0s")  # the guest agent has installed them
        t_keys = time.monotonic()
        n = job.node().n_workers
        resumed = job.wait(lambda: job.workers_running() == n, 90, "the job running again")
        print(f"\n{how}: job running on every worker {resumed - t_keys:.2f} s after the keys arrived")
        rc = job.finish(timeout=150)
        result = job.assert_invariants(rc)  # exit 0, the job finished, never two trainers
        out = job.output()
        assert "refuse the login" in out and "Traceback" not in out, out[-3000:]
        assert (job.node().id != first_id) == recreate
        outcomes = [a["outcome"] for a in result["attempts"]]
        assert outcomes[0] == "disruption" and not result["attempts"][0]["charged"], result["attempts"]
    finally:
        job.close()


def test_a_login_still_refused_after_the_grace_is_a_stop_for_a_person(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=22, steps=100_000)
    _login_grace(job, "1s")
    try:
        job.start()
        job.running_with_progress()
        sim.inject("keys-late", node="pod", delay="10h")  # a key that never gets in
        # down for 2 s: long enough that the workers' old connections are gone by the heal, on a
        # busy machine too (a 0.1 s blip could be crossed on a connection opened before it)
        sim.inject("maintenance", node="pod", heal_after="20m")
        rc = job.finish(timeout=90)
        out = job.output()
        assert rc == 1, out[-3000:]  # needs a person; never 2 once the watch has ticked
        assert "Traceback" not in out
        assert "still refuse the login" in out and "ssh.login_grace" in out, out[-3000:]
        assert f"'{sim.ssh_user}'" in out and str(sim.ssh_key) in out and "ssh.user" in out, out[-3000:]
        with job.journal() as j:
            mem = j.load_memory()
        assert mem is not None and mem.phase.value == "halted"
    finally:
        job.close()


def test_a_host_key_the_api_does_not_publish_is_refused_and_nothing_runs(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=23, steps=100)
    try:
        node = job.node()
        key = sim.node_key("pod")
        sim.inject("wrong-host-key", node="pod", worker=1)  # before tpuwatch ever connected
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        published = hostkeys.fingerprint("ssh-ed25519 " + sim.hosts.published_host_keys(key, 1)["ssh-ed25519"])
        presented = sim.hosts._worker(key, 1).served_key.get_fingerprint("sha256")
        msg = r.stderr
        for words in ("worker 1 of pod", f"tpuwatch-{node.id}-w1", published, presented, "nothing was run there"):
            assert words in msg, (words, msg)
        # no trainer anywhere: the refusal came before the launch
        assert sim.hosts.pids(key) == [], "a command ran although a host key was refused"
        assert job.steps_done() == []
        # the job's known_hosts holds what the API publishes, not what the worker presented
        known = (job.state_dir / "known_hosts").read_text()
        assert sim.hosts.published_host_keys(key, 1)["ssh-ed25519"] in known
        assert sim.hosts._worker(key, 1).served_key.export_public_key("openssh").decode().split()[1] not in known
    finally:
        job.close()


def test_host_keys_that_change_on_a_heal_are_read_again_from_the_api(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=24, steps=200)
    key = sim.node_key("pod")
    try:
        before = [sim.hosts.published_host_keys(key, w) for w in range(2)]
        job.start()
        job.running_with_progress()
        sim.inject("rotate-host-keys", node="pod")
        sim.inject("maintenance", node="pod", heal_after="60s")
        rc = job.finish(timeout=120)
        job.assert_invariants(rc)  # exit 0 on the same node id, with new keys
        after = [sim.hosts.published_host_keys(key, w) for w in range(2)]
        assert all(a != b for a, b in zip(after, before, strict=True))
        known = (job.state_dir / "known_hosts").read_text()
        assert all(k["ssh-ed25519"] in known for k in after)
        assert not any(k["ssh-ed25519"] in known for k in before), "the old keys are still trusted"
    finally:
        job.close()


def test_trust_on_first_use_only_where_no_keys_can_be_read_and_said_so(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=25, steps=100)
    try:
        # the read of the guest attributes refused (no tpu.nodes.getGuestAttributes): a warning
        # naming the permission, not "no keys", and the first key trusted
        sim.inject("permission-denied", methods=["GetGuestAttributes"])
        r = job.cli("check", "-c", str(job.cfg), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads(r.stdout)
        warned = " ".join(report.get("warnings", []))
        for words in ("cannot read the SSH host keys", "get_guest_attributes", "missing permission",
                      "trust on first use", "ssh.trust_first_use = false"):
            assert words in warned, (words, report)
        lines = [ln for ln in (job.state_dir / "known_hosts").read_text().splitlines() if not ln.startswith("#")]
        # ssh's own lines (the comments say when the API was asked, for the next cron run)
        assert not any(hostkeys.MARK in ln for ln in lines) and len(lines) == 2, lines
        # a key that changes on the same node id is still refused where nothing was published
        sim.inject("wrong-host-key", node="pod", worker=0)
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 1 and "trusted on first use" in r.stderr, r.stdout + r.stderr
    finally:
        job.close()


def test_with_trust_on_first_use_off_a_worker_whose_keys_cannot_be_read_is_never_connected_to(
        sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=26, steps=100)
    try:
        job.cfg.write_text(job.cfg.read_text().replace('connect_timeout = "2s"',
                                                       'connect_timeout = "2s"\ntrust_first_use = false'))
        sim.inject("permission-denied", methods=["GetGuestAttributes"])
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        for words in ("refusing to connect to worker(s) 0, 1 of pod", "get_guest_attributes", "missing permission",
                      "ssh.trust_first_use = false"):
            assert words in r.stderr, (words, r.stderr)
        assert sim.hosts.pids(sim.node_key("pod")) == [] and job.steps_done() == []
        assert not (job.state_dir / "known_hosts").exists() or not [
            ln for ln in (job.state_dir / "known_hosts").read_text().splitlines() if not ln.startswith("#")]
        sim.world.clear_errors()  # the permission granted: the keys are read and the job runs
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        job.close()
