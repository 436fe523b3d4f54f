"""End to end on Compute Engine: `tpuwatch watch` on a slice made through Compute Engine (a MIG of
TPU7x VMs, or an instance), against the simulator's Compute Engine REST face with the real
`google-cloud-compute` client and real ssh to the simulated VMs.

Each test reads its outcome from the journal (`history --json`), the trainer's checkpoints and
the simulated world (instance ids, what is left), never from tpuwatch's own words alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import STEPS, finish, tick_until, trainer, write_config

from tpuwatch.journal import Journal
from tpuwatch.policy import Phase
from tpuwatch.ports import Flags
from tpuwatch.sim.hostfaults import TPU_FAULT_FILE
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator
from tpuwatch.tick import Reconciler, TickReport
from tpuwatch.wiring import load_job, real_ports

pytestmark = pytest.mark.slow


class CeJob:
    """A job whose slice is a Compute Engine instance or MIG of the simulator, watched by the CLI."""

    def __init__(self, sim: Simulator, rest: RestFace, tmp: Path, kind: str, name: str, *,
                 hold_at: int | None = None, before: str = "", **recovery: str | int | bool) -> None:
        self.sim, self.ck, self.go, self.name = sim, sim.bucket / "ck", tmp / "go", name
        extra = ""
        if hold_at is not None:  # the job stalls at that step until release(): a fault meets it running
            self.go.mkdir()
            extra = f"--hold-at {hold_at} --hold-until {self.go}"
        self.hold_at = hold_at
        self.cfg = write_config(tmp / "tpuwatch.toml", sim, before + trainer(self.ck, extra), self.ck, name=name,
                                tpu={"api": "compute", kind: name}, **recovery)
        # The simulator names each VM made through Compute Engine in its own hosts file only, so
        # a MIG's peers do not resolve there (Compute Engine's internal DNS resolves them).
        with self.cfg.open("a") as f:
            f.write('[precheck]\nskip = ["dns"]\n')
        self.env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state"),
                    "TPUWATCH_COMPUTE_EMULATOR": rest.url.rstrip("/")}

    def watch(self) -> cli_process.Forked:
        return cli_process.start(["watch", "-c", str(self.cfg)], self.env)

    def capture_spec(self, edit: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Append to the job's config the spec `tpuwatch init` writes for its slice (what a recreate
        makes it again from), changed by `edit` first when given."""
        import tomli_w

        init = cli_process.run(["init", self.name, "-o", str(self.cfg.parent / "init.toml"), "--json"], self.env)
        assert init.returncode == 0, init.stderr
        spec = json.loads(init.stdout)["spec"]
        if edit is not None:
            edit(spec)
        with self.cfg.open("a") as f:
            f.write(tomli_w.dumps({"tpu": {"compute_spec": spec}}))

    def history(self) -> dict[str, Any]:
        out = cli_process.run(["history", "-c", str(self.cfg), "--json"], self.env)
        assert out.returncode == 0, out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    def assert_resumed_uncharged(self, out: str) -> None:
        """The first attempt ended as a disruption, not charged; the second resumed from a checkpoint."""
        first, second = self.history()["attempts"][:2]
        assert first["outcome"] == "disruption" and first["charged"] is False, out
        assert second["start_step"] is not None and second["start_step"] >= 10, second

    def release(self) -> None:
        assert self.hold_at is not None
        (self.go / str(self.hold_at)).touch()

    def steps_done(self) -> list[int]:
        return sorted(int(p.name) for p in self.ck.iterdir() if p.name.isdigit()) if self.ck.exists() else []


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def wait(pred: Callable[[], bool], what: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until `pred()`; on a timeout, the watch is stopped and what it printed is shown."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end or proc.poll() is not None:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"timed out waiting for {what}; watch printed:\n{out}")
        time.sleep(0.1)


def ids(sim: Simulator) -> dict[str, int]:
    return {r.name: r.id for r in sim.world.instances()}


def writes(sim: Simulator) -> list[str]:
    """The Compute Engine calls that change something, as the world counted them (a MIG's resize
    requests listed, as `status` does, are read)."""
    return sorted(m for m in sim.world.calls if m.startswith("compute.") and not m.endswith(("/List", "/Get")) and
                  any(verb in m for verb in ("Delete", "Insert", "RecreateInstances", "Stop", "Resize")))


def test_a_tpu7x_multi_host_mig_through_a_healed_host_error_resumes_and_nothing_is_deleted(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.host_error(sorted(mig.members)[1], restart_after=1800)  # the whole slice; back 3 s later
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    attempts = job.history()["attempts"]
    assert len(attempts) >= 2, out
    first, second = attempts[0], attempts[1]
    assert first["outcome"] == "disruption" and first["charged"] is False, attempts
    assert second["start_step"] is not None and second["start_step"] >= 10, attempts  # resumed
    assert job.steps_done()[-1] == STEPS
    assert ids(sim) == before  # restarted by Google, never deleted or recreated
    assert writes(sim) == [], writes(sim)


# What a VM's metadata server says under instance/ (a shell command's start), and its instance name
METADATA = 'curl -sf -H "Metadata-Flavor: Google" "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/'
NAME = f'{METADATA}name"'


def test_a_migs_workers_are_numbered_by_their_agent_worker_number_and_worker_0_is_the_vm_numbered_0(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    # Each VM carries agent-worker-number in reverse name order (a shape: Google does not say
    # whether a Compute Engine TPU VM carries one; a TPU API VM does, and JAX reads it).
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"},
                            worker_numbers="reverse")
    numbers = {n: sim.world.instance(n).metadata["agent-worker-number"] for n in mig.members}
    assert [numbers[n] for n in sorted(numbers)] == ["3", "2", "1", "0"]
    seen = tmp_path / "seen"
    seen.mkdir()
    # Each VM writes, under its own name as its metadata server gives it, the worker id tpuwatch
    # gave it (env and template) and the number its metadata server serves.
    who = (f'w={{worker}}; echo "$TPUWATCH_WORKER_ID $w $({METADATA}attributes/agent-worker-number")" '
           f'> "{seen}/$({NAME})"; ')
    job = CeJob(sim, rest, tmp_path, "mig", "slice", before=who)
    rc, out = finish(job.watch(), timeout=120)
    assert rc == 0, out
    recorded = {p.name: p.read_text().split() for p in seen.iterdir()}
    assert recorded == {n: [numbers[n]] * 3 for n in mig.members}, recorded
    assert job.steps_done()[-1] == STEPS  # worker 0, the VM numbered 0, wrote the checkpoints
    assert "agent-worker-number" not in out, out  # numbers tpuwatch follows: nothing to say


def test_a_mig_whose_worker_numbers_repeat_runs_in_name_order_and_the_watch_says_so_once(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"},
                            metadata={"agent-worker-number": "0"})  # every VM 0, from its template
    seen = tmp_path / "seen"
    seen.mkdir()
    job = CeJob(sim, rest, tmp_path, "mig", "slice", before=f'echo "$TPUWATCH_WORKER_ID" > "{seen}/$({NAME})"; ')
    rc, out = finish(job.watch(), timeout=120)
    assert rc == 0, out
    assert {p.name: p.read_text().strip() for p in seen.iterdir()} == dict(zip(sorted(mig.members), "01", strict=True))
    assert out.count("agent-worker-number metadata is not 0..1 once each") == 1, out
    assert job.steps_done()[-1] == STEPS and len(mig.members) == 2


def test_a_single_host_instance_stopped_by_a_host_error_is_left_to_google_and_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.host_error("vm", restart_after=1800)  # TERMINATED, restarted 3 s later
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    assert ids(sim) == before and writes(sim) == [], writes(sim)


def test_a_foreign_instance_is_never_touched(sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "someone-else"},
                                       "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 1, "a checkpoint", proc)
    sim.world.preempt_instance("vm")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc != 0 and "not owned" in out, out  # it would recreate a preempted VM, but not another's
    assert sim.world.instance("vm").status == "TERMINATED"
    assert writes(sim) == [], writes(sim)


def test_a_hand_deleted_instance_is_not_recreated(sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 1, "a checkpoint", proc)
    sim.world.remove_instance("vm")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc != 0 and "never recreates a node a person deleted" in out, out
    assert "vm" not in ids(sim)
    assert writes(sim) == [], writes(sim)


def test_init_finds_a_mig_writes_what_recreates_it_and_status_shows_it_as_one_node(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    sim.world.add_instance("vm", body={"labels": {"team": "ml"}})
    env = {**os.environ, **sim.env, "TPUWATCH_COMPUTE_EMULATOR": rest.url.rstrip("/"),
           "TPUWATCH_STATE_DIR": str(tmp_path / "state")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(args, env)

    out = cli("init", "slice", "-o", str(tmp_path / "slice.toml"), "--json")
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout)
    assert (written["mig"], written["workers"], written["owned"]) == ("slice", 4, True)
    spec = written["spec"]
    assert spec["mig"]["targetSize"] == 4 and spec["mig"]["instanceTemplate"].endswith("slice-template")
    assert spec["mig"]["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "REPAIR"  # a MIG made again repairs alike
    assert spec["workload_policy"]["workloadPolicy"]["acceleratorTopology"] == "2x2x4"
    assert spec["template"]["properties"]["labels"] == {"tpuwatch-job": "slice"}
    status = cli("status", "-c", str(tmp_path / "slice.toml"), "--json")
    assert status.returncode == 0, status.stderr
    (node,) = json.loads(status.stdout)["nodes"]
    assert node["name"] == "slice" and node["state"] == "READY" and len(node["workers"]) == 4

    out = cli("init", "vm", "-o", str(tmp_path / "vm.toml"), "--json")
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout)
    assert written["instance"] == "vm" and written["owned"] is False
    body = written["spec"]["instance"]
    # an instance insert takes URLs there (a bare name is refused): partial, in the instance's zone
    assert body["machineType"] == f"zones/{sim.zone}/machineTypes/tpu7x-standard-4t"
    assert body["disks"][0]["initializeParams"]["diskType"] == f"zones/{sim.zone}/diskTypes/hyperdisk-balanced"
    assert "id" not in body and "status" not in body
    assert cli("init", "nothing", "-o", str(tmp_path / "x.toml")).returncode == 1


def test_a_preempted_spot_mig_that_does_nothing_on_failure_is_recreated_as_a_whole_and_the_job_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", spot=True,
                            labels={"tpuwatch-job": "slice"}, on_failure="DO_NOTHING")
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.preempt_instance(sorted(mig.members)[0])  # TERMINATED for good: Google restarts no Spot TPU VM
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    after = ids(sim)
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)  # every VM made again
    assert writes(sim) == ["compute.v1.InstanceGroupManagers/RecreateInstances"], writes(sim)  # the MIG stays


def repaired_by_google(sim: Simulator, before: dict[str, int]) -> None:
    """Every VM of the multi-host slice made again under its name by the MIG (Google's repair,
    `repair.recreateInstance` for each), none by tpuwatch."""
    after = {n: i for n, i in ids(sim).items() if n in before}
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)
    repairs = [e for e in sim.world.audit_entries() if e.method == "compute.instances.repair.recreateInstance"]
    assert {e.resource_labels["instance_id"] for e in repairs} == {str(i) for i in before.values()}
    assert writes(sim) == [], writes(sim)  # no recreateInstances of tpuwatch's


def test_a_preempted_spot_vm_of_a_mig_that_repairs_is_left_to_the_mig_and_the_job_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim.world
    w.delays["mig_repair"] = 3600.0  # 6 s at speed 600: the watch sees the VM preempted before the MIG acts
    mig = w.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", spot=True, labels={"tpuwatch-job": "slice"})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    w.preempt_instance(sorted(mig.members)[1])  # defaultActionOnFailure REPAIR (the default): the MIG recreates it
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    repaired_by_google(sim, before)
    assert "PREEMPTED (its MIG repairs it by itself)" in out, out
    assert job.steps_done()[-1] == STEPS


def test_under_check_a_preempted_spot_vm_of_a_mig_that_repairs_is_waited_for_and_reads_list_only_its_vms(
        sim: Simulator, rest: RestFace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = sim.world
    w.delays["mig_repair"] = 3600.0  # 6 s: a tick sees the VM preempted before the MIG acts, however slow
    for other in ("bystander-1", "bystander-2", "bystander-3"):  # the zone's other VMs: never read
        w.add_instance(other)
    mig = w.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", spot=True, labels={"tpuwatch-job": "slice"})
    before = {n: i for n, i in ids(sim).items() if n in mig.members}
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    for key in ("TPUWATCH_STATE_DIR", "TPUWATCH_COMPUTE_EMULATOR"):
        monkeypatch.setenv(key, job.env[key])
    jb = load_job(job.cfg)
    with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
        rec = Reconciler(jb.cfg, jb.pcfg, real_ports(jb), journal)  # each tick is what `tpuwatch check` runs
        tick_until(rec, lambda r: r.decision.row == "running" and len(job.steps_done()) >= 2, "the job running")
        w.preempt_instance(sorted(mig.members)[0])
        rows: list[str] = []

        def seen(r: TickReport) -> bool:
            rows.append(r.decision.row)
            return r.node is not None and r.node.state == "PREEMPTED"

        down = tick_until(rec, seen, "a tick seeing the VM preempted, before the MIG acts")
        assert down.node is not None and down.node.repairs_itself, down.decision.summary
        job.release()
        tick_until(rec, lambda r: bool(rows.append(r.decision.row)) or (
            r.node is not None and r.node.usable and r.decision.row == "running" and r.memory.attempt.number == 2),
                   "attempt 2 running on the repaired slice", timeout=90)
        assert "repair_wait" in rows and not {"dead_node", "repair_timeout"} & set(rows), rows
        tick_until(rec, lambda r: r.memory.phase is Phase.DONE, "the job done", timeout=90)
    assert job.steps_done()[-1] == STEPS  # resumed to its last step
    job.assert_resumed_uncharged("")
    repaired_by_google(sim, before)
    lists = [f for m, f in w.list_filters if m == "instances.list"]
    members = "|".join(sorted(mig.members))
    assert lists and set(lists) == {f'name eq "({members})"'}, lists  # one filtered page, never the zone


def test_a_4_vm_mig_repaired_by_google_past_a_short_repair_timeout_is_waited_for_while_it_acts(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim.world
    mig = w.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10, repair_timeout="1s")
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    w.stockout(sim.zone, duration=3600.0)  # 6 s: the MIG's remake waits for capacity, far past repair_timeout
    w.autoheal("slice", sorted(mig.members)[3])  # the whole slice RECREATING
    job.release()
    rc, out = finish(proc, timeout=150)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    after = ids(sim)
    assert all(after[n] != before[n] for n in before)  # Google's recreate, once
    assert writes(sim) == [], writes(sim)  # never a recreateInstances of what the MIG recreates
    assert "waiting for the MIG's own repair to end" in out, out


def test_a_regional_mig_is_found_by_init_from_its_zone_and_a_preempted_spot_vm_is_recreated_through_its_region(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim.world
    region = sim.zone.rsplit("-", 1)[0]
    mig = w.add_mig("slice", "tpu7x-standard-4t", 2, spot=True, labels={"tpuwatch-job": "slice"},
                    region=region, on_failure="DO_NOTHING")
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    init = cli_process.run(["init", "slice", "-o", str(tmp_path / "init.toml"), "--json"], job.env)
    assert init.returncode == 0, init.stderr
    written = json.loads(init.stdout)
    assert (written["mig"], written["workers"]) == ("slice", 2)
    assert written["spec"]["mig"]["distributionPolicy"]["targetShape"] == "ANY_SINGLE_ZONE"
    status = cli_process.run(["status", "-c", str(tmp_path / "init.toml"), "--json"], job.env)
    assert status.returncode == 0, status.stderr
    (node,) = json.loads(status.stdout)["nodes"]
    assert node["name"] == "slice" and node["state"] == "READY" and len(node["workers"]) == 2, node
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    w.preempt_instance(sorted(mig.members)[0])  # DO_NOTHING: left TERMINATED by the MIG
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    after = ids(sim)
    assert all(after[n] != before[n] for n in before)  # tpuwatch's recreateInstances names every VM
    assert writes(sim) == ["compute.v1.RegionInstanceGroupManagers/RecreateInstances"], writes(sim)
    assert w.calls["compute.v1.InstanceGroupManagers/Get"] == 3, dict(w.calls)  # once a process: init, status, watch


def test_a_preempted_spot_instance_is_deleted_and_inserted_again_from_what_init_captured(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:

    sim.world.add_instance("vm", body={
        "labels": {"tpuwatch-job": "vm", "team": "ml"},
        "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"},
        "metadata": {"items": [{"key": "owner-note", "value": "kept on recreate"}]}})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.preempt_instance("vm")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    assert ids(sim)["vm"] != before["vm"]
    assert writes(sim) == ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"], writes(sim)
    vm = sim.world.instance("vm")
    assert vm.labels == {"tpuwatch-job": "vm", "team": "ml"} and vm.provisioning_model == "SPOT"
    assert vm.metadata["owner-note"] == "kept on recreate" and vm.metadata["tpuwatch-job"] == "vm"


def _spot_job_with_spec(sim: Simulator, rest: RestFace, tmp_path: Path,
                        edit: Callable[[dict[str, Any]], None]) -> tuple[CeJob, dict[str, int]]:
    """A Spot instance `vm` captured by `init`, its spec edited by `edit` before the job's config gets it."""

    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"},
                                       "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec(lambda spec: edit(spec["instance"]))
    return job, ids(sim)


def test_an_older_inits_bare_machine_and_disk_types_are_made_urls_and_the_spot_vm_recreated(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    def as_an_older_init_wrote_it(instance: dict[str, Any]) -> None:
        instance["machineType"] = "tpu7x-standard-4t"
        instance["disks"][0]["initializeParams"]["diskType"] = "hyperdisk-balanced"

    job, before = _spot_job_with_spec(sim, rest, tmp_path, as_an_older_init_wrote_it)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.preempt_instance("vm")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out  # the strict simulator took the insert: the bare names went as partial URLs
    assert out.count("older `tpuwatch init`") == 1, out  # said once
    job.assert_resumed_uncharged(out)
    assert ids(sim)["vm"] != before["vm"]
    assert writes(sim) == ["compute.v1.Instances/Delete", "compute.v1.Instances/Insert"], writes(sim)


def test_a_spec_compute_engine_would_refuse_stops_the_recreate_before_anything_is_deleted(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    def misspelled(instance: dict[str, Any]) -> None:
        instance["scheduling"]["preemptable"] = True  # no such field: Compute Engine refuses the insert

    job, before = _spot_job_with_spec(sim, rest, tmp_path, misspelled)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.preempt_instance("vm")
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 2, out
    assert "tpu.compute_spec.instance" in out and "preemptable" in out, out
    assert writes(sim) == [], writes(sim)  # no delete: the preempted VM is still there to look at
    assert ids(sim) == before


def test_a_mig_autoheal_is_waited_out_without_deleting_anything(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    mig = sim.world.add_mig("slice", "tpu7x-standard-4t", 4, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.autoheal("slice", sorted(mig.members)[2])  # a multi-host slice: Google recreates all four
    job.release()
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    after = ids(sim)
    assert all(after[n] != before[n] for n in before)  # Google's recreate
    assert writes(sim) == [], writes(sim)  # and none of tpuwatch's


def test_a_flex_start_mig_whose_run_ended_is_asked_again_through_a_stockout_and_the_job_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    import tomli_w

    w = sim.world
    w.add_mig("slice", "tpu7x-standard-4t", 0, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    w.insert_resize_request(w.project, w.zone, "slice", {"name": "slice-first", "resizeBy": 4,
                                                         "requestedRunDuration": {"seconds": str(7 * 86400)}})
    w.wait_mig_stable("slice", timeout=60)
    job = CeJob(sim, rest, tmp_path, "mig", "slice", hold_at=10)
    init = cli_process.run(["init", "slice", "-o", str(tmp_path / "init.toml"), "--json"], job.env)
    assert init.returncode == 0, init.stderr
    written = json.loads(init.stdout)
    assert written["flex_start"] == f"{7 * 86400}s"  # init saw the MIG's VMs come through a resize request
    with job.cfg.open("a") as f:  # the job's config with the spec `init` wrote, and its flex_start
        f.write(tomli_w.dumps({"tpu": {"compute_spec": written["spec"]}}))
    job.cfg.write_text(job.cfg.read_text().replace('api = "compute"', f'api = "compute"\nflex_start = "{written["flex_start"]}"', 1))
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    w.stockout()  # no capacity until cleared: the next resize request FAILS
    w.end_resize_run("slice")  # Google deletes the flex-start VMs: their run duration is over
    job.release()
    inserts = "compute.v1.InstanceGroupManagerResizeRequests/Insert"
    wait(lambda: w.calls[inserts] >= 2, "a resize request failed in the stockout, then asked again", proc, timeout=120)
    w.clear_errors()
    rc, out = finish(proc, timeout=180)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    assert "no capacity" in out and "Compute Engine took node slice back: its resize request" in out, out
    (last,) = [r for r in w.list_resize_requests(w.project, w.zone, "slice") if r.state == "SUCCEEDED"]
    assert last.name.startswith("slice-tpuwatch-") and last.run_duration == 7 * 86400
    assert len(w.mig("slice").members) == 4
    assert "compute.v1.InstanceGroupManagers/RecreateInstances" not in writes(sim)  # the MIG is never recreated


# Where libtpu would fail on a bad host, the simulated job meets the host's `tpu-fault`.
OPEN_TPU = f'f="$TPUWATCH_HOST_ROOT/{TPU_FAULT_FILE}"; if [ -s "$f" ]; then cat "$f"; exit 1; fi; '


def test_a_host_whose_tpu_cannot_be_opened_is_reported_once_repaired_and_the_job_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = sim.world
    w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"},
                               "scheduling": {"provisioningModel": "RESERVATION_BOUND"}})  # All Capacity mode
    before = ids(sim)
    w.bad_host("vm")  # every attempt fails to open the TPU, whatever the cleanup, until the host is repaired
    job = CeJob(sim, rest, tmp_path, "instance", "vm", before=OPEN_TPU, report_faulty_hosts=True)
    for key in ("TPUWATCH_STATE_DIR", "TPUWATCH_COMPUTE_EMULATOR"):
        monkeypatch.setenv(key, job.env[key])
    jb = load_job(job.cfg)
    ports = real_ports(jb)
    with Journal.open(jb.cfg.state_dir, jb.name, jb.cfg.tpu_name) as journal:
        # Up to the third attempt, in process; then a dry run of the tick that would report the host.
        tick_until(Reconciler(jb.cfg, jb.pcfg, ports, journal),
                   lambda r: r.memory.host.streak == 2 and r.memory.phase is Phase.RUNNING, "the third attempt")
        dry = tick_until(Reconciler(jb.cfg, jb.pcfg, ports, journal, Flags(dry_run=True)),
                         lambda r: r.decision.row == "faulty_host", "the third dirty end")
    sent = [d for d in dry.done if d.startswith("would send ")]
    assert len(sent) == 1 and "instances/vm/reportHostAsFaulty {" in sent[0], dry.done
    assert '"disruptionSchedule": "IMMEDIATE"' in sent[0] and "ReportHostAsFaulty" not in "".join(w.calls)
    rc, out = finish(job.watch(), timeout=180)  # the watch goes on from the journal
    assert rc == 0, out
    hist = job.history()
    attempts = hist["attempts"]
    assert len(attempts) == 4 and all("dirty host" in a["reason"] for a in attempts[:3]), attempts
    assert attempts[3]["outcome"] == "success" and job.steps_done()[-1] == STEPS
    reported = [e for e in hist["events"] if e["kind"] == "host_reported"]
    assert len(reported) == 1 and reported[0]["data"]["operation"] and reported[0]["data"]["worker"] == 0, reported
    kinds = [e["kind"] for e in hist["events"]]
    assert kinds.index("report_host") < kinds.index("host_reported")  # journaled before the call
    assert w.calls["compute.v1.Instances/ReportHostAsFaulty"] == 1, dict(w.calls)
    assert w.instance("vm").faulty_reported and w.instance("vm").status == "RUNNING"
    assert ids(sim) == before and writes(sim) == [], writes(sim)  # repaired by Google, nothing deleted


def test_a_host_whose_tpu_devices_are_missing_is_reported_before_any_launch_and_the_job_runs_once_repaired(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim.world
    w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"},
                               "scheduling": {"provisioningModel": "RESERVATION_BOUND"}})  # All Capacity mode
    before = ids(sim)
    w.bad_host("vm", "device-missing")  # a chip's device file is gone, across reboots, until the host is repaired
    job = CeJob(sim, rest, tmp_path, "instance", "vm", report_faulty_hosts=True)
    rc, out = finish(job.watch(), timeout=180)
    assert rc == 0, out
    hist = job.history()
    attempts = hist["attempts"]
    assert len(attempts) == 1 and attempts[0]["outcome"] == "success", attempts  # nothing launched on the bad host
    assert job.steps_done()[-1] == STEPS
    reported = [e for e in hist["events"] if e["kind"] == "host_reported"]
    assert len(reported) == 1 and reported[0]["data"]["worker"] == 0, reported
    assert "environment checks in a row" in reported[0]["reason"], reported
    assert w.calls["compute.v1.Instances/ReportHostAsFaulty"] == 1, dict(w.calls)
    assert w.instance("vm").faulty_reported and w.instance("vm").status == "RUNNING"
    assert ids(sim) == before and writes(sim) == [], writes(sim)  # repaired by Google, nothing deleted


def test_a_spot_instances_insert_refused_for_quota_is_queued_retried_and_the_job_resumes(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Compute Engine refuses an insert beyond quota at once, 403 quotaExceeded: after the delete
    of a preempted Spot VM that is a shortage to queue within queue_timeout (rows no_capacity,
    queue_retry), never a missing permission or a failed job."""

    sim.world.add_instance("vm", body={
        "labels": {"tpuwatch-job": "vm"},
        "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}})
    before = ids(sim)
    job = CeJob(sim, rest, tmp_path, "instance", "vm", hold_at=10)
    job.capture_spec()
    proc = job.watch()
    wait(lambda: len(job.steps_done()) >= 2, "two checkpoints", proc)
    sim.world.quota()  # every insert in the zone refused: 403 quotaExceeded, until cleared
    sim.world.preempt_instance("vm")
    job.release()
    insert = "compute.v1.Instances/Insert"
    wait(lambda: sim.world.call_count(insert) >= 3, "three inserts refused for quota", proc)
    assert proc.poll() is None and "vm" not in ids(sim), "the watch ended on a quota refusal"
    sim.world.clear_errors()  # quota granted: the next retry is served
    rc, out = finish(proc, timeout=120)
    assert rc == 0, out
    job.assert_resumed_uncharged(out)
    assert ids(sim)["vm"] != before["vm"]
    assert sim.world.call_count(insert) >= 4, sim.world.calls  # refused three times or more, then served
    assert "quota" in out.lower() and "permission" not in out.lower(), out


def test_a_watch_whose_reads_are_rate_limited_keeps_going_and_never_exits_3(
        sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """Compute Engine's rate limits are 403 rateLimitExceeded: retried like UNAVAILABLE, from the
    first tick on, never a missing permission (exit 3) nor a warning about one."""
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    job = CeJob(sim, rest, tmp_path, "instance", "vm")
    job.env["TPUWATCH_API_BACKOFF_SCALE"] = "0.05"
    reads = ["compute.v1.Instances/Get", "compute.v1.Instances/List", "ZoneOperations/Get"]
    sim.world.api_errors(0.5, ["RESOURCE_EXHAUSTED"], methods=reads)  # half of every read refused
    sim.world.reset_calls()
    rc, out = finish(job.watch(), timeout=180)
    throttled = sum(n for m, n in sim.world.injected.items() if m.startswith("compute."))
    sim.world.clear_errors()
    assert rc == 0, out
    assert throttled >= 3, sim.world.injected  # the reads were throttled, and served in the end
    assert "permission" not in out.lower() and "cloud API failed" not in out, out
    assert job.steps_done()[-1] == STEPS, job.steps_done()
