"""`tpuwatch` commands as their own processes, forked from a warm server instead of started
from nothing.

Not a test module. A `python -m tpuwatch.cli check` on Compute Engine spends ~0.5 of its ~0.6
CPU-s importing google-cloud-compute (one class per message of the API) and the command; the
end-to-end tests start hundreds of them. A server process (one per pytest worker, started on
first use) imports all that once (tests/cli_warm.py) and does nothing else; each command runs
in a child forked from it, with its own pid, the given environment, working directory and argv,
stdin /dev/null, stdout and stderr in real files, and it ends as a Python process ends
(SystemExit up to the top: atexit, threads joined, streams flushed), so its exit code is the
one `python -m tpuwatch.cli` would give. Nothing of a test's process (its simulator, threads,
environment) is in the child. `run` is `subprocess.run` for a one-shot command; `start` gives a
handle that can be polled, waited for and signalled, as a `Popen` whose output goes to a file.
Tests that read a watcher's output line by line still start a real subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# The server: one JSON request a line on stdin ("start": fork a command, answer its pid), and
# each child's exit code on stdout as it ends (SIGCHLD wakes the loop). A child leaves the loop
# by raising SystemExit, so that Python's own exit runs.
SERVER = r"""
import io, json, os, select, signal, sys
sys.path.insert(0, sys.argv[1])
import cli_warm  # noqa: F401 (the imports, once)
import gc
gc.collect()
gc.freeze()  # the children's collections skip what the server made: no walk of it, no copy of its pages
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
replies = sys.stdout.buffer
def say(msg):
    replies.write(json.dumps(msg).encode() + b"\n")
    replies.flush()
def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
buf = b""
while True:
    ready = select.select([0, wake_r], [], [])[0]
    if wake_r in ready:
        os.read(wake_r, 512)
        reap()
    if 0 not in ready:
        continue
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_r)
            os.close(wake_w)
            for fd, path in ((0, os.devnull), (1, req["out"]), (2, req["err"])):
                f = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_APPEND)
                os.dup2(f, fd)
                os.close(f)
            os.environ.clear()
            os.environ.update(req["env"])
            os.chdir(req["cwd"])
            # as Python sets them up for a process whose output is a file (a UTF-8 locale)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict")
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                          errors="backslashreplace", line_buffering=True)
            sys.argv = ["tpuwatch", *req["argv"]]
            from tpuwatch.cli import main
            main(req["argv"])
            raise SystemExit(0)
        say({"pid": pid})
while True:  # stdin closed: the test process is done; wait for what still runs
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
"""


class _Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(Path(__file__).parent)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()  # one start at a time: its pid is the next "pid" answer
        self.changed = threading.Condition()
        self.pids: list[int] = []
        self.codes: dict[int, int] = {}
        threading.Thread(target=self._read, name="cli-server", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                if "pid" in msg:
                    self.codes.pop(msg["pid"], None)  # a pid used again: the old one's code is stale
                    self.pids.append(msg["pid"])
                else:
                    self.codes[msg["exit"]] = msg["code"]
                self.changed.notify_all()

    def start(self, req: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        with self.lock:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
            with self.changed:
                if not self.changed.wait_for(lambda: self.pids or self.proc.poll() is not None, 60) or not self.pids:
                    raise AssertionError(f"the command server did not start the command (exit {self.proc.poll()})")
                return self.pids.pop(0)

    def code(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.codes, timeout)
            return self.codes.pop(pid, None)

    def stop(self) -> None:
        # Waited for, so that the CPU time of the server and of every command it ran (it waits
        # for each) counts in this process's children's, as a subprocess's does.
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a command a test left running: orphaned, as a subprocess would be
                self.proc.kill()
                self.proc.wait()


_server: _Server | None = None
_server_lock = threading.Lock()


def _started() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
            atexit.register(_server.stop)
        return _server


class Forked:
    """A command forked from the server: `Popen`'s poll, wait, send_signal, kill, terminate, pid,
    returncode, and communicate (what it wrote to `out`, once it has ended)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], out: str, err: str, cwd: str | None) -> None:
        self.args = ["tpuwatch", *args]
        self.out = out
        self._server = _started()
        self.pid = self._server.start({"argv": list(args), "env": dict(env), "cwd": cwd or os.getcwd(),
                                       "out": out, "err": err})
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """(its output, None) once it has ended, as `Popen(..., stdout=PIPE, stderr=STDOUT)`'s."""
        self.wait(timeout)
        return Path(self.out).read_text(encoding="utf-8", errors="replace"), None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def start(args: Sequence[str], env: Mapping[str, str], stdout: IO[Any] | None = None,
          cwd: str | None = None) -> Forked:
    """`tpuwatch ARGS` forked from the warm server, stdout and stderr appended to the file
    `stdout` is open on (as `Popen(..., stdout=f, stderr=STDOUT, stdin=DEVNULL)`), or to a file
    of its own that `communicate` reads (as with `stdout=PIPE, text=True`)."""
    if stdout is None:
        fd, out = tempfile.mkstemp(prefix="tpuwatch-cli-", suffix=".out")
        os.close(fd)
        proc = Forked(args, env, out, out, cwd)
        weakref.finalize(proc, os.unlink, out)
        return proc
    return Forked(args, env, stdout.name, stdout.name, cwd)


def run(args: Sequence[str], env: Mapping[str, str], timeout: float = 60,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """`tpuwatch ARGS` forked from the warm server, returned as `subprocess.run(..., text=True,
    capture_output=True, stdin=DEVNULL)` returns it (TimeoutExpired, the process killed, after
    `timeout` seconds)."""
    with tempfile.TemporaryDirectory(prefix="tpuwatch-cli-") as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        for path in (out, err):
            open(path, "wb").close()
        proc = Forked(args, env, out, err, cwd)
        end = time.monotonic() + timeout
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(max(10.0, end - time.monotonic()))
            raise
        stdout = Path(out).read_text(encoding="utf-8", errors="replace")
        stderr = Path(err).read_text(encoding="utf-8", errors="replace")
    assert proc.returncode is not None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
