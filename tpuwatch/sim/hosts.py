"""Simulated TPU VM workers: one SSH server (asyncssh) per worker, each on its own loopback IP.

A worker is a home directory, a host root (its `/dev/accel*`, `/tmp`, `/dev/shm` and the kernel's
boot id `/proc/sys/kernel/random/boot_id`, new at every boot; found through `TPUWATCH_HOST_ROOT`),
an ed25519 host key, an SSH listener on `127.<b>.<node>.<worker>`
(Linux routes all of 127/8 to `lo`, so `.0` and `.255` are ordinary addresses there and a node
holds up to 256 workers, a v5p-2048) and a metadata server on the same address (another port
shared by all workers; `GCE_METADATA_HOST=<worker ip>:<port>` in every process's environment, so
each worker reads its own values, see metadata.py). Commands run as local processes under `/bin/bash -c`; every
process a worker starts carries a marker variable in its environment, so the worker's processes
can be found and killed through /proc even after they `setsid` away from their process group.

Booting a node makes fresh homes and new host keys and runs its startup script in the background,
as a TPU VM runs its `startup-script` metadata on boot. The metadata server answers from
`metadata_source(node_key, worker)` (the simulator wires the world's live values in), or else
from the metadata given at boot. SSH faults of the real cloud: keys that arrive a while after
sshd listens (`keys_late`), host keys that change on a reboot (`rotate_keys_on_reboot`), and a
worker presenting a key its guest attributes do not publish (`wrong_host_key`);
`down`/`up` model a host going away and
coming back (maintenance), `destroy` deletes it. All asyncio work happens on one loop in a daemon
thread; the public methods are synchronous and thread-safe. The SSH server and its sessions
(authentication, running a command, relaying its stdio and signals) are in sshd.py.

This module knows nothing of the TPU API, node states or faults' timing: the simulator's world
model decides when a node boots, goes down or hangs, and calls these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import getpass
import os
import random
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from tpuwatch.errors import UsageError
from tpuwatch.sim import cgroups, hostfaults
from tpuwatch.sim import metadata as md
from tpuwatch.sim.sshd import ConnReset, WorkerServer

MARKER = "TPUWATCH_SIM_WORKER"
# Every shell a worker starts first moves itself into the worker's cgroup (when the simulator
# could make one): a real VM's /proc shows its own processes only, and the worker-side scripts
# list this host's processes from TPUWATCH_SIM_PROCS instead of every process of the machine.
ENTER_CGROUP = '[ -z "${TPUWATCH_SIM_PROCS:-}" ] || { echo $$ >"$TPUWATCH_SIM_PROCS"; } 2>/dev/null\n'
STARTUP_LOG = "startup-script.log"
STARTUP_EXIT = "startup-script.exit"  # written when the startup script ends: its exit status
MAX_WORKERS = 256  # the last octet of a worker's address (a v5p-2048 has 256 hosts)
_PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range (32768-60999)
_CALL_TIMEOUT = 60.0
T = TypeVar("T")


@dataclass
class HostWorker:
    node: _Node
    index: int
    ip: str
    dir: Path
    host_key: Any  # asyncssh.SSHKey: the worker's own key, the one its guest attributes publish
    served_key: Any = None  # a fault: the key the SSH server presents instead (None: host_key)
    keys_at: float = 0.0  # time.monotonic() before which every client key is refused
    acceptor: Any = None  # asyncssh.SSHAcceptor while listening
    md_server: asyncio.AbstractServer | None = None  # the metadata server while listening
    conns: set[Any] = field(default_factory=set)  # asyncssh.SSHServerConnection
    accepted: int = 0  # SSH connections accepted since the worker was created (benchmarks, tests)
    sessions: int = 0  # SSH sessions (channels running a command) opened on them
    reset: ConnReset | None = None
    startup: asyncio.Task[None] | None = None
    faults: dict[str, Any] = field(default_factory=dict)  # host faults (hostfaults.py); gone on recreate
    ssh_mode: str = ""  # an SSH fault: "refuse" or "hang" (see Hosts.ssh_fault); "" serves
    blackhole: asyncio.AbstractServer | None = None  # accepts SSH connections, never answers
    held: list[asyncio.StreamWriter] = field(default_factory=list)  # connections it holds
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # a new one at every (re)boot
    cgroup: Path | None = None  # the cgroup its processes are in, when the simulator made one

    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def host_root(self) -> Path:
        return self.dir / "host"

    @property
    def marker(self) -> str:
        return f"{self.node.hosts.instance}/{self.node.key}/{self.index}"

    @property
    def listening(self) -> bool:
        return self.acceptor is not None


@dataclass
class _Node:
    hosts: Hosts
    key: str
    node_id: str
    slot: int
    dir: Path
    startup_script: str | None
    chips_per_host: int
    vfio: bool
    metadata: dict[str, str] = field(default_factory=dict)  # given at boot
    workers: list[HostWorker] = field(default_factory=list)


class Hosts:
    """The simulated workers of every node of one simulator instance."""

    enter_cgroup = ENTER_CGROUP

    def __init__(self, root: Path, *, speed: float = 600.0, user: str | None = None,
                 extra_env: Mapping[str, str] | None = None,
                 metadata_source: Callable[[str, int], md.Instance | None] | None = None) -> None:
        self.root = Path(root)
        # (node_key, worker) -> what that worker's metadata server says; None: the boot metadata.
        # Called on a thread of its own, never on the hosts' loop, so it may take locks.
        self.metadata_source = metadata_source
        self.speed = speed  # kept for the simulator's clock; the hosts layer adds no delays
        self.ssh_user = user or getpass.getuser()
        self.extra_env = dict(extra_env or {})
        self.instance = secrets.token_hex(4)
        self._base = random.randint(1, 254)
        ssh_dir = self.root / "ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        self.client_key = ssh_dir / "id_ed25519"
        if not self.client_key.exists():
            key = asyncssh.generate_private_key("ssh-ed25519", comment="tpuwatch-sim")
            key.write_private_key(str(self.client_key))
            key.write_public_key(str(self.client_key) + ".pub")
            os.chmod(self.client_key, 0o600)
        self.client_pub = asyncssh.read_public_key(str(self.client_key) + ".pub")
        self.ssh_port = self._free_port()
        self.metadata_port = self._free_port(avoid=self.ssh_port)
        self._nodes: dict[str, _Node] = {}
        self._slots: dict[str, int] = {}  # node_key -> third octet; kept so a recreate keeps IPs
        # SSH faults that outlive a recreate (keyed by node_key, not by the hosts of one boot):
        self._keys_late: dict[str, float] = {}  # simulated seconds every boot refuses all keys
        self._rotate_on_reboot: set[str] = set()  # a reboot gives the workers new host keys
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Metadata reads waiting for one thread call (_instance_async), and their answers
        self._looks: list[tuple[HostWorker, asyncio.Future[md.Instance]]] = []
        self._cgroups: Path | None = None  # made at start; None: the machine's processes are every host's

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the event loop thread that serves every worker."""
        if self._loop is not None:
            return
        self._cgroups = cgroups.root(self.instance)
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="tpuwatch-sim-hosts", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    def close(self) -> None:
        """Stop every listener and kill every process any worker started."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            self._kill_marked(f"{self.instance}/", prefix=True)
            cgroups.remove(self._cgroups)
            return
        try:
            self._call(self._close)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None
            self._kill_marked(f"{self.instance}/", prefix=True)  # anything born during shutdown
            for node in self._nodes.values():
                for w in node.workers:
                    cgroups.remove(w.cgroup)
            cgroups.remove(self._cgroups)

    def __enter__(self) -> Hosts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- nodes -------------------------------------------------------------------------------

    def boot(self, node_key: str, node_id: str, n_workers: int, startup_script: str | None,
             *, chips_per_host: int = 4, vfio: bool = False,
             metadata: Mapping[str, str] | None = None) -> list[str]:
        """Fresh homes, new host keys, listeners up, startup script started; the workers' IPs.

        `metadata` is the node's instance metadata, served by each worker's metadata server
        unless `metadata_source` knows better (it holds the startup script too; `startup_script`
        is what runs).
        """
        if not 1 <= n_workers <= MAX_WORKERS:
            raise UsageError(f"a simulated node has 1 to {MAX_WORKERS} workers, not {n_workers}")
        meta = dict(metadata or {})
        return self._call(lambda: self._boot(node_key, node_id, n_workers, startup_script,
                                             chips_per_host, vfio, meta))

    def down(self, node_key: str) -> None:
        """The hosts go away: listeners closed (connection refused), every process killed."""
        self._call(lambda: self._down(self._node(node_key)))

    def up(self, node_key: str, *, reboot: bool = True) -> None:
        """The hosts come back with the same homes and host keys.

        With `reboot` (the default; a real TPU VM is restarted after maintenance) `/tmp` and
        `/dev/shm` under the host root are emptied and the startup script runs again.
        """
        self._call(lambda: self._up(self._node(node_key), reboot))

    def destroy(self, node_key: str) -> None:
        """Kill, stop listening, delete the homes. Unknown nodes are ignored."""
        self._call(lambda: self._destroy(node_key))

    def term(self, node_key: str) -> None:
        """The guests begin to shut down: SIGTERM to every process of the node's workers (as
        systemd sends every process at a shutdown); the hosts stay up until `down`."""
        for pid in self._marked(self._node_marker(self._node(node_key)), prefix=True):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)

    def kill_worker(self, node_key: str, worker: int) -> None:
        """SIGKILL every process of one worker; its SSH server stays up."""
        self._kill_marked(self._worker(node_key, worker).marker)

    def hang(self, node_key: str, worker: int | None = None) -> None:
        """SIGSTOP the processes of one worker (all workers when None); SSH still answers."""
        node = self._node(node_key)
        # one scan of /proc for the whole node, not one per worker (hundreds on a pod)
        pids = (self._marked(self._node_marker(node), prefix=True) if worker is None
                else self._marked(self._worker(node_key, worker).marker))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)

    def host_fault(self, node_key: str, worker: int, kind: str, params: Mapping[str, Any] | None = None) -> None:
        """A fault of one worker's host that an environment check sees (tpuwatch.sim.hostfaults):
        device-missing, stale-lockfile, dns-failure, orphan-holder, disk-full, small-shm, tpu-fault."""
        w = self._worker(node_key, worker)
        values = dict(params or {})

        async def run() -> None:
            hostfaults.apply(self, w, kind, values)

        self._call(run)

    def repair(self, node_key: str) -> None:
        """The node's hosts repaired (Compute Engine's reportHostAsFaulty): their hardware faults end."""
        node = self._node(node_key)

        async def run() -> None:
            for w in node.workers:
                hostfaults.repair(w)

        self._call(run)

    def reset_connections(self, node_key: str, worker: int, after_bytes: int | None = None) -> None:
        """Fault: the next exec session on this worker loses its connection mid-command.

        The command runs; the connection is dropped once it has written `after_bytes` bytes of
        output, or (None) when it has ended but before its exit status is sent — the client sees
        ssh exit 255 for a command that did run, as after a network drop.
        """
        self._worker(node_key, worker).reset = ConnReset(after_bytes)

    def ssh_fault(self, node_key: str, worker: int, mode: str) -> None:
        """Fault one worker's SSH server, leaving its processes and metadata server alone.

        "refuse": nothing listens (connection refused); "hang": connections are accepted and
        never answered, not even with the SSH banner; "serve": back to normal (new connections
        only); "drop": every open connection is cut now (a network blip: the commands' pipes
        close, as when a client drops) and new ones are served. A host going down and up
        (maintenance, recreate) ends the fault.
        """
        if mode not in ("refuse", "hang", "serve", "drop"):
            raise UsageError(f"ssh fault mode {mode!r}: use refuse, hang, serve or drop")
        w = self._worker(node_key, worker)
        if mode == "drop":
            self._call(lambda: self._drop(w))
            return
        self._call(lambda: self._ssh_fault(w, "" if mode == "serve" else mode))

    def set_user(self, user: str) -> None:
        """From now on every worker accepts the client key only for `user` (OS Login gives the
        workers a POSIX name of its own); a login under any other name is refused."""
        self.ssh_user = user

    def keys_late(self, node_key: str, delay: float) -> None:
        """Fault: from the next boot on (create, reboot), the node's workers refuse every client key
        for `delay` simulated seconds, as a VM whose guest agent has not installed the project's
        keys yet answers `Permission denied (publickey)`. It outlives a recreate; 0 ends it, and
        the keys of the boot under way arrive now."""
        if delay < 0:
            raise UsageError(f"keys-late: delay must be 0 or more, not {delay}")
        if delay:
            self._keys_late[node_key] = float(delay)
            return
        self._keys_late.pop(node_key, None)
        node = self._nodes.get(node_key)
        for w in node.workers if node is not None else ():
            w.keys_at = 0.0

    def rotate_keys_on_reboot(self, node_key: str, on: bool = True) -> None:
        """Fault: every later reboot (a heal) gives the node's workers new host keys, published in
        their guest attributes as on a re-imaged VM. A recreate always gives new keys."""
        if on:
            self._rotate_on_reboot.add(node_key)
        else:
            self._rotate_on_reboot.discard(node_key)

    def wrong_host_key(self, node_key: str, worker: int) -> None:
        """Fault: one worker's SSH server presents a host key its guest attributes do not publish
        (a man in the middle, or a VM that is not the one the API describes), until a recreate."""
        w = self._worker(node_key, worker)

        async def run() -> None:
            w.served_key = asyncssh.generate_private_key("ssh-ed25519", comment="not the published key")
            if w.listening:
                await self._close_ssh(w)
                await self._listen_ssh(w)

        self._call(run)

    def published_host_keys(self, node_key: str, worker: int) -> dict[str, str]:
        """The worker's host keys as its guest attributes publish them: key type -> base64 data."""
        kind, data = self._worker(node_key, worker).host_key.export_public_key("openssh").decode().split()[:2]
        return {kind: data}

    # ---- queries -----------------------------------------------------------------------------

    def worker_home(self, node_key: str, worker: int) -> Path:
        return self._worker(node_key, worker).home

    def host_root(self, node_key: str, worker: int) -> Path:
        return self._worker(node_key, worker).host_root

    def ips(self, node_key: str) -> list[str]:
        return [w.ip for w in self._node(node_key).workers]

    def metadata_address(self, node_key: str, worker: int) -> str:
        """host:port of this worker's metadata server (its GCE_METADATA_HOST)."""
        return f"{self._worker(node_key, worker).ip}:{self.metadata_port}"

    def metadata_instance(self, node_key: str, worker: int) -> md.Instance:
        """What this worker's metadata server answers with now."""
        return self._instance(self._worker(node_key, worker))

    def is_listening(self, node_key: str, worker: int) -> bool:
        return self._worker(node_key, worker).listening

    def connections(self, node_key: str, worker: int) -> int:
        """Open SSH connections to this worker."""
        return len(self._worker(node_key, worker).conns)

    def accepted(self, node_key: str, worker: int) -> int:
        """SSH connections this worker has accepted (open or closed) since it was created."""
        return self._worker(node_key, worker).accepted

    def sessions(self, node_key: str, worker: int) -> int:
        """SSH sessions (one command each) opened on this worker's connections since it was created."""
        return self._worker(node_key, worker).sessions

    def startup_status(self, node_key: str, worker: int) -> int | None:
        """The startup script's exit status on this worker, or None while it has not ended."""
        f = self._worker(node_key, worker).home / STARTUP_EXIT
        try:
            return int(f.read_text().strip())
        except (OSError, ValueError):
            return None

    def pids(self, node_key: str | None = None, worker: int | None = None) -> list[int]:
        """Live processes started by the given worker, node, or (None) any worker of this instance."""
        if node_key is None:
            return self._marked(f"{self.instance}/", prefix=True)
        if worker is None:
            return self._marked(f"{self.instance}/{node_key}/", prefix=True)
        return self._marked(self._worker(node_key, worker).marker)

    def cgroup_pids(self) -> list[int] | None:
        """Processes in the cgroups of the workers booted now: what they started, once its shell
        ran its first line (ENTER_CGROUP), so a job's processes but maybe not a shell just
        started; None when a worker has no cgroup (then `pids()` is the way). One small read per
        worker, where `pids()` reads the environment of every process of the machine: for a
        test that looks many times a second."""
        found: list[int] = []
        for node in list(self._nodes.values()):
            for w in list(node.workers):
                if w.cgroup is None:
                    return None
                try:
                    text = (w.cgroup / "cgroup.procs").read_text()
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENODEV):
                        continue  # removed with its node (ENODEV: while the read was under way)
                    raise
                found += [int(pid) for pid in text.split()]
        return found

    def cgroups_cpu(self) -> float | None:
        """CPU seconds used so far by the processes of every worker's cgroup (cgroup v2's
        cpu.stat, the dead and the detached ones too, while they were in it); None without
        cgroup v2 cgroups. For benchmarks: reaped-children times count a process only when it
        is reaped, a session's shell at its end and a detached job never."""
        total = 0.0
        for node in list(self._nodes.values()):
            for w in list(node.workers):
                if (used := cgroups.usage_seconds(w.cgroup)) is None:
                    return None
                total += used
        return total

    # ---- internals: thread bridge ------------------------------------------------------------

    def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        loop = self._loop
        if loop is None:
            raise UsageError("simulated hosts are not started: call Hosts.start() first")
        if threading.current_thread() is self._thread:
            raise RuntimeError("Hosts methods are synchronous; do not call them from its loop")

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=_CALL_TIMEOUT)

    def spawn_task(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _node(self, node_key: str) -> _Node:
        node = self._nodes.get(node_key)
        if node is None:
            raise UsageError(f"no simulated hosts for node {node_key!r}: boot it first")
        return node

    def _worker(self, node_key: str, worker: int) -> HostWorker:
        node = self._node(node_key)
        if not 0 <= worker < len(node.workers):
            raise UsageError(f"node {node_key!r} has workers 0..{len(node.workers) - 1}, not {worker}")
        return node.workers[worker]

    # ---- internals: addresses ----------------------------------------------------------------

    def _free_port(self, avoid: int = 0) -> int:
        # A port nothing is bound to on any address (a wildcard test bind conflicts with every
        # specific one), outside the ephemeral range so outgoing connections will not take it.
        for _ in range(200):
            port = random.randint(*_PORT_RANGE)
            if port == avoid:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
            finally:
                s.close()
        raise UsageError("no free TCP port found for the simulated workers' SSH servers")

    def _slot(self, node_key: str) -> int:
        if node_key not in self._slots:
            used = set(self._slots.values())
            free = [s for s in range(256) if s not in used]
            if not free:
                raise UsageError("the simulator holds at most 256 nodes")
            self._slots[node_key] = free[0]
        return self._slots[node_key]

    def _ip(self, slot: int, index: int) -> str:
        return f"127.{self._base}.{slot}.{index}"

    # ---- internals: node lifecycle (on the loop) ---------------------------------------------

    async def _boot(self, node_key: str, node_id: str, n: int, script: str | None,
                    chips: int, vfio: bool, metadata: dict[str, str]) -> list[str]:
        if node_key in self._nodes:
            await self._destroy(node_key)
        slot = self._slot(node_key)
        safe = node_key.replace("/", "__")
        node_dir = self.root / "nodes" / f"{slot:03d}-{safe}"
        shutil.rmtree(node_dir, ignore_errors=True)
        node = _Node(self, node_key, node_id, slot, node_dir, script, chips, vfio, metadata)
        for i in range(n):
            wdir = node_dir / f"worker-{i}"
            w = HostWorker(node, i, self._ip(slot, i), wdir, None)
            w.cgroup = self._make_cgroup(f"{slot:03d}-{i}")
            w.home.mkdir(parents=True)
            self._new_host_key(w)
            self._keys_arrive_later(w)
            self._make_host_root(w)
            node.workers.append(w)
        for w in node.workers:  # every worker's hosts file names all of them
            hostfaults.write_hosts_file(w)
        self._nodes[node_key] = node
        try:
            for w in node.workers:
                await self._listen(w)
        except BaseException:
            await self._destroy(node_key)
            raise
        self._start_startup_scripts(node)
        return [w.ip for w in node.workers]

    @staticmethod
    def _new_host_key(w: HostWorker) -> None:
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"{w.node.key} worker {w.index}")
        w.host_key, w.served_key = key, None
        key.write_private_key(str(w.dir / "ssh_host_ed25519_key"))
        key.write_public_key(str(w.dir / "ssh_host_ed25519_key.pub"))

    def _keys_arrive_later(self, w: HostWorker) -> None:
        """At a boot: with the keys-late fault, no client key is accepted for a while."""
        w.keys_at = time.monotonic() + self._keys_late.get(w.node.key, 0.0) / self.speed

    def _make_cgroup(self, name: str) -> Path | None:
        if self._cgroups is None:
            return None
        path = self._cgroups / name
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        return path if (path / "cgroup.procs").exists() else None

    def _make_host_root(self, w: HostWorker) -> None:
        dev = w.host_root / "dev"
        (w.host_root / "tmp").mkdir(parents=True, exist_ok=True)
        (dev / "shm").mkdir(parents=True, exist_ok=True)
        # What a real host's kernel gives each boot: remote.sh tells by it that nothing of an
        # attempt launched in an earlier boot can be alive.
        kernel = w.host_root / "proc" / "sys" / "kernel" / "random"
        kernel.mkdir(parents=True, exist_ok=True)
        (kernel / "boot_id").write_text(w.boot_id + "\n")
        chips = w.node.chips_per_host
        if w.node.vfio:  # v5+ hosts expose chips through VFIO
            (dev / "vfio").mkdir(exist_ok=True)
            for c in range(chips):
                (dev / "vfio" / str(c)).touch()
        else:
            for c in range(chips):
                (dev / f"accel{c}").touch()
        if len(w.node.workers) > w.index:  # made again on a reboot: faults that outlive it
            hostfaults.reapply(self, w)

    async def _ssh_fault(self, w: HostWorker, mode: str) -> None:
        await self._close_blackhole(w)
        await self._close_ssh(w)
        w.ssh_mode = mode
        if mode == "":
            await self._listen_ssh(w)
        elif mode == "hang":
            async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                w.held.append(writer)  # kept open and silent until the fault ends

            w.blackhole = await asyncio.start_server(hold, w.ip, self.ssh_port, reuse_address=True)

    async def _drop(self, w: HostWorker) -> None:
        for conn in list(w.conns):
            conn.abort()

    async def _close_blackhole(self, w: HostWorker) -> None:
        server, w.blackhole = w.blackhole, None
        for writer in w.held:
            writer.close()
        w.held.clear()
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _listen(self, w: HostWorker) -> None:
        await self._listen_ssh(w)
        await self._listen_md(w)

    async def _listen_ssh(self, w: HostWorker) -> None:
        try:
            w.acceptor = await asyncssh.listen(
                w.ip, self.ssh_port,
                server_factory=lambda: WorkerServer(self, w),
                server_host_keys=[w.served_key or w.host_key],
                encoding=None,
                line_editor=False,
                reuse_address=True,
            )
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {self.ssh_port} on {w.ip} is in use: the simulated "
                                 f"worker {w.index} of {w.node.key} cannot listen; restart the simulator")
            raise

    async def _listen_md(self, w: HostWorker) -> None:
        try:
            w.md_server = await asyncio.start_server(
                lambda r, wr: md.serve(r, wr, lambda: self._instance_async(w)),
                w.ip, self.metadata_port, reuse_address=True)
        except OSError as e:
            await self._unlisten(w)
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {self.metadata_port} on {w.ip} is in use: the metadata server "
                                 f"of worker {w.index} of {w.node.key} cannot listen; restart the simulator")
            raise

    def _instance(self, w: HostWorker) -> md.Instance:
        source = self.metadata_source
        inst = source(w.node.key, w.index) if source is not None else None
        if inst is None:  # no world (Hosts on its own), or the world no longer has the node
            parts = w.node.key.split("/")
            project, zone = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
            inst = md.make_instance(project=project, zone=zone, node_id=w.node.node_id, worker=w.index,
                                    metadata=w.node.metadata)
        if not inst.ip:
            inst = dataclasses.replace(inst, ip=w.ip)
        return inst

    async def _instance_async(self, w: HostWorker) -> md.Instance:
        if self.metadata_source is None:
            return self._instance(w)
        # The source may take the world's lock: a thread keeps the loop (and SSH) serving. The
        # reads made in one turn of the loop share one thread call: every relay of a pod waits on
        # its metadata server, each looking again every 50 ms (metadata.py), on the same beat.
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[md.Instance] = loop.create_future()
        self._looks.append((w, fut))
        if len(self._looks) == 1:
            loop.call_soon(self._read_looks)
        return await fut

    def _read_looks(self) -> None:
        looks, self._looks = self._looks, []

        def read() -> list[md.Instance | BaseException]:
            out: list[md.Instance | BaseException] = []
            for w, _ in looks:
                try:
                    out.append(self._instance(w))
                except Exception as exc:  # noqa: BLE001 - handed to that read's caller
                    out.append(exc)
            return out

        def answer(done: asyncio.Future[list[md.Instance | BaseException]]) -> None:
            if done.cancelled():
                got: list[md.Instance | BaseException] = [ConnectionAbortedError("the simulator is stopping")] * len(looks)
            elif (error := done.exception()) is not None:
                got = [error] * len(looks)
            else:
                got = done.result()
            for (_, fut), one in zip(looks, got, strict=True):
                if fut.done():
                    continue
                if isinstance(one, RuntimeError):  # the simulator stops under this request
                    one = ConnectionAbortedError(f"the simulator is stopping: {one}")
                if isinstance(one, BaseException):
                    fut.set_exception(one)
                else:
                    fut.set_result(one)

        try:
            asyncio.get_running_loop().run_in_executor(None, read).add_done_callback(answer)
        except RuntimeError as exc:  # the simulator stops under these requests: its executor is gone
            for _, fut in looks:
                if not fut.done():
                    fut.set_exception(ConnectionAbortedError(f"the simulator is stopping: {exc}"))

    async def _unlisten(self, w: HostWorker) -> None:
        await self._close_blackhole(w)
        w.ssh_mode = ""
        server, w.md_server = w.md_server, None
        if server is not None:
            server.close()
        await self._close_ssh(w)

    async def _close_ssh(self, w: HostWorker) -> None:
        """Stop listening for SSH on this worker and drop its open connections."""
        acceptor, w.acceptor = w.acceptor, None
        if acceptor is not None:
            acceptor.close()
            with contextlib.suppress(Exception):
                await acceptor.wait_closed()
        for conn in list(w.conns):
            conn.abort()
        w.conns.clear()

    async def _down(self, node: _Node) -> None:
        for w in node.workers:
            await self._unlisten(w)
            if w.startup is not None:
                w.startup.cancel()
        # Every worker's processes in one scan of /proc: a scan per worker made a pod's
        # maintenance O(workers x processes), past a minute for 256 workers.
        self._kill_marked(self._node_marker(node), prefix=True)

    def _node_marker(self, node: _Node) -> str:
        """The start of every marker of the node's workers (`HostWorker.marker`)."""
        return f"{self.instance}/{node.key}/"

    async def _up(self, node: _Node, reboot: bool) -> None:
        down = [w for w in node.workers if not w.listening and not w.ssh_mode]
        if not down:
            return  # already up: nothing rebooted
        for w in down:
            if reboot:
                w.boot_id = str(uuid.uuid4())
                shutil.rmtree(w.host_root / "tmp", ignore_errors=True)
                shutil.rmtree(w.host_root / "dev" / "shm", ignore_errors=True)
                self._make_host_root(w)
                if node.key in self._rotate_on_reboot:
                    self._new_host_key(w)
                self._keys_arrive_later(w)
            await self._listen(w)
        if reboot:
            self._start_startup_scripts(node)

    async def _destroy(self, node_key: str) -> None:
        node = self._nodes.pop(node_key, None)
        if node is None:
            return
        await self._down(node)
        for w in node.workers:
            hostfaults.unmount_all(w)
            cgroups.remove(w.cgroup)
        shutil.rmtree(node.dir, ignore_errors=True)

    async def _close(self) -> None:
        for key in list(self._nodes):
            await self._down(self._nodes[key])
            for w in self._nodes[key].workers:
                hostfaults.unmount_all(w)
        self._kill_marked(f"{self.instance}/", prefix=True)
        # let sessions and startup watchers see their processes die, then drop the rest
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)
        rest = [t for t in self._tasks if not t.done()]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=5)
        # the threads that asked metadata_source (a metadata request may still be in one)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.get_running_loop().shutdown_default_executor(), 5)

    def _start_startup_scripts(self, node: _Node) -> None:
        if not node.startup_script:
            return
        for w in node.workers:
            (w.home / STARTUP_EXIT).unlink(missing_ok=True)  # before boot() returns
            w.startup = self.spawn_task(self._run_startup(w, node.startup_script))

    async def _run_startup(self, w: HostWorker, script: str) -> None:
        # A TPU VM runs the startup-script metadata on every boot, on every worker, in the
        # background, logging to the journal; here the log is a file in the home.
        path = w.dir / "startup-script.sh"
        path.write_text(script)
        with open(w.home / STARTUP_LOG, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                "/bin/bash", "-c", ENTER_CGROUP + 'exec /bin/bash "$0"', str(path), cwd=w.home, env=self.worker_env(w),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        rc = await proc.wait()
        with contextlib.suppress(OSError):
            (w.home / STARTUP_EXIT).write_text(f"{rc}\n")

    # ---- internals: processes ----------------------------------------------------------------

    def worker_env(self, w: HostWorker, client_env: Mapping[str, str] | None = None) -> dict[str, str]:
        bindir = os.path.dirname(sys.executable)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(w.home),
            "USER": self.ssh_user,
            "LOGNAME": self.ssh_user,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TPUWATCH_HOST_ROOT": str(w.host_root),
            # simulator only: precheck.sh's dns check reads this worker's own hosts file
            "TPUWATCH_SIM_HOSTS": str(hostfaults.hosts_path(w)),
        }
        # what Debian's sshd accepts from the client (AcceptEnv LANG LC_*)
        for k, v in (client_env or {}).items():
            if k == "LANG" or k.startswith("LC_"):
                env[k] = v
        # Google's client libraries and the startup scripts read the metadata server from here.
        env["GCE_METADATA_HOST"] = f"{w.ip}:{self.metadata_port}"
        env.update(self.extra_env)
        env["TPUWATCH_SIM_WORKER_ID"] = str(w.index)  # a real VM reads agent-worker-number
        if w.cgroup is not None:
            env["TPUWATCH_SIM_PROCS"] = str(w.cgroup / "cgroup.procs")
        env[MARKER] = w.marker
        return env

    @staticmethod
    def _marked(value: str, *, prefix: bool = False) -> list[int]:
        """Pids whose environment holds MARKER=value (or a value starting with it)."""
        needle = f"\0{MARKER}={value}".encode()
        if not prefix:
            needle += b"\0"
        me = os.getpid()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    data = b"\0" + f.read() + b"\0"
            except OSError:
                continue  # gone, or not ours; zombies read as empty
            if needle in data:
                found.append(int(entry))
        return found

    def _kill_marked(self, value: str, *, prefix: bool = False) -> None:
        # Repeat until a scan finds nothing: a dying shell may fork once more between scans.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = self._marked(value, prefix=prefix)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
