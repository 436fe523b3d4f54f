"""`tpuwatch sim serve / inject / stats` as a user runs them, and scenario files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from tpuwatch.cloud.clients import tpu_client
from tpuwatch.errors import UsageError
from tpuwatch.sim import scenario
from tpuwatch.sim.simulator import Simulator

TPUWATCH = [sys.executable, "-m", "tpuwatch.cli"]



def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ssh(env: dict[str, str], ip: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-i",
            env["TPUWATCH_SIM_SSH_KEY"],
            "-p",
            env["TPUWATCH_SIM_SSH_PORT"],
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            f"{env['TPUWATCH_SIM_SSH_USER']}@{ip}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


SCENARIO = """
[sim]
speed = 600
seed = 7

[[node]]
name = "pod"
accelerator_type = "v4-32"
labels = { team = "ml" }
startup_script = "boot.sh"

[[step]]
at = "1s"
fault = "symptom"
node = "pod"
type = "MESH_BUILD_FAIL"
"""


@pytest.mark.slow
def test_serve_prints_env_plays_scenario_and_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "boot.sh").write_text('echo booted > "$HOME/booted"\n')
    (tmp_path / "s.toml").write_text(SCENARIO)
    proc = subprocess.Popen(
        [
            *TPUWATCH,
            "sim",
            "serve",
            "--port",
            "0",
            "--root",
            str(tmp_path / "root"),
            "--scenario",
            str(tmp_path / "s.toml"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("TPUWATCH_EMULATOR_HOST=127.0.0.1:"), first
        env = dict([first.split("=", 1)])
        while "TPUWATCH_SIM_BUCKET" not in env:
            k, _, v = proc.stdout.readline().strip().partition("=")
            env[k] = v
        assert {"TPUWATCH_SIM_SSH_KEY", "TPUWATCH_SIM_SSH_USER", "TPUWATCH_SIM_SSH_PORT"} <= set(
            env
        )

        os.environ["TPUWATCH_EMULATOR_HOST"] = env["TPUWATCH_EMULATOR_HOST"]
        name = "projects/sim-project/locations/us-central2-b/nodes/pod"
        deadline = time.monotonic() + 20
        node = tpu_client().get_node(name=name)
        while not node.symptoms and time.monotonic() < deadline:  # the step at "1s" = 2 ms real
            node = tpu_client().get_node(name=name)
        assert [s.symptom_type.name for s in node.symptoms] == ["MESH_BUILD_FAIL"]
        assert dict(node.labels) == {"team": "ml"}
        ips = [e.ip_address for e in node.network_endpoints]
        assert len(ips) == 4

        pids = []
        for ip in ips:
            res = ssh(
                env,
                ip,
                "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!; cat ~/booted 2>/dev/null || true",
            )
            assert res.returncode == 0, res.stderr
            pids.append(int(res.stdout.split()[0]))
        assert all(alive(p) for p in pids)

        stats = subprocess.run(
            [*TPUWATCH, "sim", "stats", "--host", env["TPUWATCH_EMULATOR_HOST"]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(stats.stdout)["calls"]["google.cloud.tpu.v2.Tpu/GetNode"] >= 1
    finally:
        os.environ.pop("TPUWATCH_EMULATOR_HOST", None)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "sim: stopped" in err
    assert not alive(proc.pid)
    assert [p for p in pids if alive(p)] == []
    with pytest.raises(OSError):
        socket.create_connection((ips[0], int(env["TPUWATCH_SIM_SSH_PORT"])), timeout=5).close()


def test_serve_on_a_busy_port_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [
                *TPUWATCH,
                "sim",
                "serve",
                "--no-workers",
                "--port",
                str(port),
                "--root",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0], res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[sim]\nsped = 600\n", "'sped'"),
        ('[[node]]\nname = "a"\naccelerator_type = "v9-8"\n', "accelerator_type"),
        ('[[step]]\nat = "5 minutes"\nfault = "preempt"\nnode = "a"\n', "step[0].at"),
        (
            '[[step]]\nat = "5m"\nfault = "maintenance"\nnode = "a"\nheal_afterr = "1m"\n',
            "heal_afterr",
        ),
        ('[[step]]\nat = "5m"\nfault = "meltdown"\n', "meltdown"),
        ('[[node]]\nname = "a"\nstartup_script = "missing.sh"\n', "startup_script"),
    ],
)
def test_scenario_errors_exit_2_naming_the_key(
    text: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = run_cli(
        ["sim", "serve", "--no-workers", "--port", "0", "--scenario", str(path)], capsys
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert out == ""


def test_missing_ssh_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [
            "sim",
            "serve",
            "--port",
            "0",
            "--root",
            str(tmp_path),
            "--ssh-key",
            str(tmp_path / "nope"),
        ],
        capsys,
    )
    assert code == 2 and "--ssh-key" in err and len(err.strip().splitlines()) == 1


def test_scenario_steps_play_in_process(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[sim]\nseed = 3\nzone = "us-east5-a"\n[sim.delays]\ncreate = "30s"\n'
        '[[node]]\nname = "pod"\naccelerator_type = "v5p-64"\nspot = true\n'
        '[[step]]\nat = "2m"\nfault = "preempt"\nnode = "pod"\n'
        '[[step]]\nat = "1m"\nfault = "stockout"\nduration = "1h"\n'
    )
    sc = scenario.load(path)
    assert [s.fault for s in sc.steps] == ["stockout", "preempt"] and sc.delays == {"create": 30.0}
    with Simulator(root=tmp_path / "r", workers=False, scenario=sc) as sim:
        assert sim.zone == "us-east5-a" and sim.world.node("pod").n_workers == 8
        sim.world.wait_node("pod", "PREEMPTED")
        assert sim.world._in_stockout("us-east5-a")
        assert sim.step_errors == []


def test_example_scenario_loads() -> None:
    sc = scenario.load(Path(scenario.__file__).parent / "example-scenario.toml")
    assert [n["name"] for n in sc.nodes] == ["llm-pod", "spot-pod"]
    assert [(s.at, s.fault) for s in sc.steps] == [
        (600.0, "maintenance"),
        (3600.0, "preempt"),
        (3600.0, "stockout"),
        (9000.0, "maintenance"),
    ]


def test_inject_and_stats_against_a_running_simulator(
    sim_api: Simulator, capsys: pytest.CaptureFixture[str]
) -> None:
    host = ["--host", sim_api.address]
    code, out, _ = run_cli(
        ["sim", "inject", *host, "create-node", "pod", "--type", "v4-32", "--labels", "a=b"], capsys
    )
    assert (
        code == 0 and json.loads(out)["ips"] and sim_api.world.node("pod").spec.labels == {"a": "b"}
    )
    code, out, _ = run_cli(
        ["sim", "inject", *host, "maintenance", "pod", "--stuck", "REPAIRING"], capsys
    )
    assert code == 0 and out.strip() == "injected maintenance into pod"
    sim_api.world.wait_node("pod", "REPAIRING")
    code, _, err = run_cli(["sim", "inject", *host, "maintenance", "nope"], capsys)
    assert code == 2 and "nope" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["sim", "inject", *host, "api-errors", "--rate", "1.5"], capsys)
    assert code == 2 and "rate" in err
    code, _, err = run_cli(
        ["sim", "inject", *host, "maintenance", "pod", "--heal-after", "soon"], capsys
    )
    assert code == 2 and "heal_after" in err
    code, out, _ = run_cli(
        [
            "sim",
            "inject",
            *host,
            "api-errors",
            "--rate",
            "1",
            "--codes",
            "INTERNAL",
            "--methods",
            "GetNode",
        ],
        capsys,
    )
    assert code == 0
    tpu = tpu_client()
    with pytest.raises(Exception, match="Internal"):
        tpu.get_node(name="projects/sim-project/locations/us-central2-b/nodes/pod")
    code, out, _ = run_cli(["sim", "nodes", *host], capsys)
    assert code == 0 and "nodes/pod  v4-32  REPAIRING/UNHEALTHY_MAINTENANCE" in out
    code, out, _ = run_cli(["sim", "stats", *host], capsys)
    stats: dict[str, Any] = json.loads(out)
    assert stats["calls"] == {"google.cloud.tpu.v2.Tpu/GetNode": 1}
    assert stats["injected"] == {"google.cloud.tpu.v2.Tpu/GetNode": 1}


def test_inject_without_a_simulator_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TPUWATCH_EMULATOR_HOST", raising=False)
    code, _, err = run_cli(["sim", "inject", "heal", "pod"], capsys)
    assert code == 2 and "TPUWATCH_EMULATOR_HOST" in err
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli(["sim", "inject", "--host", f"127.0.0.1:{port}", "heal", "pod"], capsys)
    assert code == 3 and "sim serve" in err


def test_fault_options_are_checked_like_scenario_keys() -> None:
    from tpuwatch.sim import faults

    with pytest.raises(UsageError, match=r"did you mean 'heal_after'"):
        faults.normalize("maintenance", {"node": "a", "heal_afer": "1m"})
    assert (
        faults.normalize("maintenance", {"node": "a", "heal_after": "never"})["heal_after"] is None
    )
    assert faults.normalize("maintenance", {"node": "a", "stuck": "unknown"}) == {
        "node": "a",
        "stuck": "UNKNOWN",
        "heal_after": None,
        "reason": "MAINTENANCE",
        "notice": 0.0,  # no notice on the metadata server before it (the default)
    }
