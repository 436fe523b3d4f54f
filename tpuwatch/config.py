"""`tpuwatch.toml`: the schema, its defaults, and validation with messages that name the key.

Every key is declared once in `SCHEMA` (section -> key -> Field). Unknown keys, wrong types and
out-of-range values raise ConfigError (exit 2) naming `section.key` and the fix, with a
did-you-mean for near misses. Flags override the file through `overrides={"tpu.zone": ...}`.
This module reads files and the environment; it knows nothing of the cloud or SSH.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuwatch import tpuconfig
from tpuwatch.durations import parse_duration
from tpuwatch.errors import ConfigError
from tpuwatch.model import NODE_NAME
from tpuwatch.tpuconfig import (  # noqa: F401  (public names of tpuwatch.config)
    COMPUTE_SPEC_KEYS,
    TPU_APIS,
    compute_spec,
    flex_start,
    repair_compute_spec,
    repair_compute_urls,
)
from tpuwatch.webhooks import Secret, webhook_template

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLACEHOLDERS = ("checkpoint", "step", "attempt", "worker", "slice", "num_slices")
CHECKPOINT_LAYOUTS = ("auto", "orbax", "flax", "t5x", "levanter", "pytorch_xla")
TRANSPORTS = ("openssh", "gcloud")
NOTIFY_FORMATS = ("slack", "chat", "json")
# What a [[notify]] table may be told about (tpuwatch.policy.alerts derives them from the journal).
ALERT_KINDS = ("failed", "needs_person", "recreated", "disruption", "resumed", "done", "maintenance",
               "checkpoint_stale", "slices", "stopping_long", "stop_failed")
# By default, what needs or concerns a person; disruptions and resumes are routine on spot nodes.
DEFAULT_ALERTS = ("failed", "needs_person", "done", "maintenance")
# Sections written as arrays of tables ([[notify]]): SCHEMA names the keys of each table.
TABLE_ARRAYS = ("notify",)
MAX_STRING = 4096
_LABEL_VALUE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,62})$")  # GCP label values (ownership label)
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][-a-z0-9:.]{4,61}[a-z0-9]$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$", re.IGNORECASE)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
    if len(value) > MAX_STRING:
        raise ConfigError(f"{key}: longer than {MAX_STRING} characters")
    if "\x00" in value:
        raise ConfigError(f"{key}: contains a NUL character")
    return value


def _str(key: str, value: Any) -> str:
    return _text(key, value)


def _nonempty(key: str, value: Any) -> str:
    text = _text(key, value)
    if not text.strip():
        raise ConfigError(f"{key}: must not be empty")
    return text


def _pattern(rx: re.Pattern[str], what: str, allow_empty: bool = False) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        text = _text(key, value)
        if allow_empty and text == "":
            return text
        if not rx.match(text):
            raise ConfigError(f"{key}: {text!r} is not a valid {what}")
        return text

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return value


def _int_range(lo: int, hi: int) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected a whole number, got {value!r}")
        if not lo <= value <= hi:
            raise ConfigError(f"{key}: {value} is out of range; use {lo}..{hi}")
        return value

    return check


def _priority(key: str, value: Any) -> int | str:
    """[job] priority: a whole number 0..1000, or "off"."""
    if value == "off":
        return "off"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
        raise ConfigError(f"{key}: expected a whole number 0..1000 (higher takes nodes from lower), or \"off\"; "
                          f"got {value!r}")
    return value


def _duration(min_seconds: float = 0.0) -> Callable[[str, Any], float]:
    def check(key: str, value: Any) -> float:
        seconds = parse_duration(value, key=key)
        if seconds < min_seconds:
            raise ConfigError(f"{key}: must be at least {min_seconds:g}s, got {value!r}")
        return seconds

    return check


def _duration_or_auto(key: str, value: Any) -> float | str:
    """A duration, or "auto" (tpuwatch derives it from what it sees of the job)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _duration(0)(key, value)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; or \"auto\"") from None


def _exit_codes(key: str, value: Any) -> frozenset[int]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of exit codes such as [1, 134], got {value!r}")
    codes = set()
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 255:
            raise ConfigError(f"{key}: {item!r} is not an exit code; use whole numbers 1..255")
        codes.add(item)
    return frozenset(codes)


def _zones(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of zones such as [\"us-central2-b\"], got {value!r}")
    check = _pattern(_ZONE, "zone (such as us-central2-b)")
    return tuple(check(key, z) for z in value)


def _workers(key: str, value: Any) -> str | tuple[int, ...]:
    if value == "all":
        return "all"
    if isinstance(value, list) and value and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 4096 for v in value
    ):
        return tuple(sorted(set(value)))
    raise ConfigError(f"{key}: expected \"all\" or a list of worker numbers such as [0, 1], got {value!r}")


def _command(key: str, value: Any) -> str:
    text = _nonempty(key, value)
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}; write a literal brace as {{{{ or }}}}") from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conv:
            hint = difflib.get_close_matches(name, PLACEHOLDERS, n=1)
            more = f" (did you mean {{{hint[0]}}}?)" if hint else ""
            raise ConfigError(
                f"{key}: unknown placeholder {{{name}}}{more}; use "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                + " (write a literal brace as {{ or }})"
            )
    return text


def _checkpoint_dir(key: str, value: Any) -> str:
    text = _text(key, value)
    if text == "":
        return text
    if text.startswith("gs://"):
        if len(text) <= 5 or text[5] == "/":
            raise ConfigError(f"{key}: {text!r} has no bucket; write gs://BUCKET/PATH")
        return text.rstrip("/")
    expanded = os.path.expanduser(text)
    if not os.path.isabs(expanded):
        raise ConfigError(f"{key}: {text!r} must be an absolute path or a gs:// URI")
    return expanded.rstrip("/") or "/"


def _choice(options: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        text = _text(key, value)
        if text not in options:
            raise ConfigError(f"{key}: {text!r} is not one of {', '.join(options)}")
        return text

    return check


def _path(key: str, value: Any) -> str:
    text = _text(key, value)
    return os.path.expanduser(text) if text else text


def _env_table(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table of NAME = \"value\"")
    out = {}
    for name, v in value.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ConfigError(f"{key}.{name}: not a valid environment variable name")
        out[name] = _text(f"{key}.{name}", v)
    return out


# Log signatures: searched by `grep -E` on the workers and by Python's re on the watcher, so
# only what both read the same way: these are the constructs one of them lacks, and what to write.
_NOT_ERE = ((re.compile(r"\\[dD]"), "\\d: write [0-9]"), (re.compile(r"\\[wW]"), "\\w: write [A-Za-z0-9_]"),
            (re.compile(r"\\[sS]"), "\\s: write [ \\t]"), (re.compile(r"\\[bBAZ]"), "\\b, \\A, \\Z anchors"),
            (re.compile(r"\(\?"), "(?...) groups"), (re.compile(r"[*+?}]\?"), "lazy quantifiers (*?, +?)"),
            (re.compile(r"\[\[?[:=.]"), "POSIX classes such as [[:space:]]: write the characters, such as [ \\t]"))
LOG_SIGNATURE_CLASSES = ("hang", "crash", "dirty_host", "off")


def _log_signatures(key: str, value: Any) -> dict[str, dict[str, str]]:
    """[recovery.log_signatures] NAME = { pattern = "ERE", class = "hang" | "crash" | "dirty_host" | "off" }."""
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table of NAME = {{ pattern = \"...\", class = \"hang\" }}")
    out: dict[str, dict[str, str]] = {}
    for name, entry in value.items():
        where = f"{key}.{name}"
        if not re.match(r"^[a-z][a-z0-9_]{0,40}$", name):
            raise ConfigError(f"{where}: a signature name is lowercase letters, digits and _ (up to 41)")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected {{ pattern = \"...\", class = \"hang\" }}")
        unknown = set(entry) - {"pattern", "class"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; use pattern, class")
        kind = _text(f"{where}.class", entry.get("class", ""))
        if kind not in LOG_SIGNATURE_CLASSES:
            raise ConfigError(f"{where}.class: unknown class {kind!r}{_did_you_mean(kind, list(LOG_SIGNATURE_CLASSES))}; "
                              f"classes are {', '.join(LOG_SIGNATURE_CLASSES)} (off turns a built-in off)")
        if kind == "off":
            out[name] = {"pattern": "", "class": kind}
            continue
        if "pattern" not in entry:
            raise ConfigError(f"{where}: missing pattern; add `pattern = \"...\"` (an extended regular expression)")
        pattern = _text(f"{where}.pattern", entry["pattern"])
        if not pattern or len(pattern) > 300 or any(c in pattern for c in "\n\r\x00"):
            raise ConfigError(f"{where}.pattern: expected one line of 1 to 300 characters")
        for construct, hint in _NOT_ERE:
            if construct.search(pattern):
                raise ConfigError(f"{where}.pattern: the workers search with grep -E and tpuwatch with Python's re, "
                                  f"which do not share {hint}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{where}.pattern: not a valid regular expression ({exc})") from None
        if compiled.search(""):
            raise ConfigError(f"{where}.pattern: {pattern!r} matches an empty line, so every line of the log")
        out[name] = {"pattern": pattern, "class": kind}
    return out


def _checks(key: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected [[precheck.custom]] tables with name, command, timeout")
    out = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a table with name, command, timeout")
        unknown = set(item) - {"name", "command", "timeout"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; use name, command, timeout")
        if "command" not in item:
            raise ConfigError(f"{where}: missing command; add `command = \"...\"` (exit 0 passes)")
        name = _pattern(re.compile(r"^[a-z][a-z0-9_-]{0,40}$"), "check name (lowercase letters, digits, - and _)")(
            f"{where}.name", item.get("name", f"custom{i}"))
        if name in PRECHECK_IDS:
            raise ConfigError(f"{where}.name: {name!r} is a built-in check; give the custom check another name")
        if name in seen:
            raise ConfigError(f"{where}.name: {name!r} is used by another [[precheck.custom]] check")
        seen.add(name)
        out.append(
            {
                "name": name,
                "command": _nonempty(f"{where}.command", item["command"]),
                "timeout": _duration(0.1)(f"{where}.timeout", item.get("timeout", "30s")),
            }
        )
    return tuple(out)


def _node_names(key: str, value: Any) -> tuple[str, ...]:
    names = _tpu_names(key, value, "each slice's node")
    if len(names) == 1:
        raise ConfigError(f"{key}: one node is not a multislice job; set tpu.name = {names[0]!r} and drop {key}")
    return names


def _spare_names(key: str, value: Any) -> tuple[str, ...]:
    return _tpu_names(key, value, "each spare")


def _tpu_names(key: str, value: Any, each: str) -> tuple[str, ...]:
    """A list of TPU node names, each named once."""
    names = _str_list(key, value)
    for name in names:
        if not NODE_NAME.match(name):
            raise ConfigError(f"{key}: {name!r} is not a TPU name (lowercase letters, digits, hyphens; starts with a letter)")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{key}: {twice!r} is listed twice; list {each} once")
    return names


def _check_spares(t: Mapping[str, Any]) -> None:
    """[tpu] spares: none of them one of the job's slices or its name; a job on one node that came
    through a queued resource has none."""
    spares = t["spares"]
    if not spares:
        return
    if not t["names"] and t["queued_resource"]:
        raise ConfigError("tpu.spares: a node made through a queued resource is made again through it, which a "
                          "spare's pool does not do; drop tpu.spares, or tpu.queued_resource if the node was not "
                          "made through one")
    both = [s for s in spares if s in t["names"] or s == t["name"]]
    if both:
        raise ConfigError(f"tpu.spares: {both[0]!r} is also one of the job's slices (tpu.names) or its name "
                          "(tpu.name); a spare is an idle node of its own: drop it from tpu.spares")


def multislice_prefix(names: Sequence[str]) -> str | None:
    """The node id prefix of a multislice queued resource's nodes `<prefix>-0..N-1`, or None."""
    prefix = names[0].rsplit("-", 1)[0] if names and "-" in names[0] else ""
    if prefix and list(names) == [f"{prefix}-{i}" for i in range(len(names))]:
        return prefix
    return None


def _str_list(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of strings")
    return tuple(_text(key, v) for v in value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b\s*$|^\s*(\d+(?:\.\d+)?)\s*([kmgt])(i?)\s*$", re.IGNORECASE)


def _bytes_size(key: str, value: Any) -> float:
    """Sizes such as "32GB", "512MiB", "1G", "0" -> bytes. A bare number other than 0 is refused:
    `min_disk = 32` is far more likely a forgotten unit than 32 bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size such as \"32GB\" or \"512MB\", got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{key}: {value!r} is negative; a size is 0 or more, e.g. \"32GB\"")
        if value == 0:
            return 0.0
        raise ConfigError(f"{key}: {value!r} has no unit; write it as a string with one, e.g. \"{value:g}GB\"")
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a size such as \"32GB\" or \"512MB\", got {value!r}")
    text = value.strip()
    if text.startswith("-"):
        raise ConfigError(f"{key}: {value!r} is negative; a size is 0 or more, e.g. \"32GB\"")
    if text == "0":
        return 0.0
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(
            f"{key}: {value!r} is not a size; write a number with a unit: B, KB, MB, GB, TB "
            "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. \"32GB\""
        )
    number, prefix, binary = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5), m.group(6))
    p = prefix.lower()
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[p] if binary else \
        {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[p]
    return float(number) * mult


def _size_or_unlimited(key: str, value: Any) -> float:
    """A size, or "unlimited" (infinity)."""
    if isinstance(value, str) and value.strip().lower() == "unlimited":
        return float("inf")
    return _bytes_size(key, value)


def _count(key: str, value: Any) -> int:
    """A whole number >= 0, or "unlimited" (-1 would be ambiguous, so it is refused)."""
    if isinstance(value, str) and value.strip().lower() == "unlimited":
        return 2**63 - 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected a whole number such as 65536 (or \"unlimited\"), got {value!r}")
    if value < 0:
        raise ConfigError(f"{key}: {value} is negative; use 0 (no minimum) or more")
    return value


def _webhook_url(key: str, value: Any) -> Secret:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string such as \"${{SLACK_WEBHOOK_URL}}\", got {type(value).__name__}")
    return webhook_template(key, _text(key, value))


def _alert_kinds(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a list of event kinds such as [\"failed\", \"needs_person\"]; "
                          f"kinds are {', '.join(ALERT_KINDS)}")
    for item in value:
        text = _text(key, item)
        if text not in ALERT_KINDS:
            raise ConfigError(f"{key}: unknown event kind {text!r}{_did_you_mean(text, list(ALERT_KINDS))}; "
                              f"kinds are {', '.join(ALERT_KINDS)}")
    return tuple(dict.fromkeys(value))


def _signal_name(key: str, value: Any) -> str:
    text = _text(key, value)
    if text == "":
        return text
    names = sorted(s.name for s in signal.Signals if s.name.startswith("SIG") and not s.name.startswith("SIG_")
                   and s not in (signal.SIGKILL, signal.SIGSTOP))
    if text not in names:
        raise ConfigError(f"{key}: {text!r} is not a signal a job can catch; use a name such as \"SIGTERM\" or "
                          f"\"SIGUSR1\", or \"\" for none{_did_you_mean(text.upper(), names)}")
    return text


@dataclass(frozen=True)
class Field:
    check: Callable[[str, Any], Any]
    default: Any
    doc: str


# The whole config surface. docs/configuration.md's reference is written from this table.
SCHEMA: dict[str, dict[str, Field]] = {
    "tpu": {
        "name": Field(_pattern(NODE_NAME, "TPU name (lowercase letters, digits, hyphens; starts with a letter)"), None,
                      "TPU node name (required); with `names`, the job's name for its slices"),
        "project": Field(_pattern(_PROJECT, "project id", allow_empty=True), "", "GCP project; default from flags, env or gcloud"),
        "zone": Field(_pattern(_ZONE, "zone (such as us-central2-b)", allow_empty=True), "", "zone; default from flags, env or gcloud"),
        "fallback_zones": Field(_zones, (), "zones tried in order when the zone has no capacity"),
        "names": Field(_node_names, (), "a multislice job's nodes, in slice order (2 or more; `name` then names the "
                       "job's group of slices). Through a multislice queued resource: its `<prefix>-0`, `<prefix>-1`, ..."),
        "spares": Field(_spare_names, (), "hot spares: idle TPU nodes (with api = \"compute\" and instance: "
                        "instances, by name or zones/ZONE/instances/NAME; with mig: MIGs, by name or "
                        "zones/ZONE/instanceGroupManagers/NAME) of the job's shape, owned by the job (its "
                        "ownership label). A lost node (or slice) is swapped for a READY one at once; the one lost, "
                        "back, is a spare from then on; with [tpu.spec] ([tpu.compute_spec]), a dead one is made "
                        "again (a MIG: its instances recreated in place)"),
        "spare_pool": Field(_pattern(_LABEL_VALUE, "spare pool name (lowercase letters, digits, - and _, up to 63)",
                                     allow_empty=True), "",
                            "the watcher's spare pool the job takes a spare from when a node (or slice) is lost: "
                            "the name of a [pool] file beside the job's (docs/multislice.md#spare-pool)"),
        "queued_resource": Field(_str, "", "set when the TPU was made through a queued resource"),
        "api": Field(_choice(TPU_APIS), "tpu", "the API that made the TPU: \"tpu\" (Cloud TPU API nodes) or "
                     "\"compute\" (a Compute Engine instance or managed instance group: TPU7x and later, v5p, v6e)"),
        "instance": Field(_pattern(NODE_NAME, "instance name (lowercase letters, digits, hyphens; starts with a "
                                   "letter)", allow_empty=True), "",
                          "with api = \"compute\": the Compute Engine instance that is the job's single-host slice"),
        "mig": Field(_pattern(NODE_NAME, "managed instance group name (lowercase letters, digits, hyphens; starts "
                              "with a letter)", allow_empty=True), "",
                     "with api = \"compute\": the managed instance group that is the job's slice (one VM, or a "
                     "multi-host slice through its workload policy)"),
        "flex_start": Field(flex_start, 0.0,
                            "with api = \"compute\" and mig: the MIG gets its VMs through flex-start resize "
                            "requests, each asking for this run duration (requestedRunDuration, 10m to 7d, e.g. "
                            "\"24h\"); its size is tpu.compute_spec.mig.targetSize (written by tpuwatch init)"),
        "compute_spec": Field(compute_spec, {},
                              "with api = \"compute\": what a recreate needs (written by tpuwatch init): "
                              "`instance` (the instance's insert body), or `mig`, `template` and `workload_policy`"),
        "startup_script": Field(_path, "", "file sent as metadata startup-script on create"),
        "spec": Field(lambda k, v: _spec(k, v), {}, "the node spec used by recreate (written by tpuwatch init)"),
        "zone_overrides": Field(lambda k, v: _zone_overrides(v), {},
                                "per fallback zone, the spec's regional and zonal keys there: [tpu.zone_overrides.\"ZONE\"] "
                                "subnetwork, network_configs, data_disks, reservation_name"),
    },
    "job": {
        "name": Field(_pattern(_LABEL_VALUE, "job name (lowercase letters, digits, - and _, up to 63)", allow_empty=True), "", "job name; default the TPU name. Names the journal and the ownership label"),
        "command": Field(_command, None, "shell command run on every worker; {checkpoint} {step} {attempt} {worker} {slice} {num_slices} substituted"),
        "checkpoint_dir": Field(_checkpoint_dir, "", "absolute path or gs:// URI where the job saves checkpoints; a path is on the TPU VM and "
                               "is read on the job's first worker, by the probe of watch/check (needs python3 there)"),
        "checkpoint_layout": Field(_choice(CHECKPOINT_LAYOUTS), "auto", "force a checkpoint layout; auto-detected by default"),
        "workers": Field(_workers, "all", "\"all\" or a list of worker numbers"),
        "env": Field(_env_table, {}, "extra environment variables for the command"),
        "env_in_metadata": Field(_bool, False, "write [job] env into a recreated node's metadata so its startup script "
                                 "can start the job at boot (anyone with tpu.nodes.get can read it); off: with env "
                                 "set, the startup script only sets up and the watcher starts the job over SSH"),
        "command_in_metadata": Field(_bool, False, "write a [job] command that looks like it holds a credential "
                                     "(WANDB_API_KEY=..., --hf_token ...) into a recreated node's metadata anyway; "
                                     "off: such a command stays out of it, the startup script only sets up and the "
                                     "watcher starts the job over SSH"),
        "megascale_abort_on_hang": Field(_bool, True, "multislice jobs: append --megascale_error_reporter_abort_on_hang=true "
                                         "and --megascale_error_reporter_abort_on_error=true to the job's LIBTPU_INIT_ARGS "
                                         "(a flag the job's own value sets is left alone), so a Megascale hang ends the "
                                         "job's processes instead of leaving them stuck; false: LIBTPU_INIT_ARGS untouched"),
        "checkpoint_warn_age": Field(_duration(1), 75 * 60.0, "warn when the newest checkpoint is older than this"),
        "min_slices": Field(_int_range(0, 10_000), 0, "multislice jobs that can train on fewer slices: the fewest "
                            "slices the job accepts. A lost slice then relaunches the job at once on the slices "
                            "left (at least this many), and the job grows back onto the slice at the next complete "
                            "checkpoint after it is back; the command learns the count from {num_slices}, "
                            "TPUWATCH_NUM_SLICES and MEGASCALE_NUM_SLICES. 0: never limp (the job waits for every slice)"),
        "priority": Field(_priority, "off", "jobs of one zone that may lend each other nodes: a job that lost "
                          "a slice with no spare free and no limp takes a READY+HEALTHY node of its shape from the "
                          "job of lowest priority below its own (stopped as a disruption, not charged) and hands "
                          "it its own node once back; TPU API nodes made plainly, or Compute Engine instances (not a MIG). 0..1000, or "
                          "\"off\": never takes, never gives"),
    },
    "recovery": {
        "poll_interval": Field(_duration(0.05), 30.0, "time between ticks of watch"),
        "repair_timeout": Field(_duration(0), 30 * 60.0, "how long to wait for the TPU to heal itself before recreating"),
        "max_restarts": Field(_int_range(0, 10_000), 5, "charged failures (not disruptions) allowed since the last run of stable_run"),
        "max_recreates": Field(_int_range(0, 1000), 3, "delete + create cycles allowed since the last run of stable_run"),
        "no_progress_limit": Field(_int_range(1, 1000), 3, "consecutive attempts that add no checkpoint => failed"),
        "min_uptime": Field(_duration(0), 120.0, "an attempt shorter than this is a failed start"),
        "queue_timeout": Field(_duration(0), 24 * 3600.0, "keep retrying create this long in each zone on stockout/quota "
                               "(with fallback_zones, set it shorter to move on sooner)"),
        "operation_timeout": Field(_duration(1), 3600.0, "a delete or create operation not done after this long fails the job"),
        "hang_timeout": Field(_duration_or_auto, "auto", "no new checkpoint this long while every worker runs: stop the job, a "
                              "charged failure. \"auto\": 3x the checkpoint interval seen (at least 30m), and only while "
                              "the workers' logs are silent too; 0s = off"),
        "fail_fast_exit_codes": Field(_exit_codes, frozenset(), "exit codes that fail the job at once"),
        "log_signatures": Field(_log_signatures, {}, "more runtime signatures in the workers' logs that end an attempt at "
                                "once: NAME = { pattern = \"ERE\", class = \"hang\" | \"crash\" | \"dirty_host\" }; "
                                "class = \"off\" turns a built-in off (docs/policy.md lists them)"),
        "backoff_base": Field(_duration(0), 10.0, "wait before the second charged restart in a row, doubling after it (the first since a stable run is at once)"),
        "backoff_max": Field(_duration(0), 300.0, "longest wait between charged restarts"),
        "stop_grace": Field(_duration(0), 30.0, "SIGTERM to SIGKILL grace when stopping workers; the watcher waits "
                            "for it only when its next step needs the job gone (a launch, a maintenance started "
                            "early), otherwise the workers SIGKILL what is left after it"),
        "stable_run": Field(_duration(0), 3600.0, "an attempt running this long resets the backoff and the restart/recreate budgets"),
        "report_faulty_hosts": Field(_bool, False, "tpu.api = \"compute\" only: when the same worker's attempts end "
                                     "with a dirty-host signature 3 times in a row, or the launch-time checks find "
                                     "its TPU devices missing 3 rounds in a row, report its instance's host to "
                                     "Google (instances.reportHostAsFaulty; Google takes it for TPU VMs in All "
                                     "Capacity mode, reservation-bound). The VM stops until its host is repaired. "
                                     "false: only say what a person should do"),
    },
    "ssh": {
        "user": Field(_pattern(_USER, "user name", allow_empty=True), "", "remote user; default the local user, as gcloud does. "
                      "With transport = \"gcloud\" OS Login may log in under another name: tpuwatch learns it"),
        "identity_file": Field(_path, "~/.ssh/google_compute_engine", "private key"),
        "port": Field(_int_range(1, 65535), 22, "SSH port"),
        "internal_ip": Field(_bool, False, "connect to workers' internal IPs"),
        "transport": Field(_choice(TRANSPORTS), "openssh", "openssh, or gcloud: `gcloud compute tpus tpu-vm ssh` "
                           "(tpu.api = \"compute\": `gcloud compute ssh` to the slice's first instance) once per "
                           "node incarnation to prepare keys and learn the user (OS Login), then OpenSSH"),
        "connect_timeout": Field(_duration(1), 10.0, "ssh ConnectTimeout"),
        "command_timeout": Field(_duration(5), 60.0, "longest a probe or launch over SSH may take before the worker "
                                 "counts as unreachable this tick (a launch's cleanup adds 2x recovery.stop_grace)"),
        "known_hosts": Field(_path, "", "known_hosts file; default one per job in the state dir; host keys pinned "
                             "from the workers' guest attributes, per node id"),
        "trust_first_use": Field(_bool, True, "for a worker whose host keys cannot be read from Google (guest "
                                 "attributes off, or the read refused for lack of compute.instances."
                                 "getGuestAttributes / tpu.nodes.getGuestAttributes): true trusts the first key it "
                                 "presents, with a warning; false refuses to connect to it (exit 1, needs a person)"),
        "login_grace": Field(_duration(0), 300.0, "a login refused this soon after the node booted is keys not there "
                             "yet (wait); later it needs a person"),
        "options": Field(_str_list, (), "extra ssh -o options, e.g. [\"ProxyJump=bastion\"]"),
        "multiplex": Field(_bool, True, "one OpenSSH master connection per worker (ControlMaster), shared by every "
                           "probe, launch and follow; false for a bastion or proxy that cannot carry it"),
        "iap": Field(_bool, False, "reach the workers through Identity-Aware Proxy TCP forwarding, as gcloud's "
                     "--tunnel-through-iap does (no external IP needed): a ProxyCommand `gcloud compute "
                     "start-iap-tunnel` per worker VM; needs gcloud and roles/iap.tunnelResourceAccessor"),
    },
    "precheck": {
        "enabled": Field(_bool, True, "run environment checks before launch and periodically"),
        "skip": Field(_str_list, (), "check ids to skip (built-in or [[precheck.custom]] names)"),
        "interval": Field(_duration(1), 600.0, "time between periodic checks while running"),
        "min_disk": Field(_bytes_size, 32e9, "root disk free space"),
        "min_shm": Field(_bytes_size, 1e9, "/dev/shm size"),
        "cache_path": Field(_str, "", "a cache/data path whose free space is checked"),
        "min_cache": Field(_bytes_size, 32e9, "free space at cache_path"),
        "min_open_files": Field(_count, 0, "ulimit -n (open files) minimum; 0 = report only"),
        "min_locked_memory": Field(_size_or_unlimited, 0, "ulimit -l (locked memory) minimum, a size or \"unlimited\"; 0 = report only"),
        "min_processes": Field(_count, 0, "ulimit -u (processes) minimum; 0 = report only"),
        "min_stack": Field(_size_or_unlimited, 0, "ulimit -s (stack) minimum, a size or \"unlimited\"; 0 = report only"),
        "custom": Field(_checks, (), "[[precheck.custom]] name, command, timeout"),
    },
    # [[notify]]: one table per destination (an array of tables; see TABLE_ARRAYS)
    "notify": {
        "url": Field(_webhook_url, None, "webhook URL, required in each [[notify]] table; write secrets as ${VAR}, read from the environment "
                     "(never printed, logged or journaled)"),
        "format": Field(_choice(NOTIFY_FORMATS), "json", "slack, chat (Google Chat) or json (anything else)"),
        "on": Field(_alert_kinds, DEFAULT_ALERTS, "event kinds to send: " + ", ".join(ALERT_KINDS)),
    },
    "maintenance": {
        "start_early": Field(_bool, True, "when the node tpuwatch owns announces maintenance that may start early "
                             "(canReschedule), start it right after the job's next checkpoint (at the latest 10 min "
                             "before its window) instead of losing work to it; refused: falls back to notify_signal. "
                             "An idle spare's is started at once"),
        "notify_signal": Field(_signal_name, "SIGTERM", "signal sent to the job's process group when a worker's metadata "
                               "server gives notice of maintenance or preemption (about 60 s / 30 s ahead); \"\" = none "
                               "(the notice is still written to ~/.tpuwatch/<job>/maintenance)"),
    },
    "metrics": {
        "port": Field(_int_range(0, 65535), 0, "watch serves Prometheus metrics and /healthz on this port, all "
                      "interfaces (0 = off; --metrics-port overrides)"),
    },
}


def _spec(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table")
    if not value:
        return {}  # no [tpu.spec]: fine until a recreate, which then asks for `tpuwatch init`
    from tpuwatch.spec import validate_spec  # here, so that importing config stays light

    return validate_spec(value, key=key)


def _zone_overrides(value: Any) -> dict[str, dict[str, Any]]:
    from tpuwatch import zonespec

    return zonespec.check_overrides(value)


@dataclass(frozen=True)
class Config:
    """A validated config: `cfg.get("recovery.max_restarts")` or the section dicts."""

    values: Mapping[str, Any]  # section -> key -> value; an array of tables ([[notify]]) -> a tuple of those
    path: Path | None = None
    state_dir: Path = field(default_factory=lambda: default_state_dir())

    def get(self, dotted: str) -> Any:
        section, key = dotted.split(".", 1)
        return self.values[section][key]

    @property
    def tpu_name(self) -> str:
        return str(self.values["tpu"]["name"])

    @property
    def tpu_names(self) -> tuple[str, ...]:
        """The job's nodes: a multislice job's slices, else its one node."""
        return tuple(self.values["tpu"]["names"]) or (self.tpu_name,)

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots a job runs in, each on its node or a spare in its place: a multislice job's
        slices, a job on one node with spares or a priority its node (a pool of one slot); none otherwise."""
        pooled = (self.values["tpu"]["spares"] or self.values["job"].get("priority", "off") != "off"
                  or self.values["tpu"].get("spare_pool"))
        return tuple(self.values["tpu"]["names"]) or ((self.tpu_name,) if pooled else ())

    @property
    def job_name(self) -> str:
        return str(self.values["job"]["name"] or self.values["tpu"]["name"])

    @property
    def tpu(self) -> Mapping[str, Any]:
        return self.values["tpu"]

    @property
    def job(self) -> Mapping[str, Any]:
        return self.values["job"]

    @property
    def recovery(self) -> Mapping[str, Any]:
        return self.values["recovery"]

    @property
    def ssh(self) -> Mapping[str, Any]:
        return self.values["ssh"]

    @property
    def precheck(self) -> Mapping[str, Any]:
        return self.values["precheck"]

    @property
    def notify(self) -> tuple[Mapping[str, Any], ...]:
        """The [[notify]] tables: url (a Secret), format, on."""
        return tuple(self.values.get("notify", ()))

    @property
    def metrics(self) -> Mapping[str, Any]:
        return self.values.get("metrics", {"port": 0})


def default_state_dir() -> Path:
    env = os.environ.get("TPUWATCH_STATE_DIR")
    if env is not None:
        if not env.strip() or "\x00" in env:
            raise ConfigError("TPUWATCH_STATE_DIR: must be a directory path, got an empty value")
        return Path(os.path.expanduser(env))
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "tpuwatch"


def _did_you_mean(word: str, options: list[str]) -> str:
    hint = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _table(section: str, where: str, given: Mapping[str, Any], require_command: bool) -> dict[str, Any]:
    """One table's keys checked against SCHEMA[section]; `where` names it in messages."""
    fields = SCHEMA[section]
    head = f"[[{section}]]" if section in TABLE_ARRAYS else f"[{section}]"
    for key in given:
        if (section, key) in REMOVED:
            raise ConfigError(f"{where}.{key}: {REMOVED[section, key]}")
        if key not in fields:
            raise ConfigError(
                f"{where}.{key}: unknown key{_did_you_mean(key, list(fields))}; "
                f"{head} accepts {', '.join(fields)}"
            )
    values: dict[str, Any] = {}
    for key, spec in fields.items():
        dotted = f"{where}.{key}"
        if key in given:
            values[key] = spec.check(dotted, given[key])
        elif spec.default is None:
            if dotted == "job.command" and not require_command:
                values[key] = ""
                continue
            raise ConfigError(f"{dotted}: missing; add `{key} = ...` under {head}")
        else:
            values[key] = spec.default
    return values


def validate(raw: Mapping[str, Any], *, require_command: bool = True) -> dict[str, Any]:
    """Check every key of a parsed TOML document against SCHEMA; return values with defaults."""
    out: dict[str, Any] = {}
    for section in raw:
        if section not in SCHEMA:
            raise ConfigError(
                f"unknown section [{section}]{_did_you_mean(section, list(SCHEMA))}; "
                f"sections are {', '.join('[' + s + ']' for s in SCHEMA)}"
            )
        if section in TABLE_ARRAYS:
            if not isinstance(raw[section], list) or not all(isinstance(t, dict) for t in raw[section]):
                raise ConfigError(f"{section}: expected [[{section}]] tables (two brackets: there may be several)")
        elif not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: expected a [{section}] table")
    for section in SCHEMA:
        if section in TABLE_ARRAYS:
            out[section] = tuple(_table(section, f"{section}[{i}]", t, require_command)
                                 for i, t in enumerate(raw.get(section, [])))
        else:
            given = dict(raw.get(section, {}))
            if section == "tpu":
                tpuconfig.name_the_slice(given, lambda key, value: SCHEMA["tpu"][key].check(f"tpu.{key}", value))
            out[section] = _table(section, section, given, require_command)
    r = out["recovery"]
    if r["backoff_max"] < r["backoff_base"]:
        raise ConfigError("recovery.backoff_max: must not be shorter than recovery.backoff_base")
    from tpuwatch import zonespec

    t = out["tpu"]
    tpuconfig.check(t, out)  # the keys of the job's API only
    if t["names"] and t["queued_resource"] and multislice_prefix(t["names"]) is None:
        raise ConfigError(
            f"tpu.names: a multislice queued resource names its nodes <prefix>-0, <prefix>-1, ... in order; got "
            f"{', '.join(t['names'])}. List them so, or drop tpu.queued_resource for separately created nodes")
    _check_limp(out["job"], t["names"])
    _check_spares(t)
    _check_priority(out["job"], t)
    _check_pool(t)
    if not t["queued_resource"]:
        tpuconfig.queued_only(t["spec"], t["zone_overrides"])
    zonespec.check(t["spec"], t["zone_overrides"], t["zone"], t["fallback_zones"])
    ssh = out["ssh"]
    proxy = next((o for o in ssh["options"] if re.match(r"(?i)\s*proxy(command|jump)\b", o)), None)
    if ssh["iap"] and proxy is not None:
        raise ConfigError(f"ssh.iap: the IAP tunnel is ssh's ProxyCommand, and ssh.options already has {proxy!r}; "
                          "use one or the other")
    known_checks = [*PRECHECK_IDS, *(c["name"] for c in out["precheck"]["custom"])]
    unknown_checks = set(out["precheck"]["skip"]) - set(known_checks)
    if unknown_checks:
        name = sorted(unknown_checks)[0]
        raise ConfigError(
            f"precheck.skip: unknown check {name!r}{_did_you_mean(name, known_checks)}; "
            f"checks are {', '.join(known_checks)}"
        )
    return out


def _check_limp(job: dict[str, Any], names: Sequence[str]) -> None:
    """[job] min_slices: only for a multislice job, fewer than its slices, with checkpoints to resume from."""
    floor = job["min_slices"]
    if not floor:
        return
    if not names:
        raise ConfigError("job.min_slices: a job on one node cannot train on fewer slices; list its slices in "
                          "tpu.names, or drop job.min_slices")
    if floor >= len(names):
        raise ConfigError(f"job.min_slices: {floor} is not fewer than the job's {len(names)} slices (tpu.names); "
                          f"set it to at most {len(names) - 1}, or drop it to never limp")
    if not job["checkpoint_dir"]:
        raise ConfigError("job.min_slices: limping relaunches the job from its newest complete checkpoint, and "
                          "grows back at the next one; set job.checkpoint_dir")


def _check_priority(job: Mapping[str, Any], t: Mapping[str, Any]) -> None:
    """[job] priority: nodes made plainly (a node handed over is relabelled and made again from
    [tpu.spec], which a queued resource's node does not take; a MIG: tpuconfig.compute_priority)."""
    if job["priority"] == "off":
        return
    if t["queued_resource"]:
        raise ConfigError("job.priority: a node made through a queued resource cannot be handed to another job (the "
                          "request holds it); drop job.priority, or tpu.queued_resource if the nodes were made plainly")


def _check_pool(t: Mapping[str, Any]) -> None:
    """[tpu] spare_pool: nodes made plainly (a node made through a queued resource is made again
    through it, which a pool does not do; Compute Engine: tpuconfig._compute_pool)."""
    if not t["spare_pool"]:
        return
    if t["queued_resource"]:
        raise ConfigError("tpu.spare_pool: a node made through a queued resource is made again through it, which a "
                          "spare pool does not do; drop tpu.spare_pool, or tpu.queued_resource if the nodes were made "
                          "plainly")


# Keys an older tpuwatch accepted, and why they went: said plainly instead of "unknown key".
REMOVED = {
    ("recovery", "retryable_exit_codes"): (
        "no longer a setting (it changed nothing: every non-zero exit that is not a disruption and "
        "not in recovery.fail_fast_exit_codes is charged and retried); delete the line"),
}
PRECHECK_IDS = ("disk", "shm", "cache", "ulimit", "dns", "devices", "device_holders", "libtpu_lock", "interpreter")


def _set_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    section, key = dotted.split(".", 1)
    raw.setdefault(section, {})[key] = value


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; errors name the file and say what is wrong."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found; create one with `tpuwatch init NAME`") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(path)!r} is a directory") from None
    except PermissionError:
        raise ConfigError(f"config file {str(path)!r} is not readable (permission denied)") from None
    except OSError as exc:  # a name too long, a file where a directory should be, a loop...
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8{_where_in_toml(data, exc.start)}; "
                          "save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _where_in_toml(data: bytes, offset: int) -> str:
    """" at line N (section.key)" for a byte offset of a TOML file, as far as it can be told."""
    lines = data[:offset].decode("utf-8", errors="replace").split("\n")
    line_no = len(lines)
    current = data.split(b"\n")[line_no - 1].decode("utf-8", errors="replace")
    section = ""
    for text in reversed(lines[:-1]):
        m = re.match(r"^\s*\[+\s*([A-Za-z0-9_.-]+)\s*\]+", text)
        if m:
            section = m.group(1)
            break
    key = re.match(r"^\s*([A-Za-z0-9_-]+)\s*=", current)
    what = f" ({section + '.' if section else ''}{key.group(1)})" if key else ""
    return f" at line {line_no}{what}, byte {offset}"


def load_config(
    path: str | Path | None,
    overrides: Mapping[str, Any] | None = None,
    *,
    require_command: bool = True,
) -> Config:
    """Read, override and validate a config file (path None = flags only)."""
    raw: dict[str, Any] = {}
    p = Path(os.path.expanduser(str(path))) if path is not None else None
    if p is not None:
        raw = read_toml(p)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_override(raw, dotted, value)
    values = validate(raw, require_command=require_command)
    return Config(values=values, path=p, state_dir=default_state_dir())
