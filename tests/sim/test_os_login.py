"""The os-login fault, from a scenario file and from `tpuwatch sim inject`, and what it changes.

With it the workers accept the client key only for the OS Login name (plain ssh under the local
name is refused), the Compute project says enable-oslogin=TRUE, and the OS Login API answers with
a profile whose primary POSIX account is that name: what gcloud reads before it swaps the name in.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import run_cli

from tpuwatch.sim import scenario
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator


def get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - the local simulator
        data: dict[str, object] = json.loads(r.read())
        return data


def test_os_login_from_a_scenario_turns_on_what_gcloud_reads(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[[step]]\nat = "1m"\nfault = "os-login"\nuser = "bob_example_com"\n')
    sc = scenario.load(path)
    with Simulator(root=tmp_path / "r", workers=False, scenario=sc) as sim, RestFace(sim.world) as rest:
        sim.world.wait_for(lambda w: w.os_login_user is not None, 10, "the os-login step")
        assert sim.world.os_login_user == "bob_example_com"
        project = get(f"{rest.url}compute/v1/projects/{sim.project}")
        items = {i["key"]: i["value"] for i in project["commonInstanceMetadata"]["items"]}  # type: ignore[index]
        assert items["enable-oslogin"] == "TRUE"
        profile = get(f"{rest.url}oslogin/v1/users/me@example.com/loginProfile?projectId={sim.project}")
        accounts = profile["posixAccounts"]
        assert [(a["username"], a["primary"]) for a in accounts] == [("bob_example_com", True)]  # type: ignore[union-attr,index]
        assert rest.calls["oslogin.v1.Users/GetLoginProfile"] == 1


def test_inject_os_login_and_a_bad_name(sim_api: Simulator, capsys: pytest.CaptureFixture[str]) -> None:
    host = ["--host", sim_api.address]
    code, out, _ = run_cli(["sim", "inject", *host, "os-login", "carol_example_com"], capsys)
    assert code == 0, out
    assert sim_api.world.os_login_user == "carol_example_com"
    code, _, err = run_cli(["sim", "inject", *host, "os-login", "Carol Smith"], capsys)
    assert code == 2 and "not a POSIX user name" in err and len(err.strip().splitlines()) == 1
