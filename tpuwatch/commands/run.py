"""`tpuwatch run -c tpuwatch.toml`: launch the job once on every worker and follow it to its end.

How it begins and how it ends are the policy's (policy/once.py: `run_start`, `attempt_end`);
this module is the flow between them: the cleanup, the checks, the launch, the log streams.

One attempt and no recovery (that is `watch`): get the node, clean up the workers, find the
latest complete checkpoint, launch attempt n+1 everywhere (n read from the workers), stream
worker 0's log (every worker's with --all-logs, prefixed `[wN]`), and end when the job ends.
If the same attempt already runs on every worker (a detached earlier `run`), it is followed,
not restarted. Ctrl-C detaches; --stop-on-exit stops the job instead.

Exit codes: 0 worker 0 exited 0 (or detached by Ctrl-C); 1 the job failed, a worker is
unreachable or the node is not usable (a person or `tpuwatch watch` must act: exit 3 is kept
for the cloud API itself, as everywhere); 2 bad config (unknown placeholder, unreadable key);
3 the cloud API (TPU or Compute Engine) or the checkpoint bucket cannot be used.
This module holds the command's flow; SSH lives in tpuwatch.workers, the API in tpuwatch.cloud.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click

from tpuwatch.commands.common import node_as_run
from tpuwatch.durations import human
from tpuwatch.errors import JobFailed, NotFoundError
from tpuwatch.model import Checkpoint, NodeSnapshot, WorkerProbe
from tpuwatch.policy.once import UNREACHABLE_POLLS, attempt_end, run_start
from tpuwatch.workers.protocol import FollowEnd
from tpuwatch.workers.ssh import Stream
from tpuwatch.workers.sshworkers import SshWorkers

HELP = """Launch the job once on every worker from the latest complete checkpoint, and
follow it to its end (no recovery: that is `tpuwatch watch`).

\b
Steps: stop what is left of earlier attempts on every worker (the process group, TPU device
holders, a stale /tmp/libtpu_lockfile), find the newest complete checkpoint in
[job] checkpoint_dir, launch attempt n+1 on all workers with {checkpoint} {step}
{attempt} {worker} substituted, then stream worker 0's log (--all-logs: every worker,
lines prefixed [wN]). If an attempt already runs on every worker (an earlier run that
was detached), that attempt is followed instead of relaunched.

\b
Ctrl-C detaches: the job keeps running on the workers (logs in
~/.tpuwatch/<job>/attempt-<n>.log there) and `tpuwatch run` follows it again;
--stop-on-exit stops it instead (exit 130).

Exit codes: 0 worker 0 exited 0 (the other workers are then stopped) or detached;
1 a worker exited non-zero (named, with its code), a worker is unreachable, or the TPU is
not READY; 2 bad config (e.g. unreadable ssh.identity_file); 3 cloud API error.
"""

MAX_POLL = 5.0


class Output:
    """Where the run's words go: notes on stderr, job log lines on stdout; JSON lines with --json."""

    def __init__(self, *, as_json: bool = False, write: Callable[[str], None] | None = None,
                 note_write: Callable[[str], None] | None = None) -> None:
        self.as_json = as_json
        self._write = write or _printer(sys.stdout)
        self._note = note_write or _printer(sys.stderr)
        self._lock = threading.Lock()

    def note(self, text: str, event: str = "note", **fields: Any) -> None:
        with self._lock:
            if self.as_json:
                self._write(json.dumps({"event": event, "message": text, **fields}))
            else:
                self._note(f"tpuwatch: {text}")

    def log(self, worker: int, line: str, prefixed: bool) -> None:
        with self._lock:
            if self.as_json:
                self._write(json.dumps({"event": "log", "worker": worker, "line": line}))
            else:
                self._write(f"[w{worker}] {line}" if prefixed else line)


def _printer(stream: Any) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return write


@dataclass
class _Follower:
    """One worker's log stream, reconnected from the last byte when the connection drops."""

    worker: int
    prefixed: bool
    offset: int = 0
    end: FollowEnd | None = None
    buf: bytes = b""
    stream: Stream | None = None
    thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    code: int  # 0 success, 1 failed
    message: str
    worker: int | None = None
    exit_code: int | None = None


def judge(probes: Sequence[WorkerProbe], attempt: int, lead_end: FollowEnd | None,
          unreachable_polls: dict[int, int], *, lead: int = 0,
          limit: int = UNREACHABLE_POLLS) -> Verdict | None:
    """Has the attempt ended? The policy's end classifier for one attempt with no recovery
    (policy/once.py `attempt_end`, its rows `RUN_ROWS`), in the run's terms.
    `unreachable_polls` carries the per-worker miss counts between calls."""
    lead_exit = lead_end.exit_code if lead_end is not None and lead_end.result == "ok" else None
    end, missed = attempt_end(probes, attempt, lead_exit, unreachable_polls, lead=lead, limit=limit)
    unreachable_polls.clear()
    unreachable_polls.update(missed)
    if end is None:
        return None
    return Verdict(0 if end.ok else 1, end.message, end.worker, end.exit_code)


class Runner:
    """The flow of `tpuwatch run` for one node, given its workers and checkpoint directory."""

    def __init__(
        self,
        workers: SshWorkers,
        *,
        checkpoints: Any = None,  # tpuwatch.checkpoints.CheckpointDir, or None
        checkpoint_label: str = "",
        out: Output | None = None,
        all_logs: bool = False,
        stop_on_exit: bool = False,
        poll: float = 2.0,
        debug: bool = False,
        reconnect_wait: float = 1.0,
        prechecker: Any = None,  # tpuwatch.workers.precheck.Prechecker, or None (checks off)
    ) -> None:
        self.workers = workers
        self.prechecker = prechecker
        self.checkpoints = checkpoints
        self.checkpoint_label = checkpoint_label
        self.out = out or Output()
        self.all_logs = all_logs
        self.stop_on_exit = stop_on_exit
        self.poll = poll
        self.debug = debug
        self.reconnect_wait = reconnect_wait
        self._closing = threading.Event()
        self._ended = threading.Event()
        self._followers: list[_Follower] = []
        self._live: int | None = None  # the attempt that may run on the workers, once known

    # -- the whole run ----------------------------------------------------------------------
    def run(self, node: NodeSnapshot) -> int:
        attempt: int | None = None
        self._closing.clear()
        self._ended.clear()
        self._followers = []
        self._live = None
        try:
            attempt = self._prepare(node)
            return self._follow(node, attempt)
        except KeyboardInterrupt:
            if attempt is None and self._live is None:
                self.out.note("interrupted before the launch: nothing was started", event="interrupted")
                return 130
            return self._interrupted(node, attempt)
        finally:
            self._close_followers()

    def _prepare(self, node: NodeSnapshot) -> int:
        """The attempt to follow: the one already running everywhere, or a new one launched."""
        endpoints = self.workers.endpoints(node) if node.usable else []
        probes = self.workers.probe(node) if endpoints else []
        start = run_start(node, len(endpoints), probes)
        if start.message:
            raise JobFailed(start.message)
        attempt = start.attempt
        if start.row == "run_follow":
            self._live = attempt
            self.out.note(f"attempt {attempt} already runs on all {len(probes)} workers; following "
                          "it (Ctrl-C detaches)", event="attached", attempt=attempt)
            return attempt
        self._start(node, attempt)
        return attempt

    def _start(self, node: NodeSnapshot, attempt: int) -> None:
        # Scan first so that a bad checkpoint_dir or missing credentials fail before anything
        # is touched; scan again when the cleanup stopped a job (it may have saved on TERM).
        checkpoint = self._latest_checkpoint()
        if self._stop_all(node, "cleaning up the workers", fail_on_leftover=True):
            checkpoint = self._latest_checkpoint(quiet=True)
        self._precheck(node)
        self._live = attempt
        results = self.workers.launch(node, attempt, checkpoint)
        bad = [r for r in results if not r.started]
        if bad:
            self.out.note(f"launch failed on {len(bad)} of {len(results)} workers; stopping the others")
            self._stop_all(node, "", quiet=True)
            raise JobFailed("launch failed: " + "; ".join(r.describe() for r in bad))
        where = (f"from step {checkpoint.step} ({checkpoint.path})" if checkpoint else "fresh (no checkpoint)")
        self.out.note(f"attempt {attempt} launched on {len(results)} worker(s) {where}",
                      event="launched", attempt=attempt,
                      checkpoint=checkpoint.path if checkpoint else None,
                      step=checkpoint.step if checkpoint else None,
                      workers=[r.worker for r in results])

    def _precheck(self, node: NodeSnapshot) -> None:
        """The environment checks, after the cleanup (which fixes what can be fixed): a worker
        that fails one is not launched on; `run` does not recover it, `watch` would."""
        if self.prechecker is None:
            return
        from tpuwatch.workers.precheck import failing_lines, summary

        report = self.prechecker.run(node, context="launch")
        self.out.note(summary(report), event="precheck", ok=report.ok)
        if not report.ok:
            raise JobFailed("environment checks failed, nothing launched: " + "; ".join(failing_lines(report))
                            + " (see `tpuwatch precheck`; skip a check with [precheck] skip)")

    def _latest_checkpoint(self, quiet: bool = False) -> Checkpoint | None:
        if self.checkpoints is None:
            if not quiet:
                self.out.note("job.checkpoint_dir is not set: the job starts fresh")
            return None
        scan = self.checkpoints.scan()
        latest: Checkpoint | None = scan.latest
        if quiet:
            return latest
        if self.debug:
            for line in scan.explain():
                self.out.note(line, event="checkpoint_scan")
        if latest is None:
            skipped = len(scan.skipped)
            why = f"; {skipped} candidate(s) skipped (--debug says why)" if skipped and not self.debug else ""
            self.out.note(f"no complete checkpoint in {self.checkpoint_label}: fresh start{why}",
                          event="checkpoint", checkpoint=None)
        return latest

    def _stop_all(self, node: NodeSnapshot, what: str, *, quiet: bool = False,
                  fail_on_leftover: bool = False, workers: Sequence[int] | None = None) -> bool:
        """Stop the job everywhere; True when some job process was running and was stopped."""
        results = self.workers.stop(node, workers)
        for r in results:
            worth_saying = r.stopped or r.device_holders or r.libtpu_lockfile not in ("absent", "")
            if r.unreachable or r.leftover or (worth_saying and not quiet):
                self.out.note(r.describe(), event="stop", worker=r.worker)
        lost = [r for r in results if r.unreachable]
        stuck = [r for r in results if r.leftover or (not r.ok and not r.unreachable)]
        if lost and fail_on_leftover:
            raise JobFailed(f"{what}: " + "; ".join(r.detail for r in lost))
        if stuck and fail_on_leftover:
            raise JobFailed(f"{what}: " + "; ".join(r.describe() for r in stuck)
                            + "; stop these processes on the workers (sudo kill -9) and retry")
        return any(r.stopped for r in results)

    # -- following --------------------------------------------------------------------------
    def _follow(self, node: NodeSnapshot, attempt: int) -> int:
        eps = [w.index for w in self.workers.endpoints(node)]
        followed = eps if self.all_logs else [eps[0]]
        for w in followed:
            f = _Follower(worker=w, prefixed=self.all_logs)
            t = threading.Thread(target=self._follow_one, args=(node, attempt, f),
                                 name=f"tpuwatch-follow-w{w}", daemon=True)
            t.start()
            f.thread = t
            self._followers.append(f)
        misses: dict[int, int] = {}
        started = time.monotonic()
        lead = self._followers[0]
        while True:
            self._ended.wait(self.poll)
            self._ended.clear()
            verdict = judge(self.workers.probe(node), attempt, lead.end, misses, lead=lead.worker)
            if verdict is None:
                continue
            elapsed = human(time.monotonic() - started)
            if verdict.code == 0:
                self._stop_all(node, "", quiet=True)
                self._drain()
                self.out.note(f"{verdict.message} after {elapsed}; the other workers are stopped",
                              event="end", exit_code=0, attempt=attempt)
                return 0
            self._stop_all(node, "", quiet=True)
            self._drain()
            self.out.note(f"{verdict.message}; every worker of attempt {attempt} is stopped",
                          event="end", exit_code=verdict.exit_code, worker=verdict.worker, attempt=attempt)
            log = f"~/.tpuwatch/{self.workers.job}/attempt-{attempt}.log"
            raise JobFailed(f"{verdict.message}; its log is {log} on worker {verdict.worker}"
                            if verdict.worker is not None else verdict.message)

    def _follow_one(self, node: NodeSnapshot, attempt: int, f: _Follower) -> None:
        def on_data(chunk: bytes) -> None:
            f.offset += len(chunk)
            f.buf += chunk
            *lines, f.buf = f.buf.split(b"\n")
            for line in lines:
                self.out.log(f.worker, line.decode("utf-8", errors="replace"), f.prefixed)

        wait = self.reconnect_wait
        try:
            while not self._closing.is_set():
                try:
                    stream, run = self.workers.follow(node, f.worker, attempt, f.offset, on_data)
                    f.stream = stream
                    if self._closing.is_set():
                        return
                    result, end = run()
                except Exception as exc:  # a fatal ssh error: the main loop's probe reports it
                    f.errors.append(str(exc))
                    return
                if end.result:
                    f.end = end
                    return
                f.errors.append(result.message or result.stderr_tail(1))
                if self._closing.wait(wait):
                    return
                wait = min(wait * 2, 10.0)
        finally:
            if f.buf:
                self.out.log(f.worker, f.buf.decode("utf-8", errors="replace"), f.prefixed)
                f.buf = b""
            self._ended.set()

    def _drain(self, timeout: float = 5.0) -> None:
        """Let the streams print what the stopped workers wrote last."""
        deadline = time.monotonic() + timeout
        for f in self._followers:
            if f.thread is not None:
                f.thread.join(max(0.0, deadline - time.monotonic()))

    def _close_followers(self) -> None:
        self._closing.set()
        for f in self._followers:
            if f.stream is not None:
                f.stream.close()
        for f in self._followers:
            if f.thread is not None:
                f.thread.join(5)

    def _interrupted(self, node: NodeSnapshot, attempt: int | None) -> int:
        attempt = attempt if attempt is not None else self._live
        self._close_followers()
        if self.stop_on_exit:
            self.out.note(f"interrupted: stopping attempt {attempt} on every worker (--stop-on-exit)")
            self._stop_all(node, "", quiet=True)
            self.out.note(f"attempt {attempt} stopped", event="stopped", attempt=attempt)
            return 130
        self.out.note(
            f"detached: attempt {attempt} keeps running on the workers (logs in "
            f"~/.tpuwatch/{self.workers.job}/attempt-{attempt}.log on each); run `tpuwatch run` "
            "again to follow it, or `tpuwatch watch` to keep it alive", event="detached", attempt=attempt)
        return 0


# -- the click command ------------------------------------------------------------------------


EPILOG = """\b
Examples:
  tpuwatch run -c tpuwatch.toml                  # stream worker 0's log
  tpuwatch run -c tpuwatch.toml --all-logs       # every worker's log
  tpuwatch run -c tpuwatch.toml --stop-on-exit   # Ctrl-C stops the job too
"""


@click.command(name="run", help=HELP, epilog=EPILOG)
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default="tpuwatch.toml", show_default=True, help="The job's tpuwatch.toml.")
@click.option("--project", help="GCP project (default: config, env, gcloud).")
@click.option("--zone", help="Zone, e.g. us-central2-b (default: config, env, gcloud).")
@click.option("--all-logs", is_flag=True, help="Stream every worker's log, lines prefixed [wN].")
@click.option("--stop-on-exit", is_flag=True,
              help="On Ctrl-C (or SIGTERM) stop the job instead of leaving it running.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines: notes, log lines and the end.")
@click.pass_context
def command(ctx: click.Context, config_path: Path, project: str | None, zone: str | None,
            all_logs: bool, stop_on_exit: bool, as_json: bool) -> int:
    from tpuwatch.cloud.location import resolve
    from tpuwatch.config import load_config
    from tpuwatch.wiring import slice_reader

    debug = bool((ctx.obj or {}).get("debug"))
    cfg = load_config(config_path)
    checkpoints: Any = None
    on_vm: dict[str, Any] = {}
    label = cfg.job["checkpoint_dir"]
    if label:
        from tpuwatch.checkpoints import CheckpointDir, WorkerCheckpoints

        checkpoints = CheckpointDir(label, cfg.job["checkpoint_layout"])
        if not label.startswith("gs://"):  # a path on the TPU VM: read by the probe, on the worker
            checkpoints = WorkerCheckpoints(label, cfg.job["checkpoint_layout"])
            on_vm = {"checkpoint_dir": checkpoints.root, "on_listing": checkpoints.feed}
    workers = SshWorkers.from_config(cfg, host_keys=lambda n: zone_api(n.zone).host_keys(n.name),
                                     instances=lambda n: zone_api(n.zone).instance_names(n),
                                     **on_vm)
    workers.transport.check()  # an unreadable key is exit 2 before any call
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None
    zone_api = slice_reader(cfg, loc.project)  # one per zone: instance names are read once per node id
    node = node_as_run(cfg, zone_api(loc.zone).get_node)
    if node is None:
        raise NotFoundError(
            f"no TPU named {cfg.tpu_name} in {loc.project}/{loc.zone} (tpu.name in {config_path}); "
            "create it, or fix --project/--zone"
        )
    prechecker = None
    if cfg.precheck["enabled"]:
        from tpuwatch.workers.precheck import Prechecker

        prechecker = Prechecker.from_config(cfg, workers)
    runner = Runner(workers, checkpoints=checkpoints, checkpoint_label=label, prechecker=prechecker,
                    out=Output(as_json=as_json), all_logs=all_logs, stop_on_exit=stop_on_exit,
                    poll=min(float(cfg.recovery["poll_interval"]), MAX_POLL), debug=debug)
    with _sigterm_as_interrupt():
        try:
            return runner.run(node)
        finally:
            workers.close()  # the shared SSH connections end with the run


class _sigterm_as_interrupt:
    """SIGTERM behaves like Ctrl-C while the run follows the job (detach or --stop-on-exit)."""

    def __enter__(self) -> None:
        self._old: Any = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handler)

    @staticmethod
    def _handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)

