"""Run the demo: a temporary directory, the simulator, the job, the reconcile loop, the story,
the summary — and, whatever happens (success, failure, Ctrl-C, SIGTERM), no process or
temporary file left behind (unless `keep`, which keeps the files only).

The loop is `tpuwatch watch`'s own (Reconciler.tick, the same dashboard or plain lines, the
same tick pacing), run in this process so there is one screen; between ticks the director gets
a look every few tens of milliseconds so a disruption lands where the story wants it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import click

from tpuwatch.demo.story import (
    API_COMPUTE,
    API_TPU,
    CRASH_WORKER,
    JOB,
    Director,
    Pace,
    Stage,
    hold_dir_for,
    stage_for,
)

EXIT_INTERRUPTED = 130
DIRECTOR_LOOK = 0.05  # seconds between the director's looks while the loop waits for a tick


def trainer_command(pace: Pace, ckpt_dir: Path, crash_marker: Path, steps: int | None = None,
                    crash: bool = True, holds: tuple[int, ...] = ()) -> str:
    q = shlex.quote
    return (f"python3 -m tpuwatch.sim.trainer --steps {pace.steps if steps is None else steps} "
            f"--step-time {pace.step_time:g} "
            f"--ckpt-every {pace.ckpt_every} --ckpt-dir {q(str(ckpt_dir))} --resume {{checkpoint}}"
            + (f" --segfault-at {pace.crash_step} --fault-worker {CRASH_WORKER} "
               f"--crash-once {q(str(crash_marker))}" if crash else "")
            + (f" --hold-at {','.join(map(str, holds))} --hold-until {q(str(hold_dir_for(ckpt_dir)))}"
               if holds else ""))


def write_config(path: Path, sim: Any, pace: Pace, ckpt_dir: Path, crash_marker: Path, stage: Stage) -> Path:
    """The demo job's tpuwatch.toml, as `tpuwatch init` plus a person's edits would leave it."""
    def dur(seconds: float) -> str:
        return json.dumps(f"{seconds:g}s")

    crash = any(a.key == "crash" for a in stage.acts(pace))  # the limping story has no crash

    text = f"""\
# Written by `tpuwatch demo` for a simulated TPU; durations are scaled down to seconds.
{stage.tpu_table(sim.project, sim.zone)}
[job]
name = {json.dumps(JOB)}
command = {json.dumps(trainer_command(pace, ckpt_dir, crash_marker, stage.steps(pace), crash, stage.holds(pace)))}
checkpoint_dir = {json.dumps(str(ckpt_dir))}
{stage.job_lines()}
[recovery]
poll_interval = {dur(pace.poll_interval)}
repair_timeout = {dur(pace.repair_timeout)}
min_uptime = {dur(pace.min_uptime)}
backoff_base = {dur(pace.backoff_base)}
backoff_max = {dur(pace.backoff_max)}
stop_grace = "1s"
queue_timeout = "5m"

[precheck]
# The simulated workers resolve no host names yet; every other check runs as on a real TPU.
skip = ["dns"]

[ssh]
user = {json.dumps(sim.ssh_user)}
identity_file = {json.dumps(str(sim.ssh_key))}
port = {sim.ssh_port}
internal_ip = true
"""
    path.write_text(text)
    return path


class _Stop(KeyboardInterrupt):
    """SIGTERM or SIGHUP: stop like Ctrl-C, cleaning up on the way out."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


@contextmanager
def _signals() -> Iterator[None]:
    """SIGTERM/SIGHUP end the demo as Ctrl-C does; the previous handlers come back after."""
    with _handling((signal.SIGTERM, signal.SIGHUP), _raise_stop):
        yield


@contextmanager
def _shielded() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C (or SIGTERM) during it is ignored."""
    with _handling((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), signal.SIG_IGN):
        yield


@contextmanager
def _handling(sigs: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
    """`handler` for `sigs` inside the block, the previous handlers after it."""
    old = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Held:
    """What the cleanup must close: filled in as the run gets that far."""

    sim: Any = None
    rest: Any = None  # the simulator's Compute Engine REST face, for the story on a MIG
    journal: Any = None


def run_demo(pace: Pace, *, keep: bool = False, live: bool = False, api: str = API_TPU, limp: bool = False,
             spare: bool = False, echo: Callable[[str], None] | None = None) -> int:
    """Play the demo on a node of the Cloud TPU API (`api` "tpu") or a MIG made through Compute
    Engine ("compute"), or with `limp` a multislice job over four slices that limps on three, or
    with `spare` one with a hot spare swapped in for a preempted slice; 0 when every disruption
    was recovered and the job finished, else 1 (130 when interrupted).
    `live`: the rich dashboard (a terminal); else plain lines."""
    stage = stage_for(api, limp, spare)
    say = echo or click.echo
    # gRPC's C core logs the GOAWAY that stopping the simulator's server sends to our own open
    # channels at INFO; nothing is wrong, so keep it off the demo's screen.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    kept_html = _user_state_dir() / "demo-report.html"  # before any file is made: it may refuse
    tmp = Path(tempfile.mkdtemp(prefix="tpuwatch-demo-"))
    # The report's HTML outlives the demo's files: it goes to the user's state dir (or with them).
    html = tmp / "report.html" if keep else kept_html
    held = _Held()
    interrupted = False
    try:
        with _signals():
            try:
                from tpuwatch.sim.simulator import Simulator

                held.sim = Simulator(root=tmp / "sim", speed=pace.speed)
                held.sim.start()
                env = {**held.sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state"),
                       "CLOUDSDK_CONFIG": str(tmp / "gcloud")}  # never the user's gcloud settings
                if stage.api == API_COMPUTE:
                    from tpuwatch.cloud.clients import COMPUTE_EMULATOR_ENV
                    from tpuwatch.sim.rest import RestFace

                    held.rest = RestFace(held.sim.world).start()
                    env[COMPUTE_EMULATOR_ENV] = held.rest.url.rstrip("/")
                with _environ(env):
                    return _play(held, tmp, pace, stage, live, say, keep, html)
            except KeyboardInterrupt:
                interrupted = True
                return EXIT_INTERRUPTED
    finally:
        with _shielded():
            if held.journal is not None:
                held.journal.close()
            if held.rest is not None:
                held.rest.close()
            if held.sim is not None:
                held.sim.close()  # every simulated worker's processes, the servers, the threads
            if keep:
                say(f"kept the demo's files in {tmp} (tpuwatch.toml, the journal in state/, "
                    f"checkpoints in sim/bucket/); no process is left running. The journal: "
                    f"TPUWATCH_STATE_DIR={tmp / 'state'} tpuwatch history -c {tmp / 'tpuwatch.toml'}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
            if interrupted:
                say("demo interrupted: stopped the simulator and its workers"
                    + ("" if keep else f", removed {tmp}"))


def _play(held: _Held, tmp: Path, pace: Pace, stage: Stage, live: bool, say: Callable[[str], None],
          keep: bool, html: Path) -> int:
    from rich.console import Console

    from tpuwatch.demo.story import checkpoint_times
    from tpuwatch.demo.summary import render, summarize
    from tpuwatch.journal import Journal
    from tpuwatch.loop import run_job
    from tpuwatch.policy import Phase
    from tpuwatch.tick import Flags
    from tpuwatch.ui.dashboard import LineView, LiveView
    from tpuwatch.wiring import load_job, real_ports

    sim = held.sim
    ckpt_dir = sim.bucket / "ckpt"
    marker = sim.bucket / "crashed-once"
    stage.make(sim)
    cfg_path = write_config(tmp / "tpuwatch.toml", sim, pace, ckpt_dir, marker, stage)
    job = load_job(cfg_path)
    journal = Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, wait=False)
    held.journal = journal
    ports = real_ports(job)
    console = Console(highlight=False) if live else Console(width=80, highlight=False, no_color=True)
    view: Any = (LiveView(job.name, job.pcfg, journal, title="tpuwatch demo", console=console) if live
                 else LineView(job.name, out=say))
    director = Director(sim, pace, ckpt_dir, marker, view.note, stage)
    acts = director.acts
    started = time.monotonic()
    deadline = started + pace.deadline
    tick_end: dict[datetime, datetime] = {}

    def past_deadline(report: Any) -> bool:
        return time.monotonic() > deadline

    def wait(report: Any, delay: float) -> None:
        # Between ticks the director plays the story's next disruption when its time comes.
        end = time.monotonic() + delay
        while True:
            director.poll(journal)
            left = end - time.monotonic()
            if left <= 0:
                return
            ports.sleep(min(DIRECTOR_LOOK, left))

    def on_report(report: Any) -> None:
        tick_end[report.time] = datetime.now(timezone.utc)

    with view:
        view.note(f"{stage.describe()} runs the toy trainer to "
                  f"step {stage.steps(pace)}; {stage.plot(acts)} "
                  f"({pace.name} pace; files in {tmp}{', kept' if keep else ''})")
        # `watch`'s own loop; a failed first tick is survived too (the simulator is local).
        report = run_job(job.cfg, job.pcfg, ports, journal, Flags(), view, after_tick=on_report,
                         stop=past_deadline, wait=wait, first_failure_fatal=False)
    mem = report.memory
    if report.decision.terminal:
        how = "job done" if mem.phase is Phase.DONE else f"job failed: {report.decision.summary}"
    elif mem.phase is Phase.HALTED:
        how = f"needs a person: {report.decision.summary}"
    else:
        how = f"the demo's deadline ({pace.deadline:g}s) passed: {report.decision.summary}"
    summary = summarize(director.played, [a.title for a in acts], journal.events(), journal.attempts(),
                        checkpoint_times(ckpt_dir), pace, done=how == "job done", how_it_ended=how,
                        tick_end=tick_end, steps=stage.steps(pace), limp=stage.limps,
                        swapped=mem.limp.swapped if stage.swaps else None,
                        slots=job.pcfg.slices)
    took = f"demo took {human_elapsed(time.monotonic() - started)}"
    if live:
        console.print()
        console.print(render(summary))
        console.print(took, style="dim")
    else:
        with console.capture() as cap:
            console.print(render(summary))
        say("")
        for line in cap.get().rstrip("\n").split("\n"):
            say(line.rstrip())
        say(took)
    _report(journal, job.name, html, (lambda line: console.print(line, markup=False)) if live else say)
    return 0 if summary.ok else 1


def _report(journal: Any, job: str, html: Path, say: Callable[[str], None]) -> None:
    """`tpuwatch report` of the demo's journal, and its HTML timeline when plotly is installed."""
    from tpuwatch.errors import UsageError
    from tpuwatch.report import compute, text
    from tpuwatch.ui.report_html import PIP_EXTRA, available, write

    report = compute(job, journal.events(), journal.attempts(), datetime.now(timezone.utc))
    say("")
    say("tpuwatch report: where the demo's wall time went")
    for line in text(report).split("\n"):
        say(line)
    if not available():
        say(f"the report's HTML timeline needs the plotting extra: {PIP_EXTRA}")
        return
    try:
        html.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write(report, html)
    except (OSError, UsageError) as exc:
        say(f"could not write the report's HTML timeline: {exc}")
        return
    say(f"the report's HTML timeline: {html}")


def _user_state_dir() -> Path:
    from tpuwatch.config import default_state_dir

    return default_state_dir()


def human_elapsed(seconds: float) -> str:
    from tpuwatch.durations import human

    return f"{seconds:.1f}s" if seconds < 60 else human(seconds)
