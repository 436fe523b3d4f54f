"""Turn `google.api_core` exceptions into tpuwatch errors, and say which ones are transient.

One table decides: transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, and on reads
RESOURCE_EXHAUSTED/429) are for `tpuwatch.cloud.retry` to retry; everything else becomes an
`ApiError` (exit 3) that names the call, the gRPC code and, for PERMISSION_DENIED, the
permission - the one the API names when it names one, else the one the call is known to need.
This module knows the Google error types but no client, node or log entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from google.api_core import exceptions as gexc

from tpuwatch.errors import CloudError, MaintenanceRefused, TpuwatchError

# Codes worth another try: the request may not have been served.
_TRANSIENT = (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError)
# A 429 on a read is quota throttling (Logging: 60 reads/min/project); on a create it means
# "no quota for TPUs", a decision for the policy rather than a retry loop here.
_THROTTLED = (gexc.ResourceExhausted, gexc.TooManyRequests)
_PERMISSION_RX = re.compile(
    r"[Pp]ermissions?\s+['\"]?([a-z][a-zA-Z0-9]*(?:\.[a-zA-Z0-9]+){2,})['\"]?"
)
_SERVICE_DISABLED_RX = re.compile(r"has not been used in project|is disabled|SERVICE_DISABLED")

# google.rpc.Code numbers: the only table of them (operations and queued resources carry numbers).
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
CODE_NUMBERS = {name: number for number, name in CODE_NAMES.items()}

LOGIN_HINT = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"


@dataclass(frozen=True)
class Call:
    """What tpuwatch was doing: shown in every error message."""

    api: str  # "TPU API", "Logging API"
    method: str  # "get_node"
    target: str  # resource name the call was about
    needs: str  # the IAM permission this call requires, e.g. "tpu.nodes.get"
    service: str  # the service to enable, e.g. "tpu.googleapis.com"
    role: str = "roles/tpu.viewer"  # a predefined role that grants `needs`

    def __str__(self) -> str:
        return f"{self.api} {self.method}({self.target})"


class ApiError(CloudError):
    """A cloud call that failed for good (exit 3); `code` is the gRPC code name."""

    def __init__(
        self, message: str, *, call: Call, code: str, permission: str = "", exit_code: int | None = None
    ) -> None:
        super().__init__(message, exit_code=exit_code)
        self.call = call
        self.code = code
        self.permission = permission


def is_transient(exc: BaseException, *, read: bool) -> bool:
    """True when the same request may succeed if sent again."""
    if isinstance(exc, _TRANSIENT):
        return True
    if read and isinstance(exc, _THROTTLED):
        return True
    try:
        from google.auth.exceptions import TransportError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, TransportError)


def code_name(exc: BaseException) -> str:
    """The gRPC code name of an api_core error ("PERMISSION_DENIED"), else the class name."""
    grpc_code = getattr(exc, "grpc_status_code", None)
    if grpc_code is not None:
        return str(grpc_code.name)
    http = getattr(exc, "code", None)
    return {
        400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
        409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
    }.get(http if isinstance(http, int) else -1, type(exc).__name__)


def api_failure(exc: BaseException) -> tuple[int | str, str]:
    """(code, the API's own words) of an error a cloud call raised; code "" when it has none.

    The code is the gRPC code name, else what the error carries (an HTTP status, a tpuwatch
    error's code). The adapter wraps Google errors (raise ... from None keeps the original as
    __context__): the API's own words and code are read through the wrapper.
    """
    code: int | str = ""
    message = ""
    if isinstance(exc, gexc.GoogleAPICallError):
        code = exc.grpc_status_code.name if exc.grpc_status_code is not None else (exc.code or "")
        message = exc.message
    elif isinstance(exc, (ApiError, MaintenanceRefused)):
        code, message = exc.code, exc.message
    elif isinstance(exc, TpuwatchError):
        message = exc.message
    message = message or str(exc)
    original = exc.__context__
    if isinstance(original, gexc.GoogleAPICallError) and original.grpc_status_code is not None:
        message = original.message or message
        code = code or original.grpc_status_code.name
    return code, message


def _error_infos(exc: gexc.GoogleAPICallError) -> Iterable[tuple[str, dict[str, str]]]:
    """(reason, metadata) of every google.rpc.ErrorInfo the error carries."""
    if exc.reason:
        yield str(exc.reason), dict(exc.metadata or {})
    for d in exc.details or ():
        reason = getattr(d, "reason", None)
        meta = getattr(d, "metadata", None)
        if isinstance(reason, str) and reason:
            yield reason, dict(meta or {})


def named_permission(exc: gexc.GoogleAPICallError) -> str:
    """The IAM permission the API says is missing, or ""."""
    for _, meta in _error_infos(exc):
        if meta.get("permission"):
            return str(meta["permission"])
    m = _PERMISSION_RX.search(exc.message or "")
    return m.group(1) if m else ""


def service_disabled(exc: gexc.GoogleAPICallError) -> bool:
    if any(reason == "SERVICE_DISABLED" for reason, _ in _error_infos(exc)):
        return True
    return bool(_SERVICE_DISABLED_RX.search(exc.message or ""))


def translate(exc: BaseException, call: Call, *, project: str) -> CloudError:
    """A CloudError (exit 3) that says which call failed, why, and what to do."""
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError

    if isinstance(exc, (DefaultCredentialsError, RefreshError)):
        return ApiError(f"{call}: credentials rejected ({exc}); {LOGIN_HINT}", call=call, code="UNAUTHENTICATED")
    if isinstance(exc, TransportError):
        return ApiError(f"{call}: cannot reach the API ({exc}); check the network", call=call, code="UNAVAILABLE")
    if not isinstance(exc, gexc.GoogleAPICallError):
        return ApiError(f"{call}: {type(exc).__name__}: {exc}", call=call, code=type(exc).__name__)
    code = code_name(exc)
    text = exc.message or str(exc)
    if service_disabled(exc):
        return ApiError(
            f"{call}: the {call.api} is disabled in project {project}; enable it with "
            f"`gcloud services enable {call.service} --project {project}` ({text})",
            call=call, code=code,
        )
    if isinstance(exc, (gexc.PermissionDenied, gexc.Forbidden)):
        perm = named_permission(exc)
        what = f"missing permission {perm}" if perm else f"permission denied (this call needs {call.needs})"
        return ApiError(
            f"{call}: {what} in project {project}; grant it to your account or service account "
            f"(e.g. {call.role}) ({text})",
            call=call, code=code, permission=perm or call.needs,
        )
    if isinstance(exc, (gexc.Unauthenticated, gexc.Unauthorized)):
        return ApiError(f"{call}: not authenticated ({text}); {LOGIN_HINT}", call=call, code=code)
    if isinstance(exc, (*_TRANSIENT, *_THROTTLED)):
        return ApiError(f"{call}: {code}, still failing after retries ({text}); try again later",
                        call=call, code=code)
    return ApiError(f"{call}: {code}: {text}", call=call, code=code)
