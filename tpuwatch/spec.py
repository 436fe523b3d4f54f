"""The saved node spec (`[tpu.spec]`): capture it from a live node, validate it, build a create request.

The spec is the zone-independent part of a `Node` that a create request needs — accelerator,
runtime, network, service account, scheduling, labels, metadata, tags, disks, shielded VM and
(v2alpha1) boot disk — written flat, one key per gcloud `tpu-vm create` flag, so a person can read
and edit it. Output-only fields that identify one incarnation (id, create_time, state, health,
network_endpoints, symptoms, queued_resource, multislice_node, api_version) are never captured, nor is
cidr_block, which the API fills in from the subnetwork (sent back, it conflicts with it).

Rules of this module: it converts between TOML tables and `google.cloud.tpu_v2[alpha1].Node`
messages and checks them; it performs no API call and reads no file except through
`read_startup_script`. Errors are ConfigError naming `tpu.spec.<key>` (exit 2).

Limits checked before any create (source: Compute Engine API reference, `Metadata.items`:
"keys ... [a-zA-Z0-9-_]+, and be less than 128 bytes", "value ... less than or equal to 262144
bytes (256 KiB)", "The total size of all keys and values must be less than 512 KB"; a TPU VM's
metadata is served by the Compute Engine metadata server, and the TPU API documents no other
limits, so these are the ones applied). Label rules are those of Google Cloud resource labels.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tpuwatch.errors import ConfigError
from tpuwatch.model import OWNER_LABEL, PLACE_LABELS

STARTUP_SCRIPT_KEY = "startup-script"
# Metadata keys tpuwatch writes on every create for the startup script (see
# startup-scripts/resume-training.sh). They are never captured from a live node, because each
# create writes them afresh from the config; other `tpuwatch-*` keys (tpuwatch-setup, ...) are
# the user's settings and are kept.
GENERATED_METADATA = frozenset({
    "tpuwatch-job", "tpuwatch-command", "tpuwatch-checkpoint-dir", "tpuwatch-env",
    "tpuwatch-worker-script", "tpuwatch-attempt", "tpuwatch-checkpoint", "tpuwatch-step",
    "tpuwatch-user", "tpuwatch-env-withheld", "tpuwatch-command-withheld",
})

METADATA_VALUE_MAX = 262_144  # bytes, per value
METADATA_TOTAL_MAX = 512 * 1024  # bytes, all keys + values
METADATA_KEY_MAX = 127  # "less than 128 bytes"
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
MAX_LABELS = 64

# key -> (kind, doc). Kinds: str, bool, int, strlist, strmap, or a nested-table name below.
SPEC_KEYS: dict[str, tuple[str, str]] = {
    "accelerator_type": ("str", "e.g. \"v4-32\" (or accelerator_config)"),
    "accelerator_config": ("accelerator_config", "{ type = \"V5P\", topology = \"2x2x2\" } (or accelerator_type)"),
    "runtime_version": ("str", "TPU software version, e.g. \"tpu-ubuntu2204-base\" (required)"),
    "description": ("str", "free text"),
    "network": ("str", "VPC network (network_config.network)"),
    "subnetwork": ("str", "subnetwork (network_config.subnetwork)"),
    "enable_external_ips": ("bool", "give workers external IPs"),
    "can_ip_forward": ("bool", "allow IP forwarding"),
    "queue_count": ("int", "network queue count per worker (0 = default)"),
    "network_configs": ("network_configs", "several network interfaces: a list of tables with the five keys above"),
    "cidr_block": ("str", "CIDR range for the TPU workers; not written by `init` (the API fills it in from the subnetwork, and a create that sends that range back is refused)"),
    "service_account": ("str", "service account email"),
    "scopes": ("strlist", "OAuth scopes for the service account"),
    "spot": ("bool", "Spot VM"),
    "preemptible": ("bool", "preemptible VM (older than spot)"),
    "reserved": ("bool", "use reserved capacity"),
    "labels": ("strmap", "resource labels; tpuwatch-job = <job> marks ownership"),
    "metadata": ("strmap", "instance metadata; startup-script comes from tpu.startup_script when set"),
    "tags": ("strlist", "network tags"),
    "data_disks": ("data_disks", "list of { source_disk = \"projects/...\", mode = \"READ_WRITE\" }"),
    "shielded_secure_boot": ("bool", "Shielded VM secure boot"),
    "boot_disk": ("boot_disk", "v2alpha1: { kms_key_name = \"...\", enable_confidential_compute = false }"),
    "autocheckpoint_enabled": ("bool", "v2alpha1: SIGTERM the workload before maintenance"),
    "queued_resource_tier": ("str", "for a node made through a queued resource: \"spot\", \"guaranteed\", "
                             "\"reserved\" (guaranteed on reserved capacity), \"best_effort\" or \"\" (on demand); "
                             "reserved and best_effort are v2alpha1 tiers"),
    "reservation_name": ("str", "queued resource: the reservation to draw from, "
                         "\"projects/P/locations/ZONE/reservations/NAME\" (or folders/F, organizations/O)"),
}
REQUIRED = ("runtime_version",)
ALPHA_ONLY = ("boot_disk", "autocheckpoint_enabled")
_NETWORK_KEYS = ("network", "subnetwork", "enable_external_ips", "can_ip_forward", "queue_count")
_SUBTABLES: dict[str, dict[str, str]] = {
    "accelerator_config": {"type": "str", "topology": "str"},
    "network_configs": {"network": "str", "subnetwork": "str", "enable_external_ips": "bool", "can_ip_forward": "bool", "queue_count": "int"},
    "data_disks": {"source_disk": "str", "mode": "str"},
    "boot_disk": {"kms_key_name": "str", "enable_confidential_compute": "bool"},
}
ACCELERATOR_TYPES = ("V2", "V3", "V4", "V5LITE_POD", "V5P", "V6E")
DISK_MODES = ("READ_WRITE", "READ_ONLY")
# The tier of a queued resource: the request's `tier` oneof (spot, guaranteed, v2alpha1's best_effort)
# with "reserved" for v2alpha1's guaranteed.reserved (gcloud alpha `--reserved`). v2 sees only spot
# and guaranteed: the others are read and sent through v2alpha1.
QR_TIERS = ("", "spot", "guaranteed", "reserved", "best_effort")
QR_ALPHA_TIERS = ("reserved", "best_effort")
# A reservation as the API names it (the queued resource's reservationName); gcloud expands a short
# name to the project form and `--reservation-host-folder` / `-organization` to theirs, "-" = any.
RESERVATION_NAME = re.compile(r"^(projects|folders|organizations)/[^/\s]+/locations/[^/\s]+/reservations/[^/\s]+$")


def _did_you_mean(word: str, options: list[str]) -> str:
    hint = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


# ---------------------------------------------------------------------------------------------
# capture: Node -> spec table


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name) if name else str(value)


def capture(node: Any, job: str) -> dict[str, Any]:
    """The `[tpu.spec]` table that creates `node` again, owned by `job` (a TOML-ready dict).

    Accepts a `tpu_v2.Node` or a `tpu_v2alpha1.Node`. Keys whose value is the API default are
    left out, except runtime_version, the accelerator and the three scheduling flags, which are
    always written so the file says what it will create.
    """
    spec: dict[str, Any] = {}
    if node.accelerator_type:
        spec["accelerator_type"] = node.accelerator_type
    cfg = node.accelerator_config
    if cfg and (_enum_name(cfg.type_) != "TYPE_UNSPECIFIED" or cfg.topology):
        # The API fills accelerator_type in when the node was created from a config; the config is
        # what the user chose (a topology cannot be expressed as a type), so keep only the config.
        spec.pop("accelerator_type", None)
        spec["accelerator_config"] = {"type": _enum_name(cfg.type_), "topology": cfg.topology}
    spec["runtime_version"] = node.runtime_version
    if node.description:
        spec["description"] = node.description

    configs = list(node.network_configs)
    if len(configs) > 1:
        spec["network_configs"] = [_network_table(c, keep_defaults=True) for c in configs]
    else:
        single = configs[0] if configs else (node.network_config if "network_config" in node else None)
        if single is not None:
            spec.update(_network_table(single, keep_defaults=False))
    # cidr_block is not captured: the API fills it in from the subnetwork, and a create that sends
    # it back conflicts with that very subnetwork.
    if "service_account" in node:
        if node.service_account.email:
            spec["service_account"] = node.service_account.email
        if node.service_account.scope:
            spec["scopes"] = list(node.service_account.scope)

    sched = node.scheduling_config
    spec["spot"] = bool(sched.spot)
    spec["preemptible"] = bool(sched.preemptible)
    spec["reserved"] = bool(sched.reserved)

    labels = {k: v for k, v in node.labels.items() if k not in PLACE_LABELS}
    labels[OWNER_LABEL] = job
    spec["labels"] = dict(sorted(labels.items()))
    metadata = {k: v for k, v in node.metadata.items() if k not in GENERATED_METADATA}
    if metadata:
        spec["metadata"] = dict(sorted(metadata.items()))
    if node.tags:
        spec["tags"] = list(node.tags)
    if node.data_disks:
        spec["data_disks"] = [
            {"source_disk": d.source_disk, "mode": _enum_name(d.mode)} for d in node.data_disks
        ]
    if "shielded_instance_config" in node and node.shielded_instance_config.enable_secure_boot:
        spec["shielded_secure_boot"] = True

    # v2alpha1 only
    if getattr(node, "autocheckpoint_enabled", False):
        spec["autocheckpoint_enabled"] = True
    boot = getattr(node, "boot_disk_config", None)
    if boot is not None and "boot_disk_config" in node:
        table: dict[str, Any] = {}
        if boot.customer_encryption_key.kms_key_name:
            table["kms_key_name"] = boot.customer_encryption_key.kms_key_name
        if boot.enable_confidential_compute:
            table["enable_confidential_compute"] = True
        if table:
            spec["boot_disk"] = table
    return spec


def _network_table(cfg: Any, keep_defaults: bool) -> dict[str, Any]:
    table: dict[str, Any] = {
        "network": cfg.network,
        "subnetwork": cfg.subnetwork,
        "enable_external_ips": bool(cfg.enable_external_ips),
        "can_ip_forward": bool(cfg.can_ip_forward),
        "queue_count": int(cfg.queue_count),
    }
    if keep_defaults:
        return table
    # enable_external_ips is always written: whether workers are reachable from outside matters
    # to SSH, and false is a choice worth seeing in the file.
    return {k: v for k, v in table.items() if k == "enable_external_ips" or v not in ("", 0, False)}


def capture_queued_resource(qr: Any) -> dict[str, Any]:
    """The spec keys for a node that came from queued resource `qr`: its tier and reservation.

    Takes a `tpu_v2alpha1.QueuedResource`, which holds every tier, or a `tpu_v2.QueuedResource`
    (where v2alpha1 is not served), which cannot show best_effort or guaranteed.reserved.
    """
    pb = type(qr).pb(qr)
    tier = pb.WhichOneof("tier") or ""
    if tier == "guaranteed" and "reserved" in pb.guaranteed.DESCRIPTOR.fields_by_name and pb.guaranteed.reserved:
        tier = "reserved"
    table: dict[str, Any] = {"queued_resource_tier": tier}
    if qr.reservation_name:
        table["reservation_name"] = qr.reservation_name
    return table


# ---------------------------------------------------------------------------------------------
# validation


def validate_spec(spec: Mapping[str, Any], *, key: str = "tpu.spec") -> dict[str, Any]:
    """Check a spec table; returns it (a copy). ConfigError names `tpu.spec.<key>` and the fix."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{key}: expected a table")
    for name in spec:
        if name not in SPEC_KEYS:
            raise ConfigError(
                f"{key}.{name}: unknown key{_did_you_mean(name, list(SPEC_KEYS))}; "
                f"[{key}] accepts {', '.join(SPEC_KEYS)}"
            )
    for name in REQUIRED:
        if not spec.get(name):
            raise ConfigError(
                f"{key}.{name}: missing; add `{name} = \"...\"` under [{key}] "
                "(run `tpuwatch init NAME` to capture it from the live TPU)"
            )
    has_type = bool(spec.get("accelerator_type"))
    has_cfg = "accelerator_config" in spec
    if not has_type and not has_cfg:
        raise ConfigError(
            f"{key}.accelerator_type: missing; add `accelerator_type = \"v4-32\"` or "
            f"`accelerator_config = {{ type = \"V4\", topology = \"2x2x4\" }}` under [{key}]"
        )
    if has_type and has_cfg:
        raise ConfigError(f"{key}.accelerator_config: give either accelerator_type or accelerator_config, not both")
    for name, value in spec.items():
        _check_value(f"{key}.{name}", SPEC_KEYS[name][0], value)
    if has_cfg:
        acc = spec["accelerator_config"]
        for sub in ("type", "topology"):
            if not acc.get(sub):
                raise ConfigError(f"{key}.accelerator_config.{sub}: missing")
        if acc["type"] not in ACCELERATOR_TYPES:
            raise ConfigError(
                f"{key}.accelerator_config.type: {acc['type']!r} is not one of {', '.join(ACCELERATOR_TYPES)}"
                f"{_did_you_mean(str(acc['type']).upper(), list(ACCELERATOR_TYPES))}"
            )
    if "network_configs" in spec and any(k in spec for k in _NETWORK_KEYS):
        raise ConfigError(
            f"{key}.network_configs: give either network_configs or the single-network keys "
            f"({', '.join(_NETWORK_KEYS)}), not both"
        )
    for i, disk in enumerate(spec.get("data_disks", [])):
        if not disk.get("source_disk"):
            raise ConfigError(f"{key}.data_disks[{i}].source_disk: missing")
        if disk.get("mode", "READ_WRITE") not in DISK_MODES:
            raise ConfigError(f"{key}.data_disks[{i}].mode: {disk['mode']!r} is not one of {', '.join(DISK_MODES)}")
    tier = spec.get("queued_resource_tier", "")
    if tier not in QR_TIERS:
        raise ConfigError(
            f"{key}.queued_resource_tier: {tier!r} is not one of "
            f"{', '.join(repr(t) for t in QR_TIERS[1:])} or \"\" (on demand)"
            f"{_did_you_mean(str(tier).replace('-', '_').lower(), list(QR_TIERS[1:]))}"
        )
    check_reservation(f"{key}.reservation_name", spec.get("reservation_name", ""))
    if sum(bool(spec.get(k)) for k in ("spot", "preemptible", "reserved")) > 1:
        raise ConfigError(f"{key}.spot: at most one of spot, preemptible and reserved may be true")
    labels = spec.get("labels", {})
    if len(labels) > MAX_LABELS:
        raise ConfigError(f"{key}.labels: {len(labels)} labels; a resource may have at most {MAX_LABELS}")
    for lk, lv in labels.items():
        if not _LABEL_KEY.match(lk):
            raise ConfigError(
                f"{key}.labels.{lk}: not a valid label key (lowercase letters, digits, _ and -, "
                "starting with a letter, at most 63)"
            )
        if not _LABEL_VALUE.match(lv):
            raise ConfigError(
                f"{key}.labels.{lk}: {lv!r} is not a valid label value (lowercase letters, digits, "
                "_ and -, at most 63)"
            )
    check_metadata(spec.get("metadata", {}), key=f"{key}.metadata")
    return dict(spec)


def check_reservation(where: str, value: str) -> None:
    """ConfigError unless `value` is "" or a reservation's full name (the API takes no short one)."""
    if value and not RESERVATION_NAME.match(value):
        raise ConfigError(
            f"{where}: {value!r} is not a reservation's full name; write "
            "\"projects/PROJECT/locations/ZONE/reservations/NAME\" (`tpuwatch init` copies it from the "
            "queued resource)"
        )


def _check_value(where: str, kind: str, value: Any) -> None:
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: expected a whole number >= 0, got {value!r}")
    elif kind == "strlist":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    elif kind == "strmap":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of key = \"value\"")
        for k, v in value.items():
            if not isinstance(v, str):
                raise ConfigError(f"{where}.{k}: expected a string, got {v!r}")
    elif kind in ("network_configs", "data_disks"):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of tables")
        for i, item in enumerate(value):
            _check_table(f"{where}[{i}]", _SUBTABLES[kind], item)
    else:
        _check_table(where, _SUBTABLES[kind], value)


def _check_table(where: str, keys: dict[str, str], value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a table with {', '.join(keys)}")
    for k, v in value.items():
        if k not in keys:
            raise ConfigError(f"{where}.{k}: unknown key{_did_you_mean(k, list(keys))}; use {', '.join(keys)}")
        _check_value(f"{where}.{k}", keys[k], v)


def check_metadata(metadata: Mapping[str, str], *, key: str = "tpu.spec.metadata") -> None:
    """Metadata keys and sizes within the Compute Engine limits, or ConfigError naming the key."""
    total = 0
    for k, v in metadata.items():
        kb = k.encode()
        vb = v.encode()
        if not _METADATA_KEY.match(k) or len(kb) > METADATA_KEY_MAX:
            raise ConfigError(f"{key}.{k}: metadata keys are letters, digits, - and _, under 128 bytes")
        if len(vb) > METADATA_VALUE_MAX:
            where = "tpu.startup_script" if k == STARTUP_SCRIPT_KEY else f"{key}.{k}"
            raise ConfigError(
                f"{where}: {len(vb)} bytes is over the metadata value limit of {METADATA_VALUE_MAX} "
                "bytes (256 KiB); keep the script small and fetch the rest (e.g. from a bucket) at boot"
            )
        total += len(kb) + len(vb)
    if total > METADATA_TOTAL_MAX:
        raise ConfigError(
            f"{key}: {total} bytes in all metadata keys and values together, over the limit of "
            f"{METADATA_TOTAL_MAX} bytes (512 KB); remove or shorten entries (tpu.startup_script counts too)"
        )


# ---------------------------------------------------------------------------------------------
# build: spec -> create request


def read_startup_script(path: str, *, base: Path | None = None) -> str:
    """The text of `tpu.startup_script`; a relative path is relative to `base` (the config's folder)."""
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and base is not None:
        p = base / p
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"tpu.startup_script: file {str(p)!r} not found; fix the path (relative paths are "
            "relative to the config file) or remove the key"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"tpu.startup_script: {str(p)!r} is a directory, not a script") from None
    except PermissionError:
        raise ConfigError(f"tpu.startup_script: {str(p)!r} is not readable (permission denied)") from None
    if len(data) > METADATA_VALUE_MAX:
        raise ConfigError(
            f"tpu.startup_script: {str(p)!r} is {len(data)} bytes, over the metadata value limit of "
            f"{METADATA_VALUE_MAX} bytes (256 KiB); keep the script small and fetch the rest at boot"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"tpu.startup_script: {str(p)!r} is not UTF-8 text") from None


def needs_v2alpha1(spec: Mapping[str, Any]) -> bool:
    """True when the spec uses fields only the v2alpha1 API has."""
    return any(k in spec for k in ALPHA_ONLY)


def build_node(
    spec: Mapping[str, Any],
    startup_script_text: str | None = None,
    *,
    job: str | None = None,
    extra_metadata: Mapping[str, str] | None = None,
) -> Any:
    """The create request's `Node` (tpu_v2, or tpu_v2alpha1 when the spec needs it).

    `startup_script_text` becomes metadata `startup-script` (replacing any captured one); other
    metadata is kept, then `extra_metadata` (tpuwatch's own `tpuwatch-*` keys) is added. With `job`
    the ownership label `tpuwatch-job=<job>` is set to exactly that value. The result is validated
    against the metadata limits.
    """
    spec = validate_spec(spec)
    if needs_v2alpha1(spec):
        from google.cloud import tpu_v2alpha1 as tpu
    else:
        from google.cloud import tpu_v2 as tpu  # type: ignore[no-redef]

    node = tpu.Node()
    if spec.get("accelerator_type"):
        node.accelerator_type = spec["accelerator_type"]
    if "accelerator_config" in spec:
        acc = spec["accelerator_config"]
        node.accelerator_config = tpu.AcceleratorConfig(
            type_=tpu.AcceleratorConfig.Type[acc["type"]], topology=acc["topology"]
        )
    node.runtime_version = spec["runtime_version"]
    if spec.get("description"):
        node.description = spec["description"]
    if "network_configs" in spec:
        node.network_configs = [tpu.NetworkConfig(**dict(c)) for c in spec["network_configs"]]
    else:
        single = {k: spec[k] for k in _NETWORK_KEYS if k in spec}
        if single:
            node.network_config = tpu.NetworkConfig(**single)
    if spec.get("cidr_block"):
        node.cidr_block = spec["cidr_block"]
    if spec.get("service_account") or spec.get("scopes"):
        node.service_account = tpu.ServiceAccount(
            email=spec.get("service_account", ""), scope=list(spec.get("scopes", []))
        )
    sched = {k: bool(spec.get(k, False)) for k in ("spot", "preemptible", "reserved")}
    if any(sched.values()):
        node.scheduling_config = tpu.SchedulingConfig(**sched)

    labels = {k: v for k, v in dict(spec.get("labels", {})).items() if k not in PLACE_LABELS}
    if job is not None:
        labels[OWNER_LABEL] = job
    if labels:
        node.labels = labels
    metadata = dict(spec.get("metadata", {}))
    if startup_script_text is not None:
        metadata[STARTUP_SCRIPT_KEY] = startup_script_text
    metadata.update(extra_metadata or {})
    check_metadata(metadata)
    if metadata:
        node.metadata = metadata
    if spec.get("tags"):
        node.tags = list(spec["tags"])
    if spec.get("data_disks"):
        node.data_disks = [
            tpu.AttachedDisk(
                source_disk=d["source_disk"], mode=tpu.AttachedDisk.DiskMode[d.get("mode", "READ_WRITE")]
            )
            for d in spec["data_disks"]
        ]
    if spec.get("shielded_secure_boot"):
        node.shielded_instance_config = tpu.ShieldedInstanceConfig(enable_secure_boot=True)
    if spec.get("autocheckpoint_enabled"):
        node.autocheckpoint_enabled = True
    if "boot_disk" in spec:
        boot = spec["boot_disk"]
        node.boot_disk_config = tpu.BootDiskConfig(
            customer_encryption_key=tpu.CustomerEncryptionKey(kms_key_name=boot.get("kms_key_name", "")),
            enable_confidential_compute=bool(boot.get("enable_confidential_compute", False)),
        )
    return node


def node_to_json(node: Any) -> dict[str, Any]:
    """A create request's Node as the JSON the REST API takes (camelCase, enum names)."""
    from google.protobuf.json_format import MessageToDict

    result: dict[str, Any] = MessageToDict(type(node).pb(node))
    return result


# ---------------------------------------------------------------------------------------------
# tpuwatch.toml writer (for `tpuwatch init`)

_JOB_COMMENT = """\
[job]
# name = ""                 # default: the TPU name; names the journal and the ownership label
# EDIT: the training command, run on every worker. {checkpoint} {step} {attempt} {worker} are
# substituted (shell-quoted); the command must resume from {checkpoint} when it is not empty.
"""

_TAIL = """\
# workers = "all"
# env = { }                 # extra environment variables for the command

# Defaults shown; uncomment to change.
# [recovery]
# poll_interval = "30s"
# repair_timeout = "30m"    # how long to wait for the TPU to heal itself before recreating
# max_restarts = 5          # failures not caused by a disruption
# max_recreates = 3
# no_progress_limit = 3     # consecutive attempts that add no checkpoint => failed
# min_uptime = "2m"         # an attempt shorter than this is a failed start
# queue_timeout = "24h"     # stockout/quota: keep retrying create this long, then fallback_zones
# fail_fast_exit_codes = []  # exit codes that fail the job at once (any other is retried)

# [ssh]
# user = ""                 # default: the local user name, as gcloud does
# identity_file = "~/.ssh/google_compute_engine"
# port = 22
# internal_ip = false
# transport = "openssh"     # or "gcloud"
"""

_PLACEHOLDER_COMMAND = "cd ~/repo && python3 train.py --resume={checkpoint}"


def render_config(
    *,
    name: str,
    project: str,
    names: Sequence[str] = (),
    zone: str,
    spec: Mapping[str, Any],
    queued_resource: str = "",
    startup_script: str = "",
    command: str = "",
    checkpoint_dir: str = "",
    source: str = "",
    job: str = "",
) -> str:
    """A complete tpuwatch.toml: [tpu], [tpu.spec], [job] and commented defaults.

    `command`/`checkpoint_dir` are filled in when known (a node tpuwatch created carries them in
    its metadata); otherwise a placeholder command is written with an EDIT note. A `job` other
    than the TPU name is written as [job] name, so the ownership label in the spec and the job
    the config runs as are the same.
    """
    import tomli_w

    head = "# tpuwatch.toml" + (f" - written by `tpuwatch init` from {source}" if source else "") + "\n"
    head += "# Reference: `tpuwatch --help`; every key is checked when the file is read.\n\n"
    tpu_table: dict[str, Any] = {
        "name": name,
        **({"names": list(names)} if names else {}),
        "project": project,
        "zone": zone,
        "fallback_zones": [],
        "queued_resource": queued_resource,
        "startup_script": startup_script,
    }
    tpu_text = tomli_w.dumps({"tpu": tpu_table})
    tpu_text = tpu_text.replace(
        "fallback_zones = []",
        "fallback_zones = []         # tried in order when the zone has no capacity, e.g. [\"us-central2-a\"]",
    ).replace(
        f"startup_script = {tomli_w.dumps({'x': startup_script})[4:].strip()}",
        f"startup_script = {tomli_w.dumps({'x': startup_script})[4:].strip()}"
        + ("" if startup_script else "         # e.g. \"startup-scripts/resume-training.sh\" (relative to this file)"),
    )
    spec_text = (
        "# The node as `tpuwatch recreate` will create it again (zone-independent). The ownership\n"
        f"# label {OWNER_LABEL} is what lets tpuwatch delete this TPU; metadata startup-script is\n"
        "# replaced by tpu.startup_script when that is set.\n"
        + tomli_w.dumps({"tpu": {"spec": dict(spec)}}, multiline_strings=True)
    )
    job_lines = _JOB_COMMENT
    if job and job != name:
        job_lines = job_lines.replace(
            '# name = ""                 # default: the TPU name;',
            f"name = {tomli_w.dumps({'x': job})[4:].strip()}        # job name, instead of the TPU name;")
    job_lines += tomli_w.dumps({"command": command or _PLACEHOLDER_COMMAND, "checkpoint_dir": checkpoint_dir})
    job_lines = job_lines.replace(
        f"checkpoint_dir = {tomli_w.dumps({'x': checkpoint_dir})[4:].strip()}",
        f"checkpoint_dir = {tomli_w.dumps({'x': checkpoint_dir})[4:].strip()}"
        + ("" if checkpoint_dir else "         # EDIT: gs://BUCKET/run/ckpt or an absolute path"),
    )
    return head + tpu_text + "\n" + spec_text + "\n" + job_lines + _TAIL


def render_compute_config(*, kind: str, name: str, project: str, zone: str, spec: Mapping[str, Any],
                          source: str = "", job: str = "", command: str = "", checkpoint_dir: str = "",
                          flex_start: str = "") -> str:
    """A complete tpuwatch.toml for a slice made through Compute Engine: [tpu] api = "compute" with
    `instance` or `mig` (`kind`), `flex_start` for a MIG made through flex-start resize requests,
    [tpu.compute_spec] as `tpuwatch init` captured it, and [job]."""
    import tomli_w

    head = "# tpuwatch.toml" + (f" - written by `tpuwatch init` from {source}" if source else "") + "\n"
    head += "# Reference: `tpuwatch --help`; every key is checked when the file is read.\n\n"
    tpu_table: dict[str, Any] = {"api": "compute", kind: name, "project": project, "zone": zone}
    if flex_start:
        tpu_table["flex_start"] = flex_start
    tpu_text = tomli_w.dumps({"tpu": {**tpu_table, "startup_script": ""}})
    what = ("the instance as tpuwatch inserts it again after deleting it" if kind == "instance" else
            "the MIG as it is inserted again if it is gone (its template must still exist), with the template\n"
            "# and workload policy it was made from; tpuwatch recreates a MIG's instances with recreateInstances")
    spec_text = (f"# {what}. The ownership label {OWNER_LABEL} is what lets tpuwatch delete or recreate it.\n"
                 + tomli_w.dumps({"tpu": {"compute_spec": dict(spec)}}, multiline_strings=True))
    job_lines = _JOB_COMMENT
    if job and job != name:
        job_lines = job_lines.replace(
            '# name = ""                 # default: the TPU name;',
            f"name = {tomli_w.dumps({'x': job})[4:].strip()}        # job name, instead of the TPU name;")
    job_lines += tomli_w.dumps({"command": command or _PLACEHOLDER_COMMAND, "checkpoint_dir": checkpoint_dir})
    return head + tpu_text + "\n" + spec_text + "\n" + job_lines + _TAIL
