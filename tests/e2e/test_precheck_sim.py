"""Environment checks end to end: `tpuwatch precheck`, `watch` and `check` against the
simulator over real OpenSSH, with the simulator's host faults (disk nearly full, small /dev/shm,
device missing, stale lockfile, DNS failure, an orphan holding a device).

Outcomes are read from `precheck --json`, the journal (`history --json`), the simulator's world
(node ids, call counters) and the workers' host roots, not from tpuwatch's words alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import STEPS, Job, finish

from tpuwatch.sim.simulator import Simulator

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the disk-full and small-shm faults mount a small tmpfs per "
                                                 "worker, which needs root (CI runs as root)")
LOOSE = {"min_disk": "100MB", "min_shm": "100MB"}  # what a simulated host on this machine surely has


def add_precheck(job: Job, **keys: Any) -> None:
    lines = ["[precheck]"] + [f"{k} = {json.dumps(v)}" for k, v in {**LOOSE, **keys}.items()]
    with open(job.cfg, "a") as f:
        f.write("\n".join(lines) + "\n")


def precheck(job: Job, *args: str) -> tuple[int, dict[str, Any]]:
    r = job.cli("precheck", "-c", str(job.cfg), "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def failing(out: dict[str, Any]) -> set[tuple[str, int]]:
    return {(i["check"], i["worker"]) for i in out["items"] if i["verdict"] == "fail"}


def verdicts(out: dict[str, Any], check: str) -> dict[int, str]:
    return {i["worker"]: i["verdict"] for i in out["items"] if i["check"] == check}


def test_each_check_fails_on_its_fault_and_only_there(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path)
    add_precheck(job)
    rc, out = precheck(job)
    assert rc == 0 and out["ok"] and failing(out) == set(), out
    assert {i["worker"] for i in out["items"]} == {0, 1, 2, 3}
    sim.inject("device-missing", node="pod", worker=1)
    sim.inject("stale-lockfile", node="pod", worker=2)
    sim.inject("dns-failure", node="pod", worker=3)
    sim.inject("orphan-holder", node="pod", worker=0)
    rc, out = precheck(job)
    assert rc == 1 and not out["ok"]
    assert failing(out) == {("devices", 1), ("libtpu_lock", 2), ("dns", 3), ("device_holders", 0)}, out
    by = {(i["check"], i["worker"]): i for i in out["items"]}
    assert by[("devices", 1)]["value"].startswith("3 TPU device(s)") and not by[("devices", 1)]["fixable"]
    assert by[("libtpu_lock", 2)]["fixable"] and by[("device_holders", 0)]["fixable"]
    assert "127." in by[("dns", 3)]["detail"]
    # the other workers still resolve worker 3 (only its own resolver broke)
    assert verdicts(out, "dns") == {0: "pass", 1: "pass", 2: "pass", 3: "fail"}
    # the table for people says the same, one row per failing item
    r = job.cli("precheck", "-c", str(job.cfg))
    assert r.returncode == 1 and "4 check(s) failed on pod" in r.stdout, r.stdout
    for check in ("devices", "libtpu_lock", "dns", "device_holders"):
        assert check in r.stdout


@needs_root
def test_disk_nearly_full_and_small_shm_fail_on_their_worker(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16")
    add_precheck(job, cache_path="~/cache", min_cache="100MB")
    rc, out = precheck(job)
    assert rc == 0, out
    sim.inject("disk-full", node="pod", worker=0)
    sim.inject("small-shm", node="pod", worker=1)
    sim.inject("disk-full", node="pod", worker=1, path="~/cache")
    rc, out = precheck(job)
    assert failing(out) == {("disk", 0), ("shm", 1), ("cache", 1)}, out
    by = {(i["check"], i["worker"]): i for i in out["items"]}
    assert by[("disk", 0)]["threshold"] == "> 100 MB (precheck.min_disk)"
    assert "free at /" in by[("disk", 0)]["value"] and "total at /dev/shm" in by[("shm", 1)]["value"]
    # the devices of the worker whose root filesystem changed are still there
    assert verdicts(out, "devices") == {0: "pass", 1: "pass"}
    key = sim.node_key("pod")
    root0 = sim.hosts.host_root(key, 0)
    assert os.path.ismount(root0)
    sim.close()  # the simulator unmounts what it mounted
    assert not os.path.ismount(root0)


def test_ulimit_and_interpreter_and_a_hanging_custom_check(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16")
    # the job runs a venv's python that only worker 0 has
    job.cfg.write_text(job.cfg.read_text().replace('command = "python3 -m', 'command = "~/venv/bin/python -m'))
    venv = sim.hosts.worker_home(sim.node_key("pod"), 0) / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    add_precheck(job, min_open_files=10**7)
    with open(job.cfg, "a") as f:
        f.write('[[precheck.custom]]\nname = "hangs"\ncommand = "sleep 600"\ntimeout = "1s"\n'
                '[[precheck.custom]]\nname = "worker-one"\ncommand = "test \\"$TPUWATCH_SIM_WORKER_ID\\" = 1"\n')
    rc, out = precheck(job)
    assert rc == 1
    assert failing(out) == {("ulimit", 0), ("ulimit", 1), ("custom:hangs", 0), ("custom:hangs", 1),
                            ("custom:worker-one", 0), ("interpreter", 1)}, out
    hang = next(i for i in out["items"] if i["check"] == "custom:hangs")
    assert hang["value"] == "killed after 1s"
    ulimit = next(i for i in out["items"] if i["check"] == "ulimit")
    assert "precheck.min_open_files" in ulimit["detail"] and "open files" in ulimit["value"]
    # a tick with a hanging check goes on: it decides (no launch, not charged) and returns
    start = time.monotonic()
    r = job.cli("check", "-c", str(job.cfg), "--json")
    assert r.returncode == 0, r.stderr
    tick = json.loads(r.stdout)
    assert tick["row"] == "precheck_wait" and "custom:hangs" in tick["summary"], tick["summary"]
    assert tick["budgets"]["restarts"] == 0 and time.monotonic() - start < 30


@pytest.mark.slow
def test_a_stale_lockfile_is_removed_and_the_launch_goes_ahead(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, steps=30)
    add_precheck(job)
    sim.inject("stale-lockfile", node="pod", worker=1)
    sim.inject("orphan-holder", node="pod", worker=2)
    lock = sim.hosts.host_root(sim.node_key("pod"), 1) / "tmp" / "libtpu_lockfile"
    assert lock.exists()
    r = job.cli("check", "-c", str(job.cfg), "--json")
    assert r.returncode == 0, r.stderr
    tick = json.loads(r.stdout)
    assert tick["row"] == "launch", tick  # fixed and checked again within the same tick
    assert tick["precheck"]["ok"] and tick["attempt"] == 1
    assert not lock.exists()
    rc, out = finish(job.watch())
    assert rc == 0, out
    hist = job.history()
    rows = [e for e in hist["events"] if e["kind"] == "stop" and "fix before the launch" in e["reason"]]
    assert rows and "w1 libtpu_lock" in rows[0]["reason"] and "w2 device_holders" in rows[0]["reason"], hist["events"]
    assert [a["charged"] for a in hist["attempts"]] == [False], hist["attempts"]
    assert job.steps_done()[-1] == 30


@pytest.mark.slow
def test_a_node_back_from_maintenance_with_a_device_missing_is_recreated_uncharged(
        sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, recreatable=True, repair_timeout="2s", hold_at=10)
    add_precheck(job, interval="1s")
    old = sim.world.node("pod").id
    proc = job.watch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("device-missing", node="pod", worker=2)  # a chip dies; it stays dead across reboots
    sim.inject("maintenance", node="pod", heal_after=600)  # 1 s
    job.release()
    rc, out = finish(proc, timeout=150)
    assert rc == 0, out
    node = sim.world.node("pod")
    assert node.id != old, "the node with the dead chip was not recreated"
    hist = job.history()
    attempts = hist["attempts"]
    assert len(attempts) >= 2 and not any(a["charged"] for a in attempts), (attempts, out)
    deletes = [e for e in hist["events"] if e["kind"] == "delete"]
    assert deletes and "environment checks failing" in deletes[0]["reason"] and "w2 devices" in deletes[0]["reason"]
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 1
    assert job.steps_done()[-1] == STEPS
    mem = job.memory()
    assert mem["budgets"]["restarts"] == 0 and mem["budgets"]["recreates"] == 1, mem


@pytest.mark.slow
def test_a_job_that_fails_with_every_check_green_is_charged(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    job = Job(sim, tmp_path, f"--segfault-at 25 --fault-worker 1 --crash-once {marker}")
    add_precheck(job, interval="1s")
    rc, out = finish(job.watch())
    assert rc == 0, out
    hist = job.history()
    attempts = hist["attempts"]
    assert len(attempts) == 2 and attempts[0]["charged"] is True, attempts
    checks = [e for e in hist["events"] if e["kind"] == "precheck"]
    assert checks and all(e["data"]["ok"] for e in checks), checks
    assert not any(i["verdict"] == "fail" for e in checks for i in e["data"]["items"])


def test_status_and_check_show_the_failing_items(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16", repair_timeout="1h")
    add_precheck(job)
    sim.inject("device-missing", node="pod", worker=1, count=2)
    r = job.cli("check", "-c", str(job.cfg))
    assert r.returncode == 0, r.stderr
    assert "environment checks fail: w1 devices: 2 TPU device(s)" in r.stdout and "not charged" in r.stdout
    s = job.cli("status", "-c", str(job.cfg))
    assert s.returncode == 0, s.stderr
    assert "FAIL w1 devices: 2 TPU device(s)" in s.stdout, s.stdout
    j = job.cli("status", "-c", str(job.cfg), "--json")
    facts = json.loads(j.stdout)["nodes"][0]["job"]
    assert facts["job"].startswith("pod: waiting_node") and not facts["precheck"]["ok"]


def test_host_faults_in_scenario_files_and_their_bad_options() -> None:
    from tpuwatch.errors import UsageError
    from tpuwatch.sim import faults, scenario

    s = scenario.parse({
        "node": [{"name": "pod", "accelerator_type": "v4-16"}],
        "step": [{"at": "1m", "fault": "device-missing", "node": "pod", "worker": 1, "count": 2},
                 {"at": "2m", "fault": "stale-lockfile", "node": "pod"},
                 {"at": "3m", "fault": "dns-failure", "node": "pod", "worker": 1}],
    })
    assert [(st.fault, st.params.get("worker"), st.params.get("count")) for st in s.steps] == [
        ("device-missing", 1, 2), ("stale-lockfile", 0, None), ("dns-failure", 1, None)]
    if ROOT:
        assert faults.normalize("disk-full", {"node": "pod", "free": "5MB"})["free"] == 5_000_000
        assert faults.normalize("small-shm", {"node": "pod", "size": "1GiB"})["size"] == 2**30
        with pytest.raises(UsageError, match="size: '5 parsecs' is not a size"):
            faults.normalize("small-shm", {"node": "pod", "size": "5 parsecs"})
    else:
        with pytest.raises(UsageError, match="needs root"):
            faults.normalize("disk-full", {"node": "pod"})
    with pytest.raises(UsageError, match="worker: expected a whole number"):
        faults.normalize("dns-failure", {"node": "pod", "worker": "two"})


def test_sim_inject_cli_and_a_worker_out_of_range(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path, accelerator="v4-16")
    r = job.cli("sim", "inject", "stale-lockfile", "pod", "--worker", "1")
    assert r.returncode == 0, r.stderr
    assert (sim.hosts.host_root(sim.node_key("pod"), 1) / "tmp" / "libtpu_lockfile").exists()
    r = job.cli("sim", "inject", "device-missing", "pod", "--worker", "7")
    assert r.returncode == 2 and "worker must be 0..1" in r.stderr, r.stderr


def test_a_relaunch_after_maintenance_costs_two_sessions_on_one_connection_per_worker(sim: Simulator, tmp_path: Path) -> None:
    """The launch-time checks ride along in the probe's session, and the cleanup in the
    launch's: one round to look, one to start, as two channels on one connection per worker
    (counted by the workers' SSH servers)."""
    job = Job(sim, tmp_path, steps=100000)
    add_precheck(job)
    key = sim.node_key("pod")
    workers = range(sim.world.node("pod").n_workers)

    def accepted() -> list[tuple[int, int]]:  # (connections, sessions) per worker
        return [(sim.hosts.accepted(key, w), sim.hosts.sessions(key, w)) for w in workers]

    def delta(now: list[tuple[int, int]], before: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [(a - b, c - d) for (a, c), (b, d) in zip(now, before, strict=True)]

    before = accepted()
    first = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
    assert first["row"] == "launch" and first["precheck"]["context"] == "launch", first
    assert delta(accepted(), before) == [(1, 2)] * 4
    job.wait(lambda: len(job.job_processes()) == 4, what="the trainer on every worker")
    # The maintenance heals when the test says, once a `check` has seen the node down: a heal on
    # a timer could come before that check's process has read the node on a busy machine.
    sim.inject("maintenance", node="pod", heal_after=10**6)
    job.wait(lambda: sim.world.node("pod").health != "HEALTHY", what="maintenance under way")
    down = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
    assert down["phase"] == "waiting_node", down
    sim.inject("heal", node="pod")
    job.wait(lambda: sim.world.node("pod").health == "HEALTHY" and sim.world.node("pod").state == "READY",
             what="the node back")
    before = accepted()
    back = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
    assert back["row"] == "launch" and back["attempt"] == 2 and back["precheck"]["ok"], back
    assert delta(accepted(), before) == [(1, 2)] * 4
    job.wait(lambda: len(job.job_processes()) == 4, what="attempt 2 on every worker")
    assert [a["charged"] for a in job.history()["attempts"]] == [False, None]  # uncharged; 2 runs
    # a steady tick reports what hang detection knows, and each worker's log size
    steady = json.loads(job.cli("check", "-c", str(job.cfg), "--json").stdout)
    assert steady["row"] == "running" and steady["hang"]["timeout"] == "auto", steady
    assert all(isinstance(w["log_bytes"], int) for w in steady["workers"]), steady["workers"]
