"""Alerts to the [[notify]] webhooks: derived after each tick, journaled, then sent in the background.

Rules of this module:
- Derived, not decided: after a tick, the journal events it wrote (and the maintenance notice it
  saw) become alerts by `tpuwatch.policy.alerts`; the tick itself knows nothing of alerts.
- Write-ahead and idempotent: each alert is recorded in the job's journal (table `deliveries`,
  keyed by an idempotency key derived from the journal event, one row per target) in the same
  transaction that moves the journal's alert bookmark past its event. A watcher killed at any
  point loses nothing (unsent rows are sent by the next `watch` or `check`, which holds the
  job's lock) and derives nothing twice. The one window left, a kill between the server's
  answer and the row being marked sent, is covered by the key: it goes out as the
  `Idempotency-Key` header, the json `id`, and Google Chat's `requestId` (Chat answers a repeated
  request id with the message it already made).
- Never holds a tick up: sending happens in a thread of its own, with its own SQLite
  connection, retried with tenacity (honouring Retry-After on 429); `check` waits for it at most
  FLUSH_SECONDS after its tick, then leaves what is unsent for the next run.
- Secrets: the URL (a webhooks.Secret) is used only to make the request. Targets are named
  `notify[i] (format)` everywhere; error texts are scrubbed of the URL and its host.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from tpuwatch import __version__
from tpuwatch.config import Config
from tpuwatch.journal import DeliveryRow, Journal
from tpuwatch.policy import alerts
from tpuwatch.webhooks import Secret, resolve_webhook

HTTP_TIMEOUT = 10.0  # seconds per request: a server that hangs costs this, in the sender thread
TRIES_PER_ROUND = 4  # requests per delivery before it waits for a later round
LONGEST_WAIT_IN_ROUND = 30.0  # a Retry-After longer than this moves the delivery to a later round
RETRY_AFTER_CAP = 3600.0  # a longer Retry-After is taken as this
MAX_AGE = timedelta(hours=24)  # an alert still unsent after this is given up: it would be noise
FLUSH_SECONDS = 15.0  # how long `check` (and `watch` on its way out) waits for sending
MAX_BODY = 64 * 1024


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Target:
    index: int
    format: str  # slack, chat, json
    on: frozenset[str]
    url: Secret

    @property
    def name(self) -> str:
        return f"notify[{self.index}] ({self.format})"


class SendError(Exception):
    """A request that did not deliver; `detail` never holds the URL."""

    def __init__(self, detail: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.transient = transient
        self.retry_after = retry_after


def targets_from_config(cfg: Config) -> tuple[Target, ...]:
    """The [[notify]] tables with their URLs read from the environment (exit 2 naming the key)."""
    return tuple(Target(i, str(t["format"]), frozenset(t["on"]), resolve_webhook(f"notify[{i}].url", t["url"]))
                 for i, t in enumerate(cfg.notify))


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return min(max(float(value), 0.0), RETRY_AFTER_CAP)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return min(max((when - now).total_seconds(), 0.0), RETRY_AFTER_CAP)


def payload(target: Target, row: DeliveryRow) -> dict[str, Any]:
    """The request body: Slack and Google Chat show `text`; json gets every field."""
    if target.format in ("slack", "chat"):
        return {"text": row.text}
    return {**row.data, "id": row.key, "kind": row.kind, "time": row.time.isoformat(), "text": row.text}


def _scrub(text: str, url: str) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    for secret in (url, host):
        if secret:
            text = text.replace(secret, "<webhook>")
    return text


def post(target: Target, row: DeliveryRow, *, timeout: float = HTTP_TIMEOUT,
         now: Callable[[], datetime] = utcnow) -> None:
    """One POST of `row` to `target`; SendError (transient or not) when it was not accepted."""
    url = target.url.reveal()
    if target.format == "chat":  # Google Chat's spaces.messages.create: a repeated requestId is a no-op
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.urlencode([*urllib.parse.parse_qsl(parts.query), ("requestId", row.key)])
        url = urllib.parse.urlunsplit(parts._replace(query=query))
    body = json.dumps(payload(target, row), sort_keys=True).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json; charset=UTF-8", "Idempotency-Key": row.key,
        "User-Agent": f"tpuwatch/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http/https checked)
            response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        after = retry_after_seconds(exc.headers.get("Retry-After") if exc.headers else None, now())
        # 408/425/429 and 5xx may succeed later; any other 4xx (a revoked webhook: 403/404) will not
        transient = exc.code in (408, 425, 429) or exc.code >= 500
        raise SendError(f"HTTP {exc.code}" + (f", Retry-After {after:g}s" if after is not None else ""),
                        transient=transient, retry_after=after) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        what = "timed out" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else str(reason)
        raise SendError(_scrub(f"{type(exc).__name__}: {what}"[:200], target.url.reveal()),
                        transient=True) from None


class Notifier:
    """Derives alerts after each tick (main thread) and sends them (its own thread).

    Use: `n = Notifier(journal, targets, job, node, zone)`; `n.start()`; after each tick
    `n.after_tick(report)`; at the end `n.close(FLUSH_SECONDS)`. `take_warnings()` says what
    could not be sent, for the dashboard or `check`'s output.
    """

    def __init__(self, journal: Journal, targets: Sequence[Target], job: str, node: str, zone: str, *,
                 timeout: float = HTTP_TIMEOUT, backoff: float = 1.0,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.journal = journal
        self.targets = {t.index: t for t in targets}
        self.where = alerts.Where(job, node, zone)
        self.timeout = timeout
        self.backoff = backoff  # scales the waits between tries (tests use a small one)
        self.now = now
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._asked = 0  # flush generations asked for / completed by the sender
        self._done = 0
        self._warnings: list[str] = []
        self._thread: threading.Thread | None = None
        with journal.transaction():  # a new [[notify]] on an old journal: from now on, not its history
            if journal.alert_bookmark() is None:
                last = journal.events(limit=1)
                journal.set_alert_bookmark(last[-1].id if last else 0)

    # -- main thread ----------------------------------------------------------------------------

    def after_tick(self, report: Any) -> int:
        """Journal the alerts this tick's events make (one row per target that wants them); wake
        the sender. Returns the rows added. Local SQLite only: it never waits on the network."""
        node = getattr(report, "node", None) if report is not None else None
        memory = getattr(report, "memory", None)
        zone = getattr(memory, "zone", "") or self.where.zone
        where = alerts.Where(self.where.job, self.where.node, zone)
        added = 0
        now = self.now()
        with self.journal.transaction():
            last = self.journal.alert_bookmark() or 0
            found: list[alerts.Alert] = []
            newest = last
            for ev in self.journal.events_after(last):
                newest = max(newest, ev.id)
                if now - ev.time > MAX_AGE:
                    continue  # a journal picked up again after a long pause: not news
                alert = alerts.from_event(where, ev.id, ev.kind, ev.time, ev.reason, ev.data)
                if alert is not None:
                    found.append(alert)
            if node is not None:
                pcfg = getattr(report, "pcfg", None)
                notice = alerts.from_maintenance(where, node.id, node.upcoming_maintenance, now,
                                                 start_early=bool(getattr(pcfg, "start_early", True)))
                if notice is not None:
                    found.append(notice)
            for alert in found:
                for target in self.targets.values():
                    if alert.kind in target.on:
                        data = {"job": where.job, "node": where.node, "zone": where.zone, **alert.data}
                        added += self.journal.add_delivery(f"{alert.key}-t{target.index}", target.index,
                                                           alert.kind, alert.time, alert.text, data)
            self.journal.set_alert_bookmark(newest)
        self._wake.set()
        return added

    def start(self) -> Notifier:
        """Start the sender thread (it first sends what an earlier run left unsent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tpuwatch-notify", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s for one full sending round that began after this call."""
        with self._cond:
            self._asked += 1
            want = self._asked
        self._wake.set()
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= want, timeout=timeout)

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        """Send what is due (up to `timeout` s), then stop the thread; the rest waits for the next run."""
        if self._thread is None:
            return
        if timeout > 0 and not self.flush(timeout):
            self._warn(f"alerts still being sent after {timeout:g}s; what is unsent goes out with the next run")
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)  # a request in flight ends by its own timeout; the thread is a daemon

    def take_warnings(self) -> list[str]:
        with self._cond:
            out, self._warnings = self._warnings, []
        return out

    # -- sender thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        journal = self.journal.companion()
        try:
            while not self._stop.is_set():
                self._wake.clear()  # before reading the generation: a flush asked after this wakes the next wait
                with self._cond:
                    generation = self._asked
                try:
                    wait = self._round(journal)
                except Exception as exc:  # a locked or full journal: say so, keep the thread, try again
                    self._warn(f"alerts not sent this round: {type(exc).__name__}: {str(exc)[:200]}")
                    wait = 30.0
                with self._cond:
                    self._done = max(self._done, generation)
                    self._cond.notify_all()
                self._wake.wait(timeout=wait)
        finally:
            journal.close()

    def _round(self, journal: Journal) -> float:
        """Send every due delivery once (with in-round retries); the seconds until the next is due."""
        nearest = 60.0
        for row in journal.deliveries(pending_only=True):
            if self._stop.is_set():
                break
            now = self.now()
            if row.next_try is not None and row.next_try > now:
                nearest = min(nearest, (row.next_try - now).total_seconds())
                continue
            later = self._deliver(journal, row)
            if later is not None:
                nearest = min(nearest, later)
        return max(nearest, 0.05)

    def _deliver(self, journal: Journal, row: DeliveryRow) -> float | None:
        """Try `row` (TRIES_PER_ROUND at most) and journal the outcome; seconds to its next try."""
        target = self.targets.get(row.target)
        now = self.now()
        if target is None:
            with journal.transaction():
                journal.delivery_tried(row.key, row.tries, gave_up=now,
                                       error=f"no [[notify]] table at position {row.target} any more")
            return None
        tries = row.tries

        def once() -> None:
            nonlocal tries
            tries += 1
            post(target, row, timeout=self.timeout, now=self.now)

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, SendError) and exc.retry_after is not None:
                return exc.retry_after
            return float(wait_random_exponential(multiplier=self.backoff, max=30 * self.backoff)(state))

        def worth_it(exc: BaseException) -> bool:
            return (isinstance(exc, SendError) and exc.transient
                    and (exc.retry_after or 0.0) <= LONGEST_WAIT_IN_ROUND)

        def stop(state: RetryCallState) -> bool:
            return self._stop.is_set() or bool(stop_after_attempt(TRIES_PER_ROUND)(state))

        def sleep(seconds: float) -> None:
            self._stop.wait(seconds)  # a closing notifier does not sit out a Retry-After

        retrying = Retrying(stop=stop, wait=wait, retry=retry_if_exception(worth_it), sleep=sleep, reraise=True)
        try:
            retrying(once)
        except SendError as exc:
            now = self.now()
            if not exc.transient or now - row.time > MAX_AGE:
                why = "not accepted" if not exc.transient else f"still failing after {human_age(now - row.time)}"
                with journal.transaction():
                    journal.delivery_tried(row.key, tries, gave_up=now, error=exc.detail)
                self._warn(f"alert to {target.name} given up ({why}: {exc.detail}): {row.kind}")
                return None
            delay = max(exc.retry_after or 0.0, min(60.0 * 2 ** max(tries // TRIES_PER_ROUND - 1, 0), 1800.0) * self.backoff)
            with journal.transaction():
                journal.delivery_tried(row.key, tries, next_try=now + timedelta(seconds=delay), error=exc.detail)
            self._warn(f"alert to {target.name} not sent yet ({exc.detail}); trying again in {delay:.0f}s")
            return delay
        with journal.transaction():
            journal.delivery_tried(row.key, tries, sent=self.now())
        return None

    def _warn(self, text: str) -> None:
        with self._cond:
            self._warnings.append(text)


def human_age(delta: timedelta) -> str:
    from tpuwatch.durations import human

    return human(delta.total_seconds())


def from_config(cfg: Config, journal: Journal, node: str, zone: str, **kw: Any) -> Notifier | None:
    """The job's Notifier, or None without [[notify]] tables. Reads the URLs from the environment."""
    targets = targets_from_config(cfg)
    if not targets:
        return None
    return Notifier(journal, targets, cfg.job_name, node, zone, **kw)

