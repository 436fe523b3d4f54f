"""The simulated cloud's records: nodes, create requests, operations, queued resources,
maintenance notices and symptoms, the error an API call returns, and the fault windows.

Plain data, with no lock and no behaviour: the World (`world.py`) owns them and guards them with
its one lock; the gRPC and REST faces render them as Google's messages.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error the API returns: a google.rpc code name and the service's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class SymptomRec:
    type: str
    worker_id: str
    details: str
    time_ns: int


@dataclass
class UpcomingRec:
    type: str  # SCHEDULED / UNSCHEDULED
    status: str  # PENDING / ONGOING
    can_reschedule: bool
    window_start_ns: int
    window_end_ns: int
    latest_window_start_ns: int

    def notice(self) -> dict[str, object]:
        """The metadata server's `upcoming-maintenance` JSON (snake_case, times in whole seconds)."""
        return {
            "can_reschedule": self.can_reschedule,
            "latest_window_start_time": rfc3339_s(self.latest_window_start_ns),
            "maintenance_status": self.status,
            "type": self.type,
            "window_end_time": rfc3339_s(self.window_end_ns),
            "window_start_time": rfc3339_s(self.window_start_ns),
        }


@dataclass
class NodeSpec:
    """What a create request asked for (the fields the world acts on, plus the whole request)."""

    accelerator_type: str
    runtime_version: str = "tpu-ubuntu2204-base"
    spot: bool = False
    preemptible: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    description: str = ""
    spec_json: str = ""  # the request's Node as JSON: every other field is echoed back from it
    accelerator_config: tuple[str, str] | None = None  # (type name, topology) when given that way


@dataclass
class NodeRec:
    project: str
    zone: str
    name: str
    spec: NodeSpec
    id: int
    create_ns: int
    n_workers: int
    state: str = "CREATING"
    health: str = "HEALTH_UNSPECIFIED"
    health_description: str = ""
    ips: list[str] = field(default_factory=list)
    symptoms: list[SymptomRec] = field(default_factory=list)
    upcoming: UpcomingRec | None = None
    # What the workers' metadata servers say shortly before the host stops (the notice).
    maintenance_event: str = "NONE"
    preempt_notice: bool = False
    # Fault: the service refuses to start this node's maintenance by hand with this code ("" none).
    maintenance_refusal: str = ""
    # Fault: the workers' metadata servers fail every directory query (listing or ?recursive=true).
    metadata_dirs_fail: bool = False
    queued_resource: str = ""
    multislice_node: bool = False  # one of the nodes of a multislice queued resource
    api_version: str = "v2"
    epoch: int = 0  # bumped by every fault and lifecycle change; stale timers check it

    @property
    def key(self) -> str:
        return f"{self.project}/{self.zone}/{self.name}"

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.name}"


@dataclass
class OperationRec:
    name: str
    project: str
    zone: str
    verb: str  # create, delete, stop, start, simulateMaintenanceEvent, performMaintenance, ...
    target: str
    api_version: str
    create_ns: int
    end_ns: int = 0
    done: bool = False
    error: tuple[int, str] | None = None  # (google.rpc code, message)
    response_kind: str = "node"  # node, empty, queued_resource
    response: Any = None  # NodeRec / QueuedRec snapshot when done


@dataclass
class QueuedRec:
    project: str
    zone: str
    name: str
    node_id: str  # "" for a multislice request
    spec: NodeSpec
    spot: bool
    create_ns: int
    state: str = "CREATING"
    error: str = ""
    spec_json: str = ""
    epoch: int = 0
    api_version: str = "v2"
    node_count: int = 0  # multislice: how many nodes (> 1), named `<node_prefix>-<i>`
    node_prefix: str = ""
    # As the request asked: "spot", "guaranteed", "reserved" (v2alpha1 guaranteed.reserved),
    # "best_effort" (v2alpha1) or "" (on demand); and its reservationName.
    tier: str = ""
    reservation: str = ""

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.name}"

    @property
    def node_ids(self) -> list[str]:
        """The nodes this request provisions, as Google names them."""
        if self.node_count:
            return [f"{self.node_prefix}-{i}" for i in range(self.node_count)]
        return [self.node_id]


@dataclass
class Window:
    until: float  # monotonic; inf = until cleared
    data: dict[str, Any] = field(default_factory=dict)

    def active(self) -> bool:
        return time.monotonic() < self.until


def parse_node_name(name: str) -> tuple[str, str, str]:
    m = re.match(r"^projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)$", name)
    if not m:
        raise ApiError(
            "INVALID_ARGUMENT",
            f"Invalid resource name {name!r}; expected projects/P/locations/Z/nodes/N",
        )
    return m.group(1), m.group(2), m.group(3)


def rfc3339_ns(ns: int) -> str:
    """`2022-01-26T03:44:36.265703305Z`: nanosecond RFC 3339, as healthDescription shows it."""
    secs, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{nanos:09d}Z"


def rfc3339_s(ns: int) -> str:
    """`2024-11-15T04:00:00Z`: whole seconds, as maintenance notices show them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 1_000_000_000))
