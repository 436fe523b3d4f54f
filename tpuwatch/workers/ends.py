"""Crashes noticed at once, and probes without a new channel: one follow channel per worker
while an attempt runs.

Each channel runs remote.sh's `wait` (protocol.wait_script): it blocks on the job lock on the
worker and answers the moment that worker's attempt ends (an exit code, killed, or replaced).
Over a multiplexed connection (mux.py) a channel costs no handshake and, while it waits, no
CPU on either side. The first answer of an end calls `wake`, so the watch loop ticks at once
instead of at its next poll.

A channel that drops without an answer is not a crash: it is opened again (a few times, a
second apart, and again on the next `hold`), and the tick's probe stays the truth. One whose
worker's SSH port stays closed through those tries (its host went down) wakes the loop once, so
the tick looks at the node now. Only ends
of the attempt held now wake; a worker that has answered is not asked again for that attempt,
so a worker that ended cannot wake the loop twice.

The channel's stdin stays open, and `ask` carries a tick's probe on it: a request line with a
number, answered by the same probe code an SSH probe runs, framed by that number. Only the
answer to this request is used, and only a well-formed one; a worker whose channel is not
open, ends, or does not answer within `answer_wait` is left to the caller to probe over SSH.
A channel still opening for the first time (the tick right after a launch) is waited for, up
to `answer_wait`: asking it costs a line, where an SSH probe costs another channel and shell
on every worker while those channels are still starting.

`launch` opens the channels itself: each worker's launch session goes on as its follow channel
(remote.sh `launch` with `then_wait`), so a relaunch costs one session per worker, not two. An
end seen before the loop holds the channels wakes it when it does. A launch session that ends
before its launch answered is not a channel: the caller launches over SSH as before, and the
next `hold` opens that worker's channel.
This module knows nothing of the policy: the caller says which attempt and which workers.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tpuwatch.model import NodeSnapshot, WorkerEndpoint, WorkerProbe
from tpuwatch.workers import protocol
from tpuwatch.workers.ssh import SshResult, Stream, Transport, port_open

POLL = 1.0  # seconds between the worker-side script's exit-code reads while the lock is held
REOPEN_AFTER = 1.0  # seconds before a dropped channel is opened again
REOPEN_TRIES = 3  # times a dropped channel is opened again before the next hold
ANSWER_WAIT = 5.0  # seconds a probe waits for the channels' answers before the caller asks over SSH
ENDED = ("ok", "gone", "replaced")


@dataclass(eq=False)
class _Channel:
    """One worker's open follow channel."""

    stream: Stream
    checkpoint_dir: str  # what its probe requests list (the preamble's, fixed when it opened)
    gen: int  # the generation it was opened in: one closed since says nothing of the channels now
    reader: protocol.WaitReader = field(default_factory=protocol.WaitReader)
    ended: bool = False


@dataclass(eq=False)
class _Launch:
    """A launch whose session goes on as the follow channel: its stdout until its answer ended."""

    answered: threading.Event = field(default_factory=threading.Event)
    out: bytes = b""  # stdout so far; once answered, the launch's answer alone
    result: SshResult | None = None  # how the session ended, when it ended before its answer did


@dataclass(eq=False)
class _Request:
    """One `ask`: the workers still to answer it, and the answers trusted so far."""

    waiting: set[int]
    answers: dict[int, WorkerProbe] = field(default_factory=dict)


def _node_key(node: NodeSnapshot) -> str:
    return node.id or f"{node.zone}/{node.name}"


class AttemptEnds:
    """The follow channels of one job's workers, for one (node incarnation, attempt) at a time."""

    def __init__(self, transport: Transport, job: str, poll: float = POLL,
                 answer_wait: float = ANSWER_WAIT, patterns: Sequence[str] = ()) -> None:
        self.transport = transport
        self.job = job
        self.patterns = tuple(patterns)  # what its probe requests search in the log (protocol.probe_script)
        self.poll = poll
        self.answer_wait = answer_wait
        self.opened = 0  # channels opened so far (tests, benchmarks)
        self.answered = 0  # probes answered on a channel (tests, benchmarks)
        self.rejected = 0  # answers not trusted: another request's, or garbled (tests)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._key: tuple[str, int] | None = None
        self._checkpoint_dir = ""
        self._open: dict[int, _Channel | None] = {}  # worker -> its channel (None while it starts)
        self._answered: set[int] = set()  # workers whose attempt ended, for this key
        self._first: set[int] = set()  # workers whose channel is opening for the first time, for this key
        self._reopened: set[int] = set()  # workers whose channel ended once, for this key: not waited for again
        self._gen = 0  # counts closes: a channel's thread of an older generation stops
        self._closed = threading.Event()  # wakes the reopen waits of older generations
        self._seq = 0  # the number of the latest probe request
        self._requests: dict[int, _Request] = {}
        self._wake: Callable[[], None] | None = None  # the holder's, once it held channels
        self._wake_due = False  # an end came before anyone held the channels: wake at the hold

    def launch(self, node: NodeSnapshot, attempt: int, workers: Sequence[WorkerEndpoint],
               scripts: Callable[[WorkerEndpoint], bytes], timeout: float,
               checkpoint_dir: str = "") -> dict[int, SshResult]:
        """Run each worker's launch-then-wait script (protocol.launch_script with `then_wait`) as
        its follow channel for `attempt`: the launch's answers by worker, as an SSH call's result
        (stdout the launch's records), within `timeout`. A worker whose session ended before its
        launch answered gets that session's result; one whose answer did not come in time gets
        none (its session is closed). Workers whose channel is held for this attempt are not
        launched again here."""
        with self._lock:
            key, gen, start = self._claim_locked(node, attempt, workers, checkpoint_dir)
            self._first.update(w.index for w in start)
            self._reopened.difference_update(w.index for w in start)
        launches = {w.index: _Launch() for w in start}
        for w in start:
            threading.Thread(target=self._follow, args=(gen, key, node, w, self._wake_holder),
                             kwargs={"launch": (launches[w.index], scripts(w))}, daemon=True,
                             name=f"tpuwatch-ends-w{w.index}").start()
        out: dict[int, SshResult] = {}
        deadline = time.monotonic() + timeout
        for launch in launches.values():
            if not launch.answered.wait(max(0.0, deadline - time.monotonic())):
                break
        address = {w.index: w.address(self.transport.internal_ip) for w in start}
        for i, launch in launches.items():
            if not launch.answered.is_set():
                continue
            if launch.result is not None:  # the session ended first: its own result
                out[i] = dataclasses.replace(launch.result, stdout=launch.out.decode("utf-8", "replace"))
            else:
                out[i] = SshResult(i, address[i], 0, launch.out.decode("utf-8", "replace"), "")
        with self._lock:  # those that did not answer in time: their sessions end, the caller asks again
            late = [c for i, c in self._open.items() if i in launches and i not in out and c is not None]
        for chan in late:
            chan.ended = True
            chan.stream.close()
        return out

    def _wake_holder(self) -> None:
        """An end on a channel: wake whoever holds the channels, or the first to hold them."""
        with self._lock:
            wake = self._wake
            if wake is None:
                self._wake_due = True
        if wake is not None:
            wake()

    def hold(self, node: NodeSnapshot, attempt: int, workers: Sequence[WorkerEndpoint],
             wake: Callable[[], None], checkpoint_dir: str = "") -> None:
        """One channel per worker of `workers` for `attempt` on `node`; channels held for another
        node or attempt are closed. `wake()` is called from a channel's thread. A channel opened
        from now on lists `checkpoint_dir` when a probe request asks for the listing."""
        with self._lock:
            key, gen, start = self._claim_locked(node, attempt, workers, checkpoint_dir)
            self._first.update(w.index for w in start if w.index not in self._reopened)
            self._wake = wake
            due, self._wake_due = self._wake_due, False
        for w in start:
            threading.Thread(target=self._follow, args=(gen, key, node, w, self._wake_holder), daemon=True,
                             name=f"tpuwatch-ends-w{w.index}").start()
        if due:  # an end on a channel the launch opened, before this hold
            wake()

    def _claim_locked(self, node: NodeSnapshot, attempt: int, workers: Sequence[WorkerEndpoint],
                      checkpoint_dir: str) -> tuple[tuple[str, int], int, list[WorkerEndpoint]]:
        """(Lock held.) Follow `attempt` on `node` (the channels of any other are closed) and
        claim the workers that have no channel for it and have not ended it: (key, generation,
        those workers)."""
        key = (_node_key(node), attempt)
        if key != self._key:
            self._close_locked()
            self._key = key
        self._checkpoint_dir = checkpoint_dir
        start = [w for w in workers if w.index not in self._open and w.index not in self._answered]
        for w in start:
            self._open[w.index] = None
        return key, self._gen, start

    def release(self) -> None:
        """Close every channel."""
        with self._lock:
            self._close_locked()
            self._key = None

    def held(self) -> list[int]:
        """Workers with a channel open or opening."""
        with self._lock:
            return sorted(self._open)

    def ask(self, node: NodeSnapshot, workers: Sequence[int], listing: int | None = None,
            checkpoint_dir: str = "") -> dict[int, WorkerProbe]:
        """This tick's probe of `workers` on the channels held for `node`: the answers to be
        trusted, by worker. `listing`: the worker whose probe also lists `checkpoint_dir`
        (asked on its channel only if that channel lists the same directory).

        Waits `answer_wait` seconds at most for channels opening for the first time to get
        ready, then as long for the answers; a worker missing from the answer has no open
        channel, its channel ended or did not answer in time, or its answer was garbled.
        """
        with self._cond:
            if self._key is None or self._key[0] != _node_key(node):
                return {}
            # Channels opening for the first time are waited for; one that opens again after a
            # drop (a worker that stopped answering, say) is not: its request would wait out
            # answer_wait before the SSH probe could even start.
            gen = self._gen
            self._cond.wait_for(lambda: self._gen != gen or not self._first.intersection(workers), self.answer_wait)
            if self._gen != gen:
                return {}
            chans = {w: c for w in workers if (c := self._open.get(w)) is not None and not c.ended
                     and c.reader.ready and (w != listing or c.checkpoint_dir == checkpoint_dir)}
            if not chans:
                return {}
            self._seq += 1
            seq = self._seq
            req = _Request(waiting=set(chans))
            self._requests[seq] = req
        # Written outside the lock: answers may come back while the others are sent.
        unsent = {w for w, c in chans.items() if not c.stream.send(protocol.probe_request(seq, w == listing))}
        with self._cond:
            req.waiting -= unsent
            self._cond.wait_for(lambda: not req.waiting, self.answer_wait)
            del self._requests[seq]
            self.answered += len(req.answers)
            for w in req.waiting:  # silent: not asked again; opened afresh on the next hold
                chans[w].ended = True
                chans[w].stream.close()
            return dict(req.answers)

    def _close_locked(self) -> None:
        self._wake_due = False
        self._gen += 1
        self._closed.set()
        self._closed = threading.Event()
        for chan in self._open.values():
            if chan is not None:
                chan.stream.close()
        self._open.clear()
        self._answered.clear()
        self._first.clear()
        self._reopened.clear()
        self._cond.notify_all()

    def _feed(self, worker: int, chan: _Channel, data: bytes) -> None:
        """Output of `worker`'s channel: an answer goes to the request of its number, if any
        still waits for this worker; any other is not trusted."""
        was_ready = chan.reader.ready
        done = chan.reader.feed(data)
        if chan.reader.ready and not was_ready:  # it reads requests now: an ask may be waiting for it
            with self._cond:
                if chan.gen == self._gen:
                    self._first.discard(worker)
                    self._cond.notify_all()
        if not done:
            return
        with self._cond:
            for seq, text in done:
                req = self._requests.get(int(seq)) if seq.isdigit() else None
                if req is None or worker not in req.waiting:
                    self.rejected += 1
                    continue
                req.waiting.discard(worker)
                probe = protocol.parse_probe(worker, protocol.parse_records(text))
                if probe.state == "unreachable":  # no well-formed probe answer: asked over SSH instead
                    self.rejected += 1
                else:
                    req.answers[worker] = probe
            self._cond.notify_all()

    def _launch_feed(self, launch: _Launch, feed: Callable[[bytes], None], data: bytes) -> None:
        """A launch-then-wait session's stdout: the launch's answer until `launch_end`, then the
        follow channel's."""
        if launch.answered.is_set():
            feed(data)
            return
        launch.out += data
        split = protocol.split_launch(launch.out)
        if split is None:
            return
        launch.out, rest = split
        launch.answered.set()
        if rest:
            feed(rest)

    def _not_first(self, worker: int) -> None:
        """(Lock held.) `worker`'s channel ended or could not start: an ask no longer waits for
        it, now or when it opens again."""
        self._first.discard(worker)
        self._reopened.add(worker)
        self._cond.notify_all()

    def _ended(self, worker: int, chan: _Channel) -> None:
        """`worker`'s channel closed: no request waits for its answer any more."""
        with self._cond:
            chan.ended = True
            if chan.gen == self._gen:
                self._not_first(worker)
            for req in self._requests.values():
                req.waiting.discard(worker)
            self._cond.notify_all()

    def _follow(self, gen: int, key: tuple[str, int], node: NodeSnapshot, w: WorkerEndpoint,
                wake: Callable[[], None], launch: tuple[_Launch, bytes] | None = None) -> None:
        try:
            self._follow_channel(gen, key, node, w, wake, launch)
        finally:
            if launch is not None:  # however it ended, the launch waits no longer
                launch[0].answered.set()
            with self._cond:  # however it ended (a transport that raised, say), no ask waits for it
                if self._gen == gen and w.index in self._first:
                    self._not_first(w.index)

    def _port_answers(self, w: WorkerEndpoint) -> bool:
        """A TCP connect to the worker's SSH port succeeds, or the path is one it cannot see."""
        target = self.transport.direct_target(w)
        return target is None or port_open(*target, REOPEN_AFTER)

    def _follow_channel(self, gen: int, key: tuple[str, int], node: NodeSnapshot, w: WorkerEndpoint,
                        wake: Callable[[], None], launch: tuple[_Launch, bytes] | None) -> None:
        with self._lock:
            closed = self._closed
        down = False
        for n in range(REOPEN_TRIES + 1):
            if n and closed.wait(REOPEN_AFTER):
                return
            down = bool(n) and not self._port_answers(w)
            if down:  # its host is down (a maintenance): no ssh for nothing
                continue
            with self._lock:
                if self._gen != gen:
                    return
                checkpoint_dir = self._checkpoint_dir
            # argv may prepare the node first (gcloud): in this thread, never the caller's
            first = launch if not n else None
            script = first[1] if first else protocol.wait_script(self.job, key[1], self.poll, checkpoint_dir,
                                                                  self.patterns)
            stream = Stream(self.transport, node, w, protocol.framed(script), remote_command=protocol.REMOTE_COMMAND,
                            keep_open=True)
            chan = _Channel(stream, checkpoint_dir, gen)
            with self._lock:
                if self._gen != gen:
                    return
                self._open[w.index] = chan
                self.opened += 1
            feed = functools.partial(self._feed, w.index, chan)
            try:
                r = stream.run(feed if first is None else functools.partial(self._launch_feed, first[0], feed))
            finally:
                self._ended(w.index, chan)
            if first is not None and not first[0].answered.is_set():
                # No launch answer: not a channel of a launched attempt; the caller asks again.
                first[0].result = r
                first[0].answered.set()
                with self._lock:
                    if self._gen == gen and self._open.get(w.index) is chan:
                        self._open.pop(w.index, None)
                return
            end = chan.reader.wait_answer() if r.reached else None
            with self._lock:
                if self._gen != gen:
                    return
                if end is not None and end.result in ENDED:
                    self._answered.add(w.index)
                    self._open.pop(w.index, None)
                    ended = True
                else:
                    ended = False
            if ended:
                wake()
                return
        with self._lock:  # dropped every time: opened again on the next hold
            held = self._gen == gen
            if held and self._open.get(w.index) is not None:
                self._open.pop(w.index, None)
        if held and down:
            # Its host went away under the attempt (no SSH port any more): not an end, but worth a
            # look now rather than at the next poll (a multislice job limps on the slices left).
            wake()
