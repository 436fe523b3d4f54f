"""The training job of the goodput benchmark, modelled analytically: its parameters (with the
slice's and the cloud's delays), the processes one launch starts, and one training attempt.

After `startup` seconds an attempt runs `ckpt_every` steps of `step_time`, then spends `ckpt_save`
seconds writing a checkpoint that is complete at the end of the save, and so on. Its log has a
banner at the launch, then a line every `log_every` seconds while it trains (silent while it
starts up, saves, or makes no progress). Its step at any time is a formula, so a 30-day run costs
one event per fault and per tool action, not one per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lab.clock import Signal


@dataclass(frozen=True)
class Params:
    """The job, the slice and the cloud's delays. Seconds unless named otherwise."""

    days: float = 30.0
    workers: int = 4  # hosts in the slice (v4-32)
    step_time: float = 2.0
    ckpt_every: int = 900  # steps between checkpoints (30 min at 2 s a step)
    ckpt_save: float = 30.0  # a save blocks training this long; complete at its end
    steps: int | None = None  # job length; None: more than fits in `days`, so it never ends
    startup: float = 120.0  # program start + checkpoint restore, paid by every launch
    create_time: float = 300.0  # create operation to READY (startup script included)
    create_fail_time: float = 60.0  # a create that meets a stockout fails after this long
    delete_time: float = 90.0
    repairing_after: float = 60.0  # UNHEALTHY_MAINTENANCE -> REPAIRING (as the simulator)
    unknown_after: float = 120.0  # a repair that fails ends in state UNKNOWN after this long
    peer_timeout: float = 100.0  # when one worker dies, the others abort this much later
    bug_exit_after: float = 60.0  # the deterministic bug: every worker exits 1 this long after launch
    audit_delay: float = 30.0  # an audit entry is readable this long after the event
    gcloud_overhead: float = 2.0  # start-up of one gcloud invocation
    # Announced maintenance (trace kinds "scheduled", "unscheduled", "notice"): the metadata
    # server's TERMINATE_ON_HOST_MAINTENANCE comes this long before the host goes down; a job
    # told of it by a signal saves a checkpoint (Orbax's save-on-preemption) when save_on_term.
    notice_lead: float = 60.0
    save_on_term: bool = True
    slices: int = 1  # pod slices the job spans (Multislice), each of `workers` hosts
    log_every: float = 60.0  # the job logs a line this often while it trains
    megascale_threshold: float = 300.0  # Multislice: no progress this long and Megascale logs a hang
    # Multislice autorepair of a slice that failed for good ("stuck"): its node goes at once, a new
    # one of the same name is created this long later (then `create_time`, waiting out a stockout),
    # and the other slices restart for `multislice_restart` once it is READY. Google publishes no
    # figure for either: these are the project simulator's (`sim inject slice-replace`).
    autorepair_after: float = 600.0
    multislice_restart: float = 60.0
    # Past fixed slices (the ideal bounds, and tpuwatch's [tpu] spares and [job] min_slices): `spares` idle
    # same-shape slices kept beside the job's, and limping: with `limp_floor` set, the job may run
    # on any k >= limp_floor of its `slices`, a step on k slices counting k/slices of a step. A world
    # that limps counts in 1/slices of a step (`limping()` scales step_time, ckpt_every, steps).
    spares: int = 0
    limp_floor: int | None = None
    # A job that limps runs on slices made one by one with [tpu.spec] (what a user who means to
    # limp runs: a lost slice can be made again alone); with `limp_queued`, on one multislice
    # queued resource instead, as the fixed-slice runs are.
    limp_queued: bool = False

    @property
    def made_alone(self) -> bool:
        """Every slice is a node made alone (no multislice queued resource, no autorepair): a world
        with spares, or one whose job limps on slices made one by one."""
        limps = self.limp_floor is not None and self.limp_floor < self.slices and not self.limp_queued
        return self.slices > 1 and (self.spares > 0 or limps)

    @property
    def unit(self) -> int:
        """Counted steps per step of the job: `slices` when it may limp, else 1."""
        return self.slices if self.limp_floor is not None else 1

    def on_slices(self, k: int) -> Params:
        """An attempt's parameters on `k` of the job's slices: in a limping world's units, a step
        on k slices is k units long (so it takes step_time * slices / k per unit), and a checkpoint
        still comes every ckpt_every of the job's steps."""
        if k == self.slices:
            return self
        if self.limp_floor is None or not self.limp_floor <= k < self.slices:
            raise ValueError(f"an attempt on {k} of {self.slices} slices needs a limp floor <= {k}")
        return replace(self, step_time=self.step_time * self.slices / k, ckpt_every=self.ckpt_every * k // self.slices)

    @property
    def horizon(self) -> float:
        return self.days * 86400.0

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return int(math.ceil(self.horizon / self.step_time)) + 1


def way_params(p: Params, spares: int = 0, limp_floor: int | None = None) -> Params:
    """`p` for a world with `spares` and, when `limp_floor` is given, limping (counted in
    1/slices of a step, so that k slices make k units a step; the job's length in the same units)."""
    q = replace(p, spares=spares)
    if limp_floor is None:
        return q
    if not 1 <= limp_floor <= p.slices:
        raise ValueError(f"limp floor {limp_floor} is outside 1..{p.slices}")
    n = p.slices
    return replace(q, limp_floor=limp_floor, step_time=p.step_time / n, ckpt_every=p.ckpt_every * n,
                   steps=p.total_steps * n)


@dataclass
class Procs:
    """The training processes one launch started on the workers of one slice."""

    no: int  # the attempt number its launcher gave it
    slice: int
    node_id: int
    t0: float
    bad: bool  # launched after the code push: exits 1 at start
    exits: dict[int, int | None] = field(default_factory=dict)  # slice-local worker -> code
    ended: bool = False
    attempt: Attempt | None = None  # the training run it joined (None: waiting for its peers)


@dataclass
class Attempt:
    """One training run: processes on every worker of every slice, the slices' node incarnations."""

    no: int
    node_id: int
    t0: float
    s0: int  # checkpoint step it resumed from (0: from scratch)
    bad: bool  # launched after the code push: exits 1 at start
    p: Params
    frozen: float | None = None  # progress stopped here (hang, crash, kill, exit)
    exits: dict[int, int | None] = field(default_factory=dict)  # worker (global) -> code (None: killed)
    procs: list[Procs] = field(default_factory=list)  # one per slice, in slice order
    ended: bool = False
    end_time: float | None = None
    end_sig: Signal = field(default_factory=Signal)
    done_at: float | None = None  # when it would finish the job, if it runs undisturbed
    notice: str = ""  # what the relay beside it passed on (model.NOTICES), "" none
    saved_step: int | None = None  # the checkpoint it saves on a signal, complete at saved_at
    saved_at: float | None = None
    lost: int = 0  # at its end: steps run past the newest complete checkpoint (redone later)
    megascale_at: float | None = None  # Multislice: when Megascale logged its hang line
    left_out: tuple[str, ...] = ()  # limping: the state of each of the job's slices it runs without, at its start

    def __post_init__(self) -> None:
        if not self.bad:
            self.done_at = self._done_time()

    @property
    def run_start(self) -> float:
        return self.t0 + self.p.startup

    def _cycle(self) -> float:
        return self.p.ckpt_every * self.p.step_time + self.p.ckpt_save

    def _done_time(self) -> float:
        p, m = self.p, self.p.total_steps - self.s0
        n, rest = divmod(m, p.ckpt_every)
        if rest == 0:
            return self.run_start + n * self._cycle()
        return self.run_start + n * self._cycle() + rest * p.step_time + p.ckpt_save

    def last_write(self, t: float) -> float:
        """When the attempt last wrote to its log, as of `t`: its banner at the launch, then a line
        every `log_every` while it trains; nothing while it starts up, saves or is frozen."""
        p = self.p
        if self.frozen is not None:
            t = min(t, self.frozen)
        if self.bad or t <= self.run_start:
            return self.t0
        if self.done_at is not None and t >= self.done_at:
            return self.done_at
        c = self._cycle()
        n = int((t - self.run_start) // c)
        r = min(t - self.run_start - n * c, p.ckpt_every * p.step_time)
        return self.run_start + n * c + (r // p.log_every) * p.log_every

    def progress(self, t: float) -> tuple[int, int, float | None]:
        """(step reached, newest complete checkpoint step, when it completed) at time `t`."""
        saved = self.saved_step is not None and self.saved_at is not None and t >= self.saved_at
        if self.frozen is not None:
            t = min(t, self.frozen)
        if self.bad or t <= self.run_start:
            return self.s0, self.s0, None
        p = self.p
        if self.done_at is not None and t >= self.done_at:
            return p.total_steps, p.total_steps, self.done_at
        u = t - self.run_start
        c = self._cycle()
        n = int(u // c)
        r = u - n * c
        step = min(p.total_steps, self.s0 + n * p.ckpt_every + min(p.ckpt_every, int(r // p.step_time)))
        ck = self.s0 + n * p.ckpt_every
        ckt = (self.run_start + n * c) if n > 0 else None
        if saved and self.saved_step is not None and self.saved_step > ck:
            ck, ckt = self.saved_step, self.saved_at
        return step, ck, ckt
