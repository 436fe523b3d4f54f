"""The ideal bounds: oracles that see every fault the moment it happens and know the future.

`ideal` is the bound for all tools while a job's slices are fixed (the watchdogs of lab/tools.py
and tpuwatch); `ideal_ways` is the same oracle past fixed slices, with hot spares and limping on
fewer slices (docs/benchmarks.md, "Past fixed slices").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lab.clock import Process
from lab.world import BenchWorld

if TYPE_CHECKING:
    from lab.tools import Run


def ideal(run: Run, repair_timeout: float | None = None) -> Process:
    """An oracle: it sees every fault the moment it happens and knows the future.

    With `repair_timeout` it does not know the future (the reactive bound): a node down for
    anything but a preemption is waited for that long, then recreated, as a tool without
    foresight must choose; everything else is as instant as the oracle's.

    A hang or a crash is stopped and relaunched at once; a maintenance is waited out when
    it heals sooner than a delete + create would give a node, recreated otherwise; a preempted
    or stuck node is deleted at once and created the moment the zone has capacity; the buggy
    code is given up on when its first attempt fails. It still pays startup, lost work since
    the last checkpoint and the real repair / delete / create times. Over several slices it
    recovers each slice so, and relaunches on all of them the moment every one is usable.
    """
    w = run.world
    n = 0
    down_since: dict[int, float] = {}  # slice -> when it was first seen unusable (repair_timeout)
    while True:
        if w.done is not None:
            w.give_up("job done")
            return
        a = w.live()
        wait: float | None = None  # until a stockout ends, or a repair_timeout
        if w.usable():
            if a is not None and a.frozen is not None and not a.bad:
                w.stop_job()
                a = None
            last = w.attempt
            if a is None:
                if last is not None and last.bad:
                    w.give_up("the deterministic bug: first attempt after the push failed", "stopped at the bug")
                    return
                n += 1
                w.launch(n)
        else:
            for s, sl in enumerate(w.slices):
                node = sl.node
                if w.usable(s):
                    down_since.pop(s, None)
                    continue
                if (repair_timeout is not None and node is not None and node.state not in ("DELETING", "CREATING")
                        and node.state != "PREEMPTED"):
                    due = down_since.setdefault(s, w.now) + repair_timeout
                    if w.now >= due:
                        down_since.pop(s, None)
                        w.delete_node(s)
                    else:
                        wait = due if wait is None else min(wait, due)
                elif (t := _recover(w, s)) is not None:
                    wait = t if wait is None else min(wait, t)
        if wait is not None:
            yield run.sim.any_of(w.changed, wait - w.now)
        else:
            yield w.changed


def _recover(w: BenchWorld, s: int) -> float | None:
    """The oracle's recovery of slice `s` that is not usable (as `ideal`'s): a preempted or stuck
    node is deleted at once, a healing one when a recreate would be READY sooner than its heal, a
    missing one created the moment the zone has capacity. Returns when to look again (a stockout's
    end), or None."""
    sl, p = w.slices[s], w.p
    node = sl.node
    if node is not None and node.state not in ("DELETING", "CREATING"):
        if node.state == "PREEMPTED" or (sl.maintenance and sl.heal_at is None):
            w.delete_node(s)
        elif sl.maintenance and sl.heal_at is not None:
            if w.stockout_end(w.now + p.delete_time) + p.create_time < sl.heal_at:
                w.delete_node(s)
        elif node.state in ("REPAIRING", "UNKNOWN"):
            w.delete_node(s)
    elif node is None:
        t = w.stockout_end(w.now)
        if t > w.now:
            return t
        w.create_node(s)
    return None


def _back_at(w: BenchWorld, s: int) -> float:
    """When the oracle foresees slice `s` usable again, as it recovers it (`_recover`); now when it is."""
    sl, p = w.slices[s], w.p
    node = sl.node
    recreate = w.stockout_end(w.now + p.delete_time) + p.create_time
    if w.usable(s):
        return w.now
    if node is None:
        return w.stockout_end(w.now) + p.create_time
    if node.state == "CREATING":
        return node.created + p.create_time
    if node.state == "RESTARTING":
        return w.now + p.multislice_restart
    if sl.maintenance and sl.heal_at is not None:
        return min(sl.heal_at, recreate)
    return recreate  # preempted, stuck, deleting: a delete (at most) and a create


def ideal_ways(run: Run) -> Process:
    """The ideal bound past fixed slices: the oracle of `ideal` (it sees every fault at once,
    knows when a heal comes and when a stockout ends, recovers every slice as `ideal` does: the
    spares too, in the background), with `p.spares` idle slices and limping down to `p.limp_floor`.

    When the job's attempt is lost it relaunches at once on the usable slices, its own first and
    then the spares (a restart: no delete or create on its path; the lost slice, recovered, is a
    spare from then on). Short of p.slices usable slices and with a floor, it limps on the k >=
    floor there are (from the newest checkpoint), unless its foresight says waiting for all of
    them loses less (a short heal); when more slices are usable than it runs on, it relaunches on
    them at the next complete checkpoint (at once while the attempt is still starting, nothing to
    lose). With no spares and no floor it is `ideal` exactly (a test checks it).
    """
    w, p = run.world, run.world.p
    floor = p.limp_floor if p.limp_floor is not None else p.slices
    n = 0
    eps = 1e-3  # just past a checkpoint's completion, so the attempt stopped there has lost nothing
    while True:
        if w.done is not None:
            w.give_up("job done")
            return
        waits: list[float] = []
        for s in range(len(w.slices)):
            if not w.usable(s):
                t = _recover(w, s)
                if t is not None:
                    waits.append(t)
        a = w.live()
        usable = [s for s in range(len(w.slices)) if w.usable(s)]
        # its own slices first, then the spares, in order; never more than the job's
        chosen = sorted(usable, key=lambda s: (s not in w.active, s))[:p.slices]
        if a is not None and a.frozen is None:
            # limping, and more slices are back; not once the code is broken (the oracle knows
            # that a relaunch would meet the bug, and a forced one comes soon enough)
            if not a.bad and not w.pushed and len(chosen) > len(w.active):
                step, ck, _ = a.progress(w.now)
                if step == ck:
                    w.stop_job()
                    n += 1
                    w.launch(n, slices=chosen)
                else:
                    c = a._cycle()
                    waits.append(a.run_start + (math.floor((w.now - a.run_start) / c) + 1) * c + eps)
        elif a is not None and a.bad:
            pass  # the buggy code exits by itself
        elif w.attempt is not None and w.attempt.bad and a is None:
            w.give_up("the deterministic bug: first attempt after the push failed", "stopped at the bug")
            return
        elif len(chosen) >= floor and (len(chosen) == p.slices or _limp_pays(w, len(chosen))):
            if a is not None:
                w.stop_job()
            n += 1
            w.launch(n, slices=chosen)
        if waits:
            yield run.sim.any_of(w.changed, max(0.0, min(waits) - w.now))
        else:
            yield w.changed


def _limp_pays(w: BenchWorld, k: int) -> bool:
    """Limping on k slices now loses less than waiting for all of them (the oracle's foresight):
    waiting loses the time until the last one needed is back; limping loses (n-k)/n of the time
    until the first checkpoint after that, and a second start-up (the relaunch on all of them)."""
    p = w.p
    back = sorted(_back_at(w, s) for s in range(len(w.slices)))[p.slices - 1]
    wait_loss = back - w.now
    run_start = w.now + p.startup
    if back <= run_start:
        return False  # back before a limped attempt could train
    c = p.on_slices(k)
    cycle = c.ckpt_every * c.step_time + c.ckpt_save
    switch = run_start + math.ceil((back - run_start) / cycle) * cycle
    limp_loss = p.startup + (p.slices - k) / p.slices * (switch - run_start) + p.startup
    return limp_loss < wait_loss + p.startup
