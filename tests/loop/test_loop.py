"""`loop.tick_loop` and `Decision.ends_watch`: when watching one job stops.

Every wait of the loop goes through the sleep port, so a stop reaches a run of cloud API
failures too. The tests drive the loop with fakes and wait on what the loop emits (its warning),
never on the wall clock.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from tpuwatch.errors import CloudError
from tpuwatch.loop import tick_loop
from tpuwatch.policy import Decision, Memory, Phase
from tpuwatch.policy.values import CLOUD_FAILURES as MAX_CLOUD_FAILURES
from tpuwatch.policy.values import PolicyConfig
from tpuwatch.tick import TickReport

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)
POLL = 3600.0  # a wait past the port would outlast the test's timeout


def report(phase: Phase = Phase.RUNNING) -> TickReport:
    mem = replace(Memory.initial("us-central2-b"), phase=phase)
    decision = Decision((), mem, "", 0, "running")
    return TickReport(NOW, None, None, None, (), decision)


class Ticks:
    """A good tick, then a cloud API that fails after its own retries."""

    def __init__(self) -> None:
        self.ticks = 0
        self.first = report()

    def tick(self) -> TickReport:
        self.ticks += 1
        if self.ticks == 1:
            return self.first
        raise CloudError("TPU API: UNAVAILABLE")


class View:
    def __init__(self, on_warn: threading.Event | None = None) -> None:
        self.ticks = 0
        self.warnings: list[str] = []
        self.on_warn = on_warn

    def show(self, report: TickReport, next_at: object) -> None:
        self.ticks += 1

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        if self.on_warn is not None:
            self.on_warn.set()  # the watcher is told to stop as the failure is shown


@pytest.mark.parametrize(("phase", "ends"), [(Phase.RUNNING, False), (Phase.WAITING_NODE, False),
                                             (Phase.HALTED, True), (Phase.DONE, True), (Phase.FAILED, True)])
def test_the_policy_says_when_watching_ends(phase: Phase, ends: bool) -> None:
    assert report(phase).decision.ends_watch is ends


def test_a_stop_cuts_short_the_wait_after_a_cloud_failure() -> None:
    stopping = threading.Event()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the sleep port: cut short by the stop, as a fleet's is
        waits.append(seconds)
        stopping.wait(seconds)

    ticks, view = Ticks(), View(on_warn=stopping)
    last = tick_loop(ticks, view, POLL, wait=lambda r, d: None, sleep=sleep, stop=lambda r: False,
                     stopping=stopping)
    assert last is ticks.first  # the last report seen, not an error
    assert ticks.ticks == 2 and waits == [POLL]  # the one wait after the failure, ended by the stop
    assert view.warnings == [f"cloud API failed (1/{MAX_CLOUD_FAILURES}): TPU API: UNAVAILABLE"]


def test_without_a_stop_the_cloud_failures_run_to_their_limit_through_the_port() -> None:
    waits: list[float] = []
    ticks, view = Ticks(), View()
    with pytest.raises(CloudError):
        tick_loop(ticks, view, POLL, wait=lambda r, d: None, sleep=waits.append, stop=lambda r: False)
    assert ticks.ticks == 1 + MAX_CLOUD_FAILURES
    assert waits == [POLL] * (MAX_CLOUD_FAILURES - 1)  # one per survived failure; the last is raised


def test_the_policy_setting_is_the_loops_tolerance_of_cloud_failures() -> None:
    pcfg = PolicyConfig(job="j", tpu_name="t", zones=("us-central2-b",), cloud_failures=3)
    waits: list[float] = []
    ticks, view = Ticks(), View()
    with pytest.raises(CloudError):
        tick_loop(ticks, view, POLL, wait=lambda r, d: None, sleep=waits.append, stop=lambda r: False,
                  cloud_failures=pcfg.cloud_failures)
    assert ticks.ticks == 1 + 3 and waits == [POLL, POLL]
    assert view.warnings[-1] == "cloud API failed (2/3): TPU API: UNAVAILABLE"
