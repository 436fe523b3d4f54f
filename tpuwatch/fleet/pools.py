"""Spare pools of a watcher of several jobs: a file beside the jobs' files holding a `[pool]`
table and no `[job]` (`--config-dir`, or given with `-c`), and the checks of the jobs that name
one ([tpu] spare_pool). The claims themselves go by the nodes' labels (policy/pool.py).

```toml
[pool]
name = "v5p"                      # the jobs' [tpu] spare_pool; the spares' tpuwatch-pool label
zone = "us-central2-b"            # the zone of its spares (and of the jobs that name it)
project = "my-project"            # optional: the jobs' own project is not checked against it then
accelerator_type = "v5p-16"       # optional: the shape of its spares, checked against the jobs'
spares = ["sp-0", "sp-1"]         # the TPU API nodes it starts with, each labelled tpuwatch-pool=v5p
```

A pool of Compute Engine instances (for jobs with `api = "compute"` and `tpu.instance`) says so
with `api = "compute"`, and its shape with `machine_type` (an instance's machine type, as
[tpu.compute_spec.instance] names it) instead of `accelerator_type`; its `spares` are instances,
by name or URL (zones/ZONE/instances/NAME) in the pool's zone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from tpuwatch.config import SCHEMA, ConfigError
from tpuwatch.tpuconfig import TPU_APIS
from tpuwatch.wiring import Job

KEYS = ("name", "zone", "project", "api", "accelerator_type", "machine_type", "spares")
# the key naming the spares' shape, by the pool's api
SHAPE_KEYS = {"tpu": "accelerator_type", "compute": "machine_type"}


@dataclass(frozen=True)
class Pool:
    path: Path
    name: str
    zone: str
    project: str
    accelerator_type: str  # its spares' shape: an accelerator type, or (api "compute") a machine type
    spares: tuple[str, ...]
    api: str = "tpu"  # what its spares are: Cloud TPU API nodes, or Compute Engine instances


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # not a pool: its job's loading says what is wrong with it


def is_pool(path: Path) -> bool:
    """A pool file: a `[pool]` table and no `[job]`."""
    data = _read(path)
    return data is not None and "pool" in data and "job" not in data


def load(path: Path) -> Pool:
    """The pool `path` holds; ConfigError (exit 2) naming the file, the key and the fix."""
    data = _read(path) or {}
    table = data.get("pool")
    where = f"{path.name}: pool"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [pool] must be a table (name, zone, spares)")
    other = sorted(set(data) - {"pool"})
    if other:
        raise ConfigError(f"{where}: a pool file holds only [pool]; move [{other[0]}] to a job's file")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key; a pool takes {', '.join(KEYS)}")

    def text(key: str, check: str, required: bool) -> str:
        value = table.get(key, "")
        if required and not value:
            raise ConfigError(f"{where}.{key}: required; set {key} = \"...\" in [pool]")
        if value == "":
            return ""
        try:
            return str(SCHEMA[check.split(".")[0]][check.split(".")[1]].check(f"pool.{key}", value))
        except ConfigError as exc:
            raise ConfigError(f"{path.name}: {exc.message}") from None

    name = text("name", "tpu.spare_pool", True)
    zone = text("zone", "tpu.zone", True)
    project = text("project", "tpu.project", False)
    api = table.get("api", TPU_APIS[0])
    if api not in TPU_APIS:
        raise ConfigError(f"{where}.api: {api!r} is not an API of TPUs; set api = \"tpu\" (Cloud TPU API nodes, the "
                          "default) or api = \"compute\" (Compute Engine instances), as the jobs' [tpu] api")
    shape_key = SHAPE_KEYS[api]
    for key in SHAPE_KEYS.values():
        if key != shape_key and key in table:
            raise ConfigError(f"{where}.{key}: not with api = {api!r}; a pool of "
                              f"{'Compute Engine instances' if api == 'compute' else 'Cloud TPU API nodes'} names "
                              f"its spares' shape with {shape_key}")
    accel = table.get(shape_key, "")
    if not isinstance(accel, str):
        example = "ct5lp-hightpu-4t" if api == "compute" else "v5p-16"
        raise ConfigError(f"{where}.{shape_key}: a string such as \"{example}\"")
    accel = accel.rsplit("/", 1)[-1]  # a machine type's URL, as [tpu.compute_spec] holds it: its name
    given = table.get("spares", [])
    if api == "compute" and isinstance(given, list):
        given = [_instance_name(where, g, zone, project) for g in given]
    try:
        spares = tuple(SCHEMA["tpu"]["spares"].check("pool.spares", given))
    except ConfigError as exc:
        raise ConfigError(f"{path.name}: {exc.message}") from None
    if not spares:
        raise ConfigError(f"{where}.spares: name at least one idle {'instance' if api == 'compute' else 'TPU node'}, "
                          "e.g. spares = [\"sp-0\"]")
    return Pool(path, name, zone, project, accel, spares, api)


# An instance as gcloud and the console show it: zones/Z/instances/N, partial or full URL
_INSTANCE_URL = re.compile(r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/(?P<project>[^/]+)/)?"
                           r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
_INSTANCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _instance_name(where: str, given: Any, zone: str, project: str) -> Any:
    """A spare of a pool of instances given by its name or URL: its name, when of the pool's zone
    (and project); a value not a string as given, for the list's own check."""
    m = _INSTANCE_URL.match(given) if isinstance(given, str) else None
    if m is None:
        if isinstance(given, str) and not _INSTANCE_NAME.match(given):
            raise ConfigError(f"{where}.spares: {given!r} is not an instance name (lowercase letters, digits, hyphens; "
                              "starts with a letter) nor its URL; give the instance's name, or zones/ZONE/instances/NAME")
        return given
    if m["zone"] != zone:
        raise ConfigError(f"{where}.spares: {given!r} is in zone {m['zone']}, not the pool's zone {zone}; list "
                          "instances of that zone")
    if m["project"] and project and m["project"] != project:
        raise ConfigError(f"{where}.spares: {given!r} is in project {m['project']}, not the pool's project {project}; "
                          "list instances of that project")
    return m["name"]


def load_all(paths: Iterable[Path]) -> dict[str, Pool]:
    """Every pool by name; ConfigError for a bad file, two pools of one name, or one node in two."""
    pools: dict[str, Pool] = {}
    owner: dict[tuple[str, str], Pool] = {}
    for path in paths:
        p = load(path)
        if p.name in pools:
            raise ConfigError(f"{path.name}: pool.name: {p.name!r} is also the pool of {pools[p.name].path.name}; "
                              "give one of them another name")
        for spare in p.spares:
            other = owner.setdefault((p.zone, spare), p)
            if other is not p:
                raise ConfigError(f"{path.name}: pool.spares: {spare!r} is also a spare of pool {other.name} "
                                  f"({other.path.name}); a node is in one pool: drop it from one of them")
        pools[p.name] = p
    return pools


def check_job(pools: Mapping[str, Pool], job: Job) -> None:
    """A job naming a pool: the pool is one of this watcher's, in the job's zone (and project),
    of its shape, and none of its spares is one of the job's slices or own spares."""
    name = str(job.cfg.tpu["spare_pool"])
    if not name:
        return
    p = pools.get(name)
    if p is None:
        known = ", ".join(sorted(pools)) or "none"
        raise ConfigError(f"tpu.spare_pool: no spare pool {name!r} in this watcher (its pools: {known}); add a "
                          f"file with [pool] name = {name!r} beside the job's (--config-dir) or pass it with -c")
    if job.location.zone != p.zone:
        raise ConfigError(f"tpu.spare_pool: pool {name} ({p.path.name}) is in zone {p.zone}, the job in "
                          f"{job.location.zone}; a spare stands in for a slice of its own zone: name a pool there")
    if p.project and job.location.project != p.project:
        raise ConfigError(f"tpu.spare_pool: pool {name} ({p.path.name}) is of project {p.project}, the job of "
                          f"{job.location.project}; name a pool of the job's project")
    api = str(job.cfg.tpu.get("api") or TPU_APIS[0])
    if api != p.api:
        what = {"tpu": "Cloud TPU API nodes", "compute": "Compute Engine instances"}
        raise ConfigError(f"tpu.spare_pool: pool {name} ({p.path.name}) holds {what[p.api]} (its api = {p.api!r}), the "
                          f"job runs on {what[api]} (tpu.api = {api!r}); name a pool of the job's API, or set api = "
                          f"{api!r} in the pool's file if its spares are {what[api]}")
    if api == "compute":
        machine = str(((job.cfg.tpu.get("compute_spec") or {}).get("instance") or {}).get("machineType") or "")
        shape, where = machine.rsplit("/", 1)[-1], "[tpu.compute_spec.instance] machineType"
    else:
        shape, where = str((job.cfg.tpu.get("spec") or {}).get("accelerator_type") or ""), "[tpu.spec]"
    if p.accelerator_type and shape and shape != p.accelerator_type:
        raise ConfigError(f"tpu.spare_pool: pool {name} ({p.path.name}) holds {p.accelerator_type}, the job runs on "
                          f"{shape} ({where}); name a pool of the job's shape")
    own = {*job.cfg.tpu["names"], str(job.cfg.tpu["name"]), *job.cfg.tpu["spares"]}
    both = [s for s in p.spares if s in own]
    if both:
        raise ConfigError(f"tpu.spare_pool: {both[0]!r} is a spare of pool {name} ({p.path.name}) and one of the "
                          "job's own nodes (tpu.name, tpu.names, tpu.spares); drop it from one of them")
