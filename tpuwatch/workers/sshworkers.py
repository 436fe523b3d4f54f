"""`SshWorkers`: the job on the workers over SSH (the `Workers` port).

`SshWorkers` joins the pieces: a transport (ssh.py) carries the worker-side script
(protocol.py, remote.sh) to every selected worker of a node in parallel, and the answers come
back as model values. Launch is idempotent per attempt and retried when a connection drops,
so a retry never starts a job twice; probe is one round trip per worker, on the worker's open
follow channel when it has one (ends.py).

Host keys are pinned from the workers' guest attributes (hostkeys.py) when a source of them is
given: a key that does not match is read again from the API before anything is decided, and
still unmatched it raises JobFailed (exit 1: a person must decide), naming the worker and the
fingerprints. A refused login is a result, not an error: an "unreachable" probe with
`login_refused`, since keys reach a new VM after sshd listens (the policy decides how long to
wait). Unreachable workers are results too: the caller decides.
This module knows nothing of the TPU API, the journal or the recovery policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuwatch.errors import ConfigError, JobFailed
from tpuwatch.model import (
    Checkpoint,
    Login,
    NodeSnapshot,
    WorkerEndpoint,
    WorkerProbe,
    megascale_from_runtime,
)
from tpuwatch.workers import hostkeys, protocol
from tpuwatch.workers.ends import AttemptEnds
from tpuwatch.workers.gcloud import GcloudSsh, raise_if_gcloud_fatal
from tpuwatch.workers.protocol import FollowEnd, LaunchResult, StopResult
from tpuwatch.workers.ssh import (
    InstanceNames,
    OpenSsh,
    SshResult,
    Stream,
    Transport,
    prepare,
    run_on_workers,
)


def transport_from_config(ssh: Mapping[str, Any], state_dir: Path,
                          host_keys: hostkeys.HostKeySource | None = None,
                          instances: InstanceNames | None = None) -> Transport:
    """The transport [ssh] transport names: OpenSSH, or gcloud once per node then OpenSSH.
    `host_keys`: the workers' published host keys, pinned by the OpenSSH that connects;
    `instances`: their VM names, which an IAP tunnel (ssh.iap) goes by."""
    if ssh.get("transport", "openssh") == "gcloud":
        return GcloudSsh.from_config(ssh, state_dir, host_keys=host_keys, instances=instances)
    return OpenSsh.from_config(ssh, state_dir, host_keys=host_keys, instances=instances)


SSH_TRIES = 4  # SSH sends of one launch to a worker that refused or lost it
RETRY_WAIT = 1.0  # seconds before the second send; doubling after


class SshWorkers:
    """ports.Workers over SSH for one job."""

    def __init__(
        self,
        transport: Transport,
        *,
        job: str,
        command: str,
        env: Mapping[str, str] | None = None,
        workers: str | Sequence[int] = "all",
        stop_grace: float = 30.0,
        timeout: float = 60.0,
        ssh_tries: int = SSH_TRIES,
        retry_wait: float = RETRY_WAIT,
        sleep: Callable[[float], None] = time.sleep,
        notify_signal: str = "SIGTERM",
        checkpoint_dir: str = "",
        on_listing: Callable[[NodeSnapshot, str], None] | None = None,
        log_patterns: Sequence[str] = (),
        megascale_abort: bool = False,
    ) -> None:
        self.transport = transport
        self.job = job
        self.command = command
        self.env = dict(env or {})
        self.selection: str | tuple[int, ...] = workers if isinstance(workers, str) else tuple(workers)
        self.stop_grace = stop_grace
        self.timeout = timeout
        self.ssh_tries = max(1, ssh_tries)
        self.retry_wait = retry_wait
        self._sleep = sleep
        # A local job.checkpoint_dir is on the workers: the first selected worker's probe lists
        # it, and the listing goes to `on_listing` (checkpoints.WorkerCheckpoints.feed).
        self.checkpoint_dir = checkpoint_dir
        self.on_listing = on_listing
        self.notify_signal = notify_signal
        # What each probe searches in the new bytes of the attempt's log (runtime signatures)
        self.log_patterns = tuple(log_patterns)
        self.megascale_abort = megascale_abort
        self.ends = AttemptEnds(transport, job, patterns=self.log_patterns)
        if command:
            protocol.check_template(command)

    @classmethod
    def from_config(cls, cfg: Any, host_keys: hostkeys.HostKeySource | None = None,
                    instances: InstanceNames | None = None, **kw: Any) -> SshWorkers:
        """From a tpuwatch.config.Config: [job], [ssh] and recovery.stop_grace. `host_keys`: the
        workers' published host keys (TpuAdapter.host_keys), pinned instead of trusted on first use;
        `instances`: their VM names (TpuAdapter.instance_names), for ssh.iap."""
        return cls(
            transport_from_config(cfg.ssh, Path(cfg.state_dir), host_keys, instances),
            job=cfg.job_name,
            command=cfg.job["command"],
            env=cfg.job["env"],
            workers=cfg.job["workers"],
            stop_grace=float(cfg.recovery["stop_grace"]),
            timeout=float(cfg.ssh["command_timeout"]),
            notify_signal=cfg.get("maintenance.notify_signal"),
            megascale_abort=bool(cfg.job["megascale_abort_on_hang"]),
            **kw,
        )

    # -- which workers ----------------------------------------------------------------------
    def endpoints(self, node: NodeSnapshot) -> list[WorkerEndpoint]:
        """The selected workers of `node` (job.workers), in index order; of a multislice job,
        those on the slices that are READY (the others cannot be reached)."""
        if isinstance(self.selection, str):  # "all"
            chosen = sorted(node.workers, key=lambda w: w.index)
        else:
            by_index = {w.index: w for w in node.workers}
            missing = [i for i in self.selection if i not in by_index]
            if missing:
                raise ConfigError(
                    f"job.workers: node {node.name} has workers 0..{len(node.workers) - 1}, "
                    f"not {', '.join(map(str, missing))}"
                )
            chosen = [by_index[i] for i in sorted(self.selection)]
        if node.slices:
            up = set(node.reachable_workers)
            chosen = [w for w in chosen if w in up]
        return chosen

    def _endpoint(self, node: NodeSnapshot, worker: int) -> WorkerEndpoint:
        for w in node.workers:
            if w.index == worker:
                return w
        raise ConfigError(f"node {node.name} has no worker {worker}")

    def run_scripts(self, node: NodeSnapshot, workers: Sequence[WorkerEndpoint],
                    scripts: bytes | Callable[[WorkerEndpoint], bytes], timeout: float | None = None) -> list[SshResult]:
        """A worker-side script (one for all, or one per worker) run by protocol.REMOTE_COMMAND
        on every worker at once, as run_commands does."""
        def framed(w: WorkerEndpoint) -> bytes:
            return protocol.framed(scripts(w) if callable(scripts) else scripts)

        return self.run_commands(node, workers, framed, remote_command=protocol.REMOTE_COMMAND,
                                 timeout=timeout or self.timeout)

    def run_commands(self, node: NodeSnapshot, workers: Sequence[WorkerEndpoint],
                     stdin: bytes | Callable[[WorkerEndpoint], bytes], *, remote_command: str,
                     timeout: float) -> list[SshResult]:
        """`remote_command` on every worker at once, host keys pinned; raises what no retry fixes.

        A host key that does not match may be a new one the API publishes: the keys are read
        again and those workers asked once more (ssh refused before the login, so nothing ran).
        """
        pins = self._ready(node, workers)
        results = run_on_workers(self.transport, node, workers, stdin, remote_command=remote_command, timeout=timeout)
        mismatched = [i for i, r in enumerate(results) if r.failure == "host_key"]
        if mismatched and pins is not None:
            pins.refresh(node)
            again = run_on_workers(self.transport, node, [workers[i] for i in mismatched], stdin,
                                   remote_command=remote_command, timeout=timeout)
            for i, r in zip(mismatched, again, strict=True):
                results[i] = r
        for r in results:
            raise_if_fatal(r)
        return results

    def _ready(self, node: NodeSnapshot, workers: Sequence[WorkerEndpoint]) -> hostkeys.PinnedHostKeys | None:
        """Check the transport's settings and pin the workers' host keys; the pins, if any."""
        self.transport.check()
        pins = self.transport.pins
        if pins is not None:
            pins.prepare(node, workers)
        return pins

    def take_notes(self) -> list[str]:
        """What the person watching should know, once (a node trusted on first use)."""
        pins = self.transport.pins
        return pins.take_notes() if pins is not None else []

    # -- ports.Workers ----------------------------------------------------------------------
    def probe(self, node: NodeSnapshot) -> list[WorkerProbe]:
        """running / exited(code) / absent / unreachable for every selected worker.

        A worker whose follow channel is open is asked on it (ends.py: no new channel, no ssh
        process); every other worker, and one whose channel does not answer this request in
        time or answers it garbled, over SSH as always.
        """
        workers = self.endpoints(node)
        first = min((w.index for w in workers), default=None)
        held = self.ends.ask(node, [w.index for w in workers], first if self.checkpoint_dir else None,
                             self.checkpoint_dir)
        rest = [w for w in workers if w.index not in held]
        results = self.run_scripts(node, rest, self.probe_scripts(workers)) if rest else []
        by_worker = {**held, **{r.worker: _probe_of(r) for r in results}}
        listed = self._listed(node, [by_worker[w.index] for w in workers])
        return sorted(listed + self._down(node), key=lambda p: p.worker) if node.slices else listed

    def _down(self, node: NodeSnapshot) -> list[WorkerProbe]:
        """A multislice job's selected workers on slices that are not READY (or on a MIG's VMs
        that are not RUNNING): unreachable, so that no one takes the workers still up for the
        whole job; no ssh is tried to them."""
        if not node.slices:
            return []
        up = {w.index for w in self.endpoints(node)}
        everyone = sorted(node.workers, key=lambda w: w.index) if isinstance(self.selection, str) else [
            w for w in node.workers if w.index in set(self.selection)]
        return [WorkerProbe(w.index, "unreachable", detail=_down_why(node, w)) for w in everyone if w.index not in up]

    def probe_scripts(self, workers: Sequence[WorkerEndpoint]) -> Callable[[WorkerEndpoint], bytes]:
        """The probe script per worker: the first one also lists a local checkpoint_dir."""
        plain = protocol.probe_script(self.job, patterns=self.log_patterns)
        if not self.checkpoint_dir or not workers:
            return lambda w: plain
        first = min(w.index for w in workers)
        listing = protocol.probe_script(self.job, self.checkpoint_dir, self.log_patterns)
        return lambda w: listing if w.index == first else plain

    def probes_of(self, node: NodeSnapshot, results: Sequence[SshResult]) -> list[WorkerProbe]:
        """The probe answers; a checkpoint listing among them goes to `on_listing`."""
        return self._listed(node, [_probe_of(r) for r in results])

    def _listed(self, node: NodeSnapshot, probes: list[WorkerProbe]) -> list[WorkerProbe]:
        for p in probes:
            if p.checkpoint_listing and self.on_listing is not None:
                self.on_listing(node, p.checkpoint_listing)
        return probes

    def launch(self, node: NodeSnapshot, attempt: int, checkpoint: Checkpoint | None,
               clean: bool = False) -> list[LaunchResult]:
        """Start `attempt` on every selected worker; workers whose connection failed are retried.

        Safe to repeat: a worker that already runs (or ran) this attempt is not started again.
        With `clean`, each worker first stops what an older attempt left (processes, device
        holders, a stale libtpu lockfile; `LaunchResult.cleanup`) in the same connection.
        """
        workers = self.endpoints(node)
        slices = len(node.slices) or 1

        def script(w: WorkerEndpoint, then_wait: float | None = None) -> bytes:
            return protocol.launch_script(
                self.job, attempt=attempt, worker=w.worker_id, checkpoint=checkpoint,
                command=protocol.render_command(
                    self.command, checkpoint=checkpoint.path if checkpoint else "",
                    step=checkpoint.step if checkpoint else None, attempt=attempt, worker=w.worker_id,
                    slice=w.slice, slices=slices),
                env={**megascale_env(node, w.slice), **self.env},  # the job's own env wins
                clean_grace=self.stop_grace if clean else None, notify_signal=self.notify_signal,
                slice=w.slice, slices=slices,
                libtpu_args=MEGASCALE_ABORT_FLAGS if node.multislice and self.megascale_abort else (),
                then_wait=then_wait, checkpoint_dir=self.checkpoint_dir, patterns=self.log_patterns)

        timeout = self.timeout + 2 * self.stop_grace + 10 if clean else self.timeout
        done: dict[int, LaunchResult] = {}
        # The first try: each worker's launch session goes on as its follow channel (ends.py).
        # A worker that did not answer is tried again over SSH, up to ssh_tries tries in all.
        pending = self._launch_following(node, attempt, workers, script, timeout, done)
        for n in range(1, self.ssh_tries):
            if not pending:
                break
            self._sleep(self.retry_wait * (2 ** (n - 1)))
            results = self.run_scripts(node, pending, script, timeout)
            retry = []
            for w, r in zip(pending, results, strict=True):
                res, answered = _launch_of(r)
                done[w.index] = res
                # No answer means the connection broke somewhere: the launch may or may not
                # have happened, and asking again is exactly what idempotency is for.
                if not answered:
                    retry.append(w)
            pending = retry
        return [done[w.index] for w in workers]

    def _launch_following(self, node: NodeSnapshot, attempt: int, workers: Sequence[WorkerEndpoint],
                          script: Callable[[WorkerEndpoint, float | None], bytes], timeout: float,
                          done: dict[int, LaunchResult]) -> list[WorkerEndpoint]:
        """The first try of a launch, on sessions that go on as the attempt's follow channels:
        each worker's result goes to `done`, and those that did not answer are returned."""
        self._ready(node, workers)
        failed = prepare(self.transport, node)
        if failed is not None:  # the transport could not get ready (gcloud failed): no worker tried
            answers = {w.index: replace(failed, worker=w.index, address=w.address(self.transport.internal_ip))
                       for w in workers}
        else:
            answers = self.ends.launch(node, attempt, workers, lambda w: script(w, self.ends.poll), timeout,
                                       self.checkpoint_dir)
        pending = []
        for w in workers:
            r = answers.get(w.index)
            if r is None:  # closed after `timeout`: the launch may or may not have happened
                done[w.index] = LaunchResult(w.index, "unreachable", detail=f"no answer within {timeout:g}s")
                pending.append(w)
                continue
            if r.failure != "host_key":  # a key the API may publish anew: the SSH try reads the keys again
                raise_if_fatal(r)
            done[w.index], answered = _launch_of(r)
            if not answered:
                pending.append(w)
        return pending

    def stop(self, node: NodeSnapshot, workers: Sequence[int] | None = None, *,
             wait: bool = True) -> list[StopResult]:
        """TERM the attempt's processes, wait stop_grace, KILL; then device holders and a stale
        libtpu lockfile. `workers` limits it to some worker indices. `wait=False`: answer right
        after the TERM; a detached process on each worker KILLs what is left after stop_grace
        (device holders and the lockfile are left to the next launch's cleanup)."""
        eps = self.endpoints(node)
        if workers is not None:
            eps = [w for w in eps if w.index in set(workers)]
        timeout = self.timeout + (2 * self.stop_grace if wait else 0) + 10
        results = self.run_scripts(node, eps, protocol.stop_script(self.job, self.stop_grace, detach=not wait), timeout)
        out = []
        for r in results:
            if not r.reached:
                out.append(StopResult(r.worker, ok=False, unreachable=True, detail=r.message))
            else:
                out.append(protocol.parse_stop(r.worker, protocol.parse_records(r.stdout)))
        return out

    def port_target(self, node: NodeSnapshot) -> tuple[str, int] | None:
        """Worker 0's SSH address for a TCP probe (of a multislice job, the first worker of a slice
        that is down); None unless OpenSSH connects there directly.

        gcloud (IAP, OS Login) may reach the worker by a path the probe cannot see.
        """
        # a multislice job: the first worker of a slice that is down (the others answer anyway)
        candidates = [w for w in node.workers if not node.slice_of(w).usable] if node.slices else node.workers
        if not candidates:
            return None
        return self.transport.direct_target(min(candidates, key=lambda w: w.index))

    def follow_ends(self, node: NodeSnapshot, attempt: int, workers: Sequence[int],
                    wake: Callable[[], None]) -> None:
        """Hold one follow channel per worker of `workers` while `attempt` runs (ends.py):
        `wake()` the moment one of them ends."""
        eps = [w for w in self.endpoints(node) if w.index in set(workers)]
        self.ends.hold(node, attempt, eps, wake, self.checkpoint_dir)

    def unfollow(self) -> None:
        """Close the follow channels."""
        self.ends.release()

    def close(self) -> None:
        """Close the follow channels and the shared connections (on exit)."""
        self.ends.release()
        self.transport.close()

    # -- who the watcher is on the workers ------------------------------------------------
    def login(self, node: NodeSnapshot) -> Login | None:
        """The user the watcher logs in as on this node incarnation, once known.

        With gcloud it is learned over SSH (OS Login may give another name than the one asked
        for); with OpenSSH it is the user ssh is told to log in as.
        """
        return self.transport.login(node)

    def remember(self, login: Login) -> None:
        """A login learned by an earlier watcher (the journal's): gcloud need not run again."""
        self.transport.remember(login)

    # -- logs -------------------------------------------------------------------------------
    def follow(self, node: NodeSnapshot, worker: int, attempt: int, offset: int,
               on_data: Callable[[bytes], None], poll: float = 0.2) -> tuple[Stream, Callable[[], tuple[SshResult, FollowEnd]]]:
        """A stream of attempt-<n>.log from byte `offset`; returns (stream, run).

        Call run() (blocking) to follow until the attempt ends; stream.close() ends it early.
        """
        self.transport.check()
        ep = self._endpoint(node, worker)
        failed = prepare(self.transport, node)
        if failed is not None:
            raise_if_fatal(failed)
        stream = Stream(self.transport, node, ep, protocol.framed(protocol.follow_script(self.job, attempt, offset, poll)),
                        remote_command=protocol.REMOTE_COMMAND)

        def run() -> tuple[SshResult, FollowEnd]:
            r = stream.run(on_data)
            raise_if_fatal(r)
            end = protocol.parse_follow_end(r.stderr) if r.reached else FollowEnd("")
            return r, end

        return stream, run


# The port a multislice job's slices reach their coordinator on (what Ray sets for JAX too)
MEGASCALE_PORT = "8081"


# [job] megascale_abort_on_hang: on a multislice job, a Megascale hang (no progress for
# --megascale_graph_hang_threshold, 5m by default) ends the job's processes instead of leaving
# them stuck. The flags AXLearn sets for its multislice jobs (axlearn/common/compiler_options.py),
# appended on the worker to the LIBTPU_INIT_ARGS the job would get, each only when that value does
# not set it already (remote.sh, launch).
MEGASCALE_ABORT_FLAGS = ("--megascale_error_reporter_abort_on_hang=true",
                         "--megascale_error_reporter_abort_on_error=true")


def megascale_env(node: NodeSnapshot, slice: int) -> dict[str, str]:
    """What libtpu needs on a worker of slice `slice` to join a multislice job's slices over the
    data-center network: the coordinator (slice 0's first worker), its port, the number of
    slices and this slice's id. {} for one node (its own, or a spare in its place), and for slices whose `tpu-env` already carries
    them (one multislice queued resource): values of ours would override the runtime's, and
    disagree with them where its slice order or coordinator is not ours."""
    if not node.multislice or megascale_from_runtime(node):
        return {}
    first = min((w for w in node.workers if w.slice == 0), key=lambda w: w.index, default=None)
    address = first.internal_ip or first.external_ip if first is not None else ""
    return {"MEGASCALE_COORDINATOR_ADDRESS": address, "MEGASCALE_PORT": MEGASCALE_PORT,
            "MEGASCALE_NUM_SLICES": str(len(node.slices)), "MEGASCALE_SLICE_ID": str(slice)}


def raise_if_fatal(r: SshResult) -> None:
    raise_if_gcloud_fatal(r)
    if r.failure == "host_key":
        raise JobFailed(r.message)
    if r.failure == "missing":
        raise ConfigError(r.message)


def _probe_of(r: SshResult) -> WorkerProbe:
    if r.failure == "auth":
        return WorkerProbe(worker=r.worker, state="unreachable", detail=f"login refused: {r.message}",
                           login_refused=True)
    if not r.reached:
        return WorkerProbe(worker=r.worker, state="unreachable", detail=r.message)
    return protocol.parse_probe(r.worker, protocol.parse_records(r.stdout))


def _launch_of(r: SshResult) -> tuple[LaunchResult, bool]:
    """The worker's answer, and whether it answered at all."""
    if not r.reached:
        return LaunchResult(r.worker, "unreachable", detail=r.message), False
    records = protocol.parse_records(r.stdout)
    res = protocol.parse_launch(r.worker, records)
    if "result" not in records:
        tail = r.stderr_tail(3)
        detail = f"no answer from the worker-side script (exit code {r.exit_code}" + (f": {tail})" if tail else ")")
        return LaunchResult(r.worker, "error", detail=detail), False
    return res, True


def _down_why(node: NodeSnapshot, w: WorkerEndpoint) -> str:
    """Why worker `w` of `node` cannot be reached: its slice's state, or its VM's in a MIG."""
    part = node.slice_of(w)
    states = part.worker_states
    if 0 <= w.worker_id < len(states) and states[w.worker_id] != "READY":
        return f"its VM in slice {w.slice} ({w.node or '-'}) is {states[w.worker_id]}"
    return f"slice {w.slice} ({w.node or '-'}) is {part.state}"


if TYPE_CHECKING:  # mypy checks that SshWorkers still fits the port the tick calls
    from tpuwatch import ports

    def _fits_the_port(w: SshWorkers) -> ports.Workers:
        return w
