"""The gcloud configuration directory written for the simulator (no gcloud run here)."""

from __future__ import annotations

import configparser
import stat
from pathlib import Path

import pytest

from tpuwatch.errors import UsageError
from tpuwatch.sim import gcloudcfg


def _key(tmp_path: Path, name: str, body: str) -> Path:
    key = tmp_path / name
    key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n-----END OPENSSH PRIVATE KEY-----\n")
    Path(str(key) + ".pub").write_text(f"ssh-ed25519 AAAA{body} sim\n")
    return key


def test_config_points_gcloud_at_the_rest_face(tmp_path: Path) -> None:
    cfg = gcloudcfg.write_config(tmp_path / "gc", url="http://127.0.0.1:4242/", project="p1", zone="us-central2-b")
    assert cfg.directory == (tmp_path / "gc").resolve() and cfg.home is None
    assert cfg.env == {"CLOUDSDK_CONFIG": str(cfg.directory)}
    assert (cfg.directory / "active_config").read_text() == "default"
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(cfg.directory / "configurations" / "config_default")
    assert ini["api_endpoint_overrides"]["tpu"] == "http://127.0.0.1:4242/"
    assert ini["api_endpoint_overrides"]["compute"] == "http://127.0.0.1:4242/compute/v1/"
    assert ini["auth"]["disable_credentials"] == "True"
    assert (ini["core"]["project"], ini["compute"]["zone"]) == ("p1", "us-central2-b")
    assert ini["core"]["check_gce_metadata"] == "False"  # no metadata-server probe off GCE
    # rewriting (a restarted simulator on a new port) replaces the old endpoint
    gcloudcfg.write_config(tmp_path / "gc", url="http://127.0.0.1:5353", project="p1", zone="us-central2-b")
    ini.read(cfg.directory / "configurations" / "config_default")
    assert ini["api_endpoint_overrides"]["tpu"] == "http://127.0.0.1:5353/"


def test_an_unwritable_directory_is_a_one_line_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError) as info:
        gcloudcfg.write_config(blocker / "gc", url="http://127.0.0.1:1/", project="p", zone="us-central2-b")
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message and str(blocker / "gc") in info.value.message


def test_the_key_is_installed_for_the_given_home_only_once(tmp_path: Path) -> None:
    key = _key(tmp_path, "sim_key", "one")
    home = tmp_path / "home"
    cfg = gcloudcfg.write_config(tmp_path / "gc", url="http://127.0.0.1:1/", project="p", zone="us-central2-b",
                                 home=home, ssh_key=key)
    assert cfg.env["HOME"] == str(home.resolve())
    dest = home / ".ssh" / "google_compute_engine"
    assert dest.read_bytes() == key.read_bytes()
    assert Path(str(dest) + ".pub").read_text() == "ssh-ed25519 AAAAone sim\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600  # ssh refuses a key others can read
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    gcloudcfg.install_ssh_key(home, key)  # the same key again: fine
    other = _key(tmp_path, "other_key", "two")
    with pytest.raises(UsageError, match="already holds a different key") as info:
        gcloudcfg.install_ssh_key(home, other)
    assert info.value.exit_code == 2
    assert dest.read_bytes() == key.read_bytes()  # a user's key is never overwritten


def test_a_missing_key_or_unwritable_home_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot be read"):
        gcloudcfg.install_ssh_key(tmp_path / "home", tmp_path / "nope")
    key = _key(tmp_path, "k", "three")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write") as info:
        gcloudcfg.install_ssh_key(blocker, key)
    assert "\n" not in info.value.message
