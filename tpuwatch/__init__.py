"""tpuwatch: keeps long training jobs alive on Cloud TPU VMs and pod slices."""

__version__ = "0.1.0"
