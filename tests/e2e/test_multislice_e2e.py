"""End to end: one job over the slices of a multislice queued resource, kept alive as one.

A 2-slice request "ms" (nodes np-0 and np-1, 2 workers each) runs one attempt on all 4 workers,
each told its slice and the coordinator. One slice's maintenance ends the attempt on both
slices (not charged) and the relaunch waits until both are READY+HEALTHY; a preempted slice
takes the whole request, which the watcher deletes with force and creates again as a whole
(same node count, prefix and tier), then resumes. Outcomes come from the simulated world, the
workers' processes and the journal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import STEPS, finish, trainer, trainer_env, write_config

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.errors import UsageError
from tpuwatch.sim.records import NodeSpec
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SLICES = ("np-0", "np-1")
LONG = 200  # steps: 8 s of training, long enough to see the attempt's processes


def multislice_job(sim: Simulator, tmp_path: Path, *, spot: bool = False, recreatable: bool = True,
                   queued: bool = True, steps: int = STEPS, accelerator: str = "v4-16") -> tuple[Path, dict[str, str]]:
    """The request's 2 slices READY with booted workers, and a config for the job over them."""
    labels = {"tpuwatch-job": "ms"}
    if queued:
        sim.world.queue_resource("ms", NodeSpec(accelerator_type=accelerator, spot=spot, labels=labels),
                                 node_count=2, node_prefix="np")
        sim.world.wait_for(lambda w: all(w.has_node(n) and w.node(n).state == "READY" for n in SLICES)
                           and w.get_queued_resource(sim.project, sim.zone, "ms").state == "ACTIVE", timeout=30)
    else:
        for name in SLICES:
            sim.create_node(name, accelerator, labels=labels)
    ck = sim.bucket / "ck"
    tpu: dict[str, object] = {"names": list(SLICES)}
    spec = None
    if queued:
        tpu["queued_resource"] = "ms"
    if recreatable:
        spec = {"accelerator_type": accelerator, "runtime_version": "tpu-ubuntu2204-base", "labels": labels,
                "queued_resource_tier": "spot" if spot else ""}
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, trainer(ck, steps=steps), ck, tpu=tpu, spec=spec,
                       name="ms")
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    return cfg, env


def watch(cfg: Path, env: dict[str, str]) -> cli_process.Forked:
    return cli_process.start(["watch", "-c", str(cfg)], env)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_process.run(args, env)


def trainers(sim: Simulator) -> dict[tuple[str, int], dict[str, str]]:
    """(slice node, worker) -> the environment of the job's trainer process running there."""
    out: dict[tuple[str, int], dict[str, str]] = {}
    for name in SLICES:
        if not sim.world.has_node(name):
            continue
        for w in range(sim.world.node(name).n_workers):
            try:
                pids = sim.hosts.pids(sim.node_key(name), w)
            except UsageError:  # its hosts are not booted (yet, or any more)
                continue
            for pid in pids:
                if (env := trainer_env(pid, "ms")) is not None:
                    out[(name, w)] = env
    return out


def megascale_in_tpu_env(sim: Simulator, name: str, worker: int) -> dict[str, str]:
    """The MEGASCALE_* lines of a worker's `tpu-env` metadata, parsed as JAX's cloud_tpu_cluster.py does."""
    inst = sim.world.instance_metadata(sim.node_key(name), worker)
    assert inst is not None
    pairs = (line.split(":", 1) for line in inst.attributes["tpu-env"].splitlines() if ":" in line)
    return {k.strip(): v.strip().strip("'") for k, v in pairs if k.strip().startswith("MEGASCALE_")}


def steps(sim: Simulator) -> list[int]:
    ck = sim.bucket / "ck"
    return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.exists() else []


def wait(pred: Any, timeout: float = 60, what: str = "", proc: cli_process.Forked | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    said = ""
    if proc is not None:  # what the watcher said, to see why
        proc.kill()
        said = "\n" + proc.communicate()[0][-4000:]
    raise AssertionError(f"timed out waiting for {what}{said}")


def hold_at_10(cfg: Path, tmp_path: Path, extra: str = "") -> Path:
    """The job (with `extra` trainer flags) holds at step 10 until the file <dir>/10 exists, as
    e2e_helpers.Job's hold does: it cannot finish before the test's fault is in. The dir."""
    go = tmp_path / "go"
    go.mkdir()
    cfg.write_text(cfg.read_text().replace("{checkpoint}", f"{{checkpoint}} {extra} --hold-at 10 --hold-until {go}"))
    return go


def run_through(sim: Simulator, cfg: Path, env: dict[str, str], go: Path, fault: str, *,
                release_at: int = 1, **params: Any) -> tuple[int, str]:
    """watch the job until it runs on all 4 workers with two checkpoints, inject `fault`, let the
    job past its hold (`release_at` 2: once attempt 2, which resumes at the held step and holds
    there too, runs on all 4), and follow the watch to its end: (exit code, output)."""
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 4 and len(steps(sim)) >= 2, what="the job on all 4 workers", proc=proc)
        sim.inject(fault, **params)
        if release_at == 2:
            wait(lambda: [e["TPUWATCH_ATTEMPT"] for e in trainers(sim).values()] == ["2"] * 4,
                 what="attempt 2 on all 4 workers", proc=proc)
        (go / "10").touch()
        return finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_one_attempt_runs_on_every_slice_and_one_slice_down_stops_and_restarts_them_all(
        sim: Simulator, tmp_path: Path) -> None:
    # As Google documents for multislice: once a slice is back, the others restart (3 s here).
    sim.world.delays["multislice_restart"] = 1800.0
    cfg, env = multislice_job(sim, tmp_path)
    go = hold_at_10(cfg, tmp_path)  # attempt 1 still runs when slice 1 goes down, however slow the machine
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 4 and len(steps(sim)) >= 2, what="the job on all 4 workers", proc=proc)
        seen = trainers(sim)
        coordinator = TpuAdapter(sim.project, sim.zone).require_node("np-0").workers[0].internal_ip
        for (name, w), e in seen.items():
            i = SLICES.index(name)
            assert (e["TPUWATCH_SLICE_ID"], e["TPUWATCH_NUM_SLICES"], e["TPUWATCH_WORKER_ID"]) == (str(i), "2", str(w))
            # Slices of one multislice queued resource: the runtime's tpu-env says how to join them,
            # and no MEGASCALE_* of tpuwatch's overrides it (JAX and libtpu prefer the environment).
            assert not [k for k in e if k.startswith("MEGASCALE_")], e
            assert megascale_in_tpu_env(sim, name, w) == {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator, "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": str(i)}
        assert {e["TPUWATCH_ATTEMPT"] for e in seen.values()} == {"1"}

        # Slice 1 goes into maintenance: the attempt ends on slice 0 too, and nothing is
        # launched until slice 1 is READY+HEALTHY again.
        sim.inject("maintenance", node="np-1", heal_after="60m")  # 6 s here
        # Attempt 2 resumes at the held step and holds there too: let it go once it runs on all 4.
        wait(lambda: [e["TPUWATCH_ATTEMPT"] for e in trainers(sim).values()] == ["2"] * 4,
             what="attempt 2 on all 4 workers", proc=proc)
        (go / "10").touch()
        rc, out = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    # Stopped on slice 0's 2 workers while slice 1 was down (its workers unreachable or not
    # asked), not left to hang in the collectives until slice 1 came back; relaunched on all 4.
    assert re.search(r"stopped the job on 2/[24] workers: attempt 1 ended", out), out
    assert "launched attempt 2 on 4/4 workers" in out, out
    assert "MEGASCALE_* from the TPU runtime's tpu-env (one multislice queued resource)" in out, out
    # np-1 back, np-0 restarting: still waiting; attempt 2 only once both are READY+HEALTHY
    assert "(np-0 RESTARTING/HEALTHY, np-1 READY/HEALTHY)" in out, out
    restarting = out.index("(np-0 RESTARTING/HEALTHY, np-1 READY/HEALTHY)")
    assert out.index("queued resource ms is READY+HEALTHY; launching attempt 2") > restarting > out.index("REPAIRING"), out
    assert steps(sim)[-1] == STEPS
    history = cli(env, "history", "-c", str(cfg), "--json")
    attempts = json.loads(history.stdout)["attempts"]
    assert len(attempts) == 2, attempts  # the restart of np-0 did not cost a third attempt
    assert attempts[0]["outcome"] == "disruption" and not attempts[0]["charged"], attempts
    assert "slice np-1" in attempts[0]["reason"], attempts  # which slice ended it
    assert attempts[1]["start_step"] is not None and attempts[1]["start_step"] >= 10
    # Never a delete or a create: the slice healed.
    assert sim.world.call_count("DeleteQueuedResource") == 0 and sim.world.call_count("CreateQueuedResource") == 0


def test_a_preempted_slice_recreates_the_whole_request_and_the_job_resumes(sim: Simulator, tmp_path: Path) -> None:
    cfg, env = multislice_job(sim, tmp_path, spot=True)
    old = {n: sim.world.node(n).id for n in SLICES}
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 4 and len(steps(sim)) >= 2, what="the job on all 4 workers", proc=proc)
        sim.inject("preempt", node="np-1")
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    qr = sim.world.get_queued_resource(sim.project, sim.zone, "ms")
    assert qr.state == "ACTIVE" and qr.spot
    assert sorted(n.name for n in sim.world.list_nodes(sim.project, "-")) == list(SLICES)
    assert all(sim.world.node(n).id != old[n] for n in SLICES), "both slices are new"
    # Deleted with force and created again as one request; never a node alone.
    assert sim.world.call_count("DeleteQueuedResource") == 1 and sim.world.call_count("CreateQueuedResource") == 1
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
    assert steps(sim)[-1] == STEPS
    # named as what the person made: the queued resource, not a node "ms" that does not exist
    assert "queued resource ms is deleted; creating it" in out and "node ms " not in out, out


def test_a_slice_that_ignores_sigterm_holds_up_no_recreate_and_the_log_says_what_is_true(
        sim: Simulator, tmp_path: Path) -> None:
    """np-1 stays in maintenance; np-0's processes ignore SIGTERM, as a process stuck in a
    cross-slice collective may. The stop asks and goes on: the request is deleted once
    repair_timeout is over, not after stop_grace, and the log says the processes still ran."""
    cfg, env = multislice_job(sim, tmp_path)
    go = hold_at_10(cfg, tmp_path, "--ignore-term 1")
    cfg.write_text(cfg.read_text().replace('repair_timeout = "30s"', 'repair_timeout = "2s"')
                   .replace('stop_grace = "2s"', 'stop_grace = "90s"'))
    # np-0's held attempt 1 ignores the TERM and holds on until the delete ends it
    rc, out = run_through(sim, cfg, env, go, "maintenance", release_at=2, node="np-1", stuck="REPAIRING")
    assert rc == 0, out
    assert re.search(r"asked the job to stop \(SIGTERM\) on 2/[24] workers: attempt 1 ended: stopping every worker; "
                     r"still running on w0, w1, killed after 1m30s \(recovery.stop_grace\)", out), out
    assert not re.search(r"stopped the job on 2/[24] workers: attempt 1 ended", out), out
    events = json.loads(cli(env, "history", "-c", str(cfg), "--json").stdout)["events"]
    def at(kind: str, reason: str) -> datetime:  # when the tick that decided it began
        return datetime.fromisoformat(next(e["time"] for e in events if e["kind"] == kind and reason in e["reason"]))
    # With the stop waited for, the tick that deletes could begin only after the 90 s grace.
    assert (at("delete", "repair_timeout") - at("stop", "attempt 1 ended")).total_seconds() < 45, events
    assert sim.world.call_count("DeleteQueuedResource") == 1 and steps(sim)[-1] == STEPS


def test_a_slice_replaced_by_googles_autorepair_is_waited_for_not_recreated(sim: Simulator, tmp_path: Path) -> None:
    """np-1 fails for good; Cloud TPU's multislice autorepair creates a new np-1 once hardware is
    found (6 s here, longer than repair_timeout) and restarts np-0. tpuwatch waits for that:
    no delete, no create, and the job resumes on the new slice."""
    sim.world.delays["multislice_restart"] = 3000.0  # 5 s here: longer than repair_timeout too
    cfg, env = multislice_job(sim, tmp_path)
    go = hold_at_10(cfg, tmp_path)
    cfg.write_text(cfg.read_text().replace('repair_timeout = "30s"', 'repair_timeout = "2s"\nqueue_timeout = "120s"'))
    old = sim.world.node("np-1").id
    rc, out = run_through(sim, cfg, env, go, "slice-replace", release_at=2, node="np-1",
                          hardware_after="60m")  # 6 s here
    assert rc == 0, out
    # np-0's job may run on alone while np-1 is gone (nothing in it notices here); the restart
    # of np-0 that ends the repair is seen either way
    assert re.search(r"slice np-1 of queued resource ms (is being replaced|was replaced)", out), out
    assert sim.world.call_count("DeleteQueuedResource") == 0 and sim.world.call_count("CreateQueuedResource") == 0, out
    assert sim.world.node("np-1").id != old  # Google's new slice, not tpuwatch's
    attempts = json.loads(cli(env, "history", "-c", str(cfg), "--json").stdout)["attempts"]
    assert attempts[0]["outcome"] == "disruption" and not attempts[0]["charged"], attempts
    assert steps(sim)[-1] == STEPS


def test_separately_created_slices_are_never_recreated(sim: Simulator, tmp_path: Path) -> None:
    """Nodes listed in tpu.names without a queued resource: a slice that does not come back
    needs a person; tpuwatch deletes nothing."""
    cfg, env = multislice_job(sim, tmp_path, queued=False, recreatable=True, steps=LONG)
    text = cfg.read_text().replace('repair_timeout = "30s"', 'repair_timeout = "2s"')
    cfg.write_text(text)
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 4, what="the job on all 4 workers", proc=proc)
        # No queued resource made these slices together: their tpu-env says nothing of the
        # others, so tpuwatch sets MEGASCALE_* in tpu.names order.
        coordinator = TpuAdapter(sim.project, sim.zone).require_node("np-0").workers[0].internal_ip
        for (name, w), e in trainers(sim).items():
            assert megascale_in_tpu_env(sim, name, w) == {}
            assert (e["MEGASCALE_SLICE_ID"], e["MEGASCALE_NUM_SLICES"], e["MEGASCALE_PORT"],
                    e["MEGASCALE_COORDINATOR_ADDRESS"]) == (str(SLICES.index(name)), "2", "8081", coordinator)
        sim.inject("maintenance", node="np-1", stuck="REPAIRING")
        rc, out = finish(proc, timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1, out
    assert "created one by one" in out, out
    assert "MEGASCALE_* set by tpuwatch in tpu.names order (slices created one by one)" in out, out
    assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
    assert sim.world.has_node("np-0") and sim.world.has_node("np-1")


def test_announced_maintenance_is_started_early_one_slice_at_a_time(sim: Simulator, tmp_path: Path) -> None:
    """A reschedulable window on each slice: each is started right after a checkpoint, through
    the request (performMaintenanceQueuedResource naming that slice alone), one after the other;
    the job loses one relaunch per slice and no work."""
    sim.world.delays["simulated_maintenance_heal"] = 600.0  # 1 s at speed 600
    cfg, env = multislice_job(sim, tmp_path, steps=LONG, accelerator="v6e-16")
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 8 and len(steps(sim)) >= 1, what="the job on all 8 workers", proc=proc)
        sim.inject("upcoming-maintenance", node="np-1", starts_in="7d", heal_after="10m")
        sim.inject("upcoming-maintenance", node="np-0", starts_in="8d", heal_after="10m")
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    history = json.loads(cli(env, "history", "-c", str(cfg), "--json").stdout)
    started = [e["reason"] for e in history["events"] if e["kind"] == "maintenance_started"]
    # np-1's window opens first: it goes first, then np-0; each on its own.
    assert len(started) == 2, started
    assert "queued resource ms's node np-1" in started[0] and "queued resource ms's node np-0" in started[1], started
    assert sim.world.call_count("PerformMaintenanceQueuedResource") == 2
    ends = [a for a in history["attempts"] if a["end_step"] is not None][:2]
    assert all(a["outcome"] == "disruption" and not a["charged"] for a in ends), history["attempts"]
    assert all("maintenance started early by tpuwatch" in a["reason"] for a in ends), history["attempts"]
    nxt = history["attempts"][1:3]
    # each relaunch resumes from the checkpoint its stop was taken at (or a newer one, saved while
    # the stop reached the workers): no step lost
    assert all(b["start_step"] >= a["end_step"] for a, b in zip(ends, nxt, strict=True)), history["attempts"]
    assert steps(sim)[-1] == LONG


def test_status_precheck_and_recreate_act_on_every_slice(sim: Simulator, tmp_path: Path) -> None:
    cfg, env = multislice_job(sim, tmp_path)
    status = cli(env, "status", "-c", str(cfg), "--json")
    assert status.returncode == 0, status.stderr
    assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == list(SLICES)

    pre = cli(env, "precheck", "-c", str(cfg), "--json")
    assert pre.returncode in (0, 1), pre.stderr
    assert sorted({i["worker"] for i in json.loads(pre.stdout)["items"]}) == [0, 1, 2, 3]

    plan = cli(env, "recreate", "ms", "-c", str(cfg), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    requests = json.loads(plan.stdout)
    assert requests["delete"]["method"].endswith("DeleteQueuedResource") and requests["delete"]["force"]
    spec = requests["create"]["queuedResource"]["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "np"}, spec
    old = {n: sim.world.node(n).id for n in SLICES}
    # the new request's create ends once it is accepted, its slices come seconds later: the
    # command returns once they are up, and says their new id
    sim.world.delays["queued_accept"] = 1200.0
    done = cli(env, "recreate", "ms", "-c", str(cfg), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deleting queued resource ms and its 2 slices np-0, np-1 (force)" in done.stdout, done.stdout
    assert ": new id " in done.stdout and ": new id  " not in done.stdout, done.stdout
    assert all(sim.world.node(n).id != old[n] and sim.world.node(n).state == "READY" for n in SLICES)
    assert sim.world.call_count("CreateQueuedResource") == 1 and sim.world.call_count("CreateNode") == 0
    # the new slices' startup script only sets up: nothing runs until a watcher launches on all
    assert trainers(sim) == {}


def test_a_drill_on_a_worker_of_the_second_slice_hits_that_slice_and_the_job_recovers(
        sim: Simulator, tmp_path: Path) -> None:
    cfg, env = multislice_job(sim, tmp_path, steps=100000)
    assert cli(env, "check", "-c", str(cfg)).returncode == 0  # launches attempt 1
    wait(lambda: len(trainers(sim)) == 4 and len(steps(sim)) >= 2, what="the job on all 4 workers")
    r = cli_process.run(["drill", "-c", str(cfg), "--yes", "--json", "--worker", "3"], env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["attempt"] == 2 and out["from_checkpoint"] >= 10, out
    # job worker 3 is np-1's worker 1: the event hit that VM, not np-0
    entries = {(e.node, e.worker) for e in sim.world.audit_entries() if e.method.endswith("terminate")}
    assert entries == {("np-1", "1")}, entries
    attempts = json.loads(cli(env, "history", "-c", str(cfg), "--json").stdout)["attempts"]
    assert (attempts[0]["outcome"], attempts[0]["charged"]) == ("disruption", False), attempts


def test_a_megascale_hang_ends_the_attempt_at_once_and_the_job_resumes(sim: Simulator, tmp_path: Path) -> None:
    # Worker 0 of each slice hangs once at step 30 (a marker per slice: one shared by both would
    # let the primary run on to the end whenever the other slice's worker got to it first);
    # Megascale says so after its threshold (0.5 s here, 5 min by default) and, with the flags
    # tpuwatch appends to LIBTPU_INIT_ARGS, aborts.
    once = tmp_path / "hung-once"
    cfg, env = multislice_job(sim, tmp_path, steps=LONG)
    text = cfg.read_text().replace(
        "--resume {checkpoint}", f"--resume {{checkpoint}} --hang-at 30 --fault-worker 0 --crash-once {once}-{{slice}} "
                                 "--megascale-hang-threshold 0.5")
    cfg.write_text(text)
    proc = watch(cfg, env)
    try:
        wait(lambda: len(trainers(sim)) == 4, what="the job on all 4 workers", proc=proc)
        flags = {e.get("LIBTPU_INIT_ARGS", "") for e in trainers(sim).values()}
        assert flags == {"--megascale_error_reporter_abort_on_hang=true "
                         "--megascale_error_reporter_abort_on_error=true"}, flags
        rc, out = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out
    assert Path(f"{once}-0").exists() and steps(sim)[-1] == LONG
    attempts = json.loads(cli(env, "history", "-c", str(cfg), "--json").stdout)["attempts"]
    assert len(attempts) == 2, attempts
    first = attempts[0]
    assert first["charged"] and "hung: the runtime says so (megascale_hang in worker" in first["reason"], first
    assert "Megascale hang detected: Timed out waiting for 1 graphs" in first["reason"], first
