"""The SSH server side of a simulated worker: the asyncssh server that authenticates one
connection (the client's key only, once the guest agent has installed it) and the session that
runs `/bin/bash -c CMD` for `ssh worker CMD`, relaying stdio, signals and the exit status.

`hosts.py` owns the workers and their event loop and starts one listener per worker with
`WorkerServer`. What the server needs of them is written here as protocols (`Host`, `Worker`),
so that this module does not import hosts.py back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncssh


@dataclass
class ConnReset:
    """A pending fault: the worker's next command's connection is cut, after that many bytes of
    output (None: when the command ends, before its exit status)."""

    after_bytes: int | None


class Worker(Protocol):
    """One worker, as its SSH server sees it (hosts.HostWorker)."""

    keys_at: float
    conns: set[Any]
    accepted: int
    sessions: int
    reset: ConnReset | None

    @property
    def home(self) -> Path: ...

    @property
    def listening(self) -> bool: ...


class Host(Protocol):
    """The simulated hosts, as a worker's SSH server sees them (hosts.Hosts)."""

    ssh_user: str
    client_pub: Any  # asyncssh.SSHKey
    enter_cgroup: str  # shell text that moves the shell into its worker's cgroup, run before the command

    # `w` is the hosts' own worker record, which this module does not import.
    def worker_env(self, w: Any, client_env: Mapping[str, str] | None = None) -> dict[str, str]: ...

    def spawn_task(self, coro: Awaitable[Any]) -> asyncio.Task[Any]: ...


class WorkerServer(asyncssh.SSHServer):
    """One SSH connection to a worker: public-key auth with the client key only."""

    def __init__(self, hosts: Host, worker: Worker) -> None:
        self._hosts = hosts
        self._worker = worker
        self._conn: Any = None

    def connection_made(self, conn: Any) -> None:
        self._conn = conn
        if not self._worker.listening:
            conn.abort()
            return
        self._worker.accepted += 1
        self._worker.conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        # counted gone on the loop's next turn: its sessions' pipes close then (an asyncio pipe
        # transport closes its fd so), and one who sees it gone must find a command's next write
        # meeting a closed pipe, as under sshd
        asyncio.get_running_loop().call_soon(self._worker.conns.discard, self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: Any) -> bool:
        if time.monotonic() < self._worker.keys_at:
            return False  # booted, but the guest agent has not installed the keys yet
        client: Any = self._hosts.client_pub
        return bool(username == self._hosts.ssh_user and key.public_data == client.public_data)

    def session_requested(self) -> ExecSession:
        self._worker.sessions += 1
        return ExecSession(self._hosts, self._worker, self._conn)


class ExecSession(asyncssh.SSHServerSession):  # type: ignore[misc]
    """`ssh worker CMD`: runs `/bin/bash -c CMD` and relays stdio, signals and exit status.

    Signal requests go to the command's process group. A dropped client closes the command's
    pipes, as sshd does without a PTY.
    """

    def __init__(self, hosts: Host, worker: Worker, conn: Any) -> None:
        self._hosts = hosts
        self._worker = worker
        self._conn = conn
        self._chan: Any = None
        self._command: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stdin_buf: list[bytes] = []
        self._stdin_eof = False
        self._stdin_flushed = False  # the buffered input reached the command: later input goes straight in
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False
        self._reset: ConnReset | None = None
        self._sent = 0
        self._out_transports: list[asyncio.BaseTransport] = []

    # -- channel callbacks
    def connection_made(self, chan: Any) -> None:
        self._chan = chan

    def pty_requested(self, term_type: str, term_size: Any, term_modes: Any) -> bool:
        return True  # accepted and ignored: commands always run on pipes

    def shell_requested(self) -> bool:
        return False

    def subsystem_requested(self, subsystem: str) -> bool:
        return False

    def exec_requested(self, command: str | bytes) -> bool:
        self._command = command.decode() if isinstance(command, bytes) else command
        return True

    def session_started(self) -> None:
        self._hosts.spawn_task(self._run())

    def data_received(self, data: bytes, datatype: Any) -> None:
        # Not straight in as soon as the command exists: until the buffer is flushed, input that
        # arrives would overtake it (and an EOF would drop it), as happens on a loaded box.
        if self._stdin_flushed and self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.write(data)
        else:
            self._stdin_buf.append(data)

    def eof_received(self) -> bool:
        self._stdin_eof = True
        if self._stdin_flushed and self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.close()
        return True  # keep our side open until the command's output is sent

    def signal_received(self, signal_name: str) -> None:
        sig = getattr(signal, f"SIG{signal_name}", None)
        if isinstance(sig, signal.Signals):
            self._signal_group(sig)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        # As sshd does without a PTY: no signal, the command's pipes are closed; it reads EOF
        # and dies of SIGPIPE when it next writes. Detached jobs are not affected either way.
        self._lost = True
        self._writable.set()
        self._close_pipes()

    # -- the command
    def _close_pipes(self) -> None:
        for t in self._out_transports:
            t.close()  # feeds EOF to the pump's reader
        self._out_transports.clear()
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.close()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def _pipe_reader(self, fd: int) -> asyncio.StreamReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
        self._out_transports.append(transport)
        return reader

    async def _run(self) -> None:
        w = self._worker
        if self._lost:
            return
        if not w.listening or self._command is None:
            self._conn.abort()
            return
        self._reset, w.reset = w.reset, None
        # Our own pipes for stdout/stderr, so a lost client can close the read ends.
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                "/bin/bash", "-c", self._hosts.enter_cgroup + self._command, cwd=w.home,
                env=self._hosts.worker_env(w, self._chan.get_environment()),
                stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w,
                start_new_session=True)
        except OSError as e:
            for fd in (out_r, err_r):
                os.close(fd)
            self._chan.write_stderr(f"bash: {e}\n".encode())
            self._chan.exit(127)
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        proc = self._proc
        assert proc.stdin is not None
        stdout = await self._pipe_reader(out_r)
        stderr = await self._pipe_reader(err_r)
        if self._lost:
            self._close_pipes()
        for chunk in self._stdin_buf:
            proc.stdin.write(chunk)
        self._stdin_buf.clear()
        self._stdin_flushed = True
        if self._stdin_eof:
            proc.stdin.close()
        await asyncio.gather(self._pump(stdout, self._chan.write),
                             self._pump(stderr, self._chan.write_stderr))
        rc = await proc.wait()
        self._close_pipes()
        if self._lost:
            return
        if self._reset is not None and self._reset.after_bytes is None:
            self._conn.abort()
            return
        with contextlib.suppress(Exception):
            if rc >= 0:
                self._chan.exit(rc)
            else:
                self._chan.exit_with_signal(signal.Signals(-rc).name[3:])

    async def _pump(self, stream: asyncio.StreamReader, write: Callable[[bytes], None]) -> None:
        while True:
            data = await stream.read(65536)
            if not data or self._lost:
                return
            await self._writable.wait()
            with contextlib.suppress(Exception):
                write(data)
            self._sent += len(data)
            reset = self._reset
            if reset is not None and reset.after_bytes is not None and self._sent >= reset.after_bytes:
                self._conn.abort()
