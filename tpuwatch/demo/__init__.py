"""`tpuwatch demo`: a simulated pod slice (a v4-32 node of the Cloud TPU API, or with `--api
compute` a TPU7x MIG made through Compute Engine), the toy trainer under tpuwatch's reconcile
loop, four scripted disruptions, and a summary of how each one was detected and recovered; or
with `--limp` a multislice job over four slices that limps on three while one is lost and grows
back onto it, with what that cost and gave; or with `--spare` a multislice job with a hot spare
swapped in at once for a preempted slice, the slice made again as the spare.

- `story.py`: the pace (normal or fast), the stage (the slice and its API, or the multislice
  job's four slices, limping or with a spare) and the scripted disruptions; decides when to inject each from what it can observe, through the simulator's
  fault API.
- `summary.py`: per-disruption time to detect, time to resume, steps lost, restarts charged,
  and the job's goodput, computed afterwards from the journal, the simulator's audit entries
  and the checkpoints; rendered as a table.
- `run.py`: sets it all up in a temporary directory, runs the loop, and tears everything down
  (processes and files), on success, failure and Ctrl-C alike.

The demo uses tpuwatch's real code paths (Reconciler, the Google clients against the
simulator's gRPC server and its Compute Engine REST face, OpenSSH to the simulated workers);
nothing in it is faked.
"""

from tpuwatch.demo.run import run_demo
from tpuwatch.demo.story import FAST, NORMAL, Pace

__all__ = ["FAST", "NORMAL", "Pace", "run_demo"]
