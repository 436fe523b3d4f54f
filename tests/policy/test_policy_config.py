"""PolicyConfig is built from a validated tpuwatch.toml: seconds, budgets, zones in create order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch.config import load_config
from tpuwatch.errors import ConfigError
from tpuwatch.policy import PolicyConfig


def test_from_config(tmp_path: Path) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(
        '[tpu]\nname = "llm-pod"\nzone = "us-central2-b"\nfallback_zones = ["us-east1-d", "us-central2-b"]\n'
        '[job]\nname = "run1"\ncommand = "python3 train.py --resume={checkpoint}"\nworkers = [2, 1]\n'
        '[recovery]\nrepair_timeout = "10m"\nmax_restarts = 7\nmin_uptime = "90s"\n'
        'fail_fast_exit_codes = [3]\nbackoff_base = "5s"\nbackoff_max = "1m"\npoll_interval = "15s"\n'
    )
    cfg = PolicyConfig.from_config(load_config(path))
    assert (cfg.job, cfg.tpu_name) == ("run1", "llm-pod")
    assert cfg.zones == ("us-central2-b", "us-east1-d")  # the zone first, no repeats
    assert (cfg.repair_timeout, cfg.min_uptime, cfg.backoff_base, cfg.backoff_max) == (600.0, 90.0, 5.0, 60.0)
    assert (cfg.max_restarts, cfg.max_recreates, cfg.no_progress_limit) == (7, 3, 3)
    assert cfg.fail_fast_exit_codes == frozenset({3})
    assert cfg.primary_worker == 1  # the lowest worker the job runs on
    assert cfg.unreachable_grace == 15.0


def test_zone_resolved_outside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n')
    cfg = PolicyConfig.from_config(load_config(path), zone="europe-west4-a")
    assert cfg.zones == ("europe-west4-a",) and cfg.job == "pod" and cfg.primary_worker == 0


def test_no_zone_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n')
    with pytest.raises(ConfigError, match="tpu.zone") as exc:
        PolicyConfig.from_config(load_config(path))
    assert exc.value.exit_code == 2
