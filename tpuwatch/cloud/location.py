"""Which project and zone a command talks to (docs/commands.md: flags, then environment, then gcloud).

Order: the flag, the config file, the environment (CLOUDSDK_CORE_PROJECT, GOOGLE_CLOUD_PROJECT;
CLOUDSDK_COMPUTE_ZONE), then the active gcloud configuration, read directly from its INI file
(CLOUDSDK_CONFIG or ~/.config/gcloud; `active_config` names it, CLOUDSDK_ACTIVE_CONFIG_NAME
overrides; `configurations/config_<name>` holds [core] project and [compute] zone). gcloud is
never spawned. A missing or malformed value raises UsageError (exit 2) that says how to set it.
This module reads files and the environment only; it knows no API client.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.errors import UsageError

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
# Project ids, plus the legacy "domain.com:project" form gcloud still accepts.
_PROJECT = re.compile(r"^(?:[a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,61}[a-z0-9]$")

PROJECT_HELP = (
    "no Google Cloud project set; pass --project P, set [tpu] project in tpuwatch.toml, "
    "export CLOUDSDK_CORE_PROJECT=P, or run `gcloud config set project P`"
)
ZONE_HELP = (
    "no zone set; pass --zone Z (e.g. --zone us-central2-b), set [tpu] zone in tpuwatch.toml, "
    "export CLOUDSDK_COMPUTE_ZONE=Z, or run `gcloud config set compute/zone Z`"
)


@dataclass(frozen=True)
class Location:
    project: str
    zone: str | None
    project_from: str  # where the value came from, e.g. "--project", "gcloud configuration 'default'"
    zone_from: str


def gcloud_config_dir(env: Mapping[str, str]) -> Path:
    explicit = env.get("CLOUDSDK_CONFIG", "").strip()
    if explicit:
        return Path(os.path.expanduser(explicit))
    if os.name == "nt" and env.get("APPDATA"):  # pragma: no cover - gcloud's Windows location
        return Path(env["APPDATA"]) / "gcloud"
    return Path(os.path.expanduser("~")) / ".config" / "gcloud"


def gcloud_properties(env: Mapping[str, str]) -> tuple[str, dict[tuple[str, str], str]]:
    """(configuration name, {(section, key): value}) of the active gcloud configuration.

    Unreadable or malformed files give an empty mapping: gcloud's files are a last fallback,
    and the caller's "how to set it" message is the right answer when they say nothing.
    """
    root = gcloud_config_dir(env)
    name = env.get("CLOUDSDK_ACTIVE_CONFIG_NAME", "").strip()
    if not name:
        try:
            name = (root / "active_config").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            name = ""
    name = name or "default"
    if "/" in name or "\\" in name or name.startswith("."):
        return name, {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string((root / "configurations" / f"config_{name}").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, configparser.Error):
        return name, {}
    props = {
        (section, key): value.strip()
        for section in parser.sections()
        for key, value in parser.items(section)
    }
    return name, props


def _first(candidates: list[tuple[str, str | None]]) -> tuple[str, str] | None:
    for source, value in candidates:
        if value is not None and value.strip():
            return value.strip(), source
    return None


def resolve(
    project_flag: str | None = None,
    zone_flag: str | None = None,
    *,
    config_project: str | None = None,
    config_zone: str | None = None,
    need_zone: bool = True,
    env: Mapping[str, str] | None = None,
) -> Location:
    """Project and zone by that order; UsageError naming the source when missing or bad."""
    env = os.environ if env is None else env
    for flag, value in (("--project", project_flag), ("--zone", zone_flag)):
        # `--project "$PROJECT"` with PROJECT unset must not quietly mean another project.
        if value is not None and not value.strip():
            raise UsageError(f"{flag}: empty; give a value, or leave the flag out to use the config "
                             "file, the environment or gcloud's configuration")
    gname, gprops = gcloud_properties(env)
    gsource = f"gcloud configuration {gname!r}"
    project = _first([
        ("--project", project_flag),
        ("tpu.project", config_project),
        ("CLOUDSDK_CORE_PROJECT", env.get("CLOUDSDK_CORE_PROJECT")),
        ("GOOGLE_CLOUD_PROJECT", env.get("GOOGLE_CLOUD_PROJECT")),
        (f"{gsource} core/project", gprops.get(("core", "project"))),
    ])
    if project is None:
        raise UsageError(PROJECT_HELP)
    if not _PROJECT.match(project[0]):
        raise UsageError(f"{project[1]}: {project[0]!r} is not a project id such as my-project-123")
    zone = _first([
        ("--zone", zone_flag),
        ("tpu.zone", config_zone),
        ("CLOUDSDK_COMPUTE_ZONE", env.get("CLOUDSDK_COMPUTE_ZONE")),
        (f"{gsource} compute/zone", gprops.get(("compute", "zone"))),
    ])
    if zone is None:
        if need_zone:
            raise UsageError(ZONE_HELP)
        return Location(project[0], None, project[1], "")
    if not _ZONE.match(zone[0]):
        raise UsageError(f"{zone[1]}: {zone[0]!r} is not a zone such as us-central2-b")
    return Location(project[0], zone[0], project[1], zone[1])
