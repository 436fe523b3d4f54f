"""Prometheus metrics (tpuwatch.metrics): names and values, scraped and parsed with
prometheus_client's own parser; /healthz; the goodput and time-to-resume arithmetic; a port in
use. The end-to-end scrape of a watched job on the simulator is in test_metrics_e2e.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch import metrics
from tpuwatch.cloud import calls
from tpuwatch.cloud.errors import Call
from tpuwatch.journal import AttemptRow, Journal, JournalEvent
from tpuwatch.policy import PolicyConfig
from tpuwatch.report import compute

T0 = datetime(2026, 11, 24, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def row(n: int, start: float, end: float | None, s0: int | None, s1: int | None, outcome: str | None,
        charged: bool = False, reason: str = "") -> AttemptRow:
    return AttemptRow(n, at(start), None if end is None else at(end), "id", s0, s1, outcome, charged, None, reason)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


SNAP = metrics.Snapshot(
    job="llm", time=at(1000), phase="running", attempt=3, restarts=1, max_restarts=5, recreates=1,
    max_recreates=3, restarts_charged_total=1, recreates_total=1,
    disruptions={"maintenance": 1, "preemption": 1}, checkpoint_step=120, checkpoint_time=at(900),
    resumes=(25.0, 400.0), goodput=0.8, api_requests={("tpu.googleapis.com", "get_node"): 42, ("logging.googleapis.com", "list_log_entries"): 3},
    api_errors={("tpu.googleapis.com", "get_node"): 2})


def test_every_metric_is_named_by_prometheus_conventions_and_parses() -> None:
    registry, _ = metrics.registry_for(SNAP, clock=lambda: at(1000))
    from prometheus_client.exposition import generate_latest

    text = generate_latest(registry).decode()
    fams = list(text_string_to_metric_families(text))
    for fam in fams:
        assert fam.name.startswith("tpuwatch_"), fam.name
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.samples
        assert all(s.labels.get("job_name") == "llm" for s in fam.samples), fam.name
    got = samples(text)
    job = (("job_name", "llm"),)
    assert got[("tpuwatch_job_phase", (("job_name", "llm"), ("phase", "running")))] == 1
    assert got[("tpuwatch_job_phase", (("job_name", "llm"), ("phase", "failed")))] == 0
    assert got[("tpuwatch_job_attempt", job)] == 3
    assert got[("tpuwatch_restart_budget_used", job)] == 1 and got[("tpuwatch_restart_budget", job)] == 5
    assert got[("tpuwatch_recreate_budget_used", job)] == 1 and got[("tpuwatch_recreate_budget", job)] == 3
    assert got[("tpuwatch_restarts_charged_total", job)] == 1
    assert got[("tpuwatch_recreates_total", job)] == 1
    assert got[("tpuwatch_disruptions_total", (("job_name", "llm"), ("kind", "preemption")))] == 1
    assert got[("tpuwatch_checkpoint_step", job)] == 120
    assert got[("tpuwatch_checkpoint_age_seconds", job)] == 100
    assert got[("tpuwatch_goodput_ratio", job)] == pytest.approx(0.8)
    assert got[("tpuwatch_api_requests_total", (("api", "tpu.googleapis.com"), ("job_name", "llm"), ("method", "get_node")))] == 42
    assert got[("tpuwatch_api_errors_total", (("api", "tpu.googleapis.com"), ("job_name", "llm"), ("method", "get_node")))] == 2
    # the histogram: cumulative buckets, count and sum
    assert got[("tpuwatch_time_to_resume_seconds_bucket", (("job_name", "llm"), ("le", "10.0")))] == 0
    assert got[("tpuwatch_time_to_resume_seconds_bucket", (("job_name", "llm"), ("le", "30.0")))] == 1
    assert got[("tpuwatch_time_to_resume_seconds_bucket", (("job_name", "llm"), ("le", "600.0")))] == 2
    assert got[("tpuwatch_time_to_resume_seconds_bucket", (("job_name", "llm"), ("le", "+Inf")))] == 2
    assert got[("tpuwatch_time_to_resume_seconds_count", job)] == 2
    assert got[("tpuwatch_time_to_resume_seconds_sum", job)] == 425


def test_a_request_that_raises_counts_as_a_request_and_an_error() -> None:
    call = Call("Test API", "get_thing", "things/a", "test.things.get", "test.googleapis.com")
    key = (call.service, call.method)
    before_n, before_e = calls.counts().get(key, 0), calls.errors().get(key, 0)

    def fail() -> int:
        raise TimeoutError("deadline")

    assert calls.counted(call, lambda: 7)() == 7
    with pytest.raises(TimeoutError):
        calls.counted(call, fail)()
    assert calls.counts()[key] - before_n == 2 and calls.errors()[key] - before_e == 1


def test_the_textfile_adds_api_counts_up_over_runs_in_the_journal(tmp_path: Path) -> None:
    key = ("tpu.googleapis.com", "get_node")
    with Journal.open(tmp_path / "state", "pod", "pod") as j:
        for run, expect in ((3, 3), (4, 7)):
            with j.transaction():
                assert metrics._added_up(j, True, {key: run}) == {key: expect}
        with j.transaction():  # the requests' own count is apart
            assert metrics._added_up(j, False, {key: 1}) == {key: 1}


def test_time_to_resume_counts_from_each_interrupted_end_to_the_next_launch() -> None:
    attempts = [row(1, 0, 100, None, 30, "disruption"), row(2, 130, 200, 30, 40, "failure", charged=True),
                row(3, 210, 300, 40, 60, "success"), row(4, 5000, None, 60, None, None)]
    assert metrics.resumes(attempts) == (30.0, 10.0)  # a success is not a resume


def test_goodput_is_the_reports_productive_share_of_wall_time() -> None:
    # attempt 1 saves at 60 s and 120 s and is ended by a disruption at 150 s; 50 s pass before
    # attempt 2 launches and saves once at 260 s. The report counts from the first launch.
    events = [JournalEvent(1, at(0), "phase", "idle -> running", {"from": "idle", "to": "running", "row": "launch"}),
              JournalEvent(2, at(65), "checkpoint", "step 10", {"attempt": 1, "step": 10, "time": at(60).isoformat()}),
              JournalEvent(3, at(125), "checkpoint", "step 20", {"attempt": 1, "step": 20, "time": at(120).isoformat()}),
              JournalEvent(4, at(150), "phase", "running -> waiting_node",
                           {"from": "running", "to": "waiting_node", "row": "disruption"}),
              JournalEvent(5, at(200), "phase", "waiting_node -> running",
                           {"from": "waiting_node", "to": "running", "row": "launch"}),
              JournalEvent(6, at(265), "checkpoint", "step 30", {"attempt": 2, "step": 30, "time": at(260).isoformat()})]
    attempts = [row(1, 0, 150, None, 20, "disruption"), row(2, 200, None, 20, None, None)]
    got = metrics.goodput("llm", events, attempts, at(300))
    want = compute("llm", events, attempts, at(300)).goodput
    assert got is not None and got == want
    # lost: the 30 s after attempt 1's last save and the 50 s wait; attempt 2 still runs (not lost yet)
    assert got == pytest.approx((300 - 30 - 50) / 300)
    assert metrics.goodput("llm", [], [], at(10)) is None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_is_200_while_ticks_come_and_503_once_they_stop() -> None:
    clock = Clock()
    pcfg = PolicyConfig(job="llm", tpu_name="llm", zones=("us-central2-b",), poll_interval=30.0)
    ex = metrics.Exporter(0, "--metrics-port", metrics.stale_limit(pcfg.poll_interval, 600.0), clock=clock)
    try:
        base = f"http://127.0.0.1:{ex.port}"
        assert get(base + "/healthz")[0] == 200  # starting up
        assert get(base + "/metrics") == (200, "")  # nothing before the first tick
        ex.update(SNAP)
        clock.t = ex.stale_after  # 3 polls + the slowest tick
        assert ex.stale_after == 3 * 30 + 600
        assert get(base + "/healthz")[0] == 200
        clock.t = ex.stale_after + 1
        code, text = get(base + "/healthz")
        assert code == 503 and "stale" in text
        ex.update(SNAP)
        assert get(base + "/healthz")[0] == 200
        code, text = get(base + "/metrics")
        assert code == 200 and ("tpuwatch_job_attempt", (("job_name", "llm"),)) in samples(text)
        assert get(base + "/other")[0] == 404
    finally:
        ex.close()


def _config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\nproject = "sim-project"\nzone = "us-central2-b"\n'
                   '[job]\ncommand = "python3 train.py"\n' + extra)
    return cfg


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TPUWATCH_STATE_DIR": str(tmp_path / "state"), "TPUWATCH_EMULATOR_HOST": "127.0.0.1:9"}
    return subprocess.run([sys.executable, "-m", "tpuwatch.cli", *args], env=env, text=True, capture_output=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("where", ["flag", "config"])
def test_a_port_in_use_is_exit_2_naming_the_flag_or_key(tmp_path: Path, where: str) -> None:
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        if where == "flag":
            out = _run(tmp_path, "watch", "-c", str(_config(tmp_path)), "--metrics-port", str(port))
            name = "--metrics-port"
        else:
            out = _run(tmp_path, "watch", "-c", str(_config(tmp_path, f"[metrics]\nport = {port}\n")))
            name = "metrics.port"
    finally:
        busy.close()
    assert out.returncode == 2, out
    assert f"{name} {port}: the port is in use" in out.stderr and "choose another port" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "state" / "pod.db").exists()  # refused before anything was done


@pytest.mark.parametrize(("path", "says"), [("x.txt", "reads only *.prom"), ("missing/x.prom", "does not exist")])
def test_a_bad_metrics_file_is_exit_2_naming_the_flag(tmp_path: Path, path: str, says: str) -> None:
    out = _run(tmp_path, "check", "-c", str(_config(tmp_path)), "--metrics-file", str(tmp_path / path))
    assert out.returncode == 2 and "--metrics-file" in out.stderr and says in out.stderr, out
    assert not (tmp_path / "state" / "pod.db").exists()


def test_one_endpoint_for_several_jobs_labels_each_and_counts_api_requests_once() -> None:
    clock = Clock()
    pcfg = PolicyConfig(job="llm", tpu_name="llm", zones=("us-central2-b",), poll_interval=30.0)
    ex = metrics.Exporter(0, "--metrics-port", None, clock=clock)
    try:
        base = f"http://127.0.0.1:{ex.port}"
        for job in ("llm", "vit"):
            ex.expect(job, metrics.stale_limit(pcfg.poll_interval, 600.0))
        ex.update(SNAP)
        ex.update(metrics.Snapshot(**{**SNAP.__dict__, "job": "vit", "attempt": 7}))
        code, text = get(base + "/metrics")
        got = samples(text)
        assert got[("tpuwatch_job_attempt", (("job_name", "llm"),))] == 3
        assert got[("tpuwatch_job_attempt", (("job_name", "vit"),))] == 7
        # one family per name (a second HELP/TYPE would make the exposition invalid)
        assert text.count("# TYPE tpuwatch_job_attempt ") == 1
        api = {k: v for k, v in got.items() if k[0] == "tpuwatch_api_requests_total"}
        assert api == {("tpuwatch_api_requests_total", (("api", "tpu.googleapis.com"), ("job_name", ""),
                                                         ("method", "get_node"))): 42,
                       ("tpuwatch_api_requests_total", (("api", "logging.googleapis.com"), ("job_name", ""),
                                                         ("method", "list_log_entries"))): 3}
        limit = 3 * 30 + 600
        clock.t = limit + 1
        ex.update(SNAP)  # llm ticks, vit does not
        code, text = get(base + "/healthz")
        assert code == 503 and "vit" in text and "llm" not in text
        ex.forget("vit")  # its config removed: no longer expected to tick
        assert get(base + "/healthz")[0] == 200
    finally:
        ex.close()


def test_a_multislice_job_that_limps_shows_its_slices_and_those_in_use() -> None:
    from dataclasses import replace

    from prometheus_client.exposition import generate_latest

    job = (("job_name", "llm"),)
    limping = replace(SNAP, slices=4, slices_in_use=3)
    got = samples(generate_latest(metrics.registry_for(limping, clock=lambda: at(1000))[0]).decode())
    assert got[("tpuwatch_slices", job)] == 4 and got[("tpuwatch_slices_in_use", job)] == 3
    one = samples(generate_latest(metrics.registry_for(SNAP, clock=lambda: at(1000))[0]).decode())
    assert ("tpuwatch_slices", job) not in one  # a job on one node has no slices to count


def test_a_job_with_spares_shows_them_those_ready_and_the_slices_swapped() -> None:
    from dataclasses import replace

    from prometheus_client.exposition import generate_latest

    job = (("job_name", "llm"),)
    spared = replace(SNAP, slices=4, slices_in_use=4, spares=2, spares_ready=1, slices_swapped=1)
    got = samples(generate_latest(metrics.registry_for(spared, clock=lambda: at(1000))[0]).decode())
    assert (got[("tpuwatch_spares", job)], got[("tpuwatch_spares_ready", job)],
            got[("tpuwatch_slices_swapped", job)]) == (2, 1, 1)
    one = samples(generate_latest(metrics.registry_for(SNAP, clock=lambda: at(1000))[0]).decode())
    assert ("tpuwatch_spares", job) not in one


def test_a_check_without_metrics_does_not_import_them() -> None:
    # cron runs `check` every minute: prometheus_client and the report are start-up it only pays
    # when a --metrics-file or a port asks for them (the flag and the port work: the tests above)
    code = ("import sys, tpuwatch.commands.check, tpuwatch.outputs, tpuwatch.loop, tpuwatch.wiring, tpuwatch.tick; "
            "print(' '.join(m for m in ('prometheus_client', 'tpuwatch.metrics', 'tpuwatch.report') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [], out.stdout


def test_a_job_of_a_spare_pool_shows_its_nodes_who_holds_each_and_those_free_to_claim() -> None:
    from dataclasses import replace

    from prometheus_client.exposition import generate_latest

    pooled = replace(SNAP, pool="v5p", pool_nodes=(("a", "", ""), ("sp-0", "llm", ""), ("sp-1", "", ""),
                                                   ("sp-2", "", "PREEMPTED"), ("sp-3", "", "failed its checks")))
    got = samples(generate_latest(metrics.registry_for(pooled, clock=lambda: at(1000))[0]).decode())
    where = (("job_name", "llm"), ("pool", "v5p"))
    # idle counts only the spares a job could claim now: not a dead one, nor one marked bad
    assert (got[("tpuwatch_spare_pool_nodes", where)], got[("tpuwatch_spare_pool_idle", where)]) == (5, 1 + 1)
    held = {dict(k[1])["node"]: dict(k[1])["held_by"] for k, v in got.items()
            if k[0] == "tpuwatch_spare_pool_node" and v == 1}
    assert held == {"a": "", "sp-0": "llm", "sp-1": "", "sp-2": "", "sp-3": ""}
    one = samples(generate_latest(metrics.registry_for(SNAP, clock=lambda: at(1000))[0]).decode())
    assert not any(k[0].startswith("tpuwatch_spare_pool") for k in one)  # a job of no pool
