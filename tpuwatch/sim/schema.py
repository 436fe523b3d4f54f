"""Google's own request schema: every REST and gRPC request the simulator serves is checked against
the discovery documents google-api-python-client ships (compute.v1, tpu.v2, tpu.v2alpha1,
oslogin.v1), so a request Google would refuse is refused here too, with Google's wording.

Checked: the method (HTTP verb + `flatPath`); unknown query parameters; missing required
parameters; path parameters against their `pattern`; query parameters' types and enums; the body,
at any depth (through `$ref`, arrays and `additionalProperties` maps): unknown fields, JSON types
(int64/uint64 as strings or numbers, as proto3's JSON mapping takes them), enum values; and the
URL formats Compute Engine's field descriptions demand where a bare name is refused (`URL_FIELDS`:
`instances.insert` takes `machineType` and `initializeParams.diskType` as full or partial URLs only;
an instance template takes bare names there, so only the methods listed are checked).

Output-only fields (`readOnly`, "Output only." / "[Output Only]") are NOT refused: Compute Engine
ignores them on insert (gcloud and the clients send `kind`; a GET-modify-PUT round trip carries
`id`, `selfLink`, `fingerprint`...) and Google's AIP-203 has services ignore output-only fields
in requests. Their values are still parsed, as Google's JSON front end parses them: an unknown
name or a wrong type inside one is refused. Field names may be camelCase or the proto field name
(snake_case), as proto3's JSON mapping accepts both.

Wording (each is what Google's front ends answer): an unknown body field `Invalid JSON payload
received. Unknown name "foo" at 'node.scheduling_config': Cannot find field.` (the TPU API names
the proto path, the request's body field first; Compute Engine names its body `resource`); an
unknown query parameter `Invalid JSON payload received. Unknown name "foo": Cannot bind query
parameter. Field 'foo' could not be found in request message.`; a wrong JSON type `Invalid value at
'node.accelerator_type' (TYPE_STRING), 5`; a TPU enum `Invalid value at
'node.scheduling_config.provisioning_model' (type.googleapis.com/google.cloud.tpu.v2.
SchedulingConfig.ProvisioningModel), "CHEAP"`; Compute Engine's enums (strings to its JSON front
end, checked by the service) and URLs `Invalid value for field 'resource.machineType':
'tpu7x-standard-4t'. The URL is malformed.`, a path parameter `Invalid value for field 'instance':
'x_'. Must be a match of regex '...'` and a missing one `Required field 'size' not specified`. A TPU resource created without a field
its description marks "Required." (a node's `runtimeVersion`, an `acceleratorConfig`'s `type`
and `topology`) is refused as `Missing required field node.runtime_version` (the simulator's
wording: Google's for this case was not found published).

The documents are a test dependency, not the product's: without google-api-python-client `DOCS`
is empty, `strict()` is False and the simulator serves unchecked (said once in the log). Each
document is parsed once per process.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

# api name -> (document file, package of its messages, style of its errors: Compute Engine's, or
# the one of Google's other APIs (the TPU API's), with proto field paths)
_FILES = {
    "compute": ("compute.v1.json", "google.cloud.compute.v1", "compute"),
    "tpu.v2": ("tpu.v2.json", "google.cloud.tpu.v2", "tpu"),
    "tpu.v2alpha1": ("tpu.v2alpha1.json", "google.cloud.tpu.v2alpha1", "tpu"),
    "oslogin": ("oslogin.v1.json", "google.cloud.oslogin.v1", "tpu"),
}
# (method id, field path with [] for each array element) -> the collection its URL must name.
# Compute Engine refuses a bare name in these fields (their descriptions: "full or partial URL").
URL_FIELDS: dict[tuple[str, str], str] = {
    ("compute.instances.insert", "machineType"): "machineTypes",
    ("compute.instances.insert", "disks[].initializeParams.diskType"): "diskTypes",
    ("compute.instances.insert", "disks[].source"): "disks",
    ("compute.instanceGroupManagers.insert", "instanceTemplate"): "instanceTemplates",
    ("compute.regionInstanceGroupManagers.insert", "instanceTemplate"): "instanceTemplates",
    ("compute.instanceGroupManagers.insert", "resourcePolicies.workloadPolicy"): "resourcePolicies",
    ("compute.instanceGroupManagers.recreateInstances", "instances[]"): "instances",
}
# Query parameters Google takes beyond the document: compute.v1's earlier revisions had
# `returnPartialSuccess` on every list and aggregatedList; newer documents (and clients) dropped
# it, but gcloud still sends it and Google still serves gcloud.
_KEPT_QUERY = {"compute": {"returnPartialSuccess"}}
_URL = re.compile(r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/[^/]+/)?"
                  r"(?:zones|regions)/[^/]+/(?P<c>[A-Za-z]+)/[^/]+$|"
                  r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/[^/]+/)?global/(?P<g>[A-Za-z]+)/[^/]+$")
# discovery type (type, format) -> the proto type Google's JSON front end names in its refusals
_TYPES: dict[tuple[Any, Any], str] = {
    ("string", None): "TYPE_STRING", ("boolean", None): "TYPE_BOOL", ("integer", "int32"): "TYPE_INT32",
    ("integer", "uint32"): "TYPE_UINT32", ("string", "int64"): "TYPE_INT64", ("string", "uint64"): "TYPE_UINT64",
    ("number", "double"): "TYPE_DOUBLE", ("number", "float"): "TYPE_FLOAT", ("string", "byte"): "TYPE_BYTES",
}


class Refusal(Exception):
    """A request Google refuses: HTTP 400 (INVALID_ARGUMENT), 404 for no such method."""

    def __init__(self, message: str, reason: str = "invalid", code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason  # Compute Engine's errors[].reason
        self.code = code


@dataclass
class Method:
    id: str
    verb: str
    regex: re.Pattern[str]
    literal: int  # characters of the path template outside its variables (more wins a tie)
    params: dict[str, Any]
    request: str  # schema name of the body, "" for none
    path_vars: list[str] = field(default_factory=list)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class Doc:
    """One discovery document: its methods, found by verb and path, and their checks."""

    def __init__(self, api: str, data: dict[str, Any]) -> None:
        self.api = api
        _, self.package, self.style = _FILES[api]
        self.schemas: dict[str, Any] = data.get("schemas", {})
        # the parameters every method takes (`alt`, `fields`, ...); the client libraries' REST
        # transports send them with a `$` (`$alt=json;enum-encoding=int`)
        self.system = dict(data.get("parameters", {}))
        self.methods: list[Method] = []
        self.by_id: dict[str, Method] = {}
        self._by_verb: dict[str, list[Method]] = {}
        stack = [data]
        while stack:
            node = stack.pop()
            for m in node.get("methods", {}).values():
                self._add(m)
            stack.extend(node.get("resources", {}).values())

    def _add(self, m: dict[str, Any]) -> None:
        template = m.get("flatPath") or m["path"]
        parts, names = [], []
        for seg in template.split("/"):
            def var(match: re.Match[str], seg: str = seg) -> str:
                names.append(match.group(1).lstrip("+"))
                return "([^/:]+)" if ":" in seg else "([^/]+)"
            parts.append(re.sub(r"\\\{([^}]+)\\\}", var, re.escape(seg)))
        literal = len(re.sub(r"\{[^}]+\}", "", template))
        method = Method(m["id"], m["httpMethod"], re.compile("^" + "/".join(parts) + "$"), literal,
                        dict(m.get("parameters", {})), str((m.get("request") or {}).get("$ref", "")), names)
        self.methods.append(method)
        self.by_id[method.id] = method
        self._by_verb.setdefault(method.verb, []).append(method)

    # --- naming ---------------------------------------------------------------------------

    def _join(self, at: str, name: str) -> str:
        name = name if self.style == "compute" else _snake(name)
        return f"{at}.{name}" if at else name

    def _root(self, method: Method) -> str:
        if self.style == "compute":
            return "resource"
        return "" if method.request.endswith("Request") else _snake(method.request)

    # --- the checks -----------------------------------------------------------------------

    def find(self, verb: str, path: str) -> tuple[Method, dict[str, str]]:
        """The method served at `path` (relative to the API's root) for `verb`; 404 when none."""
        best: tuple[Method, re.Match[str]] | None = None
        for method in self._by_verb.get(verb, []):
            m = method.regex.match(path)
            if m is not None and (best is None or method.literal > best[0].literal):
                best = (method, m)
        if best is None:
            raise Refusal(f"{verb} {path}: no such method in Google's {self.api} API", "notFound", "NOT_FOUND")
        method, m = best
        return method, dict(zip(method.path_vars, m.groups(), strict=True))

    def check_request(self, verb: str, path: str, query: dict[str, list[str]], body: Any) -> Method:
        """Refusal for a request Google refuses; the method otherwise. `body` is the parsed JSON
        (None for no body)."""
        method, path_values = self.find(verb, path)
        for name, value in path_values.items():
            self._check_param(name, method.params.get(name, {}), value)
        for name, values in query.items():
            spec = method.params.get(name)
            if spec is None or spec.get("location") != "query":
                spec = self.system.get(name.removeprefix("$"))
            if spec is None and name in _KEPT_QUERY.get(self.api, ()) and method.id.endswith(("list", "List")):
                spec = {"type": "boolean"}
            if spec is None:
                raise Refusal(f"Invalid JSON payload received. Unknown name \"{name}\": Cannot bind query parameter. "
                              f"Field '{name}' could not be found in request message.")
            for value in values:
                self._check_param(name, spec, value.split(";", 1)[0] if name == "$alt" else value)
        for name, spec in method.params.items():
            if spec.get("required") and spec.get("location") == "query" and name not in query:
                raise self._required(name)
        if method.request and body is not None:
            self.check_body(method, body)
        elif method.request and self.style == "compute":
            raise self._required("resource")
        return method

    def _required(self, name: str) -> Refusal:
        if self.style == "compute":
            return Refusal(f"Required field '{name}' not specified", "required")
        return Refusal(f"Missing required field {_snake(name)}", "required")

    def _check_param(self, name: str, spec: dict[str, Any], value: str) -> None:
        pattern = spec.get("pattern")
        if pattern and not re.fullmatch(pattern.strip("^$"), value):
            raise Refusal(f"Invalid value for field '{name}': '{value}'. Must be a match of regex '{pattern}'")
        kind = spec.get("type", "string")
        ok = (kind != "integer" or re.fullmatch(r"-?\d+", value) is not None) and \
            (kind != "boolean" or value.lower() in ("true", "false"))
        if not ok or (spec.get("enum") and value not in spec["enum"]):
            raise Refusal(f"Invalid value at '{_snake(name)}' ({_TYPES.get((kind, spec.get('format')), 'TYPE_STRING')}), "
                          f"\"{value}\"")

    def check_body(self, method: Method, body: Any, *, typed: bool = False) -> None:
        """Refusal for a body Google refuses. `typed`: it came as a protobuf message (gRPC), whose
        fields the client package's proto defines, maybe newer than this document: no field is
        unknown then."""
        if not isinstance(body, dict):
            raise Refusal(f"Invalid JSON payload received. Expected an object for '{self._root(method)}'.")
        self._object(method, self.schemas.get(method.request, {}), method.request, body, self._root(method), "", typed)

    def _object(self, method: Method, schema: dict[str, Any], name: str, value: dict[str, Any], at: str,
                route: str, typed: bool) -> None:
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if extra is not None and not props:
                self._value(method, extra, f"{at}[{key}]" if at else key, item, name, route + "{}", key, typed)
                continue
            spec = props.get(key)
            if spec is None and _camel(key) in props:  # the proto field name
                key = _camel(key)
                spec = props[key]
            if spec is None and typed:
                continue
            if spec is None:
                where = f" at '{at}'" if at else ""
                raise Refusal(f"Invalid JSON payload received. Unknown name \"{key}\"{where}: Cannot find field.")
            self._value(method, spec, self._join(at, key), item, name, f"{route}.{key}" if route else key, key, typed)
        if self.style == "tpu" and method.id.endswith(".create"):  # a whole resource: its "Required." fields
            for prop, spec in props.items():
                given = value.get(prop, value.get(_snake(prop)))
                if str(spec.get("description", "")).startswith("Required.") and given in (None, "", [], {}):
                    raise Refusal(f"Missing required field {self._join(at, prop)}", "required")

    def _value(self, method: Method, spec: dict[str, Any], at: str, value: Any, owner: str, route: str,
               key: str, typed: bool) -> None:
        if value is None:
            return  # JSON null is the field's default
        ref = spec.get("$ref")
        kind = spec.get("type")
        if ref:
            if not isinstance(value, dict):
                raise Refusal(f"Invalid value at '{at}' (type.googleapis.com/{self.package}.{ref}), {json.dumps(value)}")
            self._object(method, self.schemas.get(ref, {}), ref, value, at, route, typed)
            return
        if kind == "array":
            if not isinstance(value, list):
                item = spec.get("items", {})
                raise Refusal(f"Invalid value at '{at}' ({self._type_name(item)}), {json.dumps(value)}")
            for i, element in enumerate(value):
                self._value(method, spec.get("items", {}), f"{at}[{i}]", element, owner, route + "[]", key, typed)
            return
        if kind == "object":
            if not isinstance(value, dict):
                raise Refusal(f"Invalid value at '{at}' (TYPE_MESSAGE), {json.dumps(value)}")
            self._object(method, spec, owner, value, at, route, typed)
            return
        if not _fits(kind, spec.get("format"), value):
            raise Refusal(f"Invalid value at '{at}' ({self._type_name(spec)}), {json.dumps(value)}")
        if spec.get("enum") and value not in spec["enum"]:
            if self.style == "compute":
                raise Refusal(f"Invalid value for field '{at}': '{value}'.")
            enum = f"{owner}.{key[:1].upper()}{key[1:]}"
            raise Refusal(f"Invalid value at '{at}' (type.googleapis.com/{self.package}.{enum}), {json.dumps(value)}")
        collection = URL_FIELDS.get((method.id, route))
        if collection and isinstance(value, str):
            m = _URL.match(value)
            if m is None or (m.group("c") or m.group("g")) != collection:
                raise Refusal(f"Invalid value for field '{at}': '{value}'. The URL is malformed.")

    @staticmethod
    def _type_name(spec: dict[str, Any]) -> str:
        if spec.get("$ref") or spec.get("type") == "object":
            return "TYPE_MESSAGE"
        return _TYPES.get((spec.get("type"), spec.get("format")), "TYPE_STRING")


def _fits(kind: str | None, fmt: str | None, value: Any) -> bool:
    """Whether a JSON value is one proto3's JSON mapping parses as this discovery type."""
    if kind == "string":
        if fmt in ("int64", "uint64"):
            return (isinstance(value, int) and not isinstance(value, bool)) or \
                (isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None)
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, float):
            return value.is_integer()
        return isinstance(value, int) or (isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None)
    if kind == "number":
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or isinstance(value, str)
    return True  # "any" and untyped


# --- loading --------------------------------------------------------------------------------


@functools.cache
def doc(api: str) -> Doc | None:
    """The parsed document of `api` ("compute", "tpu.v2", ...), once per process; None when
    google-api-python-client is not installed (logged once)."""
    try:
        folder = resources.files("googleapiclient.discovery_cache") / "documents"
        data = json.loads((folder / _FILES[api][0]).read_text())
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        _say_not_strict()
        return None
    return Doc(api, data)


@functools.cache
def _say_not_strict() -> None:
    log.warning("google-api-python-client is not installed: the simulator does not check requests against "
                "Google's discovery documents (pip install google-api-python-client to have it strict)")


def strict() -> bool:
    """Whether requests are held to Google's discovery documents (they are importable)."""
    return all(doc(api) is not None for api in _FILES)


def for_path(path: str) -> tuple[Doc, str] | None:
    """The document serving an HTTP path of the simulator's REST face and the path relative to its
    root; None when not strict or the path is no Google API's."""
    for prefix, api, keep in (("/compute/v1/", "compute", ""), ("/v2/", "tpu.v2", "v2/"),
                              ("/v2alpha1/", "tpu.v2alpha1", "v2alpha1/"), ("/oslogin/v1/", "oslogin", "v1/")):
        if path.startswith(prefix):
            d = doc(api)
            return (d, keep + path[len(prefix):]) if d is not None else None
    return None


def check_http(verb: str, path: str, query: dict[str, list[str]], body: bytes) -> None:
    """Refusal for an HTTP request (path unquoted, query parsed) Google refuses; nothing when
    not strict. A body that is not JSON is left to the caller's own parse error."""
    found = for_path(path)
    if found is None:
        return
    d, rel = found
    try:
        payload = json.loads(body.decode()) if body.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return
    d.check_request(verb, rel, query, payload)


# gRPC method of google.cloud.tpu.*.Tpu -> discovery method (under tpu.projects.locations.)
GRPC_METHODS = {
    "GetNode": "nodes.get", "ListNodes": "nodes.list", "CreateNode": "nodes.create", "DeleteNode": "nodes.delete",
    "StopNode": "nodes.stop", "StartNode": "nodes.start", "UpdateNode": "nodes.patch",
    "GetGuestAttributes": "nodes.getGuestAttributes", "SimulateMaintenanceEvent": "nodes.simulateMaintenanceEvent",
    "PerformMaintenance": "nodes.performMaintenance", "CreateQueuedResource": "queuedResources.create",
    "GetQueuedResource": "queuedResources.get", "ListQueuedResources": "queuedResources.list",
    "DeleteQueuedResource": "queuedResources.delete",
    "PerformMaintenanceQueuedResource": "queuedResources.performMaintenanceQueuedResource",
}


def check_grpc(version: str, method_name: str, request: dict[str, Any]) -> None:
    """Refusal for a TPU gRPC request (as `json_format.MessageToDict`: camelCase) Google refuses:
    its resource name missing or not of the method's pattern, and its body's enums and types
    (already typed by protobuf, so rarely). Nothing when not strict or the method is not mapped."""
    d = doc(f"tpu.{version}")
    mid = GRPC_METHODS.get(method_name)
    if d is None or mid is None:
        return
    method = d.by_id.get(f"tpu.projects.locations.{mid}")
    if method is None:
        return
    body_field = _camel(d._root(method)) if method.request else ""
    for name, spec in method.params.items():
        if spec.get("location") != "path":
            continue
        holder = request.get(body_field) or {} if method.verb == "PATCH" else request
        value = str(holder.get(name) or "")
        if not value:
            raise d._required(name)
        d._check_param(name, spec, value)
    if method.request:
        body = request.get(body_field) if body_field else \
            {k: v for k, v in request.items() if k not in method.params}
        d.check_body(method, body or {}, typed=True)


__all__ = ["URL_FIELDS", "Doc", "Refusal", "check_grpc", "check_http", "doc", "for_path", "strict"]
