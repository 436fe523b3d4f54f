"""The commands other than `watch` and `check` on a slice made through Compute Engine: `status`,
`events`, `precheck`, `run` and `recreate` against the simulator's Compute Engine REST face with
the real `google-cloud-compute` client (and real ssh where the command reaches the workers).

Each calls the CLI in-process once or twice, on a MIG of two VMs or one instance: no job is
watched, so each test stays short.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli_env, run
from e2e_helpers import trainer, write_config

from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


@pytest.fixture
def rest(sim_api: Simulator) -> Iterator[RestFace]:
    with RestFace(sim_api.world) as face:
        yield face


@pytest.fixture
def rest_ssh(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def config(sim: Simulator, tmp: Path, kind: str, name: str, steps: int = 20, **tpu: object) -> Path:
    ck = sim.bucket / "ck"
    cfg = write_config(tmp / f"{name}.toml", sim, trainer(ck, "", steps), ck, name=name,
                       tpu={"api": "compute", kind: name, **tpu})
    if not sim.ssh_port:  # the APIs alone: no workers to reach
        cfg.write_text("\n".join(line for line in cfg.read_text().splitlines() if not line.startswith(("user =", "identity_file =", "port =", "internal_ip ="))))
    with cfg.open("a") as f:  # a MIG's peers resolve only in Compute Engine's internal DNS
        f.write('\n[precheck]\nskip = ["dns"]\n')
    return cfg


def env(sim: Simulator, rest: RestFace, tmp: Path) -> dict[str, str | None]:
    return cli_env(sim, tmp, TPUWATCH_COMPUTE_EMULATOR=rest.url.rstrip("/"), TPUWATCH_STATE_DIR=str(tmp / "state"))


def as_json(args: list[str], environ: Mapping[str, str | None]) -> dict[str, Any]:
    code, out, err = run(args, environ)
    assert code == 0, (code, out, err)
    data: dict[str, Any] = json.loads(out)
    return data


def tpu_calls(sim: Simulator) -> list[str]:
    return sorted(m for m in sim.world.calls if "tpu." in m.lower() and not m.startswith("compute."))


def test_events_shows_a_migs_system_events_matched_to_its_workers_and_its_upcoming_maintenance(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    mig = w.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"})
    w.add_instance("slice-other")  # a name that starts alike: none of its entries are the slice's
    first, second = sorted(mig.members)
    w.host_error(second, restart_after=None)
    w.host_error("slice-other", restart_after=None)
    w.schedule_instance_maintenance(first, starts_in=86400, notice=0)
    cfg = config(sim_api, tmp_path, "mig", "slice")
    environ = env(sim_api, rest, tmp_path)
    w.reset_calls()
    data = as_json(["events", "-c", str(cfg), "--since", "1h", "--json"], environ)
    assert data["node"] == "slice" and data["upcoming_error"] is None
    got = [(e["kind"], e["method"], e["node"], e["worker"]) for e in data["events"]]
    assert ("terminate", "compute.instances.hostError", "slice", "1") in got, got
    assert ("upcoming_maintenance", "compute.instances.upcomingMaintenance", "slice", "0") in got, got
    assert all(e["node"] == "slice" for e in data["events"]) and len(got) == 2, got
    assert data["upcoming_maintenance"] is not None and data["upcoming_maintenance"]["status"] == "PENDING"
    assert tpu_calls(sim_api) == [], tpu_calls(sim_api)  # never the TPU API for a Compute Engine job
    # Without -c: no TPU node of that name, so the instance or MIG of that name is found
    bare = as_json(["events", "slice", "--since", "1h", "--json"], environ)
    assert [(e["kind"], e["worker"]) for e in bare["events"]] == [(e["kind"], e["worker"]) for e in data["events"]]


def test_status_shows_a_flex_start_migs_resize_request_in_flight_and_all_lists_migs_as_one_node(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    w.add_mig("slice", "tpu7x-standard-4t", 0, topology="2x2x4", labels={"tpuwatch-job": "slice"})
    w.add_mig("pair", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "pair"})
    w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    w.stockout()  # the request waits for capacity, for longer than the test (3600 s are 6 s at speed 600)
    w.delays["resize_timeout"] = 7 * 86400.0
    w.insert_resize_request(w.project, w.zone, "slice", {"name": "slice-first", "resizeBy": 4,
                                                         "requestedRunDuration": {"seconds": "86400"}})
    w.wait_for(lambda world: world.get_resize_request(w.project, w.zone, "slice", "slice-first").state == "ACCEPTED",
               20, "the request accepted")
    cfg = config(sim_api, tmp_path, "mig", "slice", flex_start="24h",
                 compute_spec={"mig": {"targetSize": 4, "name": "slice"}})
    environ = env(sim_api, rest, tmp_path)
    data = as_json(["status", "-c", str(cfg), "--json"], environ)
    (node,) = data["nodes"]
    assert node["full_name"] == f"projects/{w.project}/zones/{w.zone}/instanceGroupManagers/slice"
    request = node["resize_request"]
    assert request["name"].endswith("/instanceGroupManagers/slice/resizeRequests/slice-first"), request
    assert request["state"] == "WAITING_FOR_RESOURCES" and request["since"], request
    code, out, err = run(["status", "-c", str(cfg)], environ)
    assert code == 0, err
    assert "resize request slice-first WAITING_FOR_RESOURCES, since" in " ".join(out.split()), out
    assert "made as Compute Engine MIG" in " ".join(out.split()), out  # what made it, as its adapter says
    # --all: each MIG one node of its instances, the instance no MIG manages another
    every = as_json(["status", "--all", "-c", str(cfg), "--json"], environ)
    shown = {n["name"]: len(n["workers"]) for n in every["nodes"]}
    assert shown == {"slice": 0, "pair": 2, "vm": 1}, shown
    assert tpu_calls(sim_api) == [], tpu_calls(sim_api)
    # Without -c: a name the TPU API does not know is looked up as an instance, then as a MIG
    bare = as_json(["status", "pair", "vm", "--json"], environ)
    assert [(n["name"], n["full_name"].split("/")[-2], len(n["workers"])) for n in bare["nodes"]] == [
        ("pair", "instanceGroupManagers", 2), ("vm", "instances", 1)], bare
    # the snapshot says what kind of slice it is (its adapter fills it in)
    assert [(n["name"], n["kind"]) for n in bare["nodes"]] == [("pair", "mig"), ("vm", "instance")], bare


def test_precheck_checks_every_instance_of_a_mig(sim: Simulator, rest_ssh: RestFace, tmp_path: Path) -> None:
    sim.world.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"})
    cfg = config(sim, tmp_path, "mig", "slice")
    data = as_json(["precheck", "-c", str(cfg), "--json"], env(sim, rest_ssh, tmp_path))
    assert data["node"] == "slice" and data["ok"] is True, data
    assert {i["worker"] for i in data["items"]} == {0, 1} and data["unreachable"] == []


def test_run_launches_the_job_once_on_an_instance_and_follows_it_to_its_end(
        sim: Simulator, rest_ssh: RestFace, tmp_path: Path) -> None:
    sim.world.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    cfg = config(sim, tmp_path, "instance", "vm", steps=10)
    code, out, err = run(["run", "-c", str(cfg)], env(sim, rest_ssh, tmp_path))
    assert code == 0, (out, err)
    assert "worker 0: done at step 10" in out, out
    assert (sim.bucket / "ck" / "10").exists()


def test_recreate_deletes_and_inserts_an_instance_and_has_a_mig_recreate_its_instances(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    mig = w.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"})
    environ = env(sim_api, rest, tmp_path)
    specs = {n: as_json(["init", n, "-o", str(tmp_path / f"init-{n}.toml"), "--json"], environ)["spec"]
             for n in ("vm", "slice")}
    vm = config(sim_api, tmp_path, "instance", "vm", compute_spec=specs["vm"])
    old = w.instance("vm").id
    w.reset_calls()
    plan = as_json(["recreate", "vm", "-c", str(vm), "--dry-run"], environ)
    assert plan["delete"] == {"method": "compute.instances.delete",
                              "name": f"projects/{w.project}/zones/{w.zone}/instances/vm"}, plan
    assert plan["create"]["labels"]["tpuwatch-job"] == "vm" and w.instance("vm").id == old
    done = as_json(["recreate", "vm", "-c", str(vm), "--yes", "--json"], environ)
    assert done["old_id"] == str(old) and done["new_id"] == str(w.instance("vm").id) != str(old), done
    assert w.instance("vm").labels["tpuwatch-job"] == "vm"
    # A MIG is never deleted: it recreates its instances (new ids), its template stays
    before = {n: w.instance(n).id for n in mig.members}
    slice_cfg = config(sim_api, tmp_path, "mig", "slice", compute_spec=specs["slice"])
    done = as_json(["recreate", "slice", "-c", str(slice_cfg), "--yes", "--json"], environ)
    after = {r.name: r.id for r in w.instances() if r.name in before}
    assert after.keys() == before.keys() and all(after[n] != before[n] for n in before), (before, after)
    assert done["new_id"] == "+".join(str(after[n]) for n in sorted(after)) and done["state"] == "READY", done
    assert not any("InstanceGroupManagers/Delete" in m or "InstanceGroupManagers/Insert" in m for m in w.calls)
    assert tpu_calls(sim_api) == [], tpu_calls(sim_api)


def test_status_lists_a_migs_workers_by_their_agent_worker_number_and_says_when_it_cannot(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    mig = w.add_mig("slice", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "slice"}, worker_numbers="reverse")
    # every VM numbered 0 by its template: numbers tpuwatch cannot follow
    odd = w.add_mig("odd", "tpu7x-standard-4t", 2, labels={"tpuwatch-job": "odd"},
                    metadata={"agent-worker-number": "0"})
    environ = env(sim_api, rest, tmp_path)
    data = as_json(["status", "-c", str(config(sim_api, tmp_path, "mig", "slice")), "--json"], environ)
    (node,) = data["nodes"]
    assert [x["internal_ip"] for x in node["workers"]] == [w.instance(n).ip for n in sorted(mig.members, reverse=True)]
    code, out, err = run(["status", "-c", str(config(sim_api, tmp_path, "mig", "odd"))], environ)
    assert code == 0, err
    first, second = sorted(odd.members)
    said = " ".join(err.split())
    assert f"warning: MIG odd: the instances' agent-worker-number metadata is not 0..1 once each ({first}: 0, " \
           f"{second}: 0), so tpuwatch numbers the workers by instance name." in said, err
    assert "pass {worker} (or TPUWATCH_WORKER_ID) to the job as its process id" in said, err
    assert said.count("agent-worker-number") == 1, err  # once


def test_recreate_repairs_an_older_inits_bare_names_and_refuses_a_body_google_would_refuse_before_deleting(
        sim_api: Simulator, rest: RestFace, tmp_path: Path) -> None:
    w = sim_api.world
    w.add_instance("vm", body={"labels": {"tpuwatch-job": "vm"}})
    environ = env(sim_api, rest, tmp_path)
    spec = as_json(["init", "vm", "-o", str(tmp_path / "init.toml"), "--json"], environ)["spec"]
    spec["instance"]["machineType"] = "tpu7x-standard-4t"  # as an older `init` wrote it (no tpu.zone here)
    old = w.instance("vm").id
    bad = json.loads(json.dumps(spec))
    bad["instance"]["disks"][0]["initializeParams"]["sizeGb"] = "100"  # not a field of Compute Engine's
    code, out, err = run(["recreate", "vm", "-c", str(config(sim_api, tmp_path, "instance", "vm", compute_spec=bad)),
                          "--yes"], environ)
    assert code == 2 and "tpu.compute_spec.instance" in err and "sizeGb" in err, (code, out, err)
    assert w.instance("vm").id == old and not any("Instances/Delete" in m for m in w.calls)  # nothing deleted
    plan = as_json(["recreate", "vm", "-c", str(config(sim_api, tmp_path, "instance", "vm", compute_spec=spec)),
                    "--dry-run"], environ)
    assert plan["create"]["machineType"] == f"zones/{w.zone}/machineTypes/tpu7x-standard-4t", plan
    done = as_json(["recreate", "vm", "-c", str(tmp_path / "vm.toml"), "--yes", "--json"], environ)
    assert done["new_id"] == str(w.instance("vm").id) != str(old), done  # the strict simulator took the insert
