"""`tpuwatch init` and `tpuwatch recreate` against the simulator, with the real TPU clients.

The simulated workers run the node's startup-script metadata at boot, reading their settings from
the simulator's metadata server (each worker its own, at GCE_METADATA_HOST).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run_cli
from e2e_helpers import wait_for

from tpuwatch import recreate as rc
from tpuwatch.cloud.tpu.lifecycle import Lifecycle
from tpuwatch.config import load_config
from tpuwatch.sim.simulator import Simulator
from tpuwatch.spec import OWNER_LABEL

REPO = Path(__file__).resolve().parents[2]
RESUME = REPO / "startup-scripts" / "resume-training.sh"
ZONE_A, ZONE_B = "us-central2-b", "us-central2-a"


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    with Simulator(root=tmp_path_factory.mktemp("sim"), speed=600, zones=[ZONE_A, ZONE_B], zone=ZONE_A) as s:
        s.hosts.extra_env["TPUWATCH_METADATA_RETRIES"] = "1"
        yield s
        assert s.world.scheduler_errors == [], "a simulator step raised"
        assert s.world.host_errors == [], "an effect on the simulated hosts failed"


@pytest.fixture
def env(shared_sim: Simulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Simulator:
    for k, v in shared_sim.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # never the user's gcloud config
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    shared_sim.world.clear_errors()
    shared_sim.world.reset_calls()  # each test counts its own calls, whichever ran before it here
    return shared_sim



def write_config(sim: Simulator, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str],
                 *, job: str | None = None, fallback: list[str] | None = None) -> Path:
    """`tpuwatch init`, then the edits a user makes: startup script, command, checkpoint dir."""
    cfg = tmp_path / f"{name}.toml"
    args = ["init", name, "-o", str(cfg)] + (["--job", job] if job else [])
    code, out, err = run_cli(list(args), capsys)
    assert code == 0, err
    text = cfg.read_text()
    text = re.sub(r"(?m)^startup_script = .*$", f"startup_script = {json.dumps(str(RESUME))}", text)
    text = re.sub(r"(?m)^command = .*$",
                  'command = "echo resumed attempt={attempt} worker={worker} > $HOME/resumed; exec sleep 600"', text)
    text = re.sub(r"(?m)^checkpoint_dir = .*$", f"checkpoint_dir = {json.dumps(str(sim.bucket / name))}", text)
    if fallback:
        text = re.sub(r"(?m)^fallback_zones = .*$", f"fallback_zones = {json.dumps(fallback)}", text)
    cfg.write_text(text)
    return cfg


def test_init_writes_a_config_load_config_accepts_and_leaves_the_node_alone(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("init-a", "v4-16", labels={"team": "x"}, metadata={"k": "v"}, startup_script="echo hi\n")
    env.world.reset_calls()
    cfg_path = write_config(env, tmp_path, "init-a", capsys)
    cfg = load_config(cfg_path)
    spec = cfg.tpu["spec"]
    assert cfg.tpu_name == "init-a" and cfg.tpu["zone"] == ZONE_A and cfg.tpu["project"] == env.project
    assert spec["accelerator_type"] == "v4-16"
    assert spec["labels"] == {"team": "x", OWNER_LABEL: "init-a"}
    assert spec["metadata"] == {"k": "v", "startup-script": "echo hi\n"}
    # The API reports the subnetwork's range as cidr_block; sent back on a recreate, it conflicts
    # with that subnetwork (the recreate tests below create from this very capture).
    assert "cidr_block" not in spec
    assert OWNER_LABEL not in env.world.node("init-a").spec.labels  # not without --adopt
    assert set(env.world.calls) == {"google.cloud.tpu.v2alpha1.Tpu/GetNode"}

    code, _, err = run_cli(["init", "init-a", "-o", str(cfg_path)], capsys)
    assert code == 2 and "already exists; pass --force" in err
    code, _, err = run_cli(["init", "no-such-tpu", "-o", str(tmp_path / "x.toml")], capsys)
    assert code == 1 and "no TPU named no-such-tpu" in err


def test_recreate_dry_run_prints_the_requests_and_changes_nothing(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("dry", "v4-8", labels={OWNER_LABEL: "dry"})
    cfg = write_config(env, tmp_path, "dry", capsys)
    before = env.world.node("dry").id
    env.world.reset_calls()
    code, out, err = run_cli(["recreate", "dry", "-c", str(cfg), "--dry-run"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["delete"]["name"] == f"projects/{env.project}/locations/{ZONE_A}/nodes/dry"
    node = plan["create"]["node"]
    assert node["metadata"]["startup-script"] == RESUME.read_text()
    assert node["labels"][OWNER_LABEL] == "dry"
    assert env.world.node("dry").id == before
    assert env.world.call_count("CreateNode") == 0 and env.world.call_count("DeleteNode") == 0


def test_recreate_refuses_a_node_it_does_not_own(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("theirs", "v4-8", labels={OWNER_LABEL: "theirs-2"})  # a prefix is not ownership
    cfg = write_config(env, tmp_path, "theirs", capsys)
    env.world.reset_calls()
    before = env.world.node("theirs").id
    code, _, err = run_cli(["recreate", "theirs", "-c", str(cfg), "--yes"], capsys)
    assert code == 1
    assert f"has {OWNER_LABEL}=theirs-2, not {OWNER_LABEL}=theirs" in err and "--adopt" in err
    assert env.world.node("theirs").id == before
    assert env.world.call_count("DeleteNode") == 0


def test_recreate_without_tty_or_yes_is_a_usage_error(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    env.create_node("ask", "v4-8", labels={OWNER_LABEL: "ask"})
    cfg = write_config(env, tmp_path, "ask", capsys)
    env.world.reset_calls()
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run_cli(["recreate", "ask", "-c", str(cfg)], capsys)
    assert code == 2 and "pass --yes" in err
    assert env.world.call_count("DeleteNode") == 0


def test_recreate_an_owned_node_gives_a_new_node_that_runs_the_startup_script(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("own", "v4-16", labels={OWNER_LABEL: "own", "team": "x"}, metadata={"k": "v"})
    cfg = write_config(env, tmp_path, "own", capsys)
    # A checkpoint_dir on the TPU VM cannot be read from here: the startup script only sets up.
    code, out, err = run_cli(["recreate", "own", "-c", str(cfg), "--yes", "--json"], capsys)
    assert code == 0, err
    assert "is on the TPU VM" in err and "starts the job from what it finds there" in err
    key = env.node_key("own")
    rec = env.world.node("own")
    assert rec.spec.metadata["tpuwatch-launch"] == "false" and "tpuwatch-attempt" not in rec.spec.metadata
    for w in range(rec.n_workers):
        wait_for(lambda w=w: env.hosts.startup_status(key, w) is not None, what=f"startup script on worker {w}")
        log = (env.hosts.worker_home(key, w) / "startup-script.log").read_text()
        assert "set up only; the watcher starts the job" in log, log
        assert not (env.hosts.worker_home(key, w) / "resumed").exists()
    # With no checkpoint_dir (or gs://) the new node's startup script starts the job at boot.
    cfg.write_text(re.sub(r"(?m)^checkpoint_dir = .*$", 'checkpoint_dir = ""', cfg.read_text()))
    before = env.world.node("own").id
    code, out, err = run_cli(["recreate", "own", "-c", str(cfg), "--yes", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    rec = env.world.node("own")
    assert str(rec.id) == result["new_id"] != str(before)
    assert rec.spec.labels == {OWNER_LABEL: "own", "team": "x"}
    assert rec.spec.metadata["k"] == "v"
    assert rec.spec.metadata["startup-script"] == RESUME.read_text()
    key = env.node_key("own")
    for w in range(rec.n_workers):  # v4-16: two workers, each booted the script and resumed the job
        wait_for(lambda w=w: env.hosts.startup_status(key, w) is not None, what=f"startup script on worker {w}")
        home = env.hosts.worker_home(key, w)
        assert env.hosts.startup_status(key, w) == 0, (home / "startup-script.log").read_text()
        assert f"launched attempt 1 of own on worker {w}" in (home / "startup-script.log").read_text()
        wait_for(lambda home=home: (home / "resumed").exists(), what=f"the job on worker {w}")
        assert (home / "resumed").read_text() == f"resumed attempt=1 worker={w}\n"
        assert (home / ".tpuwatch" / "own" / "attempt").read_text().strip() == "1"


def test_stockout_is_queueable_with_the_api_text_and_fallback_zone_is_used(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("stock", "v4-8", labels={OWNER_LABEL: "stock"})
    cfg_path = write_config(env, tmp_path, "stock", capsys, fallback=[ZONE_B])
    cfg = load_config(cfg_path)
    from tpuwatch.cloud.tpu.adapter import TpuAdapter

    env.world.stockout(ZONE_B)
    api = TpuAdapter(env.project, ZONE_B)
    op = rc.start_create(Lifecycle(api), cfg, ZONE_B)
    failure = rc.classify_operation(rc.wait_operation(api, op, timeout=30))
    assert failure is not None and failure.queueable and failure.reason == "no_capacity"
    assert failure.message.startswith(f'There is no more capacity in the zone "{ZONE_B}"')
    env.world.clear_errors()

    env.world.stockout(ZONE_A)
    code, out, err = run_cli(["recreate", "stock", "-c", str(cfg_path), "--yes"], capsys)
    assert code == 0, err
    assert f'create in {ZONE_A} failed: There is no more capacity in the zone "{ZONE_A}"' in out
    assert f"recreated stock in {ZONE_B} (fallback zone" in out
    assert not env.world.has_node("stock", zone=ZONE_A)
    assert env.world.node("stock", zone=ZONE_B).spec.labels[OWNER_LABEL] == "stock"


def test_quota_refusal_is_queueable_and_everywhere_out_fails_with_exit_1(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("quota", "v4-8", labels={OWNER_LABEL: "quota"})
    cfg_path = write_config(env, tmp_path, "quota", capsys)
    from tpuwatch.cloud.tpu.adapter import TpuAdapter

    env.world.quota(ZONE_A)
    with pytest.raises(rc.CreateRejected) as refused:
        rc.start_create(Lifecycle(TpuAdapter(env.project, ZONE_A)), load_config(cfg_path), ZONE_A)
    assert refused.value.failure.queueable and refused.value.failure.reason == "quota"
    assert refused.value.failure.message.startswith("Quota limit 'TPUV4PerProjectPerRegionForTPUAPI' has been exceeded")

    code, out, err = run_cli(["recreate", "quota", "-c", str(cfg_path), "--yes"], capsys)
    assert code == 1
    assert "could not create quota: no capacity or quota" in err and "Quota limit" in err


def test_a_node_from_a_queued_resource_is_recreated_through_one_with_the_same_tier(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from google.cloud import tpu_v2

    from tpuwatch.cloud import clients

    parent = f"projects/{env.project}/locations/{ZONE_A}"
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base",
                       labels={OWNER_LABEL: "qnode"}, metadata={"k": "v"})
    request = tpu_v2.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id="qr1",
        queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id="qnode", node=node)]),
            spot=tpu_v2.QueuedResource.Spot()))
    clients.tpu_client("v2").create_queued_resource(request=request)
    env.world.wait_for(lambda w: w.has_node("qnode") and w.node("qnode").state == "READY", timeout=20)
    env.world.wait_for(lambda w: w.get_queued_resource(env.project, ZONE_A, "qr1").state == "ACTIVE", timeout=20)

    cfg = write_config(env, tmp_path, "qnode", capsys)
    text = cfg.read_text()
    assert 'queued_resource = "qr1"' in text and 'queued_resource_tier = "spot"' in text
    before = env.world.node("qnode").id

    code, out, err = run_cli(["recreate", "qnode", "-c", str(cfg), "--dry-run"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["delete"] == {"method": "google.cloud.tpu.v2.Tpu.DeleteQueuedResource",
                              "name": f"{parent}/queuedResources/qr1", "force": True}
    assert plan["create"]["queuedResourceId"] == "qr1" and "spot" in plan["create"]["queuedResource"]

    code, out, err = run_cli(["recreate", "qnode", "-c", str(cfg), "--yes"], capsys)
    assert code == 0, err
    rec = env.world.node("qnode")
    assert rec.id != before and rec.spec.spot and rec.spec.metadata["k"] == "v"
    assert rec.queued_resource == f"{parent}/queuedResources/qr1"
    assert env.world.get_queued_resource(env.project, ZONE_A, "qr1").state == "ACTIVE"


@pytest.mark.parametrize(("tier", "alpha_tier", "reservation"), [
    ("best_effort", {"best_effort": {}}, ""),
    ("reserved", {"guaranteed": {"reserved": True}}, ""),
    ("guaranteed", {"guaranteed": {}}, "projects/{project}/locations/{zone}/reservations/tpu-res"),
])
def test_a_v2alpha1_tier_and_a_reservation_are_captured_and_asked_for_again_on_recreate(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        tier: str, alpha_tier: dict[str, object], reservation: str) -> None:
    """best_effort and guaranteed.reserved exist only in v2alpha1 (gcloud alpha --best-effort,
    --reserved): read through v2, the request looks on demand, and a recreate from that would
    draw on other quota. The request the simulator receives on recreate must ask for the same."""
    from google.cloud import tpu_v2alpha1

    from tpuwatch.cloud import clients

    qr_id, node_id = f"qr-{tier.replace('_', '-')}", f"n-{tier.replace('_', '-')}"
    parent = f"projects/{env.project}/locations/{ZONE_A}"
    reservation = reservation.format(project=env.project, zone=ZONE_A)
    node = tpu_v2alpha1.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base",
                             labels={OWNER_LABEL: node_id})
    request = tpu_v2alpha1.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id=qr_id,
        queued_resource=tpu_v2alpha1.QueuedResource.from_json(json.dumps(
            {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": node_id,
                                   "node": json.loads(tpu_v2alpha1.Node.to_json(node))}]},
             **{("bestEffort" if k == "best_effort" else k): v for k, v in alpha_tier.items()},
             **({"reservationName": reservation} if reservation else {})})))
    clients.tpu_client("v2alpha1").create_queued_resource(request=request)
    env.world.wait_for(lambda w: w.has_node(node_id) and w.node(node_id).state == "READY", timeout=20)
    env.world.wait_for(lambda w: w.get_queued_resource(env.project, ZONE_A, qr_id).state == "ACTIVE", timeout=20)
    first = env.world.get_queued_resource(env.project, ZONE_A, qr_id)
    assert (first.tier, first.reservation) == (tier, reservation)

    cfg = write_config(env, tmp_path, node_id, capsys)
    spec = load_config(cfg).tpu["spec"]
    assert spec["queued_resource_tier"] == tier and spec.get("reservation_name", "") == reservation

    before = env.world.node(node_id).id
    code, _, err = run_cli(["recreate", node_id, "-c", str(cfg), "--yes"], capsys)
    assert code == 0, err
    assert env.world.node(node_id).id != before
    again = env.world.get_queued_resource(env.project, ZONE_A, qr_id)
    assert again.create_ns != first.create_ns and again.state == "ACTIVE"
    assert (again.tier, again.reservation) == (tier, reservation), again.spec_json
    if tier in ("best_effort", "reserved"):  # only v2alpha1 can ask for these
        assert again.api_version == "v2alpha1"


def test_a_node_on_reserved_capacity_is_recreated_on_reserved_capacity(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The node-level scheduling config (gcloud `tpu-vm create --reserved`) is captured and sent again."""
    from google.cloud import tpu_v2

    from tpuwatch.cloud import clients

    parent = f"projects/{env.project}/locations/{ZONE_A}"
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base",
                       labels={OWNER_LABEL: "resnode"}, scheduling_config=tpu_v2.SchedulingConfig(reserved=True))
    clients.tpu_client("v2").create_node(parent=parent, node_id="resnode", node=node)
    env.world.wait_for(lambda w: w.has_node("resnode") and w.node("resnode").state == "READY", timeout=20)
    cfg = write_config(env, tmp_path, "resnode", capsys)
    assert load_config(cfg).tpu["spec"]["reserved"] is True
    before = env.world.node("resnode").id
    code, _, err = run_cli(["recreate", "resnode", "-c", str(cfg), "--yes"], capsys)
    assert code == 0, err
    rec = env.world.node("resnode")
    assert rec.id != before and json.loads(rec.spec.spec_json)["schedulingConfig"]["reserved"] is True


def test_an_unknown_fallback_zone_is_refused_before_anything_is_deleted(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("fz", "v4-8", labels={OWNER_LABEL: "fz"})
    cfg = write_config(env, tmp_path, "fz", capsys, fallback=["europe-west9-z"])
    env.world.reset_calls()
    before = env.world.node("fz").id
    code, _, err = run_cli(["recreate", "fz", "-c", str(cfg), "--yes"], capsys)
    assert code == 2
    assert "tpu.fallback_zones: 'europe-west9-z' cannot be used" in err
    assert env.world.node("fz").id == before and env.world.call_count("DeleteNode") == 0


def test_a_bad_spec_or_missing_startup_script_is_refused_before_anything_is_deleted(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("badspec", "v4-8", labels={OWNER_LABEL: "badspec"})
    cfg = write_config(env, tmp_path, "badspec", capsys)
    env.world.reset_calls()
    good = cfg.read_text()
    cfg.write_text(good.replace(f"startup_script = {json.dumps(str(RESUME))}", 'startup_script = "nope.sh"'))
    code, _, err = run_cli(["recreate", "badspec", "-c", str(cfg), "--yes"], capsys)
    assert code == 2 and "tpu.startup_script: file" in err and "nope.sh' not found" in err
    cfg.write_text(re.sub(r'(?m)^runtime_version = .*\n', "", good))
    code, _, err = run_cli(["recreate", "badspec", "-c", str(cfg), "--yes"], capsys)
    assert code == 2 and "tpu.spec.runtime_version: missing" in err
    assert env.world.call_count("DeleteNode") == 0 and env.world.has_node("badspec")


def test_init_adopt_refuses_a_node_owned_by_another_job(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("other", "v4-8", labels={OWNER_LABEL: "other-job"})
    out = tmp_path / "other.toml"
    code, _, err = run_cli(["init", "other", "-o", str(out), "--adopt"], capsys)
    assert code == 1 and "already belongs to job 'other-job'" in err
    assert not out.exists()
    assert env.world.node("other").spec.labels == {OWNER_LABEL: "other-job"}
    code, _, err = run_cli(["init", "other", "-o", str(out), "--job", "Bad Name"], capsys)
    assert code == 2 and "--job" in err
    code, printed, err = run_cli(["init", "other", "-o", str(out), "--job", "other-job", "--adopt", "--json"], capsys)
    assert code == 0, err  # already labelled for this job: nothing to update
    assert json.loads(printed)["owned"] is True


def test_init_of_a_node_tpuwatch_created_recovers_the_job_settings(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("again", "v4-8", labels={OWNER_LABEL: "again"})
    cfg = write_config(env, tmp_path, "again", capsys)
    code, _, err = run_cli(["recreate", "again", "-c", str(cfg), "--yes"], capsys)
    assert code == 0, err
    assert "tpuwatch-worker-script" in env.world.node("again").spec.metadata
    code, _, err = run_cli(["init", "again", "-o", str(tmp_path / "again2.toml")], capsys)
    assert code == 0, err
    again = load_config(tmp_path / "again2.toml")
    assert again.job["command"] == load_config(cfg).job["command"]
    assert again.job["checkpoint_dir"] == str(env.bucket / "again")
    assert not any(k in again.tpu["spec"].get("metadata", {}) for k in ("tpuwatch-job", "tpuwatch-worker-script"))


def test_init_adopt_labels_the_live_node_so_recreate_may_delete_it(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("adopt", "v4-8", labels={"team": "x"}, metadata={"k": "v"})
    cfg = tmp_path / "adopt.toml"
    env.world.reset_calls()
    code, out, err = run_cli(["init", "adopt", "-o", str(cfg), "--job", "run-7", "--adopt"], capsys)
    assert code == 0, err
    assert "labelled the live TPU tpuwatch-job=run-7" in out
    rec = env.world.node("adopt")
    assert rec.spec.labels == {"team": "x", OWNER_LABEL: "run-7"}  # other labels kept
    assert rec.spec.metadata == {"k": "v"}  # a labels-only update
    assert env.world.call_count("v2.Tpu/UpdateNode") == 1
    assert load_config(cfg).job_name == "run-7"

    # adopted: the recreate needs no --adopt
    text = re.sub(r"(?m)^command = .*$", 'command = "true"', cfg.read_text())
    cfg.write_text(text)
    code, out, err = run_cli(["recreate", "adopt", "-c", str(cfg), "--yes", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["new_id"] != str(rec.id)
    assert env.world.node("adopt").spec.labels == {"team": "x", OWNER_LABEL: "run-7"}

    # a node on a stopped or preempted path cannot be updated: the API's error, exit 3
    env.create_node("adopt-pre", "v4-8", spot=True)
    env.world.preempt("adopt-pre")
    code, _, err = run_cli(["init", "adopt-pre", "-o", str(tmp_path / "pre.toml"), "--adopt"], capsys)
    assert code == 3 and "update is not supported while in state PREEMPTED" in err
    assert OWNER_LABEL not in env.world.node("adopt-pre").spec.labels


def test_a_spec_with_v2alpha1_fields_is_recreated_through_v2alpha1_and_captured_again(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("alpha", "v4-8", labels={OWNER_LABEL: "alpha"})
    cfg = write_config(env, tmp_path, "alpha", capsys)
    cfg.write_text(cfg.read_text().replace(
        "[tpu.spec]\n",
        '[tpu.spec]\nautocheckpoint_enabled = true\nboot_disk = { enable_confidential_compute = true }\n', 1))
    code, out, err = run_cli(["recreate", "alpha", "-c", str(cfg), "--dry-run"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["create"]["method"] == "google.cloud.tpu.v2alpha1.Tpu.CreateNode"
    assert plan["create"]["node"]["autocheckpointEnabled"] is True
    env.world.reset_calls()
    code, out, err = run_cli(["recreate", "alpha", "-c", str(cfg), "--yes"], capsys)
    assert code == 0, err
    assert env.world.call_count("v2alpha1.Tpu/CreateNode") == 1 and env.world.call_count("v2.Tpu/CreateNode") == 0
    code, _, err = run_cli(["init", "alpha", "-o", str(tmp_path / "alpha2.toml")], capsys)
    assert code == 0, err
    spec = load_config(tmp_path / "alpha2.toml").tpu["spec"]
    assert spec["autocheckpoint_enabled"] is True and spec["boot_disk"] == {"enable_confidential_compute": True}


def test_an_empty_or_bad_spec(env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.create_node("nospec", "v4-8", labels={OWNER_LABEL: "nospec"})
    cfg = write_config(env, tmp_path, "nospec", capsys)
    good = cfg.read_text()
    # no [tpu.spec] at all: the config loads, and recreate says what to run
    head, _, rest = good.partition("[tpu.spec]")
    without = head + "[job]" + rest.partition("[job]")[2]
    cfg.write_text(without)
    assert load_config(cfg).tpu["spec"] == {}
    env.world.reset_calls()
    code, _, err = run_cli(["recreate", "nospec", "-c", str(cfg), "--yes"], capsys)
    assert code == 2 and "tpu.spec: missing; run `tpuwatch init nospec`" in err
    # a misspelt key is refused when the config is read, by any command
    cfg.write_text(good.replace("runtime_version =", "runtime_versoin =", 1))
    code, _, err = run_cli(["recreate", "nospec", "-c", str(cfg), "--dry-run"], capsys)
    assert code == 2 and "tpu.spec.runtime_versoin: unknown key (did you mean 'runtime_version'?)" in err
    assert env.world.call_count("DeleteNode") == 0 and env.world.call_count("GetNode") == 0


def test_recreate_journals_each_step_and_refuses_while_a_watcher_holds_the_job(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpuwatch.config import load_config
    from tpuwatch.journal import Journal

    env.create_node("jrn", "v4-8", labels={OWNER_LABEL: "jrn"})
    cfg_path = write_config(env, tmp_path, "jrn", capsys)
    cfg = load_config(cfg_path)
    before = env.world.node("jrn").id
    # A watcher (or a cron check) holds the job: a person's recreate must not act beside it.
    with Journal.open(cfg.state_dir, cfg.job_name, cfg.tpu_name, wait=False):
        code, _, err = run_cli(["recreate", "jrn", "-c", str(cfg_path), "--yes"], capsys)
    assert code == 1 and "another tpuwatch" in err, err
    assert env.world.node("jrn").id == before and env.world.call_count("DeleteNode") == 0
    code, _, err = run_cli(["recreate", "jrn", "-c", str(cfg_path), "--yes"], capsys)
    assert code == 0, err
    with Journal.open(cfg.state_dir, cfg.job_name, cfg.tpu_name, readonly=True) as journal:
        lines = [e.reason for e in journal.events() if e.kind == "recreate"]
    assert any(line.startswith("deleting jrn") and "operations/" in line for line in lines), lines
    assert any(line.startswith("creating jrn") and "operations/" in line for line in lines), lines
    assert any(line.startswith("recreated jrn") and str(env.world.node("jrn").id) in line for line in lines), lines


def test_a_slice_of_a_multislice_request_is_never_deleted_or_recreated_alone(
        env: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deleting a multislice request with force takes every slice, and creating it again as one
    node's request would shrink the job: `init` on a slice captures the whole request (one job
    over every slice), and a lifecycle for one node, or for another number of slices, refuses it."""
    from tpuwatch.cloud.tpu.adapter import TpuAdapter
    from tpuwatch.errors import JobFailed
    from tpuwatch.sim.records import NodeSpec

    env.world.queue_resource("msq", NodeSpec(accelerator_type="v4-8", spot=True), node_count=2,
                             node_prefix="msn", zone=ZONE_A)
    env.world.wait_for(lambda w: w.get_queued_resource(env.project, ZONE_A, "msq").state == "ACTIVE", timeout=30)
    out = tmp_path / "msn.toml"
    code, said, err = run_cli(["init", "msn-1", "-o", str(out)], capsys)
    assert code == 0, err
    cfg = load_config(out)
    assert (cfg.tpu_name, cfg.tpu["names"], cfg.tpu["queued_resource"]) == ("msq", ("msn-0", "msn-1"), "msq")
    assert cfg.job_name == "msq" and cfg.tpu["spec"]["queued_resource_tier"] == "spot"
    assert "one job over the 2 slices of multislice request msq" in said

    api = TpuAdapter(env.project, ZONE_A)
    assert api.queued_status("msq").node_count == 2
    life = Lifecycle(api, "msq")
    with pytest.raises(JobFailed, match="multislice request \\(2 nodes\\)"):
        life.delete(api.require_node("msn-0"))
    with pytest.raises(JobFailed, match="--node-count"):
        life.create("msn-0", {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}, ZONE_A)
    with pytest.raises(JobFailed, match="tpu.names lists 3"):
        Lifecycle(api, "msq", ("msn-0", "msn-1", "msn-2")).delete(None)
    # A config written by hand for the slice: `recreate` refuses before showing a plan.
    env.create_node("msx", "v4-8", labels={OWNER_LABEL: "msx"})
    text = write_config(env, tmp_path, "msx", capsys).read_text()
    hand = tmp_path / "hand.toml"
    hand.write_text(re.sub(r'(?m)^queued_resource = .*$', 'queued_resource = "msq"',
                           re.sub(r'(?m)^name = "msx"$', 'name = "msn-0"', text)))
    code, out, err = run_cli(["recreate", "msn-0", "-c", str(hand), "--dry-run", "--adopt"], capsys)
    assert code == 1 and "multislice request (2 nodes)" in err and out == ""
    assert env.world.get_queued_resource(env.project, ZONE_A, "msq").state == "ACTIVE"
    assert {env.world.node(n, zone=ZONE_A).state for n in ("msn-0", "msn-1")} == {"READY"}

    env.world.preempt("msn-1", zone=ZONE_A)
    env.world.wait_for(lambda w: w.get_queued_resource(env.project, ZONE_A, "msq").state == "SUSPENDED", timeout=30)
    with pytest.raises(JobFailed, match="multislice"):
        life.clear_ended()
    assert env.world.get_queued_resource(env.project, ZONE_A, "msq").state == "SUSPENDED"  # left to a person
