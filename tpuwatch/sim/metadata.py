"""The GCE metadata server as one simulated TPU VM worker sees it.

Holds `Instance` (everything one worker's metadata server knows), `answer()` (one request in,
status + headers + body out, by the metadata server's rules) and `serve()` (an asyncio connection
handler speaking just enough HTTP/1.1 for curl, urllib and requests). Rules kept here:

- Every request needs the header `Metadata-Flavor: Google`; without it the answer is 403, as
  on Compute Engine. Every answer carries `Metadata-Flavor: Google`.
- Paths are those under `http://metadata.google.internal/computeMetadata/v1/` that tpuwatch,
  its startup scripts and a training job read: `instance/attributes/` (the node's metadata, plus
  `agent-worker-number`, `accelerator-type` and `tpu-env` as on a TPU VM), `instance/id`, `instance/name`,
  `instance/hostname`, `instance/zone`, `instance/preempted` (TRUE/FALSE),
  `instance/upcoming-maintenance`, `instance/maintenance-event`, `instance/network-interfaces/0/ip`,
  `project/project-id`, `project/numeric-project-id`. A directory path lists its entries
  (`?recursive=true` gives JSON); anything else is 404.
- `instance/upcoming-maintenance` is the notice as JSON (snake_case field names, as Compute
  Engine's `?alt=json` example shows; `maintenance_status` PENDING, then ONGOING once it is under
  way), or `{"error": "no notifications have been received yet, try again later"}` when there is
  none (as the Cloud TPU documentation has it). The documentation does not say which HTTP status
  comes with that error text; 200 is served.
- `instance/maintenance-event` is `NONE`, then `TERMINATE_ON_HOST_MAINTENANCE` for the short
  notice before the host stops (Compute Engine fills it only for VMs set to migrate or with a GPU;
  a notice may come through upcoming-maintenance ONGOING alone, see World.maintenance's
  `notice_via`); `instance/preempted` turns `TRUE` shortly before a spot VM stops.
- Fault `directories_fail`: every directory query (a listing, or `?recursive=true`) answers
  503 while each key is still served.
- `?wait_for_change=true` blocks until the value (or, for a directory, anything under it)
  differs from the one whose ETag is `last_etag` (without it: from the value when the request
  came), or `timeout_sec` seconds pass; then answers with the value then. Every answer carries an
  `ETag` header, a hash of its body.

This module knows neither the world model nor SSH: the world builds an `Instance` for a node's
worker (`World.instance_metadata`) and the hosts layer serves it on that worker's own address.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PREFIX = "/computeMetadata/v1/"
FLAVOR = ("Metadata-Flavor", "Google")
NO_NOTICE = {"error": "no notifications have been received yet, try again later"}
WORKER_NUMBER = "agent-worker-number"
ACCELERATOR = "accelerator-type"
TPU_ENV = "tpu-env"
_MAX_HEADER = 64 * 1024
_WAIT_POLL = 0.05  # seconds between looks at the instance while a wait_for_change request waits


def project_number(project: str) -> str:
    """A stable made-up project number for a project id (the same one the REST face shows)."""
    return str(int(hashlib.sha256(project.encode()).hexdigest()[:11], 16))


def worker_hostname(node_id: str | int, worker: int) -> str:
    """A worker's short host name, `t1v-n-<8 hex>-w-<index>`, as guest attributes show it."""
    try:
        ident = int(node_id)
    except (TypeError, ValueError):
        ident = int(hashlib.sha256(str(node_id).encode()).hexdigest()[:15], 16)
    return f"t1v-n-{ident % 10**8:08x}-w-{worker}"


def worker_instance_id(node_id: str | int, worker: int) -> str:
    """Each worker is a Compute Engine instance with its own numeric id (not the node's id)."""
    return str(int(hashlib.sha256(f"{node_id}/{worker}".encode()).hexdigest()[:15], 16))


@dataclass(frozen=True)
class Instance:
    """What one worker's metadata server answers with."""

    project: str
    zone: str
    worker: int
    instance_id: str
    name: str  # short host name
    attributes: Mapping[str, str] = field(default_factory=dict)
    preempted: bool = False
    upcoming_maintenance: Mapping[str, Any] | None = None
    ip: str = ""
    maintenance_event: str = "NONE"
    directories_fail: bool = False  # fault: every directory query answers 503
    # instance/upcoming-maintenance with nothing scheduled (Compute Engine shows `{}`, the error
    # JSON or `NONE` in different places; a TPU VM of the TPU API shows the error JSON)
    no_notice: str = json.dumps(NO_NOTICE, sort_keys=True)

    @property
    def hostname(self) -> str:
        """The fully qualified name (zonal DNS), as `instance/hostname` gives it."""
        return f"{self.name}.{self.zone}.c.{self.project}.internal" if self.zone else self.name


def tpu_env_text(values: Mapping[str, str]) -> str:
    """The `tpu-env` attribute: one `KEY: 'value'` line per setting, sorted, as a TPU VM shows it
    (JAX's cloud_tpu_cluster.py parses it so: "Typical line is MEGASCALE_NUM_SLICES: '2'")."""
    return "".join(f"{k}: '{v}'\n" for k, v in sorted(values.items()))


def make_instance(*, project: str, zone: str, node_id: str | int, worker: int,
                  metadata: Mapping[str, str], accelerator_type: str = "", preempted: bool = False,
                  upcoming_maintenance: Mapping[str, Any] | None = None, ip: str = "",
                  maintenance_event: str = "NONE", tpu_env: Mapping[str, str] | None = None,
                  directories_fail: bool = False) -> Instance:
    """An Instance for worker `worker` of a node: its metadata plus what a TPU VM adds itself
    (`tpu_env`: the runtime's settings, served as the `tpu-env` attribute)."""
    attributes = dict(metadata)
    # Set by the TPU service on every worker; a user's metadata cannot override them.
    attributes[WORKER_NUMBER] = str(worker)
    if accelerator_type:
        attributes[ACCELERATOR] = accelerator_type
    if tpu_env is not None:
        attributes[TPU_ENV] = tpu_env_text(tpu_env)
    return Instance(project=project, zone=zone, worker=worker,
                    instance_id=worker_instance_id(node_id, worker),
                    name=worker_hostname(node_id, worker), attributes=attributes, preempted=preempted,
                    upcoming_maintenance=upcoming_maintenance, ip=ip, maintenance_event=maintenance_event,
                    directories_fail=directories_fail)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/text"

    @property
    def text(self) -> str:
        return self.body.decode()

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.body).hexdigest()[:16]


def _text(value: str) -> Response:
    return Response(200, value.encode())


def _json(value: Any) -> Response:
    return Response(200, json.dumps(value, sort_keys=True).encode(), "application/json")


def _not_found(path: str) -> Response:
    return Response(404, f"The requested URL {path} was not found on this server.\n".encode(), "text/html")


def _listing(entries: Mapping[str, Any], recursive: bool) -> Response:
    if recursive:
        return _json(dict(entries))
    return _text("".join(f"{k}/\n" if isinstance(v, Mapping) else f"{k}\n" for k, v in entries.items()))


def _tree(inst: Instance) -> dict[str, Any]:
    """Every path this server answers, as nested dicts of strings (JSON values where noted)."""
    return {
        "instance": {
            "attributes": dict(sorted(inst.attributes.items())),
            "hostname": inst.hostname,
            "id": inst.instance_id,
            "maintenance-event": inst.maintenance_event,
            "name": inst.name,
            "network-interfaces": {"0": {"ip": inst.ip}} if inst.ip else {},
            "preempted": "TRUE" if inst.preempted else "FALSE",
            # a leaf holding JSON text, not a directory
            "upcoming-maintenance": (json.dumps(dict(inst.upcoming_maintenance), sort_keys=True)
                                     if inst.upcoming_maintenance else inst.no_notice),
            "zone": f"projects/{project_number(inst.project)}/zones/{inst.zone}",
        },
        "project": {"numeric-project-id": project_number(inst.project), "project-id": inst.project},
    }


def answer(inst: Instance, path: str, headers: Mapping[str, str], method: str = "GET") -> Response:
    """The metadata server's answer to one request for `path` (with its query string)."""
    flavor = {k.lower(): v for k, v in headers.items()}.get("metadata-flavor")
    parts = urlsplit(path)
    raw = unquote(parts.path)
    if flavor != FLAVOR[1]:
        return Response(403, (f"Your client does not have permission to get URL {raw} from this server. "
                              "Missing Metadata-Flavor:Google header.\n").encode(), "text/html")
    if method not in ("GET", "HEAD"):
        return Response(405, f"Method {method} not allowed\n".encode(), "text/html")
    if raw in ("/", ""):
        return _text("computeMetadata/\n")
    if raw.rstrip("/") == "/computeMetadata":
        return _text("v1/\n")
    if not (raw + "/").startswith(PREFIX):
        return _not_found(raw)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    recursive = query.get("recursive", "").lower() == "true"
    node: Any = _tree(inst)
    for part in [p for p in raw[len(PREFIX):].split("/") if p]:
        if not isinstance(node, Mapping) or part not in node:
            return _not_found(raw)
        node = node[part]
    if raw.rstrip("/").endswith("/upcoming-maintenance"):
        return Response(200, str(node).encode(), "application/json")
    if isinstance(node, Mapping):
        if inst.directories_fail:
            return Response(503, b"Service Unavailable\n", "text/html")
        return _listing(node, recursive)
    if query.get("alt") == "json":
        return _json(node)
    return _text(str(node))


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    if len(head) > _MAX_HEADER:
        return None
    lines = head.decode("latin-1").split("\r\n")
    request = lines[0].split()
    if len(request) != 3:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return request[0].upper(), request[1], headers


_REASONS = {200: "OK", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request",
            503: "Service Unavailable"}


def http_bytes(response: Response, method: str = "GET") -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
        f"{FLAVOR[0]}: {FLAVOR[1]}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        f"ETag: {response.etag}\r\n"
        "Server: Metadata Server for VM\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + (b"" if method == "HEAD" else response.body)


async def _wait_for_change(reader: asyncio.StreamReader, first: Response, query: Mapping[str, str], path: str,
                           headers: Mapping[str, str], method: str,
                           instance: Callable[[], Awaitable[Instance]], seen: Instance) -> Response | None:
    """The answer to a `wait_for_change` request: the first value whose ETag differs from the
    one waited on, or the current value after `timeout_sec`; None when the client hung up.
    `seen`: the instance `first` answered from."""
    since = query.get("last_etag") or first.etag
    if first.etag != since:
        return first
    try:
        timeout = float(query.get("timeout_sec", "") or "inf")
    except ValueError:
        return Response(400, b"timeout_sec must be a number\n", "text/html")
    deadline = asyncio.get_running_loop().time() + max(timeout, 0.0)
    response = first
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return response
        # Waiting on the connection doubles as the pause: EOF means the client is gone. Every
        # waiting request looks again on the same beat, so their looks come together.
        pause = _WAIT_POLL - asyncio.get_running_loop().time() % _WAIT_POLL
        try:
            if await asyncio.wait_for(reader.read(1), timeout=min(pause, left)) == b"":
                return None
        except asyncio.TimeoutError:
            pass
        try:
            current = await instance()
        except RuntimeError:  # the simulator is shutting down (its executor is gone)
            return None
        # The answer is a function of the instance alone: the same instance, the same answer.
        # Not computed again (a pod's relays each wait here, 20 looks a second: a simulator's
        # cost only, Google's server answers a change when it comes).
        if current == seen:
            continue
        seen = current
        response = answer(current, path, headers, method)
        if response.status != 200 or response.etag != since:
            return response


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                instance: Callable[[], Awaitable[Instance]]) -> None:
    """Answer one request on a connection, then close it (`Connection: close`)."""
    try:
        request = await _read_request(reader)
        if request is None:
            writer.write(http_bytes(Response(400, b"bad request\n", "text/html")))
        else:
            method, path, headers = request
            inst = await instance()
            response = answer(inst, path, headers, method)
            query = {k: v[-1] for k, v in parse_qs(urlsplit(path).query).items()}
            if response.status == 200 and query.get("wait_for_change", "").lower() == "true":
                waited = await _wait_for_change(reader, response, query, path, headers, method, instance, inst)
                if waited is None:
                    return  # the client went away
                response = waited
            writer.write(http_bytes(response, method))
        await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
