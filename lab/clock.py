"""The discrete-event engine of the goodput benchmark: a virtual clock and its processes.

`Sim` runs callbacks and generator processes in virtual seconds (a process yields a number of
seconds to sleep, or a `Signal` to wait for, whose value is sent back). It knows nothing of TPUs:
the world it drives is `world.BenchWorld`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator
from typing import Any

# A process yields seconds to sleep, or a Signal to wait for (its value is sent back).
Process = Generator[Any, Any, Any]


class Signal:
    """A one-shot event processes can wait for; `fire(value)` wakes them all with `value`."""

    __slots__ = ("callbacks", "fired", "value", "waiters")

    def __init__(self) -> None:
        self.fired = False
        self.value: Any = None
        self.waiters: list[Proc] = []
        self.callbacks: list[Callable[[Any], None]] = []


class Proc:
    """A running generator process."""

    __slots__ = ("dead", "done", "gen", "name", "result")

    def __init__(self, gen: Process, name: str) -> None:
        self.gen = gen
        self.name = name
        self.dead = False
        self.result: Any = None
        self.done = Signal()


class Sim:
    """Virtual time: a heap of callbacks, and generator processes driven by it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0  # callbacks run, for the speed report

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def spawn(self, gen: Process, name: str = "") -> Proc:
        proc = Proc(gen, name)
        self.at(self.now, self._step, proc, None)
        return proc

    def fire(self, sig: Signal, value: Any = None) -> None:
        if sig.fired:
            return
        sig.fired, sig.value = True, value
        waiters, sig.waiters = sig.waiters, []
        for proc in waiters:
            self.at(self.now, self._step, proc, value)
        callbacks, sig.callbacks = sig.callbacks, []
        for cb in callbacks:
            cb(value)

    def any_of(self, sig: Signal, timeout: float) -> Signal:
        """A signal fired by `sig` or, failing that, after `timeout` seconds (value None)."""
        out = Signal()
        if sig.fired:
            self.fire(out, sig.value)
            return out
        sig.callbacks.append(lambda v: self.fire(out, v))
        self.after(timeout, self.fire, out, None)
        return out

    def kill(self, proc: Proc) -> None:
        proc.dead = True

    def _step(self, proc: Proc, value: Any) -> None:
        if proc.dead:
            return
        try:
            y = proc.gen.send(value)
        except StopIteration as stop:
            proc.dead, proc.result = True, stop.value
            self.fire(proc.done, stop.value)
            return
        if isinstance(y, Signal):
            if y.fired:
                self.at(self.now, self._step, proc, y.value)
            else:
                y.waiters.append(proc)
        else:
            self.after(float(y), self._step, proc, None)

    def next_time(self, ignore: Callable[..., None] | None = None) -> float:
        """When the next callback is due (inf: none), callbacks `ignore` left out."""
        if ignore is None:
            return self._heap[0][0] if self._heap else math.inf
        return min((t for t, _, fn, _ in self._heap if fn != ignore), default=math.inf)

    def run(self, until: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
        self.now = until
