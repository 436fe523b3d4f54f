"""What every cloud API a TPU is made through gives the rest of tpuwatch (cloud/apis.py lists them).

One `CloudApi` per API (cloud/tpu/api.py, cloud/compute/api.py): how a job's slice is read,
deleted and made again, how a create's body is built from the config, which gcloud verb reaches
its workers, and what `status`, `events` and `drill` ask of its adapter (`SliceReader`). Nothing
outside cloud/ asks which API a job uses: it asks the registry for the job's `CloudApi`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple, Protocol

from tpuwatch.config import Config
from tpuwatch.model import NodeSnapshot, OperationStatus, QueuedStatus
from tpuwatch.ports import NodeLifecycle, TpuApi


@dataclass
class Due:
    """When one job's current tick was due (monotonic), set by the watcher before the tick waits
    for a free slot; None: answer as of now."""

    at: float | None = None

    def not_before(self, slack: float, clock: Callable[[], float]) -> float:
        """The earliest start of a shared listing that may still answer this job's tick."""
        return (clock() if self.at is None else self.at) - slack


class SliceReader(TpuApi, Protocol):
    """One zone's slices as one API's adapter shows them, for the commands that read a slice
    without a tick (`status`, `events`, `precheck`, `run`, `drill`)."""

    def worker_instances(self, *nodes: NodeSnapshot) -> Mapping[str, tuple[str, str]]: ...

    def instance_names(self, node: NodeSnapshot) -> tuple[str, ...]: ...

    def host_keys(self, name: str) -> dict[int, tuple[str, ...]]: ...

    def resize_request(self, node: NodeSnapshot) -> QueuedStatus | None:
        """The slice's own request for capacity still at work (a flex-start MIG's resize
        request), or None (`status`)."""

    def drill_target(self, node: NodeSnapshot, worker: int) -> tuple[str, str]:
        """What a drill on worker `worker` hits, in words, and the slice it is on (`drill`)."""

    def simulate_worker_maintenance(self, node: NodeSnapshot, worker: int) -> str:
        """Start a simulated maintenance event on worker `worker`; the operation name."""


class Doors(NamedTuple):
    """A job's doors to its slice: the API per zone, the lifecycle per zone, the workers' host
    keys and their VMs' names (for the workers' transport)."""

    tpu_for: Callable[[str], TpuApi]
    lifecycle_for: Callable[[str], NodeLifecycle]
    host_keys: Callable[[NodeSnapshot], Mapping[int, tuple[str, ...]]]
    instances: Callable[[NodeSnapshot], tuple[str, ...]]


@dataclass(frozen=True)
class ZoneSharing:
    """What one job of a watcher of several shares with the others: this API's zone lists
    (`CloudApi.shared()`), when its current tick was due, and how early a list may have begun."""

    lists: object
    due: Due
    slack: float


@dataclass(frozen=True)
class LaunchParts:
    """What a create writes for the startup script, built only when the body needs it."""

    metadata: Callable[[], dict[str, str]]  # the `tpuwatch-*` keys
    startup_script: Callable[[], str | None]  # tpu.startup_script's text, None when unset


@dataclass(frozen=True)
class GcloudSsh:
    """How `gcloud` prepares a worker of this API's slices: the verb, and whether it goes by the
    worker's own VM (instance name) or by the slice's name and --worker."""

    verb: tuple[str, ...]
    by_instance: bool


@dataclass(frozen=True)
class InitRequest:
    """`tpuwatch init NAME`: what to read, and the command's own doors (the API writes nothing
    itself but through them)."""

    name: str
    project: str
    zone: str
    job: str | None  # --job
    adopt: bool  # --adopt: label the live slice for the job
    out: str  # the config file's path, as the lines name it
    job_name: Callable[[str | None, str], str]  # (--job, the default) -> the job's name; exit 2 when bad
    write: Callable[[str], None]  # writes the config text and loads it back (exit 2 when it cannot)
    wait: Callable[[TpuApi, str, str], OperationStatus]  # (api, operation, what) -> the ended operation


@dataclass(frozen=True)
class InitResult:
    """What `init` tells about the config it wrote: --json's object and a person's lines."""

    summary: dict[str, Any]
    lines: list[str]


class CloudApi(Protocol):
    """One API a TPU is made through. `name` is the config's `[tpu] api`; `kinds` the
    `NodeSnapshot.kind`s its adapters fill in."""

    name: str
    kinds: tuple[str, ...]
    gcloud_ssh: GcloudSsh

    def describe(self, kind: str) -> str:
        """One of its `kinds` in a person's words ("TPU node", "Compute Engine MIG")."""

    def reader(self, cfg: Config, project: str, zone: str, *, as_is: bool = False) -> SliceReader:
        """The adapter that reads the job's slice in `zone`; `as_is`: as `status` shows it (a
        flex-start MIG with no VM is there, where a tick reads it as gone)."""

    def guesses(self, project: str, zone: str) -> list[SliceReader]:
        """Readers of a name given without a config (`status`, `events`), most likely first;
        none when the API cannot be used here (its client library is missing)."""

    def shared(self) -> object:
        """A watcher's zone lists of this API, shared by its jobs (`ZoneSharing.lists`)."""

    def doors(self, cfg: Config, project: str, sharing: ZoneSharing | None) -> Doors:
        """The job's doors to its slice; with `sharing`, reads come from the zone's shared lists."""

    def lifecycle(self, cfg: Config, reader: SliceReader) -> NodeLifecycle:
        """Delete and create of the job's slice through `reader` (one of this API's)."""

    def create_body(self, cfg: Config, zone: str, launch: LaunchParts) -> tuple[dict[str, Any], dict[str, Any]]:
        """The create request's body (REST JSON) for the job's slice in `zone`, and the spec whose
        queued-resource tier and reservation it asks for; UsageError/ConfigError (exit 2) when
        the config cannot make one."""

    def request_json(self, cfg: Config, zone: str, project: str, launch: LaunchParts) -> dict[str, Any]:
        """The exact create request (REST JSON) a create sends, for --dry-run."""

    def checks_body_before_delete(self, cfg: Config) -> bool:
        """Whether a delete must first build the create body (an instance is inserted again from
        the config: a body the cloud would refuse stops the watcher before the delete)."""

    def gone_workers(self, cfg: Config) -> Mapping[str, tuple[str, str]] | None:
        """Worker VMs the audit log names while the slice is gone (instance name -> (node,
        worker id)), or None."""

    def label_hint(self, node: NodeSnapshot, zone: str, job: str) -> str:
        """How a person gives `node` to `job` (its ownership label), for a refusal's message."""

    def init_config(self, request: InitRequest) -> InitResult | None:
        """`tpuwatch init`: read the live slice of that name, capture what making it again
        needs, and write its config (`request.write`); None when this API has no slice of that
        name (NotFoundError when no other API is left to ask)."""


# RFC 3339 with any number of fractional digits ("...T03:44:36.265703305Z", "+02:00").
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:?\d{2})"
)


def parse_rfc3339(text: str) -> datetime | None:
    """The first RFC 3339 time in `text` as an aware UTC datetime (microseconds kept), or None."""
    m = _RFC3339.search(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, tz = m.groups()
    try:
        micro = int((frac or "0")[:6].ljust(6, "0"))
        offset = timedelta(0)
        if tz not in ("Z", "z"):
            sign = 1 if tz[0] == "+" else -1
            digits = tz[1:].replace(":", "")
            offset = sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        local = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro,
                         tzinfo=timezone(offset))
    except ValueError:  # e.g. month 13: not a time after all
        return None
    return local.astimezone(timezone.utc)
