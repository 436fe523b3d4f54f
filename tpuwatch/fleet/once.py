"""`check` with several jobs: one tick each, TICK_SLOTS at a time, sharing what `watch` shares.

A job whose config is bad, whose journal another process holds, or whose tick raises is
reported with its error; the others tick as usual.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpuwatch.cloud.apis import SharedLists
from tpuwatch.cloud.base import Due
from tpuwatch.cloud.logs import AuditLogReader
from tpuwatch.errors import EXIT_JOB_FAILED, EXIT_USAGE, TpuwatchError
from tpuwatch.fleet import pools, sources
from tpuwatch.fleet.runner import TICK_SLOTS, Options, open_journal
from tpuwatch.outputs import Outputs
from tpuwatch.tick import Reconciler, TickReport
from tpuwatch.ui.jobs import JobState
from tpuwatch.wiring import Sharing, load_job, real_ports


@dataclass
class Checked:
    state: JobState
    report: TickReport | None = None
    notes: list[str] = field(default_factory=list)


def check_all(files: Sequence[Path], directory: Path | None, options: Options) -> list[Checked]:
    paths = list(sources.scan(files, directory))
    found = [p for p in paths if pools.is_pool(p)]  # spare pools ([pool], no [job]): exit 2 when bad
    spare_pools = pools.load_all(found)
    paths = [p for p in paths if p not in found]
    lists = SharedLists()  # each cloud API's zone lists, shared by the jobs
    start = time.monotonic()
    audit_dirs: dict[str, Path] = {}
    readers: dict[tuple[str, str | None], AuditLogReader] = {}
    names: dict[str, Path] = {}

    def one(path: Path) -> Checked:
        state = JobState(path=path, name=path.stem, status="starting")
        try:
            job = load_job(path, options.project, options.zone)
            state = JobState(path=path, name=job.name, status="starting")
            pools.check_job(spare_pools, job)
            if names.setdefault(job.name, path) != path:
                raise TpuwatchError(f"job {job.name!r} is also in {names[job.name]}: give one of them another "
                                    "[job] name (each job has its own journal)", exit_code=EXIT_USAGE)
            outputs = Outputs.prepare(job, dry_run=options.flags.dry_run)
            journal = open_journal(job)
            if journal is None:
                return Checked(JobState(path=path, name=job.name, status="busy",
                                        error="another tpuwatch is working on it; nothing to do"))
            state = JobState(path=path, name=job.name, status="watching")
            with journal:
                outputs.start(journal)
                project, zone = job.location.project, job.location.zone
                audit_dir = audit_dirs.setdefault(project, Path(job.cfg.state_dir))
                reader = readers.setdefault((project, zone), AuditLogReader(project, zone=zone))
                poll = float(job.cfg.recovery["poll_interval"])
                sharing = Sharing(lists=lists, due=Due(start), slack=min(1.0, poll / 4),
                                  audit_dir=audit_dir, audit_reader=reader)
                ports = real_ports(job, sharing)
                try:
                    report = Reconciler(job.cfg, job.pcfg, ports, journal, options.flags).tick()
                finally:
                    ports.workers.close()
                notes = outputs.after_tick(report) + outputs.close(report)
            return Checked(JobState(path=path, name=job.name, status="finished", exit_code=report.exit_code,
                                    report=report), report, notes)
        except TpuwatchError as exc:
            status = "config_error" if exc.exit_code == EXIT_USAGE and state.status == "starting" else "failed"
            return Checked(JobState(path=path, name=state.name, status=status, error=exc.message,
                                    exit_code=exc.exit_code))
        except Exception as exc:  # noqa: BLE001 (one job's bug must not stop the others)
            return Checked(JobState(path=path, name=state.name, status="failed",
                                    error=f"{type(exc).__name__}: {exc}", exit_code=EXIT_JOB_FAILED))

    with ThreadPoolExecutor(max_workers=TICK_SLOTS, thread_name_prefix="tpuwatch-check") as pool:
        return list(pool.map(one, paths))
