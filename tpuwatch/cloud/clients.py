"""The one place that builds Google API clients.

With `TPUWATCH_EMULATOR_HOST=host:port` every TPU (v2, v2alpha1), long-running-operation and
Logging call goes over plain gRPC to that address with anonymous credentials, the same
convention as `PUBSUB_EMULATOR_HOST`. Otherwise the clients use Application Default
Credentials as usual. Nothing else in tpuwatch knows whether it talks to Google.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from functools import lru_cache
from typing import Any

from tpuwatch.errors import CloudError, UsageError

EMULATOR_ENV = "TPUWATCH_EMULATOR_HOST"
# The simulator's REST face for Compute Engine (`http://host:port`; the client appends /compute/v1).
COMPUTE_EMULATOR_ENV = "TPUWATCH_COMPUTE_EMULATOR"
_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


def emulator_host() -> str | None:
    """The validated emulator address, or None when talking to Google."""
    value = os.environ.get(EMULATOR_ENV)
    if value is None or value == "":
        return None
    value = value.strip()
    if value.startswith(("http://", "https://")):
        value = value.split("://", 1)[1].rstrip("/")
    if not _HOSTPORT.match(value) or not 0 < int(value.rsplit(":", 1)[1]) < 65536:
        raise UsageError(
            f"{EMULATOR_ENV}={os.environ[EMULATOR_ENV]!r} is not host:port; "
            "use the line `tpuwatch sim serve` prints, e.g. 127.0.0.1:8470"
        )
    return value


@lru_cache(maxsize=4)
def _channel(host: str) -> Any:
    import grpc

    return grpc.insecure_channel(host)


def _credentials() -> Any:
    """ADC, or a CloudError that says how to log in."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError as exc:
        raise CloudError(
            "no Google Cloud credentials found; run `gcloud auth application-default login` "
            f"(or set GOOGLE_APPLICATION_CREDENTIALS) ({exc})"
        ) from None
    return creds


def tpu_client(version: str = "v2") -> Any:
    """A `google.cloud.tpu_v2.TpuClient` (or v2alpha1 with version="v2alpha1")."""
    if version == "v2":
        from google.cloud import tpu_v2 as mod
        from google.cloud.tpu_v2.services.tpu.transports.grpc import TpuGrpcTransport as T
    elif version == "v2alpha1":
        from google.cloud import tpu_v2alpha1 as mod  # type: ignore[no-redef]
        from google.cloud.tpu_v2alpha1.services.tpu.transports.grpc import (  # type: ignore[assignment]
            TpuGrpcTransport as T,
        )
    else:  # pragma: no cover - programming error
        raise ValueError(version)
    host = emulator_host()
    if host:
        return mod.TpuClient(transport=T(channel=_channel(host)))
    return mod.TpuClient(credentials=_credentials())


def compute_emulator() -> str | None:
    """The validated Compute Engine emulator URL, or None when talking to Google."""
    value = (os.environ.get(COMPUTE_EMULATOR_ENV) or "").strip().rstrip("/")
    if not value:
        return None
    host = value.split("://", 1)[1] if value.startswith(("http://", "https://")) else ""
    if not _HOSTPORT.match(host):
        raise UsageError(f"{COMPUTE_EMULATOR_ENV}={os.environ[COMPUTE_EMULATOR_ENV]!r} is not http://host:port; "
                         "use the line `tpuwatch sim serve` prints")
    return value


# Compute Engine resource kind -> its google-cloud-compute client class name
_COMPUTE_CLIENTS = {
    "instances": "InstancesClient",
    "disks": "DisksClient",
    "instanceGroupManagers": "InstanceGroupManagersClient",
    "instanceGroupManagerResizeRequests": "InstanceGroupManagerResizeRequestsClient",
    "instanceTemplates": "InstanceTemplatesClient",
    "regionInstanceTemplates": "RegionInstanceTemplatesClient",
    "resourcePolicies": "ResourcePoliciesClient",
    "zoneOperations": "ZoneOperationsClient",
    "regionInstanceGroupManagers": "RegionInstanceGroupManagersClient",
    "regionOperations": "RegionOperationsClient",
    "regionInstanceGroupManagerResizeRequests": "RegionInstanceGroupManagerResizeRequestsClient",
}


def compute_available() -> bool:
    """Whether Compute Engine may be asked: not while the TPU API goes to a simulator that the
    Compute Engine calls would not (they would reach Google)."""
    return compute_emulator() is not None or emulator_host() is None


_COMPUTE_V1 = "google.cloud.compute_v1"
_COMPUTE_V1_LOCK = threading.Lock()
# `from .services.instances import InstancesClient` / `from .types.compute import (A, B, ...)`
_FROM_IMPORT = re.compile(r"^from \.([\w.]+) import (?:\(([^)]*)\)|([\w, ]+)$)", re.M)


def compute_v1() -> Any:
    """`google.cloud.compute_v1`, loading only the services used.

    Its package imports all of its ~130 services at once: 1.5 s of CPU, most of a `tpuwatch check`
    on Compute Engine. Its `__lazy_modules__` lets Python 3.15 defer them (PEP 810); on older
    Pythons this does the same: the package is entered without running its __init__, and a name
    is imported from the module its __init__ takes it from (as written there) when first used.
    A process that had already imported the whole package keeps it."""
    with _COMPUTE_V1_LOCK:
        loaded = sys.modules.get(_COMPUTE_V1)
        if loaded is not None:
            return loaded
        import importlib
        import importlib.util
        import types

        spec = importlib.util.find_spec(_COMPUTE_V1)
        if spec is None or spec.origin is None or spec.submodule_search_locations is None:
            return importlib.import_module(_COMPUTE_V1)  # not a plain package: as it is
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        where: dict[str, str] = {}
        for m in _FROM_IMPORT.finditer(source):
            for name in re.split(r"[\s,]+", m.group(2) or m.group(3)):
                if name:
                    where[name] = m.group(1)
        pkg = types.ModuleType(_COMPUTE_V1)
        pkg.__spec__ = spec
        pkg.__file__ = spec.origin
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__package__ = _COMPUTE_V1

        def attribute(name: str) -> Any:
            if name == "__version__":
                value = importlib.import_module(f"{_COMPUTE_V1}.gapic_version").__version__
            elif name in where:
                value = getattr(importlib.import_module(f"{_COMPUTE_V1}.{where[name]}"), name)
            elif not name.startswith("__") and importlib.util.find_spec(f"{_COMPUTE_V1}.{name}") is not None:
                value = importlib.import_module(f"{_COMPUTE_V1}.{name}")  # a subpackage: types, services
            else:
                raise AttributeError(f"module {_COMPUTE_V1!r} has no attribute {name!r}")
            setattr(pkg, name, value)
            return value

        pkg.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[_COMPUTE_V1] = pkg
        import google.cloud

        google.cloud.compute_v1 = pkg  # type: ignore[attr-defined]
        return pkg


def compute_client(kind: str) -> Any:
    """A `google.cloud.compute_v1` client of `kind` (instances, instanceGroupManagers,
    instanceTemplates, resourcePolicies, zoneOperations): REST, against the emulator's URL with
    anonymous credentials when TPUWATCH_COMPUTE_EMULATOR is set. Every client is built here with
    the same options, so an operation is never polled through a client that would reach Google."""
    cls = getattr(compute_v1(), _COMPUTE_CLIENTS[kind])
    url = compute_emulator()
    if url:
        from google.auth.credentials import AnonymousCredentials

        return cls(credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
    if not compute_available():
        raise UsageError(f"{EMULATOR_ENV} is set but {COMPUTE_EMULATOR_ENV} is not: tpuwatch will not send "
                         "Compute Engine calls to Google while the TPU API goes to a simulator; set both")
    return cls(credentials=_credentials())


def logging_client() -> Any:
    """A `google.cloud.logging_v2` GAPIC `LoggingServiceV2Client`."""
    from google.cloud.logging_v2.services.logging_service_v2 import LoggingServiceV2Client
    from google.cloud.logging_v2.services.logging_service_v2.transports.grpc import (
        LoggingServiceV2GrpcTransport,
    )

    host = emulator_host()
    if host:
        return LoggingServiceV2Client(transport=LoggingServiceV2GrpcTransport(channel=_channel(host)))
    return LoggingServiceV2Client(credentials=_credentials())


def storage_client(project: str | None = None) -> Any:
    """A `google.cloud.storage.Client`; it honours STORAGE_EMULATOR_HOST by itself."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "test", credentials=AnonymousCredentials())
    return storage.Client(project=project, credentials=_credentials())
