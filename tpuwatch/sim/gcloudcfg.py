"""A private gcloud configuration directory (`CLOUDSDK_CONFIG`) that points gcloud at the simulator.

`write_config()` writes the directory's `active_config` and `configurations/config_default`:
`api_endpoint_overrides/tpu`, `/compute` and `/oslogin` at the simulator's REST face, `auth/disable_credentials`
(no account needed), `core/project`, `compute/zone`, and the settings that keep gcloud from
probing the GCE metadata server, checking for updates or prompting. Writing the INI files
directly, rather than running `gcloud config set` five times, costs nothing and needs no gcloud.
`install_ssh_key()` puts the simulated workers' client key where gcloud looks for its own,
`<HOME>/.ssh/google_compute_engine(.pub)`, for a HOME it is given (never silently replacing a
different key already there).

This module knows nothing of the simulator's internals: a URL, names and a key file in, files out.
"""

from __future__ import annotations

import configparser
import io
import os
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.errors import UsageError

CONFIG_NAME = "default"
KEY_NAME = "google_compute_engine"
ACCOUNT = "tpuwatch-sim@example.com"


@dataclass(frozen=True)
class GcloudConfig:
    """What was written: the CLOUDSDK_CONFIG directory and, when given, the HOME holding the key."""

    directory: Path
    home: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        """Environment for a gcloud process that should talk to the simulator."""
        env = {"CLOUDSDK_CONFIG": str(self.directory)}
        if self.home is not None:
            env["HOME"] = str(self.home)
        return env


def render_config(*, url: str, project: str, zone: str, compute_url: str | None = None) -> str:
    """The text of `configurations/config_default`."""
    base = url if url.endswith("/") else url + "/"
    cfg = configparser.ConfigParser(interpolation=None)
    cfg["core"] = {
        "project": project,
        "disable_usage_reporting": "True",
        "check_gce_metadata": "False",  # no 169.254.169.254 probe (seconds lost off GCE)
        "disable_prompts": "True",
        # the Google account OS Login knows (credentials stay disabled)
        "account": ACCOUNT,
    }
    cfg["compute"] = {"zone": zone, "region": zone.rsplit("-", 1)[0]}
    cfg["auth"] = {"disable_credentials": "True"}
    cfg["api_endpoint_overrides"] = {
        "tpu": base,
        "compute": compute_url or f"{base}compute/v1/",
        "oslogin": f"{base}oslogin/",
    }
    cfg["component_manager"] = {"disable_update_check": "True"}
    cfg["survey"] = {"disable_prompts": "True"}
    out = io.StringIO()
    cfg.write(out)
    return out.getvalue()


def write_config(directory: str | Path, *, url: str, project: str, zone: str,
                 compute_url: str | None = None, home: str | Path | None = None,
                 ssh_key: str | Path | None = None) -> GcloudConfig:
    """Write the gcloud configuration directory (and install `ssh_key` under `home`).

    Raises UsageError (exit 2) naming the directory when it cannot be written.
    """
    d = Path(directory).expanduser()
    try:
        (d / "configurations").mkdir(parents=True, exist_ok=True)
        _write(d / "configurations" / f"config_{CONFIG_NAME}",
               render_config(url=url, project=project, zone=zone, compute_url=compute_url))
        _write(d / "active_config", CONFIG_NAME)
    except OSError as exc:
        raise UsageError(
            f"gcloud configuration directory {str(d)!r} cannot be written ({exc.strerror or exc}); "
            "choose a writable directory"
        )
    home_path: Path | None = None
    if home is not None:
        home_path = Path(home).expanduser()
        if ssh_key is not None:
            install_ssh_key(home_path, ssh_key)
    return GcloudConfig(d.resolve(), home_path.resolve() if home_path is not None else None)


def install_ssh_key(home: str | Path, key: str | Path) -> Path:
    """Copy private key `key` (and `key.pub`) to `<home>/.ssh/google_compute_engine(.pub)`.

    An identical key already there is kept; a different one is an error, never overwritten.
    """
    h = Path(home).expanduser()
    src = Path(key).expanduser()
    try:
        private = src.read_bytes()
        public = Path(str(src) + ".pub").read_bytes()
    except OSError as exc:
        raise UsageError(f"ssh key {str(src)!r} (and its .pub) cannot be read ({exc.strerror or exc})")
    ssh_dir = h / ".ssh"
    dest = ssh_dir / KEY_NAME
    try:
        ssh_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        if dest.exists() and dest.read_bytes() != private:
            raise UsageError(
                f"{str(dest)!r} already holds a different key; give an empty HOME for the simulator "
                "(gcloud finds the key under $HOME/.ssh)"
            )
        _write(dest, private, mode=0o600)
        _write(Path(str(dest) + ".pub"), public, mode=0o644)
    except OSError as exc:
        raise UsageError(f"HOME {str(h)!r}: cannot write {str(dest)!r} ({exc.strerror or exc}); "
                         "choose a writable directory")
    return dest


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write atomically (a reader never sees half a file) with `mode`."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
