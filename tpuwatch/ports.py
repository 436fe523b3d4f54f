"""The small protocols the tick talks to; real adapters (for the cloud, one per API a TPU is
made through: tpuwatch.cloud.apis picks them), plus fakes in tests and benchmarks.

Every outside system has one typed door here, so the tick needs no `Any`, `getattr` or `cast`
to use it. The policy never sees these: the tick calls them to observe and to act, and hands
the policy plain values from `tpuwatch.model`. `JobPorts` bundles one job's doors (real ones
from `tpuwatch.wiring`), `Flags` the command-line choices that widen what the policy may do.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, Protocol, runtime_checkable

from tpuwatch.model import (
    AuditEvent,
    Checkpoint,
    LaunchResult,
    Login,
    NodeSnapshot,
    OperationStatus,
    PrecheckReport,
    QueuedStatus,
    StopResult,
    WorkerProbe,
)

CheckContext = Literal["launch", "running"]


class TpuApi(Protocol):
    """Slices and operations of one project and zone, as the API that made them shows them: a
    Cloud TPU API node (tpuwatch.cloud.tpu), or a Compute Engine instance or MIG as one node
    (tpuwatch.cloud.compute)."""

    def get_node(self, name: str) -> NodeSnapshot | None:
        """The node, or None when it does not exist."""

    def list_nodes(self) -> list[NodeSnapshot]: ...

    def delete_node(self, name: str) -> str:
        """Start a delete; returns the operation name."""

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        """Start a create from a spec; returns the operation name."""

    def get_operation(self, name: str) -> OperationStatus: ...

    def worker_instances(self, node: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        """The node's worker VMs by Compute Engine instance name -> (node, worker id), for the
        audit log's upcoming-maintenance entries; read lazily, on the first lookup."""

    def take_notes(self) -> list[str]:
        """What the person watching should know about the nodes read, once (e.g. a MIG whose
        worker numbers tpuwatch cannot follow)."""


@runtime_checkable
class NodeLabels(Protocol):
    """A TpuApi that writes a node's labels (the TPU API's nodes.patch, updateMask=labels): job
    priorities hand nodes over by their ownership label (policy/priority.py)."""

    def set_labels(self, name: str, labels: Mapping[str, str]) -> str:
        """Start replacing the node's labels with `labels`; the operation name."""

    def read_node(self, name: str) -> NodeSnapshot | None:
        """The node as the API says it now (one get, never a shared listing), or None."""


@runtime_checkable
class ZoneListing(Protocol):
    """A TpuApi that lists the zone's nodes once per poll for every job of a watcher."""

    def listed(self) -> list[NodeSnapshot]:
        """The zone's nodes, from this poll's listing."""


class NodeLifecycle(Protocol):
    """Delete and create the job's node, as its API does it: plainly or through its queued
    resource (tpuwatch.cloud.tpu.lifecycle), or an instance's delete and insert, a MIG's recreate
    (tpuwatch.cloud.compute.lifecycle)."""

    # What the node is made through and waits in line by, in words ("queued resource pod-qr",
    # "a resize request of MIG slice"); "" for a node made plainly
    queue: str

    def get_node(self, name: str) -> NodeSnapshot | None:
        """The node `name` in the lifecycle's zone, or None."""

    def status(self) -> QueuedStatus | None:
        """The queued resource's state; None for a plain node."""

    def delete(self, node: NodeSnapshot | None) -> tuple[str, str]:
        """Start deleting (no node: its queued resource alone); (operation name, what is deleted).
        NotFoundError when nothing is left."""

    def delete_plan(self, node: NodeSnapshot | None) -> tuple[dict[str, Any] | None, bool]:
        """The request `delete(node)` would send, for people (`--dry-run`), None when nothing is
        left to delete; and whether that call makes the node again by itself (no create follows).
        JobFailed when this lifecycle must not delete it."""

    def clear_ended(self) -> str:
        """Delete a queued resource the service gave up on; what was done ("": nothing)."""

    def start_maintenance(self, node: NodeSnapshot) -> tuple[str, str]:
        """Start the node's announced maintenance now (v2alpha1; through its queued resource when
        it has one); (operation name, what). errors.MaintenanceRefused when the service refuses
        (not offered for this TPU type, or nothing pending)."""

    def create(self, name: str, node: Mapping[str, Any], zone: str, *, resumed: bool = False,
               tier: str = "", reservation: str = "") -> str:
        """Start a create; the operation name ("" when this job's own earlier create stands)."""

    def report_faulty_host(self, node: NodeSnapshot, worker: int, description: str) -> tuple[str, str]:
        """Report the host of the node's worker `worker` as faulty, for the cloud to repair it;
        (operation name, what was reported). errors.HostReportRefused when the cloud refuses (or
        has no such call)."""

    def faulty_host_request(self, node: NodeSnapshot, worker: int, description: str) -> str:
        """The request `report_faulty_host` would send, for people (`--dry-run`); "" when none."""

    def start_node(self, node: NodeSnapshot) -> tuple[str, str]:
        """Start the stopped node again; (operation name, what). A CloudError when the cloud
        refuses, or has no such call for it."""


class AuditLog(Protocol):
    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        """Events about `nodes` (and their worker VMs, `instances`: instance name -> (node, worker id), as the adapter's worker_instances gives it)
        after `cursor`, oldest first, and the new cursor (one query)."""

    def take_warnings(self) -> list[str]:
        """Warnings about the reader itself since the last call (e.g. a shared cache not usable)."""


class Workers(Protocol):
    """The job on the workers over SSH (tpuwatch.workers.sshworkers.SshWorkers)."""

    def probe(self, node: NodeSnapshot) -> Sequence[WorkerProbe]: ...

    def launch(self, node: NodeSnapshot, attempt: int, checkpoint: Checkpoint | None,
               clean: bool = False) -> Sequence[LaunchResult]: ...

    def stop(self, node: NodeSnapshot, workers: Sequence[int] | None = None, *,
             wait: bool = True) -> Sequence[StopResult]:
        """TERM the job, KILL it after stop_grace; `wait=False`: answer right after the TERM
        (what is still alive then is in `StopResult.stopping`, killed on the worker later)."""

    def login(self, node: NodeSnapshot) -> Login | None:
        """The user the watcher logs in as on this node incarnation, once known."""

    def remember(self, login: Login) -> None:
        """A login an earlier watcher learned (the journal keeps it)."""

    def take_notes(self) -> list[str]:
        """What the person watching should know, once (e.g. host keys trusted on first use)."""

    def port_target(self, node: NodeSnapshot) -> tuple[str, int] | None:
        """Worker 0's SSH address, when a TCP connect there tells whether its sshd is up; None when
        the transport reaches the workers by a path a TCP probe cannot follow (gcloud, IAP)."""

    def follow_ends(self, node: NodeSnapshot, attempt: int, workers: Sequence[int],
                    wake: Callable[[], None]) -> None:
        """Hold one cheap channel per worker of `workers` that calls `wake()` (from another
        thread) the moment `attempt` ends there; channels of another node or attempt are closed.
        A channel that drops is not an end: only the probe says what happened."""

    def unfollow(self) -> None:
        """Close those channels."""

    def close(self) -> None:
        """Close the channels and every shared connection (when the watcher exits)."""


class Prechecker(Protocol):
    """The environment checks of the workers (tpuwatch.workers.precheck.Prechecker); a job with
    precheck.enabled off has none (`JobPorts.precheck` is None)."""

    def run(self, node: NodeSnapshot, context: CheckContext = "launch", *,
            now: datetime | None = None) -> PrecheckReport: ...

    def probe_and_run(self, node: NodeSnapshot, context: CheckContext = "launch", *,
                      now: datetime | None = None) -> tuple[Sequence[WorkerProbe], PrecheckReport]:
        """The probe and the checks in one connection per worker."""


class CheckpointStore(Protocol):
    def latest(self) -> Checkpoint | None: ...


def utcnow() -> datetime:
    """The real wall clock, in UTC (`JobPorts.now`)."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Flags:
    """Command-line choices that widen what the policy may do."""

    adopt: bool = False  # treat the node as owned (it lacks the tpuwatch-job label)
    recreate_missing: bool = False  # recreate a node that vanished without tpuwatch deleting it
    dry_run: bool = False  # decide and print, change nothing
    # a person asked for a delete + create now (row `recreate_asked`): for the ticks until it is
    # under way, then no more (the caller drops it, or every tick would recreate again)
    recreate: bool = False


@dataclass
class JobPorts:
    """The adapters one job's ticks talk to; real ones in `tpuwatch.wiring`, fakes in tests and benchmarks."""

    tpu_for: Callable[[str], TpuApi]  # zone -> TPU API of that zone
    lifecycle_for: Callable[[str], NodeLifecycle]  # zone -> delete/create of the job's node there
    workers: Workers
    checkpoints: CheckpointStore | None
    # TCP probe of a down node's SSH port between ticks (loop.Pacer): workers.ssh.port_open; a
    # benchmark in virtual time answers from its simulated hosts
    port_open: Callable[[str, int, float], bool]
    audit: AuditLog | None = None
    now: Callable[[], datetime] = utcnow
    jitter: Callable[[], float] = random.random
    sleep: Callable[[float], None] = time.sleep  # between ticks (loop.Pacer)
    clock: Callable[[], float] = time.monotonic
    # between ticks while the workers are followed: until `event` is set (a worker's attempt
    # ended), `seconds` at most; True when it was set (a benchmark in virtual time runs its clock)
    wait_for: Callable[[threading.Event, float], bool] = threading.Event.wait
    # Environment checks before launches and while running; None: precheck.enabled is off
    precheck: Prechecker | None = None
