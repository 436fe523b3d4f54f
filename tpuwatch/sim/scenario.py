"""Scenario files: a TOML description of a simulated world and the faults to play in it.

```toml
[sim]
speed = 600                 # simulated seconds per real second
seed = 1
project = "sim-project"
zone = "us-central2-b"
zones = ["us-central2-b", "us-east5-a"]   # optional: only these zones exist
log_latency = "30s"         # optional: audit entries become readable this long after their time
[sim.delays]                # optional: how long operations take (simulated)
create = "2m"

[[node]]
name = "llm-pod"
accelerator_type = "v4-32"
spot = false
labels = { team = "ml" }
metadata = { foo = "bar" }
startup_script = "resume.sh"   # file (relative to this scenario) -> metadata startup-script

[[instance]]                # a Compute Engine TPU VM (any option of fault create-instance)
name = "vm"
machine_type = "tpu7x-standard-4t"

[[mig]]                     # a MIG of TPU VMs (any option of fault create-mig)
name = "slice"
machine_type = "tpu7x-standard-4t"
size = 4
topology = "2x2x4"          # a multi-host slice
spot = false

[[step]]
at = "5m"                   # simulated time after start
fault = "maintenance"       # any fault of `tpuwatch sim inject --help`
node = "llm-pod"
heal_after = "30m"
```
Every key is checked: an unknown key, a bad duration or an unknown accelerator type is a
UsageError naming it (exit 2). This module only reads and checks; the Simulator plays it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuwatch.durations import parse_duration
from tpuwatch.errors import UsageError
from tpuwatch.sim import faults
from tpuwatch.sim.core import DEFAULT_DELAYS
from tpuwatch.sim.shapes import ZONE_RE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SIM_KEYS = ("speed", "seed", "project", "zone", "zones", "log_latency", "delays")


@dataclass(frozen=True)
class Step:
    index: int
    at: float  # simulated seconds after the start
    fault: str
    params: dict[str, Any]

    def describe(self) -> str:
        target = self.params.get("node") or self.params.get("name") or self.params.get("zone") or ""
        return f"{self.fault} {target}".strip()


@dataclass
class Scenario:
    path: Path | None = None
    speed: float | None = None
    seed: int | None = None
    project: str | None = None
    zone: str | None = None
    zones: list[str] | None = None
    log_latency: float | None = None
    delays: dict[str, float] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)  # create-instance options
    migs: list[dict[str, Any]] = field(default_factory=list)  # create-mig options
    steps: list[Step] = field(default_factory=list)


def load(path: str | Path) -> Scenario:
    """Read and check a scenario file."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"--scenario: cannot read {str(p)!r}: {exc.strerror}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{p}: not valid TOML: {exc}")
    scenario = parse(data, where=str(p), base_dir=p.parent)
    scenario.path = p
    return scenario


def _unknown(where: str, key: str, known: tuple[str, ...] | list[str]) -> UsageError:
    return UsageError(
        f"{where}: unknown key {key!r}{faults.did_you_mean(key, list(known))}; known keys: {', '.join(known)}"
    )


def parse(
    data: Mapping[str, Any], *, where: str = "scenario", base_dir: Path | None = None
) -> Scenario:
    out = Scenario()
    for key in data:
        if key not in ("sim", "node", "instance", "mig", "step"):
            raise _unknown(where, key, ("sim", "node", "instance", "mig", "step"))
    sim = data.get("sim", {})
    if not isinstance(sim, Mapping):
        raise UsageError(f"{where}: [sim] must be a table")
    for key, value in sim.items():
        w = f"{where}: sim.{key}"
        if key not in SIM_KEYS:
            raise _unknown(f"{where}: [sim]", key, SIM_KEYS)
        if key == "speed":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise UsageError(f"{w}: expected a number above zero, got {value!r}")
            out.speed = float(value)
        elif key == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{w}: expected a whole number, got {value!r}")
            out.seed = value
        elif key in ("project", "zone"):
            if not isinstance(value, str) or not value:
                raise UsageError(f"{w}: expected a name, got {value!r}")
            if key == "zone" and not ZONE_RE.match(value):
                raise UsageError(f"{w}: {value!r} is not a zone name such as us-central2-b")
            setattr(out, key, value)
        elif key == "zones":
            if not isinstance(value, list) or not all(
                isinstance(z, str) and ZONE_RE.match(z) for z in value
            ):
                raise UsageError(
                    f'{w}: expected a list of zone names such as ["us-central2-b"], got {value!r}'
                )
            out.zones = list(value)
        elif key == "log_latency":
            out.log_latency = parse_duration(value, key=w)
        elif key == "delays":
            if not isinstance(value, Mapping):
                raise UsageError(f"{w}: expected a table of durations")
            for dk, dv in value.items():
                if dk not in DEFAULT_DELAYS:
                    raise _unknown(f"{where}: [sim.delays]", dk, list(DEFAULT_DELAYS))
                out.delays[dk] = parse_duration(dv, key=f"{w}.{dk}")

    nodes = data.get("node", [])
    if not isinstance(nodes, list):
        raise UsageError(f"{where}: nodes are written [[node]] (an array of tables)")
    names: set[str] = set()
    for i, node in enumerate(nodes):
        w = f"{where}: node[{i}]"
        if not isinstance(node, Mapping):
            raise UsageError(f"{w}: expected a table")
        norm = faults.normalize("create-node", node, where=w, base_dir=base_dir)
        ident = (norm.get("project"), norm.get("zone"), norm["name"])
        if ident in names:
            raise UsageError(f"{w}.name: node {norm['name']!r} is listed twice")
        names.add(norm["name"])
        out.nodes.append(norm)

    for table, fault, into in (("instance", "create-instance", out.instances), ("mig", "create-mig", out.migs)):
        rows = data.get(table, [])
        if not isinstance(rows, list):
            raise UsageError(f"{where}: {table}s are written [[{table}]] (an array of tables)")
        seen: set[tuple[Any, Any, str]] = set()
        for i, row in enumerate(rows):
            w = f"{where}: {table}[{i}]"
            if not isinstance(row, Mapping):
                raise UsageError(f"{w}: expected a table")
            norm = faults.normalize(fault, row, where=w, base_dir=base_dir)
            ident = (norm.get("project"), norm.get("zone"), norm["name"])
            if ident in seen:
                raise UsageError(f"{w}.name: {table} {norm['name']!r} is listed twice")
            seen.add(ident)
            into.append(norm)

    steps = data.get("step", [])
    if not isinstance(steps, list):
        raise UsageError(f"{where}: steps are written [[step]] (an array of tables)")
    for i, step in enumerate(steps):
        w = f"{where}: step[{i}]"
        if not isinstance(step, Mapping):
            raise UsageError(f"{w}: expected a table")
        if "at" not in step:
            raise UsageError(f'{w}.at: required (simulated time after start, e.g. "5m")')
        if "fault" not in step:
            raise UsageError(f"{w}.fault: required; one of {', '.join(faults.FAULTS)}")
        at = parse_duration(step["at"], key=f"{w}.at")
        fault = step["fault"]
        if not isinstance(fault, str):
            raise UsageError(f"{w}.fault: expected a fault name, got {fault!r}")
        faults.get(fault, where=f"{w}.fault")
        params = {k: v for k, v in step.items() if k not in ("at", "fault")}
        out.steps.append(
            Step(i, at, fault, faults.normalize(fault, params, where=w, base_dir=base_dir))
        )
    out.steps.sort(key=lambda s: (s.at, s.index))
    return out
