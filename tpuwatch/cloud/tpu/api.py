"""The Cloud TPU API as the registry (cloud/apis.py) sees it: nodes, made plainly or through a
queued resource, reached by `gcloud compute tpus tpu-vm ssh NODE --worker=W`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuwatch import spec as specmod
from tpuwatch import zonespec
from tpuwatch.cloud.base import (
    Doors,
    GcloudSsh,
    InitRequest,
    InitResult,
    LaunchParts,
    SliceReader,
    ZoneSharing,
)
from tpuwatch.cloud.tpu import capture
from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.cloud.tpu.lifecycle import Lifecycle, queued_id, queued_request
from tpuwatch.cloud.tpu.zonenodes import JobNodes, SharedTpu
from tpuwatch.config import Config
from tpuwatch.errors import ConfigError
from tpuwatch.model import OWNER_LABEL, NodeSnapshot
from tpuwatch.ports import NodeLifecycle, TpuApi


class TpuCloud:
    name: str = "tpu"
    kinds: tuple[str, ...] = ("node",)
    gcloud_ssh: GcloudSsh = GcloudSsh(verb=("compute", "tpus", "tpu-vm", "ssh"), by_instance=False)

    def describe(self, kind: str) -> str:
        return "TPU node (Cloud TPU API)"

    def reader(self, cfg: Config, project: str, zone: str, *, as_is: bool = False) -> SliceReader:
        return TpuAdapter(project, zone)

    def guesses(self, project: str, zone: str) -> list[SliceReader]:
        return [TpuAdapter(project, zone)]

    def shared(self) -> SharedTpu:
        return SharedTpu()

    def doors(self, cfg: Config, project: str, sharing: ZoneSharing | None) -> Doors:
        """Alone, a tick reads its node with one get; with `sharing`, from the zone's node list
        shared by the watcher's jobs (cloud/tpu/zonenodes.py)."""
        shared = sharing.lists if sharing is not None else None
        assert shared is None or isinstance(shared, SharedTpu)
        adapters: dict[str, TpuAdapter] = {}
        views: dict[str, JobNodes] = {}

        def adapter_for(zone: str) -> TpuAdapter:
            if shared is not None:
                return shared.adapter(project, zone)
            if zone not in adapters:
                adapters[zone] = TpuAdapter(project, zone)
            return adapters[zone]

        def tpu_for(zone: str) -> TpuApi:
            if sharing is None or shared is None:
                return adapter_for(zone)
            if zone not in views:
                views[zone] = JobNodes(shared.zone(project, zone), sharing.due, slack=sharing.slack)
            return views[zone]

        def lifecycle_for(zone: str) -> NodeLifecycle:
            return Lifecycle(adapter_for(zone), str(cfg.tpu["queued_resource"]), tuple(cfg.tpu["names"]))

        def host_keys(node: NodeSnapshot) -> Mapping[int, tuple[str, ...]]:
            return adapter_for(node.zone).host_keys(node.name)

        def instances(node: NodeSnapshot) -> tuple[str, ...]:
            return adapter_for(node.zone).instance_names(node)

        return Doors(tpu_for, lifecycle_for, host_keys, instances)

    def lifecycle(self, cfg: Config, reader: SliceReader) -> NodeLifecycle:
        assert isinstance(reader, TpuAdapter)
        return Lifecycle(reader, str(cfg.tpu["queued_resource"]), tuple(cfg.tpu["names"]))

    def create_body(self, cfg: Config, zone: str, launch: LaunchParts) -> tuple[dict[str, Any], dict[str, Any]]:
        """The CreateNode body from [tpu.spec] (with [tpu.zone_overrides] for `zone`)."""
        spec = zone_spec(cfg, zone)
        return specmod.node_to_json(node_message(cfg, zone, launch)), spec

    def request_json(self, cfg: Config, zone: str, project: str, launch: LaunchParts) -> dict[str, Any]:
        """CreateNode, or CreateQueuedResource when the node came from a queued resource (the
        same name, tier, reservation and node spec as the saved one)."""
        node = node_message(cfg, zone, launch)
        parent = f"projects/{project}/locations/{zone}"
        if not cfg.tpu["queued_resource"]:
            return {"method": f"google.cloud.tpu.{_api_version(node)}.Tpu.CreateNode", "parent": parent,
                    "nodeId": cfg.tpu_name, "node": specmod.node_to_json(node)}
        spec = zone_spec(cfg, zone)
        tier = str(spec.get("queued_resource_tier", ""))
        # v2alpha1 when the node spec or the tier needs it, as the adapter sends it
        version = "v2alpha1" if tier in specmod.QR_ALPHA_TIERS else _api_version(node)
        return {
            "method": f"google.cloud.tpu.{version}.Tpu.CreateQueuedResource",
            "parent": parent,
            "queuedResourceId": queued_id(str(cfg.tpu["queued_resource"])),
            "queuedResource": queued_request(parent, cfg.tpu_name, specmod.node_to_json(node), tier,
                                             str(spec.get("reservation_name", "")), tuple(cfg.tpu["names"])),
        }

    def checks_body_before_delete(self, cfg: Config) -> bool:
        return False  # [tpu.spec] was checked when the config loaded

    def gone_workers(self, cfg: Config) -> Mapping[str, tuple[str, str]] | None:
        return None  # a node's worker VMs are known from the node itself

    def init_config(self, request: InitRequest) -> InitResult | None:
        return capture.init_config(request)

    def label_hint(self, node: NodeSnapshot, zone: str, job: str) -> str:
        return (f"run `tpuwatch init {node.name} --adopt` (or add the label: `gcloud compute tpus tpu-vm update "
                f"{node.name} --zone {zone} --update-labels {OWNER_LABEL}={job}`)")


def zone_spec(cfg: Config, zone: str) -> dict[str, Any]:
    """[tpu.spec] as a create in `zone` sends it: with [tpu.zone_overrides] for that zone."""
    return zonespec.for_zone(cfg.tpu.get("spec") or {}, cfg.tpu.get("zone_overrides") or {}, zone)


def node_message(cfg: Config, zone: str, launch: LaunchParts) -> Any:
    """The validated create request's Node for this config in `zone` (nothing is sent)."""
    raw_spec = zone_spec(cfg, zone)
    if not raw_spec:
        raise ConfigError(
            f"tpu.spec: missing; run `tpuwatch init {cfg.tpu_name}` to capture the TPU's spec "
            "before tpuwatch can recreate it"
        )
    # A spec with v2alpha1-only fields gives a tpu_v2alpha1.Node; the adapter sends that to v2alpha1.
    return specmod.build_node(raw_spec, launch.startup_script(), job=cfg.job_name, extra_metadata=launch.metadata())


def _api_version(message: Any) -> str:
    """"v2alpha1" for a tpu_v2alpha1 message, else "v2" (for the method names --dry-run prints)."""
    return "v2alpha1" if "v2alpha1" in type(message).__module__ else "v2"
