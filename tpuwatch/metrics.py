"""Prometheus metrics of one job: served by `watch --metrics-port`, written by `check --metrics-file`.

Rules of this module:
- The numbers come from what the tick reports and the journal keeps; after each tick the main
  thread makes an immutable `Snapshot` and the exporter serves the newest one, so a scrape never
  touches the journal (whose connection belongs to the main thread) and never waits on a tick.
- Names follow Prometheus conventions: `tpuwatch_` prefix, base units in the name (`_seconds`,
  `_ratio`), `_total` for counters; every series carries `job_name` (Prometheus' own `job` label
  names the scrape job).
- `/healthz` answers 200 while ticks keep coming and 503 once the last one began longer ago
  than HEALTHY_POLLS poll intervals plus the slowest tick the code allows (`longest_tick`), so
  an honest slow tick never turns a readiness probe red.
- It serves no secret: no URL, no token, no command line.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from tpuwatch.cloud import calls
from tpuwatch.cloud.apis import RPC_TIMEOUT
from tpuwatch.cloud.retry import RetryPolicy
from tpuwatch.config import Config
from tpuwatch.errors import UsageError
from tpuwatch.journal import AttemptRow, Journal, JournalEvent
from tpuwatch.policy import Phase, PolicyConfig
from tpuwatch.policy.alerts import disruption_kind
from tpuwatch.policy.spares import unfit
from tpuwatch.report import compute

# time from an attempt's end (not a success) to the next launch, seconds
RESUME_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)
HEALTHY_POLLS = 3
# Cloud calls one tick may make in a row at most: the node (a multislice job: a get per slice,
# counted as one list here), the operation, the queued resource, the audit log, one delete or create.
TICK_API_CALLS = 5
MIN_RATE_SPAN = 1.0  # seconds: an attempt shorter than this tells nothing of the step time


@dataclass(frozen=True)
class Snapshot:
    """One job's numbers after a tick."""

    job: str
    time: datetime  # of the tick
    phase: str
    attempt: int
    restarts: int  # budget in use (since the last stable run)
    max_restarts: int
    recreates: int
    max_recreates: int
    restarts_charged_total: int  # charged attempt ends, ever
    recreates_total: int  # nodes created by tpuwatch, ever
    disruptions: Mapping[str, int]  # kind -> attempts ended by one
    checkpoint_step: int | None
    checkpoint_time: datetime | None
    resumes: tuple[float, ...]  # seconds from each interrupted attempt's end to the next launch
    goodput: float | None
    api_requests: Mapping[tuple[str, str], int] = field(default_factory=dict)
    api_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # a multislice job: its slices, and those its attempts run on (fewer while it limps)
    slices: int = 0
    slices_in_use: int = 0
    # a job with spares (tpu.spares): how many, how many could stand in for a slice now, and the
    # slices that run on one
    spares: int = 0
    spares_ready: int = 0
    slices_swapped: int = 0
    # a job with a priority (job.priority; None: off): its slots lent to a job of higher priority,
    # and the nodes it took from one of lower priority (policy/priority.py)
    priority: int | None = None
    slots_lent: int = 0
    nodes_taken: int = 0
    # a job of a spare pool (tpu.spare_pool): its name, and the pool's nodes as the tick listed
    # them, each with the job that holds it ("" idle) and, idle, why it cannot be claimed ("" it can)
    pool: str = ""
    pool_nodes: tuple[tuple[str, str, str], ...] = ()


def goodput(job: str, events: Sequence[JournalEvent], attempts: Sequence[AttemptRow], now: datetime) -> float | None:
    """The job's goodput as `tpuwatch report` computes it (productive training over wall time,
    tpuwatch/report.py): one definition, so a dashboard and the report never disagree."""
    return compute(job, events, attempts, now).goodput


def resumes(attempts: Sequence[AttemptRow]) -> tuple[float, ...]:
    """Seconds from each attempt that ended other than in success to the next launch."""
    out = []
    for a, b in zip(attempts, attempts[1:], strict=False):
        if a.end is not None and a.outcome != "success":
            out.append(max(0.0, (b.start - a.end).total_seconds()))
    return tuple(out)


def snapshot(report: Any, journal: Journal, pcfg: PolicyConfig,
             api_requests: Mapping[tuple[str, str], int] | None = None,
             api_errors: Mapping[tuple[str, str], int] | None = None) -> Snapshot:
    """The numbers after a tick (`report`: tpuwatch.tick.TickReport), from it and the journal."""
    attempts = journal.attempts()
    mem = report.memory
    disruptions: dict[str, int] = {}
    for a in attempts:
        if a.outcome == "disruption":
            kind = disruption_kind(a.reason)
            disruptions[kind] = disruptions.get(kind, 0) + 1
    created = sum(1 for op in journal.operations() if op.kind == "create" and op.finished and not op.error_code)
    ck = report.checkpoint
    return Snapshot(
        job=pcfg.job, time=report.time, phase=mem.phase.value, attempt=mem.attempt.number,
        restarts=mem.budgets.restarts, max_restarts=pcfg.max_restarts, recreates=mem.budgets.recreates,
        max_recreates=pcfg.max_recreates,
        restarts_charged_total=sum(1 for a in attempts if a.charged),
        recreates_total=created, disruptions=disruptions,
        checkpoint_step=ck.step if ck is not None else None, checkpoint_time=ck.time if ck is not None else None,
        resumes=resumes(attempts), goodput=goodput(pcfg.job, journal.events(), attempts, report.time),
        api_requests=dict(calls.counts() if api_requests is None else api_requests),
        api_errors=dict(calls.errors() if api_errors is None else api_errors),
        slices=len(pcfg.slices), slices_in_use=len(mem.limp.kept(pcfg.slices)),
        spares=len(pcfg.spares), slices_swapped=len(mem.limp.swapped),
        spares_ready=sum(1 for _, part in report.spares
                         if not unfit(pcfg.job, report.node, part, mem.limp.bad)) if pcfg.spares else 0,
        priority=pcfg.priority, slots_lent=len(mem.limp.lent), nodes_taken=len(mem.limp.took),
        pool=pcfg.spare_pool, pool_nodes=tuple(getattr(report, "pool", ())) if pcfg.spare_pool else (),
    )


def families(s: Snapshot, now: datetime, *, api: bool = True) -> Iterator[Metric]:
    """The metric families of a snapshot; `now` for ages (`api`: with this process's API requests)."""
    job = [s.job]
    phase = GaugeMetricFamily("tpuwatch_job_phase", "1 for the phase the job is in (tpuwatch policy phases)",
                              labels=["job_name", "phase"])
    for p in Phase:
        phase.add_metric([s.job, p.value], 1.0 if p.value == s.phase else 0.0)
    yield phase
    yield _gauge("tpuwatch_job_attempt", "number of the latest attempt launched", s.attempt, job)
    yield _gauge("tpuwatch_restart_budget_used", "charged restarts counted against recovery.max_restarts "
                 "(since the last stable run)", s.restarts, job)
    yield _gauge("tpuwatch_restart_budget", "recovery.max_restarts", s.max_restarts, job)
    yield _gauge("tpuwatch_recreate_budget_used", "delete+create cycles counted against recovery.max_recreates "
                 "(since the last stable run)", s.recreates, job)
    yield _gauge("tpuwatch_recreate_budget", "recovery.max_recreates", s.max_recreates, job)
    yield _counter("tpuwatch_restarts_charged", "attempt ends charged as failures", s.restarts_charged_total, job)
    yield _counter("tpuwatch_recreates", "nodes tpuwatch created again", s.recreates_total, job)
    dis = CounterMetricFamily("tpuwatch_disruptions", "attempts ended by a disruption (never charged), by kind",
                              labels=["job_name", "kind"])
    for kind, n in sorted(s.disruptions.items()):
        dis.add_metric([s.job, kind], float(n))
    yield dis
    if s.checkpoint_step is not None:
        yield _gauge("tpuwatch_checkpoint_step", "step of the newest complete checkpoint", s.checkpoint_step, job)
    if s.checkpoint_time is not None:
        yield _gauge("tpuwatch_checkpoint_age_seconds", "age of the newest complete checkpoint",
                     max(0.0, (now - s.checkpoint_time).total_seconds()), job)
        yield _gauge("tpuwatch_checkpoint_timestamp_seconds", "when the newest complete checkpoint was written",
                     s.checkpoint_time.timestamp(), job)
    hist = HistogramMetricFamily("tpuwatch_time_to_resume_seconds", "from the end of an attempt that did not "
                                 "succeed to the launch of the next one", labels=["job_name"])
    buckets = [(floatToGoString(le), float(sum(1 for r in s.resumes if r <= le))) for le in RESUME_BUCKETS]
    buckets.append(("+Inf", float(len(s.resumes))))
    hist.add_metric(job, buckets, sum_value=float(sum(s.resumes)))
    yield hist
    if s.goodput is not None:
        yield _gauge("tpuwatch_goodput_ratio", "productive training time / wall time since the first launch, as `tpuwatch report` "
                     "computes it", s.goodput, job)
    if s.slices:
        yield _gauge("tpuwatch_slices", "a multislice job's slices (tpu.names)", s.slices, job)
        yield _gauge("tpuwatch_slices_in_use", "the slices its attempts run on: fewer while it limps "
                     "(job.min_slices)", s.slices_in_use, job)
    if s.spares:
        yield _gauge("tpuwatch_spares", "a multislice job's hot spares (tpu.spares)", s.spares, job)
        yield _gauge("tpuwatch_spares_ready", "its idle nodes that could stand in for a lost slice now (READY+HEALTHY, "
                     "owned, of its shape, not failed their checks)", s.spares_ready, job)
        yield _gauge("tpuwatch_slices_swapped", "its slices that run on a spare (or a node swapped out before) "
                     "instead of their own node", s.slices_swapped, job)
    if s.priority is not None:
        yield _gauge("tpuwatch_job_priority", "job.priority (a job of higher priority may take a node of one of "
                     "lower priority)", s.priority, job)
        yield _gauge("tpuwatch_slots_lent", "its slots whose node it lent to a job of higher priority, not given "
                     "a node back yet", s.slots_lent, job)
        yield _gauge("tpuwatch_nodes_taken", "the nodes it runs on that it took from a job of lower priority, "
                     "not traded back yet", s.nodes_taken, job)
    if s.pool:
        yield from pool_families(s)
    if api:
        yield from api_families(s.job, s.api_requests, s.api_errors)
    yield _gauge("tpuwatch_last_tick_timestamp_seconds", "when the last tick began", s.time.timestamp(), job)


def pool_families(s: Snapshot) -> Iterator[GaugeMetricFamily]:
    """A job's spare pool as its tick listed it: how many nodes, how many idle, and who holds each."""
    labels = ["job_name", "pool"]
    for name, doc, value in (
            ("tpuwatch_spare_pool_nodes", "the nodes of the job's spare pool (tpu.spare_pool) as listed: "
             "labelled tpuwatch-pool=<pool>, idle or held by a job", len(s.pool_nodes)),
            ("tpuwatch_spare_pool_idle", "its idle spares a job can claim now: no job's label, READY+HEALTHY, "
             "not marked tpuwatch-pool-bad (0: a job that loses a node now finds none there)",
             sum(1 for _, job, why in s.pool_nodes if not job and not why))):
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric([s.job, s.pool], float(value))
        yield g
    held = GaugeMetricFamily("tpuwatch_spare_pool_node", "1 for each node of the pool, with the job that holds "
                             "it (held_by, \"\" when idle)", labels=[*labels, "node", "held_by"])
    for node, job, _ in s.pool_nodes:
        held.add_metric([s.job, s.pool, node, job], 1.0)
    yield held


def api_families(job: str, requests: Mapping[tuple[str, str], int],
                 errors: Mapping[tuple[str, str], int]) -> Iterator[CounterMetricFamily]:
    for name, doc, counts in (("tpuwatch_api_requests", "requests sent to Google APIs (retries included)", requests),
                              ("tpuwatch_api_errors", "requests to Google APIs that raised: an HTTP error, a timeout "
                               "(retries included)", errors)):
        fam = CounterMetricFamily(name, doc, labels=["job_name", "api", "method"])
        for (api, method), n in sorted(counts.items()):
            fam.add_metric([job, api, method], float(n))
        yield fam


def merged(snaps: Sequence[Snapshot], now: datetime) -> Iterator[Metric]:
    """The families of several jobs of one watcher, each family once with every job's samples.

    The watcher's API requests serve every job at once (one list per zone), so they are one set
    of series with an empty `job_name`, not a copy per job.
    """
    out: dict[str, Metric] = {}
    for s in snaps:
        for fam in families(s, now, api=False):
            if fam.name in out:
                out[fam.name].samples.extend(fam.samples)
            else:
                out[fam.name] = fam
    yield from out.values()
    if snaps:
        newest = max(snaps, key=lambda s: s.time)
        yield from api_families("", newest.api_requests, newest.api_errors)


def _gauge(name: str, doc: str, value: float, labels: list[str]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["job_name"])
    g.add_metric(labels, float(value))
    return g


def _counter(name: str, doc: str, value: float, labels: list[str]) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["job_name"])
    c.add_metric(labels, float(value))
    return c


class _Collector:
    """A prometheus_client collector over the newest snapshot (None before the first tick), or,
    for a watcher of several jobs (`jobs`), the newest snapshot of each job."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.snap: Snapshot | None = None
        self.jobs: dict[str, Snapshot] | None = None
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        if self.jobs is not None:
            yield from merged(list(self.jobs.values()), self.clock())
            return
        snap = self.snap
        if snap is not None:
            yield from families(snap, self.clock())


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def registry_for(snap: Snapshot | None, clock: Callable[[], datetime] = _utcnow) -> tuple[CollectorRegistry, _Collector]:
    registry = CollectorRegistry(auto_describe=False)
    collector = _Collector(clock)
    collector.snap = snap
    registry.register(collector)  # type: ignore[arg-type]
    return registry, collector


# -- check --metrics-file ----------------------------------------------------------------------


def check_textfile_path(path: Path) -> Path:
    """Refuse a path that cannot work before the tick runs (exit 2 naming the flag)."""
    if not path.name.endswith(".prom"):
        raise UsageError(f"--metrics-file {str(path)!r}: node_exporter's textfile collector reads only *.prom "
                         "files; name it e.g. tpuwatch.prom")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--metrics-file {str(path)!r}: directory {str(parent)!r} does not exist; create it or "
                         "point at node_exporter's --collector.textfile.directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--metrics-file {str(path)!r}: directory {str(parent)!r} is not writable")
    if path.is_dir():
        raise UsageError(f"--metrics-file {str(path)!r} is a directory; name a file such as tpuwatch.prom")
    return path


def write_textfile(path: Path, report: Any, journal: Journal, pcfg: PolicyConfig) -> None:
    """Write the job's metrics in node_exporter's textfile format, atomically (a temporary file in
    the same directory, then a rename). API requests add up over runs (kept in the journal)."""
    with journal.transaction():
        requests = _added_up(journal, False, calls.counts())
        errors = _added_up(journal, True, calls.errors())
    registry, _ = registry_for(snapshot(report, journal, pcfg, requests, errors))
    try:
        write_to_textfile(str(path), registry)
    except OSError as exc:
        raise UsageError(f"--metrics-file {str(path)!r}: cannot write it: {exc.strerror or exc}") from None


def _added_up(journal: Journal, errors: bool, now: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Counts of earlier runs (kept in the journal) plus this run's, saved back."""
    total = journal.api_calls(errors)
    for k, n in now.items():
        total[k] = total.get(k, 0) + n
    journal.set_api_calls(total, errors)
    return total


# -- watch --metrics-port ----------------------------------------------------------------------


def longest_tick(cfg: Config) -> float:
    """The longest one tick may take, every wait at its bound: its cloud calls, each retried for
    RetryPolicy.max_delay; the probe of every worker; the launch-time checks, the cleanup of what
    they found and the checks again; a stop; and the launch, its unanswered workers tried
    SshWorkers.ssh_tries times with doubling waits between (a cleanup before each)."""
    from tpuwatch.workers.precheck import BASE_TIMEOUT
    from tpuwatch.workers.sshworkers import RETRY_WAIT, SSH_TRIES

    retry = RetryPolicy()
    api = TICK_API_CALLS * (retry.max_delay + retry.max_wait + RPC_TIMEOUT)
    probe = float(cfg.ssh["command_timeout"])
    check = BASE_TIMEOUT + sum(float(c["timeout"]) + 2 for c in cfg.precheck["custom"])
    cleanup = probe + 2 * float(cfg.recovery["stop_grace"]) + 10  # a stop, or a launch that cleans up first
    launch = SSH_TRIES * cleanup + sum(RETRY_WAIT * 2 ** n for n in range(SSH_TRIES - 1))
    return api + probe + check + cleanup + check + cleanup + launch


def stale_limit(poll_interval: float, longest: float) -> float:
    """Seconds without a tick after which /healthz says stale (see the module's docstring)."""
    return HEALTHY_POLLS * poll_interval + longest


class Exporter:
    """`/metrics` and `/healthz` over HTTP on all interfaces, in a thread of its own."""

    def __init__(self, port: int, source: str, stale_after: float | None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = _utcnow) -> None:
        self.registry, self.collector = registry_for(None, wall)
        # None: a watcher of several jobs, each with its own limit (`expect`)
        self.stale_after = stale_after or 0.0
        self.clock = clock
        self.last_tick = clock()  # starting up counts as ticking
        self._watched: dict[str, tuple[float, float]] = {}  # job -> (last tick, its stale limit)
        self._lock = threading.Lock()
        if stale_after is None:
            self.collector.jobs = {}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(exporter.registry))
                elif path == "/healthz":
                    ok, text = exporter.health()
                    self._send(200 if ok else 503, "text/plain; charset=utf-8", text.encode())
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # scrapes every 15 s would drown the watch's own lines

        try:
            self.server = ThreadingHTTPServer(("", port), Handler)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                why = "is in use" if exc.errno == errno.EADDRINUSE else "may not be bound by this user"
                raise UsageError(f"{source} {port}: the port {why} ({exc.strerror}); choose another port "
                                 "(or stop what listens there)") from None
            raise UsageError(f"{source} {port}: cannot listen: {exc.strerror or exc}") from None
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="tpuwatch-metrics", daemon=True)
        self._thread.start()

    def update(self, snap: Snapshot) -> None:
        jobs = self.collector.jobs
        if jobs is None:
            self.collector.snap = snap
            self.last_tick = self.clock()
            return
        with self._lock:
            jobs[snap.job] = snap
            if snap.job in self._watched:
                self._watched[snap.job] = (self.clock(), self._watched[snap.job][1])

    def expect(self, job: str, stale_after: float) -> None:
        """A watcher of several jobs: `job` is watched from now on (starting counts as ticking)."""
        with self._lock:
            self._watched[job] = (self.clock(), stale_after)

    def forget(self, job: str) -> None:
        """`job` is no longer watched (finished, or its config removed): its last numbers stay served,
        its ticks are no longer expected."""
        with self._lock:
            self._watched.pop(job, None)

    def health(self) -> tuple[bool, str]:
        """/healthz: ticks keep coming (for several jobs: for every job watched)."""
        now = self.clock()
        if self.collector.jobs is None:
            age = now - self.last_tick
            ok = age <= self.stale_after
            return ok, f"{'ok' if ok else 'stale'}: last tick {age:.0f}s ago (limit {self.stale_after:.0f}s)\n"
        with self._lock:
            watched = dict(self._watched)
        stale = sorted(job for job, (last, limit) in watched.items() if now - last > limit)
        if stale:
            return False, f"stale: no tick within the limit for {', '.join(stale)}\n"
        return True, f"ok: {len(watched)} job(s) ticking\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
