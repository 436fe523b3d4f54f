"""Compute Engine reads shared by the jobs of one watcher: one instances list per zone per poll
(and one MIG list, when a job there watches a MIG), not a get per job.

`tpuwatch watch` with several jobs gives every Compute Engine job of a project and zone the same
`ZoneInstances`, and each job's `ComputeAdapter` reads its slice through a `JobInstances`
(`compute.Reads`) with that job's `Due`, as the TPU API's jobs share one ListNodes
(cloud/tpu/zonenodes.py, whose `Listing` this uses):

- an instance: from the zone's newest instances list begun no earlier than `slack` seconds
  before the job's tick was due, else from a list this job makes (and jobs asking meanwhile
  wait for). instances.list returns whole `Instance` resources, the same as a get: status,
  scheduling, labels, metadata and `resourceStatus.upcomingMaintenance` are all in it. An
  instance the list does not hold is confirmed with a get, so a list that lags behind an
  insert never makes an instance look missing.
- a MIG: itself from the zone's MIG list (a MIG the list does not hold: a get, which finds a
  regional MIG; a job's MIG known regional is read from its region's MIG list instead), and its
  instances from the zone's instances list (one the list does not hold yet: its instances
  listed again by this job alone, filtered to their names, as a MIG's own read does). Its managed instances come from
  listManagedInstances, one request per MIG (Compute Engine lists managed instances, their
  current action and last attempt's errors, only per MIG), except while the MIG is at rest
  (`compute.at_rest`: stable, every instance of its target size doing nothing, and that many
  instances in the list made by it, all RUNNING): then nothing is under way for that request
  to name, and the zone's two lists are the whole read.

Everything else (listManagedInstances, the gets of what a list lacks, operations, inserts,
deletes, recreateInstances, guest attributes, the reads of an action that needs a fresh look)
goes through the job's own adapter. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tpuwatch.cloud.base import Due
from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.compute.view import at_rest, members
from tpuwatch.cloud.listing import Listing


class ZoneInstances:
    """The instances and MIGs of one project and zone, each listed once for every job that asks
    at about the same time."""

    def __init__(self, api: ComputeAdapter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api  # the zone's lists (each job's other requests go through its own adapter)
        self.clock = clock
        self.instances: Listing[dict[str, Any]] = Listing(lambda: {i.name: i for i in api.list_instances()},
                                                          clock=clock)
        self.migs: Listing[dict[str, Any]] = Listing(lambda: {m.name: m for m in api.list_migs()}, clock=clock)
        # the zone's region's MIGs, listed only for jobs whose MIG was found regional
        self.region_migs: Listing[dict[str, Any]] = Listing(lambda: {m.name: m for m in api.list_region_migs()},
                                                            clock=clock)
        self.gets = 0  # gets of an instance or MIG the zone's list did not hold
        self._lock = threading.Lock()

    def job(self, due: Due, *, slack: float) -> JobInstances:
        return JobInstances(self, due, slack=slack)

    def missed(self) -> None:
        with self._lock:
            self.gets += 1


class JobInstances:
    """`compute.Reads` of one job: its instance or MIG from the zone's shared lists."""

    def __init__(self, zone: ZoneInstances, due: Due, *, slack: float) -> None:
        self.zone = zone
        self.due = due
        self.slack = slack  # a list begun this long before the tick was due still answers it

    def _not_before(self) -> float:
        return self.due.not_before(self.slack, self.zone.clock)

    def instance(self, api: ComputeAdapter, name: str) -> Any | None:
        inst = self.zone.instances.get(self._not_before()).get(name)
        if inst is not None:
            return inst
        self.zone.missed()
        return api.get_instance(name)

    def listed(self, api: ComputeAdapter) -> list[Any]:
        return list(self.zone.instances.get(self._not_before()).values())

    def mig_parts(self, api: ComputeAdapter, name: str) -> tuple[Any, list[Any], list[Any]] | None:
        since = self._not_before()
        listing = self.zone.region_migs if api.mig_region(name) else self.zone.migs
        mig = listing.get(since).get(name)
        if mig is None:
            self.zone.missed()
            mig = api.get_mig(name)
            if mig is None:
                return None
        listed = self.zone.instances.get(since)
        managed = at_rest(mig, listed.values(), api.zone)
        if managed is None:
            managed = api.managed_instances(name)
        instances = members(managed, listed.values)
        if len(instances) < len({m.instance for m in managed if m.instance}):
            instances = api.member_instances(managed)  # made since the zone's list: look again, at them only
        return mig, managed, instances


class SharedCompute:
    """One lister adapter and one ZoneInstances per project and zone, for every Compute Engine
    job of one watcher."""

    def __init__(self, adapter: Callable[[str, str], ComputeAdapter] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make = adapter or (lambda project, zone: ComputeAdapter(project, zone, "instance"))
        self.clock = clock
        self._lock = threading.Lock()
        self._zones: dict[tuple[str, str], ZoneInstances] = {}

    def zone(self, project: str, zone: str) -> ZoneInstances:
        with self._lock:
            key = (project, zone)
            if key not in self._zones:
                self._zones[key] = ZoneInstances(self._make(project, zone), clock=self.clock)
            return self._zones[key]

    def counts(self) -> dict[str, int]:
        """Instance lists, MIG lists, and gets of what a list did not hold, so far, over every zone."""
        with self._lock:
            zones = list(self._zones.values())
        return {"instance_lists": sum(z.instances.count for z in zones),
                "mig_lists": sum(z.migs.count + z.region_migs.count for z in zones), "gets": sum(z.gets for z in zones)}
