"""ssh.transport = "gcloud" on a slice made through Compute Engine, end to end: the real gcloud
(`gcloud compute ssh`) and the real `google-cloud-compute` client against the simulator's REST
face, real ssh to the simulated VMs; nothing reaches Google.

gcloud runs once per slice incarnation, to the first instance (worker 0), to prepare the keys
(OS Login, or the project's `ssh-keys`) and learn the user it logs in as; OpenSSH reaches every
worker as that user. gcloud costs about a second a call, so each test makes few.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import finish, trainer, write_config

from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.sim import gcloudcfg
from tpuwatch.sim.rest import COMPUTE_PROJECTS_SET_METADATA, OSLOGIN_GET_PROFILE, RestFace
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers.gcloud import GcloudSsh
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers

GCLOUD = shutil.which("gcloud") or "/usr/bin/gcloud"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(GCLOUD), reason="needs the Google Cloud CLI (gcloud)"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client"),
]
OS_LOGIN_USER = "alice_example_com"


def gcloud_config(sim: Simulator, rest: RestFace, tmp: Path, name: str, hold_at: int) -> tuple[Path, dict[str, str]]:
    """A job on Compute Engine slice `name` whose [ssh] goes through gcloud, with no ssh.user
    (gcloud decides who we are), and the environment of a tpuwatch (and its gcloud) pointed at
    the simulator. The job stalls at step `hold_at` until `go/<hold_at>` exists."""
    ck, go = sim.bucket / "ck", tmp / "go"
    go.mkdir()
    cfg = write_config(tmp / f"{name}.toml", sim, trainer(ck, f"--hold-at {hold_at} --hold-until {go}"), ck,
                       name=name, tpu={"api": "compute", "mig": name})
    text = cfg.read_text()
    cfg.write_text(text[:text.index("[ssh]")] + "\n".join([
        "[ssh]", 'transport = "gcloud"', f"identity_file = {json.dumps(str(sim.ssh_key))}",
        f"port = {sim.ssh_port}", f'options = ["Port={sim.ssh_port}"]', "internal_ip = true",
        # a MIG's peers resolve only in Compute Engine's internal DNS
        "[precheck]", 'skip = ["dns"]', ""]))
    g = gcloudcfg.write_config(tmp / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                               home=tmp / "home", ssh_key=sim.ssh_key)
    env = {**os.environ, **sim.env, **g.env, "TPUWATCH_STATE_DIR": str(tmp / "state"),
           "TPUWATCH_COMPUTE_EMULATOR": rest.url.rstrip("/")}
    return cfg, env


def tpuwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_process.run(args, env, timeout=120)


def wait(pred: Callable[[], bool], what: str, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end or proc.poll() is not None:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"timed out waiting for {what}; watch printed:\n{out}")
        time.sleep(0.1)


@contextlib.contextmanager
def gcloud_in_this_process(sim: Simulator, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    """The simulator's REST face, with this process's gcloud and Compute Engine client pointed
    at it (GcloudSsh runs `gcloud` with this process's environment)."""
    with RestFace(sim.world) as rest:
        g = gcloudcfg.write_config(tmp / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                                   home=tmp / "home", ssh_key=sim.ssh_key)
        for k, v in {**g.env, "TPUWATCH_COMPUTE_EMULATOR": rest.url.rstrip("/")}.items():
            monkeypatch.setenv(k, v)
        yield rest


def gcloud_workers(sim: Simulator, tmp: Path, adapter: ComputeAdapter) -> tuple[GcloudSsh, SshWorkers]:
    """A fresh gcloud transport (nothing prepared yet) and the workers of a job over it."""
    ssh = OpenSsh(known_hosts=tmp / "kh", identity_file=str(sim.ssh_key), port=sim.ssh_port, internal_ip=True)
    t = GcloudSsh(openssh=ssh, identity_file=str(sim.ssh_key), internal_ip=True, instances=adapter.instance_names)
    return t, SshWorkers(t, job="train", command="sleep 300", timeout=60)


def gcloud_pinned(home: Path) -> set[str]:
    """The instances gcloud connected to, by the host key aliases it pinned (`compute.<id>`)."""
    known = home / ".ssh" / "google_compute_known_hosts"
    lines = known.read_text().splitlines() if known.exists() else []
    return {line.split()[0] for line in lines if line.strip()}


def test_gcloud_compute_ssh_prepares_a_mig_once_per_incarnation_on_worker_0_and_openssh_runs_the_job(
        sim: Simulator, tmp_path: Path) -> None:
    w = sim.world
    with RestFace(w) as rest:
        w.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"})
        cfg, env = gcloud_config(sim, rest, tmp_path, "slice", hold_at=10)
        sim.control("Inject", {"fault": "os-login", "params": {"user": OS_LOGIN_USER}})
        assert sim.ssh_user == OS_LOGIN_USER

        def first_instance() -> str:
            """gcloud's host key alias of worker 0's instance ("" while the MIG makes it)."""
            ids = {r.name: r.id for r in w.instances()}
            members = sorted(w.mig("slice").members)
            return f"compute.{ids[members[0]]}" if members and members[0] in ids else ""

        first = first_instance()
        proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(cfg)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        ck = sim.bucket / "ck"
        wait(lambda: (ck / "10").exists(), "the checkpoint at step 10", proc)
        # one gcloud run for this incarnation, to its first instance: one OS Login profile read
        assert w.calls[OSLOGIN_GET_PROFILE] == 1, dict(w.calls)
        assert gcloud_pinned(tmp_path / "home") == {first}
        w.autoheal("slice")  # Google recreates the multi-host slice as a whole: a new incarnation
        wait(lambda: first_instance() not in ("", first), "the slice recreated", proc)
        (tmp_path / "go" / "10").touch()
        rc, out = finish(proc, timeout=180)
        assert rc == 0, out
        assert w.calls[OSLOGIN_GET_PROFILE] == 2, dict(w.calls)  # once per incarnation
        assert gcloud_pinned(tmp_path / "home") == {first, first_instance()}
        history = tpuwatch(env, "history", "-c", str(cfg), "--json")
        assert history.returncode == 0, history.stderr
        data: dict[str, Any] = json.loads(history.stdout)
        logins = [e["reason"] for e in data["events"] if e["kind"] == "login"]
        # journaled when learned (the second incarnation's user is the same: no second event)
        assert len(logins) == 1 and f"as {OS_LOGIN_USER}" in logins[0] and "via gcloud" in logins[0], logins
        first_attempt, second = data["attempts"][:2]
        assert first_attempt["outcome"] == "disruption" and first_attempt["charged"] is False, out
        assert second["start_step"] is not None and second["start_step"] >= 10, second
        # both workers of the new slice ran the resumed attempt, reached by OpenSSH as the OS Login user
        for name in sorted(w.mig("slice").members):
            home = sim.hosts.worker_home(w.instance(name).key, 0)
            assert (home / ".tpuwatch" / "slice" / "attempt").read_text().strip() == "2", name


def test_a_gcloud_compute_ssh_failure_is_classified_and_never_the_jobs(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuwatch.errors import CloudError

    w = sim.world
    with gcloud_in_this_process(sim, tmp_path, monkeypatch):
        w.add_instance("vm")  # a lone instance, no OS Login: gcloud adds its key to the project
        adapter = ComputeAdapter(sim.project, sim.zone, "instance")
        node = adapter.get_node("vm")
        assert node is not None and node.state == "READY"

        # gcloud may not read the project: its credentials, for a person (exit 3), not the job's exit 1
        sim.control("Inject", {"fault": "permission-denied", "params": {"methods": ["compute.v1.Projects/Get"]}})
        t, denied_workers = gcloud_workers(sim, tmp_path, adapter)
        with pytest.raises(CloudError) as denied:
            denied_workers.probe(node)
        assert "`gcloud compute ssh vm --zone=" in str(denied.value) and "gcloud auth login" in str(denied.value)
        assert t.prepare_calls == 1 and t.login(node) is None
        sim.control("Inject", {"fault": "clear-errors", "params": {}})

        # it may: gcloud adds its key to the project's ssh-keys, the login is learned, OpenSSH asks
        t, ok_workers = gcloud_workers(sim, tmp_path, adapter)
        assert [p.state for p in ok_workers.probe(node)] == ["absent"]
        login = t.login(node)
        assert login is not None and login.user == sim.ssh_user and login.via == "gcloud"
        assert w.calls[COMPUTE_PROJECTS_SET_METADATA] == 1, dict(w.calls)

        # the instance gone under gcloud: unreachable this tick, in gcloud's words
        w.remove_instance("vm")
        t, gone_workers = gcloud_workers(sim, tmp_path, adapter)
        probes = gone_workers.probe(node)
        assert [p.state for p in probes] == ["unreachable"] and "was not found" in probes[0].detail, probes
        assert "gcloud compute ssh vm" in probes[0].detail and t.login(node) is None


def test_a_key_gcloud_can_put_in_one_instance_only_is_put_in_every_instance_of_the_slice(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the right to write the project's metadata, gcloud compute ssh puts the key in the
    instance's own: the other instances never read it, so gcloud goes to each of them too."""
    w = sim.world
    with gcloud_in_this_process(sim, tmp_path, monkeypatch):
        mig = w.add_mig("slice", "tpu7x-standard-4t", 2)
        adapter = ComputeAdapter(sim.project, sim.zone, "mig")
        node = adapter.get_node("slice")
        assert node is not None and node.state == "READY" and len(node.workers) == 2
        sim.control("Inject", {"fault": "permission-denied",
                               "params": {"methods": [COMPUTE_PROJECTS_SET_METADATA]}})
        t, workers = gcloud_workers(sim, tmp_path, adapter)
        probes = workers.probe(node)
        assert [p.state for p in probes] == ["absent", "absent"], probes
        assert t.prepare_calls == 2 and w.calls["compute.v1.Instances/SetMetadata"] == 2, dict(w.calls)
        kind, data = Path(str(sim.ssh_key) + ".pub").read_text().split()[:2]
        for name in mig.members:  # each instance carries the key in its own metadata
            assert f"{kind} {data}" in w.instance(name).metadata["ssh-keys"], name
        assert gcloud_pinned(tmp_path / "home") == {f"compute.{w.instance(n).id}" for n in mig.members}
