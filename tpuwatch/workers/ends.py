"""Crashes noticed at once: one follow channel per worker while an attempt runs.

Each channel runs remote.sh's `wait` (protocol.wait_script): it blocks on the job lock on the
worker and answers the moment that worker's attempt ends (an exit code, killed, or replaced).
Over a multiplexed connection (mux.py) a channel costs no handshake and, while it waits, no
CPU on either side. The first answer of an end calls `wake`, so the watch loop ticks at once
instead of at its next poll.

A channel that drops without an answer is not a crash: it is opened again (a few times, a
second apart, and again on the next `hold`), and the tick's probe stays the truth. Only ends
of the attempt held now wake; a worker that has answered is not asked again for that attempt,
so a worker that ended cannot wake the loop twice.
This module knows nothing of the policy: the caller says which attempt and which workers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from tpuwatch.model import NodeSnapshot, WorkerEndpoint
from tpuwatch.workers import protocol
from tpuwatch.workers.ssh import Stream, Transport

POLL = 1.0  # seconds between the worker-side script's exit-code reads while the lock is held
REOPEN_AFTER = 1.0  # seconds before a dropped channel is opened again
REOPEN_TRIES = 3  # times a dropped channel is opened again before the next hold
ENDED = ("ok", "gone", "replaced")
ANSWER_MAX = 4096  # bytes of a channel's output kept: its answer is one short record at the end


class Answer:
    """What a wait channel said, without its keepalives.

    The worker-side script writes a newline every poll while the attempt runs (so that it dies
    of SIGPIPE once nobody reads it): a channel held for days would otherwise keep one small
    object per second and, for each, strand the rest of a read buffer in the allocator. The
    newlines before the answer are dropped and at most the last ANSWER_MAX bytes are kept
    (the answer is the last record).
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        if not self._buf:
            chunk = chunk.lstrip(b"\n")
        self._buf += chunk
        if len(self._buf) > ANSWER_MAX:
            del self._buf[:-ANSWER_MAX]

    def __len__(self) -> int:
        return len(self._buf)

    def text(self) -> str:
        return self._buf.decode("utf-8", "replace")


class AttemptEnds:
    """The follow channels of one job's workers, for one (node incarnation, attempt) at a time."""

    def __init__(self, transport: Transport, job: str, poll: float = POLL) -> None:
        self.transport = transport
        self.job = job
        self.poll = poll
        self.opened = 0  # channels opened so far (tests, benchmarks)
        self.received = 0  # bytes read from the channels so far (tests)
        self._lock = threading.Lock()
        self._key: tuple[str, int] | None = None
        self._open: dict[int, Stream | None] = {}  # worker -> its channel (None while it starts)
        self._answers: dict[int, Answer] = {}  # worker -> what its open channel said so far
        self._answered: set[int] = set()  # workers whose attempt ended, for this key
        self._gen = 0  # counts closes: a channel's thread of an older generation stops
        self._closed = threading.Event()  # wakes the reopen waits of older generations

    def hold(self, node: NodeSnapshot, attempt: int, workers: Sequence[WorkerEndpoint],
             wake: Callable[[], None]) -> None:
        """One channel per worker of `workers` for `attempt` on `node`; channels held for another
        node or attempt are closed. `wake()` is called from a channel's thread."""
        key = (node.id or f"{node.zone}/{node.name}", attempt)
        with self._lock:
            if key != self._key:
                self._close_locked()
                self._key = key
            gen = self._gen
            start = [w for w in workers if w.index not in self._open and w.index not in self._answered]
            for w in start:
                self._open[w.index] = None
        for w in start:
            threading.Thread(target=self._follow, args=(gen, key, node, w, wake), daemon=True,
                             name=f"tpuwatch-ends-w{w.index}").start()

    def release(self) -> None:
        """Close every channel."""
        with self._lock:
            self._close_locked()
            self._key = None

    def held(self) -> list[int]:
        """Workers with a channel open or opening."""
        with self._lock:
            return sorted(self._open)

    def kept(self) -> int:
        """Bytes of output the open channels keep (tests)."""
        with self._lock:
            return sum(len(a) for a in self._answers.values())

    def _close_locked(self) -> None:
        self._gen += 1
        self._closed.set()
        self._closed = threading.Event()
        for stream in self._open.values():
            if stream is not None:
                stream.close()
        self._open.clear()
        self._answered.clear()

    def _follow(self, gen: int, key: tuple[str, int], node: NodeSnapshot, w: WorkerEndpoint,
                wake: Callable[[], None]) -> None:
        with self._lock:
            closed = self._closed
        for n in range(REOPEN_TRIES + 1):
            if n and closed.wait(REOPEN_AFTER):
                return
            with self._lock:
                if self._gen != gen:
                    return
            # argv may prepare the node first (gcloud): in this thread, never the caller's
            stream = Stream(self.transport, node, w, protocol.wait_script(self.job, key[1], self.poll),
                            remote_command=protocol.REMOTE_COMMAND)
            with self._lock:
                if self._gen != gen:
                    return
                self._open[w.index] = stream
                self.opened += 1
            answer = Answer()
            with self._lock:
                self._answers[w.index] = answer

            def feed(chunk: bytes, answer: Answer = answer) -> None:
                with self._lock:
                    self.received += len(chunk)
                    answer.feed(chunk)

            r = stream.run(feed)
            end = protocol.parse_wait(answer.text()) if r.reached else None
            with self._lock:
                if self._answers.get(w.index) is answer:
                    del self._answers[w.index]
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
            if self._gen == gen and self._open.get(w.index) is not None:
                self._open.pop(w.index, None)
