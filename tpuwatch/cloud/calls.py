"""Requests this process has sent to Google's APIs, by service and method (`tpuwatch_api_requests_total`),
and those of them that raised (`tpuwatch_api_errors_total`: an HTTP error, a timeout, a refused
connection; a retried request that then succeeds counts its failed tries).

Counted per request, retries included, where `tpuwatch.cloud.tpu.adapter` and `tpuwatch.cloud.logs` hand
one to the retry policy. Thread-safe; it knows nothing of what the requests were about.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from tpuwatch.cloud.errors import Call

T = TypeVar("T")
_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_errors: Counter[tuple[str, str]] = Counter()


def counted(call: Call, fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, counting each time it is called (each is one request) under (call.service, call.method),
    and each time it raises."""

    def request() -> T:
        key = (call.service, call.method)
        with _lock:
            _counts[key] += 1
        try:
            return fn()
        except Exception:
            with _lock:
                _errors[key] += 1
            raise

    return request


def counts() -> dict[tuple[str, str], int]:
    """{(service, method): requests} so far in this process, e.g. ("tpu.googleapis.com", "get_node")."""
    with _lock:
        return dict(_counts)


def errors() -> dict[tuple[str, str], int]:
    """{(service, method): requests that raised} so far in this process."""
    with _lock:
        return dict(_errors)
