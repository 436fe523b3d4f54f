"""SshWorkers over the real OpenSSH client (/usr/bin/ssh) against the simulated workers.

Each simulated worker is an SSH server on its own 127.x address running commands as local
bash processes with their own HOME and TPUWATCH_HOST_ROOT (tpuwatch/sim/hosts.py).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tpuwatch.errors import ConfigError, JobFailed
from tpuwatch.model import NodeSnapshot, WorkerEndpoint
from tpuwatch.sim.hosts import Hosts
from tpuwatch.workers.gcloud import LEARN_COMMAND, GcloudSsh, Login, gcloud_failure, parse_login
from tpuwatch.workers.ssh import Iap, OpenSsh, classify, run_one
from tpuwatch.workers.sshworkers import SshWorkers

SSH = "/usr/bin/ssh"
needs_ssh = pytest.mark.skipif(not os.path.exists(SSH), reason="needs the OpenSSH client")
_keys = itertools.count()


def node_of(ips: list[str], node_id: str, name: str = "pod") -> NodeSnapshot:
    return NodeSnapshot(
        name=name, project="proj", zone="us-central2-b", id=node_id, create_time=None,
        state="READY", health="HEALTHY", health_description="", maintenance_time=None,
        workers=tuple(WorkerEndpoint(i, ip, "") for i, ip in enumerate(ips)))


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    h = Hosts(tmp_path_factory.mktemp("hosts"))
    h.start()
    try:
        yield h
    finally:
        h.close()


class Cluster:
    """One booted node of the simulated hosts, and SshWorkers pointed at it."""

    def __init__(self, hosts: Hosts, tmp: Path, n: int = 2, command: str = "sleep 300") -> None:
        self.hosts = hosts
        self.key = f"proj/us-central2-b/n{next(_keys)}"
        self.node_id = f"{next(_keys)}0000"
        self.node = node_of(hosts.boot(self.key, self.node_id, n, None), self.node_id)
        self.known_hosts = tmp / "known_hosts"
        self.waits: list[float] = []
        self.workers = self.make(command)

    def transport(self, **kw: object) -> OpenSsh:
        args: dict[str, object] = dict(known_hosts=self.known_hosts, user=self.hosts.ssh_user,
                                       identity_file=str(self.hosts.client_key), port=self.hosts.ssh_port,
                                       connect_timeout=5)
        args.update(kw)
        return OpenSsh(**args)  # type: ignore[arg-type]

    def make(self, command: str, job: str = "j", **kw: object) -> SshWorkers:
        return SshWorkers(self.transport(**kw), job=job, command=command, stop_grace=0.5,
                          retry_wait=0.01, sleep=self.waits.append)

    def job_pids(self, w: int, job: str = "j", needle: bytes = b"") -> list[int]:
        """Live processes of `job` on worker w (they carry TPUWATCH_JOB in their environment)."""
        out = []
        for pid in self.hosts.pids(self.key, w):
            try:
                env = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"\0TPUWATCH_JOB={job}\0".encode() in env and needle in cmd:
                out.append(pid)
        return out


@pytest.fixture
def cluster(hosts: Hosts, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(hosts, tmp_path)
    yield c
    hosts.destroy(c.key)


# ---- argv and classification (no network) ---------------------------------------------------


def test_openssh_argv_pins_host_keys_per_node_id_and_worker(tmp_path: Path) -> None:
    t = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", port=2222,
                internal_ip=True, connect_timeout=7, options=["ProxyJump=bastion"])
    node = node_of(["10.0.0.2", "10.0.0.3"], "1234")
    node = NodeSnapshot(**{**node.__dict__, "workers": (WorkerEndpoint(1, "10.0.0.3", "34.1.2.3"),)})
    argv = t.argv(node, node.workers[0], "bash -s")
    assert argv[:2] == ["ssh", "-T"]
    assert argv[-3:] == ["--", "10.0.0.3", "bash -s"]
    assert argv[2:8] == ["-p", "2222", "-l", "alice", "-i", "/k/id"]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert opts[0] == "ProxyJump=bastion"  # the user's own options come first: first value wins
    for o in ("BatchMode=yes", "ConnectTimeout=7", "ServerAliveInterval=15", "ServerAliveCountMax=3",
              f"UserKnownHostsFile={tmp_path / 'kh'}", "HostKeyAlias=tpuwatch-1234-w1",
              "StrictHostKeyChecking=accept-new", "IdentitiesOnly=yes"):
        assert o in opts
    external = OpenSsh(known_hosts=tmp_path / "kh", user="bob", internal_ip=False)
    assert external.argv(node, node.workers[0], "x")[-2] == "34.1.2.3"


def test_gcloud_prepares_with_gcloud_once_then_connects_with_openssh_as_the_learned_user(tmp_path: Path) -> None:
    ssh = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", port=2222, internal_ip=True)
    t = GcloudSsh(openssh=ssh, user="alice", identity_file="/k/id", internal_ip=True, connect_timeout=9,
                  options=("ProxyJump=b",))
    node = node_of(["10.0.0.2", "10.0.0.3"], "1234", name="llm-pod")
    argv = t.prepare_argv(node, node.workers[0])
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "alice@llm-pod"]
    for a in ("--zone=us-central2-b", "--project=proj", "--worker=0", f"--command={LEARN_COMMAND}",
              "--internal-ip", "--ssh-key-file=/k/id", "--ssh-flag=-oBatchMode=yes",
              "--ssh-flag=-oConnectTimeout=9", "--ssh-flag=-oProxyJump=b", "--ssh-flag=-oPort=2222", "--quiet"):
        assert a in argv
    # what the learn command prints on a worker whose OS Login name is not the local one
    assert parse_login("1234", "motd\n@tpuwatch login user=alice_example_com home=/home/alice_example_com\n") \
        == Login("1234", "alice_example_com", "/home/alice_example_com")
    assert parse_login("1234", "@tpuwatch login user=a;rm home=/\n") is None  # never a shell word
    t.remember(Login("1234", "alice_example_com"))
    argv = t.argv(node, node.workers[1], "bash -s")
    assert argv[:2] == ["ssh", "-T"] and argv[-3:] == ["--", "10.0.0.3", "bash -s"]
    assert argv[argv.index("-l") + 1] == "alice_example_com"
    assert t.prepare(node) is None and t.prepare_calls == 0  # known for this node id: no gcloud


@pytest.mark.parametrize("scope", ["zones/us-central2-b", "regions/us-central2"])
def test_gcloud_prepares_a_compute_engine_slice_with_gcloud_compute_ssh_to_its_first_instance(
        tmp_path: Path, scope: str) -> None:
    """A MIG's workers are its instances: gcloud compute ssh goes by instance name (no --worker),
    and nothing is run while the slice does not name its instances. A regional MIG too: its kind
    says so, whatever its resource name holds."""
    mig = replace(node_of(["10.0.0.2", "10.0.0.3"], "11+12", name="slice"),
                  resource=f"projects/proj/{scope}/instanceGroupManagers/slice", kind="mig")
    names: dict[str, tuple[str, ...]] = {"11+12": ("slice-ab12", "slice-cd34")}
    ssh = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", port=2222, internal_ip=True)
    t = GcloudSsh(openssh=ssh, identity_file="/k/id", internal_ip=True, instances=lambda n: names.get(n.id, ()))
    argv = t.prepare_argv(mig, mig.workers[0])
    assert argv[:4] == ["gcloud", "compute", "ssh", "slice-ab12"]
    for a in ("--zone=us-central2-b", "--project=proj", f"--command={LEARN_COMMAND}", "--internal-ip",
              "--ssh-key-file=/k/id", "--ssh-flag=-oBatchMode=yes", "--ssh-flag=-oPort=2222", "--quiet"):
        assert a in argv
    assert not any(a.startswith("--worker") for a in argv)
    names.clear()
    failed = t.prepare(mig)
    assert failed is not None and failed.failure == "unreachable" and "name its instances" in failed.message
    assert t.prepare_calls == 0


def test_gcloud_prepares_a_mig_only_when_ready_as_a_whole_and_reaches_its_vms_still_running_with_the_known_login(
        tmp_path: Path) -> None:
    """A MIG is prepared once per incarnation, READY as a whole. One VM of it down (preempted,
    or Google recreating the slice one VM at a time, the half-made incarnation's id already new):
    no gcloud run; the VMs still running are reached as the user gcloud logged in as before; a
    watcher that knows no login yet reaches none of them until the MIG is READY."""
    from tpuwatch.model import combine_slices

    calls = tmp_path / "calls"
    fake = tmp_path / "gcloud"  # a stand-in for gcloud: logs its target, prints what LEARN_COMMAND prints
    fake.write_text(f"#!/bin/sh\necho \"$3\" >> {calls}\necho '@tpuwatch login user=alice_x home=/home/alice_x'\n")
    fake.chmod(0o755)
    mig = replace(node_of(["10.0.0.2", "10.0.0.3"], "11+12", name="slice"), kind="mig",
                  resource="projects/proj/zones/us-central2-b/instanceGroupManagers/slice",
                  worker_states=("READY", "READY"))
    half = replace(mig, state="PREEMPTED", worker_states=("PREEMPTED", "READY"))
    ssh = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", internal_ip=True)

    def transport() -> GcloudSsh:
        return GcloudSsh(openssh=ssh, user="alice", identity_file="/k/id", binary=str(fake),
                         instances=lambda n: ("slice-ab12", "slice-cd34"))

    fresh = transport()  # a watcher that first sees the MIG with a VM down, no login known
    view = combine_slices("slice", [half])
    assert view is not None and view.reachable
    failed = fresh.prepare(view)
    assert failed is not None and failed.failure == "unreachable" and "READY as a whole" in failed.message
    assert not calls.exists() and fresh.login(view) is None

    t = transport()
    whole = combine_slices("slice", [mig])
    assert whole is not None and t.prepare(whole) is None
    assert calls.read_text().split() == ["alice@slice-ab12"]  # once, to worker 0
    assert view is not None and t.prepare(view) is None  # VM 0 preempted: VM 1 reached as before
    login = t.login(view)
    assert login is not None and login.user == "alice_x"
    argv = t.argv(view, view.workers[1], "true")
    assert argv[argv.index("-l") + 1] == "alice_x" and "10.0.0.3" in argv
    # Google recreating the slice: VM 0 made again (a new id, running), VM 1 still being made
    making = combine_slices("slice", [replace(mig, id="21+22", state="REPAIRING",
                                              worker_states=("READY", "PROVISIONING"))])
    assert making is not None and making.reachable and t.prepare(making) is None
    login = t.login(making)
    assert login is not None and login.user == "alice_x"
    assert t.prepare_calls == 1
    remade = combine_slices("slice", [replace(mig, id="21+22")])  # READY as a whole: its one gcloud run
    assert remade is not None and t.prepare(remade) is None and t.prepare(remade) is None
    assert t.prepare_calls == 2 and calls.read_text().split() == ["alice@slice-ab12"] * 2

    journaled = transport()  # a later watcher that remembers the journal's login: no gcloud at all
    journaled.remember(Login(whole.id, "alice_x", "/home/alice_x"))
    assert journaled.prepare(view) is None and journaled.prepare_calls == 0


def test_iap_tunnels_each_worker_by_its_vm_name_with_both_transports(tmp_path: Path) -> None:
    """As gcloud's --tunnel-through-iap: ssh's ProxyCommand is `gcloud compute start-iap-tunnel
    <VM> %p --listen-on-stdin`; no TCP probe (only the tunnel reaches the port); nothing is
    tried while the node does not publish its VM names."""
    node = node_of(["10.0.0.2", "10.0.0.3"], "1234", name="llm-pod")
    names: dict[str, tuple[str, ...]] = {"1234": ("t1v-n-ab-w-0", "t1v-n-ab-w-1")}
    iap = Iap(lambda n: names.get(n.id, ()))
    t = OpenSsh(known_hosts=tmp_path / "kh", user="alice", port=2222, internal_ip=True, iap=iap)
    argv = t.argv(node, node.workers[1], "bash -s")
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert ("ProxyCommand=gcloud compute start-iap-tunnel t1v-n-ab-w-1 %p --listen-on-stdin --project=proj "
            "--zone=us-central2-b --verbosity=warning") in opts and "ProxyUseFdpass=no" in opts
    assert "HostKeyAlias=tpuwatch-1234-w1" in opts  # the key is still pinned per node id
    assert t.direct_target(node.workers[0]) is None and t.prepare(node) is None
    names.clear()
    failed = t.prepare(node)
    assert failed is not None and failed.failure == "unreachable" and "instance names" in failed.message
    g = GcloudSsh(openssh=OpenSsh(known_hosts=tmp_path / "kh", user="alice", internal_ip=True, iap=iap),
                  user="alice", identity_file="/k/id", internal_ip=True)
    prep = g.prepare_argv(node, node.workers[0])
    assert "--tunnel-through-iap" in prep and "--internal-ip" not in prep


def test_gcloud_own_failures_are_told_from_ssh_and_remote_exit_codes() -> None:
    expired = ("ERROR: (gcloud.compute.tpus.tpu-vm.ssh) There was a problem refreshing your current auth "
               "tokens: Reauthentication failed. cannot prompt during non-interactive execution.\n"
               "Please run:\n\n  $ gcloud auth login\n")
    assert gcloud_failure(1, expired)[0] == "credentials"
    unusable = 'ERROR: (gcloud.compute.tpus.tpu-vm.ssh) This TPU has state "STOPPED", so it cannot be currently connected to.\n'
    assert gcloud_failure(1, unusable) == ("unreachable", unusable.strip())
    refused = ("alice_example_com@10.0.0.2: Permission denied (publickey).\n"
               "ERROR: (gcloud.compute.tpus.tpu-vm.ssh) [/usr/bin/ssh] exited with return code [255].\n")
    assert gcloud_failure(1, refused)[0] == "auth"
    down = ("ssh: connect to host 10.0.0.2 port 22: Connection refused\n"
            "ERROR: (gcloud.compute.tpus.tpu-vm.ssh) [/usr/bin/ssh] exited with return code [255].\n")
    assert gcloud_failure(1, down)[0] == "unreachable"
    # gcloud compute ssh's own words: an instance gone, a stopped one, no permission
    gone = ("ERROR: (gcloud.compute.ssh) Could not fetch resource:\n - The resource "
            "'projects/p/zones/z/instances/slice-ab12' was not found\n")
    assert gcloud_failure(1, gone)[0] == "unreachable"
    stopped = ("ERROR: (gcloud.compute.ssh) Instance [slice-ab12] in zone [z] has not been allocated an external "
               "IP address yet. Try rerunning this command later.\n")
    assert gcloud_failure(1, stopped)[0] == "unreachable"
    denied = ("ERROR: (gcloud.compute.ssh) Could not fetch resource:\n - Required 'compute.instances.get' "
              "permission for 'projects/p/zones/z/instances/slice-ab12'\n")
    assert gcloud_failure(1, denied)[0] == "credentials"


def test_ssh_failures_are_told_apart_from_remote_exit_codes() -> None:
    assert classify(1, "anything") == ""
    assert classify(0, "Connection refused") == ""
    assert classify(255, "ssh: connect to host 10.0.0.2 port 22: Connection refused") == "unreachable"
    assert classify(255, "ssh: connect to host 10.0.0.2 port 22: Connection timed out") == "unreachable"
    assert classify(255, "alice@10.0.0.2: Permission denied (publickey).") == "auth"
    assert classify(255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\n"
                         "Host key verification failed.") == "host_key"


def test_an_unusable_identity_file_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    missing = OpenSsh(known_hosts=tmp_path / "kh", identity_file=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"ssh\.identity_file: .*does not exist"):
        missing.check()
    key = tmp_path / "key"
    key.write_text("x")
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"ssh\.identity_file: .*chmod 600"):
        OpenSsh(known_hosts=tmp_path / "kh", identity_file=str(key)).check()
    with pytest.raises(ConfigError, match=r"ssh\.identity_file: .*directory"):
        OpenSsh(known_hosts=tmp_path / "kh", identity_file=str(tmp_path)).check()
    with pytest.raises(ConfigError, match="job.command: unknown placeholder"):
        SshWorkers(missing, job="j", command="run {ckpt}")


# ---- real ssh ---------------------------------------------------------------------------------


@needs_ssh
def test_probe_launch_twice_and_stop(cluster: Cluster) -> None:
    w = cluster.workers
    assert [p.state for p in w.probe(cluster.node)] == ["absent", "absent"]
    first = w.launch(cluster.node, 1, None)
    assert [r.outcome for r in first] == ["launched", "launched"]
    again = w.launch(cluster.node, 1, None)
    assert [r.outcome for r in again] == ["running", "running"]
    assert [r.pid for r in again] == [r.pid for r in first]
    for i in (0, 1):
        wait_for(lambda i=i: bool(cluster.job_pids(i, needle=b"sleep\x00300")), what="the job")
        assert len(cluster.job_pids(i, needle=b"sleep\x00300")) == 1
    probes = w.probe(cluster.node)
    assert [(p.state, p.attempt) for p in probes] == [("running", 1), ("running", 1)]
    stops = w.stop(cluster.node)
    assert all(s.ok and s.stopped for s in stops)
    assert cluster.job_pids(0) == [] and cluster.job_pids(1) == []
    assert [(p.state, p.exit_code) for p in w.probe(cluster.node)] == [("exited", 143)] * 2


@needs_ssh
def test_a_connection_dropped_mid_launch_is_retried_and_starts_one_job(cluster: Cluster) -> None:
    # Each worker's connection drops once the launch's first bytes are out (its cleanup's
    # answer), before the launch itself answered: the launch may or may not have happened.
    for i in (0, 1):
        cluster.hosts.reset_connections(cluster.key, i, after_bytes=1)
    results = cluster.workers.launch(cluster.node, 1, None, clean=True)
    # the first try's answer never came: each worker was asked again on a session of its own
    assert [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)] == [2, 2]
    # the retry found the job the first try started, or started it: the drop may come before
    # the first try's shell got to it
    assert all(r.outcome in ("running", "launched") and r.started for r in results), results
    for i in (0, 1):
        wait_for(lambda i=i: bool(cluster.job_pids(i, needle=b"sleep\x00300")), what="the job")
        assert len(cluster.job_pids(i, needle=b"sleep\x00300")) == 1
    cluster.workers.stop(cluster.node)


@needs_ssh
def test_stop_leaves_nothing_of_the_job_and_clears_the_tpu(cluster: Cluster) -> None:
    cmd = "sleep 301 & setsid sleep 302 & (trap '' TERM; exec sleep 303) & exec sleep 304"
    job = cluster.make(cmd)
    assert all(r.started for r in job.launch(cluster.node, 1, None))
    # an orphan of some other program holding worker 1's TPU, and a stale lockfile on worker 0
    holder = cluster.make('exec 3<"$TPUWATCH_HOST_ROOT/dev/accel0"; exec sleep 305', job="other")
    assert all(r.started for r in holder.launch(cluster.node, 1, None))
    stale = cluster.hosts.host_root(cluster.key, 0) / "tmp" / "libtpu_lockfile"
    stale.touch()
    for i in (0, 1):
        wait_for(lambda i=i: len(cluster.job_pids(i, needle=b"sleep\x0030")) == 4, what="the job")
        wait_for(lambda i=i: len(cluster.job_pids(i, "other", b"sleep\x00305")) == 1, what="the holder")
    stops = job.stop(cluster.node)
    assert all(s.ok for s in stops), [s.describe() for s in stops]
    for i in (0, 1):
        assert cluster.job_pids(i) == [], f"worker {i} still runs the job"
        # the holder itself; its wrapper, no holder, ends on its own a moment later
        assert cluster.job_pids(i, "other", b"sleep\x00305") == [], f"worker {i}: the device holder lives"
        assert stops[i].device_holders
    assert stops[0].libtpu_lockfile == "removed" and not stale.exists()
    assert "stopped TPU device holder" in stops[1].describe()


@needs_ssh
def test_host_keys_are_pinned_per_node_id(cluster: Cluster) -> None:
    w = cluster.workers
    assert [p.state for p in w.probe(cluster.node)] == ["absent", "absent"]
    aliases = {line.split()[0] for line in cluster.known_hosts.read_text().splitlines()}
    assert aliases == {f"tpuwatch-{cluster.node_id}-w0", f"tpuwatch-{cluster.node_id}-w1"}
    # same node id, new host keys: refused, naming the node, worker and the fix
    ips = cluster.hosts.boot(cluster.key, cluster.node_id, 2, None)
    with pytest.raises(JobFailed) as err:
        w.probe(node_of(ips, cluster.node_id))
    msg = str(err.value)
    assert "worker 0 of pod" in msg and f"node id {cluster.node_id}" in msg
    assert f"ssh-keygen -R tpuwatch-{cluster.node_id}-w0 -f {cluster.known_hosts}" in msg
    # a recreated node has a new id: its new keys are accepted once
    recreated = node_of(ips, cluster.node_id + "9")
    assert [p.state for p in w.probe(recreated)] == ["absent", "absent"]


@needs_ssh
def test_an_unreachable_worker_is_a_result_not_a_crash(cluster: Cluster) -> None:
    cluster.hosts.down(cluster.key)
    probes = cluster.workers.probe(cluster.node)
    assert [p.state for p in probes] == ["unreachable", "unreachable"]
    assert "Connection refused" in probes[0].detail and "worker 0 of pod" in probes[0].detail
    results = cluster.workers.launch(cluster.node, 1, None)
    assert [r.outcome for r in results] == ["unreachable", "unreachable"]
    assert len(cluster.waits) == cluster.workers.ssh_tries - 1
    stops = cluster.workers.stop(cluster.node)
    assert all(s.unreachable for s in stops)


def test_a_command_that_hangs_is_cut_at_ssh_command_timeout(cluster: Cluster, tmp_path: Path) -> None:
    # Worker 1's job lock is a FIFO nobody writes: opening it blocks, as on a hung file system.
    job_dir = cluster.hosts.worker_home(cluster.key, 1) / ".tpuwatch" / "j"
    job_dir.mkdir(parents=True)
    os.mkfifo(job_dir / "lock")
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\nzone = "us-central2-b"\n[job]\nname = "j"\ncommand = "true"\n'
                   '[ssh]\ncommand_timeout = "5s"\n')
    from tpuwatch.config import load_config

    assert SshWorkers.from_config(load_config(cfg)).timeout == 5.0
    workers = SshWorkers(cluster.transport(), job="j", command="true", timeout=2.0)
    t0 = time.monotonic()
    probes = workers.probe(cluster.node)
    assert time.monotonic() - t0 < 10
    assert probes[0].state == "absent"
    assert probes[1].state == "unreachable" and "ssh.command_timeout" in probes[1].detail, probes[1]


@needs_ssh
def test_a_refused_login_is_an_unreachable_worker_that_says_so(cluster: Cluster, tmp_path: Path) -> None:
    """Keys reach a new VM after sshd listens: a refused login is a result the policy weighs
    (keys not there yet, or a person must fix user and key), not an error that ends the watch."""
    import asyncssh

    other = tmp_path / "other_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(other))
    other.chmod(0o600)
    w = cluster.make("true", identity_file=str(other))
    probes = w.probe(cluster.node)
    assert all(p.state == "unreachable" and p.login_refused for p in probes), probes
    assert "refused the login" in probes[0].detail and str(other) in probes[0].detail


@needs_ssh
def test_follow_streams_the_log_over_ssh(cluster: Cluster) -> None:
    job = cluster.make("for i in 1 2 3; do echo w{worker} $i; sleep 0.05; done; exit 3")
    job.launch(cluster.node, 1, None)
    got: list[bytes] = []
    _, run = job.follow(cluster.node, 1, 1, 0, got.append, poll=0.05)
    result, end = run()
    assert result.ok and (end.result, end.exit_code) == ("ok", 3)
    assert b"".join(got) == b"w1 1\nw1 2\nw1 3\n"


def test_a_timeout_ends_the_clients_whole_process_group(tmp_path: Path) -> None:
    # ssh's ProxyCommand is a child of ssh (gcloud's ssh is a child of gcloud): killing only the
    # client left it running, holding the connection. Nothing listens: the proxy just waits.
    pidfile = tmp_path / "proxy.pid"
    proxy = f"ProxyCommand=sh -c 'echo $$ > {pidfile}; exec sleep 300'"
    t = OpenSsh(known_hosts=tmp_path / "kh", user="u", options=[proxy], connect_timeout=60)
    node = node_of(["10.0.0.2"], "1")
    r = run_one(t, node, node.workers[0], b"", remote_command="true", timeout=1.5)
    assert r.failure == "timeout" and r.exit_code is None
    pid = int(pidfile.read_text())
    wait_for(lambda: not _alive(pid), 5, "the ProxyCommand to be gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
