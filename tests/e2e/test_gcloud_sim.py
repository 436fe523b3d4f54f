"""The real `gcloud` (gcloud 528 at /usr/bin/gcloud) against the simulator's REST face.

Each test starts a Simulator with SSH workers, a RestFace on its world, and a private gcloud
configuration (CLOUDSDK_CONFIG) plus a HOME holding the workers' key as
~/.ssh/google_compute_engine. gcloud takes about a second per call, so the number of calls is
kept small (about 25 in this file); `GCLOUD_CALLS` counts the ones made directly.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from e2e_helpers import create_through_queued_resource

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.recreate import ownership_error
from tpuwatch.sim import gcloudcfg
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers import protocol
from tpuwatch.workers.gcloud import GcloudSsh
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers

GCLOUD = shutil.which("gcloud") or "/usr/bin/gcloud"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(GCLOUD), reason="needs the Google Cloud CLI (gcloud)"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client"),
]
GCLOUD_CALLS = [0]


@dataclass
class Gcloud:
    sim: Simulator
    rest: RestFace
    cfg: gcloudcfg.GcloudConfig
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        GCLOUD_CALLS[0] += 1
        return subprocess.run([GCLOUD, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def ssh(self, node: str, command: str, *, worker: str = "all") -> subprocess.CompletedProcess[str]:
        return self("compute", "tpus", "tpu-vm", "ssh", node, f"--zone={self.sim.zone}", f"--worker={worker}",
                    f"--ssh-flag=-p {self.sim.ssh_port}", f"--command={command}")

    def shell(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A bash script that calls gcloud itself (the docs' pipelines and loops)."""
        return subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def gcloud(sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcloud]:
    with RestFace(sim.world) as rest:
        cfg = gcloudcfg.write_config(tmp_path / "gcloud", url=rest.url, project=sim.project, zone=sim.zone,
                                     home=tmp_path / "home", ssh_key=sim.ssh_key)
        env = {**os.environ, **cfg.env}
        # gcloud reads the project and zone from its configuration, not from the sim's env
        for k in ("CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE"):
            env.pop(k, None)
        yield Gcloud(sim, rest, cfg, env)


def wait_for(cond: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout}s"
        time.sleep(0.05)


def job_pids(sim: Simulator, node: str, worker: int, cmdline: str) -> list[int]:
    """Live processes of one simulated worker whose command line is exactly `cmdline`."""
    out = []
    for pid in sim.hosts.pids(sim.node_key(node), worker):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if b" ".join(argv).decode() == cmdline:
            out.append(pid)
    return out


def settled_counts(sim: Simulator, node: str, n: int, cmdline: str) -> list[int]:
    """Per-worker counts of `cmdline` processes, once every worker has at least one (a launch
    returns before its child has exec'd); a duplicate shows as 2."""
    wait_for(lambda: all(job_pids(sim, node, i, cmdline) for i in range(n)), what=f"{cmdline!r} on {n} workers")
    return [len(job_pids(sim, node, i, cmdline)) for i in range(n)]


def test_describe_list_delete_and_create_with_a_startup_script(gcloud: Gcloud, tmp_path: Path) -> None:
    sim = gcloud.sim
    sim.create_node("alpha", "v4-8")
    sim.create_node("beta", "v4-8")
    sim.world.maintenance("alpha", heal_after=60)
    sim.world.wait_for(lambda w: w.node("alpha").health_description != "", 10, "alpha healed")

    # the docs' example, literally: describe | grep health
    r = gcloud.shell(f"gcloud compute tpus tpu-vm describe alpha --zone={sim.zone} | grep health")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "health: HEALTHY", r.stdout
    assert lines[1].startswith("healthDescription: The TPU had a maintenance event at 20"), r.stdout
    assert lines[1].endswith("Z") and len(lines) == 2

    r = gcloud("compute", "tpus", "tpu-vm", "list", f"--zone={sim.zone}", "--format=value(name.basename(),state)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["alpha\tREADY", "beta\tREADY"]

    r = gcloud("compute", "tpus", "tpu-vm", "describe", "nope", f"--zone={sim.zone}")
    assert r.returncode == 1 and "NOT_FOUND: Resource" in r.stderr and "nodes/nope' was not found" in r.stderr

    r = gcloud("compute", "tpus", "tpu-vm", "delete", "beta", f"--zone={sim.zone}", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Deleted tpu [beta]" in r.stderr and not sim.world.has_node("beta")

    script = tmp_path / "startup.sh"
    script.write_text('#!/bin/bash\necho "booted worker $TPUWATCH_SIM_WORKER_ID" > "$HOME/booted"\n')
    r = gcloud("compute", "tpus", "tpu-vm", "create", "gamma", f"--zone={sim.zone}", "--accelerator-type=v4-16",
               "--version=tpu-ubuntu2204-base", f"--metadata-from-file=startup-script={script}")
    assert r.returncode == 0, r.stderr
    assert "Created tpu [gamma]" in r.stderr
    node = sim.world.node("gamma")
    assert (node.state, node.health, node.spec.metadata["startup-script"]) == ("READY", "HEALTHY", script.read_text())
    key = sim.node_key("gamma")
    for i in range(2):
        wait_for(lambda i=i: sim.hosts.startup_status(key, i) is not None, what=f"startup script on worker {i}")
        assert sim.hosts.startup_status(key, i) == 0
        assert (sim.hosts.worker_home(key, i) / "booted").read_text() == f"booted worker {i}\n"


def test_the_update_labels_command_tpuwatch_suggests_marks_a_node_as_owned(gcloud: Gcloud) -> None:
    sim = gcloud.sim
    sim.create_node("mine", "v4-8", labels={"team": "x"})
    node = TpuAdapter(sim.project, sim.zone).require_node("mine")
    hint = ownership_error(node, "job-1").message
    command = hint.split("`gcloud ", 1)[1].split("`", 1)[0].split()
    r = gcloud(*command)
    assert r.returncode == 0, r.stderr
    assert sim.world.node("mine").spec.labels == {"team": "x", "tpuwatch-job": "job-1"}
    assert TpuAdapter(sim.project, sim.zone).require_node("mine").owned_by("job-1")


def test_ssh_worker_all_reaches_every_worker_and_passes_a_failure_on(gcloud: Gcloud) -> None:
    sim = gcloud.sim
    sim.create_node("pod", "v4-32")
    key = sim.node_key("pod")
    r = gcloud.ssh("pod", 'echo "worker=$TPUWATCH_SIM_WORKER_ID home=$HOME"')
    assert r.returncode == 0, r.stderr
    got = sorted(r.stdout.splitlines())
    assert got == [f"worker={i} home={sim.hosts.worker_home(key, i)}" for i in range(4)]
    # gcloud pinned every worker's host key under its node-id alias
    known = (gcloud.cfg.home / ".ssh" / "google_compute_known_hosts").read_text()  # type: ignore[operator]
    node_id = sim.world.node("pod").id
    assert sorted(line.split("-")[1] for line in known.splitlines()) == ["0", "1", "2", "3"]
    assert all(line.startswith(f"tpu.{node_id}-") for line in known.splitlines())

    # the loop in the docs relies on this: a worker's non-zero status is gcloud's status
    r = gcloud.ssh("pod", '[ "$TPUWATCH_SIM_WORKER_ID" != 2 ] || exit 7')
    assert r.returncode == 7, r.stderr
    assert "worker 2 failed with exit status 7" in r.stderr


def test_the_docs_retry_loop_resumes_the_trainer_after_a_healed_maintenance(gcloud: Gcloud) -> None:
    sim = gcloud.sim
    sim.create_node("pod", "v4-16")
    ck = sim.bucket / "ck"
    # What a user's train.py does: find the newest complete checkpoint and resume from it. The
    # trainer learns its worker number from the simulated host, as a real job does from its VM.
    train = (
        f'last=$(ls {ck} 2>/dev/null | grep -E "^[0-9]+$" | sort -n | tail -1); '
        f"python3 -m tpuwatch.sim.trainer --steps 40 --step-time 0.03 --ckpt-every 5 --ckpt-dir {ck} "
        f'--resume "${{last:+{ck}/$last}}"'
    )
    loop = (
        "runs=0; "
        f"while ! {{ runs=$((runs+1)); gcloud compute tpus tpu-vm ssh pod --zone={sim.zone} --worker=all "
        f"--ssh-flag='-p {sim.ssh_port}' --command {shlex.quote(train)}; }}; do sleep 1; done; "
        'echo "gcloud runs: $runs"'
    )
    GCLOUD_CALLS[0] += 1
    proc = subprocess.Popen(["bash", "-c", loop], env=gcloud.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (ck / "10").is_dir(), 30, "checkpoint 10")
        sim.world.maintenance("pod", heal_after=600)  # heals after 1 s of real time
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert out.count("worker 0: fresh start") == 1, out
    resumed = [line for line in out.splitlines() if line.startswith("worker 0: resumed from")]
    assert resumed and all(int(line.split(" at step ")[1].split(",")[0]) >= 10 for line in resumed), out
    assert "worker 0: done at step 40" in out and "worker 1: done at step 40" in out
    assert (ck / "40" / "commit_success.txt").is_file()
    runs = int(out.rsplit("gcloud runs: ", 1)[1].split()[0])
    assert 1 <= runs <= 5, out
    # the node went through maintenance and is healthy again, as describe would show
    node = sim.world.node("pod")
    assert node.health == "HEALTHY" and node.health_description.startswith("The TPU had a maintenance event at")


def test_gcloud_reruns_a_command_after_a_dropped_connection_but_the_lock_keeps_one_job(gcloud: Gcloud) -> None:
    sim = gcloud.sim
    sim.create_node("pod", "v4-32")
    key = sim.node_key("pod")
    for i in range(4):
        launch = protocol.launch_script("job", attempt=1, worker=i, checkpoint=None, command="sleep 300")
        (sim.hosts.worker_home(key, i) / "launch.sh").write_bytes(launch)
    # worker 2's session loses its connection after the command ran, before its exit status
    sim.hosts.reset_connections(key, 2)
    # one command, two launches: a naive detached start, and tpuwatch's locked launch
    r = gcloud.ssh("pod", "echo ran >> ~/runs; (setsid sleep 301 </dev/null >/dev/null 2>&1 &); bash ~/launch.sh")
    assert r.returncode == 0, r.stderr
    assert "exited with return code [255]" in r.stderr and "Retrying" in r.stderr
    runs = [(sim.hosts.worker_home(key, i) / "runs").read_text().count("ran") for i in range(4)]
    assert runs == [1, 1, 2, 1]  # gcloud ran the command on worker 2 a second time
    naive = settled_counts(sim, "pod", 4, "sleep 301")
    assert naive == [1, 1, 2, 1]  # so the naive launch started a duplicate job there
    locked = settled_counts(sim, "pod", 4, "sleep 300")
    assert locked == [1, 1, 1, 1]  # the worker-side lock refused the second launch
    # the rerun's answer on worker 2: this attempt already runs
    answers = [line for line in r.stdout.splitlines() if line.startswith("@tpuwatch result=")]
    assert sorted(answers) == ["@tpuwatch result=launched"] * 4 + ["@tpuwatch result=running"]


def test_tpuwatch_gcloud_transport_launch_probe_stop_on_all_workers(
        gcloud: Gcloud, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = gcloud.sim
    sim.create_node("pod", "v4-16")
    key = sim.node_key("pod")
    for k, v in gcloud.cfg.env.items():
        monkeypatch.setenv(k, v)  # GcloudSsh runs `gcloud` with this process's environment
    node = TpuAdapter(sim.project, sim.zone).require_node("pod")  # over gRPC: one world, two faces
    assert [w.index for w in node.workers] == [0, 1]
    ssh = OpenSsh(known_hosts=gcloud.cfg.home / "kh", identity_file=str(sim.ssh_key),  # type: ignore[operator]
                  port=sim.ssh_port, internal_ip=True)
    transport = GcloudSsh(openssh=ssh, identity_file=str(sim.ssh_key), internal_ip=True)
    workers = SshWorkers(transport, job="train", command="sleep 300", stop_grace=0.5, timeout=90, retry_wait=0.1)

    # worker 1's connection drops once its launch's first bytes (the cleanup's answer) are out:
    # the launch is retried there; the lock keeps one job
    sim.hosts.reset_connections(key, 1, after_bytes=1)
    launched = workers.launch(node, 1, None, clean=True)
    assert [(r.worker, r.started, r.attempt) for r in launched] == [(0, True, 1), (1, True, 1)], launched
    assert settled_counts(sim, "pod", 2, "sleep 300") == [1, 1]

    probes = workers.probe(node)
    assert [(p.state, p.attempt) for p in probes] == [("running", 1), ("running", 1)], probes
    assert [p.pid for p in probes] == [r.pid for r in launched]
    # the follow channels gcloud's login opened carry the next probe: no new channel
    workers.follow_ends(node, 1, [0, 1], lambda: None)
    # writable and ready (its wait said so): only such a channel is asked
    wait_for(lambda: all((c := workers.ends._open.get(i)) is not None and c.stream._writable and c.reader.ready
                         for i in (0, 1)),
             30, "the follow channels")
    sessions, answered = [sim.hosts.sessions(key, i) for i in (0, 1)], workers.ends.answered
    # the same answer, but for the log's age in whole seconds, which a busy machine may tick over
    assert [replace(p, log_age=0) for p in workers.probe(node)] == [replace(p, log_age=0) for p in probes]
    assert [sim.hosts.sessions(key, i) for i in (0, 1)] == sessions and workers.ends.answered == answered + 2

    stopped = workers.stop(node)
    assert all(s.ok and s.stopped for s in stopped), stopped
    assert [len(job_pids(sim, "pod", i, "sleep 300")) for i in range(2)] == [0, 0]
    probes = workers.probe(node)
    assert [(p.state, p.attempt, p.exit_code) for p in probes] == [("exited", 1, 143)] * 2, probes
    workers.close()
    assert transport.prepare_calls == 1  # gcloud ran once for the node; OpenSSH did the rest


def test_queued_resources_multislice_create_describe_list_delete(gcloud: Gcloud) -> None:
    """`gcloud compute tpus queued-resources create --node-count 2 --node-prefix np` (v2
    multisliceParams) provisions np-0 and np-1; describe shows them, delete --force removes all."""
    z = f"--zone={gcloud.sim.zone}"
    made = gcloud("compute", "tpus", "queued-resources", "create", "ms", z, "--node-count=2", "--node-prefix=np",
                  "--accelerator-type=v4-8", "--runtime-version=tpu-ubuntu2204-base", "--spot")
    assert made.returncode == 0, made.stderr
    world = gcloud.sim.world
    world.wait_for(lambda w: w.get_queued_resource(gcloud.sim.project, gcloud.sim.zone, "ms").state == "ACTIVE",
                   what="the request ACTIVE", timeout=60)
    assert sorted(n.name for n in world.nodes()) == ["np-0", "np-1"] and all(n.spec.spot for n in world.nodes())
    shown = gcloud("compute", "tpus", "queued-resources", "describe", "ms", z,
                   "--format=value(state.state,tpu.nodeSpec[0].multisliceParams.nodeCount)")
    assert shown.returncode == 0 and shown.stdout.split() == ["ACTIVE", "2"], shown.stderr
    listed = gcloud("compute", "tpus", "queued-resources", "list", z, "--format=value(name)")
    assert listed.returncode == 0 and listed.stdout.split() == ["ms"], listed.stderr
    gone = gcloud("compute", "tpus", "queued-resources", "delete", "ms", z, "--force", "--quiet")
    assert gone.returncode == 0, gone.stderr
    world.wait_for(lambda w: not w.nodes() and not w.list_queued_resources(gcloud.sim.project, gcloud.sim.zone),
                   what="every node and the request gone", timeout=60)


def test_gcloud_alpha_reserved_tier_and_reservation_are_what_init_writes(
        gcloud: Gcloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gcloud alpha ... queued-resources create --reserved --reservation=NAME` (v2alpha1
    guaranteed.reserved, reservationName expanded to the full name): `tpuwatch init` on its node,
    over gRPC, writes both into the spec; the GA (v2) describe cannot show `reserved`."""
    from cli_helpers import run_cli

    from tpuwatch.config import load_config

    sim, z = gcloud.sim, f"--zone={gcloud.sim.zone}"
    made = gcloud("alpha", "compute", "tpus", "queued-resources", "create", "rq", z, "--node-id=rnode",
                  "--accelerator-type=v4-8", "--runtime-version=tpu-ubuntu2204-base", "--reserved",
                  "--reservation=tpu-res")
    assert made.returncode == 0, made.stderr
    reservation = f"projects/{sim.project}/locations/{sim.zone}/reservations/tpu-res"
    sim.world.wait_for(lambda w: w.get_queued_resource(sim.project, sim.zone, "rq").state == "ACTIVE",
                       what="the request ACTIVE", timeout=60)
    qr = sim.world.get_queued_resource(sim.project, sim.zone, "rq")
    assert (qr.tier, qr.reservation, qr.api_version) == ("reserved", reservation, "v2alpha1")
    alpha = gcloud("alpha", "compute", "tpus", "queued-resources", "describe", "rq", z,
                   "--format=value(guaranteed.reserved,reservationName)")
    assert alpha.returncode == 0 and alpha.stdout.split() == ["True", reservation], alpha.stderr
    ga = gcloud("compute", "tpus", "queued-resources", "describe", "rq", z, "--format=json(guaranteed)")
    assert ga.returncode == 0 and "reserved" not in ga.stdout, ga.stdout + ga.stderr

    out = tmp_path / "rnode.toml"
    code, _, err = run_cli(["init", "rnode", "-o", str(out)], capsys)
    assert code == 0, err
    spec = load_config(out).tpu["spec"]
    assert (spec["queued_resource_tier"], spec["reservation_name"]) == ("reserved", reservation)


def test_queued_resources_perform_maintenance_names_nodes_by_their_short_names(gcloud: Gcloud) -> None:
    """`gcloud alpha compute tpus queued-resources perform-maintenance qr --node-names=pod`, as
    Google's example has it, starts the node's announced maintenance; the simulator refuses a
    full resource name (INVALID_ARGUMENT), as tpuwatch no longer sends one."""
    sim = gcloud.sim
    create_through_queued_resource(sim, "qr", "v6e-16", {}, spot=False)
    sim.world.delays["simulated_maintenance_heal"] = 120.0
    sim.world.upcoming_maintenance("pod", starts_in=7 * 86400)
    verb = ("alpha", "compute", "tpus", "queued-resources", "perform-maintenance", "qr", f"--zone={sim.zone}",
            "--async")
    full = gcloud(*verb, f"--node-names=projects/{sim.project}/locations/{sim.zone}/nodes/pod")
    assert full.returncode != 0 and "is not a node of" in full.stderr, full.stderr
    assert sim.world.node("pod").upcoming.status == "PENDING"  # type: ignore[union-attr]
    short = gcloud(*verb, "--node-names=pod")
    assert short.returncode == 0, short.stderr
    sim.world.wait_for(lambda w: w.node("pod").upcoming is None and w.node("pod").health == "HEALTHY",
                       what="the maintenance done", timeout=60)
