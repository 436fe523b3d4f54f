#!/usr/bin/env python3
"""Goodput of tpuwatch and of the baselines on a seeded 30-day fault trace, in virtual time.

    python scripts/bench_goodput.py                      # the default trace, seed 0, a table
    python scripts/bench_goodput.py --seed 7 --json      # another trace, as JSON
    python scripts/bench_goodput.py --hangs 0 --bug-at none --workers 16 --ckpt-every 1800
    python scripts/bench_goodput.py --maintenance 0 --scheduled 4 --unscheduled 2 --notice-only 2
    python scripts/bench_goodput.py --slices 4                 # one job over 4 slices (Multislice)
    python scripts/bench_goodput.py --api compute              # the slice as a Compute Engine MIG (TPU7x, Spot)
    python scripts/bench_goodput.py --slices 8 --spares 1 --limp-floor 7   # the bounds past fixed slices; tpuwatch with them

Every tool replays the same trace (lab/): tpuwatch itself (`watch`'s loop over the real
tick, policy, config and journal, against in-memory ports), the bash loop of the TPU docs,
TensorFlow's retry.sh, tpunicorn babysit, Levanter's babysit script, SkyPilot's managed-job loop,
and an oracle that bounds them all. See docs/benchmarks.md for the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's lab/ (not in the wheel)

from lab import (
    Params,
    TraceConfig,
    make_tools,
    make_trace,
    render,
    run_all,
    tpuwatch_config,
)
from lab.goodput import as_json, bug_json, render_bug, render_sweep, sweep, sweep_json
from lab.tools import per_slice_tool, reactive_tool, way_tools
from lab.trace import make_bug_trace
from tpuwatch.config import SCHEMA
from tpuwatch.durations import human, parse_duration
from tpuwatch.errors import TpuwatchError, UsageError

# The "tuned" row: tpuwatch's defaults plus these [recovery] keys (docs/benchmarks.md
# says why each); --tuned KEY=VALUE changes or adds one.
TUNED: dict[str, str | int] = {"repair_timeout": "10m"}
RECOVERY_FLAGS = ("poll_interval", "repair_timeout", "max_restarts", "max_recreates", "no_progress_limit",
                  "min_uptime", "queue_timeout", "hang_timeout", "backoff_max", "stable_run")


def _duration(flag: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            return parse_duration(text if not text.replace(".", "", 1).isdigit() else f"{text}s", key=flag)
        except TpuwatchError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _fraction(text: str) -> float | None:
    if text.lower() in ("none", "never", "off"):
        return None
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bug-at: expected a fraction of the run in [0, 1] or 'none', got {text!r}") from None
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"--bug-at: {x} is outside [0, 1]")
    return x


def _seeds(text: str) -> list[int]:
    a, _, b = text.partition("-")
    try:
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds: expected A-B (e.g. 0-19), got {text!r}") from None
    if hi < lo:
        raise argparse.ArgumentTypeError(f"--seeds: {hi} is before {lo}")
    return list(range(lo, hi + 1))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench_goodput.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d, t = Params(), TraceConfig()
    g = ap.add_argument_group("the job and the slice")
    g.add_argument("--api", choices=("tpu", "compute"), default="tpu",
                   help="the API that made the slice: a Cloud TPU API node, or a Compute Engine MIG "
                        "(lab.compute)")
    g.add_argument("--provisioning", choices=("spot", "standard"), default="spot",
                   help="--api compute: the MIG's VMs (standard: no preemptions; host errors restarted by "
                        "Compute Engine instead of the MIG's autoheal)")
    g.add_argument("--seed", type=int, default=0, help="fault trace seed")
    g.add_argument("--days", type=float, default=d.days, help="length of the run")
    g.add_argument("--workers", type=int, default=d.workers, help="hosts in the slice (in each slice)")
    g.add_argument("--slices", type=int, default=d.slices,
                   help="pod slices the job spans (Multislice); faults are drawn per slice")
    g.add_argument("--step-time", type=_duration("--step-time"), default=d.step_time, help="seconds per step")
    g.add_argument("--ckpt-every", type=int, default=d.ckpt_every, help="steps between checkpoints")
    g.add_argument("--ckpt-save", type=_duration("--ckpt-save"), default=d.ckpt_save, help="checkpoint save time")
    g.add_argument("--steps", type=int, default=None, help="job length in steps (default: more than fits)")
    g.add_argument("--startup", type=_duration("--startup"), default=d.startup, help="program start + restore")
    g = ap.add_argument_group(
        "past fixed slices: the ideal bound of each way; over several slices both tpuwatch rows use them too "
        "(--spares: [tpu] spares; --limp-floor: [job] min_slices)")
    g.add_argument("--spares", type=int, default=0,
                   help="idle same-shape slices kept READY beside the job's, with faults of their own: adds "
                        "the bound with them (ideal-spares); over several slices both tpuwatch rows have them "
                        "([tpu] spares, every node made alone, a dead spare made again from [tpu.spec])")
    g.add_argument("--limp-floor", type=int, default=None, metavar="K",
                   help="multislice: the job may run on K or more of its slices, a step on k of n counting k/n: "
                        "adds the bound limping (ideal-limp; ideal-both with --spares), and both tpuwatch rows "
                        "limp ([job] min_slices = K, when K is below --slices) on slices made one by one with "
                        "[tpu.spec]")
    g.add_argument("--limp-queued", action="store_true",
                   help="with --limp-floor: the slices are one multislice queued resource, as at fixed slices "
                        "(a dead slice is taken back and the request recreated as a whole), not made one by one")
    g = ap.add_argument_group("the cloud")
    g.add_argument("--create-time", type=_duration("--create-time"), default=d.create_time)
    g.add_argument("--delete-time", type=_duration("--delete-time"), default=d.delete_time)
    g.add_argument("--audit-delay", type=_duration("--audit-delay"), default=d.audit_delay,
                   help="audit entries are readable this long after the event")
    g.add_argument("--autorepair-after", type=_duration("--autorepair-after"), default=d.autorepair_after,
                   help="multislice: a slice that fails for good is created again by Google this long after")
    g.add_argument("--multislice-restart", type=_duration("--multislice-restart"), default=d.multislice_restart,
                   help="multislice: the other slices restart for this long once the new slice is READY")
    g.add_argument("--heal-median", type=_duration("--heal-median"), default=t.heal_median,
                   help="median repair time of a healing maintenance (log-normal)")
    g.add_argument("--heal-sigma", type=float, default=t.heal_sigma)
    g.add_argument("--stockout-median", type=_duration("--stockout-median"), default=t.stockout_median)
    g.add_argument("--stockout-sigma", type=float, default=t.stockout_sigma)
    g = ap.add_argument_group("faults per 30 days")
    g.add_argument("--maintenance", type=float, default=t.maintenance, help="maintenance events that heal")
    g.add_argument("--stuck", type=float, default=t.stuck, help="maintenance events that never heal")
    g.add_argument("--preemptions", type=float, default=t.preemptions)
    g.add_argument("--stockout-after-preemption", type=float, default=t.stockout_after_preemption,
                   help="chance of a stockout window after a preemption")
    g.add_argument("--stockouts", type=float, default=t.stockouts, help="other stockout windows")
    g.add_argument("--crashes", type=float, default=t.crashes, help="one worker exits 139 once")
    g.add_argument("--hangs", type=float, default=t.hangs, help="progress stops, processes live")
    g.add_argument("--bug-at", type=_fraction, default=t.bug_at,
                   help="push the buggy code at this fraction of the run ('none': never)")
    g = ap.add_argument_group("announced maintenance per 30 days (each heals; none by default)")
    g.add_argument("--scheduled", type=float, default=t.scheduled,
                   help="SCHEDULED, canReschedule: upcomingMaintenance --scheduled-lead ahead, then the notice")
    g.add_argument("--unscheduled", type=float, default=t.unscheduled,
                   help="UNSCHEDULED, canReschedule: upcomingMaintenance --unscheduled-lead ahead, then the notice")
    g.add_argument("--notice-only", type=float, default=t.notice_only,
                   help="not reschedulable: only the metadata server's termination notice, --notice-lead ahead")
    g.add_argument("--scheduled-lead", type=_duration("--scheduled-lead"), default=t.scheduled_lead)
    g.add_argument("--unscheduled-lead", type=_duration("--unscheduled-lead"), default=t.unscheduled_lead)
    g.add_argument("--notice-lead", type=_duration("--notice-lead"), default=d.notice_lead,
                   help="TERMINATE_ON_HOST_MAINTENANCE comes this long before the host goes down")
    g.add_argument("--no-save-on-term", dest="save_on_term", action="store_false",
                   help="the job does not save a checkpoint when signalled (it dies of the signal)")
    g = ap.add_argument_group(
        "tpuwatch: [recovery] keys of both tpuwatch rows (default: the product's own default); the "
        "'tuned' row also sets " + ", ".join(f"{k}={v}" for k, v in TUNED.items()))
    for key in RECOVERY_FLAGS:
        flag = "--poll" if key == "poll_interval" else "--" + key.replace("_", "-")
        kind = int if key in ("max_restarts", "max_recreates", "no_progress_limit") else _duration(flag)
        default = SCHEMA["recovery"][key].default
        shown = human(default) if isinstance(default, float) else default
        g.add_argument(flag, dest=key, type=kind, default=argparse.SUPPRESS,
                       help=f"recovery.{key} (tpuwatch's default: {shown})")
    g.add_argument("--tuned", action="append", default=[], metavar="KEY=VALUE",
                   help="set a [recovery] key of the tuned row only, e.g. --tuned repair_timeout=10m")
    g.add_argument("--every-tick", action="store_true",
                   help="run every tick of tpuwatch (no fast-forward over idle periods; same figures, slower)")
    g = ap.add_argument_group("output")
    g.add_argument("--skypilot-restarts", type=int, default=0, help="SkyPilot max_restarts_on_errors")
    g.add_argument("--tools", default="", help="comma-separated tool keys (default: all)")
    g.add_argument("--seeds", type=_seeds, default=None,
                   help="A-B: run every seed from A to B and print goodput over them (replaces --seed)")
    g.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.days <= 0 or args.workers < 1 or args.step_time <= 0 or args.ckpt_every < 1:
        raise UsageError("--days, --step-time must be > 0; --workers, --ckpt-every at least 1")
    if min(args.scheduled, args.unscheduled, args.notice_only) < 0 or args.notice_lead < 0:
        raise UsageError("--scheduled, --unscheduled, --notice-only and --notice-lead must not be negative")
    if args.slices < 1:
        raise UsageError(f"--slices: expected 1 or more, got {args.slices}")
    if args.slices > 1 and max(args.scheduled, args.unscheduled, args.notice_only) > 0:
        raise UsageError("--scheduled, --unscheduled and --notice-only are modelled on one slice only: "
                         "leave them at 0 with --slices")
    if args.spares < 0:
        raise UsageError(f"--spares: expected 0 or more idle slices, got {args.spares}")
    if args.limp_floor is not None:
        if args.slices < 2:
            raise UsageError("--limp-floor: limping needs a job over several slices: give --slices 2 or more")
        if not 1 <= args.limp_floor <= args.slices:
            raise UsageError(f"--limp-floor: expected 1 to --slices ({args.slices}) slices, got {args.limp_floor}")
    if args.api == "compute" and (args.spares or args.limp_floor is not None):
        raise UsageError("--spares and --limp-floor are modelled over Cloud TPU API nodes only: drop --api compute")
    if args.api == "compute" and args.slices > 1:
        raise UsageError("--api compute: one slice only (Google documents no multislice over Compute Engine MIGs)")
    if args.api == "compute" and args.provisioning == "standard":
        args.preemptions = 0.0  # only Spot VMs are preempted
    p = Params(days=args.days, workers=args.workers, step_time=args.step_time, ckpt_every=args.ckpt_every,
               ckpt_save=args.ckpt_save, steps=args.steps, startup=args.startup, create_time=args.create_time,
               delete_time=args.delete_time, audit_delay=args.audit_delay, notice_lead=args.notice_lead,
               save_on_term=args.save_on_term, slices=args.slices, autorepair_after=args.autorepair_after,
               multislice_restart=args.multislice_restart, limp_queued=args.limp_queued)
    tc = TraceConfig(maintenance=args.maintenance, stuck=args.stuck, preemptions=args.preemptions,
                     stockout_after_preemption=args.stockout_after_preemption, stockouts=args.stockouts,
                     crashes=args.crashes, hangs=args.hangs, bug_at=args.bug_at, heal_median=args.heal_median,
                     heal_sigma=args.heal_sigma, stockout_median=args.stockout_median,
                     stockout_sigma=args.stockout_sigma, scheduled=args.scheduled, unscheduled=args.unscheduled,
                     notice_only=args.notice_only, scheduled_lead=args.scheduled_lead,
                     unscheduled_lead=args.unscheduled_lead)
    common = {k: getattr(args, k) for k in RECOVERY_FLAGS if getattr(args, k, None) is not None}
    tuned_keys: dict[str, Any] = dict(TUNED)
    for item in args.tuned:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--tuned: expected KEY=VALUE such as repair_timeout=10m, got {item!r}")
        tuned_keys[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    cfg = tpuwatch_config(**common)
    tuned = tpuwatch_config(**{**common, **tuned_keys})
    if args.api == "compute":
        from lab.compute import compute_config, compute_tools

        cfg, tuned = compute_config(**common), compute_config(**{**common, **tuned_keys})
        chosen = compute_tools(cfg, tuned, args.provisioning, skip_idle=not args.every_tick)
    else:
        chosen = make_tools(cfg, tuned, args.skypilot_restarts, skip_idle=not args.every_tick, slices=args.slices,
                            limp_floor=args.limp_floor, spares=args.spares if args.slices > 1 else 0)
    if args.tools:
        # one tpuwatch per slice of a one-slice job is tpuwatch itself: there on request only
        available = chosen + ([per_slice_tool(cfg, not args.every_tick)] if args.slices == 1 and args.api == "tpu" else [])
        # so is the bound without foresight over several slices (what waiting out every repair can reach)
        if args.slices > 1:
            available.insert(1, reactive_tool(cfg))
        keys = [k.strip() for k in args.tools.split(",") if k.strip()]
        unknown = [k for k in keys if k not in {t.key for t in available}]
        if unknown:
            where = f" with --slices {args.slices}" if args.slices > 1 else ""
            raise UsageError(f"--tools: unknown tool {unknown[0]!r}{where}; choose from "
                             + ", ".join(t.key for t in available))
        chosen = [t for t in available if t.key in keys]
    # the bounds past fixed slices, after the fixed-slice ones (what the flags are for: always shown)
    ways = way_tools(args.spares, args.limp_floor)
    at = next((i + 1 for i, t in enumerate(chosen) if t.key == "ideal"), 0)
    chosen = chosen[:at] + ways + chosen[at:]
    if args.seeds:
        sw = sweep(chosen, [make_trace(s, p.days, p.workers, tc, p.slices, args.spares) for s in args.seeds], p)
        if args.json:
            json.dump(sweep_json(sw), sys.stdout, indent=2)
            print()
        else:
            from rich.console import Console

            for part in render_sweep(sw):
                Console(width=150).print(part)
        return 1 if sw.errors else 0
    report = run_all(chosen, make_trace(args.seed, p.days, p.workers, tc, p.slices, args.spares), p)
    bug = run_all([t for t in chosen if t not in ways], make_bug_trace(p.days, spares=args.spares), p)
    if args.json:
        out = as_json(report)
        out["permanent_bug"] = bug_json(bug)
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        from rich.console import Console

        console = Console(width=max(150, Console().width))
        for part in render(report):
            console.print(part)
        console.print(render_bug(bug))
    return 1 if any(r.error for r in report.results + bug.results) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TpuwatchError as exc:
        print(f"bench_goodput.py: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
