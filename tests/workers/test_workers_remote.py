"""remote.sh run by a local bash exactly as a worker runs it (protocol.REMOTE_COMMAND, the framed script on stdin).

HOME and TPUWATCH_HOST_ROOT point into tmp_path, so the job files, the fake /dev/accel* and
/tmp/libtpu_lockfile are private to each test. The SSH path is tested in test_workers_ssh.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tpuwatch.model import Checkpoint
from tpuwatch.sim import metadata as md
from tpuwatch.workers import protocol

JOB = "job"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def environ(pid: int) -> bytes:
    try:
        return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Worker:
    home: Path
    root: Path
    mark: str
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.home / ".tpuwatch" / JOB

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": str(self.home),
                "TPUWATCH_HOST_ROOT": str(self.root), "TWTEST_MARK": self.mark, **self.extra}

    def run(self, data: bytes, prefix: str = "") -> dict[str, str]:
        argv = ["/bin/bash", "-c", prefix + protocol.REMOTE_COMMAND]
        r = subprocess.run(argv, input=protocol.framed(data), capture_output=True, env=self.env, timeout=30)
        assert r.returncode == 0, r.stderr
        return protocol.parse_records(r.stdout.decode())

    def launch(self, attempt: int, command: str, checkpoint: Checkpoint | None = None,
               env: dict[str, str] | None = None, clean_grace: float | None = None,
               notify_signal: str = "SIGTERM") -> dict[str, str]:
        return self.run(protocol.launch_script(JOB, attempt=attempt, worker=3, checkpoint=checkpoint,
                                               command=command, env=env, clean_grace=clean_grace,
                                               notify_signal=notify_signal))

    def probe(self) -> dict[str, str]:
        return self.run(protocol.probe_script(JOB))

    def stop(self, grace: float = 0.5, prefix: str = "") -> dict[str, str]:
        return self.run(protocol.stop_script(JOB, grace), prefix)

    def pids(self, needle: bytes = b"") -> list[int]:
        """Live processes this test started (they carry its mark), optionally by cmdline."""
        out = []
        for e in os.listdir("/proc"):
            if not e.isdigit():
                continue
            pid = int(e)
            if f"\0TWTEST_MARK={self.mark}\0".encode() not in environ(pid) + b"\0" or not alive(pid):
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmd:
                out.append(pid)
        return out

    def kill(self, needle: bytes = b"") -> None:
        """SIGKILL those processes (as a host going down does); one that ended since it was listed
        (a wrapper exec'ing, a child reaped) is gone already."""
        for pid in self.pids(needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "home", tmp_path / "host", secrets.token_hex(6))
    w.home.mkdir()
    (w.root / "dev").mkdir(parents=True)
    (w.root / "tmp").mkdir()
    (w.root / "dev" / "accel0").touch()
    (w.root / "dev" / "accel1").touch()
    yield w
    w.kill()  # only processes this test started


def test_launch_is_detached_idempotent_and_exclusive(worker: Worker) -> None:
    first = worker.launch(1, "sleep 300")
    assert first["result"] == "launched" and first["attempt"] == "1"
    assert worker.probe()["state"] == "running"
    # the same attempt again (a retry after a dropped connection): not started twice
    again = worker.launch(1, "sleep 300")
    assert again["result"] == "running" and again["pid"] == first["pid"]
    # another attempt while this one lives: refused
    busy = worker.launch(2, "sleep 300")
    assert busy["result"] == "busy" and busy["attempt"] == "1"
    assert len(worker.pids(b"sleep\x00300")) == 1
    pgid = int(first["pid"])
    assert os.getpgid(pgid) == pgid and os.getsid(pgid) == pgid  # its own session and group
    for f in ("lock", "attempt", "pid", "attempt-1.log"):
        assert (worker.dir / f).stat().st_mode & 0o777 == 0o600, f
    assert worker.dir.stat().st_mode & 0o777 == 0o700


def test_exit_code_and_already_ran(worker: Worker) -> None:
    r = worker.launch(1, "echo out; echo err >&2; exit 7")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    p = worker.probe()
    assert (p["state"], p["attempt"], p["exit_code"]) == ("exited", "1", "7")
    assert (worker.dir / "attempt-1.log").read_text() == "out\nerr\n"
    assert protocol.parse_probe(3, p).log_bytes == 8  # the log's size: its activity, for hang detection
    ran = worker.launch(1, "touch should-not-run")
    assert (ran["result"], ran["exit_code"]) == ("ran", "7")
    assert worker.launch(0, "true")["result"] == "newer"
    assert not (worker.home / "should-not-run").exists()
    nxt = worker.launch(2, "exit 0")
    assert nxt["result"] == "launched" and r["pid"] != nxt["pid"]
    wait_for(lambda: worker.probe()["state"] == "exited", what="attempt 2 to end")
    assert worker.probe()["exit_code"] == "0"


def test_an_ended_command_whose_child_lives_on_is_reported_lingering(worker: Worker) -> None:
    """The policy relaunches without a stop only when no worker has anything of the attempt
    left: a child that outlives the command (it holds the job's lock) must say so."""
    worker.launch(1, "sleep 300 & exit 3")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    p = protocol.parse_probe(3, worker.probe())
    assert (p.state, p.exit_code, p.lingering) == ("exited", 3, True)
    worker.kill(b"sleep\x00300")
    wait_for(lambda: not worker.pids(b"sleep\x00300"), what="the child to die")
    p = protocol.parse_probe(3, worker.probe())
    assert (p.state, p.lingering) == ("exited", False)


def test_probe_states_absent(worker: Worker) -> None:
    assert worker.probe()["state"] == "absent"
    worker.launch(1, "sleep 300")
    (sleep,) = worker.pids(b"sleep\x00300")
    wrapper = int(worker.probe()["pid"])
    os.kill(wrapper, signal.SIGKILL)  # killed without a word: no exit code is written
    os.kill(sleep, signal.SIGKILL)
    wait_for(lambda: not alive(sleep) and not alive(wrapper), what="the kill")
    p = worker.probe()
    assert p["state"] == "absent" and "no exit code" in p["detail"]


def test_the_command_gets_its_environment_and_placeholders(worker: Worker) -> None:
    ck = Checkpoint(path="/bucket/it's $(touch pwned)/20", step=20, layout="orbax")
    cmd = protocol.render_command(
        "printf '%s|' {checkpoint} {step} {attempt} {worker} \"$TPUWATCH_JOB\" \"$TPUWATCH_ATTEMPT\" "
        "\"$TPUWATCH_WORKER_ID\" \"$TPUWATCH_CHECKPOINT\" \"$TPUWATCH_STEP\" \"$EXTRA\"; read -t 1 x; echo \"stdin:$?\"",
        checkpoint=ck.path, step=ck.step, attempt=5, worker=3)
    worker.launch(5, cmd, checkpoint=ck, env={"EXTRA": "a 'b' $(c)"})
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    log = (worker.dir / "attempt-5.log").read_text()
    assert log == f"{ck.path}|20|5|3|{JOB}|5|3|{ck.path}|20|a 'b' $(c)|stdin:1\n"  # stdin: /dev/null
    assert not list(worker.home.rglob("pwned")) and not Path("pwned").exists()


def test_a_relaunch_on_a_host_with_nothing_else_on_it_starts_no_scan_and_no_env(worker: Worker, tmp_path: Path) -> None:
    """A relaunch after a reboot, as the simulator's hosts see their processes (the worker's
    cgroup lists the session's shell alone): no `find` for device holders (none of our own shells
    holds a device) and, with no [job] env, no `env` process; the job still gets its variables."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for tool in ("find", "env"):
        real = shutil.which(tool)
        (bin_dir / tool).write_text(f'#!/bin/bash\necho {tool} >>"{calls}"\nexec {real} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    procs = tmp_path / "cgroup.procs"  # a file: the session's shell writes its pid there, as into a cgroup
    worker.extra.update(PATH=f"{bin_dir}:{os.environ['PATH']}", TPUWATCH_SIM_PROCS=str(procs))
    enter = '[ -z "${TPUWATCH_SIM_PROCS:-}" ] || { echo $$ >"$TPUWATCH_SIM_PROCS"; } 2>/dev/null\n'
    r = worker.run(protocol.launch_script(JOB, attempt=2, worker=3, checkpoint=None, clean_grace=1.0,
                                          command='echo "$TPUWATCH_JOB $TPUWATCH_ATTEMPT $TPUWATCH_WORKER_ID"; '
                                                  'declare -F | grep -c " tw_"'), enter)
    assert (r["result"], r["cleanup_device_holders"]) == ("launched", ""), r
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    # the job's variables, and none of the functions the wrapper and the relay get exported
    assert (worker.dir / "attempt-2.log").read_text() == f"{JOB} 2 3\n0\n"
    assert not calls.exists(), calls.read_text()
    # with [job] env, `env` sets it (a name may be one bash cannot export)
    r = worker.run(protocol.launch_script(JOB, attempt=3, worker=3, checkpoint=None, clean_grace=1.0,
                                          command='echo "$EXTRA"', env={"EXTRA": "x"}), enter)
    assert r["result"] == "launched", r
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    assert (worker.dir / "attempt-3.log").read_text() == "x\n" and calls.read_text() == "env\n"


def test_stop_clears_the_job_its_escapees_device_holders_and_a_stale_lockfile(worker: Worker) -> None:
    accel = worker.root / "dev" / "accel0"
    cmd = ("sleep 301 & setsid sleep 302 & (trap '' TERM; exec sleep 303) & "
           f"exec 3<{accel}; exec sleep 304")
    worker.launch(1, cmd)
    wait_for(lambda: len(worker.pids(b"sleep\x0030")) == 4, what="the job's processes")
    # an orphan from some earlier run holding the TPU, outside any job
    with open(accel) as dev:
        orphan = subprocess.Popen(["sleep", "305"], stdin=dev, start_new_session=True, env=worker.env)
    (worker.root / "tmp" / "libtpu_lockfile").touch()
    t0 = time.monotonic()
    res = worker.stop(grace=0.5)
    assert res["result"] == "ok", res
    assert time.monotonic() - t0 < 10
    assert worker.pids(b"sleep\x0030") == []
    assert str(orphan.pid) in res["device_holders"].split()
    assert res["libtpu_lockfile"] == "removed"
    assert not (worker.root / "tmp" / "libtpu_lockfile").exists()
    orphan.wait(5)
    p = worker.probe()
    assert p["state"] == "exited" and p["exit_code"] == "143"  # TERM reached the command
    assert worker.launch(2, "true")["result"] == "launched"  # the lock is free again


def test_stop_finds_a_session_member_that_closed_the_lock_whatever_its_name(worker: Worker) -> None:
    # Found by its session alone (it closed the lock's fd), under a name that mimics the fields
    # of /proc/<pid>/stat after it: they are read after the last ") ".
    odd = worker.home / "x) S 1 2 3"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    worker.launch(1, f"{shlex.quote(str(odd))} 331 9>&- & exec sleep 332")
    wait_for(lambda: worker.pids(b"\x00331") and worker.pids(b"sleep\x00332"), what="the job's processes")
    res = worker.stop(grace=0.5)
    assert res["result"] == "ok", res
    assert worker.pids(b"\x00331") == [] and worker.pids(b"sleep\x00332") == []


def test_a_stop_not_waited_for_answers_after_the_term_and_kills_what_ignores_it_after_the_grace(
        worker: Worker) -> None:
    """A job stuck in a collective may ignore SIGTERM: a stop nothing waits on answers at once,
    says which processes still run, and a detached process on the worker KILLs them after the
    grace (a waited stop says which needed the KILL)."""
    worker.launch(1, "(trap '' TERM; exec sleep 321) & exec sleep 322")
    wait_for(lambda: len(worker.pids(b"sleep\x0032")) == 2, what="the job's processes")
    stubborn = worker.pids(b"sleep\x00321")
    res = worker.run(protocol.stop_script(JOB, 2.0, detach=True))
    stop = protocol.parse_stop(3, res)
    assert stop.ok and stop.grace == 2.0, res
    assert list(stop.stopping) == stubborn, res  # sleep 322 took the TERM; 321 did not
    assert "still running after SIGTERM: killed after 2s" in stop.describe()
    wait_for(lambda: worker.pids(b"sleep\x00321") == [], timeout=30, what="the KILL after the grace")
    assert worker.pids(b"tpuwatch-killer") == []  # the killer is gone too
    # waited for: the same job is killed within the call, and the answer says so
    worker.launch(2, "(trap '' TERM; exec sleep 323) & exec sleep 324")
    wait_for(lambda: len(worker.pids(b"sleep\x0032")) == 2, what="attempt 2's processes")
    waited = protocol.parse_stop(3, worker.stop(grace=0.3))
    assert waited.ok and waited.killed and not any(alive(p) for p in waited.killed), waited
    assert worker.pids(b"sleep\x0032") == [] and "ignored SIGTERM for 0.3s: killed" in waited.describe()


def test_the_detached_killer_never_kills_a_process_that_reused_the_pid(worker: Worker) -> None:
    """It knows each process by pid and start time: a pid now held by another process is left."""
    stranger = subprocess.Popen(["sleep", "325"], start_new_session=True, stdin=subprocess.DEVNULL, env=worker.env)
    wait_for(lambda: bool(worker.pids(b"sleep\x00325")), what="the stranger")
    body = protocol.remote_script() + f"\ntw_killer 0 '{stranger.pid}:1'\n"  # start time 1: another process
    subprocess.run(["/bin/bash", "-s"], input=body.encode(), env={**worker.env, "TW_JOB": JOB, "TW_ACTION": "none"},
                   capture_output=True, timeout=30)
    assert stranger.poll() is None
    stranger.kill()
    stranger.wait(5)


def test_a_follow_channel_ends_its_helpers_by_pid_and_start_time(worker: Worker) -> None:
    """At its end a follow channel TERMs its helpers only while their pids are still theirs: a
    helper that ended first (the reader ends with stdin) may have given its pid to anything."""
    stranger = subprocess.Popen(["sleep", "326"], start_new_session=True, stdin=subprocess.DEVNULL, env=worker.env)
    wait_for(lambda: bool(worker.pids(b"sleep\x00326")), what="the stranger")
    start = Path(f"/proc/{stranger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    env = {**worker.env, "TW_JOB": JOB, "TW_ACTION": "none"}
    body = protocol.remote_script() + f"\ntw_kill_same '{stranger.pid}:1'\n"  # start time 1: another process
    subprocess.run(["/bin/bash", "-s"], input=body.encode(), env=env, capture_output=True, timeout=30)
    assert stranger.poll() is None
    body = protocol.remote_script() + f"\ntw_kill_same '{stranger.pid}:{start}'\n"  # the helper itself
    subprocess.run(["/bin/bash", "-s"], input=body.encode(), env=env, capture_output=True, timeout=30)
    assert stranger.wait(5) == -signal.SIGTERM


def test_a_cleaning_launch_stops_the_older_attempt_and_its_leftovers_in_one_connection(worker: Worker) -> None:
    accel = worker.root / "dev" / "accel1"
    worker.launch(1, "(trap '' TERM; exec sleep 311) & exec sleep 312")
    def old() -> list[int]:
        return worker.pids(b"sleep\x00311") + worker.pids(b"sleep\x00312")

    wait_for(lambda: len(old()) == 2, what="attempt 1's processes")
    with open(accel) as dev:  # an orphan of some earlier run holding the TPU
        orphan = subprocess.Popen(["sleep", "313"], stdin=dev, start_new_session=True, env=worker.env)
    (worker.root / "tmp" / "libtpu_lockfile").touch()
    # Without cleaning, attempt 2 is refused while attempt 1 holds the lock.
    assert worker.launch(2, "sleep 314")["result"] == "busy"
    res = worker.launch(2, "sleep 314", clean_grace=0.3)
    assert res["result"] == "launched" and res["attempt"] == "2", res
    cleanup = protocol.parse_launch(3, res).cleanup
    assert cleanup is not None and cleanup.ok and len(cleanup.stopped) >= 2, res
    assert orphan.pid in cleanup.device_holders and cleanup.libtpu_lockfile == "removed"
    orphan.wait(5)
    assert old() == []
    # the launch reports once the job is started detached; its exec of the command may come a
    # moment later on a loaded machine
    wait_for(lambda: len(worker.pids(b"sleep\x00314")) == 1, what="attempt 2's process")
    # A repeat of the same attempt (a retry after a dropped connection) cleans nothing: the
    # attempt it would find is its own.
    again = worker.launch(2, "sleep 314", clean_grace=0.3)
    assert again["result"] == "running" and "cleanup_result" not in again
    assert protocol.parse_launch(3, again).cleanup is None
    assert len(worker.pids(b"sleep\x00314")) == 1
    # An older attempt number never cleans up a newer one.
    older = worker.launch(1, "true", clean_grace=0.3)
    assert older["result"] == "busy" and "cleanup_result" not in older  # refused, nothing stopped
    assert len(worker.pids(b"sleep\x00314")) == 1


def test_a_launch_whose_channel_closed_under_it_still_launches_and_the_job_gets_sigpipe(worker: Worker) -> None:
    # A watcher killed mid-cleanup: its channel closes, so nobody reads the launch's reports.
    # The script arrived, so attempt 2 must still start (not die of SIGPIPE at the cleanup's
    # report, leaving the worker with no attempt at all), and the job gets SIGPIPE as usual.
    worker.launch(1, "sleep 321")
    wait_for(lambda: len(worker.pids(b"sleep\x00321")) == 1, what="attempt 1")
    data = protocol.framed(protocol.launch_script(JOB, attempt=2, worker=3, checkpoint=None,
                                                  command="sleep 322", clean_grace=0.3))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the channel is gone before the first report
    try:
        subprocess.run(["/bin/bash", "-c", protocol.REMOTE_COMMAND], input=data, stdout=write_end,
                       stderr=subprocess.DEVNULL, env=worker.env, timeout=30)
    finally:
        os.close(write_end)
    wait_for(lambda: len(worker.pids(b"sleep\x00322")) == 1, what="attempt 2 launched")
    assert worker.pids(b"sleep\x00321") == [] and (worker.dir / "attempt").read_text().strip() == "2"
    job_pid = worker.pids(b"sleep\x00322")[0]
    status = Path(f"/proc/{job_pid}/status").read_text()
    ignored = int(status.split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), status


def test_stop_keeps_a_lockfile_in_use_and_never_kills_its_own_shell(worker: Worker) -> None:
    lockfile = worker.root / "tmp" / "libtpu_lockfile"
    holder = subprocess.Popen(["flock", str(lockfile), "sleep", "306"], start_new_session=True,
                              env=worker.env, stdin=subprocess.DEVNULL)
    wait_for(lambda: bool(worker.pids(b"sleep\x00306")), what="the lock holder")
    accel = worker.root / "dev" / "accel1"
    # the shell that runs the script itself holds a device: stop must not kill its own caller
    res = worker.stop(prefix=f"exec 5<{accel}; ")
    assert res["result"] == "ok"
    assert res["libtpu_lockfile"].startswith("held")
    assert lockfile.exists()
    assert holder.poll() is None
    holder.kill()
    holder.wait(5)


def test_stop_never_signals_a_pid_that_is_no_longer_ours(worker: Worker) -> None:
    worker.launch(1, "exit 0")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    stranger = subprocess.Popen(["sleep", "307"], start_new_session=True, stdin=subprocess.DEVNULL,
                                env={**worker.env, "TPUWATCH_JOB": "someone-else"})
    (worker.dir / "pid").write_text(f"{stranger.pid}\n")  # as if the pid had been reused
    res = worker.stop()
    assert res["stopped"] == ""
    assert stranger.poll() is None
    stranger.kill()
    stranger.wait(5)


def test_whose_a_process_is_is_read_from_its_environment_by_bash_itself(worker: Worker, tmp_path: Path) -> None:
    """A process in the attempt's session counts as the attempt's by TPUWATCH_JOB in its
    environment, read without a `tr` (every run of one is logged here): the job's name whole,
    not a prefix of another's."""
    worker.launch(1, "exit 0")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
    (worker.dir / "exit_code").unlink()  # as if it had never ended: its session decides
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    (bindir / "tr").write_text(f'#!/bin/sh\necho tr >>{calls}\nexec {shutil.which("tr")} "$@"\n')
    (bindir / "tr").chmod(0o755)
    worker.extra["PATH"] = f"{bindir}:{os.environ['PATH']}"
    for job, state in ((JOB + "x", "absent"), (JOB, "running")):
        member = subprocess.Popen(["sleep", "308"], start_new_session=True, stdin=subprocess.DEVNULL,
                                  env={**worker.env, "TPUWATCH_JOB": job})
        try:
            (worker.dir / "pid").write_text(f"{member.pid}\n")
            assert worker.probe()["state"] == state, job
        finally:
            member.kill()
            member.wait(5)
    assert not calls.exists()


def test_after_a_reboot_the_attempt_of_an_earlier_boot_is_not_looked_for(worker: Worker) -> None:
    """Nothing of an attempt launched before the host last booted can be alive, so its pid (now
    anyone's, even a process that carries the job's name) is neither probed as running nor
    stopped, and no scan of every process looks for its session."""
    boot_id = worker.root / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("boot-1\n")
    worker.launch(1, "exec sleep 341")
    wait_for(lambda: bool(worker.pids(b"sleep\x00341")), what="the job")
    assert (worker.dir / "boot").read_text() == "boot-1\n"
    worker.kill()  # the host goes down: every process of the attempt dies
    wait_for(lambda: worker.pids() == [], what="the attempt's end")
    # Another process of the same job name, whose session is the pid in the attempt's files
    stranger = subprocess.Popen(["sleep", "342"], start_new_session=True, stdin=subprocess.DEVNULL,
                                env={**worker.env, "TPUWATCH_JOB": JOB})
    (worker.dir / "pid").write_text(f"{stranger.pid}\n")
    assert worker.probe()["state"] == "running"  # the same boot: it could be the attempt's
    boot_id.write_text("boot-2\n")  # booted again
    probe = worker.probe()
    assert probe["state"] == "absent" and "no exit code and no process" in probe["detail"], probe
    res = worker.launch(2, "exec sleep 343", clean_grace=0.3)
    assert res["result"] == "launched" and res["cleanup_stopped"] == "", res
    assert stranger.poll() is None
    assert (worker.dir / "boot").read_text() == "boot-2\n"
    stranger.kill()
    stranger.wait(5)


def test_after_a_reboot_a_follow_channel_of_the_old_attempt_ends_at_once(worker: Worker) -> None:
    """A channel opened again after a maintenance rebooted the host reports the attempt's end
    at once, whoever holds the job lock by then (a launch under way, say), and starts no helper
    to watch the lock; the probe says the same."""
    boot_id = worker.root / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("boot-1\n")
    worker.launch(1, "exec sleep 361")
    wait_for(lambda: bool(worker.pids(b"sleep\x00361")), what="the job")
    worker.kill()  # the host goes down: every process of the attempt dies
    wait_for(lambda: worker.pids() == [], what="the attempt's end")
    boot_id.write_text("boot-2\n")
    holder = subprocess.Popen(["flock", str(worker.dir / "lock"), "sleep", "362"], start_new_session=True,
                              stdin=subprocess.DEVNULL, env=worker.env)
    try:
        wait_for(lambda: bool(worker.pids(b"sleep\x00362")), what="the lock's holder")
        assert worker.probe()["state"] == "absent"
        shell = subprocess.Popen(["/bin/bash", "-c", protocol.REMOTE_COMMAND], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=worker.env)
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write(protocol.framed(protocol.wait_script(JOB, 1, poll=3600)))  # stdin stays open
        shell.stdin.flush()
        out = shell.stdout.read()  # the end, with no timed look and no request
        assert protocol.parse_wait(out.decode()).result == "gone", out
        assert shell.wait(10) == 0
        assert worker.pids(b"flock\x00-s\x00-o") == []
    finally:
        holder.kill()
        holder.wait(5)


def test_follow_streams_from_an_offset_and_reports_the_exit_code(worker: Worker) -> None:
    worker.launch(1, "for i in 1 2 3; do echo line $i; sleep 0.1; done; printf tail; exit 4")
    proc = subprocess.run(["/bin/bash", "-c", protocol.REMOTE_COMMAND],
                          input=protocol.framed(protocol.follow_script(JOB, 1, offset=5, poll=0.05)),
                          capture_output=True, env=worker.env, timeout=30)
    assert proc.stdout == b"1\nline 2\nline 3\ntail", proc.stderr
    end = protocol.parse_follow_end(proc.stderr.decode())
    assert (end.result, end.exit_code) == ("ok", 4), proc.stderr
    wrong = subprocess.run(["/bin/bash", "-c", protocol.REMOTE_COMMAND], input=protocol.framed(protocol.follow_script(JOB, 9)),
                           capture_output=True,
                           env=worker.env, timeout=30)
    assert protocol.parse_follow_end(wrong.stderr.decode()).result == "error"


class LoopServer:
    """A TCP server on a loopback port whose connections `handle` serves on an event loop of its
    own thread."""

    def serve(self, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(handle, "127.0.0.1", 0)

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        async def stop() -> None:
            # the handlers still open (a connection kept open) end here, on the running loop: left
            # suspended, one would be closed by the garbage collector after the loop is gone
            self.server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class MetadataServer(LoopServer):
    """The simulator's metadata server (tpuwatch.sim.metadata) on a loopback port, serving an
    instance the test changes, as Compute Engine changes it before a maintenance or preemption."""

    def __init__(self) -> None:
        self.instance = md.make_instance(project="proj", zone="us-central2-b", node_id=7, worker=0, metadata={})
        self.requests = 0  # connections taken so far (one request each: Connection: close)
        self.answered = 0  # of those, answered: a change after N were answered reaches none of them

        async def current() -> md.Instance:
            return self.instance

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.requests += 1
            try:
                await md.serve(reader, writer, current)
            finally:
                self.answered += 1

        self.serve(handle)


@pytest.fixture
def metadata(worker: Worker) -> Iterator[MetadataServer]:
    server = MetadataServer()
    worker.extra["GCE_METADATA_HOST"] = server.address
    yield server
    server.close()


# A job that saves when told to stop (as Orbax does on SIGTERM) and then ends its loop: exit 0.
SAVES_ON_TERM = "trap 'echo saved-on-term; exit 0' TERM; echo started; while :; do sleep 0.05; done"


def _notice(worker: Worker) -> dict[str, object]:
    data: dict[str, object] = json.loads((worker.dir / "maintenance").read_text())
    return data


def test_the_relay_passes_a_maintenance_notice_to_the_job(worker: Worker, metadata: MetadataServer) -> None:
    window = {"type": "SCHEDULED", "can_reschedule": False, "window_start_time": "2026-01-01T00:00:00Z"}
    metadata.instance = replace(metadata.instance, upcoming_maintenance=window)
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    log = worker.dir / "attempt-1.log"
    wait_for(lambda: "started" in log.read_text(), what="the job")
    time.sleep(0.5)  # the relay is waiting now; no notice yet, nothing happens
    assert worker.probe()["state"] == "running" and not (worker.dir / "maintenance").exists()
    metadata.instance = replace(metadata.instance, maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
    p = worker.probe()
    assert (p["state"], p["exit_code"], p["notice"]) == ("exited", "0", "TERMINATE_ON_HOST_MAINTENANCE"), p
    assert "saved-on-term" in log.read_text()
    note = _notice(worker)
    assert (note["what"], note["attempt"], note["signal"], note["window"]) == (
        "TERMINATE_ON_HOST_MAINTENANCE", 1, "SIGTERM", window)
    assert str(note["when"]).endswith("Z")
    assert worker.pids(b"\0tpuwatch-relay\0") == []  # it ended with the attempt
    # the host came back (the notice is over): the next attempt starts with no notice. An attempt
    # started while the notice still stands is told at once, by design: its host is going away.
    metadata.instance = replace(metadata.instance, maintenance_event="NONE")
    assert worker.launch(2, "sleep 30", clean_grace=0.5)["result"] == "launched"
    p = worker.probe()
    assert p["state"] == "running" and p["notice"] == ""


def test_a_preemption_notice_with_no_signal_only_writes_the_file(worker: Worker, metadata: MetadataServer) -> None:
    assert worker.launch(1, SAVES_ON_TERM, notify_signal="")["result"] == "launched"
    wait_for(lambda: "started" in (worker.dir / "attempt-1.log").read_text(), what="the job")
    metadata.instance = replace(metadata.instance, preempted=True)
    wait_for(lambda: (worker.dir / "maintenance").exists(), what="the notice file")
    note = _notice(worker)
    assert (note["what"], note["signal"], note["window"]) == ("PREEMPTED", "", None)
    time.sleep(0.5)
    p = worker.probe()
    assert (p["state"], p["notice"]) == ("running", "PREEMPTED")  # not signalled
    assert "saved-on-term" not in (worker.dir / "attempt-1.log").read_text()


def _term_session(worker: Worker) -> None:
    """TERM every process of the attempt's session, as the guest's shutdown does (systemd TERMs
    every process), from outside both tpuwatch's stop and the relay."""
    os.killpg(int(worker.probe()["pid"]), signal.SIGTERM)


def test_a_term_from_outside_is_recorded_with_the_exit_code(worker: Worker) -> None:
    assert worker.launch(1, SAVES_ON_TERM, notify_signal="")["result"] == "launched"
    wait_for(lambda: "started" in (worker.dir / "attempt-1.log").read_text(), what="the job")
    _term_session(worker)
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the TERM")
    p = worker.probe()
    assert (p["state"], p["exit_code"], p["sigterm"]) == ("exited", "0", "foreign"), p
    assert protocol.parse_probe(3, p).foreign_term
    # the next attempt starts with a clean slate
    assert worker.launch(2, "sleep 30", clean_grace=0.5)["result"] == "launched"
    assert protocol.parse_probe(3, worker.probe()).foreign_term is False


def test_tpuwatchs_own_stop_is_not_a_term_from_outside(worker: Worker) -> None:
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    wait_for(lambda: "started" in (worker.dir / "attempt-1.log").read_text(), what="the job")
    assert worker.stop()["result"] == "ok"
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the stop")
    p = worker.probe()
    assert (p["exit_code"], p["sigterm"]) == ("0", ""), p
    assert "saved-on-term" in (worker.dir / "attempt-1.log").read_text()


def test_the_relays_term_is_not_a_term_from_outside(worker: Worker, metadata: MetadataServer) -> None:
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    wait_for(lambda: "started" in (worker.dir / "attempt-1.log").read_text(), what="the job")
    metadata.instance = replace(metadata.instance, preempted=True)
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
    p = worker.probe()
    assert (p["exit_code"], p["notice"], p["sigterm"]) == ("0", "PREEMPTED", ""), p


PENDING = {"can_reschedule": "true", "latest_window_start_time": "2026-01-08T00:00:00Z", "maintenance_status": "PENDING",
           "type": "SCHEDULED", "window_end_time": "2026-01-08T01:00:00Z", "window_start_time": "2026-01-08T00:00:00Z"}
ONGOING = {**PENDING, "can_reschedule": "false", "maintenance_status": "ONGOING"}


def relay_waiting(metadata: MetadataServer, since: int) -> Callable[[], bool]:
    """True once the relay has read the keys after request `since` and waits again: its
    directory query, three keys, then the next wait_for_change (one connection each)."""
    return lambda: metadata.requests >= since + 5


def test_the_relay_passes_upcoming_maintenance_turning_ongoing_to_the_job(
        worker: Worker, metadata: MetadataServer) -> None:
    # A TPU VM is neither set to migrate nor has a GPU: maintenance-event may stay NONE, and the
    # notice is instance/upcoming-maintenance's maintenance_status turning ONGOING.
    metadata.instance = replace(metadata.instance, upcoming_maintenance=PENDING)
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    log = worker.dir / "attempt-1.log"
    wait_for(lambda: "started" in log.read_text(), what="the job")
    wait_for(relay_waiting(metadata, 0), what="the relay's first look")
    assert worker.probe()["state"] == "running" and not (worker.dir / "maintenance").exists()
    metadata.instance = replace(metadata.instance, upcoming_maintenance=ONGOING)
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
    p = worker.probe()
    assert (p["state"], p["exit_code"], p["notice"]) == ("exited", "0", "MAINTENANCE_ONGOING"), p
    assert "saved-on-term" in log.read_text()
    note = _notice(worker)
    assert (note["what"], note["signal"], note["window"]) == ("MAINTENANCE_ONGOING", "SIGTERM", ONGOING)


def test_an_ongoing_notice_there_before_the_attempt_counts_only_once_it_comes_again(
        worker: Worker, metadata: MetadataServer) -> None:
    # A notice left over from a maintenance that is over must not end every new attempt at once.
    metadata.instance = replace(metadata.instance, upcoming_maintenance=ONGOING)
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    wait_for(lambda: "started" in (worker.dir / "attempt-1.log").read_text(), what="the job")
    wait_for(relay_waiting(metadata, 0), what="the relay's first look")
    assert worker.probe()["state"] == "running" and not (worker.dir / "maintenance").exists()
    seen = metadata.requests
    metadata.instance = replace(metadata.instance, upcoming_maintenance=None)  # the notice is over
    wait_for(relay_waiting(metadata, seen - 1), what="the relay to read the keys again")
    assert worker.probe()["state"] == "running"
    metadata.instance = replace(metadata.instance, upcoming_maintenance=ONGOING)  # a new one begins
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the new notice")
    assert worker.probe()["notice"] == "MAINTENANCE_ONGOING"


@pytest.mark.parametrize("notice", ["maintenance-event", "upcoming-maintenance"])
def test_when_directory_queries_fail_the_relay_watches_the_keys_one_by_one(
        worker: Worker, metadata: MetadataServer, notice: str) -> None:
    metadata.instance = replace(metadata.instance, directories_fail=True)
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    log = worker.dir / "attempt-1.log"
    wait_for(lambda: "watching maintenance-event, upcoming-maintenance and preempted one by one" in log.read_text(),
             what="the relay's note")
    assert worker.probe()["state"] == "running" and "not relayed" not in log.read_text()
    # Two failed directory queries and a key that answers, then the first round of the keys:
    # a notice there at the first look would be taken for one left over.
    wait_for(lambda: metadata.answered >= 6, what="the relay's first look at the keys")
    metadata.instance = (replace(metadata.instance, maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
                         if notice == "maintenance-event" else replace(metadata.instance, upcoming_maintenance=ONGOING))
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
    assert worker.probe()["notice"] == ("TERMINATE_ON_HOST_MAINTENANCE" if notice == "maintenance-event"
                                        else "MAINTENANCE_ONGOING")
    assert "saved-on-term" in log.read_text()


def test_the_relay_looks_and_waits_without_a_process_of_its_own(worker: Worker, metadata: MetadataServer) -> None:
    # A relaunched pod starts a relay on every host at once: its looks go over bash's /dev/tcp,
    # not a curl each (~6 ms of CPU to start, twice per host at a relaunch).
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    wait_for(relay_waiting(metadata, 0), what="the relay's first look and its wait")
    relay = worker.pids(b"\0tpuwatch-relay\0")
    assert relay, "no relay"
    children = [pid for pid in worker.pids() if _ppid(pid) in relay]
    assert children == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children]
    metadata.instance = replace(metadata.instance, maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
    wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
    assert worker.probe()["notice"] == "TERMINATE_ON_HOST_MAINTENANCE"


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class ChunkedMetadataServer(LoopServer):
    """A metadata server that answers every request in HTTP/1.1 chunks (the simulator's answers,
    re-encoded), even an HTTP/1.0 one: what the relay's own reads do not take, and curl does.
    With `keep_open`, plain answers instead (a Content-Length), on a connection it never ends,
    whatever the request asked. With `refuse_1_0`, an HTTP/1.0 request is answered 400 and any
    other plainly: a server the relay's own HTTP/1.0 reads cannot use, whose answers curl gets."""

    def __init__(self, instance: md.Instance, keep_open: bool = False, refuse_1_0: bool = False) -> None:
        self.instance = instance

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split()[1]
                r = md.answer(self.instance, path, dict(ln.split(": ", 1) for ln in head[1:] if ": " in ln), "GET")
                if refuse_1_0:
                    status, body = ((400, b"") if head[0].endswith("HTTP/1.0") else (r.status, r.body))
                    writer.write(f"HTTP/1.1 {status} X\r\nMetadata-Flavor: Google\r\nETag: {r.etag}\r\n"
                                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                    await writer.drain()
                    return
                if keep_open:
                    writer.write(f"HTTP/1.1 {r.status} X\r\nMetadata-Flavor: Google\r\nETag: {r.etag}\r\n"
                                 f"Content-Length: {len(r.body)}\r\n\r\n".encode() + r.body)
                    await writer.drain()
                    await reader.read()  # until the client ends it
                    return
                body = b"".join(b"%x\r\n%s\r\n" % (len(r.body[i:i + 3]), r.body[i:i + 3])
                                for i in range(0, len(r.body), 3)) + b"0\r\n\r\n"
                writer.write(f"HTTP/1.1 {r.status} X\r\nMetadata-Flavor: Google\r\nETag: {r.etag}\r\n"
                             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode() + body)
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError, IndexError):
                pass
            finally:
                writer.close()

        self.serve(handle)


@pytest.mark.parametrize("mode", ["chunked", "kept-open", "refuses-1.0"])
def test_a_notice_in_an_answer_not_plain_http_1_0_still_reaches_the_job(worker: Worker, mode: str) -> None:
    # kept open: read by its Content-Length, 2 s after it came, not after the look's timeout.
    # refuses 1.0: the relay's own reads speak HTTP/1.0; an answer other than 200 before any 200
    # came that way is curl's to judge, so a server that refused them could not silence the notices
    instance = md.make_instance(project="proj", zone="us-central2-b", node_id=7, worker=0, metadata={})
    server = ChunkedMetadataServer(replace(instance, preempted=True), keep_open=mode == "kept-open",
                                   refuse_1_0=mode == "refuses-1.0")
    worker.extra["GCE_METADATA_HOST"] = server.address
    try:
        assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
        wait_for(lambda: (worker.dir / "exit_code").exists(), what="the job to end on the notice")
        assert _notice(worker)["what"] == "PREEMPTED"
    finally:
        server.close()


def test_without_a_metadata_server_the_relay_ends_and_the_job_runs_on(worker: Worker) -> None:
    worker.extra["GCE_METADATA_HOST"] = "127.0.0.1:9"  # nothing listens there
    assert worker.launch(1, SAVES_ON_TERM)["result"] == "launched"
    log = worker.dir / "attempt-1.log"
    wait_for(lambda: "maintenance notices are not relayed" in log.read_text(), what="the relay's note")
    wait_for(lambda: worker.pids(b"\0tpuwatch-relay\0") == [], what="the relay to end")
    assert worker.probe()["state"] == "running"


def test_wait_answers_probe_requests_on_its_stdin_and_ends_with_it(worker: Worker) -> None:
    """remote.sh `wait` with its stdin kept open, as a follow channel holds it: each request
    line is answered by the probe, framed by its number (the listing only when asked), the
    attempt's end still comes at once, and a closed stdin ends the shell and its helpers."""
    assert worker.launch(1, "sleep 300")["result"] == "launched"
    ck = worker.root / "ck"
    ck.mkdir()
    (ck / "step_5").mkdir()
    script = protocol.framed(protocol.wait_script(JOB, 1, poll=3600, checkpoint_dir="/ck"))  # no timed wake-ups
    shell = subprocess.Popen(["/bin/bash", "-c", protocol.REMOTE_COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=worker.env)
    assert shell.stdin is not None and shell.stdout is not None
    reader = protocol.WaitReader()

    def ask(seq: int, listing: bool) -> dict[str, str]:
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write(protocol.probe_request(seq, listing))
        shell.stdin.flush()
        while True:
            done = reader.feed(shell.stdout.readline())
            if done:
                assert [s for s, _ in done] == [str(seq)]
                return protocol.parse_records(done[0][1])

    try:
        shell.stdin.write(script)
        shell.stdin.flush()
        plain = ask(41, False)
        assert reader.ready  # it said it reads requests before the first answer
        assert (plain["state"], plain["attempt"]) == ("running", "1") and "ckpt_listing" not in plain
        # what the probe over its own connection says (the log's age in seconds may have moved on)
        assert int(plain.pop("log_age")) <= int((again := worker.probe()).pop("log_age")) and plain == again
        listed = ask(42, True)
        assert '"step_5"' in listed["ckpt_listing"]
        assert reader.rest == []  # nothing but answers while the attempt runs
        helpers = worker.pids(b"cat\x00") + worker.pids(b"flock\x00-s\x00-o")
        assert len(helpers) == 2
        shell.stdin.close()  # the channel closes: sshd closes the shell's stdin
        assert shell.wait(30) == 0
        wait_for(lambda: not any(alive(p) for p in helpers), what="the helpers to end")
        assert reader.rest == []  # a closed channel is not an end
    finally:
        shell.kill()
    # and its end is noticed the moment it happens, on the lock, not at the poll
    shell = subprocess.Popen(["/bin/bash", "-c", protocol.REMOTE_COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=worker.env)
    assert shell.stdin is not None and shell.stdout is not None
    shell.stdin.write(script)
    shell.stdin.flush()
    try:
        wait_for(lambda: len(worker.pids(b"flock\x00-s\x00-o")) == 1, what="the lock's helper")
        worker.kill(b"sleep\x00300")
        out = shell.stdout.read()  # ends well before the hour's poll
        assert protocol.parse_wait(out.decode()).exit_code == 137
        assert shell.wait(30) == 0
    finally:
        shell.kill()


def test_a_probe_on_a_follow_channel_learns_the_lock_is_held_from_its_helper(worker: Worker, tmp_path: Path) -> None:
    """The channel's helper waiting for its shared lock says the attempt holds the lock: a probe
    request answers `running` without a flock of its own (every flock run is logged here)."""
    assert worker.launch(1, "sleep 300")["result"] == "launched"
    bindir, calls = tmp_path / "bin", tmp_path / "flock-calls"
    bindir.mkdir()
    (bindir / "flock").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >>{calls}\nexec {shutil.which("flock")} "$@"\n')
    (bindir / "flock").chmod(0o755)
    env = {**worker.env, "PATH": f"{bindir}:{worker.env['PATH']}"}
    shell = subprocess.Popen(["/bin/bash", "-c", protocol.REMOTE_COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env)
    assert shell.stdin is not None and shell.stdout is not None
    reader = protocol.WaitReader()
    try:
        shell.stdin.write(protocol.framed(protocol.wait_script(JOB, 1, poll=3600)))
        shell.stdin.write(b"".join(protocol.probe_request(seq) for seq in (1, 2, 3)))
        shell.stdin.flush()
        answers: list[tuple[str, str]] = []
        while len(answers) < 3:
            answers += reader.feed(shell.stdout.readline())
        assert [(seq, protocol.parse_records(text)["state"]) for seq, text in answers] == [
            ("1", "running"), ("2", "running"), ("3", "running")]
        assert calls.read_text().splitlines() == [f"-s -o {worker.dir / 'lock'} printf free\\n"]  # the helper only
    finally:
        shell.kill()
        shell.wait()


def _signed_probe(worker: Worker, patterns: tuple[str, ...]) -> dict[str, str]:
    return worker.run(protocol.probe_script(JOB, patterns=patterns))


def test_the_probe_reports_the_log_age_and_the_first_line_matching_a_signature(worker: Worker) -> None:
    from tpuwatch.policy.signatures import BUILTIN, worker_patterns

    patterns = (*worker_patterns(BUILTIN), "it's \"q\" $(touch pwned)|`touch pwned`")  # reaches bash as data
    worker.launch(1, "exec sleep 300")
    log = worker.dir / "attempt-1.log"
    log.write_text("step 1\n")
    old = time.time() - 120
    os.utime(log, (old, old))
    p = protocol.parse_probe(0, _signed_probe(worker, patterns))
    assert p.log_match == "" and p.log_age is not None and 119 <= p.log_age <= 130
    # a signature split across two probes' reads is still found whole
    with log.open("a") as f:
        f.write("E0926 x] Megascale hang det")
    assert protocol.parse_probe(0, _signed_probe(worker, patterns)).log_match == ""
    with log.open("a") as f:
        f.write("ected: Timed out waiting for 4 graphs to complete\nlater: TPU initialization failed\n")
    p = protocol.parse_probe(0, _signed_probe(worker, patterns))
    assert p.log_match == "E0926 x] Megascale hang detected: Timed out waiting for 4 graphs to complete"
    assert p.log_age is not None and p.log_age <= 5
    # kept: later probes report the same first line without searching again
    assert protocol.parse_probe(0, _signed_probe(worker, patterns)).log_match == p.log_match
    # a user's pattern with quotes and shell syntax is only ever a pattern
    assert not list(worker.home.rglob("pwned")) and not Path("pwned").exists()
    # the next attempt starts afresh
    worker.stop()
    worker.launch(2, "echo clean; exec sleep 300")
    wait_for(lambda: (worker.dir / "attempt-2.log").read_text() == "clean\n", what="attempt 2's output")
    assert protocol.parse_probe(0, _signed_probe(worker, patterns)).log_match == ""
    assert not (worker.dir / "attempt-1.match").exists()


def test_a_probe_searches_a_short_logs_growth_with_grep_alone(worker: Worker, tmp_path: Path) -> None:
    """A log that grew, shorter than the look-back: grep reads it itself, and nothing else runs
    beside it (no tail, no head, no mv of the scan mark); the match is cut at 400 bytes."""
    worker.launch(1, "exec sleep 300")
    log = worker.dir / "attempt-1.log"
    log.write_text("step 1\nTraceback (most recent call last): " + "x" * 600 + "\n")
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    for tool in ("tail", "head", "mv", "grep"):
        (bindir / tool).write_text(f'#!/bin/sh\necho {tool} >>{calls}\nexec {shutil.which(tool)} "$@"\n')
        (bindir / tool).chmod(0o755)
    worker.extra["PATH"] = f"{bindir}:{os.environ['PATH']}"
    p = protocol.parse_probe(0, _signed_probe(worker, ("Traceback \\(most recent",)))
    assert p.log_match == ("Traceback (most recent call last): " + "x" * 600)[:400]
    assert calls.read_text().split() == ["grep", "mv"]  # the mv keeps the match, once
    assert (worker.dir / "attempt-1.scan").read_text() == f"{log.stat().st_size}\n"


def test_libtpu_args_are_appended_to_the_jobs_own_and_never_override_a_flag_it_sets(worker: Worker) -> None:
    def launched_with(attempt: int, env: dict[str, str] | None, login: str | None) -> str:
        if login is None:
            worker.extra.pop("LIBTPU_INIT_ARGS", None)
        else:
            worker.extra["LIBTPU_INIT_ARGS"] = login
        worker.run(protocol.launch_script(JOB, attempt=attempt, worker=0, checkpoint=None, env=env,
                                          command="printf '%s' \"$LIBTPU_INIT_ARGS\"",
                                          libtpu_args=("--megascale_error_reporter_abort_on_hang=true",
                                                       "--megascale_error_reporter_abort_on_error=true")))
        log = worker.dir / f"attempt-{attempt}.log"
        wait_for(lambda: (worker.dir / "exit_code").exists(), what="exit_code")
        return log.read_text()

    assert launched_with(1, None, None) == ("--megascale_error_reporter_abort_on_hang=true "
                                            "--megascale_error_reporter_abort_on_error=true")
    # the login's own value is kept, first
    assert launched_with(2, None, "--xla_foo=1") == ("--xla_foo=1 --megascale_error_reporter_abort_on_hang=true "
                                                     "--megascale_error_reporter_abort_on_error=true")
    # [job] env wins over the login's, and a flag it sets itself is left as it set it
    assert launched_with(3, {"LIBTPU_INIT_ARGS": "--megascale_error_reporter_abort_on_hang=false"}, "--xla_foo=1") == (
        "--megascale_error_reporter_abort_on_hang=false --megascale_error_reporter_abort_on_error=true")
