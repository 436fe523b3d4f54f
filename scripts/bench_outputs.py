#!/usr/bin/env python3
"""What alerts and metrics add to a tick, on a long job's journal.

    python scripts/bench_outputs.py                       # 2000 attempts, 20000 events
    python scripts/bench_outputs.py --attempts 200 --events 2000 --repeat 50

Measured in-process with the real Journal (SQLite in a temporary directory) and a local webhook
(stdlib http.server on 127.0.0.1):
1. alerts, per tick: `Notifier.after_tick` when the tick journaled one event that makes an
   alert (derive, journal the delivery, move the cursor), median over --repeat ticks;
2. metrics, per tick: `metrics.snapshot` (reads the journal's attempts and operations) plus a
   render of /metrics (`generate_latest`), median over --repeat;
3. delivery: from `after_tick` to the webhook having accepted the alert (the sender thread's
   round trip, journal writes included), median over --repeat alerts.
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.exposition import generate_latest

from tpuwatch import metrics, notify
from tpuwatch.journal import Journal
from tpuwatch.policy import Attempt, AttemptEnd, Memory, PolicyConfig
from tpuwatch.webhooks import Secret


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=2000)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=100)
    args = ap.parse_args()

    accepted = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            accepted.set()

        def log_message(self, *a: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    t0 = datetime.now(timezone.utc) - timedelta(days=30)
    with tempfile.TemporaryDirectory() as tmp, Journal.open(Path(tmp), "bench", "bench") as j:
        with j.transaction():
            for n in range(1, args.attempts + 1):
                start = t0 + timedelta(minutes=10 * n)
                j.start_attempt(n, start, "id", n * 10)
                j.end_attempt(AttemptEnd(n, start, start + timedelta(minutes=9), "id", n * 10, n * 10 + 9,
                                         "disruption", False, None, "ended by a disruption (node state PREEMPTED)"))
            for i in range(args.events):
                j.add_event(t0 + timedelta(seconds=i), "status", f"event {i}", {"row": "running"})
        target = notify.Target(0, "json", frozenset({"done"}), Secret(f"http://127.0.0.1:{server.server_port}/h"))
        n = notify.Notifier(j, [target], "bench", "bench", "us-central2-b")
        derive, deliver = [], []
        for i in range(args.repeat):
            with j.transaction():
                j.add_event(datetime.now(timezone.utc), "done", f"run {i}", {})
            accepted.clear()
            a = time.perf_counter()
            n.after_tick(None)
            derive.append(time.perf_counter() - a)
            if i == 0:
                n.start()
            accepted.wait(30)
            deliver.append(time.perf_counter() - a)
        n.close(5)
        pcfg = PolicyConfig(job="bench", tpu_name="bench", zones=("us-central2-b",))
        report = SimpleNamespace(memory=Memory(attempt=Attempt(number=args.attempts)), checkpoint=None,
                                 time=datetime.now(timezone.utc))
        render = []
        for _ in range(args.repeat):
            a = time.perf_counter()
            registry, _ = metrics.registry_for(metrics.snapshot(report, j, pcfg))
            generate_latest(registry)
            render.append(time.perf_counter() - a)
    server.shutdown()
    ms = lambda xs: f"{statistics.median(xs) * 1000:.2f} ms"  # noqa: E731
    print(f"journal: {args.attempts} attempts, {args.events + args.repeat} events; median of {args.repeat}")
    print(f"alerts, per tick (derive + journal):      {ms(derive)}")
    print(f"metrics, per tick (snapshot + render):    {ms(render)}")
    print(f"delivery, after_tick to webhook accepted: {ms(deliver)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
