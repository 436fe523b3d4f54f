"""OpenSSH connection multiplexing (workers/mux.py) and the follow channels that notice an
attempt's end at once (workers/ends.py), over the real OpenSSH client against the simulated
workers. `Hosts.accepted` counts the SSH connections (handshakes) each worker accepted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from e2e_helpers import wait_for

from tpuwatch.config import load_config
from tpuwatch.errors import ConfigError
from tpuwatch.model import Login, NodeSnapshot, WorkerEndpoint, WorkerProbe
from tpuwatch.sim.hosts import Hosts
from tpuwatch.workers import mux as muxmod
from tpuwatch.workers import protocol
from tpuwatch.workers.gcloud import GcloudSsh
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers

# The command line of the shell that runs a worker-side script (protocol.REMOTE_COMMAND).
SCRIPT_SHELL = b"".join(a.encode() + b"\x00" for a in shlex.split(protocol.REMOTE_COMMAND))

SSH = "/usr/bin/ssh"
pytestmark = pytest.mark.skipif(not os.path.exists(SSH), reason="needs the OpenSSH client")
_keys = itertools.count()


def node_of(ips: list[str], node_id: str) -> NodeSnapshot:
    return NodeSnapshot(
        name="pod", project="proj", zone="us-central2-b", id=node_id, create_time=None,
        state="READY", health="HEALTHY", health_description="", maintenance_time=None,
        workers=tuple(WorkerEndpoint(i, ip, "") for i, ip in enumerate(ips)))


class Cluster:
    """One booted two-worker node of the simulated hosts, and SshWorkers pointed at it."""

    def __init__(self, hosts: Hosts, tmp: Path) -> None:
        self.hosts = hosts
        self.key = f"proj/us-central2-b/m{next(_keys)}"
        self.node_id = f"{next(_keys)}0000"
        self.node = node_of(hosts.boot(self.key, self.node_id, 2, None), self.node_id)
        self.known_hosts = tmp / "known_hosts"
        self.workers = self.make("sleep 300")

    def transport(self, **kw: object) -> OpenSsh:
        args: dict[str, object] = dict(known_hosts=self.known_hosts, user=self.hosts.ssh_user,
                                       identity_file=str(self.hosts.client_key), port=self.hosts.ssh_port,
                                       connect_timeout=5)
        args.update(kw)
        return OpenSsh(**args)  # type: ignore[arg-type]

    def make(self, command: str, **kw: object) -> SshWorkers:
        return SshWorkers(self.transport(**kw), job="j", command=command, stop_grace=0.5, retry_wait=0.01)

    def job_pids(self, w: int, needle: bytes = b"") -> list[int]:
        """Live processes of job "j" on worker w whose command line holds `needle`."""
        out = []
        for pid in self.hosts.pids(self.key, w):
            try:
                env = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"\0TPUWATCH_JOB=j\0" in env and needle in cmd:
                out.append(pid)
        return out


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    h = Hosts(tmp_path_factory.mktemp("hosts"))
    h.start()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory whose sockets fit sun_path: tmp_path under a pytest-xdist worker is too long."""
    d = Path(tempfile.mkdtemp(prefix="tw", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cluster(hosts: Hosts, short_tmp: Path) -> Iterator[Cluster]:
    c = Cluster(hosts, short_tmp)
    yield c
    c.workers.close()
    hosts.destroy(c.key)


def _opts(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]


def _alive(pid: int) -> bool:
    """The process runs (a zombie has closed its sockets: not alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _master_pid(path: str) -> int:
    out = subprocess.run([SSH, "-o", f"ControlPath={path}", "-O", "check", "x"], capture_output=True, text=True,
                         timeout=10)
    m = re.search(r"pid=(\d+)", out.stderr + out.stdout)
    assert m, out
    return int(m.group(1))


# ---- socket paths and options (no network) ----------------------------------------------------


def test_socket_paths_fit_the_unix_socket_limit_even_under_a_long_state_dir(short_tmp: Path) -> None:
    tmp_path = short_tmp
    short = OpenSsh(known_hosts=tmp_path / "kh", user="u", control_dir=tmp_path / "ssh")
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    long = OpenSsh(known_hosts=deep / "kh", user="u", control_dir=deep / "ssh")
    node = node_of(["10.0.0.2", "10.0.0.3"], "1234")
    for t, inside in ((short, True), (long, False)):
        assert t.mux is not None
        for w in node.workers:
            path = next(o for o in _opts(t.argv(node, w, "x")) if o.startswith("ControlPath=")).split("=", 1)[1]
            # ssh binds "<path>.<16 characters>" first; sun_path holds 104 bytes on macOS, NUL included
            assert len(os.fsencode(path)) + muxmod.TEMP_SUFFIX + 1 <= muxmod.SUN_PATH
            assert (Path(path).parent == tmp_path / "ssh") is inside
        t.check()
        assert os.stat(t.mux.dir).st_mode & 0o777 == 0o700
        t.argv(node, node.workers[0], "x")
        t.close()
        assert t.mux.dir.exists() is inside  # a /tmp stand-in is removed on close once empty
    # a recreated node (new id) behind the same address never shares the old node's connection
    again = node_of(["10.0.0.2", "10.0.0.3"], "5678")
    assert short.argv(node, node.workers[0], "x") != short.argv(again, again.workers[0], "x")


def test_multiplex_options_and_the_config_key(tmp_path: Path) -> None:
    node = node_of(["10.0.0.2"], "1")
    on = OpenSsh(known_hosts=tmp_path / "kh", user="u", options=["ControlPersist=30"])
    opts = _opts(on.argv(node, node.workers[0], "x"))
    assert "ControlMaster=auto" in opts and any(o.startswith("ControlPath=") for o in opts)
    assert opts[0] == "ControlPersist=30"  # the user's own value comes first, so it wins
    off = OpenSsh(known_hosts=tmp_path / "kh", user="u", multiplex=False)
    assert not any(o.startswith("Control") for o in _opts(off.argv(node, node.workers[0], "x")))
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n[ssh]\nmultiplex = false\n')
    assert SshWorkers.from_config(load_config(cfg)).transport.mux is None  # type: ignore[attr-defined]
    cfg.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n[ssh]\nmultiplex = "yes"\n')
    with pytest.raises(ConfigError, match=r"ssh\.multiplex"):
        load_config(cfg)


def test_the_gcloud_transport_and_a_bastion_share_masters_unless_multiplex_is_off(tmp_path: Path) -> None:
    """gcloud runs once per node incarnation (never through a master: it runs its own ssh); the
    OpenSSH calls after it share the worker's master, as do calls through a ProxyJump bastion
    (the master holds the jump). `ssh.multiplex = false` is the way out for a bastion or proxy
    that cannot carry it: no Control option reaches ssh at all."""
    node = node_of(["10.0.0.2"], "77")
    w = node.workers[0]
    for multiplex in (True, False):
        ssh = {"multiplex": multiplex, "options": ["ProxyJump=bastion"]}
        g = GcloudSsh.from_config(ssh, tmp_path / str(multiplex))
        g.remember(Login(node_id="77", user="alice_example_com"))
        later = _opts(g.argv(node, w, "bash -s"))
        assert "ProxyJump=bastion" in later
        assert any(o.startswith("ControlPath=") for o in later) is multiplex, later
        assert not any("Control" in a for a in g.prepare_argv(node, w))
        plain = OpenSsh.from_config(ssh, tmp_path / str(multiplex))
        direct = _opts(plain.argv(node, w, "bash -s"))
        assert "ProxyJump=bastion" in direct and any(o.startswith("ControlMaster=") for o in direct) is multiplex


def test_a_socket_directory_others_can_write_is_refused(short_tmp: Path) -> None:
    tmp_path = short_tmp
    d = tmp_path / "ssh"
    d.mkdir()
    d.chmod(0o777)
    t = OpenSsh(known_hosts=tmp_path / "kh", user="u", control_dir=d)
    with pytest.raises(ConfigError, match=r"ssh\.multiplex: .*only you.*ssh\.multiplex = false"):
        t.check()


# ---- over the simulated workers ---------------------------------------------------------------


def test_one_handshake_per_worker_for_many_calls_and_none_left_after_close(cluster: Cluster) -> None:
    w = cluster.workers
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    for _ in range(3):
        assert [p.state for p in w.probe(cluster.node)] == ["running", "running"]
    assert all(s.ok for s in w.stop(cluster.node))
    assert [cluster.hosts.accepted(cluster.key, i) for i in (0, 1)] == [1, 1]  # 5 calls, 1 connection each
    mux = w.transport.mux  # type: ignore[attr-defined]
    sockets = list(mux.dir.iterdir())
    assert len(sockets) == 2
    w.close()
    assert list(mux.dir.iterdir()) == []
    wait_for(lambda: cluster.hosts.connections(cluster.key, 0) == 0 == cluster.hosts.connections(cluster.key, 1),
             10, "the masters' connections to close")
    # without multiplexing, every call is a handshake
    plain = cluster.make("true", multiplex=False)
    before = cluster.hosts.accepted(cluster.key, 0)
    plain.probe(cluster.node)
    plain.probe(cluster.node)
    assert cluster.hosts.accepted(cluster.key, 0) == before + 2


def test_a_dead_or_stuck_master_is_replaced(cluster: Cluster) -> None:
    w = SshWorkers(cluster.transport(), job="j", command="true", timeout=3.0)
    w.probe(cluster.node)
    mux = w.transport.mux  # type: ignore[attr-defined]
    path0 = mux.path(w.transport._control_key(cluster.node, cluster.node.workers[0], w.transport.user))  # type: ignore[attr-defined]
    # killed: its socket is left behind; ssh removes it and connects afresh. Once it is gone: a
    # master still dying would take the probe's connection and drop it.
    dead = _master_pid(path0)
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: not _alive(dead), what="the killed master to be gone")
    assert [p.state for p in w.probe(cluster.node)] == ["absent", "absent"]
    assert cluster.hosts.accepted(cluster.key, 0) == 2
    # stuck (a connection that no longer answers): the call times out at ssh.command_timeout,
    # the master is ended, and the next call gets a new connection
    stuck = _master_pid(path0)
    os.kill(stuck, signal.SIGSTOP)
    try:
        first = w.probe(cluster.node)
        assert first[0].state == "unreachable" and "ssh.command_timeout" in first[0].detail, first[0]
        assert first[1].state == "absent"
        assert [p.state for p in w.probe(cluster.node)] == ["absent", "absent"]
        assert cluster.hosts.accepted(cluster.key, 0) == 3
    finally:
        os.kill(stuck, signal.SIGKILL)
        w.close()


def test_a_follow_channel_wakes_the_moment_a_workers_attempt_ends(cluster: Cluster) -> None:
    w = cluster.workers
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    ended = threading.Event()
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)
    wait_for(lambda: w.ends.opened == 2, 20, "two follow channels")
    wait_for(lambda: bool(cluster.job_pids(0, needle=b"sleep\x00300")), what="the job")
    assert not ended.is_set()
    # one thread per channel, reading both of ssh's pipes (a watcher holds one per job)
    assert sorted(t.name for t in threading.enumerate() if t.name.startswith(("tpuwatch-ends", "tpuwatch-ssh"))) == \
        ["tpuwatch-ends-w0", "tpuwatch-ends-w1"]
    # holding it again for the same attempt opens nothing new
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)
    assert w.ends.opened == 2
    for pid in cluster.job_pids(0, needle=b"sleep\x00300"):
        os.kill(pid, signal.SIGSEGV)
    assert ended.wait(30), "the crash did not wake the watcher"
    assert w.ends.held() == [1]  # worker 1 still runs; worker 0's end is not asked again
    assert [cluster.hosts.accepted(cluster.key, i) for i in (0, 1)] == [1, 1]  # channels, not handshakes
    w.unfollow()
    assert w.ends.held() == []


def test_a_dropped_follow_channel_is_not_an_end(cluster: Cluster) -> None:
    w = cluster.workers
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    ended = threading.Event()
    w.follow_ends(cluster.node, 1, [0], ended.set)
    # the launch's session goes on as the follow channel: one session, no other
    assert w.ends.opened == 2 and w.ends._open.get(0) is not None
    assert cluster.hosts.sessions(cluster.key, 0) == 1
    # every connection to worker 0 dropped (its master too): the job itself runs on
    cluster.hosts.ssh_fault(cluster.key, 0, "drop")
    wait_for(lambda: w.ends.opened >= 3, 30, "the channel to be opened again")
    assert not ended.is_set()
    assert [p.state for p in w.probe(cluster.node)][0] == "running"  # the probe is the truth
    for pid in cluster.job_pids(0, needle=b"sleep\x00300"):
        os.kill(pid, signal.SIGKILL)
    assert ended.wait(30), "the end after the reopen did not wake the watcher"


def test_a_channel_dropped_while_its_host_refuses_ssh_opens_no_ssh_to_reopen(cluster: Cluster) -> None:
    """A maintenance: the host stops answering and its channel drops. The tries to open it again
    knock on the SSH port (a TCP connect, as between ticks) and start no ssh client while
    nothing listens; once they give up the loop is woken, once, to look now (not an end: the
    probe says what happened); the next hold opens it when the host is back."""
    w = cluster.workers
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    ended = threading.Event()
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)
    opened = w.ends.opened
    cluster.hosts.ssh_fault(cluster.key, 0, "refuse")
    cluster.hosts.ssh_fault(cluster.key, 0, "drop")
    wait_for(lambda: 0 not in w.ends.held(), 30, "worker 0's channel to give up")
    assert w.ends.opened == opened
    wait_for(ended.is_set, 30, "the wake for the host gone")
    assert w.ends.held() == [1]
    cluster.hosts.ssh_fault(cluster.key, 0, "serve")
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)
    wait_for(lambda: w.ends.opened == opened + 1, 30, "worker 0's channel to open again")  # in its own thread
    assert [p.state for p in w.probe(cluster.node)] == ["running", "running"]
    w.unfollow()


_WATCHER = """
import sys
from pathlib import Path
from tpuwatch.model import Login, NodeSnapshot, WorkerEndpoint
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import SshWorkers
kh, user, key, port, ip = sys.argv[1:6]
node = NodeSnapshot(name="pod", project="proj", zone="us-central2-b", id=sys.argv[6], create_time=None,
                    state="READY", health="HEALTHY", health_description="", maintenance_time=None,
                    workers=(WorkerEndpoint(0, ip, ""),))
t = OpenSsh(known_hosts=Path(kh), user=user, identity_file=key, port=int(port), connect_timeout=5)
SshWorkers(t, job="j", command="sleep 300", stop_grace=2.0).launch(node, 2, None, clean=True)
"""


def test_an_end_on_a_launchs_channel_before_the_hold_wakes_the_holder(cluster: Cluster) -> None:
    """The launch's session goes on as the follow channel; an attempt that ends before the loop
    holds the channels (a crash at start) still wakes the loop, once, when it does."""
    w = cluster.make("exit 3")
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    assert [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)] == [1, 1]
    wait_for(lambda: sorted(w.ends._answered) == [0, 1], 30, "both channels to report the end")
    ended = threading.Event()
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)
    assert ended.is_set(), "an end seen before the hold did not wake the holder"
    ended.clear()
    w.follow_ends(cluster.node, 1, [0, 1], ended.set)  # the next tick's hold: nothing new to say
    assert not ended.is_set() and w.ends.held() == []
    assert [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)] == [1, 1]  # no channel opened again


def test_a_launch_outlives_the_watcher_killed_while_it_runs(cluster: Cluster) -> None:
    """A watcher SIGKILLed mid-launch (the chaos test's launch kills): its ssh client is a mux
    client that exits when nobody reads it, and the master closes the channel. The launch on
    the worker must still happen once its script arrived, or the next watcher finds this
    worker without the attempt the others run and charges the job for it."""
    w = cluster.make("trap '' TERM; sleep 300")  # attempt 1 outlives a TERM: cleanup takes stop_grace
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    wait_for(lambda: bool(cluster.job_pids(0, needle=b"sleep\x00300")), what="attempt 1")
    w0 = cluster.node.workers[0]
    t = w.transport
    assert t.mux is not None  # type: ignore[attr-defined]
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(cluster.known_hosts), cluster.hosts.ssh_user,
                                str(cluster.hosts.client_key), str(cluster.hosts.ssh_port), w0.internal_ip, cluster.node_id],
                               stdin=subprocess.DEVNULL)

    def running(cmdline: bytes) -> bool:
        for pid in cluster.hosts.pids(cluster.key, 0):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                    return True
        return False

    def launching() -> bool:  # the launch's shell runs on the worker
        return running(SCRIPT_SHELL)

    try:
        # Its cleanup waits for attempt 1 to die (`sleep 0.1` between looks): the whole script
        # arrived and runs; the watcher dies now, before the cleanup reports and the launch.
        wait_for(lambda: running(b"sleep\x000.1\x00"), 120, "the launch's cleanup to run on the worker")
    finally:
        watcher.kill()
        watcher.wait()
    # The cleanup waits stop_grace for attempt 1, then reports and launches: after the kill.
    wait_for(lambda: not launching(), 120, "the launch to end on the worker")
    probe = w.probe(cluster.node)[0]
    assert (probe.attempt, probe.state) == (2, "running"), probe
    w.close()


# ---- probes carried on the follow channels ----------------------------------------------------


def _counting_ssh(tmp: Path) -> tuple[Path, Path]:
    """The real ssh behind a script that counts its runs: (the script, the count file)."""
    count = tmp / "ssh-runs"
    count.write_text("")
    script = tmp / "ssh-counted"
    script.write_text(f"#!/bin/sh\necho x >> {shlex.quote(str(count))}\nexec {SSH} \"$@\"\n")
    script.chmod(0o755)
    return script, count


def _runs(count: Path) -> int:
    return len(count.read_text().splitlines())


def _channel(cluster: Cluster, w: int) -> dict[str, int]:
    """Worker w's follow channel on the worker (remote.sh `wait`): its shell, and the helpers
    its subshell runs, the cat of its stdin and the flock waiting on the job lock."""
    found: dict[str, int] = {}
    shells: dict[int, int] = {}  # pid -> parent
    for pid in cluster.hosts.pids(cluster.key, w):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if cmd == SCRIPT_SHELL:
                shells[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            elif cmd == b"cat\x00":
                found["cat"] = pid
            elif cmd.startswith(b"flock\x00-s\x00-o\x00"):
                found["flock"] = pid
    for pid, parent in shells.items():
        found["subshell" if parent in shells else "shell"] = pid
    return found


def _channels_up(cluster: Cluster, w: SshWorkers, workers: list[int]) -> None:
    """Wait until each worker's channel answers requests: its shell, cat and flock run."""
    wait_for(lambda: all(len(_channel(cluster, i)) == 4 for i in workers), 30, "the follow channels")
    wait_for(lambda: all((c := w.ends._open.get(i)) is not None and c.stream._writable and c.reader.ready
                         for i in workers),
             30, "the channels' stdin")


def _io(pid: int, what: str) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith(what + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {what} in /proc/{pid}/io")


@pytest.mark.parametrize("multiplex", [True, False])
def test_a_probe_rides_the_open_follow_channels_and_equals_an_ssh_probe(
        cluster: Cluster, tmp_path: Path, multiplex: bool) -> None:
    ssh, runs = _counting_ssh(tmp_path)
    w = cluster.make("sleep 300", binary=str(ssh), multiplex=multiplex)
    # a local checkpoint_dir is listed by the first worker's probe, on its channel too
    ck = cluster.hosts.host_root(cluster.key, 0) / "ck"
    (ck / "checkpoints" / "100").mkdir(parents=True)
    (ck / "checkpoints" / "100" / "metadata.json").write_text('{"step": 100}')
    listings: list[str] = []
    w.checkpoint_dir = "/ck"
    w.on_listing = lambda node, listing: listings.append(listing)
    try:
        assert all(r.started for r in w.launch(cluster.node, 1, None))
        w.follow_ends(cluster.node, 1, [0, 1], lambda: None)
        _channels_up(cluster, w, [0, 1])
        before = ([cluster.hosts.accepted(cluster.key, i) for i in (0, 1)],
                  [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)], _runs(runs))
        on_channel = w.probe(cluster.node)
        # no handshake, no channel, no ssh process: both answered on the channels they had
        assert ([cluster.hosts.accepted(cluster.key, i) for i in (0, 1)],
                [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)], _runs(runs)) == before
        assert w.ends.answered == 2 and w.ends.rejected == 0
        w.unfollow()
        over_ssh = w.probe(cluster.node)
        assert _runs(runs) == before[2] + 2
        # the same answers (the log's age in seconds may have moved on between the two)
        assert [replace(p, log_age=None) for p in on_channel] == [replace(p, log_age=None) for p in over_ssh]
        assert all(a.log_age is not None and b.log_age is not None and a.log_age <= b.log_age
                   for a, b in zip(on_channel, over_ssh, strict=True))
        assert [(p.state, p.attempt) for p in on_channel] == [("running", 1), ("running", 1)]
        assert len(listings) == 2 and listings[0] == listings[1] and '"checkpoints/100"' in listings[0]
    finally:
        w.close()


def test_a_channel_that_dies_or_stops_answering_leaves_its_worker_to_ssh(cluster: Cluster) -> None:
    w = cluster.workers
    w.ends.answer_wait = 2.0
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    w.follow_ends(cluster.node, 1, [0, 1], lambda: None)
    _channels_up(cluster, w, [0, 1])
    sessions = [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)]
    assert [p.state for p in w.probe(cluster.node)] == ["running", "running"]
    assert [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)] == sessions  # on the channels
    dead, stuck = _channel(cluster, 0)["shell"], _channel(cluster, 1)["shell"]
    os.kill(dead, signal.SIGKILL)
    os.kill(stuck, signal.SIGSTOP)
    try:
        probes = w.probe(cluster.node)
        assert [(p.state, p.attempt) for p in probes] == [("running", 1), ("running", 1)], probes
        assert w.ends.answered == 2  # the first probe's two; these came over ssh
        assert cluster.hosts.sessions(cluster.key, 1) == sessions[1] + 1
    finally:
        os.kill(stuck, signal.SIGCONT)
    # the silent channel was closed, not kept to be asked again (each ask would wait out
    # answer_wait before the ssh probe could start): its shell ends once it runs again
    wait_for(lambda: _gone(stuck), 30, "the silent channel's shell to end")


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_an_end_during_a_probe_request_is_answered_and_still_reported_as_an_end(cluster: Cluster) -> None:
    w = cluster.workers
    w.ends.poll = 3600  # only the request and the lock can wake the channel's shell
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    ended = threading.Event()
    w.follow_ends(cluster.node, 1, [0], ended.set)
    _channels_up(cluster, w, [0])
    chan = _channel(cluster, 0)
    sessions = cluster.hosts.sessions(cluster.key, 0)
    os.kill(chan["shell"], signal.SIGSTOP)  # the request waits in its pipe
    out: list[list[WorkerProbe]] = []
    try:
        relayed = _io(chan["cat"], "wchar")
        asking = threading.Thread(target=lambda: out.append(w.probe(cluster.node)))
        asking.start()
        wait_for(lambda: _io(chan["cat"], "wchar") > relayed, 30, "the request to reach the shell's pipe")
        # the attempt ends on worker 0 after the request arrived: its end is queued behind it
        for pid in cluster.job_pids(0, needle=b"sleep\x00300"):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _channel(cluster, 0).get("flock"), 30, "the lock to be free")
    finally:
        os.kill(chan["shell"], signal.SIGCONT)
    asking.join(60)
    probes = out[0]
    assert (probes[0].state, probes[0].exit_code) == ("exited", 137), probes[0]  # the truth, on the channel
    # both on the channels the launch left open (worker 1's too)
    assert w.ends.answered == 2 and cluster.hosts.sessions(cluster.key, 0) == sessions
    assert ended.wait(30), "the end was not reported after the answer"
    assert 0 not in w.ends.held()  # worker 0's end was taken: it is not followed again for attempt 1


def test_a_garbled_or_foreign_answer_on_a_channel_is_not_trusted(cluster: Cluster) -> None:
    w = cluster.workers
    w.ends.answer_wait = 60.0  # the garbled answer ends the wait, not the clock
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    w.follow_ends(cluster.node, 1, [0], lambda: None)
    _channels_up(cluster, w, [0])
    shell = _channel(cluster, 0)["shell"]
    os.kill(shell, signal.SIGSTOP)  # only forged answers come back
    out: list[list[WorkerProbe]] = []
    try:
        asking = threading.Thread(target=lambda: out.append(w.probe(cluster.node)))
        asking.start()
        wait_for(lambda: bool(w.ends._requests), 30, "the request")
        seq = w.ends._seq
        # written to the channel's stdout on the worker, as if the shell had said it: another
        # request's answer (a lie), then this request's number around a garbled probe
        with open(f"/proc/{shell}/fd/1", "w") as stdout:
            stdout.write(f"@tpuwatch probe_begin={seq + 7}\n@tpuwatch result=ok\n@tpuwatch state=exited\n"
                         f"@tpuwatch exit_code=3\n@tpuwatch probe_end={seq + 7}\n"
                         f"@tpuwatch probe_begin={seq}\n@tpuwatch state=exited\n@tpuwatch probe_end={seq}\n")
        asking.join(60)
    finally:
        os.kill(shell, signal.SIGCONT)
    probes = out[0]
    # worker 0 over ssh; worker 1 on the channel its launch left open
    assert [(p.state, p.exit_code) for p in probes] == [("running", None), ("running", None)], probes
    assert (w.ends.answered, w.ends.rejected) == (1, 2)


def test_the_probe_right_after_a_launch_waits_for_the_channels_opening_instead_of_ssh(
        cluster: Cluster, tmp_path: Path) -> None:
    # The tick after a launch: the follow channels are the launch's sessions, going on. Its probe
    # waits for them to read requests and rides them; a probe over SSH would be another channel
    # and shell on every worker.
    ssh, runs = _counting_ssh(tmp_path)
    w = cluster.make("sleep 300", binary=str(ssh))
    w.ends.answer_wait = 60.0  # ready and answered well before; the clock does not decide
    try:
        assert all(r.started for r in w.launch(cluster.node, 1, None))
        launched = _runs(runs)
        w.follow_ends(cluster.node, 1, [0, 1], lambda: None)
        probes = w.probe(cluster.node)
        assert [(p.state, p.attempt) for p in probes] == [("running", 1), ("running", 1)], probes
        assert w.ends.answered == 2 and w.ends.opened == 2
        assert _runs(runs) == launched == 2  # the launches, which are the channels; no ssh for the probe
    finally:
        w.close()


def test_a_channel_opening_again_after_a_drop_is_not_waited_for(cluster: Cluster) -> None:
    w = cluster.workers
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    w.follow_ends(cluster.node, 1, [0, 1], lambda: None)
    _channels_up(cluster, w, [0, 1])
    cluster.hosts.ssh_fault(cluster.key, 0, "refuse")  # worker 0's channel drops; it cannot connect again
    try:
        wait_for(lambda: 0 in w.ends._reopened, 30, "worker 0's channel to drop")
        w.follow_ends(cluster.node, 1, [0, 1], lambda: None)  # the next tick's hold
        # a worker that stopped answering would hold every probe for answer_wait
        assert 0 not in w.ends._first
        probes = w.probe(cluster.node)  # worker 1 on its channel; worker 0 over ssh, refused
        assert [p.state for p in probes] == ["unreachable", "running"], probes
        assert w.ends.answered == 1
    finally:
        cluster.hosts.ssh_fault(cluster.key, 0, "serve")


def test_the_next_attempts_channels_are_waited_for_while_the_last_ones_close(cluster: Cluster) -> None:
    # A relaunch on the same node: the hold for attempt 2 closes attempt 1's channels, whose
    # threads end after it; that says nothing of attempt 2's channels, still opening.
    w = cluster.workers
    w.ends.poll = 3600  # only the lock and the requests wake a channel's shell
    w.ends.answer_wait = 60.0
    assert all(r.started for r in w.launch(cluster.node, 1, None))
    w.follow_ends(cluster.node, 1, [0, 1], lambda: None)
    _channels_up(cluster, w, [0, 1])
    shells = [_channel(cluster, i)["shell"] for i in (0, 1)]
    for pid in shells:
        os.kill(pid, signal.SIGSTOP)  # attempt 1's channels do not see its end: closed by the hold
    try:
        assert all(r.started for r in w.launch(cluster.node, 2, None, clean=True))
        sessions = [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)]
        w.follow_ends(cluster.node, 2, [0, 1], lambda: None)
        probes = w.probe(cluster.node)
        assert [(p.state, p.attempt) for p in probes] == [("running", 2), ("running", 2)], probes
        assert w.ends.answered == 2  # on attempt 2's channels (its launch's sessions), no probe over ssh
        assert [cluster.hosts.sessions(cluster.key, i) for i in (0, 1)] == sessions
    finally:
        for pid in shells:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
