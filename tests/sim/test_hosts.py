"""The simulated workers against the real OpenSSH client (`/usr/bin/ssh`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tpuwatch.errors import UsageError
from tpuwatch.sim.hosts import STARTUP_LOG, Hosts
from tpuwatch.workers import protocol

NODE = "proj/us-central2-b/pod"
SSH = "/usr/bin/ssh"

pytestmark = pytest.mark.skipif(not os.path.exists(SSH), reason="needs the OpenSSH client")


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    h = Hosts(tmp_path / "sim")
    h.start()
    try:
        yield h
    finally:
        h.close()


def ssh(hosts: Hosts, ip: str, command: str, *, known_hosts: Path, strict: bool = False,
        key: Path | None = None, user: str | None = None, stdin: str = "",
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    args = [
        SSH, "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={'yes' if strict else 'no'}",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "ConnectTimeout=10",
        "-i", str(key or hosts.client_key), "-p", str(hosts.ssh_port),
        "-l", user or hosts.ssh_user, ip, command,
    ]
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout)


# prints, waits for a file `go`, then writes again and leaves a file if that write worked
WAIT_THEN_WRITE = ("echo started; while [ ! -e go ]; do sleep 0.02; done; "
                   "echo more; echo more; touch not-reached")


def alive(pid: int) -> bool:
    """Running or stopped; a zombie waiting for its reaper counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)


def test_command_runs_on_every_worker_and_exit_status_passes_through(
        hosts: Hosts, tmp_path: Path) -> None:
    ips = hosts.boot(NODE, "1001", 4, None)
    assert len(set(ips)) == 4 and all(ip.startswith("127.") for ip in ips)
    kh = tmp_path / "known_hosts"
    for i, ip in enumerate(ips):
        r = ssh(hosts, ip, 'pwd; echo "$HOME|$TPUWATCH_HOST_ROOT"; '
                'python3 -c "import sys; print(sys.executable)"; ls "$TPUWATCH_HOST_ROOT/dev"; exit 7',
                known_hosts=kh)
        assert r.returncode == 7, r.stderr
        lines = r.stdout.splitlines()
        home, root = hosts.worker_home(NODE, i), hosts.host_root(NODE, i)
        assert lines[0] == str(home)
        assert lines[1] == f"{home}|{root}"
        assert Path(lines[2]).parent == Path(sys.executable).parent  # the venv's python3
        assert {"accel0", "accel1", "accel2", "accel3", "shm"} <= set(lines[3:])
    assert len({hosts.worker_home(NODE, i) for i in range(4)}) == 4


def test_stdio_and_signal_exit(hosts: Hosts, tmp_path: Path) -> None:
    ip = hosts.boot(NODE, "1", 1, None)[0]
    kh = tmp_path / "known_hosts"
    r = ssh(hosts, ip, "tr a-z A-Z; echo oops >&2", known_hosts=kh, stdin="hello\n")
    assert (r.returncode, r.stdout, r.stderr.splitlines()[-1]) == (0, "HELLO\n", "oops")
    # A command killed by a signal: the server sends exit-signal, which OpenSSH's client
    # does not turn into a status, so ssh exits 255 (the same as with a real sshd).
    r = ssh(hosts, ip, "kill -KILL $$", known_hosts=kh)
    assert r.returncode == 255
    r = ssh(hosts, ip, "kill -SEGV $$", known_hosts=kh)
    assert r.returncode == 255
    # a child killed under a shell that survives it gives the usual 128+sig
    r = ssh(hosts, ip, "bash -c 'kill -SEGV $$'; exit $?", known_hosts=kh)
    assert r.returncode == 128 + signal.SIGSEGV


def test_down_refuses_up_keeps_host_key_recreate_changes_it(hosts: Hosts, tmp_path: Path) -> None:
    marker_script = 'echo "booted $(hostname)"; touch "$HOME/startup-ran"'
    ips = hosts.boot(NODE, "1", 2, marker_script)
    kh = tmp_path / "known_hosts"
    assert ssh(hosts, ips[0], "touch old-file", known_hosts=kh).returncode == 0
    assert ssh(hosts, ips[1], "true", known_hosts=kh).returncode == 0
    first_keys = kh.read_text()

    hosts.down(NODE)
    t0 = time.monotonic()
    r = ssh(hosts, ips[0], "true", known_hosts=kh)
    assert r.returncode == 255 and "Connection refused" in r.stderr
    assert time.monotonic() - t0 < 5  # refused, not timed out

    hosts.up(NODE, reboot=False)
    r = ssh(hosts, ips[0], "cat old-file && echo same-home", known_hosts=kh, strict=True)
    assert r.returncode == 0 and "same-home" in r.stdout, r.stderr  # same host key, same home

    hosts.destroy(NODE)
    old_home = hosts.root / "nodes"
    assert not any(old_home.rglob("old-file"))  # homes deleted
    with pytest.raises(UsageError):
        hosts.worker_home(NODE, 0)
    new_ips = hosts.boot(NODE, "2", 2, marker_script)
    assert new_ips == ips  # a recreated node keeps its IPs here ...
    r = ssh(hosts, ips[0], "true", known_hosts=kh, strict=True)
    assert r.returncode == 255 and "Host key verification failed" in r.stderr  # ... not its key
    scan = subprocess.run(["ssh-keyscan", "-p", str(hosts.ssh_port), "-t", "ed25519", ips[0]],
                          capture_output=True, text=True, timeout=30)
    new_key = scan.stdout.split()[-1]
    assert new_key and new_key not in first_keys
    for w in range(2):
        home = hosts.worker_home(NODE, w)
        wait_for(lambda: hosts.startup_status(NODE, w) == 0)  # noqa: B023 (called at once)
        assert (home / "startup-ran").exists()
        assert "booted" in (home / STARTUP_LOG).read_text()
        assert not (home / "old-file").exists()  # fresh home


def test_up_after_maintenance_reboots(hosts: Hosts, tmp_path: Path) -> None:
    hosts.boot(NODE, "1", 1, 'echo run >> "$HOME/boots"')
    home, root = hosts.worker_home(NODE, 0), hosts.host_root(NODE, 0)
    wait_for(lambda: hosts.startup_status(NODE, 0) == 0)
    (root / "tmp" / "libtpu_lockfile").write_text("")
    boot_id = root / "proc" / "sys" / "kernel" / "random" / "boot_id"
    first = boot_id.read_text()
    hosts.down(NODE)
    hosts.up(NODE, reboot=False)  # processes killed, no reboot: the same boot
    assert boot_id.read_text() == first
    hosts.down(NODE)
    hosts.up(NODE)
    wait_for(lambda: hosts.startup_status(NODE, 0) == 0)
    assert (home / "boots").read_text() == "run\nrun\n"  # the startup script ran on each boot
    assert not (root / "tmp" / "libtpu_lockfile").exists()  # /tmp emptied by the reboot
    assert (root / "dev" / "accel0").exists()
    assert boot_id.read_text() != first  # as a kernel gives each boot an id of its own
    hosts.up(NODE)  # already up: no reboot
    assert hosts.startup_status(NODE, 0) == 0


def _detached_sleep(hosts: Hosts, ip: str, kh: Path) -> int:
    r = ssh(hosts, ip, "setsid nohup sleep 1000 >/dev/null 2>&1 & echo $!", known_hosts=kh)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.strip())
    # `$!` is known before the child has run setsid and exec'd sleep; wait for that
    wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001000\x00")
    return pid


def test_detached_processes_killed_by_kill_worker_and_down(hosts: Hosts, tmp_path: Path) -> None:
    ips = hosts.boot(NODE, "1", 2, None)
    kh = tmp_path / "known_hosts"
    p0, p1 = _detached_sleep(hosts, ips[0], kh), _detached_sleep(hosts, ips[1], kh)
    assert os.getsid(p1) == p1  # escaped the session's process group
    assert set(hosts.pids(NODE)) == {p0, p1}

    hosts.kill_worker(NODE, 1)
    wait_for(lambda: not alive(p1))
    assert alive(p0)  # other workers untouched
    assert ssh(hosts, ips[1], "echo still-here", known_hosts=kh).stdout == "still-here\n"

    hosts.down(NODE)
    assert not alive(p0)
    assert hosts.pids(NODE) == []


def test_each_worker_lists_only_its_own_processes(hosts: Hosts, tmp_path: Path) -> None:
    """As a real VM's /proc shows only its own processes, the worker-side scripts' list of this
    host's processes (procs.sh tw_procs) holds a worker's detached job, not another worker's."""
    ips = hosts.boot(NODE, "1", 2, None)
    kh = tmp_path / "known_hosts"
    env = ssh(hosts, ips[0], "echo ${TPUWATCH_SIM_PROCS:-}", known_hosts=kh)
    if not env.stdout.strip():
        pytest.skip("this machine gives the simulator no cgroup of its own: every host sees every process")
    p0, p1 = _detached_sleep(hosts, ips[0], kh), _detached_sleep(hosts, ips[1], kh)
    procs = (Path(protocol.__file__).parent / "procs.sh").read_text()
    listed = ssh(hosts, ips[0], "bash -s", known_hosts=kh, stdin=procs + '\ntw_procs; echo "${TW_PROCS[@]}"\n')
    assert listed.returncode == 0, listed.stderr
    mine = {int(p.removeprefix("/proc/")) for p in listed.stdout.split()}
    assert p0 in mine and p1 not in mine, listed.stdout


def test_the_workers_cgroups_list_the_processes_they_started(hosts: Hosts, tmp_path: Path) -> None:
    ips = hosts.boot(NODE, "1", 2, None)
    kh = tmp_path / "known_hosts"
    if hosts.cgroup_pids() is None:
        pytest.skip("this machine gives the simulator no cgroup of its own")
    p0, p1 = _detached_sleep(hosts, ips[0], kh), _detached_sleep(hosts, ips[1], kh)
    assert set(hosts.cgroup_pids() or []) == set(hosts.pids()) == {p0, p1}
    hosts.down(NODE)
    assert hosts.cgroup_pids() == []


def test_hang_stops_job_processes_but_ssh_answers(hosts: Hosts, tmp_path: Path) -> None:
    ips = hosts.boot(NODE, "1", 2, None)
    kh = tmp_path / "known_hosts"
    pids = [_detached_sleep(hosts, ip, kh) for ip in ips]
    hosts.hang(NODE, 1)
    wait_for(lambda: proc_state(pids[1]) == "T")  # SIGSTOP lands asynchronously
    assert proc_state(pids[0]) == "S"
    hosts.hang(NODE)
    wait_for(lambda: proc_state(pids[0]) == "T")
    assert ssh(hosts, ips[1], "echo alive", known_hosts=kh).stdout == "alive\n"
    hosts.down(NODE)  # stopped processes die too
    assert not any(alive(p) for p in pids)


def test_client_disconnect_closes_the_command_pipes(hosts: Hosts, tmp_path: Path) -> None:
    # As with a real sshd and no PTY: nothing is signalled, the command's stdout is closed,
    # so its next write kills it with SIGPIPE.
    ip = hosts.boot(NODE, "1", 1, None)[0]
    kh = tmp_path / "known_hosts"
    home = hosts.worker_home(NODE, 0)
    with subprocess.Popen(
            [SSH, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", f"UserKnownHostsFile={kh}", "-i", str(hosts.client_key),
             "-p", str(hosts.ssh_port), ip, WAIT_THEN_WRITE],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as client:
        assert client.stdout is not None
        assert client.stdout.readline() == "started\n"
        client.kill()
    wait_for(lambda: hosts.connections(NODE, 0) == 0)
    assert len(hosts.pids(NODE, 0)) >= 1  # still running: no hangup was sent
    (home / "go").touch()
    wait_for(lambda: hosts.pids(NODE, 0) == [])
    assert not (home / "not-reached").exists()


def test_reset_connection_after_command_ran(hosts: Hosts, tmp_path: Path) -> None:
    ip = hosts.boot(NODE, "1", 1, None)[0]
    kh = tmp_path / "known_hosts"
    home = hosts.worker_home(NODE, 0)
    hosts.reset_connections(NODE, 0)
    r = ssh(hosts, ip, "echo x >> launches", known_hosts=kh)
    assert r.returncode == 255  # the client cannot tell it ran ...
    assert (home / "launches").read_text() == "x\n"  # ... but it did
    r = ssh(hosts, ip, "echo x >> launches", known_hosts=kh)  # one-shot fault
    assert r.returncode == 0 and (home / "launches").read_text() == "x\nx\n"


def test_reset_connection_mid_command(hosts: Hosts, tmp_path: Path) -> None:
    ip = hosts.boot(NODE, "1", 1, None)[0]
    kh = tmp_path / "known_hosts"
    home = hosts.worker_home(NODE, 0)
    hosts.reset_connections(NODE, 0, after_bytes=1)
    cmd = "setsid nohup bash -c 'touch launched' >/dev/null 2>&1 & " + WAIT_THEN_WRITE
    r = ssh(hosts, ip, cmd, known_hosts=kh)
    assert r.returncode == 255  # dropped after "started", while the command still ran
    wait_for(lambda: (home / "launched").exists())  # the detached part lived on
    wait_for(lambda: hosts.connections(NODE, 0) == 0)
    (home / "go").touch()
    wait_for(lambda: hosts.pids(NODE, 0) == [])  # the attached part died writing to a closed pipe
    assert not (home / "not-reached").exists()


def test_only_the_client_key_and_user_are_accepted(hosts: Hosts, tmp_path: Path) -> None:
    ip = hosts.boot(NODE, "1", 1, None)[0]
    kh = tmp_path / "known_hosts"
    other = tmp_path / "other_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(other))
    other.chmod(0o600)
    r = ssh(hosts, ip, "true", known_hosts=kh, key=other)
    assert r.returncode == 255 and "Permission denied" in r.stderr
    r = ssh(hosts, ip, "true", known_hosts=kh, user="someone-else")
    assert r.returncode == 255 and "Permission denied" in r.stderr
    assert ssh(hosts, ip, "true", known_hosts=kh).returncode == 0


def test_trainer_runs_on_every_worker(hosts: Hosts, tmp_path: Path) -> None:
    ips = hosts.boot(NODE, "1", 4, None)
    kh = tmp_path / "known_hosts"
    bucket = tmp_path / "bucket"
    procs = [
        subprocess.Popen(
            [SSH, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", f"UserKnownHostsFile={kh}", "-i", str(hosts.client_key),
             "-p", str(hosts.ssh_port), ip,
             f"TPUWATCH_WORKER_ID={i} python3 -m tpuwatch.sim.trainer --steps 6 "
             f"--step-time 0.001 --ckpt-every 3 --ckpt-dir {bucket}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, ip in enumerate(ips)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    for i, (out, _) in enumerate(outs):
        assert f"worker {i}: done at step 6" in out
    assert sorted(p.name for p in bucket.iterdir()) == ["0", "3", "6"]


def test_close_leaves_no_process(tmp_path: Path) -> None:
    h = Hosts(tmp_path / "sim")
    h.start()
    ips = h.boot(NODE, "1", 2, "setsid nohup sleep 1000 >/dev/null 2>&1 &\nsleep 1000")
    h.boot("proj/zone/other", "2", 1, None)
    kh = tmp_path / "known_hosts"
    pids = [_detached_sleep(h, ip, kh) for ip in ips]
    h.hang(NODE, 0)
    wait_for(lambda: len(h.pids(NODE)) >= 2 + 4)  # two startup scripts with a sleep each
    pids += h.pids()
    h.close()
    assert not [p for p in pids if alive(p)]
    assert h.pids() == []
    r = subprocess.run([SSH, "-o", "BatchMode=yes", "-p", str(h.ssh_port), ips[0], "true"],
                       capture_output=True, text=True, timeout=30)
    assert "Connection refused" in r.stderr


def test_bad_input(hosts: Hosts) -> None:
    with pytest.raises(UsageError, match="1 to 256 workers"):
        hosts.boot(NODE, "1", 0, None)
    with pytest.raises(UsageError, match="1 to 256 workers, not 257"):
        hosts.boot(NODE, "1", 257, None)
    with pytest.raises(UsageError, match="boot it first"):
        hosts.down("proj/zone/missing")
    hosts.boot(NODE, "1", 2, None)
    with pytest.raises(UsageError, match="workers 0..1, not 5"):
        hosts.kill_worker(NODE, 5)
    with pytest.raises(UsageError, match="not started"):
        Hosts(hosts.root / "other").boot(NODE, "1", 1, None)


def test_input_that_arrives_while_the_command_starts_keeps_its_order(
        hosts: Hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded box: the command exists but its pipes are not set up yet when more input and the
    # client's EOF arrive. They must queue behind what came first, not overtake it (or, for the
    # EOF, close the command's stdin with the first part still unsent): tpuwatch's scripts are
    # read with `read -N`, and a lost script is an exit 1 with no output.
    ip = hosts.boot(NODE, "1", 1, None)[0]
    loop = hosts._loop
    assert loop is not None
    connect = loop.connect_read_pipe
    in_setup, release = threading.Event(), threading.Event()

    async def slow_setup(*args: Any, **kwargs: Any) -> Any:
        if not in_setup.is_set():
            in_setup.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
        return await connect(*args, **kwargs)

    monkeypatch.setattr(loop, "connect_read_pipe", slow_setup)
    with subprocess.Popen(
            [SSH, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", f"UserKnownHostsFile={tmp_path / 'kh'}", "-i", str(hosts.client_key),
             "-p", str(hosts.ssh_port), ip, "cat"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as client:
        assert client.stdin is not None
        client.stdin.write(b"first\n")
        client.stdin.flush()
        assert in_setup.wait(30), "the command never started"
        client.stdin.write(b"second\n")
        client.stdin.close()
        # What is checked does not depend on this pause: the fixed server gives the same answer
        # after any pause; the pause only gives the late input time to arrive mid-setup.
        time.sleep(0.3)
        release.set()
        assert client.stdout is not None and client.stderr is not None
        out, err = client.stdout.read(), client.stderr.read()
        client.wait(timeout=30)
    assert (client.returncode, out) == (0, b"first\nsecond\n"), err
