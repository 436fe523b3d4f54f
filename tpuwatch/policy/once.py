"""The policy of the commands that act once: `tpuwatch run` and `tpuwatch recreate`.

`tpuwatch run`: one attempt, followed to its end, with no recovery (a restart budget of zero).

`run_start` decides how a run begins (rows `RUN_START_ROWS`): refused, following an attempt that
already runs, or launching the next. `attempt_end` is the run's end classifier, pure: it reads
the workers' probes (and the lead worker's follow channel's exit code) each poll and says
whether the attempt ended, by which row of `RUN_ROWS`. The lead worker alone decides success; any other worker can only fail the
attempt; a worker that misses `UNREACHABLE_POLLS` probes in a row fails it (one dropped SSH
connection does not). Every end but success fails the run, as the watch policy fails a job
whose restart budget is spent: `run` never relaunches (that is `tpuwatch watch`).

`tpuwatch recreate`: a person's delete + create, made by the watcher's own rows (the Reconciler's
ticks, from row `recreate_asked`) with the settings of `asked_recreate`, and ended by
`recreate_end` (rows `RECREATE_ROWS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tpuwatch.model import NodeSnapshot, WorkerProbe
from tpuwatch.policy.rows import Row
from tpuwatch.policy.state import Memory, Phase
from tpuwatch.policy.values import Decision, PolicyConfig

# Probes in a row a worker may miss before the run gives up on it: a poll's SSH connection
# may drop once, and `run` follows at most every few seconds.
UNREACHABLE_POLLS = 3

RUN_START_ROWS: tuple[Row, ...] = (
    Row("run_not_usable", "the node is not READY+HEALTHY", "exit 1: `run` does not recover a node (wait for "
        "READY, or use `tpuwatch watch`); nothing is probed"),
    Row("run_no_workers", "the node lists no workers (network endpoints)", "exit 1"),
    Row("run_lost_at_start", "a worker is unreachable before anything is launched", "exit 1 naming it"),
    Row("run_follow", "every worker runs one same attempt (an earlier run, detached)", "follow it; launch nothing"),
    Row("run_launch", "otherwise", "stop what is left of earlier attempts, run the launch-time checks, launch "
        "attempt n+1 (n: the highest any worker ran) from the newest complete checkpoint"),
)


@dataclass(frozen=True)
class RunStart:
    """How a run begins: its row of RUN_START_ROWS, the attempt to follow or launch, and why
    (the refusal, for people)."""

    row: str
    attempt: int = 0
    message: str = ""


def run_start(node: NodeSnapshot, workers: int, probes: Sequence[WorkerProbe]) -> RunStart:
    """`workers`: how many the node lists; `probes`: theirs (none when the node is not usable)."""
    if not node.usable:
        return RunStart("run_not_usable", message=(
            f"TPU {node.name} is {node.state}/{node.health or 'no health reported'}"
            + (f" ({node.health_description})" if node.health_description else "")
            + "; `tpuwatch run` does not recover a node: wait for READY, or use `tpuwatch watch`"))
    if not workers:
        return RunStart("run_no_workers", message=f"TPU {node.name} lists no workers (network endpoints); check "
                                                  f"`tpuwatch status {node.name}`")
    lost = [p for p in probes if p.state == "unreachable"]
    if lost:
        return RunStart("run_lost_at_start", message="cannot start: " + "; ".join(p.detail for p in lost))
    running = [p for p in probes if p.state == "running"]
    if running and len(running) == len(probes) and len({p.attempt for p in running}) == 1:
        return RunStart("run_follow", int(running[0].attempt or 0))
    return RunStart("run_launch", max((p.attempt for p in probes if p.attempt is not None), default=0) + 1)


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


RECREATE_ROWS: tuple[Row, ...] = (
    Row("recreate_not_started", "the journal has a delete, create or queued create under way, or the job ended; or "
        "the first tick decided another row than `recreate_asked`", "exit 1, saying why (nothing is done when the "
        "journal says so: the operation is followed to its end by the watcher; an ended job stays ended)"),
    Row("recreate_failed", "the job failed or needs a person (rows delete_failed, create_failed, "
        "operation_timeout, not_owned, someone_deleting, ...)", "exit 1 with the row's reason"),
    Row("recreate_queued", "no capacity or quota in the last zone tried (row `no_capacity` with no fallback zone "
        "left)", "exit 1: the create stays queued in the journal, and `tpuwatch watch` or `check` goes on with it"),
    Row("recreate_done", "the recreate left DELETING, CREATING and QUEUED: the node is created, or made again in "
        "place (a MIG's recreateInstances)", "exit 0 with the new node"),
)
RECREATE_ROW_BY_ID = {r.id: r for r in RECREATE_ROWS}
_UNDER_WAY = (Phase.DELETING, Phase.CREATING, Phase.QUEUED)


def asked_recreate(cfg: PolicyConfig) -> PolicyConfig:
    """The settings a person's recreate ticks with: the watcher's, but queueing nothing. Each zone
    (tpu.zone, then fallback_zones) is tried once, the next at once after a create error the
    policy falls back from (a queue_timeout and backoff of 0); `tpuwatch watch` is the one that
    waits out a stockout."""
    return replace(cfg, queue_timeout=0.0, backoff_base=0.0, backoff_max=0.0)


@dataclass(frozen=True)
class RecreateEnd:
    """How a person's recreate ended: its row of RECREATE_ROWS and the reason, for people."""

    row: str
    message: str

    @property
    def ok(self) -> bool:
        return self.row == "recreate_done"


def recreate_refused(mem: Memory | None) -> str | None:
    """Why a person's recreate must not start from this memory (row `recreate_not_started`), or
    None. An operation tpuwatch started is followed to its end first (a second delete or create
    beside it could give two nodes); a job that ended stays ended."""
    if mem is None:
        return None
    if mem.phase in (Phase.DONE, Phase.FAILED):
        return (f"the job ended ({mem.phase.value}: {mem.reason}), and an ended job stays ended: tpuwatch "
                "recreates nothing for it (to run it again, give it a new job.name)")
    if mem.phase in _UNDER_WAY:
        what = ("its create is queued for capacity" if mem.phase is Phase.QUEUED else
                f"its {mem.phase.value.lower()} (operation {mem.recreate.pending_op or 'not recorded'}) is under way")
        return f"tpuwatch is already recreating it: {what}; `tpuwatch watch` or `check` goes on with it"
    return None


def recreate_end(d: Decision, cfg: PolicyConfig, *, first: bool) -> RecreateEnd | None:
    """Has the recreate ended, after the tick that decided `d` (`first`: the tick that was asked
    for it)? None while it is under way."""
    phase = d.memory.phase
    if first and d.row != "recreate_asked":
        return RecreateEnd("recreate_not_started", f"{d.row}: {d.summary}")
    if phase in (Phase.FAILED, Phase.HALTED, Phase.DONE):
        return RecreateEnd("recreate_failed", f"{d.row}: {d.summary}")
    if d.row == "no_capacity" and d.memory.recreate.zone_try >= len(cfg.zones) - 1:
        return RecreateEnd("recreate_queued", d.summary)
    if phase not in _UNDER_WAY:
        return RecreateEnd("recreate_done", d.summary)
    return None
