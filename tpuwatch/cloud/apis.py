"""The registry: every cloud API a TPU is made through, and the one dispatch to it.

One handler per API (`CloudApi`, cloud/base.py), each in its own package: the Cloud TPU API's
nodes (cloud/tpu/) and Compute Engine's instances and MIGs (cloud/compute/). Everything outside
cloud/ that depends on the API (wiring, the commands, the fleet, the tick, recreate, the gcloud
transport) asks here: `api_for(cfg)` for a job's, `api_of(node)` for the one that read a
snapshot, `default_reader` and `other_readers` for a name given without a config. A third API adds its package and
one entry to `APIS` (and its keys to config's per-API table).
"""

from __future__ import annotations

from tpuwatch.cloud.base import CloudApi, SliceReader
from tpuwatch.cloud.compute.api import ComputeCloud
from tpuwatch.cloud.tpu.adapter import RPC_TIMEOUT
from tpuwatch.cloud.tpu.api import TpuCloud
from tpuwatch.config import Config
from tpuwatch.model import NodeSnapshot

__all__ = ["APIS", "RPC_TIMEOUT", "SharedLists", "api_for", "api_of", "default_reader", "describe", "other_readers"]

# [tpu] api -> its handler; the first is the default (config.TPU_APIS lists the same names)
APIS: dict[str, CloudApi] = {api.name: api for api in (TpuCloud(), ComputeCloud())}


def api_for(cfg: Config) -> CloudApi:
    """The API the job's slice is made through (`[tpu] api`, which config validated)."""
    return APIS[str(cfg.tpu["api"])]


def api_of(node: NodeSnapshot) -> CloudApi:
    """The API whose adapter read `node` (by its `kind`)."""
    for api in APIS.values():
        if node.kind in api.kinds:
            return api
    raise ValueError(f"no cloud API reads slices of kind {node.kind!r}")


def describe(node: NodeSnapshot) -> str:
    """What made `node`, in a person's words (`status`)."""
    return api_of(node).describe(node.kind)


def default_reader(project: str, zone: str) -> SliceReader:
    """The reader a name given without a config is looked for first (the default API's)."""
    return next(iter(APIS.values())).guesses(project, zone)[0]


def other_readers(project: str, zone: str) -> list[SliceReader]:
    """Where else a name the default API does not know is looked for (`status`, `events`), in
    turn: the other APIs' readers (an API whose client is not installed has none)."""
    return [reader for api in list(APIS.values())[1:] for reader in api.guesses(project, zone)]


class SharedLists:
    """A watcher's zone lists of every API, shared by its jobs (`CloudApi.shared()`)."""

    def __init__(self) -> None:
        self.by_api: dict[str, object] = {name: api.shared() for name, api in APIS.items()}

    def of(self, api: CloudApi) -> object:
        return self.by_api[api.name]
