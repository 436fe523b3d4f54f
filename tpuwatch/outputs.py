"""What `watch` and `check` tell the world besides their own lines: [[notify]] alerts and metrics.

The commands call three things: `Outputs.prepare` before the journal is opened (an unset
${VAR}, a port in use or a bad --metrics-file is exit 2 before anything is done), `start` with
the open journal, `after_tick(report)` after each tick, and `close` at the end. The tick itself
knows nothing of either. With --dry-run nothing is sent or written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuwatch import notify
from tpuwatch.journal import Journal

if TYPE_CHECKING:  # imported when a port or a file asks for it: prometheus_client and the report
    # cost a `check` without metrics about 25 ms of its start-up
    from tpuwatch import metrics


@dataclass
class Outputs:
    job: Any  # tpuwatch.wiring.Job
    targets: tuple[notify.Target, ...]
    exporter: metrics.Exporter | None
    metrics_file: Path | None
    dry_run: bool
    notifier: notify.Notifier | None = None
    journal: Journal | None = None
    closed: bool = False
    owns_exporter: bool = True  # False: a watcher of several jobs shares one (`share`)

    @classmethod
    def prepare(cls, job: Any, *, dry_run: bool, metrics_port: int | None = None, serve: bool = False,
                metrics_file: Path | None = None) -> Outputs:
        """Check everything the user gave; bind the metrics port (`serve`: watch, which also reads [metrics] port)."""
        targets = notify.targets_from_config(job.cfg)
        port = metrics_port if metrics_port is not None else (int(job.cfg.metrics["port"]) if serve else 0)
        exporter = None
        if port or metrics_file is not None:
            from tpuwatch import metrics
        if port:
            source = "--metrics-port" if metrics_port is not None else "metrics.port"
            exporter = metrics.Exporter(port, source, _stale_after(job))
        path = metrics.check_textfile_path(metrics_file) if metrics_file is not None else None
        return cls(job, () if dry_run else targets, exporter, path, dry_run)

    def share(self, exporter: metrics.Exporter) -> Outputs:
        """Report to the watcher's one endpoint (several jobs), which outlives this job."""
        self.exporter, self.owns_exporter = exporter, False
        exporter.expect(self.job.name, _stale_after(self.job))
        return self

    def start(self, journal: Journal) -> Outputs:
        """Begin: the sender first sends what an earlier run left unsent."""
        self.journal = journal
        if self.targets:
            self.notifier = notify.Notifier(journal, self.targets, self.job.name, self.job.cfg.tpu_name,
                                            str(self.job.location.zone or "")).start()
        return self

    def after_tick(self, report: Any) -> list[str]:
        """Alerts journaled and handed to the sender, metrics updated; warnings to show."""
        assert self.journal is not None, "Outputs.start first"
        if self.notifier is not None and not self.dry_run:
            self.notifier.after_tick(report)
        if self.exporter is not None:
            from tpuwatch import metrics

            self.exporter.update(metrics.snapshot(report, self.journal, self.job.pcfg))
        return self.take_warnings()

    def take_warnings(self) -> list[str]:
        out = self.notifier.take_warnings() if self.notifier is not None else []
        return out

    def close(self, report: Any = None, flush: float = notify.FLUSH_SECONDS) -> list[str]:
        """Send what is due (for `flush` s at most), write the metrics file (check), stop serving.
        A second call does nothing."""
        if self.closed:
            return []
        self.closed = True
        if self.notifier is not None:
            self.notifier.close(flush)
        if self.metrics_file is not None and report is not None and not self.dry_run and self.journal is not None:
            from tpuwatch import metrics

            metrics.write_textfile(self.metrics_file, report, self.journal, self.job.pcfg)
        if self.exporter is not None:
            if self.owns_exporter:
                self.exporter.close()
            else:
                self.exporter.forget(self.job.name)
        return self.take_warnings()


def _stale_after(job: Any) -> float:
    """How long /healthz waits for this job's next tick before it says stale."""
    from tpuwatch import metrics

    return metrics.stale_limit(job.pcfg.poll_interval, metrics.longest_tick(job.cfg))
