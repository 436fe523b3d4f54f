"""A tick's report for people and for `--json`: one line, the node's state, a JSON-ready dict.

Used by `check`, the dashboard and the many-jobs views; the fields of `tick_dict` are the
`--json` output of `check` and `watch` (docs/status-json.md).
"""

from __future__ import annotations

from typing import Any

from tpuwatch.durations import human
from tpuwatch.model import NodeSnapshot
from tpuwatch.policy import effective_hang_limit, priority
from tpuwatch.policy.cadence import silent_limit
from tpuwatch.policy.spares import unfit
from tpuwatch.tick import TickReport
from tpuwatch.workers import precheck


def node_text(node: NodeSnapshot | None) -> str:
    """`READY/HEALTHY`, `missing`; for a multislice job each slice's too, in parentheses."""
    if node is None:
        return "missing"
    text = f"{node.state}/{node.health or '-'}"
    if node.slices:
        text += " (" + ", ".join(f"{s.name or 'missing'} {s.state}/{s.health or '-'}" for s in node.slices)
        text += f"; limping without {', '.join(node.slices_out)})" if node.slices_out else ")"
    return text


def tick_line(report: TickReport) -> str:
    """One line for people: node, job and what happens next."""
    mem = report.memory
    parts = [f"node {node_text(report.node)}", f"{mem.phase.value}", f"attempt {mem.attempt.number}"]
    ckpt = report.checkpoint
    if ckpt is not None:
        age = max(0.0, (report.time - ckpt.time).total_seconds()) if ckpt.time else None
        parts.append(f"step {ckpt.step}" + (f" ({human(age)} old)" if age is not None else ""))
    return f"{' | '.join(parts)}: {summary(report)}"


def summary(report: TickReport) -> str:
    """What the tick decided: each decision it carried out, in order (an end, then its relaunch)."""
    return "; then ".join(d.summary for d in (*report.earlier, report.decision))


def _slice_of(node: NodeSnapshot | None, worker: int) -> dict[str, int]:
    """{"slice": n} for a worker of a multislice job, else {}."""
    if node is None or not node.slices:
        return {}
    return next(({"slice": w.slice} for w in node.workers if w.index == worker), {})


def tick_dict(report: TickReport) -> dict[str, Any]:
    """The report, JSON-ready."""
    mem, node, ckpt, pcfg = report.memory, report.node, report.checkpoint, report.pcfg
    return {
        "time": report.time.isoformat(),
        "node": None if node is None else {
            "name": node.name, "zone": node.zone, "id": node.id,
            "state": node.state, "health": node.health,
            "health_description": node.health_description,
            # a multislice job: each slice, and its workers' numbers in "workers"
            **({"slices": [{"slice": i, "name": s.name, "id": s.id, "state": s.state, "health": s.health,
                            "workers": [w.index for w in node.workers if w.slice == i]}
                           for i, s in enumerate(node.slices)]} if node.slices else {}),
        },
        # a multislice job that limps (job.min_slices): the slices left out of its attempts,
        # since when, and since when one of them is back (it grows back at the next checkpoint)
        "limp": None if not mem.limp.out else {
            "slices_out": list(mem.limp.out),
            "since": mem.limp.since.isoformat() if mem.limp.since else None,
            "back_since": mem.limp.back_since.isoformat() if mem.limp.back_since else None,
            "grow_after_step": mem.limp.back_step},
        # a multislice job with spares (tpu.spares): the slots swapped for a spare (slot -> the node
        # it runs on), and the pool's idle nodes, each with why it cannot stand in now ("" if it can)
        "spares": None if pcfg is None or not (pcfg.spares or pcfg.spare_pool) else {
            "swapped": dict(mem.limp.swapped),
            "idle": [{"name": name, "state": part.state if part is not None else "MISSING",
                      "health": part.health if part is not None else "", "unfit": unfit(pcfg.job, node, part, mem.limp.bad)}
                     for name, part in report.spares]},
        # a job of a spare pool (tpu.spare_pool): the pool's nodes as listed, each with the job that
        # holds it (null: idle) and, idle, why it cannot be claimed now (null: it can)
        "spare_pool": None if pcfg is None or not pcfg.spare_pool else {
            "name": pcfg.spare_pool, "nodes": [{"name": n, "held_by": j or None, "unclaimable": why or None}
                                               for n, j, why in report.pool]},
        # a job with a priority (job.priority): the nodes it took and lent, from and to whom, and why
        "priority": None if pcfg is None or pcfg.priority is None else {
            "priority": pcfg.priority, "lent": [{"slot": s, "to": j} for s, j in mem.limp.lent],
            "took": [{"node": n, "from": j} for n, j in mem.limp.took], "asked_for": mem.limp.wants or None,
            "giving": [{"node": n, "to": j} for n, j in mem.limp.giving],
            "handing_back": [{"node": n, "to": j} for n, j in mem.limp.handing], "said": priority.said(mem)},
        "workers": None if report.probes is None else [
            {"worker": p.worker, "state": p.state, "attempt": p.attempt, "exit_code": p.exit_code,
             "log_bytes": p.log_bytes, "log_age": p.log_age, "log_match": p.log_match or None, "detail": p.detail,
             **_slice_of(node, p.worker)} for p in report.probes
        ],
        "checkpoint": None if ckpt is None else {
            "path": ckpt.path, "step": ckpt.step, "layout": ckpt.layout,
            "time": ckpt.time.isoformat() if ckpt.time else None,
        },
        "events": [{"time": e.time.isoformat(), "kind": e.kind, "worker": e.worker, "reason": e.reason}
                   for e in report.events],
        **report.decision.as_dict(),
        "summary": summary(report),
        # rows of the decisions carried out before `row` in this tick (an end before its relaunch)
        "earlier_rows": [d.row for d in report.earlier],
        "budgets": {"restarts": mem.budgets.restarts, "recreates": mem.budgets.recreates,
                    "disruptions": mem.budgets.disruptions,
                    "no_progress": mem.budgets.no_progress},
        "done": list(report.done),
        "warnings": list(report.warnings),
        "dry_run": report.dry_run,
        "port_probes": report.port_probes,
        "precheck": None if report.precheck is None else precheck.report_dict(report.precheck),
        # what hang detection knows: "auto" learns the interval; the limit counts from the
        # newest checkpoint of the attempt (0 = not judged yet, or off)
        "hang": None if pcfg is None else {
            "timeout": "auto" if pcfg.hang_auto else pcfg.hang_timeout,
            "checkpoint_interval_seen": mem.hang.ckpt_gap or None,
            "first_checkpoint_seen": mem.hang.ckpt_first or None,
            "limit": effective_hang_limit(pcfg, mem) or None,
            # the log cadence (policy/cadence.py): the longest silence the job has shown past a
            # first checkpoint, and the silence that stops it ("auto" only)
            "log_silence_seen": mem.hang.log_gap or None,
            "log_silence_limit": (silent_limit(mem) or None) if pcfg.hang_auto else None},
    }
