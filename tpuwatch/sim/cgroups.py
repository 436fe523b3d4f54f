"""The simulated workers' cgroups: a root of the simulator's own under the machine's cgroup tree,
one cgroup per worker under it (its processes found, and killed, without reading every
process of the machine), and the CPU they used (for the benchmarks)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path


def root(instance: str) -> Path | None:
    """A cgroup directory of this simulator's own, under the machine's cgroup v2 tree or else its
    v1 `pids` hierarchy; None where none can be made (not root, no cgroup filesystem)."""
    candidates: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            if parts[2] == "cgroup2":
                candidates.insert(0, Path(parts[1]))
            elif parts[2] == "cgroup" and "pids" in parts[3].split(","):
                candidates.append(Path(parts[1]))
    for base in candidates:
        path = base / f"tpuwatch-sim-{instance}"
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            continue
        probe = path / "probe"
        try:  # a cgroup a process can be moved into: try with a shell of our own
            probe.mkdir(exist_ok=True)
            ok = subprocess.run(["/bin/bash", "-c", 'echo $$ >"$0" && grep -qx "$$" "$0"', str(probe / "cgroup.procs")],
                                capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        remove(probe)
        if ok:
            return path
        remove(path)
    return None


def remove(path: Path | None) -> None:
    """Remove an empty cgroup (its processes killed); a few tries while the last ones are reaped."""
    if path is None:
        return
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def usage_seconds(path: Path | None) -> float | None:
    """CPU seconds the processes of cgroup `path` used while in it (cgroup v2's cpu.stat);
    None without one (no cgroup, cgroup v1, removed)."""
    if path is None:
        return None
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except FileNotFoundError:
        return None
    return None  # cgroup v1: no cpu.stat here
