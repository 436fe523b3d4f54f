"""The gcloud transport: `gcloud compute tpus tpu-vm ssh` once per node incarnation, then OpenSSH.

What gcloud's TPU ssh does on every call (gcloud 528, command_lib/compute/tpus/tpu_vm/ssh.py):
get the node, refuse a node in an unusable state (exit 1, "This TPU has state ..."), read the
workers' guest attributes, get the Compute project, and with OS Login on (`enable-oslogin`) read
the user's login profile, import the key if it is not there, and log in as the profile's POSIX
name (`alice_example_com`) instead of the local one; without OS Login it adds the key to the
node's `ssh-keys` metadata if the project has not got it. Then it runs ssh, retrying 10 times
5 s apart, and exits with ssh's status: 1 means gcloud failed or the command exited 1.

So one gcloud call per worker per probe costs four or five API calls each and cannot tell its
own failures from the job's. Here gcloud runs once per node id (a new node, a new incarnation),
on worker 0, to prepare the keys and the user; its remote command prints the user the worker
really logged it in as. Every later connection is OpenSSH (ssh.py) as that user with gcloud's
key, pinned and classified as the openssh transport does. gcloud's own failures are told apart:
no `@tpuwatch login` line means the command never ran, and gcloud's words say why.

A slice made through Compute Engine (tpu.api = "compute") is prepared by `gcloud compute ssh` to
its first instance (worker 0) instead (gcloud 528, surface/compute/ssh.py): get the instance and
the project, read the instance's host keys from its guest attributes when `enable-guest-attributes`
is on (then pinned under `compute.<instance id>` in gcloud's own known_hosts, and checked
strictly), OS Login as above, or else add the key to the project's `ssh-keys` (to the instance's
when the project refuses or blocks project keys: then gcloud runs to every instance, since no
other instance reads that one's keys) and wait for it to work; with `--internal-ip`
and no host keys to check, one more ssh confirms the instance id through the metadata server.
Then it runs ssh once (no retries) and exits with ssh's status.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuwatch.cloud.apis import api_of
from tpuwatch.errors import CloudError
from tpuwatch.model import LOGIN_USER, Login, NodeSnapshot, WorkerEndpoint
from tpuwatch.workers import proc as procgroup
from tpuwatch.workers.hostkeys import HostKeySource, PinnedHostKeys
from tpuwatch.workers.ssh import (
    STDERR_TAIL,
    Failure,
    InstanceNames,
    OpenSsh,
    SshResult,
    _decode,
    _last_line,
    classify,
    instance_name,
)

DEFAULT_KEY = "~/.ssh/google_compute_engine"  # the key gcloud makes and uses
PREPARE_WORKER = 0  # keys and the user are node-wide (metadata) or project-wide (OS Login)
LOGIN_RECORD = "@tpuwatch login "
# sshd sets USER and LOGNAME to the account it logged us in as
LEARN_COMMAND = "printf '@tpuwatch login user=%s home=%s\\n' \"${USER:-$(id -un)}\" \"$HOME\""

# gcloud's own failures, in its own words
_CREDENTIALS = re.compile(
    r"problem refreshing your current auth tokens|Reauthentication (failed|required)"
    r"|do not currently have an active account selected|gcloud auth login|invalid_grant"
    r"|Request had invalid authentication credentials|UNAUTHENTICATED",
    re.IGNORECASE,
)
_UNUSABLE = re.compile(
    r"This TPU has (terminal )?state|going through a maintenance event"
    # gcloud compute ssh: a stopped instance has no external IP (or it never had one), or the
    # internal address answers for another instance
    r"|has not been allocated an external IP address|does not have an external IP address"
    r"|unable to confirm ID of the instance",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(r"NOT_FOUND|was not found", re.IGNORECASE)
_PERMISSION = re.compile(r"PERMISSION_DENIED|Permission .* denied on|Required '.*' permission", re.IGNORECASE)
# gcloud compute ssh put the key in the instance's own metadata, not the project's
_INSTANCE_KEY = re.compile(r"Updating instance ssh metadata")
_SSH_EXIT = re.compile(r"\[[^\]]*ssh\] exited with return code \[(\d+)\]")



def parse_login(node_id: str, stdout: str) -> Login | None:
    """The `@tpuwatch login user=... home=...` line of the learn command, or None."""
    for line in stdout.splitlines():
        if not line.startswith(LOGIN_RECORD):
            continue
        fields = dict(part.split("=", 1) for part in line[len(LOGIN_RECORD):].split(" ") if "=" in part)
        user = fields.get("user", "")
        if LOGIN_USER.fullmatch(user):
            return Login(node_id, user, fields.get("home", ""))
    return None


def gcloud_failure(rc: int | None, stderr: str) -> tuple[Failure, str]:
    """Why a prepare run printed no login line: a failure kind and gcloud's own last words.

    "credentials" needs a person (`gcloud auth login`); a node gcloud calls unusable or cannot
    find is "unreachable" (the watcher sees its state through the API); an ssh failure after
    gcloud's own retries is classified from ssh's words.
    """
    last = _gcloud_last(stderr)
    if _CREDENTIALS.search(stderr):
        return "credentials", last
    m = _SSH_EXIT.search(stderr)
    if m is not None:
        return (classify(int(m.group(1)), stderr) or "unreachable"), last
    if _UNUSABLE.search(stderr) or _NOT_FOUND.search(stderr):
        return "unreachable", last
    if _PERMISSION.search(stderr):
        return "credentials", last
    return "unreachable", last


def _gcloud_last(stderr: str) -> str:
    """gcloud's last ERROR, with the ` - reason` lines under it (`Could not fetch resource:` says
    what went wrong on the next line)."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("ERROR:")]
    if not starts:
        return _last_line(stderr)
    said = [lines[starts[-1]]]
    said += itertools.takewhile(lambda ln: ln.startswith("- "), lines[starts[-1] + 1:])
    return " ".join(said)


class GcloudSsh:
    """ssh.transport = "gcloud": gcloud prepares each node incarnation, OpenSSH connects.

    The OpenSSH side is the openssh transport itself (host keys pinned per node id in the job's
    own known_hosts), with the user gcloud logged in as and gcloud's key.
    """

    name = "gcloud"

    def __init__(
        self,
        *,
        openssh: OpenSsh,
        user: str = "",
        identity_file: str = "",
        internal_ip: bool = False,
        connect_timeout: float = 10.0,
        options: tuple[str, ...] = (),
        prepare_timeout: float = 120.0,
        binary: str = "gcloud",
        instances: InstanceNames | None = None,
    ) -> None:
        self.ssh = openssh
        # a Compute Engine slice's instance names in worker order: gcloud compute ssh goes by name
        self.instances = instances
        self.user = user  # asked for; OS Login may swap in another name
        self.identity_file = identity_file
        self.internal_ip = internal_ip
        self.connect_timeout = connect_timeout
        self.options = tuple(options)
        self.prepare_timeout = prepare_timeout
        self.binary = binary
        self.port = openssh.port
        self.prepare_calls = 0  # gcloud runs so far (tests, benchmarks)
        self._logins: dict[str, Login] = {}
        self._last: Login | None = None  # the login learned or remembered last
        self._lock = threading.Lock()

    @property
    def pins(self) -> PinnedHostKeys | None:
        """The OpenSSH side's pinned host keys."""
        return self.ssh.pins

    @classmethod
    def from_config(cls, ssh: Mapping[str, Any], state_dir: Path,
                    host_keys: HostKeySource | None = None, instances: InstanceNames | None = None,
                    **kw: Any) -> GcloudSsh:
        """`host_keys`: pinned by the OpenSSH side, which connects after gcloud prepares;
        `instances`: the workers' VM names, for its IAP tunnel (ssh.iap) and, on a Compute Engine
        slice, the instance `gcloud compute ssh` prepares."""
        key = str(ssh.get("identity_file") or DEFAULT_KEY)
        openssh = OpenSsh.from_config({**ssh, "identity_file": key}, state_dir, host_keys=host_keys,
                                      instances=instances)
        return cls(
            openssh=openssh,
            user=str(ssh.get("user") or ""),
            identity_file=openssh.identity_file,
            internal_ip=bool(ssh.get("internal_ip", False)),
            connect_timeout=float(ssh.get("connect_timeout", 10.0)),
            options=tuple(ssh.get("options", ())),
            # gcloud retries ssh itself (10 x 5 s) while new keys propagate: let it
            prepare_timeout=max(120.0, float(ssh.get("command_timeout", 60.0))),
            instances=instances,
            **kw,
        )

    # -- what the watcher has learned -----------------------------------------------------
    def login(self, node: NodeSnapshot) -> Login | None:
        """The login learned for this node incarnation (a multislice job: or for one of its
        slices, until every slice has one), if any; for a node not READY as a whole (a MIG some
        VMs of which still run) the last one learned, as `_prepare_login` says why."""
        keys = [_incarnation(node), *(_incarnation(part) for part in node.slices)]
        with self._lock:
            known = next((self._logins[k] for k in keys if k in self._logins), None)
            return known if known is not None or node.state == "READY" else self._last

    def remember(self, login: Login) -> None:
        """A login learned earlier (the journal's): no gcloud run for that incarnation."""
        if login.via == "gcloud" and login.node_id:
            with self._lock:
                self._logins.setdefault(login.node_id, login)
                self._last = self._last or login

    def forget(self, node: NodeSnapshot) -> None:
        """Prepare again on next use (the login was refused: keys gone, user changed)."""
        with self._lock:
            self._logins.pop(_incarnation(node), None)

    # -- Transport -----------------------------------------------------------------------
    def check(self) -> None:
        # gcloud creates ~/.ssh/google_compute_engine itself on its first run: only a key that
        # exists and cannot be read is an error here.
        if Path(self.identity_file).exists():
            self.ssh.check()

    def prepare(self, node: NodeSnapshot) -> SshResult | None:
        """Run gcloud once for this node incarnation (then, through IAP, know every worker's VM
        name); None when ready, else the failure."""
        return self._prepare_login(node) or self.ssh.prepare(node)

    def _prepare_login(self, node: NodeSnapshot) -> SshResult | None:
        """gcloud once for this node incarnation; None when ready, else the failure.

        A multislice job: once per slice incarnation (gcloud may put the key in each node's own
        metadata), for the slices that are READY now; the job's login is kept under its own
        incarnation once every slice has one, so a later watcher (cron) runs no gcloud at all.

        Only a node READY as a whole is prepared. A MIG that is not (a VM of it preempted, or
        Google recreating it one VM at a time) may still have VMs that run, to probe and stop:
        those were reached before with the user gcloud logged in as, the account's and the same
        on every incarnation, so the last login learned is used there with no gcloud run. A
        gcloud run on a MIG part-way through a recreate would prepare an incarnation that is
        gone a moment later, and run again for the whole one.
        """
        key = _incarnation(node)
        with self._lock:  # one gcloud run at a time; the other workers' threads wait for it
            if key in self._logins:
                return None
            if not node.slices:
                if node.state != "READY":
                    return self._not_whole(node)
                got = self._prepare_one(node, key)
                if isinstance(got, SshResult):
                    return got
                self._learn(key, got)
                return None
            for part in node.slices:
                part_key = _incarnation(part)
                if part_key in self._logins or part.state != "READY" or not part.workers:
                    continue  # known already, or prepared once it is up
                got = self._prepare_one(part, part_key)
                if isinstance(got, SshResult):
                    return got
                self._learn(part_key, got)
            known = [self._logins.get(_incarnation(part)) for part in node.slices]
            if all(known) and known[0] is not None:
                self._logins[key] = dataclasses.replace(known[0], node_id=key)
            if any(part.reachable and part.workers and _incarnation(part) not in self._logins for part in node.slices):
                return self._not_whole(node)
            return None

    def _learn(self, key: str, login: Login) -> None:
        self._logins[key] = login
        self._last = login

    def _not_whole(self, node: NodeSnapshot) -> SshResult | None:
        """A node not READY as a whole some workers of which can be reached: ready with the last
        login learned; with none, unreachable until the node is READY and gcloud prepares it."""
        if self._last is not None:
            return None
        return SshResult(0, "", None, "", "", "unreachable",
                         f"{node.name} (id {node.id}) is {node.state}: gcloud prepares the login once it is "
                         "READY as a whole, and no login is known before; tried again next tick")

    def _prepare_one(self, node: NodeSnapshot, key: str) -> Login | SshResult:
        """gcloud's ssh to one node's first worker: the login it made, or the failure.

        On a Compute Engine slice where gcloud could put the key in that instance's own metadata
        only (no permission on the project's, or the instance blocks project keys: gcloud says
        "Updating instance ssh metadata"), gcloud goes to every other instance too, since each
        guest agent reads its own instance's keys and the project's, never another instance's.
        """
        workers = sorted(node.workers, key=lambda w: w.index)
        worker = next((w for w in workers if w.index == PREPARE_WORKER), workers[0] if workers else None)
        if worker is None:
            return SshResult(0, "", None, "", "", "unreachable", f"{node.name} has no workers yet")
        got, said = self._run_gcloud(node, worker, key)
        if isinstance(got, SshResult) or not by_instance(node) or not _INSTANCE_KEY.search(said):
            return got
        for other in workers:
            more = self._run_gcloud(node, other, key)[0] if other is not worker else got
            if isinstance(more, SshResult):
                return more
        return got

    def _run_gcloud(self, node: NodeSnapshot, worker: WorkerEndpoint, key: str) -> tuple[Login | SshResult, str]:
        """One gcloud run to `worker`: the login it made or the failure, and what gcloud said."""
        if by_instance(node) and not self._instance(node, worker):
            return SshResult(worker.index, "", None, "", "", "unreachable",
                             f"{node.name} (id {node.id}) does not name its instances yet, and `gcloud compute "
                             "ssh` goes by instance name; tried again next tick"), ""
        self.prepare_calls += 1
        argv = self.prepare_argv(node, worker)
        address = worker.address(self.internal_ip)
        try:
            done = procgroup.run(argv, b"", self.prepare_timeout)
        except OSError as exc:
            return SshResult(worker.index, address, None, "", str(exc), "missing",
                             f"cannot run {self.binary!r}: {exc}; install the Google Cloud CLI"), ""
        out, err = _decode(done.stdout), _decode(done.stderr)
        login = parse_login(key, out) if not done.timed_out else None
        if login is not None:
            return login, err
        if done.timed_out:
            return SshResult(worker.index, address, None, out, err[-STDERR_TAIL:], "timeout",
                             f"`{self._command_words(node, worker)}` did not finish in "
                             f"{self.prepare_timeout:.0f}s ({_gcloud_last(err) or 'no output'}); it is "
                             "ended with every process it started and tried again next tick"), err
        failure, last = gcloud_failure(done.returncode, err)
        return SshResult(worker.index, address, done.returncode, out, err[-STDERR_TAIL:], failure,
                         self._describe_prepare(node, worker, failure, done.returncode, last)), err

    def _instance(self, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        """The Compute Engine instance of `worker` ("" until the slice names its instances)."""
        return instance_name(self.instances, node, worker) if self.instances is not None else ""

    def _command_words(self, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        """The gcloud command that prepares `node`, for messages."""
        verb = " ".join(api_of(node).gcloud_ssh.verb)
        return f"gcloud {verb} {self._target(node, worker)} --zone={node.zone}"

    def _target(self, node: NodeSnapshot, worker: WorkerEndpoint) -> str:
        """What gcloud names to reach `worker`: its own instance, or the slice (with --worker)."""
        return self._instance(node, worker) if by_instance(node) else node.name

    def prepare_argv(self, node: NodeSnapshot, worker: WorkerEndpoint) -> list[str]:
        """`gcloud compute tpus tpu-vm ssh NODE --worker=W` for a TPU API node; for a slice made
        through Compute Engine, `gcloud compute ssh INSTANCE` to the worker's own instance."""
        name = self._target(node, worker)
        verb = [*api_of(node).gcloud_ssh.verb, f"{self.user}@{name}" if self.user else name]
        where = [f"--zone={node.zone}", f"--project={node.project}",
                 *([] if by_instance(node) else [f"--worker={worker.worker_id}"])]
        argv = [self.binary, *verb, *where, f"--command={LEARN_COMMAND}", "--quiet"]
        if self.ssh.iap is not None:
            argv.append("--tunnel-through-iap")
        elif self.internal_ip:
            argv.append("--internal-ip")
        argv.append(f"--ssh-key-file={self.identity_file}")
        # the user's options first: for ssh the first value of an option wins
        flags = ["-T", *[f"-o{o}" for o in self.options], "-oBatchMode=yes",
                 f"-oConnectTimeout={max(1, int(self.connect_timeout))}", "-oLogLevel=ERROR", f"-oPort={self.port}"]
        return argv + [f"--ssh-flag={f}" for f in flags]

    def argv(self, node: NodeSnapshot, worker: WorkerEndpoint, remote_command: str) -> list[str]:
        login = self.login(node)
        if login is None:  # a caller that did not prepare (a log stream): do it now
            self.prepare(node)
            login = self.login(node)
        user = login.user if login is not None else (self.user or self.ssh.user)
        return self.ssh.argv(node, worker, remote_command, user=user)

    def drop_connection(self, node: NodeSnapshot, worker: WorkerEndpoint) -> None:
        login = self.login(node)
        self.ssh.drop_connection(node, worker, user=login.user if login is not None else self.user)

    def close(self) -> None:
        self.ssh.close()

    def direct_target(self, worker: WorkerEndpoint) -> tuple[str, int] | None:
        """None: gcloud (IAP, OS Login) may reach the worker by a path a TCP probe cannot see."""
        return None

    def describe_failure(self, node: NodeSnapshot, worker: WorkerEndpoint, failure: Failure,
                         stderr: str) -> str:
        login = self.login(node)
        if failure == "auth" and login is not None:
            self.forget(node)  # prepare again next time: gcloud adds the key back
            return (f"worker {worker.index} of {node.name} refused the login as {login.user!r} that gcloud "
                    f"prepared ({_last_line(stderr)}); gcloud prepares the node again on the next try")
        return self.ssh.describe_failure(node, worker, failure, stderr)

    def _describe_prepare(self, node: NodeSnapshot, worker: WorkerEndpoint, failure: Failure, rc: int | None,
                          last: str) -> str:
        said = f"gcloud exited {rc}: {last}" if last else f"gcloud exited {rc}"
        cmd = f"`{self._command_words(node, worker)}`"
        if failure == "credentials":
            return (f"{cmd} cannot use your Google credentials ({said}); run `gcloud auth login` "
                    "(or fix the account's permissions) and tpuwatch goes on by itself")
        if failure == "auth":
            return (f"{cmd} could not log in to worker {worker.index} ({said}); check OS Login "
                    "(roles/compute.osAdminLogin) or the key in ssh.identity_file")
        if failure == "host_key":
            return f"{cmd} refused worker {worker.index}'s host key ({said})"
        return f"{cmd} did not reach worker {worker.index} ({said}); tried again next tick"


def by_instance(node: NodeSnapshot) -> bool:
    """gcloud reaches this slice's workers one VM each by instance name (a slice made through
    Compute Engine: `gcloud compute ssh INSTANCE`), not by the slice's name and --worker: the
    API that read it says (cloud/apis.py)."""
    return api_of(node).gcloud_ssh.by_instance


def _incarnation(node: NodeSnapshot) -> str:
    return node.id or f"{node.zone}/{node.name}"


def raise_if_gcloud_fatal(r: SshResult) -> None:
    """Expired or missing Google credentials: a person must run `gcloud auth login` (exit 3)."""
    if r.failure == "credentials":
        raise CloudError(r.message)


__all__ = ["GcloudSsh", "Login", "gcloud_failure", "parse_login", "raise_if_gcloud_fatal"]
