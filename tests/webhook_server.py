"""A local webhook for the alert tests: stdlib http.server on 127.0.0.1, answering from a plan.

Not a test module. `Hook(plan=[...], then="ok")` answers its requests in order from `plan`, then
with `then`: "ok" (200), an int (that status), ("429", seconds) (429 with Retry-After), or
"hang" (hold the request until `release` is set, then drop the connection without an answer:
a dead peer). `answered` holds the requests it accepted (200), `requests` every one it saw.
The URL carries a token (`TOKEN`) that must never show up anywhere but in the request itself.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Any  # "ok" | int | ("429", float) | "hang"


class Hook:
    def __init__(self, plan: list[Answer] | None = None, then: Answer = "ok") -> None:
        self.plan = list(plan or [])
        self.then = then
        self.token = "tok" + secrets.token_hex(12)
        self.requests: list[dict[str, Any]] = []
        self.answered: list[dict[str, Any]] = []
        self.held = threading.Event()  # a "hang" request has arrived
        self.release = threading.Event()
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                seen = {"time": time.monotonic(), "path": self.path, "headers": dict(self.headers),
                        "body": json.loads(body or b"null")}
                with hook.lock:
                    hook.requests.append(seen)
                    answer = hook.plan.pop(0) if hook.plan else hook.then
                if answer == "hang":
                    hook.held.set()
                    hook.release.wait(60)
                    self.close_connection = True
                    return  # no answer at all
                if isinstance(answer, tuple):
                    self.send_response(429)
                    self.send_header("Retry-After", f"{answer[1]:g}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                code = 200 if answer == "ok" else int(answer)
                text = b"ok" if code == 200 else b"no"
                if code == 200:
                    # recorded before the answer goes out: a sender that has its 200 (and a test
                    # that waited on the sender) must find it here, not race the append
                    with hook.lock:
                        hook.answered.append(seen)
                self.send_response(code)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/T0/B0/{self.token}"

    def keys(self) -> list[str]:
        """Idempotency keys of the accepted requests, in order."""
        with self.lock:
            return [r["headers"].get("Idempotency-Key", "") for r in self.answered]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
