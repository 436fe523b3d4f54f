"""The simulator's one timing thread: runs callbacks at given monotonic times, in order.

Every timed transition of the world (an operation finishing, a repair ending, a scenario step)
and every effect on the simulated hosts runs here, one at a time, so their order is the order
they were scheduled in. The thread sleeps on a condition until the next due time or a new
entry: no busy loop. This module knows nothing of TPUs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(order=True)
class Timer:
    due: float
    seq: int
    fn: Callable[[], Any] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)
    done: threading.Event = field(default_factory=threading.Event, compare=False)
    error: BaseException | None = field(default=None, compare=False)

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float = 60.0) -> None:
        """Block until the callback ran (or was dropped); re-raise what it raised."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"simulator step did not finish within {timeout:g}s")
        if self.error is not None:
            raise self.error


class Scheduler:
    """A heap of timers served by one daemon thread."""

    def __init__(self, name: str = "tpuwatch-sim-scheduler") -> None:
        self._heap: list[Timer] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.errors: list[BaseException] = []

    def start(self) -> None:
        self._thread.start()

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call_later(self, delay: float, fn: Callable[[], Any]) -> Timer:
        return self.call_at(time.monotonic() + max(0.0, delay), fn)

    def call_at(self, due: float, fn: Callable[[], Any]) -> Timer:
        timer = Timer(due, next(self._seq), fn)
        with self._cond:
            if self._closed:
                timer.cancelled = True
                timer.done.set()
                return timer
            heapq.heappush(self._heap, timer)
            self._cond.notify()
        return timer

    def submit(self, fn: Callable[[], Any]) -> Timer:
        """Run `fn` on the scheduler thread as soon as the timers due before it have run."""
        return self.call_later(0.0, fn)

    def run_sync(self, fn: Callable[[], Any], timeout: float = 60.0) -> None:
        """Run `fn` in order on the scheduler thread and wait for it (inline when already there)."""
        if self.in_thread():
            fn()
            return
        self.submit(fn).wait(timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._heap = self._heap, []
            self._cond.notify_all()
        for timer in pending:
            timer.cancelled = True
            timer.done.set()
        if self._thread.is_alive() and not self.in_thread():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._heap:
                        delay = self._heap[0].due - time.monotonic()
                        if delay <= 0:
                            break
                        self._cond.wait(delay)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                try:
                    timer.fn()
                except BaseException as exc:  # keep the world running; tests read .errors
                    log.exception("simulator step failed")
                    timer.error = exc
                    self.errors.append(exc)
            timer.done.set()
