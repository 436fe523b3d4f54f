"""`[tpu.spec]` is checked when the config is read (tpuwatch.config uses tpuwatch.spec.validate_spec)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch.config import load_config
from tpuwatch.errors import ConfigError

HEAD = """\
[tpu]
name = "pod"
[job]
command = "python3 train.py"
"""
SPEC = """\
[tpu.spec]
accelerator_type = "v4-8"
runtime_version = "tpu-ubuntu2204-base"
"""


def load(tmp_path: Path, text: str) -> dict[str, object]:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(text)
    spec: dict[str, object] = load_config(path).tpu["spec"]
    return spec


def test_no_spec_is_valid_and_empty(tmp_path: Path) -> None:
    assert load(tmp_path, HEAD) == {}
    assert load(tmp_path, HEAD + "[tpu.spec]\n") == {}


def test_a_valid_spec_loads_as_written(tmp_path: Path) -> None:
    spec = load(tmp_path, HEAD + SPEC + 'spot = true\n[tpu.spec.labels]\nteam = "x"\n')
    assert spec == {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base", "spot": True,
                    "labels": {"team": "x"}}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("acelerator_type = \"v4-8\"\n", "tpu.spec.acelerator_type: unknown key (did you mean 'accelerator_type'?)"),
        ("spot = \"yes\"\n", "tpu.spec.spot: expected true or false, got 'yes'"),
        ("spot = true\npreemptible = true\n", "tpu.spec.spot: at most one of spot, preemptible and reserved"),
        ("[tpu.spec.labels]\nTeam = \"x\"\n", "tpu.spec.labels.Team: not a valid label key"),
        ("[tpu.spec.metadata]\n\"bad key\" = \"x\"\n", "tpu.spec.metadata.bad key: metadata keys are letters"),
    ],
)
def test_a_bad_spec_is_refused_when_read_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, HEAD + SPEC + extra)
    assert message in err.value.message and err.value.exit_code == 2


def test_a_spec_without_runtime_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tpu\.spec\.runtime_version: missing"):
        load(tmp_path, HEAD + '[tpu.spec]\naccelerator_type = "v4-8"\n')


def test_importing_config_does_not_import_the_spec_module() -> None:
    code = "import sys, tpuwatch.config; print('tpuwatch.spec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_removed_key_says_why_it_went_and_what_to_do(tmp_path: Path) -> None:

    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n[recovery]\nretryable_exit_codes = [139]\n')
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "recovery.retryable_exit_codes: no longer a setting" in err.value.message
    assert "delete the line" in err.value.message


@pytest.mark.parametrize(("value", "loaded"), [('"SIGTERM"', "SIGTERM"), ('"SIGUSR1"', "SIGUSR1"), ('""', "")])
def test_maintenance_notify_signal_takes_a_signal_name_or_nothing(tmp_path: Path, value: str, loaded: str) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(HEAD + f"[maintenance]\nnotify_signal = {value}\n")
    assert load_config(path).get("maintenance.notify_signal") == loaded
    path.write_text(HEAD)
    assert load_config(path).get("maintenance.notify_signal") == "SIGTERM"  # the default


@pytest.mark.parametrize(("value", "message"), [
    ('"TERM"', "maintenance.notify_signal: 'TERM' is not a signal a job can catch"),
    ('"SIGTREM"', "(did you mean 'SIGTERM'?)"),
    ('"SIGKILL"', "maintenance.notify_signal: 'SIGKILL' is not a signal a job can catch"),
    ("15", "maintenance.notify_signal: expected a string"),
])
def test_a_bad_notify_signal_is_refused_naming_the_key(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(HEAD + f"[maintenance]\nnotify_signal = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in err.value.message and err.value.exit_code == 2
