"""The simulator's REST (HTTP/JSON) face, so the real `gcloud` runs against the simulated cloud.

Served, for the paths gcloud 528 calls (`api_endpoint_overrides/tpu` = `url`,
`api_endpoint_overrides/compute` = `url + "compute/v1/"`):

- TPU `v2` and `v2alpha1`: nodes get, list, create (`?nodeId=`), delete, stop, start, patch
  (`?updateMask=labels,metadata,description`, what `tpu-vm update` sends),
  `:getGuestAttributes`; v2alpha1 alone: `:simulateMaintenanceEvent`, `:performMaintenance` and
  `queuedResources/Q:performMaintenanceQueuedResource` (`{"nodeNames": [...]}`), refused as the
  gRPC face refuses them; queued resources get, list, create (`?queuedResourceId=`, one node or
  multislice), delete (`?force=true`); operations get and list;
- Compute `v1`: `projects/P` (get), whose `commonInstanceMetadata` holds an `ssh-keys` item with
  the simulated workers' client key, so `gcloud ... tpu-vm ssh` adds no key to the node, and
  `enable-guest-attributes=TRUE` (the simulated instances publish their host keys, which Google's
  guest agent does only then: `gcloud compute ssh` pins them); with the os-login fault it also
  holds `enable-oslogin=TRUE`; and `projects/P/setCommonInstanceMetadata`, where `gcloud compute
  ssh` adds its key when the entry it writes (`USER:KEY COMMENT`) is not there;
- Compute `v1` for TPU VMs made through Compute Engine (instances, operations, templates,
  resource policies, MIGs, resize requests) and gcloud's `/batch/compute/v1`: compute_rest.py;
- OS Login `v1` (`api_endpoint_overrides/oslogin` = `url + "oslogin/"`): `users/U/loginProfile`
  and `users/U:importSshPublicKey`, whose primary POSIX account is the world's OS Login user, so
  gcloud logs in under that name as it does on Google Cloud.

It shares one `World` with the gRPC face: every request is counted and may fail by injection
under the same method name as its gRPC twin (`google.cloud.tpu.v2.Tpu/GetNode`, ...), and
messages are rendered by the gRPC face's own functions, then mapped to JSON by protobuf's JSON
mapping with enum *names* and no default-valued fields (gcloud's apitools cannot read integer
enums). Errors have the Google API error shape, `{"error": {"code", "message", "status"}}`.

This module translates HTTP to the world's calls and back; it holds no state but a count of the calls
it served (`RestFace.calls`: gcloud's, where `World.calls` counts both faces), and knows
nothing of SSH beyond reading the simulated hosts' public client and host keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from google.cloud import tpu_v2, tpu_v2alpha1
from google.protobuf import json_format
from google.protobuf.message import Message

from tpuwatch.errors import UsageError
from tpuwatch.sim import schema
from tpuwatch.sim.cerecords import fingerprint
from tpuwatch.sim.compute_json import operation_json
from tpuwatch.sim.compute_rest import ComputeRest, RawBody, compute_error
from tpuwatch.sim.grpc_api import (
    OPERATIONS,
    TPU_V2,
    TPU_V2ALPHA1,
    create_queued,
    render_node,
    render_operation,
    render_queued,
    spec_from_node,
)
from tpuwatch.sim.instances import ComputeError
from tpuwatch.sim.metadata import project_number, worker_hostname
from tpuwatch.sim.records import ApiError
from tpuwatch.sim.world import World

log = logging.getLogger(__name__)

_VERSIONS: dict[str, Any] = {"v2": tpu_v2, "v2alpha1": tpu_v2alpha1}
_SERVICES = {"v2": TPU_V2, "v2alpha1": TPU_V2ALPHA1}
COMPUTE_PROJECTS_GET = "compute.v1.Projects/Get"
COMPUTE_PROJECTS_SET_METADATA = "compute.v1.Projects/SetCommonInstanceMetadata"
OSLOGIN_GET_PROFILE = "oslogin.v1.Users/GetLoginProfile"
OSLOGIN_IMPORT_KEY = "oslogin.v1.Users/ImportSshPublicKey"

# google.rpc code name -> HTTP status, as Google's HTTP/JSON front ends map them.
HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}

_SEG = r"([^/:]+)"
T = TypeVar("T")
_LOC = rf"^/(v2|v2alpha1)/projects/{_SEG}/locations/{_SEG}"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(_LOC + r"/nodes$"), "list_nodes"),
    ("POST", re.compile(_LOC + r"/nodes$"), "create_node"),
    ("GET", re.compile(_LOC + rf"/nodes/{_SEG}$"), "get_node"),
    ("DELETE", re.compile(_LOC + rf"/nodes/{_SEG}$"), "delete_node"),
    ("PATCH", re.compile(_LOC + rf"/nodes/{_SEG}$"), "update_node"),
    ("POST", re.compile(_LOC + rf"/nodes/{_SEG}:getGuestAttributes$"), "guest_attributes"),
    ("POST", re.compile(_LOC + rf"/nodes/{_SEG}:stop$"), "stop_node"),
    ("POST", re.compile(_LOC + rf"/nodes/{_SEG}:start$"), "start_node"),
    ("POST", re.compile(_LOC + rf"/nodes/{_SEG}:simulateMaintenanceEvent$"), "simulate_maintenance"),
    ("GET", re.compile(_LOC + r"/queuedResources$"), "list_queued"),
    ("POST", re.compile(_LOC + r"/queuedResources$"), "create_queued"),
    ("GET", re.compile(_LOC + rf"/queuedResources/{_SEG}$"), "get_queued"),
    ("DELETE", re.compile(_LOC + rf"/queuedResources/{_SEG}$"), "delete_queued"),
    ("POST", re.compile(_LOC + rf"/nodes/{_SEG}:performMaintenance$"), "perform_maintenance"),
    ("POST", re.compile(_LOC + rf"/queuedResources/{_SEG}:performMaintenanceQueuedResource$"),
     "perform_maintenance_queued_resource"),
    ("GET", re.compile(_LOC + r"/operations$"), "list_operations"),
    ("GET", re.compile(_LOC + rf"/operations/{_SEG}$"), "get_operation"),
    ("GET", re.compile(rf"^/compute/v1/projects/{_SEG}$"), "compute_project"),
    ("POST", re.compile(rf"^/compute/v1/projects/{_SEG}/setCommonInstanceMetadata$"), "set_project_metadata"),
    ("GET", re.compile(rf"^/oslogin/v1/users/{_SEG}/loginProfile$"), "login_profile"),
    ("POST", re.compile(rf"^/oslogin/v1/users/{_SEG}:importSshPublicKey$"), "import_ssh_key"),
]


def to_json_dict(message: Any) -> dict[str, Any]:
    """A client-package message (proto-plus or protobuf) in the JSON mapping gcloud reads:
    camelCase names, enum names, int64 as strings, no default-valued fields."""
    pb = message if isinstance(message, Message) else type(message).pb(message)
    return dict(json_format.MessageToDict(pb, use_integers_for_enums=False,
                                          always_print_fields_with_no_presence=False))


def error_body(code: str, message: str) -> tuple[int, dict[str, Any]]:
    """HTTP status and the Google API error body for a google.rpc code name."""
    http = HTTP_STATUS.get(code, 500)
    return http, {"error": {"code": http, "message": message, "status": code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR lets a restarted simulator take its fixed port back from TIME_WAIT; on Linux
    # it still refuses a port another socket listens on. SO_REUSEPORT would share it: never.
    allow_reuse_address = True
    allow_reuse_port = False
    face: RestFace


class RestFace:
    """An HTTP/JSON server over `world`; `url` is what gcloud's endpoint overrides point at.

    ```python
    with Simulator(root=tmp) as sim, RestFace(sim.world) as rest:
        gcloudcfg.write_config(tmp / "gcloud", url=rest.url, project=sim.project, zone=sim.zone)
    ```
    """

    def __init__(self, world: World, host: str = "127.0.0.1", port: int = 0, *,
                 ssh_keys: str | None = None) -> None:
        self.world = world
        self.host = host
        self.port = port
        self._ssh_keys = ssh_keys
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # calls served through this face (gcloud's), by method; the world counts both faces
        self.calls: Counter[str] = Counter()
        self._calls_lock = threading.Lock()
        self.compute = ComputeRest(world, self._call, lambda: self.compute_url)

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, with the trailing slash gcloud's `api_endpoint_overrides/tpu` needs."""
        return f"http://{self.host}:{self.port}/"

    @property
    def compute_url(self) -> str:
        """What `api_endpoint_overrides/compute` must be."""
        return f"{self.url}compute/v1/"

    def start(self) -> RestFace:
        if self._server is not None:
            return self
        try:
            server = _Server((self.host, self.port), _Handler)
        except OSError as exc:
            raise UsageError(
                f"--rest-port: cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); "
                "choose another port or use 0 for a free one"
            )
        server.face = self
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="tpuwatch-sim-rest", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> RestFace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the compute project holds ----------------------------------------------------

    def ssh_keys(self) -> str:
        """The project's `ssh-keys` metadata: `USER:TYPE DATA USER` for the hosts' client key."""
        if self._ssh_keys is not None:
            return self._ssh_keys
        hosts = self.world.hosts
        key = getattr(hosts, "client_key", None)
        user = getattr(hosts, "ssh_user", None)
        if key is None or user is None:
            return ""
        try:
            kind, data = Path(str(key) + ".pub").read_text().split()[:2]
        except (OSError, ValueError):
            return ""
        return f"{user}:{kind} {data} {user}"

    # --- request handling ------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: bytes,
               content_type: str = "") -> tuple[int, dict[str, Any] | RawBody]:
        """Serve one request: (HTTP status, JSON body or a raw one)."""
        parts = urlsplit(raw_path)
        path = unquote(parts.path)
        if self.compute.handles(path):
            return self.compute.handle(method, raw_path, body, content_type)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:  # Google's front end refuses what its discovery document does not take
            schema.check_http(method, path, parse_qs(parts.query, keep_blank_values=True), body)
        except schema.Refusal as exc:
            if path.startswith("/compute/"):
                return compute_error(ComputeError(exc.code, exc.message, exc.reason))
            return error_body(exc.code, exc.message)
        for verb, pattern, name in ROUTES:
            m = pattern.match(path)
            if m is None:
                continue
            if verb != method:
                continue
            try:
                payload = json.loads(body.decode() or "{}") if body else {}
                if not isinstance(payload, dict):
                    raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received: expected an object")
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                return error_body("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}")
            except ApiError as exc:
                return error_body(exc.code, exc.message)
            try:
                return 200, getattr(self, "_" + name)(*m.groups(), query=query, body=payload)
            except ApiError as exc:
                return error_body(exc.code, exc.message)
            except Exception as exc:  # a simulator bug: say so, as the gRPC face does
                log.exception("%s %s failed", method, path)
                return error_body("INTERNAL", f"simulator error in {name}: {type(exc).__name__}: {exc}")
        if any(p.match(path) for _, p, _ in ROUTES):
            return error_body("UNIMPLEMENTED", f"{method} {path} is not supported by the simulator")
        return error_body("NOT_FOUND", f"{method} {path}: no such method in the simulator's REST face "
                          "(it serves TPU v2/v2alpha1 nodes, queued resources and operations, compute/v1 projects, and the compute/v1 paths of compute_rest.py)")

    def _call(self, method: str, resource: str) -> None:
        with self._calls_lock:
            self.calls[method] += 1
        injected = self.world.before_call(method, resource)
        if injected is not None:
            raise injected

    # TPU nodes

    def _get_node(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/GetNode", f"projects/{p}/locations/{z}/nodes/{n}")
        return to_json_dict(render_node(self.world.get_node(p, z, n), version))

    def _list_nodes(self, version: str, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/ListNodes", f"projects/{p}/locations/{z}")
        nodes, token = _page(self.world.list_nodes(p, z), query)
        return to_json_dict(_VERSIONS[version].ListNodesResponse(
            nodes=[render_node(n, version) for n in nodes], next_page_token=token))

    def _create_node(self, version: str, p: str, z: str, *, query: dict[str, str],
                     body: dict[str, Any]) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/CreateNode", f"projects/{p}/locations/{z}")
        mod = _VERSIONS[version]
        try:
            node = mod.Node.from_json(json.dumps(body), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}")
        self.world.check_zone(p, z)
        op = self.world.create_node(p, z, query.get("nodeId", ""), spec_from_node(node, z), version)
        return to_json_dict(render_operation(op))

    def _delete_node(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/DeleteNode", f"projects/{p}/locations/{z}/nodes/{n}")
        return to_json_dict(render_operation(self.world.delete_node(p, z, n, version)))

    def _update_node(self, version: str, p: str, z: str, n: str, *, query: dict[str, str],
                     body: dict[str, Any]) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/UpdateNode", f"projects/{p}/locations/{z}/nodes/{n}")
        mod = _VERSIONS[version]
        try:
            node = mod.Node.from_json(json.dumps(body), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}")
        # A FieldMask in a query string is comma-separated JSON (camelCase) paths.
        paths = [re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), x.strip())
                 for x in query.get("updateMask", "").split(",") if x.strip()]
        fields = {"labels": dict(node.labels), "metadata": dict(node.metadata), "description": node.description}
        return to_json_dict(render_operation(self.world.update_node(p, z, n, fields, paths, version)))

    def _stop_node(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/StopNode", f"projects/{p}/locations/{z}/nodes/{n}")
        return to_json_dict(render_operation(self.world.stop_node(p, z, n, version)))

    def _start_node(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/StartNode", f"projects/{p}/locations/{z}/nodes/{n}")
        return to_json_dict(render_operation(self.world.start_node(p, z, n, version)))

    def _simulate_maintenance(self, version: str, p: str, z: str, n: str, *,
                              body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if version != "v2alpha1":
            raise ApiError("NOT_FOUND", "simulateMaintenanceEvent is a v2alpha1 method")
        self._call(f"{TPU_V2ALPHA1}/SimulateMaintenanceEvent", f"projects/{p}/locations/{z}/nodes/{n}")
        workers = [str(w) for w in body.get("workerIds") or []]
        return to_json_dict(render_operation(self.world.simulate_maintenance_event(p, z, n, workers)))

    def _perform_maintenance(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        if version != "v2alpha1":
            raise ApiError("NOT_FOUND", "performMaintenance is a v2alpha1 method")
        self._call(f"{TPU_V2ALPHA1}/PerformMaintenance", f"projects/{p}/locations/{z}/nodes/{n}")
        return to_json_dict(render_operation(self.world.perform_maintenance(p, z, n)))

    def _perform_maintenance_queued_resource(self, version: str, p: str, z: str, q: str, *,
                                             body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if version != "v2alpha1":
            raise ApiError("NOT_FOUND", "performMaintenanceQueuedResource is a v2alpha1 method")
        self._call(f"{TPU_V2ALPHA1}/PerformMaintenanceQueuedResource", f"projects/{p}/locations/{z}/queuedResources/{q}")
        names = body.get("nodeNames") or []
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise ApiError("INVALID_ARGUMENT", "Invalid value at 'node_names': expected a list of strings")
        return to_json_dict(render_operation(self.world.perform_maintenance_queued_resource(p, z, q, names)))

    def _guest_attributes(self, version: str, p: str, z: str, n: str, *,
                          body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/GetGuestAttributes", f"projects/{p}/locations/{z}/nodes/{n}")
        mod = _VERSIONS[version]
        rec = self.world.get_node(p, z, n)
        query_path = str(body.get("queryPath") or "")
        ids = body.get("workerIds") or []
        wanted = {int(x) for x in ids if str(x).isdigit()} or set(range(rec.n_workers))
        out = []
        for i, ip in enumerate(rec.ips):
            if i not in wanted:
                continue
            items = [
                # The worker VM's instance name; gcloud's TPU ssh reads it by the key `hostname`
                # alone (the namespace here is the simulator's choice).
                mod.GuestAttributesEntry(namespace="guestInventory", key="hostname",
                                         value=worker_hostname(rec.id, i)),
                mod.GuestAttributesEntry(namespace="guestInventory", key="InternalIP", value=ip),
            ]
            # gcloud names the worker's known_hosts alias after the ed25519 key's last 6 characters
            items += [mod.GuestAttributesEntry(namespace="hostkeys", key=k, value=v)
                      for k, v in self.world.host_keys(rec, i).items()]
            if query_path:
                items = [e for e in items if f"{e.namespace}/{e.key}".startswith(query_path.strip("/"))]
            out.append(mod.GuestAttributes(query_path=query_path,
                                           query_value=mod.GuestAttributesValue(items=items)))
        return to_json_dict(mod.GetGuestAttributesResponse(guest_attributes=out))

    # operations

    # Queued resources (`gcloud compute tpus queued-resources` create, describe, list, delete)

    def _create_queued(self, version: str, p: str, z: str, *, query: dict[str, str],
                       body: dict[str, Any]) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/CreateQueuedResource", f"projects/{p}/locations/{z}")
        mod = _VERSIONS[version]
        try:
            qr = mod.QueuedResource.from_json(json.dumps(body), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}")
        op = create_queued(self.world, version, p, z, query.get("queuedResourceId", ""), qr)
        return to_json_dict(render_operation(op))

    def _get_queued(self, version: str, p: str, z: str, n: str, **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/GetQueuedResource", f"projects/{p}/locations/{z}/queuedResources/{n}")
        return to_json_dict(render_queued(self.world.get_queued_resource(p, z, n), version))

    def _list_queued(self, version: str, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/ListQueuedResources", f"projects/{p}/locations/{z}")
        items, token = _page(self.world.list_queued_resources(p, z), query)
        return to_json_dict(_VERSIONS[version].ListQueuedResourcesResponse(
            queued_resources=[render_queued(q, version) for q in items], next_page_token=token))

    def _delete_queued(self, version: str, p: str, z: str, n: str, *, query: dict[str, str],
                       **_: Any) -> dict[str, Any]:
        self._call(f"{_SERVICES[version]}/DeleteQueuedResource", f"projects/{p}/locations/{z}/queuedResources/{n}")
        force = query.get("force", "false").lower() == "true"
        return to_json_dict(render_operation(
            self.world.delete_queued_resource(p, z, n, force, api_version=version)))

    def _get_operation(self, version: str, p: str, z: str, o: str, **_: Any) -> dict[str, Any]:
        name = f"projects/{p}/locations/{z}/operations/{o}"
        self._call(f"{OPERATIONS}/GetOperation", name)
        return to_json_dict(render_operation(self.world.get_operation(name)))

    def _list_operations(self, version: str, p: str, z: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        parent = f"projects/{p}/locations/{z}"
        self._call(f"{OPERATIONS}/ListOperations", parent)
        ops = self.world.list_operations(parent)
        page, token = _page(ops, query)
        out: dict[str, Any] = {"operations": [to_json_dict(render_operation(o)) for o in page]}
        if token:
            out["nextPageToken"] = token
        return out

    # compute

    def _compute_project(self, p: str, **_: Any) -> dict[str, Any]:
        self._call(COMPUTE_PROJECTS_GET, f"projects/{p}")
        metadata = self.world.project_metadata(p, self._initial_project_metadata())
        if self.world.os_login_user:
            metadata["enable-oslogin"] = "TRUE"
        number = project_number(p)
        items = [{"key": k, "value": v} for k, v in metadata.items()]
        return {
            "kind": "compute#project",
            "id": str(number),
            "name": p,
            "commonInstanceMetadata": {
                "kind": "compute#metadata",
                "fingerprint": fingerprint(sorted(metadata.items())),
                "items": items,
            },
            "defaultServiceAccount": f"{number}-compute@developer.gserviceaccount.com",
            "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{p}",
        }


    def _initial_project_metadata(self) -> dict[str, str]:
        return {"ssh-keys": self.ssh_keys(), "enable-guest-attributes": "TRUE"}

    def _set_project_metadata(self, p: str, *, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self._call(COMPUTE_PROJECTS_SET_METADATA, f"projects/{p}")
        items = {str(i.get("key")): str(i.get("value", "")) for i in body.get("items") or []}
        op = self.world.set_project_metadata(p, self._initial_project_metadata(), items,
                                             str(body.get("fingerprint") or ""))
        return operation_json(op, self.compute_url)

    # OS Login

    def _profile(self, email: str, project: str) -> dict[str, Any]:
        user = self.world.os_login_user
        if not user:
            raise ApiError("FAILED_PRECONDITION", "OS Login is not enabled in the simulator (inject os-login)")
        keys = {hashlib.sha256(k.encode()).hexdigest(): {"key": k, "fingerprint": hashlib.sha256(k.encode()).hexdigest(),
                                                          "name": f"users/{email}/sshPublicKeys/x"}
                for k in self.world.os_login_keys}
        uid = str(1000 + int(project_number(project or self.world.project)) % 100000)
        return {
            "name": email,
            "posixAccounts": [{"primary": True, "username": user, "uid": uid, "gid": uid,
                               "homeDirectory": f"/home/{user}", "operatingSystemType": "LINUX",
                               "accountId": project or self.world.project,
                               "name": f"users/{email}/projects/{project or self.world.project}"}],
            "sshPublicKeys": keys,
        }

    def _login_profile(self, email: str, *, query: dict[str, str], **_: Any) -> dict[str, Any]:
        self._call(OSLOGIN_GET_PROFILE, f"users/{email}")
        return self._profile(email, query.get("projectId", ""))

    def _import_ssh_key(self, email: str, *, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self._call(OSLOGIN_IMPORT_KEY, f"users/{email}")
        key = str(body.get("key") or "").strip()
        if key and key not in self.world.os_login_keys:
            self.world.os_login_keys.append(key)
        return {"loginProfile": self._profile(email, query.get("projectId", ""))}


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ApiError("INVALID_ARGUMENT", f"Invalid value at '{what}' (TYPE_INT32), \"{text}\"")
    if value < 0:
        raise ApiError("INVALID_ARGUMENT", f"{what} must not be negative")
    return value


def _page(items: list[T], query: dict[str, str]) -> tuple[list[T], str]:
    """One page of a list call (`pageToken`, `pageSize`) and the next page's token ("" at the end)."""
    start = _page_start(query.get("pageToken", ""))
    size = _int(query.get("pageSize", "0"), "pageSize") or 1000
    return items[start:start + size], (str(start + size) if start + size < len(items) else "")


def _page_start(token: str) -> int:
    if not token:
        return 0
    if not token.isdigit():
        raise ApiError("INVALID_ARGUMENT", f"pageToken {token!r} is not valid")
    return int(token)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: gcloud's httplib2 reuses its connection
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        status, payload = self.server.face.handle(self.command, self.path, body,
                                                  self.headers.get("Content-Type", ""))
        if isinstance(payload, RawBody):
            data, ctype = payload.data, payload.content_type
        else:
            data, ctype = json.dumps(payload, indent=2).encode(), "application/json; charset=UTF-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("rest: " + format, *args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = int(code) if str(code).isdigit() else 0
        (log.info if status >= 400 else log.debug)("rest: %s %s -> %s", self.command, self.path, code)


__all__ = ["HTTP_STATUS", "RestFace", "error_body", "to_json_dict"]
