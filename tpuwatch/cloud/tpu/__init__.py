"""The Cloud TPU API: nodes and queued resources (adapter), their delete and create
(lifecycle), one zone's nodes shared by a watcher's jobs (zonenodes), and what the registry
(tpuwatch.cloud.apis) asks of it (api)."""

from tpuwatch.cloud.tpu.adapter import TpuAdapter

__all__ = ["TpuAdapter"]
