"""Node reads shared by the jobs of one watcher: one ListNodes per zone per poll, not a get per job.

`tpuwatch watch` with several jobs gives every job of a project and zone the same `ZoneNodes`
(ports.TpuApi). A job's `get_node` is answered from the zone's newest listing when that listing
began no earlier than `slack` seconds before the job's tick was due (`JobNodes.due`, set by the
watcher before it waits for a free tick slot); otherwise that job lists the zone, and jobs that
ask while the list is on its way wait for it instead of listing too. Jobs whose steady ticks
fall on the same poll therefore share one list.

ListNodes returns whole `Node` messages (the reference's `nodes[]` is the same resource as a get,
and there is no partial view to ask for): state, health, healthDescription, symptoms and, on
v2alpha1, upcomingMaintenance are all in it. A node the listing does not hold is confirmed
with a get, so a listing that lags behind a create never makes a node look missing.

Everything else (operations, creates, deletes, guest attributes) goes straight to the zone's
one `TpuAdapter`, whose caches (worker instance names) the jobs share too. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tpuwatch.cloud.base import Due
from tpuwatch.cloud.listing import Listing
from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.model import NodeSnapshot, OperationStatus

T = TypeVar("T")


class ZoneNodes:
    """The nodes of one project and zone, listed once for every job that asks at about the same time."""

    def __init__(self, tpu: TpuAdapter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.tpu = tpu
        self.clock = clock
        self.gets = 0  # gets of nodes the listing did not hold
        self._lock = threading.Lock()
        self._listing: Listing[dict[str, NodeSnapshot]] = Listing(
            lambda: {n.name: n for n in self.tpu.list_nodes()}, clock=clock)

    @property
    def lists(self) -> int:
        """ListNodes rounds this reader made (each one request per page)."""
        return self._listing.count

    def nodes(self, not_before: float) -> dict[str, NodeSnapshot]:
        """The zone's nodes by short name, from a listing begun at `not_before` or later (or in flight)."""
        return self._listing.get(not_before)

    def get_node(self, name: str, not_before: float | None = None) -> NodeSnapshot | None:
        node = self.nodes(self.clock() if not_before is None else not_before).get(name)
        if node is not None:
            return node
        with self._lock:
            self.gets += 1
        return self.tpu.get_node(name)


class JobNodes:
    """ports.TpuApi of one job: its node from the zone's shared listing, the rest straight to the API."""

    def __init__(self, zone: ZoneNodes, due: Due, *, slack: float) -> None:
        self.zone = zone
        self.due = due
        self.slack = slack  # a listing begun this long before the tick was due still answers it

    def get_node(self, name: str) -> NodeSnapshot | None:
        return self.zone.get_node(name, not_before=self.due.not_before(self.slack, self.zone.clock))

    def list_nodes(self) -> list[NodeSnapshot]:
        return self.zone.tpu.list_nodes()

    def delete_node(self, name: str) -> str:
        return self.zone.tpu.delete_node(name)

    def set_labels(self, name: str, labels: Mapping[str, str]) -> str:
        return self.zone.tpu.set_labels(name, labels)

    def read_node(self, name: str) -> NodeSnapshot | None:
        return self.zone.tpu.get_node(name)

    def listed(self) -> list[NodeSnapshot]:
        return list(self.zone.nodes(self.due.not_before(self.slack, self.zone.clock)).values())

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        return self.zone.tpu.create_node(name, node, zone)

    def get_operation(self, name: str) -> OperationStatus:
        return self.zone.tpu.get_operation(name)

    def worker_instances(self, node: NodeSnapshot) -> Mapping[str, tuple[str, str]]:
        return self.zone.tpu.worker_instances(node)

    def take_notes(self) -> list[str]:
        return self.zone.tpu.take_notes()


class SharedTpu:
    """One TpuAdapter and one ZoneNodes per project and zone, for every job of one watcher."""

    def __init__(self, adapter: Callable[[str, str], TpuAdapter] = TpuAdapter) -> None:
        self._make = adapter
        self._lock = threading.Lock()
        self._zones: dict[tuple[str, str], ZoneNodes] = {}

    def zone(self, project: str, zone: str) -> ZoneNodes:
        with self._lock:
            key = (project, zone)
            if key not in self._zones:
                self._zones[key] = ZoneNodes(self._make(project, zone))
            return self._zones[key]

    def adapter(self, project: str, zone: str) -> TpuAdapter:
        return self.zone(project, zone).tpu

    def counts(self) -> dict[str, int]:
        """Lists and gets of unlisted nodes so far, over every zone."""
        with self._lock:
            zones = list(self._zones.values())
        return {"lists": sum(z.lists for z in zones), "gets": sum(z.gets for z in zones)}
