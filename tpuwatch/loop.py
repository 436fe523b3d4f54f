"""Tick after tick: the one loop of `watch`, the demo and the goodput benchmark.

- `next_delay`: how long until the next tick, from the decision alone (its deadline, and whether
  its row is steady), never from row names.
- `Pacer.wait`: the wait between ticks. While the node is down and the job waits for it to heal,
  the API is asked once per poll_interval (or at the policy's own deadline, if sooner), and in
  between worker 0's SSH port gets a TCP connect every PORT_PROBE_EVERY seconds, which costs no
  API quota. When the port answers after having been closed, the wait ends at once, so the next
  tick confirms with the API and relaunches without waiting out the poll.
  While the attempt runs steadily (policy/observe.py `follow_workers`), the workers hold one
  follow channel each (`Workers.follow_ends`), and the wait ends the moment one reports its
  attempt's end: the next tick probes, stops the others and decides at once, not at the poll.
- `tick_loop`: tick, show, stop or wait; a cloud API that fails after its own retries is
  survived for MAX_CLOUD_FAILURES ticks in a row.
No recovery rule lives here: what to do is tpuwatch.policy's to say; this only paces.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Protocol

from tpuwatch.errors import EXIT_CLOUD, CloudError
from tpuwatch.policy.observe import follow_workers, probe_port_due
from tpuwatch.ports import JobPorts
from tpuwatch.tick import TickReport

MAX_CLOUD_FAILURES = 10  # ticks in a row the cloud API may fail (after its own retries) before exit 3
PORT_PROBE_EVERY = 0.5  # seconds between TCP probes of a down node: quicker than a 1 s retry loop


class Ticker(Protocol):
    def tick(self) -> TickReport: ...


class View(Protocol):
    ticks: int  # reports shown so far

    def show(self, report: TickReport, next_at: object) -> None: ...

    def warn(self, text: str) -> None: ...


def next_delay(report: TickReport, poll: float) -> float:
    """Seconds to the next tick: the poll interval while all is well, faster while it is not."""
    d = report.decision
    if d.deadline is not None:  # the policy named its time (backoff, queued retry, repair deadline)
        return max(min(poll, (d.deadline - report.time).total_seconds()), 0.05)
    return max(poll if d.steady else min(poll, max(poll / 6, 1.0) if poll >= 1 else poll), 0.05)


class Pacer:
    """The wait between ticks for one job (see the module's docstring)."""

    def __init__(self, ports: JobPorts, poll_interval: float, *, dry_run: bool = False) -> None:
        self.ports = ports
        self.poll = poll_interval
        self.dry_run = dry_run
        self.port_probes = 0  # TCP probes made so far (they cost no API quota)
        self.woken = 0  # waits ended early by a worker's attempt ending
        self._closed_seen = False  # a probe found the port closed since it last answered
        self._ended = threading.Event()  # set from a follow channel's thread

    def wait(self, report: TickReport, delay: float) -> float:
        """Sleep until the next tick, `delay` seconds at most; return the seconds waited."""
        ports = self.ports
        start = ports.clock()
        if self._follow(report):
            # An end seen during the tick has set it already: then the next tick is now.
            if self._ended.wait(max(delay, 0.0)):
                self._ended.clear()
                self.woken += 1
            return ports.clock() - start
        target = self._probe_target(report)
        if target is None:
            self._closed_seen = False
            ports.sleep(delay)
            return ports.clock() - start
        host, port = target
        every = min(PORT_PROBE_EVERY, max(self.poll / 6, 0.05))
        longest = max(delay, self._until_deadline(report))
        while True:
            self.port_probes += 1
            if ports.port_open(host, port, max(0.2, min(every, 1.0))):
                if self._closed_seen:
                    self._closed_seen = False
                    return ports.clock() - start
                # The port answers while the API says the node is down: probes tell nothing
                # new, so wait as before and let the API decide.
                left = delay - (ports.clock() - start)
                if left > 0:
                    ports.sleep(left)
                return ports.clock() - start
            self._closed_seen = True
            left = longest - (ports.clock() - start)
            if left <= 0:
                return ports.clock() - start
            ports.sleep(min(every, left))

    def interrupt(self) -> None:
        """End the current or next wait now (a watcher of several jobs stopping one of them)."""
        self._ended.set()

    def _follow(self, report: TickReport) -> bool:
        """Hold the follow channels the policy asks for; True when an end can wake this wait."""
        workers = () if self.dry_run else follow_workers(report.memory, report.node, report.probes)
        if not workers or report.node is None:
            self.ports.workers.unfollow()
            self._ended.clear()  # an end of what is no longer followed: the tick has seen it
            return False
        return self.ports.workers.follow_ends(report.node, report.memory.attempt, workers, self._ended.set)

    def _until_deadline(self, report: TickReport) -> float:
        """A poll, or less when the decision has a deadline sooner."""
        deadline = report.decision.deadline
        if deadline is None:
            return self.poll
        return min(self.poll, max((deadline - report.time).total_seconds(), 0.05))

    def _probe_target(self, report: TickReport) -> tuple[str, int] | None:
        """Worker 0's SSH address while the job waits for a down node, when a TCP probe can follow."""
        node = report.node
        if node is None or self.dry_run or not probe_port_due(report.memory, node):
            return None
        return self.ports.workers.port_target(node)


def tick_loop(rec: Ticker, view: View, poll: float, *, wait: Callable[[TickReport, float], object],
              stop: Callable[[TickReport], bool], on_report: Callable[[TickReport], None] | None = None,
              first_failure_fatal: bool = True, port_probes: Callable[[], int] | None = None) -> TickReport:
    """Tick until `stop(report)`; show each report; `wait(report, delay)` between.

    A cloud API that fails after its own retries is survived for MAX_CLOUD_FAILURES ticks in a
    row (a warning each), except on the very first tick when `first_failure_fatal` (a wrong
    project is better said at once); errors that are not the cloud's end it at once.
    `port_probes` (a Pacer's count) is stamped on each report for the view and `--json`.
    """
    failures = 0
    while True:
        try:
            report = rec.tick()
            failures = 0
        except CloudError as exc:
            failures += 1
            if (first_failure_fatal and failures == 1 and view.ticks == 0) or failures >= MAX_CLOUD_FAILURES \
                    or exc.exit_code != EXIT_CLOUD:
                raise
            view.warn(f"cloud API failed ({failures}/{MAX_CLOUD_FAILURES}): {exc.message}")
            time.sleep(poll)
            continue
        if port_probes is not None:
            report = replace(report, port_probes=port_probes())
        if on_report is not None:
            on_report(report)
        delay = next_delay(report, poll)
        view.show(report, report.time + timedelta(seconds=delay))
        if stop(report):
            return report
        wait(report, delay)
