"""Compute Engine jobs of one watcher read their slices from one instances list (and one MIG list)
per zone per poll, plus listManagedInstances only for a MIG with something under way, through
the ports a watcher of several jobs builds for them (Fleet.sharing, wiring.real_ports), counted
by the simulator's call meter with the real google-cloud-compute client against its Compute
Engine face. No tick runs: each poll reads every job's slice as its tick does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.cloud.apis import SharedLists
from tpuwatch.cloud.compute.adapter import ComputeAdapter
from tpuwatch.cloud.compute.lifecycle import ComputeLifecycle
from tpuwatch.cloud.compute.zoneinstances import SharedCompute
from tpuwatch.cloud.tpu.zonenodes import Due
from tpuwatch.fleet.runner import Fleet, Options
from tpuwatch.model import NodeSnapshot
from tpuwatch.ports import Flags, JobPorts, ZoneListing
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator
from tpuwatch.ui.jobs import JobState
from tpuwatch.wiring import load_job, real_ports

POLL = 30.0


class Quiet:
    """fleet.runner.Output of a watcher whose jobs no test starts."""

    def changed(self, state: JobState) -> None: ...

    def ticked(self, state: JobState, report: object) -> None: ...

    def warn(self, state: JobState, text: str) -> None: ...

    def gone(self, path: Path) -> None: ...


@pytest.fixture
def rest(sim_api: Simulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        monkeypatch.setenv("TPUWATCH_COMPUTE_EMULATOR", face.url.rstrip("/"))
        yield face


class Clock:
    """The watcher's monotonic clock, moved a poll at a time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def jobs(tmp: Path, kind: str, names: list[str], clock: Clock, job: str = "") -> list[tuple[str, JobPorts, Due]]:
    """Each job's config, and its ports as one watcher of them all builds them."""
    key = tmp / "id_test"
    key.write_text("not used: nothing connects\n")
    key.chmod(0o600)
    lists = SharedLists()
    lists.by_api["compute"] = SharedCompute(clock=clock)
    fleet = Fleet([], None, Options(None, None, Flags()), Quiet(), lists=lists)
    out = []
    for name in names:
        cfg = tmp / f"{name}.toml"
        cfg.write_text(f'[tpu]\napi = "compute"\n{kind} = "{name}"\n[job]\nname = "{name}"\ncommand = "true"\n{job}'
                       f'[recovery]\npoll_interval = "{POLL:g}s"\n[ssh]\nidentity_file = "{key}"\n')
        loaded = load_job(cfg)
        due = Due()
        out.append((name, real_ports(loaded, fleet.sharing(loaded, due, POLL)), due))
    return out


def read(sim: Simulator, watched: list[tuple[str, JobPorts, Due]],
         clock: Clock) -> tuple[dict[str, int], dict[str, NodeSnapshot | None]]:
    """The next poll: every job's tick, due now, reads its slice as the tick does
    (tpu_for(zone).get_node) a little after; the Compute Engine calls they took, by method, and
    what each read."""
    sim.world.reset_calls()
    clock.now += POLL
    nodes = {}
    for name, ports, due in watched:
        due.at = clock.now
        clock.now += 0.1  # each tick got its slot a little later
        nodes[name] = ports.tpu_for(sim.world.zone).get_node(name)
    return {m.removeprefix("compute.v1."): n for m, n in sim.world.calls.items() if m.startswith("compute.")}, nodes


def poll(sim: Simulator, watched: list[tuple[str, JobPorts, Due]], clock: Clock) -> dict[str, int]:
    """The calls of the next poll, in which every slice reads as running."""
    calls, nodes = read(sim, watched, clock)
    for name, node in nodes.items():
        assert node is not None and node.state == "READY" and node.name == name, node
    return calls


def test_compute_instance_jobs_of_one_zone_share_one_instances_list_per_poll(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    names = [f"vm-{i}" for i in range(5)]
    for name in names:
        sim_api.world.add_instance(name, body={"labels": {"tpuwatch-job": name}})
    clock = Clock()
    watched = jobs(tmp_path, "instance", names, clock)
    assert poll(sim_api, watched, clock) == {"Instances/List": 1}  # not a get per job
    assert poll(sim_api, watched, clock) == {"Instances/List": 1}  # the next poll lists again, once


def test_compute_instance_jobs_with_a_priority_read_the_zones_instances_from_the_same_list(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    """A job with a priority looks at the zone's instances (their labels and machine type) for a
    node of a lower job: from the poll's one shared instances list, not a list of its own."""
    names = [f"vm-{i}" for i in range(3)]
    for i, name in enumerate(names):
        sim_api.world.add_instance(name, body={"labels": {"tpuwatch-job": name, "tpuwatch-priority": str(i)}})
    clock = Clock()
    watched = jobs(tmp_path, "instance", names, clock, job="priority = 100\n")
    for _ in range(2):
        sim_api.world.reset_calls()
        clock.now += POLL
        seen = {}
        for name, ports, due in watched:
            due.at = clock.now
            clock.now += 0.1
            tpu = ports.tpu_for(sim_api.world.zone)
            assert isinstance(tpu, ZoneListing)
            seen[name] = {n.name: (n.labels.get("tpuwatch-priority"), n.accelerator_type) for n in tpu.listed()}
        calls = {m.removeprefix("compute.v1."): n for m, n in sim_api.world.calls.items() if m.startswith("compute.")}
        assert calls == {"Instances/List": 1}, calls
        assert all(s == {n: (str(i), "tpu7x-standard-4t") for i, n in enumerate(names)} for s in seen.values()), seen


def test_compute_mig_jobs_of_one_zone_share_the_instances_and_mig_lists(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    names = [f"slice-{i}" for i in range(3)]
    for name in names:
        sim_api.world.add_mig(name, size=2, topology="2x2x2", labels={"tpuwatch-job": name})
    clock = Clock()
    watched = jobs(tmp_path, "mig", names, clock)
    # MIGs at rest (stable, nothing under way): the zone's two lists are the whole read
    assert poll(sim_api, watched, clock) == {"Instances/List": 1, "InstanceGroupManagers/List": 1}
    calls, nodes = read(sim_api, watched, clock)
    alone = ComputeAdapter(sim_api.world.project, sim_api.world.zone, "mig")
    assert nodes == {name: alone.get_node(name) for name in names}  # what each job's own three requests read

    # A host error takes slice-1 down: the MIG is no longer at rest, and only listManagedInstances
    # names what each of its instances does, for that MIG alone.
    sim_api.world.host_error(sorted(sim_api.world.mig("slice-1").members)[0], restart_after=None)
    calls, nodes = read(sim_api, watched, clock)
    assert calls == {"Instances/List": 1, "InstanceGroupManagers/List": 1,
                     "InstanceGroupManagers/ListManagedInstances": 1}, calls
    down = nodes["slice-1"]
    assert down is not None and down.state != "READY" and down == alone.get_node("slice-1"), down
    assert [n.state for k, n in sorted(nodes.items()) if k != "slice-1" and n is not None] == ["READY", "READY"]


def test_regional_mig_jobs_share_their_regions_mig_list_once_found(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    region = w.zone.rsplit("-", 1)[0]
    names = ["slice-0", "slice-1"]
    for name in names:
        w.add_mig(name, size=2, region=region, labels={"tpuwatch-job": name})
    w.add_mig("zonal", size=2, labels={"tpuwatch-job": "zonal"})
    clock = Clock()
    watched = jobs(tmp_path, "mig", [*names, "zonal"], clock)
    # the first poll finds each regional MIG with a get (the zone's MIG list holds only zonal ones)
    assert poll(sim_api, watched, clock) == {"Instances/List": 1, "InstanceGroupManagers/List": 1,
                                             "InstanceGroupManagers/Get": 2, "RegionInstanceGroupManagers/Get": 2}
    # then one list of the region's MIGs answers both: at rest, nothing else asked
    assert poll(sim_api, watched, clock) == {"Instances/List": 1, "InstanceGroupManagers/List": 1,
                                             "RegionInstanceGroupManagers/List": 1}
    calls, nodes = read(sim_api, watched, clock)
    node = nodes["slice-0"]
    assert node is not None and node.resource.endswith(f"/regions/{region}/instanceGroupManagers/slice-0")


def test_a_slice_the_zones_list_does_not_hold_is_read_on_its_own(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    sim_api.world.add_instance("vm-a")
    shared = SharedCompute()
    zone = shared.zone(sim_api.world.project, sim_api.world.zone)
    due = Due(time.monotonic())
    api = ComputeAdapter(sim_api.world.project, sim_api.world.zone, "instance", reads=zone.job(due, slack=1.0))
    assert api.get_node("vm-a") is not None
    sim_api.world.add_instance("vm-b")  # made after the zone's list of this poll
    node = api.get_node("vm-b")
    assert node is not None and node.name == "vm-b"  # confirmed with a get, never missing
    assert api.get_node("gone") is None
    assert shared.counts() == {"instance_lists": 1, "mig_lists": 0, "gets": 2}
    assert (sim_api.world.call_count("Instances/List"), sim_api.world.call_count("Instances/Get")) == (1, 2)


def test_the_lifecycle_reads_the_slice_as_it_is_now_not_the_shared_list(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    # A recreate asks the lifecycle whether the slice still exists before it creates it: a
    # list begun before this tick's delete must not answer that.
    sim_api.world.add_instance("vm")
    zone = SharedCompute().zone(sim_api.world.project, sim_api.world.zone)
    api = ComputeAdapter(sim_api.world.project, sim_api.world.zone, "instance",
                         reads=zone.job(Due(time.monotonic()), slack=1.0))
    assert api.get_node("vm") is not None
    sim_api.world.remove_instance("vm")
    assert api.get_node("vm") is not None  # this tick's look, shared
    assert ComputeLifecycle(api).get_node("vm") is None
