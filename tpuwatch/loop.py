"""Tick after tick: the one loop of `watch`, of a watcher of several jobs, of the demo and of the
goodput benchmark (`run_job`).

- `next_delay`: how long until the next tick, from the decision alone (its deadline, and whether
  its row is steady), never from row names.
- `Pacer.wait`: the wait between ticks. While the node is down and the job waits for it to heal,
  the API is asked once per poll_interval (or at the policy's own deadline, if sooner), and in
  between worker 0's SSH port gets a TCP connect every PORT_PROBE_EVERY seconds, which costs no
  API quota. When the port answers after having been closed, the wait ends at once, so the next
  tick confirms with the API and relaunches without waiting out the poll. When the port answers
  while the API still says the node is down (a VM's SSH answers as it boots; the API says READY
  once the TPU's health checks pass), the waits of that down spell start at PORT_PROBE_EVERY and
  double up to the poll: a few API calls per heal, instead of a whole poll_interval lost
  whenever SSH comes back first.
  While the attempt runs steadily (policy/observe.py `follow_workers`), the workers hold one
  follow channel each (`Workers.follow_ends`), and the wait ends the moment one reports its
  attempt's end: the next tick probes, stops the others and decides at once, not at the poll.
- `tick_loop`: tick, show, stop or wait; a cloud API that fails after its own retries is
  survived for the policy's `cloud_failures` ticks in a row (PolicyConfig).
- `run_job`: the Reconciler and the Pacer of one job, its outputs, and `tick_loop` until the
  policy ends the watch (`Decision.ends_watch`) or the caller stops it; what differs between
  callers (a tick slot, the poll grid, a story played between ticks) is passed in.
Every wait goes through the ports (`sleep`, `wait_for`), so a stop or a virtual clock reaches it.
No recovery rule lives here: what to do is tpuwatch.policy's to say; this only paces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import timedelta
from typing import Protocol

from tpuwatch.config import Config
from tpuwatch.errors import EXIT_CLOUD, CloudError
from tpuwatch.journal import Journal
from tpuwatch.policy.observe import follow_workers, probe_port_due
from tpuwatch.policy.values import CLOUD_FAILURES, PolicyConfig
from tpuwatch.ports import Flags, JobPorts
from tpuwatch.tick import Reconciler, TickReport

PORT_PROBE_EVERY = 0.5  # seconds between TCP probes of a down node: quicker than a 1 s retry loop
FLUSH_ON_EXIT = 2.0  # seconds the alerts still unsent may take when watching ends early (Ctrl-C, an error)


class Ticker(Protocol):
    def tick(self) -> TickReport: ...


class View(Protocol):
    ticks: int  # reports shown so far

    def show(self, report: TickReport, next_at: object) -> None: ...

    def warn(self, text: str) -> None: ...


class Outputs(Protocol):
    """What a job reports besides its view: alerts and metrics (tpuwatch.outputs.Outputs)."""

    def start(self, journal: Journal) -> object: ...

    def after_tick(self, report: TickReport) -> list[str]: ...

    def close(self, report: TickReport | None = None, flush: float = ...) -> list[str]: ...


def next_delay(report: TickReport, poll: float) -> float:
    """Seconds to the next tick: the poll interval while all is well, faster while it is not."""
    d = report.decision
    if d.deadline is not None:  # the policy named its time (backoff, queued retry, repair deadline)
        return max(min(poll, (d.deadline - report.time).total_seconds()), 0.05)
    return max(poll if d.steady else min(poll, max(poll / 6, 1.0) if poll >= 1 else poll), 0.05)


class Pacer:
    """The wait between ticks for one job (see the module's docstring).

    `woken` is the event that ends a follow wait: the follow channels set it, and so may the
    caller (a watcher of several jobs that stops watching this one)."""

    def __init__(self, ports: JobPorts, poll_interval: float, *, dry_run: bool = False,
                 woken: threading.Event | None = None) -> None:
        self.ports = ports
        self.poll = poll_interval
        self.dry_run = dry_run
        self.port_probes = 0  # TCP probes made so far (they cost no API quota)
        self.woken = 0  # waits ended early by a worker's attempt ending
        self._closed_seen = False  # a probe found the port closed since it last answered
        self._open_seen = False  # the port answered since the node was last seen up
        self._after_open: float | None = None  # the next wait's length while those back off
        self._ended = woken if woken is not None else threading.Event()  # set from a follow channel's thread

    def wait(self, report: TickReport, delay: float) -> float:
        """Sleep until the next tick, `delay` seconds at most; return the seconds waited."""
        ports = self.ports
        start = ports.clock()
        if report.node is not None and report.node.usable:  # a down spell, if any, is over
            self._open_seen, self._after_open = False, None
        if self._follow(report):
            # An end seen during the tick has set it already: then the next tick is now.
            if ports.wait_for(self._ended, max(delay, 0.0)):
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
                    self._open_seen, self._after_open = True, every
                    return ports.clock() - start
                # The port answers while the API says the node is down: probes tell nothing
                # new. The first times the API is asked again soon, backing off; then as before.
                if not self._open_seen:
                    self._open_seen, self._after_open = True, every
                wait = delay
                if self._after_open is not None:
                    wait = min(self._after_open, delay)
                    self._after_open = self._after_open * 2 if self._after_open * 2 < delay else None
                left = wait - (ports.clock() - start)
                if left > 0:
                    ports.sleep(left)
                return ports.clock() - start
            self._closed_seen = True
            left = longest - (ports.clock() - start)
            if left <= 0:
                return ports.clock() - start
            ports.sleep(min(every, left))

    def _follow(self, report: TickReport) -> bool:
        """Hold the follow channels the policy asks for; True when an end can wake this wait."""
        workers = () if self.dry_run else follow_workers(report.memory, report.node, report.probes)
        if not workers or report.node is None:
            self.ports.workers.unfollow()
            self._ended.clear()  # an end of what is no longer followed: the tick has seen it
            return False
        self.ports.workers.follow_ends(report.node, report.memory.attempt.number, workers, self._ended.set)
        return True

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
              sleep: Callable[[float], None], stop: Callable[[TickReport], bool],
              stopping: threading.Event | None = None, on_report: Callable[[TickReport], None] | None = None,
              first_failure_fatal: bool = True, port_probes: Callable[[], int] | None = None,
              cloud_failures: int = CLOUD_FAILURES) -> TickReport:
    """Tick until `stop(report)` or `stopping` is set; show each report; `wait(report, delay)` between.

    A cloud API that fails after its own retries is survived for `cloud_failures` ticks in a
    row (run_job passes the policy's PolicyConfig.cloud_failures; a warning each, then a poll
    through `sleep`), except on the very first tick when
    `first_failure_fatal` (a wrong project is better said at once); errors that are not the
    cloud's end it at once. `stopping` set during such a run ends it with the last report.
    `port_probes` (a Pacer's count) is stamped on each report for the view and `--json`.
    """
    failures = 0
    last: TickReport | None = None
    while True:
        try:
            report = rec.tick()
            failures = 0
        except CloudError as exc:
            failures += 1
            if (first_failure_fatal and failures == 1 and view.ticks == 0) or failures >= cloud_failures \
                    or exc.exit_code != EXIT_CLOUD:
                raise
            view.warn(f"cloud API failed ({failures}/{cloud_failures}): {exc.message}")
            sleep(poll)
            if stopping is not None and stopping.is_set():
                if last is None:
                    raise
                return last
            continue
        if port_probes is not None:
            report = replace(report, port_probes=port_probes())
        last = report
        if on_report is not None:
            on_report(report)
        delay = next_delay(report, poll)
        view.show(report, report.time + timedelta(seconds=delay))
        if stop(report) or (stopping is not None and stopping.is_set()):
            return report
        wait(report, delay)


def _never(report: TickReport) -> bool:
    return False


def run_job(cfg: Config, pcfg: PolicyConfig, ports: JobPorts, journal: Journal, flags: Flags, view: View, *,
            outputs: Outputs | None = None, after_tick: Callable[[TickReport], None] | None = None,
            stop: Callable[[TickReport], bool] = _never, stopping: threading.Event | None = None,
            woken: threading.Event | None = None,
            slot: Callable[[], AbstractContextManager[object]] = nullcontext,
            delay: Callable[[float], float] | None = None,
            wait: Callable[[TickReport, float], object] | None = None,
            first_failure_fatal: bool = True) -> TickReport:
    """Watch one job: tick, show, report to `outputs` and `after_tick`, wait, until the policy
    ends the watch (`Decision.ends_watch`), a dry run has ticked once, `stop(report)` says so
    or `stopping` is set; the last report. The workers' channels and the outputs are closed
    however it ends (what is unsent has FLUSH_ON_EXIT seconds).

    What differs between callers: `slot`, a context each tick runs in (a watcher of several
    jobs: one of its tick slots); `delay`, the wait the Pacer is given for the one the policy
    asks (the zone's poll grid); `wait`, instead of the Pacer's (the demo plays its story
    between ticks); `stopping`, an event that ends watching from another thread, with
    `woken`, the Pacer's event it also sets to end a follow wait at once.
    """
    poll = pcfg.poll_interval
    rec = Reconciler(cfg, pcfg, ports, journal, flags)
    pacer = Pacer(ports, poll, dry_run=flags.dry_run, woken=woken)

    class _Slotted:
        def tick(self) -> TickReport:
            with slot():
                return rec.tick()

    def on_report(report: TickReport) -> None:
        if outputs is not None:
            for line in outputs.after_tick(report):
                view.warn(line)
        if after_tick is not None:
            after_tick(report)

    def ends(report: TickReport) -> bool:
        return report.decision.ends_watch or flags.dry_run or stop(report)

    def between(report: TickReport, wanted: float) -> None:
        if wait is not None:
            wait(report, wanted)
        else:
            pacer.wait(report, delay(wanted) if delay is not None else wanted)

    if outputs is not None:
        outputs.start(journal)
    try:
        report = tick_loop(_Slotted(), view, poll, wait=between, sleep=ports.sleep, stop=ends, stopping=stopping,
                           on_report=on_report, first_failure_fatal=first_failure_fatal,
                           port_probes=lambda: pacer.port_probes, cloud_failures=pcfg.cloud_failures)
        if outputs is not None:
            for line in outputs.close(report):
                view.warn(line)
        return report
    finally:
        if outputs is not None:
            outputs.close(flush=FLUSH_ON_EXIT)  # nothing more after a close above
        ports.workers.close()  # follow channels and shared SSH connections
