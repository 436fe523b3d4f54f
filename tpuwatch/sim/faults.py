"""The faults the simulator can inject: one table shared by scenario files, `tpuwatch sim inject`
and the control service, so every way of asking for a fault accepts the same names and options.

`normalize` checks a fault's options (unknown key, bad duration, wrong type: a UsageError naming
it) and turns them into plain JSON values (durations in simulated seconds, a startup script
file into metadata); `apply` performs a normalized fault on a World. Nothing here knows gRPC
or click.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch.durations import parse_duration
from tpuwatch.errors import UsageError
from tpuwatch.sim.calls import INJECTABLE_CODES
from tpuwatch.sim.maintenance import MAINTENANCE_REFUSALS, NOTICE_KEYS, STUCK_MODES
from tpuwatch.sim.nodefaults import SYMPTOM_TYPES
from tpuwatch.sim.records import NodeSpec
from tpuwatch.sim.shapes import worker_count
from tpuwatch.sim.world import World


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # str, int, float, bool, duration, list, map, choice
    help: str
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()
    cli: str = ""  # the CLI flag when it differs from --name-with-dashes


# Parameters many faults share.
_METHODS = Param("methods", "list", "only methods containing one of these (default: all)", default=[])
_UNTIL_CLEARED = Param("duration", "duration", "how long (default: until cleared)")


@dataclass(frozen=True)
class Fault:
    name: str
    help: str
    params: tuple[Param, ...]
    target: str | None = None  # the param given positionally on the CLI

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


_WHERE = (
    Param("zone", "str", "zone of the node (default: the simulator's zone)"),
    Param("project", "str", "project of the node (default: the simulator's project)"),
)
_NODE = Param("node", "str", "node name", required=True)
_INSTANCE = Param("instance", "str", "Compute Engine instance name", required=True)
_NOTICE_VIA = Param("notice_via", "choice",
                    "the metadata key that gives the notice: maintenance-event TERMINATE_ON_HOST_MAINTENANCE, or "
                    "upcoming-maintenance turning ONGOING alone (as the Cloud TPU docs point TPU VMs to); "
                    "default maintenance-event", choices=NOTICE_KEYS)
_WORKER = Param("worker", "int", "worker index", default=0)
_TERM_FIRST = Param("term_first", "duration",
                    "the guest's shutdown first: every worker process gets SIGTERM this long (simulated) before the "
                    "metadata notice and the API's change", default=0.0)
HOST_FAULTS = ("device-missing", "stale-lockfile", "dns-failure", "orphan-holder", "disk-full", "small-shm")

FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "maintenance",
            "Maintenance: job killed, SSH refused, UNHEALTHY_MAINTENANCE -> REPAIRING -> healed.",
            (
                _NODE,
                Param(
                    "heal_after",
                    "duration",
                    'simulated time until it heals; "never" = stuck',
                    default=1800.0,
                ),
                Param("stuck", "choice", "never heal, stuck in this state", choices=STUCK_MODES),
                Param("worker", "int", "worker the event is on (worker-level audit entries)"),
                Param("reason", "str", "terminateReason in the audit entry", default="MAINTENANCE"),
                Param("notice", "duration",
                      "simulated time the workers' metadata servers announce it before the host stops", default=0.0),
                _NOTICE_VIA,
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "preempt",
            "Preempt a spot/preemptible node: PREEMPTED for good.",
            (
                _NODE,
                Param("reason", "str", "terminateReason in the audit entry", default="PREEMPTED"),
                Param("notice", "duration",
                      "simulated time the workers' metadata servers announce it before the host stops", default=0.0),
                _TERM_FIRST,
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "slice-replace",
            "Multislice autorepair: a slice of an ACTIVE multislice queued resource fails for good; a new "
            "one is created (same name, new id) once hardware is found, then the other slices restart.",
            (
                _NODE,
                Param("hardware_after", "duration", "simulated time until the new slice is created",
                      default=600.0),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "terminate",
            "Terminate the node: TERMINATED for good.",
            (
                _NODE,
                Param("reason", "str", "terminateReason in the audit entry", default="MAINTENANCE"),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "kill-worker",
            "Kill every process on one worker (the node stays READY).",
            (
                _NODE,
                Param("worker", "int", "worker index", default=0),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "hang",
            "Stop (SIGSTOP) the job's processes on one worker, or all.",
            (
                _NODE,
                Param("worker", "int", "worker index (default: all)"),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "ssh",
            "One worker's SSH server refuses, accepts and never answers (hang), or drops its open connections; "
            "the API says healthy.",
            (
                _NODE,
                Param("worker", "int", "worker index", default=0),
                Param(
                    "mode",
                    "choice",
                    "refuse, hang, serve (end the fault), or drop (cut the open connections now, serve new ones)",
                    default="HANG",
                    choices=("REFUSE", "HANG", "SERVE", "DROP"),
                ),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "keys-late",
            "From the node's next boot on (create, heal, recreate), its workers refuse every SSH key "
            "for DELAY: keys reach a new VM after sshd listens.",
            (
                _NODE,
                Param("delay", "duration", "how long after each boot keys are refused (0: the keys arrive now, "
                      "and the fault ends)",
                      default=60.0),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "rotate-host-keys",
            "Every later heal of the node gives its workers new host keys (published in their guest attributes).",
            (_NODE, *_WHERE),
            target="node",
        ),
        Fault(
            "wrong-host-key",
            "One worker presents an SSH host key its guest attributes do not publish (until a recreate).",
            (_NODE, _WORKER, *_WHERE),
            target="node",
        ),
        Fault(
            "slow-api",
            "API calls answer late (latency in simulated time, jittered).",
            (
                Param("latency", "duration", "how late each matching call answers", required=True),
                Param("jitter", "float", "spread as a share of the latency, 0..1", default=0.5),
                _METHODS,
                _UNTIL_CLEARED,
            ),
        ),
        Fault(
            "lose-responses",
            "Serve this fraction of calls, then answer with an error (the response is lost).",
            (
                Param("rate", "float", "fraction of calls, 0..1", required=True),
                Param("codes", "list", "status codes to answer with", default=["DEADLINE_EXCEEDED"]),
                _METHODS,
                _UNTIL_CLEARED,
            ),
        ),
        Fault(
            "symptom",
            "Add a symptom to the node.",
            (
                _NODE,
                Param(
                    "type",
                    "choice",
                    "symptom type",
                    default="EXECUTE_TIMED_OUT",
                    choices=SYMPTOM_TYPES,
                ),
                Param("worker", "int", "worker id", default=0),
                Param("details", "str", "details text", default=""),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "upcoming-maintenance",
            "Announce maintenance (v2alpha1 upcoming_maintenance), run it when due.",
            (
                _NODE,
                Param(
                    "starts_in",
                    "duration",
                    "simulated time until the window opens",
                    default=7 * 86400.0,
                ),
                Param("window", "duration", "length of the window"),
                Param("heal_after", "duration", "repair time once it starts", default=1800.0),
                Param(
                    "type",
                    "choice",
                    "maintenance type",
                    default="SCHEDULED",
                    choices=("SCHEDULED", "UNSCHEDULED"),
                ),
                Param("can_reschedule", "bool", "whether it can be rescheduled", default=True),
                Param("notice", "duration",
                      "simulated time the workers' metadata servers announce it before the host stops", default=0.0),
                _NOTICE_VIA,
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "refuse-maintenance",
            "Starting the node's maintenance by hand (performMaintenance, or through its queued resource) "
            "is refused with CODE (NONE ends the fault).",
            (
                _NODE,
                Param("code", "choice", "the refusal's code", default="PERMISSION_DENIED",
                      choices=(*MAINTENANCE_REFUSALS, "NONE")),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "metadata-directories-fail",
            "The node's workers' metadata servers answer every directory query (a listing, ?recursive=true) "
            "with 503; each key is still served.",
            (_NODE, Param("fails", "bool", "false ends the fault", default=True), *_WHERE),
            target="node",
        ),
        Fault(
            "heal",
            "End the node's fault now: READY+HEALTHY, SSH back.",
            (_NODE, *_WHERE),
            target="node",
        ),
        Fault(
            "delete-node",
            "Someone deleted the node outside tpuwatch (gone at once).",
            (_NODE, *_WHERE),
            target="node",
        ),
        Fault(
            "stockout",
            "Creates in a zone fail with the no-capacity error.",
            (
                Param("zone", "str", 'zone ("*" = all; default: the simulator\'s zone)'),
                _UNTIL_CLEARED,
                Param("at_insert", "bool", "a Compute Engine instances.insert is refused at once (503 "
                      "ZONE_RESOURCE_POOL_EXHAUSTED) instead of failing in its operation", default=False),
            ),
            target="zone",
        ),
        Fault(
            "reservation-shortfall",
            "Creates in a zone fail with code 8 and \"Insufficient reserved capacity\" (a reservation too small).",
            (
                Param("zone", "str", 'zone ("*" = all; default: the simulator\'s zone)'),
                _UNTIL_CLEARED,
            ),
            target="zone",
        ),
        Fault(
            "quota",
            "Creates in a zone are refused for quota: CreateNode RESOURCE_EXHAUSTED, a Compute Engine "
            "instances.insert 403 quotaExceeded.",
            (
                Param("zone", "str", 'zone ("*" = all; default: the simulator\'s zone)'),
                _UNTIL_CLEARED,
                Param("limit", "str", "quota limit name in the message", default=""),
            ),
            target="zone",
        ),
        Fault(
            "api-errors",
            "Fail this fraction of API calls (seeded).",
            (
                Param("rate", "float", "fraction of calls to fail, 0..1", required=True),
                Param("codes", "list", "status codes to use", default=["UNAVAILABLE"]),
                _METHODS,
                _UNTIL_CLEARED,
            ),
        ),
        Fault(
            "permission-denied",
            "Matching calls fail PERMISSION_DENIED.",
            (
                _METHODS,
                _UNTIL_CLEARED,
            ),
        ),
        Fault(
            "os-login",
            "OS Login: workers accept only this POSIX user (not the local name); gcloud learns it.",
            (Param("user", "str", "the OS Login user name", default="tpuwatch_sim_example_com"),),
            target="user",
        ),
        Fault("clear-errors", "Lift injected API errors, denials, stockouts and quota errors.", ()),
        # Host faults: each makes one environment check fail on one worker.
        Fault(
            "device-missing",
            "A chip's device file vanishes on one worker (stays gone across reboots; a recreate fixes it).",
            (_NODE, _WORKER, Param("count", "int", "chips missing", default=1), *_WHERE),
            target="node",
        ),
        Fault(
            "stale-lockfile",
            "A stale /tmp/libtpu_lockfile on one worker (a crashed TPU program).",
            (_NODE, _WORKER, *_WHERE),
            target="node",
        ),
        Fault(
            "dns-failure",
            "One worker's resolver answers nothing for its peers (until the node is recreated).",
            (_NODE, _WORKER, *_WHERE),
            target="node",
        ),
        Fault(
            "orphan-holder",
            "A process outside any job holds a TPU device open on one worker.",
            (_NODE, _WORKER, *_WHERE),
            target="node",
        ),
        Fault(
            "disk-full",
            "One worker's disk nearly full: a small tmpfs over its root (or PATH), filled (needs root).",
            (
                _NODE,
                _WORKER,
                Param("path", "str", "/ (root disk), /PATH on the host, or ~/PATH in the home", default="/"),
                Param("free", "size", "space left free, e.g. 10MB", default=10_000_000),
                *_WHERE,
            ),
            target="node",
        ),
        Fault(
            "small-shm",
            "One worker's /dev/shm is small: a tmpfs of SIZE mounted there (needs root).",
            (_NODE, _WORKER, Param("size", "size", "size of /dev/shm, e.g. 64MB", default=64_000_000), *_WHERE),
            target="node",
        ),
        Fault(
            "create-queued-resource",
            "Queue a request for a node, or with --node-count for a multislice (<prefix>-0, -1, …), "
            "provisioned all or none.",
            (
                Param("name", "str", "queued resource id (and the node's name without --node-count)",
                      required=True),
                Param("accelerator_type", "str", "accelerator type of each node", default="v4-8", cli="--type"),
                Param("runtime_version", "str", "runtime version", default="tpu-ubuntu2204-base"),
                Param("node_count", "int", "multislice: how many nodes (more than 1)", default=0),
                Param("node_prefix", "str", "multislice: node id prefix (default: the queued resource id)",
                      default=""),
                Param("spot", "bool", "Spot tier (its nodes can be preempted)", default=False),
                *_WHERE,
            ),
            target="name",
        ),
        Fault(
            "create-node",
            "Create a READY node now (no operation).",
            (
                Param("name", "str", "node name", required=True),
                Param("accelerator_type", "str", "accelerator type", default="v4-8", cli="--type"),
                Param("runtime_version", "str", "runtime version", default="tpu-ubuntu2204-base"),
                Param("spot", "bool", "spot node", default=False),
                Param("preemptible", "bool", "preemptible node", default=False),
                Param("labels", "map", "labels KEY=VALUE", default={}),
                Param("metadata", "map", "metadata KEY=VALUE", default={}),
                Param("startup_script", "str", "file whose text becomes metadata startup-script"),
                *_WHERE,
            ),
            target="name",
        ),
        # Compute Engine TPU VMs (instances and MIGs)
        Fault(
            "create-instance",
            "Create a RUNNING Compute Engine TPU VM now (no operation).",
            (
                Param("name", "str", "instance name", required=True),
                Param("machine_type", "str", "TPU machine type", default="tpu7x-standard-4t", cli="--type"),
                Param("provisioning_model", "choice", "provisioning model", default="STANDARD",
                      choices=("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")),
                Param("labels", "map", "labels KEY=VALUE", default={}),
                Param("metadata", "map", "metadata KEY=VALUE", default={}),
                Param("startup_script", "str", "file whose text becomes metadata startup-script"),
                Param("no_notice", "choice", "what instance/upcoming-maintenance says with nothing scheduled: "
                      "the error JSON, {} or NONE", default="ERROR", choices=("ERROR", "EMPTY", "NONE")),
                *_WHERE,
            ),
            target="name",
        ),
        Fault(
            "create-mig",
            "Create a MIG of TPU VMs now, from a new template (and a workload policy with --topology: a "
            "multi-host slice), and wait until it is stable.",
            (
                Param("name", "str", "MIG name (its instances are <name>-xxxx)", required=True),
                Param("machine_type", "str", "TPU machine type", default="tpu7x-standard-4t", cli="--type"),
                Param("size", "int", "target size (VMs)", default=1),
                Param("topology", "str", "accelerator topology of a multi-host slice, e.g. 2x2x4", default=""),
                Param("spot", "bool", "Spot VMs (termination action STOP)", default=False),
                Param("labels", "map", "labels KEY=VALUE of its instances", default={}),
                Param("metadata", "map", "metadata KEY=VALUE of its instances", default={}),
                Param("on_failure", "choice", "instanceLifecyclePolicy.defaultActionOnFailure: REPAIR recreates a "
                      "failed VM (a preempted Spot VM too), DO_NOTHING leaves it", default="REPAIR",
                      choices=("REPAIR", "DO_NOTHING")),
                Param("worker_numbers", "choice", "give each VM an agent-worker-number metadata item (not documented "
                      "by Google on Compute Engine): none, in name order, or in reverse name order",
                      default="NONE", choices=("NONE", "NAME", "REVERSE")),
                *_WHERE,
            ),
            target="name",
        ),
        Fault(
            "host-error",
            "A Compute Engine TPU VM's host fails: TERMINATED (a multi-host MIG's whole slice), then "
            "restarted by Compute Engine (hostError, then automaticRestart audit entries).",
            (_INSTANCE, Param("restart_after", "duration", 'simulated time until it runs again; "never": not '
                              "restarted", default=120.0), *_WHERE),
            target="instance",
        ),
        Fault(
            "instance-maintenance",
            "Schedule host maintenance of a Compute Engine TPU VM: upcomingMaintenance PENDING, the "
            "metadata notice, then it stops (terminateOnHostMaintenance) and is restarted.",
            (
                _INSTANCE,
                Param("starts_in", "duration", "simulated time until the window opens", default=7 * 86400.0),
                Param("window", "duration", "length of the window"),
                Param("heal_after", "duration", "time stopped before it runs again", default=1800.0),
                Param("type", "choice", "maintenance type", default="SCHEDULED", choices=("SCHEDULED", "UNSCHEDULED")),
                Param("can_reschedule", "bool", "whether it can be rescheduled", default=True),
                Param("notice", "duration", "maintenance-event TERMINATE_ON_HOST_MAINTENANCE this long before",
                      default=60.0),
                *_WHERE,
            ),
            target="instance",
        ),
        Fault(
            "preempt-instance",
            "Preempt a Spot Compute Engine TPU VM: TERMINATED for good (action STOP) or deleted (DELETE); "
            "a MIG that repairs (defaultActionOnFailure REPAIR) then recreates it under its name.",
            (_INSTANCE, Param("notice", "duration", "instance/preempted TRUE (and shutdownDetails PENDING_STOP) this "
                                                       "long before (default: the instance's "
                                                       "scheduling.preemptionNoticeDuration, none without one)"),
             _TERM_FIRST, Param("stopping", "duration", "action STOP: STOPPING this long before TERMINATED, as "
                                                        "Google's stop passes through it", default=0.0), *_WHERE),
            target="instance",
        ),
        Fault(
            "mig-autoheal",
            "A MIG repairs an instance: single-host, recreated under its name; multi-host, the whole slice "
            "(repair.recreateInstance audit entries, new ids).",
            (
                Param("mig", "str", "MIG name", required=True),
                Param("instance", "str", "the failed instance (default: the MIG's first)", default=""),
                Param("reason", "str", "the reason in the audit entry", default="instance's health check failed"),
                *_WHERE,
            ),
            target="mig",
        ),
        Fault(
            "run-duration-end",
            "A Compute Engine TPU VM's run duration ends (flex-start): it is deleted.",
            (_INSTANCE, *_WHERE),
            target="instance",
        ),
        Fault(
            "delete-instance",
            "Someone deleted the Compute Engine instance outside tpuwatch (gone at once; a MIG makes it again).",
            (_INSTANCE, *_WHERE),
            target="instance",
        ),
    )
}


def did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def get(fault: str, *, where: str = "fault") -> Fault:
    f = FAULTS.get(fault)
    if f is None:
        raise UsageError(
            f"{where}: unknown fault {fault!r}{did_you_mean(fault, list(FAULTS))}; "
            f"known: {', '.join(FAULTS)}"
        )
    return f


def _convert(p: Param, value: Any, where: str) -> Any:
    key = f"{where}.{p.name}" if where else p.name
    if p.kind == "duration":
        if isinstance(value, str) and value.strip().lower() == "never":
            return None
        return parse_duration(value, key=key)
    if p.kind == "str":
        if not isinstance(value, str):
            raise UsageError(f"{key}: expected a string, got {value!r}")
        return value
    if p.kind == "choice":
        if not isinstance(value, str) or value.upper() not in p.choices:
            raise UsageError(f"{key}: expected one of {', '.join(p.choices)}, got {value!r}")
        return value.upper()
    if p.kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise UsageError(f"{key}: expected a whole number, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise UsageError(f"{key}: expected a whole number, got {value!r}")
    if p.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise UsageError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"{key}: expected a number, got {value!r}")
    if p.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise UsageError(f"{key}: expected true or false, got {value!r}")
    if p.kind == "list":
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise UsageError(f"{key}: expected a list of strings, got {value!r}")
    if p.kind == "size":
        from tpuwatch.config import _bytes_size
        from tpuwatch.errors import ConfigError

        try:
            return int(_bytes_size(key, value))
        except ConfigError as exc:
            raise UsageError(exc.message)
    if p.kind == "map":
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return {k: str(v) for k, v in value.items()}
        raise UsageError(f"{key}: expected a table of strings, got {value!r}")
    raise AssertionError(p.kind)  # pragma: no cover


def normalize(
    fault: str, raw: Mapping[str, Any], *, where: str = "", base_dir: Path | None = None
) -> dict[str, Any]:
    """Checked, JSON-ready options of `fault`; UsageError naming `where.key` on any problem."""
    f = get(fault, where=where or "fault")
    names = [p.name for p in f.params]
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.replace("-", "_")
        p = f.param(key)
        if p is None:
            raise UsageError(
                f"{where + '.' if where else ''}{k}: unknown option for fault {fault!r}{did_you_mean(key, names)}; "
                f"it takes {', '.join(names) or 'no options'}"
            )
        if v is None:
            continue
        out[key] = _convert(p, v, where)
    for p in f.params:
        if p.name not in out and p.name not in raw:
            if p.required:
                raise UsageError(
                    f"{where + '.' if where else ''}{p.name}: required by fault {fault!r}"
                )
            if p.default is not None:
                out[p.name] = p.default
    if fault == "maintenance" and out.get("stuck"):
        out["heal_after"] = None
    if fault == "api-errors":
        bad = [c for c in out.get("codes", []) if c.upper() not in INJECTABLE_CODES]
        if bad:
            raise UsageError(
                f"{where + '.' if where else ''}codes: cannot inject {', '.join(bad)}; use {', '.join(sorted(INJECTABLE_CODES))}"
            )
        if not 0.0 <= out["rate"] <= 1.0:
            raise UsageError(
                f"{where + '.' if where else ''}rate: must be between 0 and 1, got {out['rate']}"
            )
    if fault in ("disk-full", "small-shm"):
        from tpuwatch.sim.hostfaults import can_mount

        if not can_mount():
            raise UsageError(
                f"{where + ': ' if where else ''}fault {fault!r} mounts a small tmpfs on the worker and needs root"
            )
    if fault in ("create-instance", "create-mig"):
        from tpuwatch.sim.cerecords import chips_of, topology_chips

        at = where + "." if where else ""
        try:
            per_vm = chips_of(out["machine_type"])
            chips = topology_chips(out["topology"]) if fault == "create-mig" and out.get("topology") else 0
            if chips and chips != per_vm * out["size"]:
                raise ValueError(f"topology {out['topology']} holds {chips} chips: {chips // per_vm} VMs of "
                                 f"{out['machine_type']}, not size = {out['size']}")
        except ValueError as exc:
            raise UsageError(f"{at}{'topology' if 'topology' in str(exc) else 'machine_type'}: {exc}")
        if fault == "create-mig" and out["size"] < 0:
            raise UsageError(f"{at}size: must be 0 or more, got {out['size']}")
    if fault in ("create-node", "create-instance"):
        if fault == "create-node":
            try:
                worker_count(out["accelerator_type"])
            except ValueError as exc:
                raise UsageError(f"{where + '.' if where else ''}accelerator_type: {exc}")
        script = out.pop("startup_script", None)
        if script is not None:
            path = Path(script).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            try:
                out["metadata"] = {**out.get("metadata", {}), "startup-script": path.read_text()}
            except OSError as exc:
                raise UsageError(
                    f"{where + '.' if where else ''}startup_script: cannot read {str(path)!r}: {exc.strerror}"
                )
    if fault == "create-queued-resource":
        at = where + "." if where else ""
        try:
            worker_count(out["accelerator_type"])
        except ValueError as exc:
            raise UsageError(f"{at}accelerator_type: {exc}")
        if out["node_count"] == 1 or out["node_count"] < 0:
            raise UsageError(
                f"{at}node_count: a multislice has more than 1 node (0 queues one node), got {out['node_count']}"
            )
        if out["node_prefix"] and not out["node_count"]:
            raise UsageError(f"{at}node_prefix: only for a multislice; give node_count too")
    return out


def apply(world: World, fault: str, params: Mapping[str, Any]) -> Any:
    """Perform a normalized fault; returns a JSON-ready result."""
    p = dict(params)
    where = (
        {"project": p.pop("project", None), "zone": p.pop("zone", None)}
        if fault not in ("stockout", "reservation-shortfall", "quota")
        else {}
    )
    if fault == "maintenance":
        world.maintenance(p.pop("node"), **p, **where)
    elif fault == "preempt":
        world.preempt(p.pop("node"), **p, **where)
    elif fault == "terminate":
        world.terminate(p.pop("node"), **p, **where)
    elif fault == "slice-replace":
        world.replace_slice(p.pop("node"), **p, **where)
    elif fault == "kill-worker":
        world.kill_worker(p.pop("node"), p.pop("worker", 0), **where)
    elif fault == "hang":
        world.hang(p.pop("node"), p.pop("worker", None), **where)
    elif fault == "symptom":
        world.add_symptom(
            p.pop("node"),
            p.pop("type"),
            worker=p.pop("worker", 0),
            details=p.pop("details", ""),
            **where,
        )
    elif fault == "upcoming-maintenance":
        world.upcoming_maintenance(
            p.pop("node"),
            starts_in=p["starts_in"],
            window=p.get("window"),
            heal_after=p.get("heal_after"),
            kind=p.get("type", "SCHEDULED"),
            can_reschedule=p.get("can_reschedule", True),
            notice=p.get("notice", 0.0),
            notice_via=p.get("notice_via", "MAINTENANCE-EVENT"),
            **where,
        )
    elif fault in HOST_FAULTS:
        node, worker = p.pop("node"), p.pop("worker", 0)
        world.host_fault(node, fault, worker, p, **where)
    elif fault == "metadata-directories-fail":
        world.metadata_directories_fail(p.pop("node"), bool(p.get("fails", True)), **where)
    elif fault == "refuse-maintenance":
        code = str(p.get("code", "PERMISSION_DENIED"))
        world.refuse_maintenance(p.pop("node"), "" if code == "NONE" else code, **where)
    elif fault == "heal":
        world.heal(p.pop("node"), **where)
    elif fault == "delete-node":
        world.remove_node(p.pop("node"), **where)
    elif fault == "stockout":
        world.stockout(p.get("zone"), p.get("duration"), at_insert=bool(p.get("at_insert", False)))
    elif fault == "reservation-shortfall":
        world.reservation_shortfall(p.get("zone"), p.get("duration"))
    elif fault == "quota":
        world.quota(p.get("zone"), p.get("duration"), p.get("limit", ""))
    elif fault == "api-errors":
        world.api_errors(
            p["rate"],
            p.get("codes", ["UNAVAILABLE"]),
            methods=p.get("methods", []),
            duration=p.get("duration"),
        )
    elif fault == "os-login":
        world.os_login(str(p.get("user") or "tpuwatch_sim_example_com"))
    elif fault == "ssh":
        world.ssh_fault(p.pop("node"), p.pop("worker", 0), str(p.pop("mode", "HANG")).lower(), **where)
    elif fault == "keys-late":
        world.keys_late(p.pop("node"), float(p.pop("delay", 60.0)), **where)
    elif fault == "rotate-host-keys":
        world.rotate_host_keys(p.pop("node"), **where)
    elif fault == "wrong-host-key":
        world.wrong_host_key(p.pop("node"), p.pop("worker", 0), **where)
    elif fault == "slow-api":
        world.slow_calls(
            p["latency"],
            jitter=p.get("jitter", 0.5),
            methods=p.get("methods", []),
            duration=p.get("duration"),
        )
    elif fault == "lose-responses":
        world.lose_responses(
            p["rate"],
            p.get("codes", ["DEADLINE_EXCEEDED"]),
            methods=p.get("methods", []),
            duration=p.get("duration"),
        )
    elif fault == "permission-denied":
        world.deny(methods=p.get("methods", []), duration=p.get("duration"))
    elif fault == "clear-errors":
        world.clear_errors()
    elif fault == "create-queued-resource":
        count = int(p.get("node_count", 0))
        spec = NodeSpec(
            accelerator_type=p["accelerator_type"],
            runtime_version=p.get("runtime_version", "tpu-ubuntu2204-base"),
            spot=p.get("spot", False),
        )
        qr = world.queue_resource(
            p["name"], spec, node_count=count, node_prefix=p.get("node_prefix", ""), **where
        )
        return {"name": qr.full_name, "nodes": qr.node_ids, "state": qr.state}
    elif fault in COMPUTE_FAULTS:
        return _apply_compute(world, fault, p, where)
    elif fault == "create-node":
        spec = NodeSpec(
            accelerator_type=p["accelerator_type"],
            runtime_version=p.get("runtime_version", "tpu-ubuntu2204-base"),
            spot=p.get("spot", False),
            preemptible=p.get("preemptible", False),
            labels=p.get("labels", {}),
            metadata=p.get("metadata", {}),
        )
        rec = world.add_node(p["name"], spec, **where)
        return {"name": rec.full_name, "id": str(rec.id), "ips": rec.ips, "state": rec.state}
    else:  # pragma: no cover - get() guards this
        raise UsageError(f"unknown fault {fault!r}")
    return {"fault": fault, "ok": True}


COMPUTE_FAULTS = ("create-instance", "create-mig", "host-error", "instance-maintenance", "preempt-instance",
                  "mig-autoheal", "run-duration-end", "delete-instance")


def _apply_compute(world: World, fault: str, p: dict[str, Any], where: dict[str, Any]) -> Any:
    """Perform a normalized Compute Engine fault."""
    if fault == "create-instance":
        model = p.get("provisioning_model", "STANDARD")
        sched: dict[str, Any] = {"provisioningModel": model, "onHostMaintenance": "TERMINATE"}
        if model in ("SPOT", "FLEX_START"):
            sched["instanceTerminationAction"] = "STOP" if model == "SPOT" else "DELETE"
        body = {"labels": p.get("labels", {}), "scheduling": sched,
                "metadata": {"items": [{"key": k, "value": v} for k, v in p.get("metadata", {}).items()]},
                "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]}
        rec = world.add_instance(p["name"], p["machine_type"], body=body, **where)
        world.set_no_notice(rec.name, str(p.get("no_notice", "ERROR")).lower(), **where)
        return {"name": rec.path, "id": str(rec.id), "ip": rec.ip, "status": rec.status}
    if fault == "create-mig":
        numbering = str(p.get("worker_numbers", "NONE"))
        mig = world.add_mig(p["name"], p["machine_type"], int(p.get("size", 1)), topology=p.get("topology", ""),
                            spot=bool(p.get("spot", False)), labels=p.get("labels", {}),
                            metadata=p.get("metadata", {}), on_failure=str(p.get("on_failure", "REPAIR")),
                            worker_numbers="" if numbering == "NONE" else numbering.lower(), **where)
        return {"name": mig.path, "instances": sorted(mig.members), "topology": mig.topology}
    if fault == "host-error":
        world.host_error(p.pop("instance"), restart_after=p.get("restart_after"), **where)
    elif fault == "instance-maintenance":
        world.schedule_instance_maintenance(
            p.pop("instance"), starts_in=p["starts_in"], window=p.get("window"), heal_after=p.get("heal_after"),
            kind=p.get("type", "SCHEDULED"), can_reschedule=p.get("can_reschedule", True),
            notice=p.get("notice", 60.0), **where)
    elif fault == "preempt-instance":
        world.preempt_instance(p.pop("instance"), notice=p.get("notice"), term_first=p.get("term_first", 0.0),
                               stopping=p.get("stopping", 0.0), **where)
    elif fault == "mig-autoheal":
        world.autoheal(p.pop("mig"), p.get("instance", ""), reason=p.get("reason", ""), **where)
    elif fault == "run-duration-end":
        world.end_run_duration(p.pop("instance"), **where)
    elif fault == "delete-instance":
        world.remove_instance(p.pop("instance"), **where)
    return {"fault": fault, "ok": True}
