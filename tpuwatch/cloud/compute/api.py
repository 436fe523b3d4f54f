"""Compute Engine as the registry (cloud/apis.py) sees it: a slice is one instance or a MIG
(`[tpu] instance` or `mig`), inserted again from [tpu.compute_spec], its workers reached one
instance each by `gcloud compute ssh INSTANCE`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tpuwatch.cloud.base import (
    Doors,
    GcloudSsh,
    InitRequest,
    InitResult,
    LaunchParts,
    SliceReader,
    ZoneSharing,
)
from tpuwatch.cloud.clients import compute_available
from tpuwatch.cloud.compute import capture
from tpuwatch.cloud.compute.adapter import ComputeAdapter, Kind, Reads
from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle
from tpuwatch.cloud.compute.spec import check_insert
from tpuwatch.cloud.compute.zoneinstances import SharedCompute
from tpuwatch.config import Config, repair_compute_spec
from tpuwatch.errors import UsageError
from tpuwatch.model import OWNER_LABEL, PLACE_LABELS, NodeSnapshot
from tpuwatch.ports import NodeLifecycle


def compute_kind(cfg: Config) -> Kind:
    """What names a Compute Engine job's slice: an instance, or a MIG (config checks one is set)."""
    return "instance" if cfg.tpu["instance"] else "mig"


def job_adapter(cfg: Config, project: str, zone: str, *, reads: Reads | None = None) -> ComputeAdapter:
    """The adapter of the job's slice; `reads`: the zone's shared lists in a watcher of several
    jobs (direct reads without)."""
    return ComputeAdapter(project, zone, compute_kind(cfg), flex_start=float(cfg.tpu["flex_start"]), reads=reads)


def flex_size(cfg: Config) -> int:
    """The VMs each resize request of a flex-start MIG asks for: the MIG's size as `init` saw it
    running (config checks it is set when tpu.flex_start is)."""
    mig = (cfg.tpu.get("compute_spec") or {}).get("mig") or {}
    return int(mig.get("targetSize") or 0)


def job_lifecycle(cfg: Config, adapter: ComputeAdapter) -> ComputeLifecycle:
    """Delete and create of the job's instance or MIG through `adapter`."""
    return ComputeLifecycle(adapter, mig=cfg.tpu["mig"], size=flex_size(cfg))


class ComputeCloud:
    name: str = "compute"
    kinds: tuple[str, ...] = ("instance", "mig")
    gcloud_ssh: GcloudSsh = GcloudSsh(verb=("compute", "ssh"), by_instance=True)

    def describe(self, kind: str) -> str:
        return f"Compute Engine {'MIG' if kind == 'mig' else kind}"

    def reader(self, cfg: Config, project: str, zone: str, *, as_is: bool = False) -> SliceReader:
        if as_is:  # a MIG as it is, also with no VM (a flex-start MIG waiting for its resize request)
            return ComputeAdapter(project, zone, compute_kind(cfg))
        return job_adapter(cfg, project, zone)

    def guesses(self, project: str, zone: str) -> list[SliceReader]:
        if not compute_available():
            return []
        return [ComputeAdapter(project, zone, "instance"), ComputeAdapter(project, zone, "mig")]

    def shared(self) -> SharedCompute:
        return SharedCompute()

    def doors(self, cfg: Config, project: str, sharing: ZoneSharing | None) -> Doors:
        """Alone, a tick reads the slice with one get of the instance, or three requests for a
        MIG; with `sharing`, from the zone's instances (and MIG) lists shared by the watcher's
        jobs, plus listManagedInstances for a MIG (cloud/compute/zoneinstances.py)."""
        shared = sharing.lists if sharing is not None else None
        assert shared is None or isinstance(shared, SharedCompute)
        adapters: dict[str, ComputeAdapter] = {}

        def adapter(zone: str) -> ComputeAdapter:
            if zone not in adapters:
                reads = (shared.zone(project, zone).job(sharing.due, slack=sharing.slack)
                         if shared is not None and sharing is not None else None)
                adapters[zone] = job_adapter(cfg, project, zone, reads=reads)
            return adapters[zone]

        def lifecycle(zone: str) -> NodeLifecycle:
            return job_lifecycle(cfg, adapter(zone))

        def host_keys(node: NodeSnapshot) -> Mapping[int, tuple[str, ...]]:
            return adapter(node.zone).host_keys(node.name)

        def instances(node: NodeSnapshot) -> tuple[str, ...]:
            return adapter(node.zone).instance_names(node)

        return Doors(adapter, lifecycle, host_keys, instances)

    def lifecycle(self, cfg: Config, reader: SliceReader) -> NodeLifecycle:
        assert isinstance(reader, ComputeAdapter)
        return job_lifecycle(cfg, reader)

    def create_body(self, cfg: Config, zone: str, launch: LaunchParts) -> tuple[dict[str, Any], dict[str, Any]]:
        return insert_body(cfg, zone, launch), {}

    def request_json(self, cfg: Config, zone: str, project: str, launch: LaunchParts) -> dict[str, Any]:
        return insert_body(cfg, zone, launch)

    def checks_body_before_delete(self, cfg: Config) -> bool:
        return bool(cfg.tpu["instance"])  # a MIG is recreated in place: nothing is inserted

    def gone_workers(self, cfg: Config) -> Mapping[str, tuple[str, str]] | None:
        """A Compute Engine instance that is gone is still its own one worker: the log's entry on
        its preemption says whether Google deleted it."""
        name = str(cfg.tpu.get("instance") or "")
        return {name: (name, "0")} if name else None

    def init_config(self, request: InitRequest) -> InitResult | None:
        return capture.init_config(request)

    def label_hint(self, node: NodeSnapshot, zone: str, job: str) -> str:
        if node.kind == "instance":
            return f"add the label: `gcloud compute instances add-labels {node.name} --zone {zone} --labels {OWNER_LABEL}={job}`"
        return f"add the label {OWNER_LABEL}={job} to the MIG's instance template"  # its instances carry its labels


def insert_body(cfg: Config, zone: str, launch: LaunchParts) -> dict[str, Any]:
    """The insert body of the job's Compute Engine instance or MIG, from [tpu.compute_spec].

    An instance gets the ownership label and the launch's metadata (the startup script, the
    `tpuwatch-*` keys), as a TPU node's create does. A MIG is inserted as saved: its instances
    take their labels and metadata from its template. An older `init`'s bare machine and disk
    types become partial URLs in `zone` (the slice's); a body Compute Engine would refuse is
    UsageError (exit 2): this runs before anything is deleted."""
    kind = compute_kind(cfg)
    saved = (cfg.tpu.get("compute_spec") or {}).get(kind)
    if not saved:
        raise UsageError(f"tpu.compute_spec.{kind}: missing; run `tpuwatch init {cfg.tpu_name}` to capture the "
                         f"{kind} tpuwatch recreates it from")
    body: dict[str, Any] = copy.deepcopy(dict(saved))
    zone = zone or str(cfg.tpu["zone"])
    if kind == "mig":
        check_insert(kind, body, cfg.tpu_name, zone or "ZONE")  # before any delete
        return body
    if zone:  # tpu.zone unset at load: the zone was resolved since (flags, env, gcloud)
        repair_compute_spec(body, zone, cfg.tpu_name)
    # where the instance `init` read stood between jobs (model.PLACE_LABELS) is not where one made
    # again stands: a `tpuwatch-lent-by` kept would make its job take it for a loan
    labels = {k: v for k, v in dict(body.get("labels") or {}).items() if k not in PLACE_LABELS}
    body["labels"] = {**labels, OWNER_LABEL: cfg.job_name}
    meta = launch.metadata()
    script = launch.startup_script()
    if script is not None:
        meta["startup-script"] = script
    metadata = dict(body.get("metadata") or {})
    metadata.pop("fingerprint", None)
    kept = [item for item in metadata.get("items") or [] if item.get("key") not in meta]
    body["metadata"] = {**metadata, "items": kept + [{"key": k, "value": v} for k, v in meta.items()]}
    # what Compute Engine would refuse stops here, before any delete (UsageError, exit 2)
    check_insert(kind, body, cfg.tpu_name, zone or "ZONE")
    return body
