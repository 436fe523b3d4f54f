"""Project and zone resolution: flag, config, env, then the gcloud configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch.cloud.location import resolve
from tpuwatch.errors import EXIT_USAGE, UsageError


def gcloud_dir(tmp_path: Path, configs: dict[str, str], active: str | None) -> Path:
    root = tmp_path / "gcloud"
    (root / "configurations").mkdir(parents=True)
    for name, text in configs.items():
        (root / "configurations" / f"config_{name}").write_text(text)
    if active is not None:
        (root / "active_config").write_text(active + "\n")
    return root


def test_flag_beats_config_beats_env_beats_gcloud(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, {"default": "[core]\nproject = gc-proj\n[compute]\nzone = europe-west4-a\n"}, None)
    env = {"CLOUDSDK_CONFIG": str(root), "GOOGLE_CLOUD_PROJECT": "env-proj", "CLOUDSDK_COMPUTE_ZONE": "us-east1-d"}
    assert resolve("flag-proj", "us-central2-b", config_project="cfg-proj", env=env).project == "flag-proj"
    loc = resolve(None, None, config_project="cfg-proj", config_zone="us-east5-a", env=env)
    assert (loc.project, loc.zone, loc.project_from, loc.zone_from) == ("cfg-proj", "us-east5-a", "tpu.project", "tpu.zone")
    loc = resolve(None, None, env=env)
    assert (loc.project, loc.zone) == ("env-proj", "us-east1-d")
    # CLOUDSDK_CORE_PROJECT comes before GOOGLE_CLOUD_PROJECT
    assert resolve(None, None, env={**env, "CLOUDSDK_CORE_PROJECT": "core-proj"}).project == "core-proj"
    loc = resolve(None, None, env={"CLOUDSDK_CONFIG": str(root)})
    assert (loc.project, loc.zone) == ("gc-proj", "europe-west4-a")
    assert "gcloud configuration 'default'" in loc.project_from


def test_active_configuration_is_read_from_its_file(tmp_path: Path) -> None:
    root = gcloud_dir(
        tmp_path,
        {"default": "[core]\nproject = other-proj\n", "work": "[core]\naccount = a@b.c\nproject = work-proj\n[compute]\nzone = us-central2-b\n"},
        "work",
    )
    loc = resolve(None, None, env={"CLOUDSDK_CONFIG": str(root)})
    assert (loc.project, loc.zone) == ("work-proj", "us-central2-b")
    # CLOUDSDK_ACTIVE_CONFIG_NAME overrides the active_config file, as in gcloud
    loc = resolve(None, None, need_zone=False, env={"CLOUDSDK_CONFIG": str(root), "CLOUDSDK_ACTIVE_CONFIG_NAME": "default"})
    assert (loc.project, loc.zone) == ("other-proj", None)


def test_no_project_says_how_to_set_one(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        resolve(None, "us-central2-b", env={"CLOUDSDK_CONFIG": str(tmp_path / "nothing")})
    assert err.value.exit_code == EXIT_USAGE
    assert "--project" in err.value.message and "gcloud config set project" in err.value.message


def test_missing_zone_only_matters_when_needed(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "nothing"), "GOOGLE_CLOUD_PROJECT": "my-proj"}
    assert resolve(None, None, need_zone=False, env=env).zone is None
    with pytest.raises(UsageError, match="--zone.*compute/zone"):
        resolve(None, None, env=env)


def test_bad_values_name_their_source(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "nothing")}
    with pytest.raises(UsageError, match="--zone: 'central' is not a zone"):
        resolve("my-proj", "central", env=env)
    with pytest.raises(UsageError, match="CLOUDSDK_CORE_PROJECT: 'Bad Project'"):
        resolve(None, "us-central2-b", env={**env, "CLOUDSDK_CORE_PROJECT": "Bad Project"})


def test_broken_gcloud_files_are_ignored(tmp_path: Path) -> None:
    root = gcloud_dir(tmp_path, {"default": "this is [not ini\n"}, "../../etc")
    with pytest.raises(UsageError, match="no Google Cloud project"):
        resolve(None, "us-central2-b", env={"CLOUDSDK_CONFIG": str(root)})
    (root / "active_config").write_text("default")
    with pytest.raises(UsageError, match="no Google Cloud project"):
        resolve(None, "us-central2-b", env={"CLOUDSDK_CONFIG": str(root)})
