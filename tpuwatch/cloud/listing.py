"""One list request shared by everyone who asks at about the same time (a watcher's jobs of one
zone): each API's zone lists are built on it (cloud/tpu/zonenodes.py, cloud/compute/zoneinstances.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Round(Generic[T]):
    started: float  # monotonic time just before the request
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None


class Listing(Generic[T]):
    """One list request answered to everyone who asks at about the same time: `get(not_before)`
    returns the newest answer begun at `not_before` or later; otherwise one caller lists, and
    callers that ask while that list is on its way wait for it instead of listing too.
    (Compute Engine's zone listings share it: cloud/compute/zoneinstances.py.)"""

    def __init__(self, fetch: Callable[[], T], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.clock = clock
        self.count = 0  # list rounds made (each one request per page)
        self._lock = threading.Lock()
        self._newest: _Round[T] | None = None  # the newest round that answered
        self._flight: _Round[T] | None = None  # the round on its way

    def get(self, not_before: float) -> T:
        with self._lock:
            newest = self._newest
            if newest is not None and newest.started >= not_before:
                assert newest.value is not None
                return newest.value
            listing, lead = self._flight, False
            if listing is None:
                listing = self._flight = _Round[T](self.clock())
                lead = True
        if lead:
            try:
                listing.value = self.fetch()
            except BaseException as exc:  # every waiter sees the same failure, as its own request would
                listing.error = exc
            with self._lock:
                self.count += 1
                if listing.error is None:
                    self._newest = listing
                self._flight = None
            listing.done.set()
        else:
            listing.done.wait()
        if listing.error is not None:
            raise listing.error
        assert listing.value is not None
        return listing.value
