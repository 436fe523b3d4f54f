"""`tpuwatch demo`: see tpuwatch work on a simulated pod slice, no cloud account needed."""

from __future__ import annotations

import sys

import click

from tpuwatch.demo.story import APIS

EPILOG = """\b
Examples:
  tpuwatch demo            # about a minute, live dashboard on a terminal
  tpuwatch demo --fast     # the same story in under 30 seconds
  tpuwatch demo --keep     # keep the config, journal and checkpoints after
  tpuwatch demo --api compute   # the story on a TPU7x slice made through Compute Engine
  tpuwatch demo --limp     # a multislice job limping on 3 of its 4 slices, then growing back
  tpuwatch demo --spare    # a multislice job's preempted slice swapped for a hot spare at once
  tpuwatch demo | cat      # plain timestamped lines, as under cron or nohup

Exit codes: 0 every disruption was recovered and the job finished; 1 one was not (the
summary says which); 130 interrupted (everything is cleaned up all the same).
"""


@click.command(epilog=EPILOG)
@click.option("--fast", is_flag=True, help="Shorter waits and steps: the whole story in under 30 s.")
@click.option("--keep", is_flag=True,
              help="Keep the demo's files (config, journal, checkpoints) and print where.")
@click.option("--plain", is_flag=True, help="Plain timestamped lines even on a terminal.")
@click.option("--api", type=click.Choice(APIS), default=APIS[0], show_default=True,
              help="The slice: a node of the Cloud TPU API, or a TPU7x MIG made through Compute Engine.")
@click.option("--limp", is_flag=True,
              help="Another story: a job over 4 slices (job.min_slices = 3) limps on 3 while one is "
                   "lost, then grows back onto it.")
@click.option("--spare", is_flag=True,
              help="Another story: a job over 4 slices with a hot spare ([tpu] spares): a slice is preempted, "
                   "the spare takes its place at once, and the slice is made again as the new spare.")
def command(fast: bool, keep: bool, plain: bool, api: str, limp: bool, spare: bool) -> int:
    """Run a simulated v4-32 TPU (4 workers) with a toy trainer under tpuwatch, and play four
    disruptions: maintenance that heals, maintenance that never heals (the TPU is recreated),
    a spot preemption during a stockout, and a crash.

    With --api compute the slice is a TPU7x multi-host slice made through Compute Engine, a MIG
    of four Spot VMs (topology 2x2x4), and the story is Compute Engine's: the MIG's autoheal
    recreates the slice (tpuwatch waits, deleting nothing), a host error stops it (no Spot VM is
    restarted: tpuwatch recreates its VMs through the MIG), a Spot preemption during a stockout,
    and the same crash.

    With --limp the story is a multislice job's: four v4-8 slices created one by one, one job
    over them with job.min_slices = 3. A slice goes into maintenance that lasts: tpuwatch
    relaunches the job on the 3 left at once, charging nothing; when the slice is back, the job
    grows back onto all 4 at its next checkpoint. The summary adds the time limped, the training
    it stood for, and what growing back cost.

    With --spare the same four slices (spot) have a hot spare of their shape, demo-4 ([tpu]
    spares, and [tpu.spec] to make a spare again from). A slice is preempted: tpuwatch swaps the
    spare into its place at once and relaunches the job there, charging nothing, then deletes
    the preempted slice and creates it again in the background as the job's spare; the job waits
    for no delete or create. The summary adds what the swap did and what it cost.

    Everything runs on this machine: the simulator serves the TPU, Compute Engine and Logging
    APIs to the real Google client libraries, and the workers are SSH servers on loopback
    addresses. At the end a summary shows, for each disruption, the time to detect and resume,
    the steps lost and the restarts charged, and the job's goodput; then `tpuwatch report` of its
    journal and the path of its HTML timeline (demo-report.html in the state dir; needs pip
    install 'tpuwatch[report]').
    Apart from that file, nothing is left running or on disk afterwards.
    """
    from tpuwatch.demo import FAST, NORMAL, run_demo

    live = sys.stdout.isatty() and not plain
    return run_demo(FAST if fast else NORMAL, keep=keep, live=live, api=api, limp=limp, spare=spare)
