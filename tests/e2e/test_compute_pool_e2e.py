"""End to end: a watcher-wide spare pool of Compute Engine instances ([pool] api = "compute")
shared by two jobs on instances in one `tpuwatch watch --config-dir`. Against the simulator's
Compute Engine REST face with the real `google-cloud-compute` client and real ssh.

Jobs `a` and `b` (Spot instances `a` and `b`, termination action STOP, one machine type, each
with the [tpu.compute_spec] `tpuwatch init` captures) name pool `v7`, whose one spare instance
`sp-0` is idle (labelled `tpuwatch-pool=v7`, no job's). `a` is preempted: it claims `sp-0`
(instances.setLabels) and trains there, no delete or insert on its path; its own instance,
inserted again from its spec, goes to the pool. Then `b` is preempted and takes that instance.
Never two trainers on one VM. Each trainer holds at step 100 until the test lets it go, so each
stage meets running jobs however slow the machine.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import cli_process
import pytest
from e2e_helpers import (
    Overlap,
    checkpoint_steps,
    cli_json,
    compute_job,
    finish,
    instance_key,
    job_memory,
    trainer_on_instance,
    wait_for,
    wait_while_watched,
)

from tpuwatch.errors import UsageError
from tpuwatch.journal import Journal
from tpuwatch.policy.observe import MIN_AUDIT_GAP
from tpuwatch.policy.state import Phase
from tpuwatch.sim.instances import InstanceRec
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200
JOBS = ("a", "b")
VMS = ("a", "b", "sp-0")
SPOT = {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}
DELETES = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def job(sim: Simulator, rest: RestFace, tmp: Path, name: str, *,
        hostname: str = "") -> tuple[Path, dict[str, str], Path]:
    """Spot instance `name` (with a custom `hostname`, if given) and its job, of pool v7."""
    return compute_job(sim, rest.url, tmp, name, steps=STEPS, tpu={"spare_pool": "v7"},
                       body={"scheduling": SPOT, **({"hostname": hostname} if hostname else {})})


def on(sim: Simulator, instance: str, who: str, attempt: int) -> dict[str, str] | None:
    return trainer_on_instance(sim, instance, who, attempt)


def labels(sim: Simulator, instance: str) -> dict[str, str]:
    """Its labels; {} while it is gone (deleted to be inserted again)."""
    try:
        return dict(sim.world.instance(instance).labels)
    except UsageError:
        return {}


def instance(sim: Simulator, name: str) -> InstanceRec | None:
    try:
        return sim.world.instance(name)
    except UsageError:
        return None


def claims(tmp: Path, name: str) -> list[str]:
    with Journal.open(tmp / "state", name, name, readonly=True) as journal:
        return [e.reason for e in journal.events() if e.kind == "pool_claim"]


def test_two_compute_jobs_share_one_pool_instance_and_a_returned_instance_serves_the_next_loss(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    a, env, go_a = job(sim, rest, tmp_path, "a")
    b, _, go_b = job(sim, rest, tmp_path, "b")
    sim.world.add_instance("sp-0", body={"labels": {"tpuwatch-pool": "v7"}})
    (tmp_path / "jobs" / "pool-v7.toml").write_text(
        f'[pool]\nname = "v7"\nzone = "{sim.zone}"\napi = "compute"\nmachine_type = "tpu7x-standard-4t"\n'
        'spares = ["sp-0"]\n')
    spare_id = sim.world.instance("sp-0").id
    proc = cli_process.start(["watch", "--config-dir", str(tmp_path / "jobs"), "--json"], env)
    overlap = Overlap(sim, VMS, JOBS, instance_key)
    try:
        wait_while_watched(lambda: on(sim, "a", "a", 1) is not None and on(sim, "b", "b", 1) is not None
                           and len(checkpoint_steps(sim.bucket / "a")) >= 2, proc, "both jobs training")
        sim.world.stockout()  # a's own instance is not inserted again until the test lifts it: a stage to look at
        sim.world.preempt_instance("a")
        wait_while_watched(lambda: on(sim, "sp-0", "a", 2) is not None, proc, "job a's attempt 2 on pool spare sp-0",
                           timeout=120)
        assert labels(sim, "sp-0") == {"tpuwatch-job": "a", "tpuwatch-pool": "v7"}
        # nothing deleted or inserted on a's path: sp-0 is the VM it was
        assert sim.world.instance("sp-0").id == spare_id
        assert on(sim, "b", "b", 1) is not None  # b untouched
        sim.inject("clear-errors")
        wait_while_watched(lambda: labels(sim, "a") == {"tpuwatch-pool": "v7"}, proc,
                           "instance a inserted again and returned to the pool", timeout=150)
        assert on(sim, "sp-0", "a", 2) is not None  # a stays where it runs
        assert sim.world.instance("a").metadata["tpuwatch-launch"] == "false"  # never starts a job at boot
        sim.world.preempt_instance("b")
        wait_while_watched(lambda: on(sim, "a", "b", 2) is not None, proc,
                           "job b's attempt 2 on instance a, returned to the pool", timeout=150)
        assert labels(sim, "a") == {"tpuwatch-job": "b", "tpuwatch-pool": "v7"}
        # b's own instance, inserted again, goes to the pool; preempted there, idle (TERMINATED), the
        # pool's keeper deletes it and inserts it again from its own [tpu.compute_spec.instance]
        wait_while_watched(lambda: labels(sim, "b") == {"tpuwatch-pool": "v7"}
                           and sim.world.instance("b").status == "RUNNING", proc,
                           "instance b inserted again and returned to the pool", timeout=150)
        idle_id = sim.world.instance("b").id
        sim.world.preempt_instance("b")
        wait_while_watched(lambda: (vm := instance(sim, "b")) is not None and vm.id != idle_id
                           and vm.status == "RUNNING", proc, "idle pool spare b inserted again by the pool's keeper",
                           timeout=150)
        assert labels(sim, "b") == {"tpuwatch-pool": "v7"}
        (go_a / "100").touch()
        (go_b / "100").touch()
        wait_while_watched(lambda: all((m := job_memory(tmp_path / "state", j)) is not None and m.phase is Phase.DONE
                                       for j in JOBS), proc, "both jobs done", timeout=150)
        proc.send_signal(signal.SIGINT)
        rc, out = finish(proc, timeout=60)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    for cfg, name in ((a, "a"), (b, "b")):
        assert checkpoint_steps(sim.bucket / name)[-1] == STEPS
        done = cli_json(cfg, env, "history")["attempts"]
        assert [(x["outcome"], x["charged"]) for x in done] == [("disruption", False), ("success", False)], done
    # the journals say each claim; the sim served each as a setLabels
    assert any("claimed sp-0 from spare pool v7" in e for e in claims(tmp_path, "a"))
    assert any("claimed a from spare pool v7" in e for e in claims(tmp_path, "b"))
    assert sim.world.calls.get("compute.v1.Instances/SetLabels", 0) >= 3, sim.world.calls
    ticks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    held = [{n["name"]: n["held_by"] for n in t["spare_pool"]["nodes"]} for t in ticks if t.get("spare_pool")]
    assert {"sp-0": "a", "a": None} in held and {"sp-0": "a", "a": "b"} in held, held[-3:]
    assert any(t.get("job") == "a" and t.get("row") == "pool_return" for t in ticks)
    remade = [t.get("summary", "") for t in ticks if t.get("row") == "spare_remake"]
    assert any("b, an idle spare of pool v7, is PREEMPTED" in s for s in remade), remade
    assert any("creating it from [tpu.compute_spec.instance] of job" in s for s in remade), remade


def test_a_pool_spare_is_inserted_from_the_keepers_spec_as_the_pools_with_a_hostname_of_its_own(
        sim: Simulator, rest: RestFace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper's VM has a custom hostname, which `init` captures: a pool spare made from that
    spec takes its own name there, the pool's label and no job's, and never starts a job at boot."""
    from tpuwatch.cloud.compute.adapter import ComputeAdapter
    from tpuwatch.config import load_config
    from tpuwatch.recreate import start_pool_create

    cfg, env, _ = job(sim, rest, tmp_path, "a", hostname="a.corp.example")
    monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", env["TPUWATCH_COMPUTE_EMULATOR"])
    config = load_config(cfg)
    assert config.tpu["compute_spec"]["instance"]["hostname"] == "a.corp.example"  # as init saw it
    start_pool_create(ComputeAdapter(sim.project, sim.zone, "instance"), config, "sp-1", sim.zone, "v7")
    sim.world.wait_for(lambda w: any(r.name == "sp-1" for r in w.instances()), timeout=30)
    made = sim.world.instance("sp-1")
    assert made.hostname == "sp-1.corp.example" and sim.world.instance("a").hostname == "a.corp.example"
    assert dict(made.labels) == {"tpuwatch-pool": "v7"} and made.metadata["tpuwatch-launch"] == "false"


def test_a_claimed_spare_instance_whose_checks_fail_goes_back_to_the_pool_marked_bad_and_is_inserted_again(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    a, env, go_a = job(sim, rest, tmp_path, "a")
    for spare in ("sp-0", "sp-1"):
        sim.world.add_instance(spare, body={"labels": {"tpuwatch-pool": "v7"}, "scheduling": SPOT})
    sim.world.bad_host("sp-0", "device-missing")  # sp-0, the first by name, fails the launch-time checks
    bad_id = sim.world.instance("sp-0").id
    (tmp_path / "jobs" / "pool-v7.toml").write_text(
        f'[pool]\nname = "v7"\nzone = "{sim.zone}"\napi = "compute"\nspares = ["sp-0", "sp-1"]\n')
    proc = cli_process.start(["watch", "--config-dir", str(tmp_path / "jobs")], env)
    try:
        wait_while_watched(lambda: on(sim, "a", "a", 1) is not None, proc, "job a training")
        sim.world.stockout()  # a's own instance is not inserted again meanwhile: only the pool can serve
        sim.world.preempt_instance("a")
        wait_while_watched(lambda: on(sim, "sp-1", "a", 2) is not None, proc,
                           "job a on pool spare sp-1, sp-0 having failed its checks", timeout=120)
        assert labels(sim, "sp-1") == {"tpuwatch-job": "a", "tpuwatch-pool": "v7"}
        assert on(sim, "sp-0", "a", 2) is None
        sim.inject("clear-errors")
        # back in the pool marked bad, then deleted and inserted again by the keeper (job a): a new
        # instance, idle, unmarked
        wait_while_watched(lambda: (vm := instance(sim, "sp-0")) is not None and vm.id != bad_id
                           and vm.status == "RUNNING", proc, "sp-0 inserted again by the pool's keeper", timeout=150)
        assert labels(sim, "sp-0") == {"tpuwatch-pool": "v7"}
        (go_a / "100").touch()
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "a")) is not None and m.phase is Phase.DONE,
                           proc, "job a done", timeout=150)
        proc.send_signal(signal.SIGINT)
        rc, out = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert "launch-time checks fail on spare sp-0" in out, out[-4000:]
    assert [(x["outcome"], x["charged"]) for x in cli_json(a, env, "history")["attempts"]] == [
        ("disruption", False), ("success", False)]
    with Journal.open(tmp_path / "state", "a", "a", readonly=True) as journal:
        marked = [e for e in journal.events() if e.kind == "relabel" and e.data.get("node") == "sp-0"]
    assert marked and marked[0].data["labels"] == {"tpuwatch-pool": "v7", "tpuwatch-pool-bad": "a"}, marked


def test_status_of_a_job_of_a_pool_of_instances_shows_its_spares_and_why_one_cannot_be_claimed(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """`status -c` of a job of the pool: the pool's instances beside the job's, idle or held; one
    whose metadata starts a job at boot said unclaimable, and why."""
    a, env, _ = job(sim, rest, tmp_path, "a")
    sim.world.add_instance("sp-0", body={"labels": {"tpuwatch-pool": "v7"}})
    boots = {"items": [{"key": "tpuwatch-job", "value": "x"}, {"key": "tpuwatch-command", "value": "python3 t.py"},
                       {"key": "tpuwatch-worker-script", "value": "#!/bin/sh"}]}
    sim.world.add_instance("sp-1", body={"labels": {"tpuwatch-pool": "v7"}, "metadata": boots})
    shown = cli_json(a, env, "status")
    assert [n["name"] for n in shown["nodes"]] == ["a", "sp-0", "sp-1"], shown["nodes"]
    pool = shown["spare_pool"]
    assert (pool["name"], pool["idle"]) == ("v7", 1), pool
    why = {n["name"]: n["unclaimable"] for n in pool["nodes"]}
    assert why["sp-0"] is None and "starts a job at boot" in why["sp-1"], why


def test_a_pool_of_vms_google_deletes_itself_keeps_its_size_and_never_makes_again_one_a_person_deleted(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Job `a` and the pool's two idle instances are Spot VMs with termination action DELETE:
    Google deletes each at its preemption (compute.instances.preempted in the audit log). `a`
    preempted (the watcher paused through the stop) ends its attempt and claims sp-0, and its own
    instance, inserted again from its spec, goes to the pool;
    preempted there, idle, the pool's keeper inserts it again, labelled the pool's. A person
    deletes sp-1 (stopping, then gone, as Google's deletion looks, but no system event): waited
    for Google's word, never inserted."""
    a, env, go_a = compute_job(sim, rest.url, tmp_path, "a", steps=STEPS, tpu={"spare_pool": "v7"},
                               body={"scheduling": DELETES})
    for spare in ("sp-0", "sp-1"):
        sim.world.add_instance(spare, body={"labels": {"tpuwatch-pool": "v7"}, "scheduling": DELETES})
    (tmp_path / "jobs" / "pool-v7.toml").write_text(
        f'[pool]\nname = "v7"\nzone = "{sim.zone}"\napi = "compute"\nspares = ["sp-0", "sp-1"]\n')
    proc = cli_process.start(["watch", "--config-dir", str(tmp_path / "jobs"), "--json"], env)
    overlap = Overlap(sim, ("a", "sp-0"), ("a",), instance_key)
    try:
        wait_while_watched(lambda: on(sim, "a", "a", 1) is not None and (m := job_memory(tmp_path / "state", "a"))
                           is not None and m.limp.pool_word.deletes == ("sp-0", "sp-1"), proc,
                           "job a training, the pool's VMs Google may delete watched by its keeper")
        # the watcher does not look while Google stops and deletes the VM (as a 30 s poll may
        # miss it): it reads the VM running, then gone, and the audit log's word at once (its
        # last read, before it stopped, long enough ago to read it again: MIN_AUDIT_GAP)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGSTOP)
        try:
            sim.world.preempt_instance("a")
            wait_for(lambda: instance(sim, "a") is None and time.monotonic() > stopped + MIN_AUDIT_GAP + 0.5,
                     timeout=60, what="instance a deleted by Google")
        finally:
            proc.send_signal(signal.SIGCONT)
        wait_while_watched(lambda: on(sim, "sp-0", "a", 2) is not None, proc, "job a's attempt 2 on pool spare sp-0",
                           timeout=120)
        wait_while_watched(lambda: labels(sim, "a") == {"tpuwatch-pool": "v7"}
                           and sim.world.instance("a").status == "RUNNING"
                           and (m := job_memory(tmp_path / "state", "a")) is not None
                           and "a" in m.limp.pool_word.deletes, proc,
                           "instance a inserted again, returned to the pool and watched there", timeout=150)
        idle = sim.world.instance("a").id
        sim.world.preempt_instance("a")
        sim.world.delete_instance(sim.project, sim.zone, "sp-1")  # a person's instances.delete
        wait_while_watched(lambda: (vm := instance(sim, "a")) is not None and vm.id != idle
                           and vm.status == "RUNNING", proc, "idle instance a inserted again by the pool's keeper",
                           timeout=150)
        assert labels(sim, "a") == {"tpuwatch-pool": "v7"}
        # seen gone: waited for Google's word (3 min), or past that dropped as a person's deletion
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "a")) is not None
                           and "sp-1" not in m.limp.pool_word.deletes, proc, "sp-1 seen gone by the pool's keeper")
        (go_a / "100").touch()
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "a")) is not None and m.phase is Phase.DONE,
                           proc, "job a done", timeout=150)
        proc.send_signal(signal.SIGINT)
        rc, out = finish(proc, timeout=60)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    assert [(x["outcome"], x["charged"]) for x in cli_json(a, env, "history")["attempts"]] == [
        ("disruption", False), ("success", False)]
    # instance a twice (its loss, then idle in the pool), never sp-1; nothing deleted by tpuwatch
    assert sim.world.calls.get("compute.v1.Instances/Insert", 0) == 2, sim.world.calls
    assert sim.world.calls.get("compute.v1.Instances/Delete", 0) == 0, sim.world.calls
    assert instance(sim, "sp-1") is None
    ticks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    remade = [t.get("summary", "") for t in ticks if t.get("row") == "spare_remake"]
    assert any("a, a spare of pool v7, is gone" in s and "by Google at its preemption" in s for s in remade), remade
    assert not any("sp-1" in s for s in remade), remade


def test_a_job_that_takes_over_as_the_pools_keeper_inserts_again_an_idle_vm_google_deleted_before(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Another watcher on the same state dir keeps pool v7 (the test holds its keeper lock, as that
    watcher's keeper job would: the moment between keepers is then the test's to choose). Google
    deletes the pool's idle VM sp-0 at its preemption. Job `a`, not the keeper, watches sp-0 too
    and reads Google's word, but inserts nothing; once the other keeper is gone (its lock
    released), `a` keeps the pool and inserts sp-0 again, labelled the pool's."""
    import fcntl
    import os

    a, env, go_a = compute_job(sim, rest.url, tmp_path, "a", steps=STEPS, tpu={"spare_pool": "v7"},
                               body={"scheduling": DELETES})
    sim.world.add_instance("sp-0", body={"labels": {"tpuwatch-pool": "v7"}, "scheduling": DELETES})
    (tmp_path / "jobs" / "pool-v7.toml").write_text(
        f'[pool]\nname = "v7"\nzone = "{sim.zone}"\napi = "compute"\nspares = ["sp-0"]\n')
    (tmp_path / "state").mkdir(exist_ok=True)
    other = os.open(tmp_path / "state" / "pool.v7.keeper", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)
    proc = cli_process.start(["watch", "--config-dir", str(tmp_path / "jobs"), "--json"], env)
    try:
        wait_while_watched(lambda: on(sim, "a", "a", 1) is not None and (m := job_memory(tmp_path / "state", "a"))
                           is not None and m.limp.pool_word.deletes == ("sp-0",), proc,
                           "job a training and watching the pool's VM Google may delete, not being its keeper")
        sim.world.preempt_instance("sp-0")
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "a")) is not None
                           and m.limp.pool_remaking == ("sp-0",), proc,
                           "sp-0 deleted by Google, and its word read by job a")
        assert instance(sim, "sp-0") is None
        assert sim.world.calls.get("compute.v1.Instances/Insert", 0) == 0, "inserted by a job not the keeper"
        os.close(other)  # the other watcher's keeper is gone
        other = -1
        wait_while_watched(lambda: (vm := instance(sim, "sp-0")) is not None and vm.status == "RUNNING", proc,
                           "sp-0 inserted again by job a, the pool's keeper now", timeout=120)
        assert labels(sim, "sp-0") == {"tpuwatch-pool": "v7"}
        assert on(sim, "a", "a", 1) is not None  # the job untouched
        (go_a / "100").touch()
        wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "a")) is not None and m.phase is Phase.DONE,
                           proc, "job a done", timeout=150)
        proc.send_signal(signal.SIGINT)
        rc, out = finish(proc, timeout=60)
    finally:
        if other >= 0:
            os.close(other)
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert sim.world.calls.get("compute.v1.Instances/Insert", 0) == 1, sim.world.calls
    assert sim.world.calls.get("compute.v1.Instances/Delete", 0) == 0, sim.world.calls
    ticks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    remade = [t.get("summary", "") for t in ticks if t.get("row") == "spare_remake"]
    assert any("sp-0, a spare of pool v7, is gone" in s and "by Google at its preemption" in s for s in remade), remade
    assert not any(t.get("row") == "spare_gone" for t in ticks)
