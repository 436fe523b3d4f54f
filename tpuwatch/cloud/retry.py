"""The retry policy for cloud API calls: tenacity, capped exponential backoff with jitter.

A transient error is retried until `max_attempts` tries or `max_delay` seconds, whichever
comes first; anything else is raised at once. A `patient` error (a rate limit: Compute Engine
refills its rate quotas at the start of each minute) is retried for `max_delay` seconds however
many tries that takes, so that a throttled request waits for the refill instead of failing in
the 20 s or so that eight quick tries last. The Google clients' own retry layer is turned
off at each call site (`retry=None`) so this is the only one, and the number of requests a
poll makes is predictable. This module knows nothing of which errors are transient: the
caller passes that predicate (see `tpuwatch.cloud.errors.is_transient`).

`TPUWATCH_API_BACKOFF_SCALE` multiplies every wait (e.g. 0.01 in tests, where the simulator
injects errors at a rate); the attempt and time bounds are unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_random_exponential,
)

from tpuwatch.errors import UsageError

T = TypeVar("T")
SCALE_ENV = "TPUWATCH_API_BACKOFF_SCALE"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds for retrying one API request."""

    max_attempts: int = 8
    max_delay: float = 60.0  # seconds from the first try; no retry starts after this
    multiplier: float = 0.5  # first wait is uniform in [0, multiplier], doubling each time
    max_wait: float = 10.0  # cap on one wait

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy with waits scaled by TPUWATCH_API_BACKOFF_SCALE when set."""
        raw = os.environ.get(SCALE_ENV, "").strip()
        if not raw:
            return cls()
        try:
            scale = float(raw)
        except ValueError:
            scale = -1.0
        if not 0 <= scale <= 100:
            raise UsageError(f"{SCALE_ENV}={raw!r}: expected a number from 0 to 100 (1 = default waits)")
        base = cls()
        return replace(base, multiplier=base.multiplier * scale, max_wait=base.max_wait * scale)

    def call(self, fn: Callable[[], T], *, transient: Callable[[BaseException], bool],
             patient: Callable[[BaseException], bool] | None = None) -> T:
        """fn(), retried while `transient(error)`; the last error is re-raised as is. While the
        last error is `patient(error)`, only the time bound stops the retries."""

        def stop(state: RetryCallState) -> bool:
            if (state.seconds_since_start or 0.0) >= self.max_delay:
                return True
            exc = state.outcome.exception() if state.outcome is not None else None
            if patient is not None and exc is not None and patient(exc):
                return False
            return state.attempt_number >= self.max_attempts

        retrying = Retrying(
            stop=stop,
            wait=wait_random_exponential(multiplier=self.multiplier, max=self.max_wait),
            retry=retry_if_exception(transient),
            reraise=True,
        )
        return retrying(fn)
