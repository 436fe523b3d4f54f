"""Running one remote command on many workers at once over OpenSSH.

A transport turns (node, worker, remote command) into an argv; `run_on_workers` runs those in
parallel threads with each worker's stdin, and `stream` follows one long-running session.
Results are per worker (exit code, stdout, stderr tail) with ssh's own failures told apart
from the remote command's: unreachable (exit 255 and a connection error), authentication,
a changed host key, a timeout. A client that times out is ended with its whole process
group (proc.py). The gcloud transport (gcloud.py) runs gcloud once per node incarnation, then
this OpenSSH.

OpenSSH pins host keys per node id: its own known_hosts file (in the state dir) and
`HostKeyAlias=tpuwatch-<node id>-w<i>`. With `pins` (hostkeys.py) the keys come from the
workers' guest attributes and ssh checks strictly; a worker that publishes none is trusted on
first use (`StrictHostKeyChecking=accept-new`), as is every worker without `pins`.

With `iap` (ssh.iap), OpenSSH reaches each worker through Identity-Aware Proxy TCP forwarding,
as `gcloud compute tpus tpu-vm ssh --tunnel-through-iap` does: a ProxyCommand `gcloud compute
start-iap-tunnel <worker VM> %p --listen-on-stdin`, the VM named by its guest attribute
`hostname` (it changes with every node). No external IP or route to the VPC is needed.

With `multiplex` (ssh.multiplex), each worker gets one OpenSSH master connection
(ControlMaster=auto, ControlPersist) and every probe, launch, stop or follow is a channel on it,
not a new handshake (mux.py: the socket paths and their cleanup).

This module knows nothing of what the command does (see protocol.py) nor of jobs or policy.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import selectors
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from tpuwatch.errors import ConfigError
from tpuwatch.model import Login, NodeSnapshot, WorkerEndpoint
from tpuwatch.workers import hostkeys, mux
from tpuwatch.workers import proc as procgroup

# "credentials": the gcloud transport's Google credentials are expired or refused (gcloud.py)
Failure = Literal["", "unreachable", "auth", "host_key", "timeout", "missing", "credentials"]
SSH_ERROR = 255
STDERR_TAIL = 4000
MAX_PARALLEL = 64

# ssh's own words for a refused host key and a refused login; any other exit 255 is a worker
# that could not be reached
_HOST_KEY = re.compile(
    r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed|Host key for .* has changed",
    re.IGNORECASE,
)
_AUTH = re.compile(
    r"Permission denied \(|Too many authentication failures|Load key .*:|no such identity"
    r"|UNPROTECTED PRIVATE KEY FILE|bad permissions",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class SshResult:
    """One worker's answer to one command."""

    worker: int
    address: str
    exit_code: int | None  # None when it timed out or ssh could not be started
    stdout: str
    stderr: str  # the tail
    failure: Failure = ""  # "" when ssh worked: exit_code is then the remote command's
    message: str = ""  # for failures: what happened and what to do

    @property
    def ok(self) -> bool:
        return self.failure == "" and self.exit_code == 0

    @property
    def reached(self) -> bool:
        """ssh connected and the remote command ran to its end."""
        return self.failure == ""

    def stderr_tail(self, lines: int = 5) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


class Transport(Protocol):
    """How to reach a worker: an argv for (node, worker, remote command)."""

    name: str
    internal_ip: bool  # connect to the workers' internal addresses (ssh.internal_ip)

    def check(self) -> None:
        """Raise ConfigError for a local setup that cannot work (an unreadable key)."""

    def argv(self, node: NodeSnapshot, worker: WorkerEndpoint, remote_command: str) -> list[str]: ...

    def describe_failure(self, node: NodeSnapshot, worker: WorkerEndpoint, failure: Failure,
                         stderr: str) -> str: ...

    @property
    def pins(self) -> hostkeys.PinnedHostKeys | None:
        """The host keys the API publishes, pinned (None: trust on first use)."""

    def prepare(self, node: NodeSnapshot) -> SshResult | None:
        """Get ready to connect to this node incarnation: None when ready, else why not."""

    def direct_target(self, worker: WorkerEndpoint) -> tuple[str, int] | None:
        """(host, port) that ssh connects to for this worker, when a TCP probe of it tells
        whether ssh can; None when the path is one a probe cannot see."""

    def login(self, node: NodeSnapshot) -> Login | None:
        """The user this transport logs in as on the node, once known."""

    def remember(self, login: Login) -> None:
        """A login an earlier watcher learned (the journal's), so it need not be learned again."""

    def drop_connection(self, node: NodeSnapshot, worker: WorkerEndpoint) -> None:
        """A call to this worker timed out or could not reach it: end its shared connection, if
        any, so that the next call connects afresh instead of waiting on a dead one."""

    def close(self) -> None:
        """End every shared connection this transport opened (on exit)."""


def check_identity_file(path: str, key: str = "ssh.identity_file") -> None:
    """ConfigError naming `key` when the private key cannot be used by ssh."""
    if not path:
        return
    p = Path(os.path.expanduser(path))
    if not p.exists():
        raise ConfigError(
            f"{key}: {str(p)!r} does not exist; point it at your private key "
            "(gcloud makes ~/.ssh/google_compute_engine on its first `gcloud compute tpus tpu-vm ssh`)"
        )
    if p.is_dir():
        raise ConfigError(f"{key}: {str(p)!r} is a directory, not a private key file")
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"{key}: {str(p)!r} is not readable ({exc.strerror}); fix its permissions") from None
    st = p.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        # ssh silently ignores such a key and then fails with "Permission denied"
        raise ConfigError(
            f"{key}: {str(p)!r} is readable by other users (mode {st.st_mode & 0o777:o}) and ssh "
            f"will refuse it; run `chmod 600 {shlex.quote(str(p))}`"
        )


def classify(exit_code: int | None, stderr: str) -> Failure:
    """Tell ssh's own failures from the remote command's exit status."""
    if exit_code != SSH_ERROR:
        return ""
    if _HOST_KEY.search(stderr):
        return "host_key"
    if _AUTH.search(stderr):
        return "auth"
    # 255 is ssh's own status; remote.sh never exits 255, so any 255 means ssh failed. It is
    # "unreachable" (retry later) unless the text says it is a configuration problem.
    return "unreachable"


# A node -> its workers' Compute Engine instance names, in worker order (TpuAdapter.instance_names)
InstanceNames = Callable[[NodeSnapshot], Sequence[str]]


def instance_name(instances: InstanceNames, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
    """`worker`'s VM name on `node` ("" until the node names its VMs)."""
    names = instances(node)
    return names[worker.worker_id] if worker.worker_id < len(names) else ""


@dataclass(frozen=True)
class Iap:
    """ssh.iap: the ProxyCommand gcloud itself builds for `--tunnel-through-iap`."""

    instances: InstanceNames
    gcloud: str = "gcloud"

    @staticmethod
    def _node_of(node: NodeSnapshot, worker: WorkerEndpoint) -> NodeSnapshot:
        """The node the worker's VM belongs to: its slice's, in a multislice job."""
        return node.slices[worker.slice] if node.slices and worker.slice < len(node.slices) else node

    def instance(self, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        """The worker's VM name ("" until its node publishes it)."""
        return instance_name(self.instances, self._node_of(node, worker), worker)

    def proxy_command(self, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        part = self._node_of(node, worker)
        words = [self.gcloud, "compute", "start-iap-tunnel", self.instance(node, worker), "%p", "--listen-on-stdin",
                 f"--project={part.project}", f"--zone={part.zone}", "--verbosity=warning"]
        return "ProxyCommand=" + " ".join(w if w == "%p" else shlex.quote(w) for w in words)


class OpenSsh:
    """The system `ssh` client, one connection per worker."""

    name = "openssh"

    def __init__(
        self,
        *,
        known_hosts: str | Path,
        user: str = "",
        identity_file: str = "",
        port: int = 22,
        internal_ip: bool = False,
        connect_timeout: float = 10.0,
        options: Sequence[str] = (),
        server_alive_interval: int = 15,
        server_alive_count: int = 3,
        binary: str = "ssh",
        multiplex: bool = True,
        control_dir: str | Path | None = None,
        host_keys: hostkeys.HostKeySource | None = None,
        iap: Iap | None = None,
        trust_first_use: bool = True,
    ) -> None:
        self.known_hosts = Path(os.path.expanduser(str(known_hosts)))
        self.iap = iap
        self.user = user or getpass.getuser()  # ssh.user, else the local user, as gcloud does
        self.identity_file = os.path.expanduser(identity_file) if identity_file else ""
        self.port = port
        self.internal_ip = internal_ip
        self.connect_timeout = connect_timeout
        self.options = tuple(options)
        self.server_alive_interval = server_alive_interval
        self.server_alive_count = server_alive_count
        self.binary = binary
        # One master connection per worker; its socket beside the known_hosts file by default
        self.mux = mux.Masters(Path(control_dir) if control_dir else self.known_hosts.parent / "ssh",
                               binary) if multiplex else None
        # the host keys the API publishes, pinned; without them, trust on first use
        self.pins = (hostkeys.PinnedHostKeys(self.known_hosts, host_keys, trust_first_use=trust_first_use)
                     if host_keys is not None else None)

    def login(self, node: NodeSnapshot) -> Login | None:
        """The user ssh is told to log in as: nothing is learned."""
        return Login(node.id, self.user, via=self.name)

    def remember(self, login: Login) -> None:
        """Nothing to remember: the user is the configured one."""

    def prepare(self, node: NodeSnapshot) -> SshResult | None:
        """Nothing to prepare, but through IAP every worker's VM name must be known: gcloud's
        tunnel goes by name (from the guest attribute `hostname`, published once the VM is up)."""
        if self.iap is None:
            return None
        unnamed = [w for w in node.workers if not self.iap.instance(node, w)]
        if not unnamed:
            return None
        w = unnamed[0]
        return SshResult(w.index, "", None, "", "", "unreachable",
                         f"ssh.iap: {node.name} (id {node.id}) does not publish its workers' instance names yet "
                         f"(guest attribute hostname, worker {w.worker_id}), and the IAP tunnel goes by name; "
                         "tried again next tick")

    def direct_target(self, worker: WorkerEndpoint) -> tuple[str, int] | None:
        """The worker's address and ssh.port, as ssh connects to them; None through IAP (no
        path to the port but the tunnel)."""
        host = worker.address(self.internal_ip)
        return (host, self.port) if host and self.iap is None else None

    @classmethod
    def from_config(cls, ssh: Mapping[str, Any], state_dir: Path, *, instances: InstanceNames | None = None,
                    **kw: Any) -> OpenSsh:
        """`instances`: the workers' VM names, which ssh.iap needs."""
        iap = None
        if ssh.get("iap", False):
            if instances is None:
                raise ConfigError("ssh.iap: this command cannot look up the workers' instance names; "
                                  "use watch, check, run or precheck")
            iap = Iap(instances)
        return cls(
            iap=iap,
            known_hosts=ssh.get("known_hosts") or (Path(state_dir) / "known_hosts"),
            user=ssh.get("user", ""),
            identity_file=ssh.get("identity_file", ""),
            port=int(ssh.get("port", 22)),
            internal_ip=bool(ssh.get("internal_ip", False)),
            connect_timeout=float(ssh.get("connect_timeout", 10.0)),
            options=tuple(ssh.get("options", ())),
            multiplex=bool(ssh.get("multiplex", True)),
            control_dir=Path(state_dir) / "ssh",
            trust_first_use=bool(ssh.get("trust_first_use", True)),
            **kw,
        )

    def check(self) -> None:
        check_identity_file(self.identity_file)
        parent = self.known_hosts.parent
        try:
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"ssh.known_hosts: cannot create {str(parent)!r} ({exc.strerror}); set "
                "TPUWATCH_STATE_DIR or ssh.known_hosts to a writable place"
            ) from None
        if self.mux is not None:
            self.mux.check()

    def drop_connection(self, node: NodeSnapshot, worker: WorkerEndpoint, *, user: str = "") -> None:
        if self.mux is not None:
            self.mux.drop(self._control_key(node, worker, user or self.user))

    def close(self) -> None:
        if self.mux is not None:
            self.mux.close()

    def _control_key(self, node: NodeSnapshot, worker: WorkerEndpoint, user: str) -> str:
        # The node id is in the alias: a recreated node behind the same address never shares
        # the old node's connection, whose host key was checked for that id.
        return f"{user}@{worker.address(self.internal_ip)}:{self.port}/{self.host_alias(node, worker)}"

    @staticmethod
    def host_alias(node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        return hostkeys.alias(node, worker)

    def argv(self, node: NodeSnapshot, worker: WorkerEndpoint, remote_command: str, *,
             user: str = "") -> list[str]:
        """`user`: log in as this user instead of ssh.user (the one gcloud learned, gcloud.py)."""
        address = worker.address(self.internal_ip)
        alias = self.host_alias(node, worker)
        strict = "yes" if self.pins is not None and self.pins.strict(alias) else "accept-new"
        opts = [
            "BatchMode=yes",
            f"ConnectTimeout={max(1, int(self.connect_timeout))}",
            f"ServerAliveInterval={self.server_alive_interval}",
            f"ServerAliveCountMax={self.server_alive_count}",
            f"UserKnownHostsFile={self.known_hosts}",
            "GlobalKnownHostsFile=/dev/null",
            f"HostKeyAlias={alias}",
            f"StrictHostKeyChecking={strict}",
            "HashKnownHosts=no",
            "UpdateHostKeys=no",
            "CheckHostIP=no",
            "LogLevel=ERROR",
        ]
        if self.identity_file:
            opts.append("IdentitiesOnly=yes")
        if self.mux is not None:
            opts += self.mux.options(self._control_key(node, worker, user or self.user))
        if self.iap is not None and self.iap.instance(node, worker):
            opts += [self.iap.proxy_command(node, worker), "ProxyUseFdpass=no"]
        argv = [self.binary, "-T", "-p", str(self.port), "-l", user or self.user]
        if self.identity_file:
            argv += ["-i", self.identity_file]
        # User options first: for ssh the first value of an option wins, so the user can
        # override ours (say ConnectTimeout) but not drop the host-key pinning by accident.
        for o in self.options:
            argv += ["-o", o]
        for o in opts:
            argv += ["-o", o]
        argv += ["--", address, remote_command]
        return argv

    def describe_failure(self, node: NodeSnapshot, worker: WorkerEndpoint, failure: Failure,
                         stderr: str) -> str:
        where = f"worker {worker.index} of {node.name}"
        address = worker.address(self.internal_ip)
        last = _last_line(stderr)
        if failure == "host_key" and self.pins is not None:
            return self.pins.describe_mismatch(node, worker, address, stderr)
        if failure == "host_key":
            alias = self.host_alias(node, worker)
            return (
                f"{where} (node id {node.id}, {address}) presented a host key that differs from "
                f"the one pinned for this node id in {self.known_hosts}. A recreated node gets "
                "a new id (and its new keys are accepted once), so this is the same node with a "
                "new key: check who changed the VM. If you trust the new key, remove the old one with "
                f"`ssh-keygen -R {alias} -f {shlex.quote(str(self.known_hosts))}` and retry"
            )
        if failure == "auth":
            return (
                f"{where} ({address}) refused the login as {self.user!r}"
                + (f" with {self.identity_file}" if self.identity_file else "")
                + f" ({last}); check ssh.user and ssh.identity_file, and that the public key is "
                "in the project or node metadata (or use ssh.transport = \"gcloud\" with OS Login)"
            )
        if failure == "timeout":
            return (f"{where} ({address}) did not finish in time ({last or 'no output'}); a slow link or a "
                    "loaded worker may need a longer ssh.command_timeout")
        if failure == "missing":
            return f"cannot run {self.binary!r}: {last}; install the OpenSSH client"
        hint = "" if self.internal_ip else "; if tpuwatch runs inside the VPC, set ssh.internal_ip = true"
        return (
            f"{where} is unreachable at {address}:{self.port} ({last or 'ssh exit 255'}); "
            f"check the node is READY, the firewall allows SSH{hint}"
        )


def prepare(transport: Transport, node: NodeSnapshot) -> SshResult | None:
    """A transport that prepares each node first (gcloud.py): None when ready, else why not."""
    return transport.prepare(node)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("@tpuwatch")]
    return lines[-1] if lines else ""


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def run_one(
    transport: Transport,
    node: NodeSnapshot,
    worker: WorkerEndpoint,
    stdin: bytes,
    *,
    remote_command: str,
    timeout: float,
) -> SshResult:
    argv = transport.argv(node, worker, remote_command)
    address = worker.address(transport.internal_ip)
    try:
        # A group of its own, ended whole on timeout (proc.py)
        done = procgroup.run(argv, stdin, timeout)
    except OSError as exc:
        return SshResult(worker.index, address, None, "", str(exc), "missing",
                         transport.describe_failure(node, worker, "missing", str(exc)))
    if done.timed_out:
        err = _decode(done.stderr)
        transport.drop_connection(node, worker)  # it may be waiting on a dead shared connection
        return SshResult(worker.index, address, None, _decode(done.stdout), err[-STDERR_TAIL:], "timeout",
                         transport.describe_failure(node, worker, "timeout", err))
    err = _decode(done.stderr)
    failure = classify(done.returncode, err)
    if failure == "unreachable":
        transport.drop_connection(node, worker)
    message = transport.describe_failure(node, worker, failure, err) if failure else ""
    return SshResult(worker.index, address, done.returncode, _decode(done.stdout),
                     err[-STDERR_TAIL:], failure, message)


def run_on_workers(
    transport: Transport,
    node: NodeSnapshot,
    workers: Sequence[WorkerEndpoint],
    stdin: bytes | Callable[[WorkerEndpoint], bytes],
    *,
    remote_command: str,
    timeout: float,
) -> list[SshResult]:
    """Run `remote_command` on every worker at once; results in the order of `workers`."""
    if not workers:
        return []
    failed = prepare(transport, node)
    if failed is not None:  # the transport could not get ready (gcloud failed): no worker tried
        return [replace(failed, worker=w.index, address=w.address(transport.internal_ip))
                for w in workers]

    def one(w: WorkerEndpoint) -> SshResult:
        data = stdin(w) if callable(stdin) else stdin
        return run_one(transport, node, w, data, remote_command=remote_command, timeout=timeout)

    if len(workers) == 1:
        return [one(workers[0])]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(workers)),
                            thread_name_prefix="tpuwatch-ssh") as pool:
        return list(pool.map(one, workers))


class Stream:
    """One long-running remote command whose stdout is handed over as it arrives.

    With `keep_open`, its stdin stays open after the script: `send` writes request lines to
    the command while it runs (remote.sh `wait` answers probes so).
    """

    def __init__(self, transport: Transport, node: NodeSnapshot, worker: WorkerEndpoint,
                 stdin: bytes, *, remote_command: str, keep_open: bool = False) -> None:
        self._transport = transport
        self._node = node
        self._worker = worker
        self._stdin = stdin
        self._keep_open = keep_open
        self._argv = transport.argv(node, worker, remote_command)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._writable = False  # the script is written and stdin is still open

    def send(self, data: bytes) -> bool:
        """Write `data` to the command's stdin (`keep_open`); False when it cannot take it now:
        not started or ended, or a pipe so full that ssh is not reading it (never blocks)."""
        with self._lock:
            proc = self._proc
            if not self._writable or self._closed or proc is None or proc.stdin is None:
                return False
            try:
                return os.write(proc.stdin.fileno(), data) == len(data)
            except OSError:  # BlockingIOError (full) or BrokenPipeError (ssh gone)
                return False

    def run(self, on_data: Callable[[bytes], None]) -> SshResult:
        """Run to the end (or until close()), calling on_data for every chunk of stdout."""
        address = self._worker.address(self._transport.internal_ip)
        with self._lock:
            if self._closed:
                return SshResult(self._worker.index, address, None, "", "", "timeout", "closed")
            try:
                proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as exc:
                return SshResult(self._worker.index, address, None, "", str(exc), "missing",
                                 self._transport.describe_failure(self._node, self._worker, "missing", str(exc)))
            self._proc = proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        err_chunks: list[bytes] = []
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        try:
            proc.stdin.write(self._stdin)
            proc.stdin.flush()
            if self._keep_open:
                with self._lock:
                    os.set_blocking(proc.stdin.fileno(), False)
                    self._writable = not self._closed
            else:
                proc.stdin.close()
        except OSError:
            pass  # ssh died at once; its stderr says why
        self._stdin = b""  # sent: a channel held for days need not keep its script
        # Both pipes in this one thread, read only once readable: a channel that waits holds
        # no second thread and no read buffer (one watcher holds one per job).
        with selectors.DefaultSelector() as sel:
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            drain_until: float | None = None  # stdout ended: stderr is read for a few seconds more
            while sel.get_map():
                timeout = None if drain_until is None else max(0.0, drain_until - time.monotonic())
                ready = sel.select(timeout)
                if not ready and drain_until is not None:
                    break  # a child of ssh holds its stderr open
                for key, _ in ready:
                    try:
                        chunk = os.read(key.fd, 65536)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fd)
                        if key.fd == out_fd:
                            drain_until = time.monotonic() + 5.0
                    elif key.fd == out_fd:
                        on_data(chunk)
                    else:
                        err_chunks.append(chunk)
        rc = proc.wait()
        with self._lock:
            self._writable = False
            with contextlib.suppress(OSError):
                proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
        err = _decode(b"".join(err_chunks))
        failure = classify(rc, err)
        if self._closed and rc != 0:
            failure = failure or "timeout"
        msg = self._transport.describe_failure(self._node, self._worker, failure, err) if failure else ""
        return SshResult(self._worker.index, address, rc, "", err[-STDERR_TAIL:], failure, msg)

    def close(self) -> None:
        """End the session from our side (the remote job is not touched)."""
        with self._lock:
            self._closed = True
            self._writable = False
            popen = self._proc
        if popen is not None and popen.poll() is None:
            procgroup.end_group(popen)  # run() reaps it; many channels close in one grace


def port_open(host: str, port: int, timeout: float) -> bool:
    """True when a TCP connection to host:port is accepted within `timeout` (no bytes sent)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
