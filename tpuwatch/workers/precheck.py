"""Environment checks on the workers: what to ask, and what the answers mean.

Before every launch, and every `precheck.interval` while the job runs, each selected worker
runs `workers/precheck.sh` in one SSH round trip. The script only measures (free space, ulimits,
devices, holders, the libtpu lockfile, DNS, the interpreter, custom commands); this module
turns the measurements into `model.CheckItem`s with a verdict against the thresholds of
`[precheck]`, so the thresholds live in one place and the script needs no change for a new one.

The pieces:
- `Settings.from_config(cfg)`: the `[precheck]` keys as plain values;
- `script(...)`: the script run on a worker (precheck.sh behind shell-quoted TW_* assignments);
- `evaluate(...)`: one worker's answer -> CheckItems (pure);
- `Prechecker(workers, settings).run(node, context)`: all of it over SSH -> PrecheckReport;
- `record(journal, now, report)`, `last(journal)`: the last report kept in the job's journal.

Check ids: disk, shm, cache, ulimit, dns, devices, device_holders, libtpu_lock, interpreter, and
`custom:<name>` for each [[precheck.custom]]. Fixable items (orphan device holders, a stale or
orphan-held libtpu lockfile) are fixed by the worker cleanup of remote.sh (`SshWorkers.stop`),
not here. This module decides nothing, and sees the journal only through `PrecheckJournal`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tpuwatch.config import PRECHECK_IDS
from tpuwatch.durations import human
from tpuwatch.model import (
    CheckItem,
    CheckVerdict,
    NodeSnapshot,
    PrecheckReport,
    WorkerEndpoint,
    WorkerProbe,
)
from tpuwatch.workers import protocol

if TYPE_CHECKING:
    from tpuwatch.config import Config
    from tpuwatch.workers.ssh import SshResult
    from tpuwatch.workers.sshworkers import SshWorkers

Context = Literal["launch", "running"]
MARK = "@tpuwatch-check "
END = "@tpuwatch-check-end"
BASE_TIMEOUT = 30.0  # seconds for the built-in checks of one worker (they take well under one)
_PYTHON = re.compile(r"^(python|python[23](\.\d+)?|pypy3?)$")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n", "|&"})


@lru_cache(maxsize=1)
def precheck_script() -> str:
    """precheck.sh as it runs on a worker (without its whole-line comments)."""
    return protocol.uncommented(protocol.packaged("precheck.sh"))


@dataclass(frozen=True)
class CustomCheck:
    name: str
    command: str
    timeout: float  # seconds


@dataclass(frozen=True)
class Settings:
    """The [precheck] keys, in bytes and seconds (precheck.enabled is the wiring's: no checker when off)."""

    skip: frozenset[str] = frozenset()
    interval: float = 600.0
    min_disk: float = 32e9
    min_shm: float = 1e9
    cache_path: str = ""
    min_cache: float = 32e9
    min_open_files: int = 0
    min_locked_memory: float = 0.0  # bytes; inf = must be unlimited
    min_processes: int = 0
    min_stack: float = 0.0  # bytes; inf = must be unlimited
    custom: tuple[CustomCheck, ...] = ()

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        p = cfg.precheck
        return cls(
            skip=frozenset(p["skip"]),
            interval=float(p["interval"]),
            min_disk=float(p["min_disk"]),
            min_shm=float(p["min_shm"]),
            cache_path=str(p["cache_path"]),
            min_cache=float(p["min_cache"]),
            min_open_files=int(p["min_open_files"]),
            min_locked_memory=float(p["min_locked_memory"]),
            min_processes=int(p["min_processes"]),
            min_stack=float(p["min_stack"]),
            custom=tuple(CustomCheck(c["name"], c["command"], float(c["timeout"])) for c in p["custom"]),
        )

    @property
    def checks(self) -> tuple[str, ...]:
        """The built-in checks to run, in report order."""
        return tuple(c for c in PRECHECK_IDS if c not in self.skip)

    @property
    def custom_checks(self) -> tuple[CustomCheck, ...]:
        return tuple(c for c in self.custom if c.name not in self.skip)

    def timeout(self, base: float = BASE_TIMEOUT) -> float:
        """How long one worker's round trip may take: the built-ins plus every custom timeout."""
        return base + sum(c.timeout + 2 for c in self.custom_checks)


# ---- what the job needs ---------------------------------------------------------------------


def chips_per_host(accelerator_type: str) -> int | None:
    """TPU chips (device files) each host of this accelerator type has; None when unknown.

    v2, v3, v4 and v5p hosts have 4 chips. v5e (v5litepod) and v6e slices of up to 8 chips are
    one host with all of them; bigger slices have 4 chips per host. A Compute Engine machine type
    names the chips of its VM: `tpu7x-standard-4t`, `ct6e-standard-8t`, `ct5p-hightpu-4t`.
    """
    ce = re.match(r"^[a-z0-9]+-[a-z]+-(\d+)t$", accelerator_type.strip().lower())
    if ce:
        return int(ce.group(1))
    m = re.match(r"^(v2|v3|v4|v5p|v5litepod|v5e|v6e)-(\d+)$", accelerator_type.strip().lower())
    if not m:
        return None
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v5e", "v6e"):
        return n if n <= 8 else 4
    return 4


def interpreter_of(command: str) -> str:
    """The job's Python interpreter as the command names it ("" when it names none we can check).

    The first word in command position whose name is python-ish: `python3 train.py`,
    `cd ~/repo && ~/venv/bin/python -m train`, `env X=1 python train.py`. A relative path is
    not checked (the command may `cd` first), nor a word built from a variable.
    """
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return ""
    expect_command = True
    for w in words:
        if w in _SEPARATORS or set(w) <= set(";&|()"):
            expect_command = True
            continue
        if not expect_command:
            continue
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w) or w in ("env", "exec", "nohup", "time", "nice", "command"):
            continue  # still in command position: assignments and wrappers come before it
        expect_command = False
        base = w.rsplit("/", 1)[-1]
        if not _PYTHON.match(base) or "$" in w or "{" in w:
            continue
        if "/" in w and not w.startswith(("/", "~/")):
            return ""
        return w
    return ""


# ---- what is sent ---------------------------------------------------------------------------


def script(settings: Settings, *, job: str, peers: Sequence[str], interpreter: str = "",
           env: Mapping[str, str] | None = None) -> bytes:
    """precheck.sh for one worker, behind its TW_* inputs (the protocol's own wrapper)."""
    custom = settings.custom_checks
    return protocol.wrap(precheck_script(), job, {
        "checks": ("precheck.skip", " ".join(settings.checks)),
        "cache_path": ("precheck.cache_path", settings.cache_path),
        "peers": ("peers", list(peers)),
        "interpreter": ("job.command", interpreter),
        "env": ("job.env", protocol.env_pairs(env)),
        "custom_name": ("precheck.custom.name", [c.name for c in custom]),
        "custom_cmd": ("precheck.custom.command", [c.command for c in custom]),
        "custom_timeout": ("precheck.custom.timeout", [f"{c.timeout:g}s" for c in custom]),
    })


# ---- what comes back ------------------------------------------------------------------------


def parse(text: str) -> tuple[dict[str, dict[str, str]], bool]:
    """The script's answer: {check id: {key: value}}, and whether it ran to its end."""
    out: dict[str, dict[str, str]] = {}
    ended = False
    for line in text.splitlines():
        if line.strip() == END:
            ended = True
            continue
        if not line.startswith(MARK):
            continue
        fields: dict[str, str] = {}
        for part in line[len(MARK):].split("\t"):
            key, sep, value = part.partition("=")
            if sep:
                fields[key.strip()] = value
        check = fields.pop("id", "")
        if check:
            out[check] = fields
    return out, ended


def size_text(n: float, binary: bool = False) -> str:
    """`32 GB`, `1.5 GB`, `512 MB`, `unlimited`: decimal units, as the config's defaults are
    (binary ones, `8 MiB`, for ulimits, which count KiB)."""
    if math.isinf(n):
        return "unlimited"
    units = (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)) if binary else \
        (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
    for unit, mult in units:
        if n >= mult:
            v = n / mult
            return f"{v:.1f} {unit}".replace(".0 ", " ")
    return f"{int(n)} B"


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    t = text.strip().lower()
    if t == "unlimited":
        return math.inf
    try:
        return float(t)
    except ValueError:
        return None


def _space(check: str, worker: int, rec: Mapping[str, str], minimum: float, what: str,
           key: str) -> CheckItem:
    if "error" in rec:
        return CheckItem(check, worker, "fail", detail=rec["error"], threshold=f"> {size_text(minimum)}")
    measured = _num(rec.get("size" if what == "size" else "free"))
    if measured is None:
        return CheckItem(check, worker, "fail", detail=f"no {what} measured at {rec.get('path', '?')}")
    value = f"{size_text(measured)} {'total' if what == 'size' else 'free'} at {rec.get('path', '?')}"
    note = rec.get("note", "")
    if measured < minimum:
        return CheckItem(check, worker, "fail", value, f"> {size_text(minimum)} ({key})", note)
    return CheckItem(check, worker, "pass", value, f"> {size_text(minimum)}", note)


def _ulimit(worker: int, rec: Mapping[str, str], s: Settings) -> CheckItem:
    # (name in the answer, unit multiplier to bytes or 1, minimum, config key, label)
    rows = [
        ("open_files", 1.0, float(s.min_open_files), "precheck.min_open_files", "open files"),
        ("locked_memory_kb", 1024.0, s.min_locked_memory, "precheck.min_locked_memory", "locked memory"),
        ("processes", 1.0, float(s.min_processes), "precheck.min_processes", "processes"),
        ("stack_kb", 1024.0, s.min_stack, "precheck.min_stack", "stack"),
    ]
    shown, low, need = [], [], []
    for name, mult, minimum, key, label in rows:
        raw = _num(rec.get(name))
        if raw is None:
            shown.append(f"{label} ?")
            if minimum > 0:
                low.append(f"{label} not measured ({key})")
            continue
        value = raw * mult
        text = (size_text(value, binary=True) if mult > 1 else ("unlimited" if math.isinf(value) else f"{int(value)}"))
        shown.append(f"{label} {text}")
        if minimum > 0:
            want = size_text(minimum, binary=True) if mult > 1 else ("unlimited" if minimum >= 2**63 - 1 else f"{int(minimum)}")
            need.append(f"{label} >= {want}")
            if value < minimum:
                low.append(f"{label} {text} < {want} ({key})")
    value_text = ", ".join(shown)
    threshold = ", ".join(need)
    if low:
        return CheckItem("ulimit", worker, "fail", value_text, threshold, "; ".join(low))
    return CheckItem("ulimit", worker, "pass", value_text, threshold)


def _pids_of(text: str) -> str:
    return " ".join(text.split())


def evaluate(worker: int, answer: Mapping[str, Mapping[str, str]], settings: Settings, *,
             context: Context, chips: int | None, ended: bool = True,
             failure: str = "") -> tuple[CheckItem, ...]:
    """One worker's answer -> a CheckItem per requested check (pure).

    `context` "launch": nothing of the job may hold the TPU (every holder is an orphan, fixed by
    the cleanup before the launch); "running": the job's own processes hold it, only a foreign
    process is a failure. `chips`: devices each host should have (None: at least one).
    `failure`: why the script did not answer in full (a check with no answer fails with it).
    """
    items: list[CheckItem] = []
    missing = failure or ("the check script stopped before its end" if not ended else "no answer")
    for check in settings.checks:
        rec = answer.get(check)
        if rec is None:
            items.append(CheckItem(check, worker, "fail", detail=f"no answer from the worker ({missing})"))
            continue
        if "skip" in rec:
            items.append(CheckItem(check, worker, "skip", detail=rec["skip"]))
            continue
        items.append(_evaluate_one(check, worker, rec, settings, context, chips))
    for c in settings.custom_checks:
        rec = answer.get(f"custom:{c.name}")
        check = f"custom:{c.name}"
        if rec is None:
            items.append(CheckItem(check, worker, "fail", detail=f"no answer from the worker ({missing})"))
            continue
        code = _num(rec.get("exit_code"))
        output = rec.get("output", "")
        timeout = f"{human(c.timeout)} timeout"
        if code == 0:
            items.append(CheckItem(check, worker, "pass", "exit 0", "exit 0", output))
        elif code in (124, 137):
            items.append(CheckItem(check, worker, "fail", f"killed after {human(c.timeout)}", "exit 0",
                                   f"did not finish within its {timeout}" + (f"; last output: {output}" if output else "")))
        else:
            shown = "?" if code is None else f"{int(code)}"
            items.append(CheckItem(check, worker, "fail", f"exit {shown}", "exit 0", output))
    return tuple(items)


def _evaluate_one(check: str, worker: int, rec: Mapping[str, str], s: Settings, context: Context,
                  chips: int | None) -> CheckItem:
    if check == "disk":
        return _space("disk", worker, rec, s.min_disk, "free", "precheck.min_disk")
    if check == "shm":
        return _space("shm", worker, rec, s.min_shm, "size", "precheck.min_shm")
    if check == "cache":
        return _space("cache", worker, rec, s.min_cache, "free", "precheck.min_cache")
    if check == "ulimit":
        return _ulimit(worker, rec, s)
    if check == "dns":
        ok, n = _num(rec.get("resolved")), _num(rec.get("peers"))
        failed = rec.get("failed", "")
        value = f"{int(ok or 0)}/{int(n or 0)} peers resolved"
        if ok is None or n is None or ok < n or failed:
            return CheckItem("dns", worker, "fail", value, "every peer resolves",
                             f"not resolved: {failed}" if failed else "no answer")
        return CheckItem("dns", worker, "pass", value, "every peer resolves")
    if check == "devices":
        n = int(_num(rec.get("count")) or 0)
        found = rec.get("found", "")
        need = chips if chips is not None else 1
        value = f"{n} TPU device(s)" + (f": {found}" if found and (n < need or n > need) else "")
        threshold = f">= {need}" if chips is None else f"{need} (chips per host)"
        if n < need:
            what = "no TPU device found under /dev/accel* or /dev/vfio/*" if n == 0 else f"{need - n} missing"
            return CheckItem("devices", worker, "fail", value, threshold, what)
        if chips is not None and n > chips:
            return CheckItem("devices", worker, "warn", value, threshold, f"more devices than the {chips} expected")
        return CheckItem("devices", worker, "pass", value, threshold)
    if check == "device_holders":
        foreign, ours = _pids_of(rec.get("foreign", "")), _pids_of(rec.get("ours", ""))
        if context == "launch" and (foreign or ours):
            held = " ".join(x for x in (foreign, ours) if x)
            return CheckItem("device_holders", worker, "fail", f"held by {held}", "no holder before a launch",
                             "orphan processes hold the TPU: the cleanup stops them", fixable=True)
        if foreign:
            return CheckItem("device_holders", worker, "fail", f"held by {foreign}", "only the job's processes",
                             "a process outside the job holds the TPU")
        if rec.get("scan") == "own":  # other users' holders are invisible to a plain user
            return CheckItem("device_holders", worker, "warn", f"held by the job ({ours})" if ours else "free",
                             "no foreign holder", "other users' processes not seen: not root and `sudo -n` "
                             "is not allowed")
        return CheckItem("device_holders", worker, "pass", f"held by the job ({ours})" if ours else "free",
                         "no foreign holder")
    if check == "libtpu_lock":
        state, path = rec.get("state", ""), rec.get("path", "/tmp/libtpu_lockfile")
        foreign, ours = _pids_of(rec.get("foreign", "")), _pids_of(rec.get("ours", ""))
        if state == "absent":
            return CheckItem("libtpu_lock", worker, "pass", "no lockfile", f"no stale {path}")
        if state == "stale":
            if context == "running":
                return CheckItem("libtpu_lock", worker, "warn", f"stale {path}", f"no stale {path}",
                                 "no process holds it; removed by the cleanup before the next launch")
            return CheckItem("libtpu_lock", worker, "fail", f"stale {path}", f"no stale {path}",
                             "left by a crashed TPU program; the cleanup removes it", fixable=True)
        holders = " ".join(x for x in (foreign, ours) if x) or "a lock"
        if context == "launch":
            return CheckItem("libtpu_lock", worker, "fail", f"{path} held by {holders}", f"no stale {path}",
                             "an orphan holds the TPU lock: the cleanup stops it", fixable=True)
        if foreign:
            return CheckItem("libtpu_lock", worker, "fail", f"{path} held by {foreign}", "only the job holds it",
                             "a process outside the job holds the TPU lock")
        return CheckItem("libtpu_lock", worker, "pass", f"held by the job ({holders})", "only the job holds it")
    if check == "interpreter":
        name = rec.get("name", "")
        if rec.get("error") or not rec.get("found"):
            return CheckItem("interpreter", worker, "fail", f"{name}: not found", "present",
                             rec.get("error", f"{name} is not installed here"))
        version = rec.get("version", "")
        return CheckItem("interpreter", worker, "pass",
                         f"{rec['found']}" + (f" (Python {version})" if version else ""), "present")
    return CheckItem(check, worker, "skip", detail="unknown check")  # pragma: no cover


# ---- over SSH -------------------------------------------------------------------------------


def _peers(node: NodeSnapshot, me: WorkerEndpoint) -> list[str]:
    # Internal addresses: what the workers of one slice use to talk to each other (the slices
    # of a multislice job reach each other by address, over the data-center network).
    return [w.internal_ip or w.external_ip for w in sorted(node.workers, key=lambda w: w.index)
            if w.index != me.index and w.slice == me.slice and (w.internal_ip or w.external_ip)]


class Prechecker:
    """Runs the checks on every selected worker of a node, one SSH round trip each."""

    def __init__(self, workers: SshWorkers, settings: Settings) -> None:
        self.workers = workers
        self.settings = settings
        self.interpreter = interpreter_of(workers.command) if workers.command else ""

    @classmethod
    def from_config(cls, cfg: Config, workers: SshWorkers) -> Prechecker:
        return cls(workers, Settings.from_config(cfg))

    def script_for(self, node: NodeSnapshot, w: WorkerEndpoint) -> bytes:
        return script(self.settings, job=self.workers.job, peers=_peers(node, w),
                      interpreter=self.interpreter, env=self.workers.env)

    def run(self, node: NodeSnapshot, context: Context = "launch",
            now: datetime | None = None) -> PrecheckReport:
        """Every check on every selected worker: unreachable workers are listed, not raised."""
        eps = self.workers.endpoints(node)
        results = self.workers.run_scripts(node, eps, lambda w: self.script_for(node, w),
                                           timeout=self.settings.timeout())
        return self._report(node, results, context, now)

    def probe_and_run(self, node: NodeSnapshot, context: Context = "launch",
                      now: datetime | None = None) -> tuple[list[WorkerProbe], PrecheckReport]:
        """The workers' probe (SshWorkers.probe) and the checks in ONE connection per worker.

        Before a launch the tick needs both; sent together they cost one SSH round trip, not
        two. The probe runs first, in its own subshell, so the checks cannot disturb it.
        """
        eps = self.workers.endpoints(node)
        probe = self.workers.probe_scripts(eps)

        def both(w: WorkerEndpoint) -> bytes:
            # One script: the worker reads all of it before any runs. Neither part reads the
            # channel (stdin /dev/null).
            return b"(\n" + probe(w) + b") </dev/null\n(\n" + self.script_for(node, w) + b") </dev/null\n"

        results = self.workers.run_scripts(node, eps, both, timeout=self.settings.timeout())
        return self.workers.probes_of(node, results), self._report(node, results, context, now)

    def _report(self, node: NodeSnapshot, results: Sequence[SshResult], context: Context,
                now: datetime | None) -> PrecheckReport:
        from tpuwatch.workers.sshworkers import raise_if_fatal

        chips = chips_per_host(node.accelerator_type)
        items: list[CheckItem] = []
        unreachable: list[tuple[int, str]] = []
        for r in results:
            raise_if_fatal(r)
            if not r.reached:
                unreachable.append((r.worker, r.message or r.failure))
                continue
            answer, ended = parse(r.stdout)
            failure = "" if ended else _why_incomplete(r)
            items.extend(evaluate(r.worker, answer, self.settings, context=context, chips=chips,
                                  ended=ended, failure=failure))
        return PrecheckReport(time=now or datetime.now(timezone.utc), context=context, node_id=node.id,
                              items=tuple(items), unreachable=tuple(unreachable))


def _why_incomplete(r: SshResult) -> str:
    tail = r.stderr_tail(2)
    return f"exit code {r.exit_code}" + (f": {tail}" if tail else "")


# ---- for people and the journal -------------------------------------------------------------


def report_dict(report: PrecheckReport) -> dict[str, Any]:
    return {
        "time": report.time.isoformat(),
        "context": report.context,
        "node_id": report.node_id,
        "ok": report.ok,
        "items": [i.as_dict() for i in report.items],
        "unreachable": [{"worker": w, "detail": d} for w, d in report.unreachable],
    }


def report_from_dict(data: Mapping[str, Any]) -> PrecheckReport:
    """The inverse of report_dict (the journal keeps the last report); ValueError when garbled."""
    try:
        items = tuple(
            CheckItem(str(i["check"]), int(i["worker"]), _verdict(i["verdict"]), str(i.get("value", "")),
                      str(i.get("threshold", "")), str(i.get("detail", "")), bool(i.get("fixable", False)))
            for i in data["items"]
        )
        context: Context = "running" if data.get("context") == "running" else "launch"
        return PrecheckReport(
            time=datetime.fromisoformat(str(data["time"])), context=context,
            node_id=str(data.get("node_id", "")), items=items,
            unreachable=tuple((int(u["worker"]), str(u.get("detail", ""))) for u in data.get("unreachable", [])),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"precheck report: {exc}") from None


def _verdict(v: Any) -> CheckVerdict:
    if v not in ("pass", "fail", "warn", "skip"):
        raise ValueError(f"precheck report: verdict {v!r}")
    verdict: CheckVerdict = v
    return verdict


def failing_lines(report: PrecheckReport) -> list[str]:
    """One line per failing item (and unreachable worker), with worker and value."""
    lines = [i.line() for i in report.failing]
    lines += [f"w{w} not checked: {d}" for w, d in report.unreachable]
    return lines


def summary(report: PrecheckReport) -> str:
    n = len({i.worker for i in report.items} | {w for w, _ in report.unreachable})
    failing = report.failing
    if report.ok:
        warn = f", {len(report.warnings)} warning(s)" if report.warnings else ""
        return f"environment checks passed on {n} worker(s){warn}"
    parts = []
    if failing:
        parts.append(f"{len(failing)} check(s) failed: " + "; ".join(i.line() for i in failing[:4])
                     + (f"; and {len(failing) - 4} more" if len(failing) > 4 else ""))
    if report.unreachable:
        parts.append("not checked on worker(s) " + ", ".join(str(w) for w, _ in report.unreachable))
    return "; ".join(parts)


# ---- in the journal -----------------------------------------------------------------------


class PrecheckJournal(Protocol):
    def precheck_report(self) -> dict[str, Any] | None: ...

    def set_precheck_report(self, report: Mapping[str, Any]) -> None: ...

    def add_event(self, time: datetime, kind: str, reason: str, data: Mapping[str, Any] | None = None) -> None: ...


def last(journal: PrecheckJournal) -> PrecheckReport | None:
    """The last report the journal keeps (for status and the dashboard), or None."""
    data = journal.precheck_report()
    if data is None:
        return None
    try:
        return report_from_dict(data)
    except ValueError:
        return None


def record(journal: PrecheckJournal, now: datetime, report: PrecheckReport) -> None:
    """Keep the last report (for `status`; when it ran is the policy's, in Memory.marks), with an
    event when what fails changes. Call inside the tick's transaction."""
    previous = last(journal)
    before = sorted(failing_lines(previous)) if previous is not None else None
    journal.set_precheck_report(report_dict(report))
    if before != sorted(failing_lines(report)):
        # The event keeps what did not pass; the full report stays in the cursor above.
        data = report_dict(report)
        data["checked"] = len(data["items"])
        data["items"] = [i for i in data["items"] if i["verdict"] in ("fail", "warn")]
        journal.add_event(now, "precheck", summary(report), data)
