"""`tpuwatch run`: one attempt, followed to its end, with no recovery (a restart budget of zero).

`attempt_end` is the run's end classifier, pure: it reads the workers' probes (and the lead
worker's follow channel's exit code) each poll and says whether the attempt ended, by which
row of `RUN_ROWS`. The lead worker alone decides success; any other worker can only fail the
attempt; a worker that misses `UNREACHABLE_POLLS` probes in a row fails it (one dropped SSH
connection does not). Every end but success fails the run, as the watch policy fails a job
whose restart budget is spent: `run` never relaunches (that is `tpuwatch watch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpuwatch.model import WorkerProbe
from tpuwatch.policy.rows import Row

# Probes in a row a worker may miss before the run gives up on it: a poll's SSH connection
# may drop once, and `run` follows at most every few seconds.
UNREACHABLE_POLLS = 3

RUN_ROWS: tuple[Row, ...] = (
    Row("run_success", "the lead worker (worker 0) exits 0, seen by its log stream or a probe",
        "stop the other workers; exit 0"),
    Row("run_exit", "a worker exits non-zero (the lead worker with any code, another with a non-zero one)",
        "stop every worker; exit 1 naming the worker, its code and its log (no relaunch: a restart budget of 0)"),
    Row("run_unreachable", f"a worker misses {UNREACHABLE_POLLS} probes in a row",
        "stop every worker; exit 1 naming the worker"),
    Row("run_foreign", "a worker runs another attempt than the one followed",
        "stop every worker; exit 1: another tpuwatch launched it"),
    Row("run_gone", "the followed attempt is gone from a worker (no process, no exit code)",
        "stop every worker; exit 1"),
)
RUN_ROW_BY_ID = {r.id: r for r in RUN_ROWS}


@dataclass(frozen=True)
class RunEnd:
    """How the followed attempt ended: its row, for people, and the worker and code it names."""

    row: str
    message: str
    worker: int | None = None
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.row == "run_success"


def attempt_end(probes: Sequence[WorkerProbe], attempt: int, lead_exit: int | None, misses: Mapping[int, int], *,
                lead: int = 0, limit: int = UNREACHABLE_POLLS) -> tuple[RunEnd | None, dict[int, int]]:
    """(the end, or None while the attempt runs; the per-worker missed probes in a row after this
    poll). `lead_exit` is the lead worker's exit code as its log stream reported it, if it did."""

    def lead_end(code: int) -> RunEnd:
        if code == 0:
            return RunEnd("run_success", f"worker {lead} exited 0: attempt {attempt} finished", lead, 0)
        return RunEnd("run_exit", f"worker {lead} exited with code {code} (attempt {attempt})", lead, code)

    missed = dict(misses)
    if lead_exit is not None:
        return lead_end(lead_exit), missed
    for p in sorted(probes, key=lambda p: p.worker):
        if p.state == "unreachable":
            missed[p.worker] = missed.get(p.worker, 0) + 1
            if missed[p.worker] >= limit:
                return RunEnd("run_unreachable", f"worker {p.worker} unreachable for {limit} checks in a row: "
                                                 f"{p.detail}", p.worker), missed
            continue
        missed.pop(p.worker, None)
        if p.attempt is not None and p.attempt != attempt:
            return RunEnd("run_foreign", f"worker {p.worker} now runs attempt {p.attempt}, not {attempt}: "
                                         "another tpuwatch launched it", p.worker), missed
        if p.state == "exited" and p.exit_code is not None:
            if p.worker == lead:
                return lead_end(p.exit_code), missed
            if p.exit_code != 0:
                return RunEnd("run_exit", f"worker {p.worker} exited with code {p.exit_code} (attempt {attempt})",
                              p.worker, p.exit_code), missed
        if p.state == "absent":
            return RunEnd("run_gone", f"worker {p.worker}: attempt {attempt} is gone ({p.detail})", p.worker), missed
    return None, missed
