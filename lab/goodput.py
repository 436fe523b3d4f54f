"""Run one fault trace under every tool and measure: goodput, time to resume, waste, API cost.

`run_tool` plays a Trace against one tool in a fresh BenchWorld and returns a ToolResult;
`run_all` does it for every tool; `render` and `as_json` present the results. Definitions:

- goodput: productive step time / wall time. Productive steps are those of the job's final
  lineage (the newest checkpoint, or the running attempt's step at the end); wall time is the
  run's length, or the time the job finished.
- time to resume: from a fault that stopped a making-progress attempt to the next launch on
  the slice. A fault never followed by a launch counts as never (inf) in the percentiles.
- steps lost: steps executed and then redone (executed - productive).
- bug waste: TPU VM-hours (workers x hours) from the first launch of the buggy code until the
  tool stops retrying it (the end of the run when it never does).
- API calls per hour: over the time the tool was running.
- relaunch time: from the moment the last slice a disruption took down (maintenance, stuck,
  preemption) is usable again to the next attempt running on every slice.

Nothing here knows how a tool decides; it only reads the BenchWorld and the Meter afterwards.
"""

from __future__ import annotations

import math
import random
import statistics
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from lab.clock import Sim
from lab.job import Params, way_params
from lab.tools import Run, Tool, TpuwatchDriver
from lab.trace import ANNOUNCED, KINDS, Fault, Trace
from lab.world import BenchWorld, Meter


@dataclass
class ToolResult:
    key: str
    label: str
    note: str
    goodput: float
    wall_hours: float
    productive_steps: int
    steps_run: int
    steps_lost: int
    resume: dict[str, list[float]]  # kind -> seconds per interrupting fault (inf: never)
    bug_seen_day: float | None  # first launch of the buggy code
    bad_launches: int  # launches of the buggy code
    stopped_day: float | None  # the tool gave up or finished
    stop_reason: str
    stop_short: str
    bug_waste_vm_hours: float | None  # None: the buggy code never ran
    meter: Meter
    active_hours: float
    attempts: int
    skipped: dict[str, int]
    attempt_slices: list[int] = field(default_factory=list)  # slices each attempt ran on (fewer: limping)
    attempt_nodes: list[tuple[str, ...]] = field(default_factory=list)  # their nodes' names (a spare's: swapped in)
    # limping: hours attempts ran on fewer slices, by the state of the slice(s) left out at their start
    limp_hours: dict[str, float] = field(default_factory=dict)
    memory: dict[str, Any] | None = None  # tpuwatch's final policy memory (counters)
    rows: dict[str, int] = field(default_factory=dict)  # tpuwatch: decisions per table row
    error: str = ""  # a policy error (ImpossibleObservation, IllegalTransition, ...)
    events: int = 0
    ticks: int = 0  # tpuwatch: ticks, fast-forwarded ones included
    real_ticks: int = 0  # tpuwatch: ticks actually run (TpuwatchDriver.skip_idle)
    port_probes: int = 0  # tpuwatch: TCP probes of a down node's SSH port between ticks
    announced: list[tuple[str, int, str]] = field(default_factory=list)  # (kind, steps lost, how) per event
    # seconds from the last slice a disruption took down being usable again to the next attempt
    relaunch: list[float] = field(default_factory=list)

    def relaunch_stats(self) -> tuple[int, float | None, float | None]:
        """(disruptions relaunched after, median s, p95 s); None when there were none."""
        xs = sorted(self.relaunch)
        if not xs:
            return 0, None, None
        return len(xs), statistics.median(xs), xs[max(0, math.ceil(0.95 * len(xs)) - 1)]

    def announced_stats(self, kind: str | None = None) -> tuple[int, float | None, int | None]:
        """(events that found the job making progress, mean steps lost, most steps lost) for an
        announced kind (None: all of them)."""
        xs = [lost for k, lost, _ in self.announced if kind is None or k == kind]
        if not xs:
            return 0, None, None
        return len(xs), statistics.fmean(xs), max(xs)

    @property
    def tpu_per_hour(self) -> float:
        return self.meter.tpu / self.active_hours if self.active_hours > 0 else 0.0

    @property
    def log_per_hour(self) -> float:
        return self.meter.log / self.active_hours if self.active_hours > 0 else 0.0

    def resume_stats(self, kind: str) -> tuple[int, float | None, float | None, int]:
        """(faults, median s, p95 s, never resumed) for `kind`; None when there were none."""
        xs = sorted(self.resume.get(kind, []))
        if not xs:
            return 0, None, None, 0
        p95 = xs[max(0, math.ceil(0.95 * len(xs)) - 1)]
        return len(xs), statistics.median(xs), p95, sum(1 for x in xs if math.isinf(x))


def _apply(world: BenchWorld, fault: Fault) -> None:
    s = world.roles[fault.slice]  # the slice in the fault's role now (the same but with spares)
    if fault.kind == "maintenance":
        world.maintenance_event("maintenance", fault.heal_after, s=s)
    elif fault.kind == "stuck":
        world.maintenance_event("stuck", None, fault.stuck, s=s)
    elif fault.kind == "preemption":
        world.preempt(s)
    elif fault.kind == "crash":
        world.crash(fault.worker, s)
    elif fault.kind == "hang":
        world.hang(s)
    elif fault.kind == "bug":
        world.push_bug()
    elif fault.kind in ANNOUNCED:
        if s != 0:
            raise ValueError("announced maintenance is modelled on a single slice only")
        world.announce(fault.kind, fault.time, fault.heal_after or 0.0)
    else:
        raise ValueError(f"unknown fault kind {fault.kind!r}")


def run_tool(tool: Tool, trace: Trace, p: Params) -> ToolResult:
    """Play `trace` under `tool` for `p.days` of virtual time.

    A tool with spares (`Tool.spares`, at most the trace's) gets that many idle slices beside the
    job's, with their faults from the trace; one that limps (`Tool.limp_floor`) a world counted in
    1/slices of a step (job.way_params). Every other tool sees the job's slices alone."""
    if tool.spares > trace.spares:
        raise ValueError(f"{tool.key} has {tool.spares} spares; the trace draws faults for {trace.spares}")
    if tool.spares or tool.limp_floor is not None:
        p = way_params(p, tool.spares, tool.limp_floor)
    sim = Sim()
    world = BenchWorld(sim, p, list(trace.stockouts))
    meter = Meter()
    rng = random.Random(trace.seed * 1000003 + zlib.crc32(tool.key.encode()))
    run = Run(sim, world, meter, rng)
    for f in trace.faults:
        if f.slice >= p.slices + p.spares:
            continue  # a spare this tool does not have
        # an announced maintenance: its notice comes notice_lead before it, however late it is announced
        when = max(0.0, f.time - max(f.lead, p.notice_lead)) if f.kind in ANNOUNCED else f.time
        sim.at(when, _apply, world, f)
    for i, proc in enumerate(tool.start(run)):
        sim.spawn(proc, f"{tool.key}-{i}")
    if tool.drive is not None:
        tool.drive(run)
    sim.run(p.horizon)
    world.finish()
    return _result(tool, run)


def _result(tool: Tool, run: Run) -> ToolResult:
    w, p = run.world, run.world.p
    end = w.done if w.done is not None else p.horizon
    # in a limping world's units (1/slices of a step; p.step_time is one unit's): goodput counts a
    # step on k of n slices as k/n of a step; the step counts below are whole steps
    productive = p.total_steps if w.done is not None else max(w.ckpt_step, w.step_now())
    resume: dict[str, list[float]] = {k: [] for k in KINDS}
    for hit in w.hits:
        if hit.interrupted:
            resume.setdefault(hit.kind, []).append(hit.resumed - hit.time if hit.resumed is not None else math.inf)
    stop = w.stopped if w.stopped is not None else p.horizon
    waste = None
    if w.bug_seen is not None:
        waste = max(0.0, min(stop, p.horizon) - w.bug_seen) / 3600.0 * p.workers * p.slices
    # tpuwatch: its watch loop; one per slice for tpuwatch-per-slice (memory: slice 0's watcher's)
    ticks: list[TpuwatchDriver] = run.extra.get("ticks", [])
    tick = ticks[0] if ticks else None
    rows: Counter[str] = Counter()
    for t in ticks:
        rows.update(t.rows)
    memory = None
    if tick is not None:
        m = tick.mem
        memory = {"phase": m.phase.value, "attempt": m.attempt.number, "restarts": m.budgets.restarts,
                  "disruptions": m.budgets.disruptions, "recreates": m.budgets.recreates, "no_progress": m.budgets.no_progress,
                  "reason": m.reason}
    return ToolResult(
        key=tool.key, label=tool.label, note=tool.note,
        goodput=productive * p.step_time / end if end > 0 else 0.0,
        wall_hours=end / 3600.0,
        productive_steps=productive // p.unit,
        steps_run=w.steps_run // p.unit,
        steps_lost=max(0, w.steps_run - productive) // p.unit,
        resume=resume,
        bug_seen_day=w.bug_seen / 86400.0 if w.bug_seen is not None else None,
        bad_launches=w.bad_launches,
        stopped_day=w.stopped / 86400.0 if w.stopped is not None else None,
        stop_reason=w.stop_reason,
        stop_short=w.stop_short,
        bug_waste_vm_hours=waste,
        meter=run.meter,
        active_hours=min(stop, end) / 3600.0,
        attempts=len(w.attempts),
        attempt_slices=[len(a.procs) for a in w.attempts],
        attempt_nodes=[tuple(w.slices[pr.slice].name for pr in a.procs) for a in w.attempts],
        limp_hours=_limp_hours(w, end),
        skipped=dict(Counter(k for k, _ in w.skipped)),
        memory=memory,
        rows=dict(rows),
        error="; ".join(t.error for t in ticks if t.error),
        events=run.sim.events,
        ticks=sum(t.ticks for t in ticks),
        real_ticks=sum(t.real_ticks for t in ticks),
        port_probes=sum(t.port_probes for t in ticks),
        announced=[(h.kind, h.lost_steps, h.how) for h in w.announced],
        relaunch=list(w.relaunches),
    )


def _limp_hours(w: BenchWorld, end: float) -> dict[str, float]:
    """Hours the attempts on fewer than the job's slices ran, by what their slices left out were."""
    out: dict[str, float] = {}
    for a in w.attempts:
        if a.left_out:
            key = "+".join(sorted(a.left_out))
            out[key] = out.get(key, 0.0) + ((a.end_time if a.end_time is not None else end) - a.t0) / 3600.0
    return dict(out)


@dataclass
class Report:
    params: Params
    trace: Trace
    results: list[ToolResult]
    seconds: float  # real time the runs took

    @property
    def ideal(self) -> ToolResult | None:
        return next((r for r in self.results if r.key == "ideal"), None)


def run_all(tools: list[Tool], trace: Trace, p: Params) -> Report:
    t0 = time.perf_counter()
    results = [run_tool(t, trace, p) for t in tools]
    return Report(p, trace, results, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# presentation


def _dur(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "never"
    if x < 120:
        return f"{x:.0f}s"
    if x < 7200:
        return f"{x / 60:.1f}m"
    return f"{x / 3600:.1f}h"


def trace_summary(trace: Trace) -> dict[str, Any]:
    heals = sorted(f.heal_after for f in trace.faults if f.kind == "maintenance" and f.heal_after is not None)
    bug = next((f.time for f in trace.faults if f.kind == "bug"), None)
    announced = {k: trace.count(k) for k in ANNOUNCED if trace.count(k)}
    return {
        "seed": trace.seed,
        "counts": {k: trace.count(k) for k in KINDS} | announced,
        "bug_push_day": bug / 86400.0 if bug is not None else None,
        "heal_minutes": [round(h / 60, 1) for h in heals],
        "stockouts": [[round(a / 86400, 3), round((b - a) / 60, 1)] for a, b in trace.stockouts],
    }


def as_json(report: Report) -> dict[str, Any]:
    ideal = report.ideal
    tools = []
    for r in report.results:
        resume = {}
        for k in KINDS:
            n, med, p95, never = r.resume_stats(k)
            resume[k] = {"faults": n, "median_s": _num(med), "p95_s": _num(p95), "never": never}
        tools.append({
            "tool": r.key, "label": r.label, "note": r.note,
            "goodput": round(r.goodput, 5),
            "of_ideal": round(r.goodput / ideal.goodput, 5) if ideal and ideal.goodput > 0 else None,
            "wall_hours": round(r.wall_hours, 3),
            "productive_steps": r.productive_steps, "steps_run": r.steps_run, "steps_lost": r.steps_lost,
            "resume": resume,
            "bug_seen_day": _round(r.bug_seen_day), "bad_launches": r.bad_launches,
            "bug_waste_tpu_vm_hours": _round(r.bug_waste_vm_hours),
            "stopped_day": _round(r.stopped_day), "stop_reason": r.stop_reason,
            "api_calls": asdict(r.meter),
            "tpu_api_calls_per_hour": round(r.tpu_per_hour, 1),
            "log_reads_per_hour": round(r.log_per_hour, 1),
            "attempts": r.attempts, "faults_that_found_nothing": r.skipped,
            "limp_hours": {k: round(v, 2) for k, v in sorted(r.limp_hours.items())},
            "policy_memory": r.memory, "policy_rows": r.rows, "error": r.error,
            "ticks": r.ticks, "ticks_run": r.real_ticks, "port_probes": r.port_probes,
        })
        if any(report.trace.count(k) for k in ANNOUNCED):  # only then: the default output keeps its shape
            tools[-1]["announced_maintenance"] = announced_json(r, report.params)
        n, med, p95 = r.relaunch_stats()
        tools[-1]["relaunch"] = {"disruptions": n, "median_s": _num(med), "p95_s": _num(p95)}
    out = {"params": asdict(report.params), "trace": trace_summary(report.trace), "tools": tools,
           "seconds": round(report.seconds, 2)}
    ways = report_ways(report)
    if ways:
        out["ways"] = ways
        out["note"] = FIXED_NOTE
    return out


def report_ways(report: Report) -> list[dict[str, Any]]:
    """Per way past fixed slices: its bound, against the fixed-slice one, the share of it every
    non-bound tool reaches, and its time from a fault that stopped the job to the next launch."""
    fixed = report.ideal
    out = []
    for r in (r for r in report.results if r.key in WAYS):
        row: dict[str, Any] = {"tool": r.key, "label": r.label, "goodput": round(r.goodput, 5),
                               "of_fixed_ideal": round(r.goodput / fixed.goodput, 5) if fixed and fixed.goodput > 0 else None}
        relaunch = sorted(x for k in KINDS for x in r.resume.get(k, []))
        row["fault_to_launch_median_s"] = _num(statistics.median(relaunch)) if relaunch else None
        row["of_it"] = {o.key: round(o.goodput / r.goodput, 5) if r.goodput > 0 else None
                        for o in report.results if not _is_bound(o.key)}
        out.append(row)
    return out


def announced_json(r: ToolResult, p: Params) -> dict[str, Any]:
    """Work lost per announced maintenance that found the job making progress, by kind and in all."""
    interval = p.ckpt_every * p.step_time + p.ckpt_save
    out: dict[str, Any] = {}
    for kind in (*ANNOUNCED, None):
        n, mean, most = r.announced_stats(kind)
        out[kind or "all"] = {
            "events": n, "lost_steps_mean": _round(mean, 2), "lost_steps_max": most,
            "lost_seconds_mean": _round(mean * p.step_time if mean is not None else None, 1),
            "share_of_interval": _round(mean * p.step_time / interval if mean is not None else None, 5),
            "how": dict(Counter(h for k, _, h in r.announced if kind is None or k == kind)),
        }
    return out


def render_announced(report: Report) -> Any:
    """The table of work lost per announced maintenance (None when the trace has none)."""
    from rich.table import Table

    if not any(report.trace.count(k) for k in ANNOUNCED):
        return None
    p = report.params
    interval = p.ckpt_every * p.step_time + p.ckpt_save
    t = Table(title=f"Announced maintenance: work lost per event that found the job running "
                    f"(mean / max steps; share of the {interval / 60:.1f}-min checkpoint interval)")
    t.add_column("tool")
    for name in (*ANNOUNCED, "all"):
        t.add_column(f"{name} (n={report.trace.count(name)})" if name != "all" else "all", justify="right")
    for r in report.results:
        cells = []
        for kind in (*ANNOUNCED, None):
            n, mean, most = r.announced_stats(kind)
            cells.append("-" if mean is None else
                         f"{mean:,.1f} / {most:,} ({100 * mean * p.step_time / interval:.2f} %, n={n})")
        label = f"{r.label} (reactive)" if r.key == "ideal" else r.label
        t.add_row(label, *cells)
    return t


@dataclass
class Sweep:
    """Goodput of every tool over several seeds of the same trace configuration."""

    seeds: list[int]
    keys: list[str]
    labels: list[str]
    goodput: dict[str, list[float]]  # key -> per seed
    errors: list[str]
    seconds: float
    tpu_per_hour: dict[str, list[float]] = field(default_factory=dict)  # key -> per seed
    log_per_hour: dict[str, list[float]] = field(default_factory=dict)
    # key -> seconds from each fault that took a slice of a running job down (LOST_KINDS) to the
    # next launch (on the slices left, for a tool that limps), over every seed
    to_launch: dict[str, list[float]] = field(default_factory=dict)
    limp_hours: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # key -> per seed (ToolResult's)
    # key -> per seed, fault kind -> seconds from each fault that stopped progress to the next
    # launch, summed (a fault never followed by one is left out): where a tool loses against a bound
    resume_s: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def of_ideal(self, key: str) -> list[float]:
        return [g / i if i > 0 else 0.0 for g, i in zip(self.goodput[key], self.goodput["ideal"], strict=True)]

    def best(self, key: str) -> int:
        """Seeds on which `key` has the highest goodput of every tool but the ideal bounds (ties count)."""
        others = [k for k in self.keys if not _is_bound(k)]
        return sum(1 for i in range(len(self.seeds))
                   if self.goodput[key][i] >= max(self.goodput[k][i] for k in others) - 1e-12)


def sweep(tools: list[Tool], traces: list[Trace], p: Params) -> Sweep:
    t0 = time.perf_counter()
    goodput: dict[str, list[float]] = {t.key: [] for t in tools}
    tpu: dict[str, list[float]] = {t.key: [] for t in tools}
    log: dict[str, list[float]] = {t.key: [] for t in tools}
    errors: list[str] = []
    lost: dict[str, list[float]] = {t.key: [] for t in tools}
    limp: dict[str, list[dict[str, float]]] = {t.key: [] for t in tools}
    resume: dict[str, list[dict[str, float]]] = {t.key: [] for t in tools}
    for trace in traces:
        for r in run_all(tools, trace, p).results:
            limp[r.key].append(r.limp_hours)
            resume[r.key].append({k: sum(x for x in xs if not math.isinf(x)) for k, xs in r.resume.items()})
            goodput[r.key].append(r.goodput)
            tpu[r.key].append(r.tpu_per_hour)
            log[r.key].append(r.log_per_hour)
            lost[r.key] += [x for k in LOST_KINDS for x in r.resume.get(k, [])]
            if r.error:
                errors.append(f"seed {trace.seed}, {r.label}: {r.error}")
    return Sweep([t.seed for t in traces], [t.key for t in tools], [t.label for t in tools], goodput, errors,
                 time.perf_counter() - t0, tpu, log, lost, limp, resume)


LOST_KINDS = ("maintenance", "stuck", "preemption")  # the faults that take a slice down


def _median_p95(xs: list[float]) -> tuple[float | None, float | None]:
    s = sorted(xs)
    return (statistics.median(s), s[max(0, math.ceil(0.95 * len(s)) - 1)]) if s else (None, None)


def sweep_json(sw: Sweep) -> dict[str, Any]:
    tools = []
    for key, label in zip(sw.keys, sw.labels, strict=True):
        g = sw.goodput[key]
        row: dict[str, Any] = {"tool": key, "label": label, "goodput_mean": round(statistics.fmean(g), 5),
                               "goodput_min": round(min(g), 5), "goodput_max": round(max(g), 5),
                               "per_seed": [round(x, 5) for x in g]}
        if sw.tpu_per_hour.get(key):
            row.update(tpu_api_calls_per_hour_max=round(max(sw.tpu_per_hour[key]), 1),
                       log_reads_per_hour_max=round(max(sw.log_per_hour[key]), 1))
        if key in sw.to_launch:
            med, p95 = _median_p95(sw.to_launch[key])
            row.update(slice_lost_to_launch={"faults": len(sw.to_launch[key]), "median_s": _num(med),
                                             "p95_s": _num(p95)})
        if any(sw.limp_hours.get(key, [])):
            row["limp_hours_per_seed"] = [{k: round(v, 2) for k, v in sorted(h.items())} for h in sw.limp_hours[key]]
        if sw.resume_s.get(key):
            row["resume_s_per_seed"] = [{k: round(v) for k, v in d.items()} for d in sw.resume_s[key]]
            if "ideal" in sw.resume_s and key != "ideal":
                # summed over the seeds, less the bound's: the time each kind of fault cost more
                row["resume_s_over_ideal"] = {
                    k: round(sum(d.get(k, 0.0) for d in sw.resume_s[key]) - sum(d.get(k, 0.0) for d in sw.resume_s["ideal"]))
                    for k in sw.resume_s[key][0]}
        if "ideal" in sw.goodput:
            oi = sw.of_ideal(key)
            row.update(of_ideal_mean=round(statistics.fmean(oi), 5), of_ideal_min=round(min(oi), 5),
                       best_non_ideal_seeds=sw.best(key) if not _is_bound(key) else None)
        tools.append(row)
    out: dict[str, Any] = {"seeds": sw.seeds, "tools": tools, "errors": sw.errors, "seconds": round(sw.seconds, 2)}
    ways = sweep_ways(sw)
    if ways:
        out["ways"] = ways
    return out


def _is_bound(key: str) -> bool:
    return key == "ideal" or key.startswith("ideal-")


WAYS = ("ideal-spares", "ideal-limp", "ideal-both")  # lab.tools.way_tools' keys
FIXED_NOTE = ("over several slices the tpuwatch rows have the same spares ([tpu] spares; every node made alone, a "
              "dead spare made again from [tpu.spec]) and limp with --limp-floor ([job] min_slices); on one "
              "slice they have no spare (tpu.spares is a multislice job's)")


def sweep_ways(sw: Sweep) -> list[dict[str, Any]]:
    """Per way past fixed slices in the sweep: its bound against the fixed-slice one, and what
    share of it each non-bound tool reaches (mean, min over the seeds)."""
    out = []
    for way in (k for k in WAYS if k in sw.goodput):
        g, fixed = sw.goodput[way], sw.goodput.get("ideal")
        row: dict[str, Any] = {"tool": way, "label": sw.labels[sw.keys.index(way)],
                               "goodput_mean": round(statistics.fmean(g), 5), "goodput_min": round(min(g), 5)}
        if fixed is not None:
            of = [x / f if f > 0 else 0.0 for x, f in zip(g, fixed, strict=True)]
            row.update(of_fixed_mean=round(statistics.fmean(of), 5), of_fixed_min=round(min(of), 5))
        for key in (k for k in sw.keys if not _is_bound(k)):
            share = [x / b if b > 0 else 0.0 for x, b in zip(sw.goodput[key], g, strict=True)]
            row[f"{key}_of_it_mean"] = round(statistics.fmean(share), 5)
            row[f"{key}_of_it_min"] = round(min(share), 5)
        out.append(row)
    return out


def render_sweep(sw: Sweep) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"Goodput over seeds {sw.seeds[0]}..{sw.seeds[-1]} ({len(sw.seeds)} traces)")
    for col in ("tool", "mean", "min", "max", "mean of ideal", "min of ideal", "best tool on",
                "TPU API/h (max)", "log reads/h (max)", "slice lost to launch (median / p95)"):
        t.add_column(col, justify="left" if col == "tool" else "right")
    for row in sweep_json(sw)["tools"]:
        best = row.get("best_non_ideal_seeds")
        lost = row.get("slice_lost_to_launch") or {}
        med, p95 = lost.get("median_s"), lost.get("p95_s")
        t.add_row(row["label"], f"{100 * row['goodput_mean']:.2f}%", f"{100 * row['goodput_min']:.2f}%",
                  f"{100 * row['goodput_max']:.2f}%",
                  f"{100 * row['of_ideal_mean']:.2f}%" if "of_ideal_mean" in row else "-",
                  f"{100 * row['of_ideal_min']:.2f}%" if "of_ideal_min" in row else "-",
                  "-" if best is None else f"{best} of {len(sw.seeds)}",
                  f"{row.get('tpu_api_calls_per_hour_max', 0):.1f}", f"{row.get('log_reads_per_hour_max', 0):.1f}",
                  "-" if med is None else f"{_dur(float('inf') if med == 'never' else med)} / "
                                          f"{_dur(float('inf') if p95 == 'never' else p95)}")
    out: list[Any] = [t]
    ways = sweep_ways(sw)
    if ways:
        others = [k for k in sw.keys if not _is_bound(k)]
        tw = Table(title="Ideal bounds past fixed slices: each way's bound, and every tool's share of it (mean / min)")
        for col in ("way", "bound (mean)", "of the fixed-slice bound (mean / min)",
                    *(sw.labels[sw.keys.index(k)] for k in others)):
            tw.add_column(col, justify="left" if col == "way" else "right")
        for w in ways:
            tw.add_row(w["label"], f"{100 * w['goodput_mean']:.2f}%",
                       f"{100 * w['of_fixed_mean']:.2f}% / {100 * w['of_fixed_min']:.2f}%" if "of_fixed_mean" in w else "-",
                       *(f"{100 * w[f'{k}_of_it_mean']:.2f}% / {100 * w[f'{k}_of_it_min']:.2f}%" for k in others))
        out += [tw, Text(FIXED_NOTE)]
    out += [Text(f"POLICY ERROR: {e}", style="bold red") for e in sw.errors]
    out.append(Text(f"{len(sw.seeds)} traces in {sw.seconds:.1f} s"))
    return out


def bug_json(report: Report) -> list[dict[str, Any]]:
    """Per tool, on the permanent-bug trace: launches of the buggy code, when it stopped, waste."""
    out = []
    for r in report.results:
        retrying = None  # relaunch rate of a tool that never stops
        if r.bug_seen_day is not None and r.stopped_day is None:
            hours = max(0.0, report.params.days - r.bug_seen_day) * 24
            retrying = round(r.bad_launches / hours, 1) if hours > 0 else None
        stop_after = None
        if r.bug_seen_day is not None and r.stopped_day is not None:
            stop_after = round((r.stopped_day - r.bug_seen_day) * 86400, 1)
        out.append({"tool": r.key, "label": r.label, "bad_launches": r.bad_launches,
                    "stopped_after_s": stop_after, "stop_reason": r.stop_reason,
                    "tpu_vm_hours_wasted": _round(r.bug_waste_vm_hours, 2), "launches_per_hour": retrying,
                    "tpu_api_calls": r.meter.tpu})
    return out


def render_bug(report: Report) -> Any:
    from rich.table import Table

    days = report.params.days
    bug = next((f for f in report.trace.faults if f.kind == "bug"), None)
    when = f"pushed at day {bug.time / 86400:g}" if bug else "never pushed"
    t = Table(title=f"The permanent bug alone ({when}, relaunched after a maintenance an hour later; "
                    f"run ends at day {days:g})")
    for col in ("tool", "launches of the bug", "stopped after", "TPU VM-h wasted", "relaunches/h", "ended"):
        t.add_column(col, justify="left" if col in ("tool", "ended") else "right")
    for row, r in zip(bug_json(report), report.results, strict=True):
        after = row["stopped_after_s"]
        t.add_row(r.label, str(r.bad_launches), "never" if after is None and r.bad_launches else _dur(after),
                  "-" if row["tpu_vm_hours_wasted"] is None else f"{row['tpu_vm_hours_wasted']:.1f}",
                  "-" if row["launches_per_hour"] is None else f"{row['launches_per_hour']:.1f}",
                  r.stop_short or "-")
    return t


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    return "never" if math.isinf(x) else round(x, 1)


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def render(report: Report) -> list[Any]:
    """rich renderables: the goodput table, the time-to-resume table, and the notes."""
    from rich.table import Table
    from rich.text import Text

    ideal = report.ideal
    p = report.params
    hosts = f"{p.slices} slices of {p.workers} workers" if p.slices > 1 else f"{p.workers} workers"
    t1 = Table(title=f"Goodput over {p.days:g} days, seed {report.trace.seed} "
                     f"({hosts}, {p.step_time:g}s steps, checkpoint every {p.ckpt_every} steps)")
    for col in ("tool", "goodput", "of ideal", "steps lost", "bug: launches", "bug waste (VM-h)",
                "TPU API/h", "log reads/h", "ended"):
        t1.add_column(col, justify="left" if col in ("tool", "ended") else "right")
    for r in report.results:
        of = f"{100 * r.goodput / ideal.goodput:.2f}%" if ideal and ideal.goodput > 0 else "-"
        waste = "-" if r.bug_waste_vm_hours is None else f"{r.bug_waste_vm_hours:.1f}"
        ended = "-" if r.stopped_day is None else f"day {r.stopped_day:.2f}: {r.stop_short}"
        t1.add_row(r.label, f"{100 * r.goodput:.2f}%", of, f"{r.steps_lost:,}", str(r.bad_launches), waste,
                   f"{r.tpu_per_hour:.0f}", f"{r.log_per_hour:.0f}", Text(ended))
    t2 = Table(title="Time to resume after a fault: median / p95 (faults that stopped progress; never = no launch after it)")
    t2.add_column("tool")
    counts = {k: 0 for k in KINDS}
    for r in report.results:
        for k in KINDS:
            counts[k] = max(counts[k], len(r.resume[k]))
    for k in KINDS:
        t2.add_column(k, justify="right")
    for r in report.results:
        cells = []
        for k in KINDS:
            n, med, p95, _ = r.resume_stats(k)
            cells.append("-" if n == 0 else f"{_dur(med)} / {_dur(p95)} (n={n})")
        t2.add_row(r.label, *cells)
    out: list[Any] = [t1, t2]
    ways = report_ways(report)
    if ways:
        others = [r for r in report.results if not _is_bound(r.key)]
        tw = Table(title="Ideal bounds past fixed slices ('of ideal' above is of the fixed-slice bound)")
        for col in ("way", "bound", "of the fixed-slice bound", "fault to launch (median)",
                    *(f"{o.label}: of it" for o in others)):
            tw.add_column(col, justify="left" if col == "way" else "right")
        for w in ways:
            med = w["fault_to_launch_median_s"]
            tw.add_row(w["label"], f"{100 * w['goodput']:.2f}%",
                       "-" if w["of_fixed_ideal"] is None else f"{100 * w['of_fixed_ideal']:.2f}%",
                       _dur(med) if isinstance(med, float) else "-",
                       *("-" if w["of_it"][o.key] is None else f"{100 * w['of_it'][o.key]:.2f}%" for o in others))
        out += [tw, Text(FIXED_NOTE)]
    if p.slices > 1:
        t3 = Table(title=f"Relaunch of the {p.slices}-slice job: from the last slice a disruption took down "
                         "being usable again to every slice running the next attempt")
        for col in ("tool", "disruptions", "median", "p95"):
            t3.add_column(col, justify="left" if col == "tool" else "right")
        for r in report.results:
            n, med, p95 = r.relaunch_stats()
            t3.add_row(r.label, str(n), _dur(med), _dur(p95))
        out.append(t3)
    announced = render_announced(report)
    if announced is not None:
        out.append(announced)
    errors = [r for r in report.results if r.error]
    for r in errors:
        out.append(Text(f"POLICY ERROR in {r.label}: {r.error}", style="bold red"))
    out.append(Text(f"{len(report.results)} tools, {sum(r.events for r in report.results):,} events "
                    f"in {report.seconds:.1f} s"))
    return out
