"""A watcher's spare pool files (fleet/pools.py): read before the jobs that name them; a job that
named a pool not there yet starts again once its file appears."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_compute_fleet import Quiet

from tpuwatch.fleet.runner import Fleet, Options
from tpuwatch.ports import Flags
from tpuwatch.sim.simulator import Simulator
from tpuwatch.ui.jobs import JobState


def state_of(fleet: Fleet, name: str) -> JobState:
    return next(s for s in fleet.states() if s.path.stem == name)


def look_until(fleet: Fleet, name: str, pred: object, what: str) -> JobState:
    end = time.monotonic() + 60  # a bound for a failure, not what the test waits for
    while time.monotonic() < end:
        fleet.look()
        if any(s.path.stem == name for s in fleet.states()) and pred(state_of(fleet, name)):  # type: ignore[operator]
            return state_of(fleet, name)
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {[(s.name, s.status, s.error) for s in fleet.states()]}")


def test_a_job_naming_a_pool_not_there_yet_starts_once_the_pool_file_appears(
        sim_api: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    key = tmp_path / "id_test"
    key.write_text("not used\n")
    key.chmod(0o600)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.toml").write_text(f'[tpu]\nname = "a"\nproject = "{sim_api.project}"\nzone = "{sim_api.zone}"\n'
                                 'spare_pool = "v4"\n[job]\ncommand = "true"\n[recovery]\npoll_interval = "0.5s"\n'
                                 f'[ssh]\nidentity_file = "{key}"\n')
    fleet = Fleet([], jobs, Options(None, None, Flags()), Quiet())
    try:
        first = look_until(fleet, "a", lambda s: s.status == "config_error", "job a's config error")
        assert "tpu.spare_pool: no spare pool 'v4'" in first.error
        (jobs / "pool-v4.toml").write_text(f'[pool]\nname = "v4"\nzone = "{sim_api.zone}"\nspares = ["sp-0"]\n')
        look_until(fleet, "a", lambda s: s.status != "config_error", "job a started again with pool v4")
        assert [s.path.name for s in fleet.states()] == ["a.toml"]  # the pool file is no job
    finally:
        fleet.stop_all()
