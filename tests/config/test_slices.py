"""A multislice job's slices as one node: how they combine, how the config names them, and what
each worker is told and reached by (the end-to-end behaviour is in tests/e2e/test_multislice_e2e.py)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import asyncssh
import pytest

from tpuwatch.cloud.tpu.adapter import parse_message
from tpuwatch.cloud.tpu.lifecycle import due_slice, queued_request
from tpuwatch.config import multislice_prefix, validate
from tpuwatch.errors import ConfigError
from tpuwatch.model import (
    OWNER_LABEL,
    NodeSnapshot,
    UpcomingMaintenance,
    WorkerEndpoint,
    combine_slices,
    megascale_note,
)
from tpuwatch.workers import hostkeys, protocol
from tpuwatch.workers.gcloud import GcloudSsh
from tpuwatch.workers.ssh import OpenSsh
from tpuwatch.workers.sshworkers import megascale_env

T0 = datetime(2026, 5, 1, tzinfo=timezone.utc)


def part(name: str, node_id: str, *, state: str = "READY", health: str = "HEALTHY", workers: int = 2,
         owner: str = "ms", **kw: object) -> NodeSnapshot:
    n = NodeSnapshot(name=name, project="p", zone="z", id=node_id, create_time=T0, state=state, health=health,
                     health_description="", maintenance_time=None, labels={OWNER_LABEL: owner} if owner else {},
                     workers=tuple(WorkerEndpoint(i, f"10.{node_id}.0.{i}", "") for i in range(workers)))
    return replace(n, **kw)  # type: ignore[arg-type]


def test_slices_combine_into_one_node_usable_only_when_every_slice_is() -> None:
    a, b = part("np-0", "1"), part("np-1", "2")
    both = combine_slices("ms", [a, b])
    assert both is not None and both.usable and both.name == "ms" and both.id == "1+2"
    assert [(w.index, w.slice, w.node, w.worker_id, w.internal_ip) for w in both.workers] == [
        (0, 0, "np-0", 0, "10.1.0.0"), (1, 0, "np-0", 1, "10.1.0.1"),
        (2, 1, "np-1", 0, "10.2.0.0"), (3, 1, "np-1", 1, "10.2.0.1")]
    assert both.owned_by("ms") and both.reachable_workers == both.workers

    down = combine_slices("ms", [a, replace(b, state="REPAIRING", health="UNHEALTHY_MAINTENANCE",
                                            health_description="The TPU is under maintenance")])
    assert down is not None and not down.usable and down.state == "REPAIRING"
    assert down.health == "UNHEALTHY_MAINTENANCE" and "np-1: The TPU is under maintenance" in down.health_description
    assert down.reachable and [w.index for w in down.reachable_workers] == [0, 1]
    # any slice recreated: a new incarnation of the job's node
    assert combine_slices("ms", [a, replace(b, id="3")]).id == "1+3"  # type: ignore[union-attr]
    # one slice missing while the other stands: MISSING (the policy waits as for a repair)
    gone = combine_slices("ms", [a, None])
    assert gone is not None and gone.state == "MISSING" and gone.id == "1+-" and len(gone.workers) == 2
    assert "slice 1 missing" in gone.health_description
    assert combine_slices("ms", [None, None]) is None
    # preempted wins over a repair: the worst state shows
    assert combine_slices("ms", [replace(a, state="PREEMPTED"), replace(b, state="REPAIRING")]).state == "PREEMPTED"  # type: ignore[union-attr]
    # owned only when every slice carries this job's label
    assert not combine_slices("ms", [a, part("np-1", "2", owner="other")]).owned_by("ms")  # type: ignore[union-attr]
    assert not combine_slices("ms", [a, part("np-1", "2", owner="")]).owned_by("ms")  # type: ignore[union-attr]


def test_the_earliest_announced_window_is_the_jobs_and_its_slice_is_started_first() -> None:
    def notice(days: int, status: str = "PENDING") -> UpcomingMaintenance:
        start = T0 + timedelta(days=days)
        return UpcomingMaintenance("SCHEDULED", status, True, start, start + timedelta(hours=1), start)

    both = combine_slices("ms", [part("np-0", "1", upcoming_maintenance=notice(8)),
                                 part("np-1", "2", upcoming_maintenance=notice(7))])
    assert both is not None and both.upcoming_maintenance == notice(7)
    assert due_slice(both) == "np-1"
    later = combine_slices("ms", [part("np-0", "1", upcoming_maintenance=notice(8)),
                                  part("np-1", "2", upcoming_maintenance=notice(7, "ONGOING"))])
    assert due_slice(later) == "np-0"  # type: ignore[arg-type]  # np-1's is under way already
    assert due_slice(part("pod", "9")) == "pod"


def base(**tpu: object) -> dict[str, object]:
    return {"tpu": {"name": "ms", "zone": "us-central2-b", **tpu}, "job": {"command": "python3 train.py"}}


def test_tpu_names_are_checked_and_a_queued_resources_must_be_its_prefixed_nodes() -> None:
    ok = validate(base(names=["np-0", "np-1"], queued_resource="ms"))
    assert ok["tpu"]["names"] == ("np-0", "np-1")
    assert validate(base(names=["alpha", "beta"]))["tpu"]["names"] == ("alpha", "beta")  # created one by one
    for names, fix in ((["np-0"], "one node is not a multislice job"), (["np-0", "np-0"], "listed twice"),
                       (["np-0", "Bad"], "not a TPU name"), ("np-0", "expected a list")):
        with pytest.raises(ConfigError, match=fix) as exc:
            validate(base(names=names))
        assert str(exc.value).startswith("tpu.names:")
    with pytest.raises(ConfigError, match="tpu.names: a multislice queued resource names its nodes <prefix>-0"):
        validate(base(names=["np-1", "np-0"], queued_resource="ms"))
    assert multislice_prefix(["np-0", "np-1", "np-2"]) == "np" and multislice_prefix(["a-b-0", "a-b-1"]) == "a-b"
    assert multislice_prefix(["np-0", "xp-1"]) is None and multislice_prefix(["np"]) is None
    with pytest.raises(ConfigError, match="unknown placeholder"):
        validate({**base(), "job": {"command": "train --slice={slices}"}})
    assert validate({**base(), "job": {"command": "train --slice={slice}"}})["job"]["command"] == "train --slice={slice}"


def test_each_worker_is_told_its_slice_its_id_within_it_and_the_coordinator() -> None:
    both = combine_slices("ms", [part("np-0", "1"), part("np-1", "2")])
    assert both is not None
    assert megascale_env(both, 1) == {"MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.0", "MEGASCALE_PORT": "8081",
                                      "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"}
    assert megascale_env(part("pod", "9"), 0) == {}
    assert megascale_note(both) == "MEGASCALE_* set by tpuwatch in tpu.names order (slices created one by one)"
    # Made together by one multislice queued resource: the runtime's tpu-env has them, ours would override it
    qr = "projects/p/locations/z/queuedResources/ms"
    made = combine_slices("ms", [replace(part("np-0", "1"), multislice_request=qr),
                                 replace(part("np-1", "2"), multislice_request=qr)])
    assert made is not None and megascale_env(made, 1) == {}
    assert megascale_note(made) == "MEGASCALE_* from the TPU runtime's tpu-env (one multislice queued resource)"
    # Two requests, or one slice of a request beside a node made alone: none of them knows all the slices
    for other in ("projects/p/locations/z/queuedResources/ms2", ""):
        mixed = combine_slices("ms", [replace(part("np-0", "1"), multislice_request=qr),
                                      replace(part("np-1", "2"), multislice_request=other)])
        assert mixed is not None and megascale_env(mixed, 1)["MEGASCALE_SLICE_ID"] == "1"
    assert megascale_note(part("pod", "9")) == ""
    w = both.workers[3]
    text = protocol.launch_script("ms", attempt=4, worker=w.worker_id, checkpoint=None, slice=w.slice, slices=2,
                                  command=protocol.render_command("train --s={slice} --w={worker}", checkpoint="",
                                                                  step=None, attempt=4, worker=w.worker_id,
                                                                  slice=w.slice)).decode()
    assert "TW_SLICE=1" in text and "TW_SLICES=2" in text and "TW_WORKER=1" in text
    assert "train --s=1 --w=1" in text
    assert "TW_SLICE=" not in protocol.launch_script("pod", attempt=1, worker=0, checkpoint=None,
                                                     command="x").decode()


def test_gcloud_reaches_a_worker_through_its_own_slice_and_prepares_every_slice(tmp_path: Path) -> None:
    ssh = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", internal_ip=True)
    t = GcloudSsh(openssh=ssh, user="alice", identity_file="/k/id", internal_ip=True)
    both = combine_slices("ms", [part("np-0", "1"), part("np-1", "2")])
    assert both is not None
    argv = t.prepare_argv(both.slice_of(both.workers[3]), both.workers[3])
    assert "alice@np-1" in argv and "--worker=1" in argv


def test_host_keys_are_read_from_each_slice_and_pinned_per_job_worker(tmp_path: Path) -> None:
    keys = {name: {i: (" ".join(asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh")
                                .decode().split()[:2]),) for i in range(2)} for name in ("np-0", "np-1")}
    asked: list[str] = []

    def source(node: NodeSnapshot) -> dict[int, tuple[str, ...]]:
        asked.append(node.name)
        return keys[node.name]

    pins = hostkeys.PinnedHostKeys(tmp_path / "kh", source)
    both = combine_slices("ms", [part("np-0", "1"), part("np-1", "2")])
    assert both is not None
    pins.prepare(both, both.workers)
    assert asked == ["np-0", "np-1"]
    lines = (tmp_path / "kh").read_text().splitlines()
    # job worker 3 is np-1's worker 1
    assert f"{hostkeys.alias(both, 3)} {keys['np-1'][1][0]} {hostkeys.MARK}" in lines
    assert f"{hostkeys.alias(both, 0)} {keys['np-0'][0][0]} {hostkeys.MARK}" in lines


def test_a_multislice_request_is_asked_for_as_a_whole_in_either_api_version() -> None:
    req = queued_request("projects/p/locations/z", "ms", {"acceleratorType": "v5litepod-16",
                                                          "runtimeVersion": "v2-alpha-tpuv5-lite"},
                         "spot", "", ("np-0", "np-1", "np-2"))
    spec = req["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"] == {"nodeCount": 3, "nodeIdPrefix": "np"} and "nodeId" not in spec
    version, msg = parse_message("QueuedResource", req, "tpu.spec")
    assert version == "v2" and msg.tpu.node_spec[0].multislice_params.node_count == 3
    # a node field only v2alpha1 has: the request goes as v2alpha1, whose name is multiNodeParams
    alpha = {**req, "tpu": {"nodeSpec": [{**spec, "node": {**spec["node"], "autocheckpointEnabled": True}}]}}
    version, msg = parse_message("QueuedResource", alpha, "tpu.spec")
    assert version == "v2alpha1" and msg.tpu.node_spec[0].multi_node_params.node_id_prefix == "np"
    one = queued_request("projects/p/locations/z", "pod", {"acceleratorType": "v4-8"})
    assert one["tpu"]["nodeSpec"][0]["nodeId"] == "pod"


def test_the_port_probe_of_a_multislice_job_watches_a_slice_that_is_down(tmp_path: Path) -> None:
    from tpuwatch.workers.sshworkers import SshWorkers

    workers = SshWorkers(OpenSsh(known_hosts=tmp_path / "kh", user="u", port=2222, internal_ip=True), job="ms",
                         command="x")
    down = combine_slices("ms", [part("np-0", "1"), part("np-1", "2", state="REPAIRING")])
    assert down is not None and workers.port_target(down) == ("10.2.0.0", 2222)
    assert workers.port_target(part("pod", "9")) == ("10.9.0.0", 2222)


def test_gcloud_prepares_each_slice_once_it_is_up_and_then_never_again_for_the_job(tmp_path: Path) -> None:
    # A stand-in for gcloud (the boundary: the real one would call Google): it logs each target and
    # prints what LEARN_COMMAND prints on a worker.
    calls = tmp_path / "calls"
    fake = tmp_path / "gcloud"
    fake.write_text(f"#!/bin/sh\necho \"$5\" >> {calls}\necho '@tpuwatch login user=alice_x home=/home/alice_x'\n")
    fake.chmod(0o755)
    ssh = OpenSsh(known_hosts=tmp_path / "kh", user="alice", identity_file="/k/id", internal_ip=True)
    t = GcloudSsh(openssh=ssh, user="alice", identity_file="/k/id", binary=str(fake))
    half = combine_slices("ms", [part("np-0", "1"), part("np-1", "2", state="REPAIRING")])
    assert half is not None and t.prepare(half) is None
    assert calls.read_text().split() == ["alice@np-0"]  # np-1 is down: prepared once it is up
    login = t.login(half)
    assert login is not None and login.user == "alice_x"
    both = combine_slices("ms", [part("np-0", "1"), part("np-1", "2")])
    assert both is not None and t.prepare(both) is None and t.prepare(both) is None
    assert calls.read_text().split() == ["alice@np-0", "alice@np-1"]
    whole = t.login(both)
    assert whole is not None and whole.node_id == both.id  # what the journal keeps for the next watcher
    later = GcloudSsh(openssh=ssh, user="alice", identity_file="/k/id", binary=str(fake))
    later.remember(whole)
    assert later.prepare(both) is None and later.prepare_calls == 0


def test_min_slices_is_for_a_multislice_job_fewer_than_its_slices_with_checkpoints_to_resume_from() -> None:
    def job(**keys: object) -> dict[str, object]:
        return {"command": "train --resume={checkpoint} --slices={num_slices}", "checkpoint_dir": "gs://b/ck", **keys}

    ok = validate({**base(names=["np-0", "np-1", "np-2"]), "job": job(min_slices=2)})
    assert ok["job"]["min_slices"] == 2
    for cfg, fix in (({**base(), "job": job(min_slices=1)}, "a job on one node cannot train on fewer slices"),
                     ({**base(names=["np-0", "np-1"]), "job": job(min_slices=2)}, "not fewer than the job's 2 slices"),
                     ({**base(names=["np-0", "np-1"]), "job": {"command": "train", "min_slices": 1}},
                      "set job.checkpoint_dir"),
                     ({**base(names=["np-0", "np-1"]), "job": job(min_slices=-1)}, "out of range; use 0..10000")):
        with pytest.raises(ConfigError, match=fix) as exc:
            validate(cfg)
        assert str(exc.value).startswith("job.min_slices"), exc.value


def test_spares_are_idle_nodes_each_named_once_not_the_jobs_own() -> None:
    ok = validate(base(names=["np-0", "np-1"], spares=["spare-a", "spare-b"]))
    assert ok["tpu"]["spares"] == ("spare-a", "spare-b")
    assert validate(base(spares=["spare-a"]))["tpu"]["spares"] == ("spare-a",)  # a job on one node: a pool of one
    for tpu, fix in (({"queued_resource": "qr"}, "made again through it"),
                     ({"names": ["np-0", "np-1"], "spares": ["np-1"]}, "'np-1' is also one of the job's slices"),
                     ({"names": ["np-0", "np-1"], "spares": ["ms"]}, "'ms' is also one of the job's slices"),
                     ({"names": ["np-0", "np-1"], "spares": ["sp", "sp"]}, "'sp' is listed twice"),
                     ({"names": ["np-0", "np-1"], "spares": ["Spare_A"]}, "is not a TPU name"),
                     ({"names": ["np-0", "np-1"], "spares": "spare-a"}, "list")):
        with pytest.raises(ConfigError, match=fix) as exc:
            validate(base(spares=tpu.pop("spares", ["spare-a"]), **tpu))
        assert str(exc.value).startswith("tpu.spares"), exc.value


def compute(**tpu: object) -> dict[str, object]:
    return {"tpu": {"zone": "us-central2-b", "api": "compute", "instance": "vm", **tpu}, "job": {"command": "train"}}


def test_a_compute_engine_instances_spares_are_instances_by_name_or_url_in_its_zone() -> None:
    zone = "us-central2-b"
    given = ["sp-a", f"zones/{zone}/instances/sp-b", f"projects/my-proj/zones/{zone}/instances/sp-c",
             f"https://compute.googleapis.com/compute/v1/projects/my-proj/zones/{zone}/instances/sp-d",
             f"https://www.googleapis.com/compute/v1/projects/my-proj/zones/{zone}/instances/sp-e"]
    assert validate(compute(project="my-proj", spares=given))["tpu"]["spares"] == ("sp-a", "sp-b", "sp-c", "sp-d", "sp-e")
    disk = {"boot": True, "source": "zones/us-central2-b/disks/vm", "mode": "READ_WRITE"}
    for tpu, key, fix in (
            ({"spares": ["vm"]}, "tpu.spares", "'vm' is the job's own instance (tpu.instance)"),
            ({"spares": ["sp", "zones/us-central2-b/instances/sp"]}, "tpu.spares", "'sp' is listed twice"),
            ({"spares": ["Sp_A"]}, "tpu.spares", "not an instance name"),
            ({"spares": ["zones/us-east5-a/instances/sp"]}, "tpu.spares", "not the job's zone us-central2-b"),
            ({"project": "my-proj", "spares": ["projects/other-proj/zones/us-central2-b/instances/sp"]}, "tpu.spares",
             "not the job's project my-proj"),
            ({"spares": ["zones/us-central2-b/instanceGroupManagers/sp"]}, "tpu.spares", "not an instance"),
            ({"spares": ["regions/us-central2/instances/sp"]}, "tpu.spares", "not an instance"),
            ({"zone": "", "spares": ["zones/us-east5-a/instances/sp", "zones/us-east5-b/instances/sq"]},
             "tpu.spares", "not the job's zone us-east5-a"),
            ({"spares": ["sp"], "compute_spec": {"instance": {"disks": [disk]}}},
             "tpu.compute_spec.instance.disks[0].source", "cannot also attach")):
        with pytest.raises(ConfigError, match=re.escape(fix)) as exc:
            validate(compute(**tpu))
        assert str(exc.value).startswith(key), exc.value
    unzoned = validate(compute(zone="", spares=["zones/us-east5-a/instances/sp"]))["tpu"]
    assert (unzoned["spares"], unzoned["zone"]) == (("sp",), "us-east5-a")  # the job's zone, as its spare's says
    shared = {"compute_spec": {"instance": {"disks": [{**disk, "mode": "READ_ONLY"}]}}}
    assert validate(compute(spares=["sp"], **shared))["tpu"]["spares"] == ("sp",)  # a disk several may read


def test_a_compute_engine_migs_spares_are_migs_by_name_or_url_in_its_zone_or_region() -> None:
    zone = "us-central2-b"
    given = ["sp-a", f"zones/{zone}/instanceGroupManagers/sp-b", f"projects/my-proj/zones/{zone}/instanceGroupManagers/sp-c",
             f"https://compute.googleapis.com/compute/v1/projects/my-proj/zones/{zone}/instanceGroupManagers/sp-d",
             "regions/us-central2/instanceGroupManagers/sp-e"]
    mig = {"instance": "", "mig": "slice", "project": "my-proj"}
    assert validate(compute(**mig, spares=given))["tpu"]["spares"] == ("sp-a", "sp-b", "sp-c", "sp-d", "sp-e")
    for tpu, fix in (
            ({"spares": ["slice"]}, "'slice' is the job's own MIG (tpu.mig)"),
            ({"spares": [f"zones/{zone}/instanceGroupManagers/slice"]}, "'slice' is the job's own MIG (tpu.mig)"),
            ({"spares": ["sp", f"zones/{zone}/instanceGroupManagers/sp"]}, "'sp' is listed twice"),
            ({"spares": [f"zones/{zone}/instances/sp"]}, "is not a MIG (instances)"),
            ({"spares": ["Sp_A"]}, "not a MIG name"),
            ({"spares": ["zones/us-east5-a/instanceGroupManagers/sp"]}, "not the job's zone us-central2-b"),
            ({"spares": ["regions/us-east5/instanceGroupManagers/sp"]}, "a MIG of region us-east5, not of the job's zone"),
            ({"spares": [f"projects/other-proj/zones/{zone}/instanceGroupManagers/sp"]}, "not the job's project my-proj"),
            ({"flex_start": "24h", "compute_spec": {"mig": {"targetSize": 4}}, "spares": ["sp"]},
             "not with tpu.flex_start")):
        with pytest.raises(ConfigError, match=re.escape(fix)) as exc:
            validate(compute(**{**mig, **tpu}))
        assert str(exc.value).startswith("tpu.spares"), exc.value


def test_a_pool_of_one_slot_is_seen_through_the_instance_it_runs_on() -> None:
    """A job on a Compute Engine instance with spares: its view is the instance (or spare) it runs
    on, with the facts only an instance has (what made it, its URL, Google's stop or deletion)."""
    spare = part("sp", "7", workers=1, kind="instance", resource="projects/p/zones/z/instances/sp",
                 pending_stop=True, google_deletes=True, google_deletes_at=T0, google_deleting="a Spot VM is STOPPING",
                 auto_restart=False, spot=True)
    view = combine_slices("vm", [spare])
    assert view is not None and (view.name, view.id, view.slices) == ("vm", "7", (spare,))
    assert (view.kind, view.full_name, view.pending_stop, view.google_deletes, view.google_deletes_at,
            view.google_deleting, view.auto_restart) == ("instance", "projects/p/zones/z/instances/sp", True, True, T0,
                                                         "a Spot VM is STOPPING", False)
    both = combine_slices("ms", [spare, part("sq", "8", workers=1, kind="instance")])
    assert both is not None and both.google_deleting == "" and both.resource == ""  # several slices: none is the job's


def test_priority_is_a_whole_number_for_tpu_api_nodes_made_plainly() -> None:
    ok = validate({**base(), "job": {"command": "train", "priority": 300}})
    assert ok["job"]["priority"] == 300
    assert validate(base())["job"]["priority"] == "off"
    for job, tpu, fix in (({"priority": 1001}, {}, "0..1000"), ({"priority": "high"}, {}, "0..1000"),
                          ({"priority": True}, {}, "0..1000"),
                          ({"priority": 5}, {"queued_resource": "qr"}, "queued resource")):
        with pytest.raises(ConfigError, match=fix) as exc:
            validate({**base(**tpu), "job": {"command": "train", **job}})
        assert str(exc.value).startswith("job.priority") and exc.value.exit_code == 2, exc.value


def test_priority_takes_a_compute_instance_and_refuses_a_mig() -> None:
    """A hand-over relabels the node: an instance takes setLabels; a MIG has no labels of its own."""
    ok = validate({"tpu": {"zone": "us-central2-b", "api": "compute", "instance": "vm"},
                   "job": {"command": "train", "priority": 5}})
    assert ok["job"]["priority"] == 5
    with pytest.raises(ConfigError, match="not with tpu.mig") as exc:
        validate({"tpu": {"zone": "us-central2-b", "api": "compute", "mig": "slice"},
                  "job": {"command": "train", "priority": 5}})
    assert str(exc.value).startswith("job.priority") and exc.value.exit_code == 2
    assert "no labels of its own" in str(exc.value) and "tpu.instance" in str(exc.value)
    off = validate({"tpu": {"zone": "us-central2-b", "api": "compute", "mig": "slice"},
                    "job": {"command": "train", "priority": "off"}})
    assert off["job"]["priority"] == "off"
    # an instance Google deletes itself (termination action DELETE) is taken, as STOP is: the job
    # inserts it again once gone with Google's word (policy/spares.py)
    spec = {"instance": {"machineType": "zones/us-central2-b/machineTypes/tpu7x-standard-4t",
                         "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}}}
    for action in ("DELETE", "STOP"):
        spec["instance"]["scheduling"]["instanceTerminationAction"] = action
        assert validate({"tpu": {"zone": "us-central2-b", "api": "compute", "instance": "vm", "compute_spec": spec},
                         "job": {"command": "train", "priority": 5}})["job"]["priority"] == 5
