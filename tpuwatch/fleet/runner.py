"""Run several jobs in one watcher; each is the usual tick loop, none can stop the others.

- One thread per job (`JobRunner`): its config is loaded and checked in that thread, its journal
  and lock are its own (a job another process watches is shown as `busy` and picked up when that
  process goes away), and everything it raises ends that job alone, shown with its error.
- At most TICK_SLOTS jobs tick at once (their SSH rounds, checks and API calls); a wait between
  ticks (follow channels, port probes) holds no slot.
- Node reads: one ListNodes per project and zone per poll (cloud/tpu/zonenodes.py); for Compute
  Engine jobs one instances list, and one MIG list, per project and zone per poll
  (cloud/compute/zoneinstances.py). A job's steady wait ends on its zone's poll grid (wall time, a
  multiple of its poll interval), so the jobs of a zone tick together and share that list; a
  job recovering ticks on its own schedule.
- The audit log: each job reads through the shared cache (cloud/auditcache.py) of its project,
  kept in the state dir of the first job of that project, so a project sees one query per
  15 s however many jobs this watcher (and any other) holds.
- `--config-dir`: looked at every RESCAN seconds; a new file starts a job, a removed one stops
  watching it (nothing is deleted or stopped on the workers), a changed one is reloaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from tpuwatch.cloud.apis import SharedLists
from tpuwatch.cloud.base import Due
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.errors import EXIT_CLOUD, EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE, TpuwatchError
from tpuwatch.fleet import pools, sources
from tpuwatch.journal import Busy, Journal
from tpuwatch.loop import run_job
from tpuwatch.metrics import Exporter
from tpuwatch.outputs import Outputs
from tpuwatch.ports import Flags
from tpuwatch.tick import TickReport
from tpuwatch.ui.jobs import JobState
from tpuwatch.wiring import Job, Sharing, load_job, real_ports

TICK_SLOTS = 8  # jobs ticking at once
RESCAN = 1.0  # seconds between looks at --config-dir
BUSY_RETRY = 5.0  # seconds between tries to take a job another process watches
# The README's exit codes, least to most severe: a config no watcher can run is worse than a
# cloud API that may come back, which is worse than one job that needs a person.
SEVERITY = (EXIT_OK, EXIT_JOB_FAILED, EXIT_CLOUD, EXIT_USAGE)


def most_severe(codes: Sequence[int]) -> int:
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=EXIT_OK)


class Output(Protocol):
    """What the watcher shows (tpuwatch/ui/jobs.py): a job's state when it changes, each tick."""

    def changed(self, state: JobState) -> None: ...

    def ticked(self, state: JobState, report: TickReport) -> None: ...

    def warn(self, state: JobState, text: str) -> None: ...

    def gone(self, path: Path) -> None: ...


@dataclass(frozen=True)
class Options:
    project: str | None
    zone: str | None
    flags: Flags


def grid_delay(poll: float, now: float) -> float:
    """Seconds to the next multiple of `poll` in wall time (at least a quarter poll away)."""
    left = poll - (now % poll)
    return left + poll if left < poll / 4 else left


class JobRunner:
    """One job's thread: load, lock, tick until it ends, is removed, or the watcher stops."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path = path
        self.fleet = fleet
        self.stopping = threading.Event()
        self.state = JobState(path=path, name=path.stem, status="starting")
        self.thread = threading.Thread(target=self._run, name=f"tpuwatch-job-{path.stem}", daemon=True)
        self.job: Job | None = None
        self._woken = threading.Event()  # ends the Pacer's follow wait
        # the watcher's pools as this job's config was checked against them (Fleet.pools, a new
        # dict each time the pool files change): a config error on older pools is retried
        self.pools_checked: dict[str, pools.Pool] | None = None

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def start(self) -> JobRunner:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._woken.set()  # a follow-channel wait ends now, not at the poll

    def _set(self, **changes: object) -> None:
        self.state = replace(self.state, **changes)  # type: ignore[arg-type]
        self.fleet.output.changed(self.state)

    def _run(self) -> None:
        try:
            self._watch()
        except TpuwatchError as exc:
            self._set(status="config_error" if exc.exit_code == EXIT_USAGE and self.state.report is None
                      else "failed", error=exc.message, exit_code=exc.exit_code)
        except Exception as exc:  # noqa: BLE001 (one job's bug must not stop the others)
            self._set(status="failed", error=f"{type(exc).__name__}: {exc}", exit_code=EXIT_JOB_FAILED)
        finally:
            if self.job is not None:
                self.fleet.release(self.job.name, self.path)

    def _watch(self) -> None:
        fleet = self.fleet
        job = load_job(self.path, fleet.options.project, fleet.options.zone)
        self._set(name=job.name)
        self.pools_checked = fleet.pools
        pools.check_job(self.pools_checked, job)  # the spare pool it names is one of this watcher's
        fleet.claim(job.name, self.path)
        self.job = job
        dry_run = fleet.options.flags.dry_run
        outputs = Outputs.prepare(job, dry_run=dry_run)
        journal = open_journal(job)
        while journal is None:
            if self.state.status != "busy":
                self._set(status="busy", error="watched by another tpuwatch process; taken over when it stops")
            if self.stopping.wait(BUSY_RETRY):
                self._set(status="stopped", error="")
                return
            journal = open_journal(job)
        self._set(status="watching", error="")
        if fleet.exporter is not None:  # expected to tick from now on
            outputs.share(fleet.exporter)
        poll = job.pcfg.poll_interval
        due = Due()
        with journal:
            ports = real_ports(job, fleet.sharing(job, due, poll), sleep=self._sleep)
            view = _View(self, journal)
            if port := int(job.cfg.metrics["port"]):  # said, not silently dropped
                where = "--metrics-port (a job_name label each)" if fleet.exporter is not None else "--metrics-port"
                view.warn(f"[metrics] port = {port} in {self.path.name} is not used when one watcher watches "
                          f"several jobs: their one endpoint is {where}")

            @contextmanager
            def slot() -> Iterator[None]:
                due.at = time.monotonic()  # the zone listing must be no older than this
                with fleet.slots:
                    yield

            def on_grid(delay: float) -> float:  # a steady wait ends with the zone's other jobs
                return grid_delay(poll, time.time()) if delay >= poll else delay

            report = run_job(job.cfg, job.pcfg, ports, journal, fleet.options.flags, view, outputs=outputs,
                             stopping=self.stopping, woken=self._woken, slot=slot, delay=on_grid)
        if self.stopping.is_set() and not report.decision.ends_watch:
            self._set(status="stopped")
        else:
            self._set(status="finished", exit_code=int(report.exit_code))

    def _sleep(self, seconds: float) -> None:
        """JobPorts.sleep: cut short once when the job stops being watched (after that a plain
        sleep, so the port-probe loop of a down node cannot spin)."""
        if self.stopping.is_set():
            time.sleep(seconds)
        else:
            self.stopping.wait(seconds)


def open_journal(job: Job) -> Journal | None:
    """The job's journal, held for writing; None while another process holds it."""
    try:
        return Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, wait=False)
    except Busy:
        return None


class _View:
    """loop.View of one job: hands its reports and warnings to the watcher's output."""

    def __init__(self, runner: JobRunner, journal: Journal) -> None:
        self.runner = runner
        self.journal = journal
        self.ticks = 0

    def show(self, report: TickReport, next_at: object) -> None:
        self.ticks += 1
        events = self.journal.events(limit=10)
        recent = [e for e in events if e.kind != "phase"]
        last = f"{recent[-1].kind}: {recent[-1].reason}" if recent else ""
        state = replace(self.runner.state, report=report, last_event=last, events=tuple(recent),
                        next_at=next_at if isinstance(next_at, datetime) else None)
        self.runner.state = state
        self.runner.fleet.output.ticked(state, report)

    def warn(self, text: str) -> None:
        self.runner.fleet.output.warn(self.runner.state, text)


class Fleet:
    """The jobs of one watcher, and what they share."""

    def __init__(self, files: Sequence[Path], directory: Path | None, options: Options, output: Output,
                 exporter: Exporter | None = None, *, lists: SharedLists | None = None) -> None:
        self.files = list(files)
        self.directory = directory
        self.options = options
        self.output = output
        self.exporter = exporter
        self.lists = lists or SharedLists()  # each cloud API's zone lists
        self.slots = threading.BoundedSemaphore(TICK_SLOTS)
        self.runners: dict[Path, JobRunner] = {}
        self.ended: dict[Path, JobState] = {}  # jobs whose thread ended, as last seen
        self._names: dict[str, Path] = {}
        self._audit_dirs: dict[str, Path] = {}
        self._readers: dict[tuple[str, str | None], AuditLogReader] = {}
        self._lock = threading.Lock()
        self._seen: dict[Path, str] = {}
        self._restart: set[Path] = set()  # changed files whose old runner is still stopping
        self.pools: dict[str, pools.Pool] = {}  # the spare pools of its pool files, by name
        self._pool_files: dict[Path, str] = {}
        self._kinds: dict[tuple[Path, str], bool] = {}  # (file, fingerprint) -> a pool file

    # -- shared by the jobs ----------------------------------------------------------------------

    def sharing(self, job: Job, due: Due, poll: float) -> Sharing:
        project, zone = job.location.project, job.location.zone
        with self._lock:
            audit_dir = self._audit_dirs.setdefault(project, Path(job.cfg.state_dir))
            reader = self._readers.setdefault((project, zone), AuditLogReader(project, zone=zone))
        return Sharing(lists=self.lists, due=due, slack=min(1.0, poll / 4), audit_dir=audit_dir,
                       audit_reader=reader)

    def claim(self, name: str, path: Path) -> None:
        """Two files may not name the same job (they would share a journal)."""
        with self._lock:
            other = self._names.get(name)
            if other is not None and other != path:
                raise TpuwatchError(f"job {name!r} is also watched from {other}: give one of them another "
                                    "[job] name (each job has its own journal)", exit_code=EXIT_USAGE)
            self._names[name] = path

    def release(self, name: str, path: Path) -> None:
        with self._lock:
            if self._names.get(name) == path:
                del self._names[name]

    # -- the main loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Until every job has ended (only with files named by -c: a directory is watched until
        Ctrl-C); the most severe of the jobs' exit codes."""
        try:
            while True:
                self.look()
                if self.directory is None and not self.runners:
                    return self.exit_code()
                time.sleep(RESCAN)
        finally:
            self.stop_all()

    def look(self) -> None:
        """Start, stop and restart jobs as the config files say; collect the ended ones."""
        now = sources.scan(self.files, self.directory)
        # pool files ([pool], no [job]): read before the jobs that name them start; one that does
        # not validate stops the watcher (exit 2), as a bad flag does
        kinds = {(p, f): self._kinds.get((p, f)) for p, f in now.items()}  # each file parsed once per version
        self._kinds = {k: pools.is_pool(k[0]) if v is None else v for k, v in kinds.items()}
        found = {p: f for p, f in now.items() if self._kinds[(p, f)]}
        pools_changed = found != self._pool_files
        if pools_changed:
            self.pools = pools.load_all(found)
            self._pool_files = found
        now = {p: f for p, f in now.items() if p not in found}
        changes = sources.diff(self._seen, now)
        self._seen = now
        for path in changes.removed:
            runner = self.runners.get(path)
            if runner is not None:
                runner.stop()
            self._restart.discard(path)
            self.ended.pop(path, None)
            self.output.gone(path)
        for path in changes.changed:
            runner = self.runners.get(path)
            if runner is not None:
                runner.stop()
            self._restart.add(path)
        for path, runner in list(self.runners.items()):
            if runner.done:
                del self.runners[path]
                if path in now and path not in self._restart:
                    if (runner.state.status == "config_error" and runner.pools_checked is not None
                            and runner.pools_checked != self.pools):
                        self._restart.add(path)  # checked against pools that have changed since
                    else:
                        self.ended[path] = runner.state
        if pools_changed:  # a job that named a pool not there yet starts again with the pools as they are now
            self._restart.update(p for p, st in self.ended.items() if st.status == "config_error")
        for path in list(self._restart):
            if path not in self.runners:
                self._restart.discard(path)
                self.ended.pop(path, None)
                self.runners[path] = JobRunner(path, self).start()
        for path in changes.added:
            self.runners[path] = JobRunner(path, self).start()

    def exit_code(self) -> int:
        return most_severe([s.exit_code for s in self.ended.values()])

    def states(self) -> list[JobState]:
        out = [r.state for r in self.runners.values()] + list(self.ended.values())
        return sorted(out, key=lambda s: str(s.path))

    def stop_all(self, timeout: float = 10.0) -> None:
        for runner in self.runners.values():
            runner.stop()
        end = time.monotonic() + timeout
        for runner in self.runners.values():
            runner.thread.join(max(0.0, end - time.monotonic()))
