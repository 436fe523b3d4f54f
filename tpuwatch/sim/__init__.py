"""The local TPU simulator: TPU and Logging APIs over gRPC, SSH workers, toy trainer, faults.

Keep this file free of imports: `python -m tpuwatch.sim.trainer` runs on every simulated worker
and must start fast.
"""
