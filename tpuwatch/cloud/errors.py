"""Turn `google.api_core` exceptions into tpuwatch errors, and say which ones are transient.

One table decides: transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, on reads
RESOURCE_EXHAUSTED/429, and a rate limit on any call) are for `tpuwatch.cloud.retry` to retry;
everything else becomes an `ApiError` (exit 3) that names the call, the gRPC code and, for
PERMISSION_DENIED, the permission - the one the API names when it names one, else the one the
call is known to need.

An HTTP 403 is not always a permission: Compute Engine answers a rate quota overrun with 403
reason `rateLimitExceeded` ("wait a minute then try your request again"), an insert beyond a
resource quota with 403 `quotaExceeded`, and a stockout can be refused at once too. The reason
(`errors[].reason` of a REST error, or a google.rpc ErrorInfo's) decides (`shortage`): a rate
limit is retried like UNAVAILABLE, reads and writes alike (a refused request did nothing); a
quota or stockout is RESOURCE_EXHAUSTED, which a create's caller queues; only a 403 with no
such reason is PERMISSION_DENIED.
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
# Reasons a refusal carries that say what ran short, whatever its HTTP status (Compute Engine's
# REST `errors[].reason`, Google's ErrorInfo reasons). RATE: a rate quota, refilled each minute:
# the same request succeeds later. QUOTA: a resource quota. CAPACITY: a stockout. Both of the
# last are RESOURCE_EXHAUSTED to a create's caller (queued within queue_timeout).
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
QUOTA_REASONS = frozenset({"quotaExceeded", "QUOTA_EXCEEDED", "RESOURCE_QUOTA_EXCEEDED"})
CAPACITY_REASONS = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                              "insufficientCapacity", "resource_availability"})

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


def reasons(exc: BaseException) -> set[str]:
    """Every reason the error carries: Compute Engine's `errors[].reason` (what google-api-core
    keeps of a REST error body as `exc.errors`) and each google.rpc ErrorInfo's."""
    if not isinstance(exc, gexc.GoogleAPICallError):
        return set()
    out = {reason for reason, _ in _error_infos(exc)}
    for item in exc.errors or ():
        reason = item.get("reason") if isinstance(item, dict) else getattr(item, "reason", None)
        if isinstance(reason, str) and reason:
            out.add(reason)
    return out


def shortage(exc: BaseException) -> str:
    """"rate", "quota" or "capacity" when the error says that ran short (`RATE_REASONS`, ...), else ""."""
    why = reasons(exc)
    if why & RATE_REASONS:
        return "rate"
    if why & QUOTA_REASONS:
        return "quota"
    if why & CAPACITY_REASONS:
        return "capacity"
    return ""


def rate_limited(exc: BaseException) -> bool:
    """A rate quota refused the request: retried until the refill (`RetryPolicy.call`'s `patient`)."""
    return shortage(exc) == "rate"


def is_transient(exc: BaseException, *, read: bool) -> bool:
    """True when the same request may succeed if sent again: a rate limit on any call (nothing
    was done, so a write is safe to send again); a quota or stockout only on a read."""
    short = shortage(exc)
    if short == "rate":
        return True
    if short and not read:
        return False  # for the create's caller to queue (recreate.classify_create_error)
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
    if shortage(exc):
        return "RESOURCE_EXHAUSTED"  # a 403 rateLimitExceeded / quotaExceeded is not a permission
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
        code = code_name(exc) if exc.grpc_status_code is not None or shortage(exc) else (exc.code or "")
        message = exc.message
    elif isinstance(exc, (ApiError, MaintenanceRefused)):
        code, message = exc.code, exc.message
    elif isinstance(exc, TpuwatchError):
        message = exc.message
    message = message or str(exc)
    original = exc.__context__
    if isinstance(original, gexc.GoogleAPICallError) and original.grpc_status_code is not None:
        message = original.message or message
        code = code or code_name(original)
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
    short = shortage(exc)
    if short == "rate":
        return ApiError(f"{call}: rate limit exceeded (HTTP {exc.code}, still refused after retries for "
                        f"a minute: {text}); tpuwatch tries again on the next poll. If it persists, another "
                        f"client shares project {project}'s rate quota, or ask for a higher one",
                        call=call, code=code)
    if short:
        what = "out of quota" if short == "quota" else "no capacity"
        return ApiError(f"{call}: {what} ({code}, HTTP {exc.code}): {text}", call=call, code=code)
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


# How the service refuses to start a maintenance early: every code that says the same request
# would fail again (not offered for this TPU type, nothing reschedulable pending, a node name or
# permission it will not take). Google does not document which code a refusal carries, so none of
# them ends the watch: the job falls back to the notice the relay passes on. A code for a request
# that may succeed when sent again (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
# INTERNAL, UNKNOWN) is an API failure like any other, tried again on a later tick.
MAINTENANCE_REFUSALS = frozenset({
    "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED",
})
