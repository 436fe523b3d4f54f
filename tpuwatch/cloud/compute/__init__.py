"""TPUs made through Compute Engine: one instance, or a MIG whose instances are the workers.
The adapter reads and writes them (adapter), view turns Google's messages into snapshots,
spec captures what `init` saves and checks an insert body, lifecycle and maint delete,
recreate and maintain them, zoneinstances shares one zone's lists between a watcher's jobs,
and api is what the registry (tpuwatch.cloud.apis) asks of it."""

from tpuwatch.cloud.compute.adapter import ComputeAdapter, is_mig

__all__ = ["ComputeAdapter", "is_mig"]
