"""The TPU API's lifecycle moved to cloud/tpu/lifecycle.py; this name stays only for
commands/recreate.py, until it goes through the policy (then delete this module)."""

from tpuwatch.cloud.tpu.lifecycle import Lifecycle, refuse_multislice

__all__ = ["Lifecycle", "refuse_multislice"]
