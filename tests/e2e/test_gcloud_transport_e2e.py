"""ssh.transport = "gcloud" end to end, with the real gcloud against the simulator's REST face.

The simulator's os-login fault makes the workers accept only an OS Login name
(`alice_example_com`), as Google does for a Google account: gcloud swaps that name in for the
local one. The watcher must learn it, run gcloud once per node incarnation (not once per worker
per probe), connect with OpenSSH, and write the learned name into a recreated node's
`tpuwatch-user` metadata so that the startup script's job and the watcher share one home.
gcloud costs about a second a call, so each test makes few.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import Job

from tpuwatch.sim import gcloudcfg
from tpuwatch.sim.rest import OSLOGIN_GET_PROFILE, RestFace
from tpuwatch.sim.simulator import Simulator

GCLOUD = shutil.which("gcloud") or "/usr/bin/gcloud"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(GCLOUD), reason="needs the Google Cloud CLI (gcloud)"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client"),
]
OS_LOGIN_USER = "alice_example_com"
GUEST_ATTRIBUTES = "google.cloud.tpu.v2.Tpu/GetGuestAttributes"


def gcloud_job(sim: Simulator, rest: RestFace, tmp: Path, **kw: object) -> Job:
    """A Job whose [ssh] goes through gcloud, with no ssh.user: gcloud decides who we are."""
    job = Job(sim, tmp, **kw)  # type: ignore[arg-type]
    text = job.cfg.read_text()
    text = text[:text.index("[ssh]")] + "\n".join([
        "[ssh]", 'transport = "gcloud"', f"identity_file = {json.dumps(str(sim.ssh_key))}",
        f"port = {sim.ssh_port}", f'options = ["Port={sim.ssh_port}"]', "internal_ip = true", ""])
    job.cfg.write_text(text)
    cfg = gcloudcfg.write_config(tmp / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                                 home=tmp / "home", ssh_key=sim.ssh_key)
    job.env.update(cfg.env)
    return job


def check(job: Job) -> subprocess.CompletedProcess[str]:
    r = job.cli("check", "-c", str(job.cfg), "--json", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_os_login_user_is_learned_once_per_node_incarnation_and_written_into_the_recreated_node(
        sim: Simulator, tmp_path: Path) -> None:
    with RestFace(sim.world) as rest:
        job = gcloud_job(sim, rest, tmp_path, accelerator="v4-16", spot=True, recreatable=True, steps=100000)
        local = sim.ssh_user
        sim.control("Inject", {"fault": "os-login", "params": {"user": OS_LOGIN_USER}})
        assert local != OS_LOGIN_USER and sim.ssh_user == OS_LOGIN_USER
        key = sim.node_key("pod")
        # the fault: plain ssh under the local name is refused
        plain = subprocess.run(
            ["ssh", "-T", "-p", str(sim.ssh_port), "-l", local, "-i", str(sim.ssh_key), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             sim.hosts.ips(key)[0], "true"], capture_output=True, text=True, timeout=60)
        assert plain.returncode == 255 and "Permission denied" in plain.stderr
        sim.world.reset_calls()

        for _ in range(3):  # three watchers in a row, as cron runs `check`
            check(job)
        job.wait(lambda: len(job.job_processes()) == 2, 30, "the job on both workers")
        # one gcloud run for this node: one OS Login profile read, one guest-attribute read
        assert sim.world.calls[OSLOGIN_GET_PROFILE] == 1, dict(sim.world.calls)
        assert sim.world.calls[GUEST_ATTRIBUTES] == 1, dict(sim.world.calls)
        for w in range(2):  # the job runs in the OS Login user's session
            assert (sim.hosts.worker_home(key, w) / ".tpuwatch" / "pod" / "attempt").read_text().strip() == "1"
        events = job.history()["events"]
        logins = [e for e in events if e["kind"] == "login"]
        assert len(logins) == 1 and f"as {OS_LOGIN_USER}" in logins[0]["reason"], logins

        # the node is preempted and recreated: its startup script is told the learned user
        old_id = sim.world.node("pod").id
        sim.world.preempt("pod")
        job.wait(lambda: (check(job) and sim.world.has_node("pod") and sim.world.node("pod").id != old_id
                          and sim.world.node("pod").state == "READY"), 120, "the node recreated")
        assert sim.world.node("pod").spec.metadata["tpuwatch-user"] == OS_LOGIN_USER
        job.wait(lambda: check(job) is not None and len(job.job_processes()) == 2, 120, "the job on the new node")
        assert sim.world.calls[OSLOGIN_GET_PROFILE] == 2, dict(sim.world.calls)  # once per incarnation


def test_a_gcloud_failure_is_not_the_remote_exit_code_and_a_timeout_ends_gcloud_and_its_ssh(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuwatch.cloud.tpu.adapter import TpuAdapter
    from tpuwatch.workers.gcloud import GcloudSsh
    from tpuwatch.workers.ssh import OpenSsh
    from tpuwatch.workers.sshworkers import SshWorkers

    with RestFace(sim.world) as rest:
        cfg = gcloudcfg.write_config(tmp_path / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                                     home=tmp_path / "home", ssh_key=sim.ssh_key)
        for k, v in cfg.env.items():
            monkeypatch.setenv(k, v)
        sim.create_node("pod", "v4-8")
        node = TpuAdapter(sim.project, sim.zone).require_node("pod")

        def transport(timeout: float) -> GcloudSsh:
            ssh = OpenSsh(known_hosts=tmp_path / "kh", identity_file=str(sim.ssh_key), port=sim.ssh_port,
                          internal_ip=True)
            return GcloudSsh(openssh=ssh, identity_file=str(sim.ssh_key), internal_ip=True, prepare_timeout=timeout)

        # The TPU API refuses gcloud (its exit 1): that is no remote exit code 1, the job is untouched
        sim.control("Inject", {"fault": "permission-denied", "params": {"methods": ["GetNode"]}})
        workers = SshWorkers(transport(120), job="train", command="sleep 300", timeout=60)
        with pytest.raises(Exception) as denied:
            workers.probe(node)
        assert type(denied.value).__name__ == "CloudError" and "gcloud auth login" in str(denied.value)
        sim.control("Inject", {"fault": "clear-errors", "params": {}})

        # worker 0 accepts connections and never answers: gcloud's ssh hangs; at the timeout the
        # whole group goes (gcloud and the ssh it started), and the worker is unreachable this tick
        sim.control("Inject", {"fault": "ssh", "params": {"node": "pod", "worker": 0, "mode": "HANG"}})
        short = transport(8)
        slow = SshWorkers(short, job="train", command="sleep 300", timeout=60)
        probes = slow.probe(node)
        assert [p.state for p in probes] == ["unreachable"] and "did not finish in 8s" in probes[0].detail
        left = subprocess.run(["pgrep", "-f", "--", f"-oPort={sim.ssh_port}"], capture_output=True, text=True)
        assert left.stdout.strip() == "", "gcloud's ssh child outlived the timeout"
        sim.control("Inject", {"fault": "ssh", "params": {"node": "pod", "worker": 0, "mode": "SERVE"}})
        # the next tick reaches the worker with the same transport; its gcloud run gets the usual
        # time, since on a loaded 2-core machine gcloud alone can take 8s to start and answer
        short.prepare_timeout = 120
        probes = slow.probe(node)
        assert [p.state for p in probes] == ["absent"], probes
        assert re.fullmatch(r"[a-z_][a-z0-9_.-]*", slow.login(node).user)  # type: ignore[union-attr]
