"""Managed instance groups of TPU VMs, their instance templates, workload policies and resize
requests, as the compute v1 API serves them.

- Instance templates (regional or global) and resource policies (a `workloadPolicy` of type
  HIGH_THROUGHPUT with an `acceleratorTopology`) are kept as given and read back.
- A MIG makes `targetSize` instances named `<baseInstanceName>-<4 chars>` from its template. With
  a workload policy naming a topology it is a multi-host slice: made all or nothing (in a
  stockout no instance is made; each managed instance stays CREATING with ZONE_RESOURCE_POOL_EXHAUSTED
  in `lastAttempt.errors`, and the MIG tries again), and repaired as a whole.
- `recreateInstances` and autoheal (`mig-autoheal`) recreate instances under the same names with
  new ids (`currentAction` RECREATING; a multi-host slice all of it), writing
  `compute.instances.repair.recreateInstance` for an autoheal. recreateInstances "flags" the
  instances (Google: the operation is DONE once the flag is set): one the MIG is already making
  (CREATING, RECREATING) keeps that action, never started over. An instance deleted behind the
  MIG's back is made again (CREATING), as a MIG keeps its target size.
- Failure repair (`instanceLifecyclePolicy.defaultActionOnFailure`, REPAIR by default): a MIG that
  repairs recreates a preempted Spot VM by itself delays["mig_repair"] after its preemption (same
  name, new id; a multi-host slice as a whole; `repair.recreateInstance` for each), as Google's
  TPU failure-recovery page says; DO_NOTHING leaves it TERMINATED.
- Shape `worker_numbers` (add_mig, create-mig; off by default, since Google does not document
  it): each instance made carries the metadata item `agent-worker-number`, its place among the
  MIG's members in name order ("name") or reverse name order ("reverse"), in the REST
  instance's `metadata.items` and so on its metadata server under `instance/attributes/`.
- Resize requests (flex-start): CREATING, ACCEPTED (waiting for capacity, the stockout in
  `status.lastAttempt`), SUCCEEDED once every VM runs, or FAILED (`status.error`) when capacity
  did not come within delays["resize_timeout"]; VMs of a `requestedRunDuration` are deleted when
  it ends, and the target size goes down with them.
"""

from __future__ import annotations

import copy
import functools
import string
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.sim.cefaults import REPAIR_RECREATE, ComputeFaults
from tpuwatch.sim.cerecords import (
    NAME,
    ComputeOpRec,
    InstanceRec,
    ManagedRec,
    MigRec,
    PolicyRec,
    ResizeRec,
    TemplateRec,
    chips_of,
    topology_chips,
)
from tpuwatch.sim.instances import STOCKOUT_CODE, ComputeError, not_found
from tpuwatch.sim.metadata import WORKER_NUMBER
from tpuwatch.sim.shapes import region_of

# The shape `worker_numbers`: none, the members numbered in name order, or in reverse name order
WORKER_NUMBERINGS = ("", "name", "reverse")
# A managed instance's current actions while the MIG makes it (again)
MAKING = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING"})
# instanceLifecyclePolicy.defaultActionOnFailure values (compute v1)
ON_FAILURE = ("REPAIR", "DO_NOTHING")


def _scope(zone: str) -> str:
    """The scope of a MIG method's `zone`: a zone's (`zones/Z`), or a regional MIG's when it is
    given as `regions/R` (every MIG method takes either)."""
    return zone if zone.startswith("regions/") else f"zones/{zone}"


def _path_tail(url: str, marker: str) -> str:
    """`projects/...` from a full or partial resource URL (from the first `marker`)."""
    i = url.find(marker)
    return url[i:] if i >= 0 else url


class Migs(ComputeFaults):
    """Instance templates, resource policies, MIGs and resize requests."""

    # ---- templates and policies --------------------------------------------------------------

    def insert_template(self, project: str, region: str, body: Mapping[str, Any]) -> ComputeOpRec:
        """instanceTemplates.insert (region "" = global); done at once."""
        name = str(body.get("name") or "")
        if not NAME.match(name):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'.", "invalid")
        props = dict(body.get("properties") or {})
        try:
            chips_of(str(props.get("machineType") or ""))
        except ValueError as exc:
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.properties.machineType': {exc}",
                               "invalid")
        with self._lock:
            rec = TemplateRec(project, region, name, self._new_id(), time.time_ns(), props)
            if rec.path in self._templates:
                raise ComputeError("ALREADY_EXISTS", f"The resource '{rec.path}' already exists", "alreadyExists")
            self._templates[rec.path] = rec
            scope = f"regions/{region}" if region else "global"
            return copy.deepcopy(self._new_cop(project, scope, "insert", rec.path, rec.id, done=True))

    def get_template(self, project: str, region: str, name: str) -> TemplateRec:
        where = f"regions/{region}" if region else "global"
        with self._lock:
            rec = self._templates.get(f"projects/{project}/{where}/instanceTemplates/{name}")
            if rec is None:
                raise not_found(f"projects/{project}/{where}/instanceTemplates/{name}")
            return copy.deepcopy(rec)

    def list_templates(self, project: str, region: str) -> list[TemplateRec]:
        with self._lock:
            return [copy.deepcopy(t) for _, t in sorted(self._templates.items())
                    if t.project == project and t.region == region]

    def insert_resource_policy(self, project: str, region: str, body: Mapping[str, Any]) -> ComputeOpRec:
        name = str(body.get("name") or "")
        if not NAME.match(name):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'.", "invalid")
        workload = body.get("workloadPolicy") or {}
        if workload.get("acceleratorTopology"):
            try:
                topology_chips(str(workload["acceleratorTopology"]))
            except ValueError as exc:
                raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field "
                                   f"'resource.workloadPolicy.acceleratorTopology': {exc}", "invalid")
        with self._lock:
            rec = PolicyRec(project, region, name, self._new_id(), time.time_ns(), dict(body))
            if rec.path in self._policies:
                raise ComputeError("ALREADY_EXISTS", f"The resource '{rec.path}' already exists", "alreadyExists")
            self._policies[rec.path] = rec
            return copy.deepcopy(self._new_cop(project, f"regions/{region}", "insert", rec.path, rec.id, done=True))

    def get_resource_policy(self, project: str, region: str, name: str) -> PolicyRec:
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        with self._lock:
            rec = self._policies.get(path)
            if rec is None:
                raise not_found(path)
            return copy.deepcopy(rec)

    # ---- MIGs --------------------------------------------------------------------------------

    def _require_mig(self, project: str, zone: str, name: str) -> MigRec:
        """The MIG `name` of a zone, or of a region with `zone` = `regions/R` (lock held)."""
        if zone.startswith("regions/"):
            self.check_compute_region(project, zone[len("regions/"):])
        else:
            self.check_compute_zone(project, zone)
        mig = self._migs.get(f"{project}/{zone}/instanceGroupManagers/{name}")
        if mig is None:
            raise not_found(f"projects/{project}/{_scope(zone)}/instanceGroupManagers/{name}")
        return mig

    def check_compute_region(self, project: str, region: str) -> None:
        """A region of the simulator's zones, else INVALID_ARGUMENT as Compute Engine answers."""
        if region not in {region_of(z) for z in (self.zone, *(self.zones or ()))}:
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'region': '{region}'. Unknown region.",
                               "invalid")

    def _regional_zone(self, project: str, region: str, body: Mapping[str, Any]) -> str:
        """The one zone a regional MIG makes its instances in: its distributionPolicy's first zone,
        else the simulator's first zone of the region (a TPU slice's VMs are in one zone)."""
        self.check_compute_region(project, region)
        zones = [str(z.get("zone") or "").rsplit("/", 1)[-1]
                 for z in (body.get("distributionPolicy") or {}).get("zones") or []]
        ours = [z for z in (self.zone, *(self.zones or ())) if region_of(z) == region]
        zone = zones[0] if zones else ours[0]
        if zone not in ours:
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.distributionPolicy.zones': "
                               f"'{zone}' is not a zone of region {region}.", "invalid")
        return zone

    def insert_mig(self, project: str, zone: str, body: Mapping[str, Any], *, worker_numbers: str = "") -> ComputeOpRec:
        """instanceGroupManagers.insert: the MIG now, its instances as they are made
        (`worker_numbers`: the shape, see the module's docstring)."""
        name = str(body.get("name") or "")
        if not NAME.match(name):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'.", "invalid")
        size = int(body.get("targetSize") or 0)
        with self._lock:
            scope, region = _scope(zone), ""
            if zone.startswith("regions/"):  # a regional MIG: its instances in one zone of the region
                region = zone[len("regions/"):]
                zone = self._regional_zone(project, region, body)
            self.check_compute_zone(project, zone)
            template = self._templates.get(_path_tail(str(body.get("instanceTemplate") or ""), "projects/"))
            if template is None:
                raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.instanceTemplate': "
                                   f"'{body.get('instanceTemplate')}'. The instance template was not found.", "invalid")
            if template.region and template.region != region_of(zone):
                raise ComputeError("INVALID_ARGUMENT", f"Instance template '{template.name}' is in region "
                                   f"{template.region}, not the MIG's region {region_of(zone)}.", "invalid")
            policy_url = str((body.get("resourcePolicies") or {}).get("workloadPolicy") or "")
            topology = ""
            if policy_url:
                policy = self._policies.get(_path_tail(policy_url, "projects/"))
                if policy is None:
                    raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.resourcePolicies."
                                       f"workloadPolicy': '{policy_url}'. The resource policy was not found.", "invalid")
                topology, policy_url = policy.topology, policy.path
            if topology and size:
                per_vm = chips_of(str(template.properties.get("machineType")))
                if topology_chips(topology) != per_vm * size:
                    raise ComputeError(
                        "INVALID_ARGUMENT",
                        f"Topology {topology} needs {topology_chips(topology) // per_vm} VMs of "
                        f"{template.properties.get('machineType')}; targetSize is {size}.", "invalid")
            lifecycle = body.get("instanceLifecyclePolicy") or {}
            if str(lifecycle.get("defaultActionOnFailure") or "REPAIR") not in ON_FAILURE:
                raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.instanceLifecyclePolicy."
                                   f"defaultActionOnFailure': '{lifecycle.get('defaultActionOnFailure')}'.", "invalid")
            mig = MigRec(project, zone, name, self._new_id(), time.time_ns(),
                         str(body.get("baseInstanceName") or name), template.path, size,
                         workload_policy=policy_url, topology=topology,
                         default_action_on_failure=str(lifecycle.get("defaultActionOnFailure") or "REPAIR"),
                         description=str(body.get("description") or ""), worker_numbers=worker_numbers,
                         region=region)
            if mig.key in self._migs:
                raise ComputeError("ALREADY_EXISTS", f"The resource '{mig.path}' already exists", "alreadyExists")
            self._migs[mig.key] = mig
            op = self._new_cop(project, scope, "insert", mig.path, mig.id, done=True)
            self._grow(mig, size)
            return copy.deepcopy(op)

    def _new_member_name(self, mig: MigRec) -> str:
        taken = {k.rsplit("/", 1)[-1] for k in self._instances} | set(mig.members)
        alphabet = string.ascii_lowercase + string.digits
        while True:
            name = f"{mig.base_instance_name}-" + "".join(self._rng.choice(alphabet) for _ in range(4))
            if name not in taken:
                return name

    def _grow(self, mig: MigRec, count: int, *, run_duration: float | None = None) -> list[str]:
        """Add `count` managed instances (CREATING) and start making them. Lock held."""
        names = [self._new_member_name(mig) for _ in range(count)]
        for n in names:
            mig.members[n] = ManagedRec(n, "CREATING")
        self._make_members(mig.key, names, mig.epoch, run_duration)
        return names

    def _make_members(self, mig_key: str, names: list[str], epoch: int, run_duration: float | None) -> None:
        """Create these members' instances, all or none: in a stockout none is made, each carries
        the error in lastAttempt, and the MIG tries again later. Lock held."""
        mig = self._migs.get(mig_key)
        if mig is None or mig.epoch != epoch:
            return
        names = [n for n in names if n in mig.members]
        if not names:
            return
        if self._in_stockout(mig.zone):
            for n in names:
                mig.members[n].errors = [(STOCKOUT_CODE, self.zone_exhausted_text(mig.project, mig.zone))]
            self._touch()
            self.after(self.delays["create_failed"],
                       lambda: self._locked(lambda: self._make_members(mig_key, names, epoch, run_duration)))
            return
        template = self._templates.get(mig.template)
        props: dict[str, Any] = copy.deepcopy(template.properties) if template is not None else {}
        items = list((props.get("metadata") or {}).get("items") or [])
        number = self._project_number(mig.project)
        items.append({"key": "created-by", "value": f"projects/{number}/{mig.scope}/instanceGroupManagers/{mig.name}"})
        props["metadata"] = {"items": items}
        numbered = {n: i for i, n in enumerate(sorted(mig.members, reverse=mig.worker_numbers == "reverse"))}
        if run_duration is not None:
            sched = dict(props.get("scheduling") or {})
            sched.update({"maxRunDuration": {"seconds": str(int(run_duration))}, "instanceTerminationAction": "DELETE",
                          "provisioningModel": "FLEX_START"})
            props["scheduling"] = sched
        for n in names:
            body = {**props, "name": n, "machineType": f"zones/{mig.zone}/machineTypes/"
                    f"{str(props.get('machineType', '')).rsplit('/', 1)[-1]}"}
            if mig.worker_numbers:
                body["metadata"] = {"items": [*items, {"key": WORKER_NUMBER, "value": str(numbered[n])}]}
            rec = self.instance_from_body(mig.project, mig.zone, body)
            rec.mig = mig.key
            self._store_new(rec)
            self._provision(rec)
        self._touch()

    def _locked(self, fn: Callable[[], None]) -> None:
        with self._lock:
            fn()

    @staticmethod
    def _project_number(project: str) -> str:
        from tpuwatch.sim.metadata import project_number

        return project_number(project)

    def _instance_up(self, rec: InstanceRec) -> None:
        mig = self._migs.get(rec.mig)
        if mig is not None and rec.name in mig.members:
            m = mig.members[rec.name]
            m.current_action, m.errors = "NONE", []
            self._advance_resizes(mig)
            self._touch()  # a wait for the MIG stable sees it now
        super()._instance_up(rec)

    def _instance_gone(self, rec: InstanceRec) -> None:
        """A MIG makes again an instance that went away while it should exist (deleted by hand,
        or preempted with DELETE), and drops one it was deleting."""
        mig = self._migs.get(rec.mig)
        if mig is not None and rec.name in mig.members:
            m = mig.members[rec.name]
            if m.current_action == "DELETING":
                del mig.members[rec.name]
                self._touch()  # a wait for the MIG emptied sees it now
            elif m.current_action != "RECREATING":
                m.current_action = "CREATING"
                self._make_members(mig.key, [rec.name], mig.epoch, None)
        super()._instance_gone(rec)

    def get_mig(self, project: str, zone: str, name: str) -> MigRec:
        with self._lock:
            return copy.deepcopy(self._require_mig(project, zone, name))

    def list_migs(self, project: str, zone: str | None = None) -> list[MigRec]:
        """The zonal MIGs of a zone (every MIG of the project, regional ones too, when None)."""
        with self._lock:
            return [copy.deepcopy(m) for _, m in sorted(self._migs.items())
                    if m.project == project and (zone is None or (m.zone == zone and not m.region))]

    def list_region_migs(self, project: str, region: str) -> list[MigRec]:
        with self._lock:
            self.check_compute_region(project, region)
            return [copy.deepcopy(m) for _, m in sorted(self._migs.items())
                    if m.project == project and m.region == region]

    def mig(self, name: str, *, project: str | None = None, zone: str | None = None,
            region: str = "") -> MigRec:
        """A snapshot of one MIG (tests); `region`: a regional MIG's."""
        where = f"regions/{region}" if region else zone or self.zone
        with self._lock:
            mig = self._migs.get(f"{project or self.project}/{where}/instanceGroupManagers/{name}")
            if mig is None:
                raise UsageError(f"no simulated MIG {name!r}")
            return copy.deepcopy(mig)

    def mig_is_stable(self, mig: MigRec) -> bool:
        """status.isStable: every managed instance made, running and with no action under way."""
        with self._lock:
            for n, m in mig.members.items():
                rec = self._instances.get(self._ikey(mig.project, mig.zone, n))
                if m.current_action != "NONE" or rec is None or rec.status != "RUNNING":
                    return False
            return len(mig.members) == mig.target_size

    def managed_instances(self, project: str, zone: str, name: str) -> list[tuple[ManagedRec, InstanceRec | None]]:
        """listManagedInstances: each managed instance and its instance (None while not made)."""
        with self._lock:
            mig = self._require_mig(project, zone, name)
            return [(copy.deepcopy(m), copy.deepcopy(self._instances.get(self._ikey(project, mig.zone, n))))
                    for n, m in sorted(mig.members.items())]

    def wait_mig_stable(self, name: str, *, timeout: float = 20.0, project: str | None = None,
                        zone: str | None = None, region: str = "") -> MigRec:
        where = f"regions/{region}" if region else zone or self.zone
        key = f"{project or self.project}/{where}/instanceGroupManagers/{name}"

        def ok(w: Migs) -> bool:
            mig = w._migs.get(key)
            return mig is not None and w.mig_is_stable(mig)

        self.wait_for(ok, timeout, f"MIG {name} stable")
        return self.mig(name, project=project, zone=zone, region=region)

    def delete_mig(self, project: str, zone: str, name: str) -> ComputeOpRec:
        """instanceGroupManagers.delete: its instances are deleted, then the MIG."""
        with self._lock:
            mig = self._require_mig(project, zone, name)
            mig.epoch += 1
            op = self._new_cop(project, _scope(zone), "delete", mig.path, mig.id)
            for m in mig.members.values():
                m.current_action = "DELETING"
            doomed = [r for r in (self._instances.get(self._ikey(project, mig.zone, n)) for n in mig.members) if r]
            for r in doomed:
                r.status, r.epoch = "STOPPING", r.epoch + 1
            victims = [(r.key, r.id) for r in doomed]
            key, ident = mig.key, mig.id

        def finish() -> None:
            for k, i in victims:
                self._finish_delete_instance(k, i)
            with self._lock:
                m = self._migs.get(key)
                if m is not None and m.id == ident:
                    del self._migs[key]
                self._end_cop(op.key)

        self.after(self.delays["delete"], finish)
        return copy.deepcopy(op)

    def resize_mig(self, project: str, zone: str, name: str, size: int) -> ComputeOpRec:
        """instanceGroupManagers.resize: more instances made, or the newest ones deleted."""
        if size < 0:
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'size': must be 0 or more.", "invalid")
        with self._lock:
            mig = self._require_mig(project, zone, name)
            if mig.multi_host and size not in (0, mig.target_size):
                raise ComputeError("INVALID_ARGUMENT", f"MIG '{name}' is a multi-host TPU slice of topology "
                                   f"{mig.topology}; its size cannot change.", "badRequest")
            op = self._new_cop(project, _scope(zone), "resize", mig.path, mig.id, done=True)
            extra = size - len(mig.members)
            mig.target_size = size
            if extra > 0:
                self._grow(mig, extra)
            for n in sorted(mig.members)[size:] if extra < 0 else []:
                self._delete_member(mig, n)
            return copy.deepcopy(op)

    def _delete_member(self, mig: MigRec, name: str) -> None:
        """Delete one managed instance for good (lock held)."""
        mig.members[name].current_action = "DELETING"
        rec = self._instances.get(self._ikey(mig.project, mig.zone, name))
        if rec is None:
            del mig.members[name]
            return
        rec.status, rec.epoch = "STOPPING", rec.epoch + 1
        key, ident = rec.key, rec.id
        self.after(self.delays["delete"], lambda: self._finish_delete_instance(key, ident))

    def recreate_instances(self, project: str, zone: str, name: str, urls: list[str],
                           *, reason: str = "") -> ComputeOpRec:
        """recreateInstances: each named instance (on a multi-host slice, the whole slice) is
        deleted and made again under its name with a new id; with `reason` (autoheal) a
        repair.recreateInstance entry is written for each."""
        with self._lock:
            mig = self._require_mig(project, zone, name)
            names = [u.rsplit("/", 1)[-1] for u in urls]
            unknown = [n for n in names if n not in mig.members]
            if unknown or not names:
                raise ComputeError("INVALID_ARGUMENT", f"Instance '{(unknown or [''])[0]}' is not a member of "
                                   f"MIG '{name}'.", "invalid")
            if mig.multi_host:
                names = sorted(mig.members)
            op = self._new_cop(project, _scope(zone), "recreateInstances", mig.path, mig.id, done=True)
            for n in names:
                if mig.members[n].current_action not in MAKING:  # flagged already: left to its action
                    self._recreate_member(mig, n, reason)
            return copy.deepcopy(op)

    def _recreate_member(self, mig: MigRec, name: str, reason: str) -> None:
        m = mig.members[name]
        m.current_action = "RECREATING"
        rec = self._instances.get(self._ikey(mig.project, mig.zone, name))
        if reason and rec is not None:
            self._system_event(rec, REPAIR_RECREATE,
                               f"Instance Group Manager '{mig.path}' initiated recreateInstance on instance "
                               f"'{rec.path}'. Reason: {reason}", prefix="repair")
        if rec is None:
            self._make_members(mig.key, [name], mig.epoch, None)
            return
        rec.status, rec.epoch = "STOPPING", rec.epoch + 1
        key, ident, mig_key, epoch = rec.key, rec.id, mig.key, mig.epoch

        def remake() -> None:
            self._finish_delete_instance(key, ident)
            with self._lock:
                self._make_members(mig_key, [name], epoch, None)

        self.after(self.delays["delete"], remake)

    def _preempt_now(self, key: str, ident: int, stopping: float = 0.0) -> None:
        """A preempted Spot VM of a MIG that repairs is recreated by the MIG (the module's docstring)."""
        super()._preempt_now(key, ident, stopping)
        with self._lock:
            rec = self._instances.get(key)
            mig = self._migs.get(rec.mig) if rec is not None else None
            if (rec is None or rec.id != ident or not rec.preempted or mig is None or rec.name not in mig.members
                    or mig.default_action_on_failure != "REPAIR"):
                return
            epoch = rec.epoch
        self.after(self.delays["mig_repair"], functools.partial(self._repair_failed, key, ident, epoch))

    def _repair_failed(self, key: str, ident: int, epoch: int) -> None:
        with self._lock:
            rec = self._instances.get(key)
            mig = self._migs.get(rec.mig) if rec is not None else None
            if (rec is None or rec.id != ident or rec.epoch != epoch or rec.status != "TERMINATED" or mig is None
                    or rec.name not in mig.members):
                return
            for n in sorted(mig.members) if mig.multi_host else [rec.name]:
                if mig.members[n].current_action not in MAKING:
                    self._recreate_member(mig, n, "instance was preempted")
            self._touch()

    def autoheal(self, mig_name: str, instance: str = "", *, reason: str = "instance's health check failed",
                 project: str | None = None, zone: str | None = None, region: str = "") -> None:
        """MIG autoheal: a single-host MIG recreates the instance under its name; a multi-host
        slice is recreated as a whole (every instance RECREATING, new ids)."""
        project, zone = project or self.project, f"regions/{region}" if region else zone or self.zone
        with self._lock:
            mig = self._migs.get(f"{project}/{zone}/instanceGroupManagers/{mig_name}")
            if mig is None:
                raise UsageError(f"no simulated MIG {mig_name!r} in {project}/{zone}")
            target = instance or next(iter(sorted(mig.members)), "")
            if target not in mig.members:
                raise UsageError(f"MIG {mig_name!r} has no instance {target!r} (it has {', '.join(sorted(mig.members))})")
        self.recreate_instances(project, zone, mig_name, [target], reason=reason)

    # ---- resize requests ---------------------------------------------------------------------

    def insert_resize_request(self, project: str, zone: str, mig_name: str, body: Mapping[str, Any]) -> ComputeOpRec:
        name = str(body.get("name") or "")
        if not NAME.match(name):
            raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'.", "invalid")
        resize_by = int(body.get("resizeBy") or 0)
        if resize_by <= 0:
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.resizeBy': must be above 0.",
                               "invalid")
        run = body.get("requestedRunDuration") or {}
        seconds = float(run["seconds"]) if run.get("seconds") is not None else None
        if seconds is not None and not 600 <= seconds <= 7 * 86400:
            raise ComputeError("INVALID_ARGUMENT", "Invalid value for field 'resource.requestedRunDuration': "
                               "it must be between 10 minutes and 7 days.", "invalid")
        with self._lock:
            mig = self._require_mig(project, zone, mig_name)
            if mig.multi_host and resize_by * chips_of(self._mig_machine(mig)) != topology_chips(mig.topology):
                raise ComputeError("INVALID_ARGUMENT", f"resizeBy {resize_by} does not make a slice of topology "
                                   f"{mig.topology}.", "invalid")
            rr = ResizeRec(project, zone, mig_name, name, self._new_id(), time.time_ns(), resize_by, seconds,
                           description=str(body.get("description") or ""))
            if rr.key in self._resizes:
                raise ComputeError("ALREADY_EXISTS", f"The resource '{rr.path}' already exists", "alreadyExists")
            self._resizes[rr.key] = rr
            op = self._new_cop(project, _scope(zone), "insert", rr.path, rr.id, done=True)
            key, created = rr.key, rr.create_ns
        self.after(self.delays["queued_accept"], lambda: self._resize_step(key, created))
        return copy.deepcopy(op)

    def _mig_machine(self, mig: MigRec) -> str:
        template = self._templates.get(mig.template)
        return str((template.properties if template else {}).get("machineType") or "")

    def _resize_step(self, key: str, created: int) -> None:
        with self._lock:
            rr = self._resizes.get(key)
            mig = self._migs.get(f"{rr.project}/{rr.zone}/instanceGroupManagers/{rr.mig}") if rr else None
            if rr is None or rr.create_ns != created or rr.state not in ("CREATING", "ACCEPTED"):
                return
            if mig is None:
                rr.state, rr.error = "FAILED", [("RESOURCE_NOT_FOUND", "The managed instance group was deleted.")]
                self._touch()
                return
            rr.state = "ACCEPTED"
            if self._in_stockout(mig.zone):  # where the MIG makes its VMs (a regional MIG's one zone)
                rr.last_attempt = [(STOCKOUT_CODE, self.zone_exhausted_text(rr.project, mig.zone))]
                if time.time_ns() - rr.create_ns >= int(self.real(self.delays["resize_timeout"]) * 1e9):
                    rr.state, rr.error = "FAILED", list(rr.last_attempt)
                else:
                    self.after(self.delays["queued_accept"], lambda: self._resize_step(key, created))
                self._touch()
                return
            rr.last_attempt = []
            mig.target_size += rr.resize_by
            rr.instances = self._grow(mig, rr.resize_by, run_duration=rr.run_duration)
            self._touch()

    def _advance_resizes(self, mig: MigRec) -> None:
        """A resize request SUCCEEDS once every VM it made runs. Lock held."""
        for rr in self._resizes.values():
            where = f"regions/{mig.region}" if mig.region else mig.zone
            if rr.state != "ACCEPTED" or not rr.instances or rr.mig != mig.name or rr.zone != where:
                continue
            recs = [self._instances.get(self._ikey(mig.project, mig.zone, n)) for n in rr.instances]
            if all(r is not None and r.status == "RUNNING" for r in recs):
                rr.state = "SUCCEEDED"
                if rr.run_duration is not None:
                    self.after(rr.run_duration, functools.partial(self._locked, functools.partial(
                        self._end_resize_run, rr.key, rr.create_ns)))
                self._touch()

    def _end_resize_run(self, key: str, created: int) -> None:
        """A resize request's run duration ends: its VMs are deleted and the target size shrinks."""
        rr = self._resizes.get(key)
        mig = self._migs.get(f"{rr.project}/{rr.zone}/instanceGroupManagers/{rr.mig}") if rr else None
        if rr is None or rr.create_ns != created or mig is None:
            return
        for n in rr.instances:
            if n in mig.members:
                self._delete_member(mig, n)
        mig.target_size = max(0, mig.target_size - len(rr.instances))
        self._touch()

    def end_resize_run(self, mig_name: str, name: str = "", *, project: str | None = None,
                       zone: str | None = None, region: str = "") -> None:
        """A flex-start run duration ends now (its time came): Google deletes the VMs the
        SUCCEEDED request `name` (default: the MIG's newest such) made, and the target size shrinks."""
        project, zone = project or self.project, f"regions/{region}" if region else zone or self.zone
        with self._lock:
            self._require_mig(project, zone, mig_name)
            done = [r for _, r in sorted(self._resizes.items(), key=lambda kv: kv[1].create_ns)
                    if r.project == project and r.zone == zone and r.mig == mig_name and r.state == "SUCCEEDED"
                    and (not name or r.name == name)]
            if not done:
                raise UsageError(f"MIG {mig_name!r} has no SUCCEEDED resize request{' ' + repr(name) if name else ''}")
            self._end_resize_run(done[-1].key, done[-1].create_ns)

    def get_resize_request(self, project: str, zone: str, mig: str, name: str) -> ResizeRec:
        with self._lock:
            self._require_mig(project, zone, mig)
            rr = self._resizes.get(f"{project}/{zone}/{mig}/{name}")
            if rr is None:
                raise not_found(f"projects/{project}/{_scope(zone)}/instanceGroupManagers/{mig}/resizeRequests/{name}")
            return copy.deepcopy(rr)

    def list_resize_requests(self, project: str, zone: str, mig: str) -> list[ResizeRec]:
        with self._lock:
            self._require_mig(project, zone, mig)
            return [copy.deepcopy(r) for _, r in sorted(self._resizes.items())
                    if r.project == project and r.zone == zone and r.mig == mig]

    def delete_resize_request(self, project: str, zone: str, mig: str, name: str) -> ComputeOpRec:
        """Delete a resize request that has ended (SUCCEEDED, FAILED, CANCELLED); one in flight is
        refused (cancel it first), as the API documents."""
        with self._lock:
            rr = self._resizes.get(f"{project}/{zone}/{mig}/{name}")
            if rr is None:
                raise not_found(f"projects/{project}/{_scope(zone)}/instanceGroupManagers/{mig}/resizeRequests/{name}")
            if rr.state in ("CREATING", "ACCEPTED"):
                raise ComputeError("FAILED_PRECONDITION", f"Resize request '{name}' is {rr.state}; cancel it "
                                   "before deleting it.", "resourceNotReady")
            del self._resizes[rr.key]
            return copy.deepcopy(self._new_cop(project, _scope(zone), "delete", rr.path, rr.id, done=True))

    def cancel_resize_request(self, project: str, zone: str, mig: str, name: str) -> ComputeOpRec:
        with self._lock:
            rr = self._resizes.get(f"{project}/{zone}/{mig}/{name}")
            if rr is None:
                raise not_found(f"projects/{project}/{_scope(zone)}/instanceGroupManagers/{mig}/resizeRequests/{name}")
            if rr.state in ("CREATING", "ACCEPTED") and not rr.instances:
                rr.state = "CANCELLED"
            return copy.deepcopy(self._new_cop(project, _scope(zone), "cancel", rr.path, rr.id, done=True))

    # ---- for tests and scenarios -------------------------------------------------------------

    def add_mig(self, name: str, machine_type: str = "tpu7x-standard-4t", size: int = 1, *,
                topology: str = "", spot: bool = False, labels: Mapping[str, str] | None = None,
                metadata: Mapping[str, str] | None = None, project: str | None = None,
                zone: str | None = None, wait: bool = True, timeout: float = 60.0,
                worker_numbers: str = "", on_failure: str = "", region: str = "") -> MigRec:
        """A MIG of `size` TPU VMs from a new regional template `<name>-template` (with a
        workload policy `<name>-policy` when a topology is given), waited until stable (unless
        not `wait`: in a stockout it is not made). `worker_numbers` "name" or "reverse": its
        VMs carry `agent-worker-number` in that order (the module's docstring). `on_failure`:
        its `instanceLifecyclePolicy.defaultActionOnFailure` (absent: REPAIR, Google's default).
        `region`: a regional MIG of that region, its instances in `zone` (the world's)."""
        if worker_numbers not in WORKER_NUMBERINGS:
            raise UsageError(f"MIG {name!r}: worker_numbers must be one of "
                             f"{', '.join(repr(w) for w in WORKER_NUMBERINGS)}, got {worker_numbers!r}")
        if on_failure and on_failure not in ON_FAILURE:
            raise UsageError(f"MIG {name!r}: on_failure must be one of {', '.join(ON_FAILURE)}, got {on_failure!r}")
        project, zone = project or self.project, zone or self.zone
        home = region_of(zone)  # the template's and workload policy's region
        sched: dict[str, Any] = {"onHostMaintenance": "TERMINATE"}
        if spot:
            sched.update({"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"})
        props: dict[str, Any] = {
            "machineType": machine_type, "scheduling": sched, "labels": dict(labels or {}),
            "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
            "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
        }
        body: dict[str, Any] = {"name": name, "baseInstanceName": name, "targetSize": size,
                                "instanceTemplate": f"projects/{project}/regions/{home}/instanceTemplates/{name}-template"}
        if on_failure:
            body["instanceLifecyclePolicy"] = {"defaultActionOnFailure": on_failure}
        if region:
            if region != home:
                raise UsageError(f"MIG {name!r}: zone {zone} is not in region {region}")
            body["distributionPolicy"] = {"zones": [{"zone": f"zones/{zone}"}], "targetShape": "ANY_SINGLE_ZONE"}
        try:
            self.insert_template(project, home, {"name": f"{name}-template", "properties": props})
            if topology:
                self.insert_resource_policy(project, home, {"name": f"{name}-policy", "workloadPolicy": {
                    "type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}})
                body["resourcePolicies"] = {"workloadPolicy": f"projects/{project}/regions/{home}/resourcePolicies/{name}-policy"}
            self.insert_mig(project, f"regions/{region}" if region else zone, body, worker_numbers=worker_numbers)
        except ComputeError as exc:
            raise UsageError(f"MIG {name!r}: {exc.message}")
        if size and wait:
            return self.wait_mig_stable(name, timeout=timeout, project=project, zone=zone, region=region)
        return self.mig(name, project=project, zone=zone, region=region)
