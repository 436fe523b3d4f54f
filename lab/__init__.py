"""The lab: benchmarks that run in virtual time, the goodput of tpuwatch and of the baselines.

Not part of the product (the wheel holds only `tpuwatch`; lint-imports forbids `tpuwatch` to
import `lab`). It runs from a clone: pytest puts the clone on the path, `scripts/` adds it itself.

- `clock`: the discrete-event engine (virtual time, processes, signals);
- `job`: the training job, modelled analytically (its steps, checkpoints and log at any time);
- `world`: the simulated slices, hosts, bucket, audit log, operations and zone;
- `trace`: the seeded fault trace every tool replays;
- `tools`: `tpuwatch watch`'s loop over the real tick, the baselines (docs/benchmarks.md), the ideal;
- `fakeports`: the TPU API, audit log, workers and checkpoint store of the BenchWorld, for the tick;
- `goodput`: run a trace under each tool, measure, and present the results.
- `compute`: the slice as a Compute Engine MIG (`--api compute`): its faults, the product's own
  mapping of its compute_v1 messages, and the `gcloud compute ssh` baselines.

`scripts/bench_goodput.py` is the command line. Nothing here touches a network, a clock or the
cloud: a 30-day trace runs in seconds and the same seed always gives the same figures.
"""

from lab.clock import Sim
from lab.goodput import Report, ToolResult, as_json, render, run_all, run_tool
from lab.job import Params
from lab.tools import Tool, make_tools, tpuwatch_config
from lab.trace import KINDS, Fault, Trace, TraceConfig, make_trace
from lab.world import BenchWorld, Meter

__all__ = [
    "KINDS", "BenchWorld", "Fault", "Meter", "Params", "Report", "Sim", "Tool", "ToolResult", "Trace",
    "TraceConfig", "as_json", "make_trace", "render", "make_tools", "run_all", "run_tool", "tpuwatch_config",
]
