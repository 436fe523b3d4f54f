"""`tpuwatch drill`: a maintenance fire drill on the job's own TPU, and how the recovery went.

One `simulateMaintenanceEvent` on a worker of the slice the job owns (after a confirmation, or
`--yes`): v2alpha1's on a TPU node's worker, Compute Engine's `instances.simulateMaintenanceEvent`
on the worker's instance, then the recovery is followed: by the `watch` that holds the job's
journal (read here read-only), or, when nobody does (no watch, or cron `check` between runs),
by ticking here exactly as `watch` does. It prints when the fault was seen, when the job ran
again, from which checkpoint, and the work lost (training time after that checkpoint).
Exit 0 when the job ran again within recovery.repair_timeout, 1 otherwise or when the node
cannot be drilled (missing, not READY, not this job's), 2 for bad usage.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from tpuwatch.commands.common import CONFIG_OPTION, open_journal_or_busy, tick_flags
from tpuwatch.durations import human
from tpuwatch.errors import JobFailed, NotFoundError, UsageError
from tpuwatch.journal import Journal
from tpuwatch.model import Checkpoint, NodeSnapshot, job_node
from tpuwatch.policy import Memory, Phase

EPILOG = """\b
Examples:
  tpuwatch drill -c tpuwatch.toml            # asks first; worker 0
  tpuwatch drill -c tpuwatch.toml --worker 3 --yes --json
"""


@click.command(epilog=EPILOG)
@CONFIG_OPTION
@click.option("--project", help="GCP project (default: config, env, gcloud).")
@click.option("--zone", help="Zone, e.g. us-central2-b (default: config, env, gcloud).")
@click.option("--worker", type=click.IntRange(min=0), default=0, show_default=True,
              help="The worker the simulated maintenance hits (of a multislice job: numbered across its slices).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end.")
def command(config_path: Path, project: str | None, zone: str | None, worker: int, yes: bool,
            as_json: bool) -> int:
    """Simulate a maintenance event on the job's TPU and time how the job recovers."""
    from tpuwatch.ports import utcnow
    from tpuwatch.tick import Reconciler
    from tpuwatch.wiring import load_job, real_ports, slice_reader

    job = load_job(config_path, project, zone)
    ports = real_ports(job)
    zone_name = job.location.zone or job.pcfg.zones[0]
    tpu = slice_reader(job.cfg, job.location.project)(zone_name)
    node = job_node(tpu.get_node, job.cfg.tpu_name, job.pcfg.slices)
    _check(node, job.cfg.tpu_name, job.name, worker)
    assert node is not None
    # what the drill hits, as the slice's API says: a multislice job's worker N is on one of its
    # slices; a Compute Engine slice's worker N is an instance of its own
    what, target = tpu.drill_target(node, worker)
    mem = _memory(job)
    if mem is None or mem.phase is not Phase.RUNNING:
        raise JobFailed(f"job {job.name} is not running ({'no journal yet' if mem is None else mem.phase.value}); "
                        "a drill times a running job's recovery: start it with `tpuwatch watch` first")
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("drill: pass --yes to simulate a maintenance event without a terminal to confirm on")
        click.confirm(f"Simulate a maintenance event on {what} of {target} "
                      f"({job.location.project}/{node.zone})? The job will be interrupted", abort=True)
    before = mem.attempt.number
    timeout = float(job.cfg.recovery["repair_timeout"])
    poll = float(job.cfg.recovery["poll_interval"])
    store = ports.checkpoints
    ports.workers.probe(node)  # a local checkpoint_dir is listed on worker 0, in its probe
    ck0 = store.latest() if store is not None else None
    started = utcnow()
    operation = tpu.simulate_worker_maintenance(node, worker)
    journal = open_journal_or_busy(job)  # None: a watcher holds it and follows the recovery
    follower = "this drill (nobody else was watching)" if journal is not None else "the running watch"
    detected: datetime | None = None
    ran: Memory | None = None
    deadline = time.monotonic() + timeout
    try:
        rec = Reconciler(job.cfg, job.pcfg, ports, journal, tick_flags(False, False, False)) \
            if journal is not None else None
        while time.monotonic() < deadline:
            if rec is not None:
                report = rec.tick()
                now, seen, mem = report.time, report.node, report.memory
                if report.decision.terminal:
                    break
            else:
                now, seen, mem = utcnow(), job_node(tpu.get_node, job.cfg.tpu_name, job.pcfg.slices), _memory(job)
            if detected is None and (seen is None or not seen.usable):
                detected = now
            if (detected is not None and mem is not None and mem.phase is Phase.RUNNING
                    and mem.attempt.number > before and mem.attempt.seen and mem.attempt.start is not None
                    and mem.attempt.start >= started):
                ran = mem
                break
            time.sleep(poll)
    finally:
        if journal is not None:
            journal.close()
    out = _result(node, worker, operation, follower, started, detected, ran, ck0, timeout)
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        for line in _lines(out):
            click.echo(line)
    return 0 if out["ok"] else 1


def _check(node: NodeSnapshot | None, name: str, job: str, worker: int) -> None:
    if node is None:
        raise NotFoundError(f"drill: no TPU named {name}; nothing to drill")
    if not node.owned_by(job):
        raise UsageError(f"drill: TPU {name} is not this job's (its label tpuwatch-job is "
                         f"{node.owner!r}, not {job!r}); tpuwatch drills only a node it owns")
    if not node.usable:
        raise JobFailed(f"drill: TPU {name} is {node.state}/{node.health}, not READY+HEALTHY; drill a healthy node")
    if not 0 <= worker < max(1, len(node.workers)):
        raise UsageError(f"--worker: TPU {name} has workers 0..{len(node.workers) - 1}, not {worker}")


def _memory(job: Any) -> Memory | None:
    try:
        with Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, readonly=True) as j:
            return j.load_memory()
    except NotFoundError:
        return None


def _rfc(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _result(node: NodeSnapshot, worker: int, operation: str, follower: str, started: datetime,
            detected: datetime | None, ran: Memory | None, ck0: Checkpoint | None, timeout: float) -> dict[str, Any]:
    ran_at = ran.attempt.start if ran is not None else None
    lost = None
    if ran is not None and ck0 is not None and ck0.time is not None and ran.attempt.start_step == ck0.step:
        lost = max(0.0, (started - ck0.time).total_seconds())  # training after that checkpoint, up to the fault
    return {
        "node": node.name, "worker": worker, "operation": operation, "followed_by": follower,
        "started": _rfc(started), "detected": _rfc(detected),
        "detected_after": (detected - started).total_seconds() if detected is not None else None,
        "ran_again": _rfc(ran_at),
        "ran_again_after": (ran_at - started).total_seconds() if ran_at is not None else None,
        "attempt": ran.attempt.number if ran is not None else None,
        "from_checkpoint": ran.attempt.start_step if ran is not None else None,
        "checkpoint_at_fault": ck0.step if ck0 is not None else None,
        "work_lost_seconds": lost,
        "repair_timeout": timeout,
        "ok": ran_at is not None and (ran_at - started) <= timedelta(seconds=timeout),
    }


def _lines(out: dict[str, Any]) -> list[str]:
    def after(key: str) -> str:
        v = out[key]
        return f"after {human(v)}" if v is not None else "never"

    lines = [f"drill on worker {out['worker']} of {out['node']} ({out['operation']}), followed by {out['followed_by']}",
             f"fault seen      {after('detected_after')}",
             f"job ran again   {after('ran_again_after')}" + (f" (attempt {out['attempt']})" if out["attempt"] else "")]
    if out["attempt"]:
        lines.append(f"from checkpoint step {out['from_checkpoint']} (newest at the fault: step "
                     f"{out['checkpoint_at_fault']})")
        if out["work_lost_seconds"] is not None:
            lines.append(f"work lost       {human(out['work_lost_seconds'])} of training after that checkpoint")
    lines.append("ok: the job ran again within recovery.repair_timeout" if out["ok"]
                 else f"FAILED: the job did not run again within recovery.repair_timeout ({human(out['repair_timeout'])})")
    return lines
