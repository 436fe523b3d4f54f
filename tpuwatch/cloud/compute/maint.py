"""Start a Compute Engine slice's announced maintenance now (`instances.performMaintenance`).

The policy asks for it at a checkpoint when the slice's earliest notice may start early
(`canReschedule`, PENDING). Which instances are asked:

- an instance: itself.
- a MIG: first the instance whose window opens first. Google says that starting it on one VM
  of a TPU slice through the Instances API puts every VM of the slice into maintenance; it does
  not say so for a multi-host MIG in words of its own, so the MIG is read again and any
  instance still PENDING (a MIG of independent VMs, or a slice Google did not take as a whole)
  is asked too.

A refusal of the first call (every code of `cloud/errors.py` `MAINTENANCE_REFUSALS`, e.g. "no pending
maintenance", not offered for this machine type, a missing `compute.instances.performMaintenance`)
is `MaintenanceRefused`: the job falls back to the notice and the reactive path. A refusal of a
later one is noted in what is returned: the maintenance that was started stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.compute.view import short, upcoming
from tpuwatch.cloud.errors import MAINTENANCE_REFUSALS, ApiError
from tpuwatch.errors import MaintenanceRefused
from tpuwatch.model import NodeSnapshot
from tpuwatch.policy.maintenance import can_start_early


def due_instances(instances: Sequence[Any]) -> list[str]:
    """The instances whose announced maintenance may start now, the earliest window first."""
    due = []
    for inst in instances:
        um = upcoming(inst)
        if um is not None and can_start_early(um):
            due.append((um.window_start.timestamp() if um.window_start is not None else float("inf"), inst.name))
    return [name for _, name in sorted(due)]


def perform(api: ComputeAdapter, instance: str) -> str:
    """performMaintenance on one instance; MaintenanceRefused on a refusal."""
    try:
        return api.perform_maintenance(instance)
    except ApiError as exc:
        if exc.code not in MAINTENANCE_REFUSALS:
            raise
        raise MaintenanceRefused(f"instance {instance}: {exc.message}", code=exc.code) from exc


def _mig_due(api: ComputeAdapter, name: str) -> list[str]:
    parts = api.mig_parts(name)
    if parts is None:
        raise MaintenanceRefused(f"MIG {name} is gone", code="NOT_FOUND")
    return due_instances(parts[2])


def on_mig(node: NodeSnapshot) -> str:
    """The MIG a job's node runs on: a spare MIG in its place ([tpu] spares), read under the job's
    name, is named by its own URL (the one-slot view carries it), else the node itself."""
    return short(node.resource) if node.kind == "mig" and node.resource else node.name


def start_maintenance(api: ComputeAdapter, node: NodeSnapshot) -> tuple[str, str]:
    """Start the slice's announced maintenance now; (operation of the first call, what was asked)."""
    if api.kind == "instance":  # the instance it runs on: a spare in its place is its own ([tpu] spares)
        instance = (api.instance_names(node) or (node.name,))[0]
        return perform(api, instance), f"instance {instance}"
    mig = on_mig(node)  # a spare MIG in the slot's place is its own ([tpu] spares)
    due = _mig_due(api, mig)
    if not due:
        raise MaintenanceRefused(f"no instance of MIG {mig} has a maintenance that may start early now",
                                 code="FAILED_PRECONDITION")
    op = perform(api, due[0])
    started, refused = [due[0]], []
    for inst in _mig_due(api, mig):
        if inst in started:
            continue
        try:
            perform(api, inst)
            started.append(inst)
        except MaintenanceRefused as exc:
            refused.append(f"{inst} refused ({exc.code})")
    what = f"MIG {mig} (performMaintenance on {', '.join(started)}"
    return op, what + (f"; {', '.join(refused)})" if refused else ")")
