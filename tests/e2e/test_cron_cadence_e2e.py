"""End to end: cron `check`, one tick per process, keeps the audit log's cadence (once a
minute while all is well) and the environment checks' (every precheck.interval), as `watch`
does: when each last happened is in the journaled memory, not in a process.

Each tick below is a fresh journal connection, fresh adapters and a fresh Reconciler, as each
`tpuwatch check` is; the watcher's clock is its own, so the test steps it over a minute or ten
without waiting. A tick read the audit log when the memory it journaled says so at its own
time (the shared reader may answer from its cache, cloud/auditcache.py, so the simulator's count
of queries is not the tick's count of reads); it ran the environment checks when its report
has its time.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from e2e_helpers import Job

from tpuwatch.journal import Journal
from tpuwatch.policy.observe import AUDIT_INTERVAL
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler, TickReport
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow

INTERVAL = 600.0  # precheck.interval's default


def test_cron_check_keeps_the_audit_and_precheck_cadence_across_processes(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(sim, tmp_path, steps=100_000, accelerator="v4-8")
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    jb = load_job(job.cfg)
    ahead = [0.0]  # seconds the watcher's clock runs ahead of the wall clock

    def clock() -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=ahead[0])

    def check() -> tuple[TickReport, bool]:
        """One cron tick; whether it read the audit log."""
        ports = replace(real_ports(jb), now=clock)
        try:
            with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
                report = Reconciler(jb.cfg, jb.pcfg, ports, journal).tick()
        finally:
            ports.workers.close()
        with Journal.open(jb.cfg.state_dir, jb.name, None, readonly=True) as journal:  # as the next process
            mem = journal.load_memory()
        assert mem is not None
        return report, mem.marks.audit_read_at == report.time

    first, read = check()
    assert first.decision.row == "launch" and read, first.decision.summary
    assert first.precheck is not None and first.precheck.context == "launch"
    launched_at = first.time
    job.wait(lambda: bool(job.steps_done()), what="the job's first checkpoint")
    ahead[0] = 20.0
    report, read = check()
    assert report.decision.row == "running" and not read, report.decision.summary  # read 20 s ago
    ahead[0] = AUDIT_INTERVAL + 1
    report, read = check()
    assert report.decision.row == "running" and read
    # the launch-time checks ran at the launch: the periodic ones are not due yet
    assert report.precheck is not None and report.precheck.time == launched_at
    ahead[0] = AUDIT_INTERVAL + 21
    report, read = check()
    assert not read and report.precheck is not None and report.precheck.time == launched_at
    ahead[0] = INTERVAL + 1
    report, read = check()
    assert read and report.precheck is not None
    assert report.precheck.context == "running" and report.precheck.time == report.time
    checked_at = report.time
    ahead[0] = INTERVAL + 21
    report, read = check()
    assert report.decision.row == "running" and not read
    assert report.precheck is not None and report.precheck.time == checked_at
    assert report.memory.marks.precheck_at == checked_at and report.memory.marks.audit_read_at == checked_at
