"""End to end: `watch --metrics-port` scraped while it keeps a job alive through a maintenance, and
`check --metrics-file` from cron, against the simulator, real ssh and the toy trainer. Scrapes are
parsed with prometheus_client's parser and compared with the journal.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_helpers import Job, finish
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return got.get((name, frozenset({"job_name": "pod", **labels}.items())))


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return getattr(exc, "code", 0), ""


def test_watch_serves_metrics_that_follow_the_job_through_a_maintenance(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=150)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(job.cfg), "--metrics-port",
                             str(port)], env=job.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    seen: dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float]] = {}

    def metric_shows(name: str, check: object) -> bool:
        code, text = scrape(port)
        if code != 200 or not text:
            return False
        got = parse(text)
        seen["last"] = got
        return bool(check(got))  # type: ignore[operator]

    try:
        job.wait(lambda: metric_shows("running", lambda g: value(g, "tpuwatch_job_phase", phase="running") == 1
                                      and (value(g, "tpuwatch_checkpoint_step") or 0) >= 20),
                 timeout=90, what="metrics of a running job with checkpoints")
        assert scrape(port, "/healthz")[0] == 200
        sim.inject("maintenance", node="pod", heal_after=1800)
        job.wait(lambda: metric_shows("resumed", lambda g: (value(g, "tpuwatch_time_to_resume_seconds_count") or 0) >= 1
                                      and value(g, "tpuwatch_job_phase", phase="running") == 1),
                 timeout=90, what="metrics after the relaunch")
        got = seen["last"]
        assert value(got, "tpuwatch_disruptions_total", kind="maintenance") == 1, got
        assert (value(got, "tpuwatch_job_attempt") or 0) >= 2
        assert value(got, "tpuwatch_restarts_charged_total") == 0  # a disruption is never charged
        assert (value(got, "tpuwatch_api_requests_total", api="tpu.googleapis.com", method="get_node") or 0) >= 2
        assert 0 < (value(got, "tpuwatch_goodput_ratio") or 0) <= 1
        assert (value(got, "tpuwatch_checkpoint_age_seconds") or -1) >= 0
        rc, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert sum(1 for a in attempts if a["outcome"] == "disruption") == 1, attempts
    assert scrape(port, "/healthz")[0] == 0  # watch has returned: nothing listens any more


def test_check_writes_a_textfile_for_node_exporter_atomically_and_its_counters_grow(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=100_000)  # still running at the second check, however slow the machine
    folder = tmp_path / "textfile"
    folder.mkdir()
    prom = folder / "tpuwatch.prom"
    calls = []
    for _ in range(2):
        r = job.cli("check", "-c", str(job.cfg), "--metrics-file", str(prom))
        assert r.returncode == 0, r.stdout + r.stderr
        got = parse(prom.read_text())
        assert sorted(p.name for p in folder.iterdir()) == ["tpuwatch.prom"]  # no temporary file left
        calls.append(value(got, "tpuwatch_api_requests_total", api="tpu.googleapis.com", method="get_node") or 0)
        assert value(got, "tpuwatch_job_attempt") == 1
        assert value(got, "tpuwatch_job_phase", phase="running") == 1
    # a counter over cron runs: each run adds its own requests to the earlier ones
    assert calls[0] >= 1 and calls[1] > calls[0], calls
    dry = job.cli("check", "-c", str(job.cfg), "--metrics-file", str(prom), "--dry-run")
    assert dry.returncode == 0 and parse(prom.read_text()) == got  # --dry-run writes nothing
