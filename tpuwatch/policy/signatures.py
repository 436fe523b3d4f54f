"""Known runtime signatures in the job's own output, and what each says about the attempt.

The workers search only the new bytes of the attempt's log at each probe (remote.sh `tw_scan`,
with the patterns of `worker_patterns`) and report the first matching line; `find` says which
signature that line is, and `decide` ends the attempt as its kind says (policy/hang.py). The
patterns are POSIX extended regular expressions (`grep -E`) that Python's `re` reads the same
way (config.py refuses the constructs where the two differ).

Kinds:
- hang        the runtime says the job is stuck: stop it at once, a charged failure;
- crash       the runtime says the job is going down (a peer died): stop every worker at once and
              classify the end as any other (disruption evidence excuses it);
- dirty_host  the TPU could not be opened on a worker (held by a leftover): stop everything (the
              stop removes device holders and a stale lockfile) and relaunch, uncharged the first
              time in a row.
Each built-in names where its text is documented (docs/policy.md shows them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tpuwatch.errors import ConfigError

KINDS = ("hang", "crash", "dirty_host")
OFF = "off"  # [recovery] log_signatures: a built-in turned off by name


@dataclass(frozen=True)
class LogSignature:
    name: str
    pattern: str  # POSIX ERE that Python's re reads the same way
    kind: str  # one of KINDS
    source: str = ""  # where the text is documented (built-ins)


BUILTIN: tuple[LogSignature, ...] = (
    LogSignature("megascale_hang", r"Megascale hang detected|Megascale detects a hang|HANG_DETECTED", "hang",
                 "MaxText docs/guides/megascale_hang_playbook.md (`HANG_DETECTED`, `Megascale detects a hang`, "
                 "after --megascale_graph_hang_threshold, 5m by default); the MXLA debugging workflow guide "
                 "(`Megascale hang detected: Timed out waiting for 4 graphs to complete at launch_id 13650. ... "
                 "Timeout: 1m`)"),
    LogSignature("jax_peer_died", r"JAX distributed service detected fatal errors|stopped sending heartbeats",
                 "crash",
                 "JAX docs/fault_tolerance.rst (`Terminating process because the JAX distributed service detected "
                 "fatal errors. ... The following tasks are unhealthy (stopped sending heartbeats)`)"),
    LogSignature("tpu_busy", r"/dev/vfio/[0-9]+\)?: Device or resource busy|Couldn't open iommu group /dev/vfio",
                 "dirty_host",
                 "https://github.com/vllm-project/tpu-inference/pull/1687 (`Unable to initialize backend 'tpu': UNKNOWN: TPU "
                 "initialization failed: ... /dev/vfio/0): Device or resource busy: Device or resource busy; "
                 "Couldn't open iommu group /dev/vfio/0`); "
                 "https://github.com/marin-community/marin/issues/2618"),
    LogSignature("tpu_in_use", r"TPU is already in use by process|libtpu\.so already in use by another process",
                 "dirty_host",
                 "https://github.com/jax-ml/jax/issues/10192 (a stale /tmp/libtpu_lockfile: `libtpu.so already in use by another "
                 "process`); https://github.com/openxla/xla/pull/4666 (`The TPU is already in use by process with pid N`)"),
    LogSignature("tpu_init_failed", r"TPU initialization failed", "dirty_host",
                 "https://github.com/jax-ml/jax/issues/21761 (`TPU initialization failed`, on a VM a person then recreated); "
                 "`RuntimeError: Unable to initialize backend 'tpu': ... TPU initialization failed: ...`"),
)
BUILTIN_NAMES = tuple(s.name for s in BUILTIN)


def log_signatures(user: Mapping[str, Mapping[str, str]]) -> tuple[LogSignature, ...]:
    """The built-ins, then the user's table ([recovery] log_signatures, validated by config.py):
    an entry with a built-in's name replaces it, class "off" removes it. ConfigError naming an
    "off" entry that names no built-in."""
    out = {s.name: s for s in BUILTIN}
    for name, entry in user.items():
        if entry["class"] == OFF:
            if name not in out:
                raise ConfigError(f"recovery.log_signatures.{name}: class \"off\" turns off a built-in signature, "
                                 f"and there is none of that name; built-ins are {', '.join(BUILTIN_NAMES)}")
            del out[name]
            continue
        out[name] = LogSignature(name, entry["pattern"], entry["class"], "your config")
    return tuple(out.values())


def worker_patterns(sigs: Sequence[LogSignature]) -> tuple[str, ...]:
    """What the workers search for, in table order."""
    return tuple(s.pattern for s in sigs)


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def find(line: str, sigs: Sequence[LogSignature]) -> LogSignature | None:
    """The first signature whose pattern matches `line` (a worker's reported line), else None."""
    for s in sigs:
        if _compiled(s.pattern).search(line):
            return s
    return None
