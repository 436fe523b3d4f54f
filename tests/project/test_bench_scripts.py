"""Smoke tests of scripts/bench_recovery.py and scripts/bench_overhead.py with tiny parameters.

Each script runs as a user runs it (a subprocess against its own simulator) and must print its
table; the JSON it also writes is checked for what the table is built from. These are not timing
tests: only facts that hold on any machine are asserted (the job cannot run again before the
node heals; one node get per tick; the down node was probed by TCP).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run(script: str, tmp: Path, *args: str) -> tuple[str, dict[str, Any]]:
    out_json = tmp / f"{script}.json"
    r = subprocess.run([sys.executable, str(SCRIPTS / script), *args, "--quiet", "--json-out", str(out_json)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{script} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout, json.loads(out_json.read_text())


def test_bench_recovery_times_a_healed_maintenance_for_tpuwatch_and_the_ssh_loop(tmp_path: Path) -> None:
    outage = 3.0
    table, doc = run("bench_recovery.py", tmp_path, "--faults", "healed", "--baselines", "ssh", "--poll", "1",
                     "--outage", str(outage), "--give-up", "10")
    header = next(line for line in table.splitlines() if line.startswith("fault"))
    assert header.split() == ["fault", "who", "noticed", "running", "floor", "after", "ratio", "1st", "ckpt",
                              "recreated", "ssh", "API", "TCP"]
    assert "healed  tpuwatch" in table and "healed  ssh" in table and "targets:" in table
    rows = {r["contestant"]: r for r in doc["rows"]}
    tw, loop = rows["tpuwatch"], rows["ssh"]
    assert outage <= tw["floor"] < outage + 1 and tw["floor"] == loop["floor"]  # the same seeded outage
    # Both resume, and neither before the node is back: the measurement follows the fault.
    assert tw["running"] is not None and loop["running"] is not None, doc["rows"]
    assert tw["after"] >= 0 and loop["after"] >= 0
    assert tw["noticed"] is not None and 0 <= tw["noticed"] < tw["running"]
    # While the node was down tpuwatch probed its SSH port instead of polling the API, and
    # the loop kept retrying ssh.
    assert tw["tcp_probes"] > 0 and tw["api"] > 0
    assert loop["ssh"] >= 2 and loop["api"] == 0 and loop["tcp_probes"] == 0
    run0 = next(r for r in doc["runs"] if r["contestant"] == "tpuwatch")
    assert run0["api_methods"].get("GetNode", 0) >= 1
    assert {t["target"].split(":")[0] for t in doc["targets"]} == {"healed maintenance"}


def test_bench_overhead_measures_start_up_memory_and_api_calls(tmp_path: Path) -> None:
    table, doc = run("bench_overhead.py", tmp_path, "--runs", "1", "--ticks", "3", "--virtual-ticks", "4",
                     "--nodes", "5", "--watchers", "1", "--watch-seconds", "1", "--pod-sizes", "2", "--pod-ticks", "2",
                     "--pod-poll", "0.5")
    for word in ("tpuwatch --help", "tpuwatch check", "RSS", "CPU per poll", "API/hour", "status --all",
                 "watchers at once"):
        assert word in table, table
    assert 0 < doc["help"]["median"] < 30
    assert 0 < doc["check"]["median"] < 60
    idle = doc["idle"]
    assert idle["ticks"] >= 3 and idle["rss_mb"] > 10 and idle["cpu_per_poll"] >= 0
    assert set(idle["rows"]) <= {"running"}, idle["rows"]  # the job was steady while measured
    one = doc["one_node"]
    # One node get per tick, so 120 an hour at the 30 s poll; the audit log at most once a minute.
    assert one["calls"]["GetNode"] == one["ticks"] == 4
    assert one["tpu_per_hour"] == 120 and one["audit_per_hour"] <= 60
    status = doc["zone"]["status_all"]
    assert status["nodes"] == 5 and status["shown"] == 5
    assert status["calls_per_run"] == {"ListNodes": 1, "ListLogEntries": 1}
    assert doc["zone"]["watchers"]["ticks"] >= 1
    # a pod of 2 workers: a steady tick's probes ride the follow channels (no handshake, no new
    # channel), one node get
    pod = doc["pods"][0]
    assert pod["workers"] == 2 and pod["rows"] == ["running"], pod
    assert pod["handshakes_per_tick"] == 0 and pod["channels_per_tick"] == 0 and pod["tpu_calls_per_tick"] == 1
    assert pod["probes_on_channels_per_tick"] == 2
    assert 0 < pod["heal_to_relaunch"] <= pod["heal_to_all_running"]



@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--hosts-apart needs two cores")
def test_bench_overhead_hosts_apart_runs_the_watcher_on_a_core_of_its_own(tmp_path: Path) -> None:
    table, doc = run("bench_overhead.py", tmp_path, "--pods-only", "--pod-sizes", "4", "--pod-ticks", "2",
                     "--pod-poll", "0.5", "--hosts-apart")
    cpus = sorted(os.sched_getaffinity(0))
    place = doc["placement"]
    assert place["watcher_cpus"] == cpus[:1] and place["hosts_cpus"] == cpus[1:], place
    assert place["hosts_nice"] == place["watcher_nice"] + 10
    (pod,) = doc["pods"]
    # the watcher process itself reported the core it ran on, and the heal was measured there
    assert pod["watcher_cpus"] == cpus[:1] and pod["watcher_nice"] == place["watcher_nice"], pod
    assert 0 < pod["heal_to_relaunch"] <= pod["heal_to_all_running"]
    assert pod["heal_cpu_watcher_own"] > 0 and pod["heal_cpu_watcher"] >= pod["heal_cpu_watcher_own"]
    assert len(pod["load_before"]) == 3
    assert f"watcher on CPU {cpus[:1]}" in table, table
    # the hosts' CPU at the heal: the simulator's process and every process of the workers'
    # cgroups, the new attempt's still running among them (not only the shells it reaped)
    if pod["heal_cpu_hosts_how"] == "cgroups":
        assert pod["heal_live_processes"]["sleep"][0] == 4, pod["heal_live_processes"]
        assert pod["ready_cpu_hosts"] > pod["ready_cpu_hosts_sim"] > 0, pod

def test_bench_overhead_jobs_mode_lists_the_zone_once_per_poll_for_every_job(tmp_path: Path) -> None:
    table, doc = run("bench_overhead.py", tmp_path, "--jobs", "3", "--jobs-poll", "1", "--jobs-seconds", "4")
    assert "ListNodes / poll" in table and "RSS" in table, table
    (three,) = doc["runs"]
    assert three["jobs"] == 3 and three["rss_mb"] > 10
    # the jobs share the zone's list: about one a poll (the window's edges may add one), no get per job
    assert 0 < three["list_per_poll"] <= 2 and three["get_per_poll"] == 0, three


def test_bench_overhead_compute_counts_one_read_of_the_slice_per_tick(tmp_path: Path) -> None:
    table, doc = run("bench_overhead.py", tmp_path, "--api", "compute", "--virtual-ticks", "4")
    assert "MIG of 4 VMs" in table, table
    assert doc["instance"]["compute_calls"] == {"Instances/Get": 4}, doc["instance"]
    assert doc["mig"]["compute_calls"] == {"InstanceGroupManagers/Get": 4, "InstanceGroupManagers/ListManagedInstances": 4,
                                           "Instances/List": 4}, doc["mig"]


def test_bench_overhead_compute_jobs_share_one_instances_list_per_poll(tmp_path: Path) -> None:
    table, doc = run("bench_overhead.py", tmp_path, "--api", "compute", "--jobs", "3", "--jobs-poll", "1",
                     "--jobs-seconds", "4")
    assert "instances.list / poll" in table, table
    (three,) = doc["runs"]
    assert 0 < three["list_per_poll"] <= 2 and three["get_per_poll"] == 0, three


def test_bench_gcloud_calls_counts_one_gcloud_run_per_node_incarnation(tmp_path: Path) -> None:
    table, doc = run("bench_gcloud_calls.py", tmp_path, "--workers", "2", "--ticks", "3")
    assert "gcloud calls" in table
    assert doc["per_gcloud_ssh"].get("oslogin.v1.Users/GetLoginProfile") == 1  # OS Login is on
    runs = [t["gcloud_runs"] for t in doc["ticks"]]
    assert runs == [1, 0, 0], doc["ticks"]  # once for the node, then OpenSSH only
    assert all(t["gcloud_calls"] == 0 for t in doc["ticks"][1:])
    assert sum(t["gcloud_runs"] for t in doc["recreate"]) == 1  # once more for the new node


def test_bench_maintenance_measures_the_work_lost_to_an_announced_maintenance() -> None:
    # a 1 s checkpoint interval and a 30 s repair (0.5 s at the script's speed): the same events, sooner
    r = subprocess.run([sys.executable, str(SCRIPTS / "bench_maintenance.py"), "--modes", "notice,early",
                        "--repeat", "1", "--ckpt-every", "20", "--heal", "30", "--json"],
                       capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["mode"] for row in rows] == ["notice", "early"]
    for row in rows:  # facts on any machine: the event is a disruption, uncharged, resumed from a checkpoint
        assert (row["outcome"], row["charged"]) == ("disruption", False) and row["resumed_step"] > 0, row
        assert row["lost_seconds"] >= 0
    assert "share of interval" in r.stdout


def test_bench_recovery_reports_crash_medians_and_p95_against_the_3_second_target() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_recovery", SCRIPTS / "bench_recovery.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_recovery"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    assert bench.p95([1.0, 2.0, 3.0]) == 3.0
    assert bench.p95([float(i) for i in range(1, 21)]) == 19.0  # nearest rank: the 19th of 20
    assert bench.p95([1.0, None]) is None  # a run that never recovered
    st = bench.Settings(faults=("crash",), contestants=("tpuwatch", "ssh"), repeat=3)
    rs = [bench.Result("crash", "tpuwatch", i, 0.0, noticed=0.1, running=r) for i, r in enumerate((1.5, 2.0, 9.0))]
    rs += [bench.Result("crash", "ssh", i, 0.0, noticed=1.0, running=1.1) for i in range(3)]
    rows = bench.summarize(rs)
    (target,) = bench.targets(rows, st, {"delete": 60.0, "create": 120.0})
    assert target["met"] and "tpuwatch 2.0s median, 9.0s p95 over 3 run(s)" in target["measured"], target
    assert "ssh loop 1.1s median" in target["measured"]


def test_bench_limp_times_the_limp_and_the_grow_back(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPTS / "bench_limp.py"), "--slices", "2", "--min-slices", "1",
                        "--poll", "1", "--outage", "3", "--step-time", "0.02", "--ckpt-every", "10", "--json"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-4000:]
    [run0] = json.loads(r.stdout)
    # the job trained on the slice left while the other was down (3 s), and grew back after it
    assert 0 < run0["limping"] < 3 and run0["grown"] > 0 and run0["steps_lost"] >= 0
    bad = subprocess.run([sys.executable, str(SCRIPTS / "bench_limp.py"), "--min-slices", "4"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "--min-slices" in bad.stderr
