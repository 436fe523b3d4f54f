"""Benchmarks that run in virtual time: the goodput of tpuwatch and of the baselines.

- `engine`: the discrete-event clock and the simulated slice, job, bucket, audit log and zone;
- `trace`: the seeded fault trace every tool replays;
- `tools`: `tpuwatch watch`'s loop over the real tick, the baselines (docs/benchmarks.md), the ideal;
- `fakeports`: the TPU API, audit log, workers and checkpoint store of the BenchWorld, for the tick;
- `goodput`: run a trace under each tool, measure, and present the results.
- `compute`: the slice as a Compute Engine MIG (`--api compute`): its faults, the product's own
  mapping of its compute_v1 messages, and the `gcloud compute ssh` baselines.

`scripts/bench_goodput.py` is the command line. Nothing here touches a network, a clock or the
cloud: a 30-day trace runs in seconds and the same seed always gives the same figures.
"""

from tpuwatch.bench.engine import BenchWorld, Meter, Params, Sim
from tpuwatch.bench.goodput import Report, ToolResult, as_json, render, run_all, run_tool
from tpuwatch.bench.tools import Tool, make_tools, tpuwatch_config
from tpuwatch.bench.trace import KINDS, Fault, Trace, TraceConfig, make_trace

__all__ = [
    "KINDS", "BenchWorld", "Fault", "Meter", "Params", "Report", "Sim", "Tool", "ToolResult", "Trace",
    "TraceConfig", "as_json", "make_trace", "render", "make_tools", "run_all", "run_tool", "tpuwatch_config",
]
