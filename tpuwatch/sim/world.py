"""The simulated cloud: projects, zones, TPU nodes, operations, audit log, injected faults.

`World` is the whole of it, built in layers that share one state under one lock (see
`core.py` for why they are mixins): `core` (state, scheduler, names, reads, operations, host
effects), `calls` (call meter and error windows), `auditlog` (audit entries, ListLogEntries),
`nodes` (node operations), `queued` (queued resources), `maintenance`, `nodefaults` (node and
worker faults), and Compute Engine's: `instances` (instances and zone operations), `cefaults`
(host error, maintenance, preemption of instances), `migs` (templates, workload policies, MIGs,
resize requests). Compute Engine records are in `cerecords.py`. Records are in `records.py`, zones and accelerator shapes in `shapes.py`.

The gRPC layer (`grpc_api.py`) renders this state as the real protobuf messages; nothing here
imports grpc or Google types. Timed transitions and every effect on the simulated hosts (start,
kill, refuse SSH) run on the one scheduler thread, in the order they were scheduled.

Time: timestamps (create_time, audit entries, healthDescription) are real wall-clock time, so
that a client comparing them with its own clock sees the truth. Durations given to the
simulator (repair takes "30m", a step at "5m", a stockout for "1h") are simulated and run
`speed` times faster: at the default speed 600 a "30m" repair takes 3 s.

Errors an API call would return are `ApiError(code name, message)`; errors in a fault request
(unknown node, bad option) are `tpuwatch.errors.UsageError`.
"""

from __future__ import annotations

from tpuwatch.sim.migs import Migs


class World(Migs):
    """The simulated cloud. Thread-safe; see the module docstring for time and errors."""
