"""`tpuwatch status` against the in-process simulator, through the real Google clients."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli_env, run
from google.cloud import tpu_v2alpha1

from tpuwatch.sim.simulator import Simulator

STATES = list(tpu_v2alpha1.Node.State.__members__)
HEALTHS = list(tpu_v2alpha1.Node.Health.__members__)


@pytest.fixture
def tpu_sim(tmp_path: Path) -> Iterator[Simulator]:
    with Simulator(root=tmp_path / "sim", speed=600, seed=7, workers=False,
                   zones=["us-central2-b", "europe-west4-a"]) as sim:
        yield sim




def status_json(args: list[str], env: Mapping[str, str | None]) -> dict[str, Any]:
    code, out, err = run(["status", *args, "--json"], env)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def force_state(sim: Simulator, name: str, state: str, health: str) -> None:
    """Put a node in any state: no fault reaches them all."""
    sim.world.set_state(name, state, health)
    assert sim.world.node(name).state == state


def test_every_state_and_health_over_the_api(tpu_sim: Simulator, tmp_path: Path) -> None:
    names = []
    for i, state in enumerate(STATES):
        name = f"n{i:02d}-{state.lower().replace('_', '-')}"
        tpu_sim.create_node(name)
        force_state(tpu_sim, name, state, HEALTHS[i % len(HEALTHS)])
        names.append(name)
    env = cli_env(tpu_sim, tmp_path)
    tpu_sim.world.reset_calls()
    data = status_json(["--all"], env)
    got = {n["name"]: (n["state"], n["health"]) for n in data["nodes"]}
    assert got == {name: (s, HEALTHS[i % len(HEALTHS)]) for i, (name, s) in enumerate(zip(names, STATES, strict=True))}
    code, out, err = run(["status", "--all"], env)
    assert code == 0, err
    for name in names:
        assert f"{name} " in out
    panels = out.split("╭─ ")[1:]
    for i, panel in enumerate(panels):
        assert STATES[i] in panel and HEALTHS[i % len(HEALTHS)] in panel
    assert max(len(line) for line in out.splitlines()) <= 80
    assert tpu_sim.world.call_count("ListNodes") == 2 and tpu_sim.world.call_count("GetNode") == 0


def test_healed_maintenance_shows_in_status(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod", "v4-32")
    tpu_sim.create_node("pod2", "v4-8")  # "nodes/pod" is a prefix of "nodes/pod2": must not mix
    tpu_sim.world.maintenance("pod", heal_after=60, worker=1, reason="HOST_ERROR")
    tpu_sim.world.maintenance("pod2", heal_after=60, reason="OTHER")
    tpu_sim.world.wait_node("pod", "READY", health="HEALTHY")
    tpu_sim.world.wait_node("pod2", "READY", health="HEALTHY")
    terminate = next(e for e in tpu_sim.world.audit_entries() if e.node == "pod" and e.method.endswith("terminate"))
    env = cli_env(tpu_sim, tmp_path)

    data = status_json(["pod"], env)
    node = data["nodes"][0]
    assert node["kind"] == "node"  # a Cloud TPU API node, as its adapter says
    assert node["health_description"].startswith("The TPU had a maintenance event at ")
    secs, nanos = divmod(terminate.time_ns, 10**9)
    assert node["maintenance_time"].endswith(f"{nanos // 1000:06d}Z")
    assert [(e["kind"], e["worker"], e["reason"]) for e in node["events"]] == [
        ("terminate", "1", "HOST_ERROR"), ("restart", "1", ""),
    ]
    assert len(node["workers"]) == 4 and all(w["internal_ip"] for w in node["workers"])
    assert data["missing"] == [] and data["events_error"] is None

    code, out, _ = run(["status", "pod"], env)
    assert code == 0
    assert "maint." in out and "HOST_ERROR" in out and "OTHER" not in out
    assert out.index("terminate") < out.index("restart")


def strip_times(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    data.pop("time")
    return data


def test_unavailable_rate_does_not_change_output(tpu_sim: Simulator, tmp_path: Path) -> None:
    for i in range(6):
        tpu_sim.create_node(f"w{i}")
    tpu_sim.world.maintenance("w2", heal_after=60)
    tpu_sim.world.wait_node("w2", "READY", health="HEALTHY")
    tpu_sim.world.add_symptom("w3", "HBM_OUT_OF_MEMORY", worker=0)
    env = cli_env(tpu_sim, tmp_path)
    names = [f"w{i}" for i in range(6)]
    clean = status_json(names, env)
    clean_all = status_json(["--all"], env)
    tpu_sim.world.api_errors(0.3, ["UNAVAILABLE"])
    tpu_sim.world.reset_calls()
    for _ in range(3):
        assert strip_times(status_json(names, env)) == strip_times(clean)
        assert strip_times(status_json(["--all"], env)) == strip_times(clean_all)
    assert sum(tpu_sim.world.injected.values()) > 0  # errors did happen, and were absorbed


def test_permission_denied_exits_3_without_retrying(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod")
    tpu_sim.world.deny(methods=["GetNode"])
    tpu_sim.world.reset_calls()
    code, out, err = run(["status", "pod"], cli_env(tpu_sim, tmp_path))
    assert code == 3
    assert "tpu.nodes.get" in err and "get_node(" in err and "Traceback" not in err
    assert tpu_sim.world.call_count("GetNode") == 1


def test_audit_log_denied_still_shows_the_node(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod")
    tpu_sim.world.deny(methods=["ListLogEntries"])
    code, out, err = run(["status", "pod", "--json"], cli_env(tpu_sim, tmp_path))
    assert code == 0
    assert "logging.logEntries.list" in json.loads(out)["events_error"]
    code, out, err = run(["status", "pod"], cli_env(tpu_sim, tmp_path))
    assert code == 0 and "READY" in out and "warning: audit log not read" in err


def test_all_on_fifty_nodes_is_one_list_call(tpu_sim: Simulator, tmp_path: Path) -> None:
    for i in range(50):
        tpu_sim.create_node(f"node-{i:02d}")
    tpu_sim.world.reset_calls()
    data = status_json(["--all"], cli_env(tpu_sim, tmp_path))
    assert [n["name"] for n in data["nodes"]] == [f"node-{i:02d}" for i in range(50)]
    assert tpu_sim.world.call_count("ListNodes") == 1
    assert tpu_sim.world.call_count("GetNode") == 0
    assert tpu_sim.world.call_count("ListLogEntries") == 1


def test_one_get_per_named_node_and_one_log_query(tpu_sim: Simulator, tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        tpu_sim.create_node(name)
    tpu_sim.world.reset_calls()
    status_json(["a", "b", "c"], cli_env(tpu_sim, tmp_path))
    assert tpu_sim.world.call_count("v2alpha1.Tpu/GetNode") == 3
    assert tpu_sim.world.call_count("v2.Tpu/GetNode") == 0
    assert tpu_sim.world.call_count("ListLogEntries") == 1


def test_unknown_node_exits_1(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod")
    code, out, err = run(["status", "pod", "nope"], cli_env(tpu_sim, tmp_path))
    assert code == 1
    assert "no TPU named nope in sim-project/us-central2-b" in err
    assert "pod" in out  # the nodes that exist are still shown
    code, out, _ = run(["status", "pod", "nope", "--json"], cli_env(tpu_sim, tmp_path))
    assert code == 1 and json.loads(out)["missing"] == ["nope"]


def test_unknown_zone_exits_2(tpu_sim: Simulator, tmp_path: Path) -> None:
    code, _, err = run(["status", "--all", "--zone", "asia-east1-c"], cli_env(tpu_sim, tmp_path))
    assert code == 2 and "asia-east1-c" in err and "--zone" in err
    code, _, err = run(["status", "pod", "--zone", "asia-east1-c"], cli_env(tpu_sim, tmp_path))
    assert code == 2 and "asia-east1-c" in err


def test_other_zone_and_flags_override_env(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("eu", zone="europe-west4-a")
    data = status_json(["eu", "--zone", "europe-west4-a"], cli_env(tpu_sim, tmp_path))
    assert data["zone"] == "europe-west4-a" and data["nodes"][0]["zone"] == "europe-west4-a"
    code, _, err = run(["status", "eu"], cli_env(tpu_sim, tmp_path))
    assert code == 1 and "no TPU named eu in sim-project/us-central2-b" in err


def test_project_and_zone_from_the_gcloud_file(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod")
    gc = tmp_path / "gcloud"
    (gc / "configurations").mkdir(parents=True)
    (gc / "active_config").write_text("sim")
    (gc / "configurations" / "config_sim").write_text(
        f"[core]\nproject = {tpu_sim.project}\n[compute]\nzone = {tpu_sim.zone}\n")
    env = cli_env(tpu_sim, tmp_path, CLOUDSDK_CORE_PROJECT=None, CLOUDSDK_COMPUTE_ZONE=None,
                  CLOUDSDK_CONFIG=str(gc))
    assert status_json(["pod"], env)["nodes"][0]["name"] == "pod"


def test_no_project_exits_2_with_how_to_set_it(tpu_sim: Simulator, tmp_path: Path) -> None:
    env = cli_env(tpu_sim, tmp_path, CLOUDSDK_CORE_PROJECT=None)
    code, _, err = run(["status", "pod"], env)
    assert code == 2
    assert "--project" in err and "gcloud config set project" in err and "Traceback" not in err


def test_no_credentials_exits_3_with_login_hint(tmp_path: Path) -> None:
    env = {
        "TPUWATCH_EMULATOR_HOST": None,
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "missing.json"),
        "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"),
        "CLOUDSDK_CORE_PROJECT": "my-project", "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
    }
    code, _, err = run(["status", "pod"], env)
    assert code == 3 and "gcloud auth application-default login" in err


def test_usage_errors(tpu_sim: Simulator, tmp_path: Path) -> None:
    env = cli_env(tpu_sim, tmp_path)
    assert run(["status"], env)[0] == 2
    assert run(["status", "a", "--all"], env)[0] == 2
    code, _, err = run(["status", "Bad_Name"], env)
    assert code == 2 and "Bad_Name" in err


def test_upcoming_maintenance_with_countdown(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("pod")
    # 7 simulated days at speed 600 is 16m48s of real time from now
    tpu_sim.world.upcoming_maintenance("pod", starts_in=7 * 86400, window=3600, can_reschedule=False)
    env = cli_env(tpu_sim, tmp_path)
    um = status_json(["pod"], env)["nodes"][0]["upcoming_maintenance"]
    assert (um["type"], um["status"], um["can_reschedule"]) == ("SCHEDULED", "PENDING", False)
    start = datetime.fromisoformat(um["window_start"].replace("Z", "+00:00"))
    assert timedelta(minutes=16) < start - datetime.now(timezone.utc) <= timedelta(minutes=17)
    code, out, _ = run(["status", "pod"], env)
    assert code == 0 and "SCHEDULED PENDING" in out and "(in 16m" in out and "cannot be started early" in out


def test_config_file_gives_name_project_and_zone(tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("eu", zone="europe-west4-a")
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text(f'[tpu]\nname = "eu"\nproject = "{tpu_sim.project}"\nzone = "europe-west4-a"\n')
    env = cli_env(tpu_sim, tmp_path, CLOUDSDK_CORE_PROJECT=None)  # env zone is us-central2-b
    data = status_json(["-c", str(cfg)], env)
    assert [n["name"] for n in data["nodes"]] == ["eu"] and data["zone"] == "europe-west4-a"
    # a flag still wins over the file
    code, _, err = run(["status", "-c", str(cfg), "--zone", "us-central2-b"], env)
    assert code == 1 and "no TPU named eu in sim-project/us-central2-b" in err


def test_config_of_a_spare_pool_job_shows_the_pools_nodes_who_holds_each_and_those_idle(
        tpu_sim: Simulator, tmp_path: Path) -> None:
    tpu_sim.create_node("a", labels={"tpuwatch-job": "a"})
    tpu_sim.create_node("sp-0", labels={"tpuwatch-pool": "v4", "tpuwatch-job": "b"})  # claimed by job b
    tpu_sim.create_node("sp-1", labels={"tpuwatch-pool": "v4"})  # idle
    tpu_sim.create_node("sp-2", labels={"tpuwatch-pool": "v4", "tpuwatch-pool-bad": "c"})  # idle, failed on job c
    tpu_sim.create_node("other", labels={"tpuwatch-pool": "v5"})  # another pool's
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text(f'[tpu]\nname = "a"\nzone = "us-central2-b"\nproject = "{tpu_sim.project}"\nspare_pool = "v4"\n')
    env = cli_env(tpu_sim, tmp_path)
    data = status_json(["-c", str(cfg)], env)
    assert [n["name"] for n in data["nodes"]] == ["a", "sp-0", "sp-1", "sp-2"]
    bad = "failed its launch-time checks on job c; the pool's keeper makes it again"
    assert data["spare_pool"] == {"name": "v4", "idle": 1, "nodes": [
        {"name": "sp-0", "held_by": "b", "unclaimable": None}, {"name": "sp-1", "held_by": None, "unclaimable": None},
        {"name": "sp-2", "held_by": None, "unclaimable": bad}]}
    code, out, err = run(["status", "-c", str(cfg)], env)
    assert code == 0, err
    assert (f"spare pool v4: 3 node(s), 1 idle and free to claim: sp-0 (held by job b), sp-1 (idle), "
            f"sp-2 (idle, {bad})") in " ".join(out.split()), out
    assert "v4: held by job b" in out and "v4: idle" in out
    assert status_json(["a"], env)["spare_pool"] is None  # no -c: no pool to name
