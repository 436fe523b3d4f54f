"""The call meter and the error windows: every API call is counted (per method, and per
project for quota windows), and may be refused, answered late or answered with an error after it
took effect while a fault window (api-errors, deny, slow-calls, lose-responses) is open; zone
windows (stockout, reservation shortfall, quota) decide how creates fail."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable

from tpuwatch.errors import UsageError
from tpuwatch.sim.core import WorldCore
from tpuwatch.sim.records import (
    ApiError,
    NodeSpec,
    Window,
)
from tpuwatch.sim.shapes import (
    ZONE_RE,
    accelerator_generation,
    region_of,
)

INJECTABLE_CODES = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "INTERNAL",
        "PERMISSION_DENIED",
        "UNKNOWN",
    }
)


_API_ERROR_TEXT = {
    "UNAVAILABLE": "The service is currently unavailable.",
    "RESOURCE_EXHAUSTED": "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'.",
    "DEADLINE_EXCEEDED": "Deadline Exceeded",
    "INTERNAL": "Internal error encountered.",
    "UNKNOWN": "An unknown error occurred.",
}


RESERVATION_SHORTFALL = "Insufficient reserved capacity. Contact customer support to increase your reservation."


class CallMeter(WorldCore):
    """Counting API calls and the fault windows that fail them."""

    def before_call(self, method: str, resource: str = "") -> ApiError | None:
        """Count one API call; return the error to inject for it, if any.

        A `slow_calls` fault then makes it wait (on the serving thread, outside the lock): the
        call has arrived, its answer comes late.
        """
        error = self._count_call(method, resource)
        slow = self._slow
        if slow is not None and slow.active() and _method_selected(method, slow.data["methods"]):
            with self._lock:
                share = 1.0 + slow.data["jitter"] * (2 * self._err_rng.random() - 1)
            time.sleep(self.real(slow.data["latency"]) * share)
        return error

    def _count_call(self, method: str, resource: str) -> ApiError | None:
        project = _project_of(resource) or self.project
        now = time.monotonic()
        with self._lock:
            self.calls[method] += 1
            q = self._call_times.setdefault(method, deque(maxlen=100_000))
            q.append((now, project))
            denied = self._denied
            if (
                denied is not None
                and denied.active()
                and _method_selected(method, denied.data["methods"])
            ):
                self.injected[method] += 1
                perm = _permission_for(method)
                service = "compute" if method.startswith("compute.") else "tpu"
                return ApiError(
                    "PERMISSION_DENIED",
                    f"Permission '{perm}' denied on resource '//{service}.googleapis.com/{resource or 'projects/' + project}' "
                    "(or it may not exist).",
                )
            errs = self._api_errors
            # The RNG is drawn only for selected calls, so a seed gives the same failures.
            if (
                errs is not None
                and errs.active()
                and _method_selected(method, errs.data["methods"])
                and self._err_rng.random() < errs.data["rate"]
            ):
                code = self._err_rng.choice(errs.data["codes"])
                self.injected[method] += 1
                return ApiError(code, _API_ERROR_TEXT.get(code, code))
            if self.log_read_quota is not None and method.endswith("/ListLogEntries"):
                recent = sum(1 for t, p in q if p == project and now - t < 60.0)
                if recent > self.log_read_quota:
                    self.injected[method] += 1
                    return ApiError(
                        "RESOURCE_EXHAUSTED",
                        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
                        f"minute' of service 'logging.googleapis.com' for consumer 'project_number:{project}'.",
                    )
        return None

    def after_call(self, method: str) -> ApiError | None:
        """For a call that was served: the error to answer instead (`lose_responses`), if any."""
        lost = self._lost
        if lost is None or not lost.active() or not _method_selected(method, lost.data["methods"]):
            return None
        with self._lock:
            if self._err_rng.random() >= lost.data["rate"]:
                return None
            code = self._err_rng.choice(lost.data["codes"])
            self.injected[method] += 1
            self.lost[method] += 1
        return ApiError(code, _API_ERROR_TEXT.get(code, code))

    def call_count(self, suffix: str) -> int:
        """Calls whose method ends with `suffix` ("GetNode", "Tpu/GetNode", "ListLogEntries")."""
        with self._lock:
            return sum(n for m, n in self.calls.items() if m.endswith(suffix))

    def max_calls_per_window(
        self, suffix: str, window: float = 60.0, project: str | None = None
    ) -> int:
        """The most calls matching `suffix` seen in any `window` real seconds (quota checks)."""
        with self._lock:
            times = sorted(
                t
                for m, q in self._call_times.items()
                if m.endswith(suffix)
                for t, p in q
                if project is None or p == project
            )
        best, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def reset_calls(self) -> None:
        with self._lock:
            self.calls.clear()
            self._call_times.clear()
            self.injected.clear()

    def stockout(self, zone: str | None = None, duration: float | None = None, *, at_insert: bool = False) -> None:
        """Creates in `zone` ("*" = every zone) fail with the no-capacity error for a while;
        `at_insert`: a Compute Engine instance insert is refused at once rather than in its operation."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._stockouts[z] = Window(self._until(duration), {"at_insert": at_insert})
            self._touch()

    def stockout_at_insert(self, zone: str) -> bool:
        """Whether a Compute Engine insert in `zone` is refused at once for a stockout."""
        win = self._stockouts.get(zone) or self._stockouts.get("*")
        return win is not None and win.active() and bool(win.data.get("at_insert"))

    def reservation_shortfall(self, zone: str | None = None, duration: float | None = None) -> None:
        """Creates in `zone` ("*" = every zone) end with code 8 "Insufficient reserved capacity"."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._stockouts[z] = Window(self._until(duration), {"reservation": True})
            self._touch()

    def quota(
        self, zone: str | None = None, duration: float | None = None, limit: str = ""
    ) -> None:
        """CreateNode in `zone` ("*" = every zone) is refused with RESOURCE_EXHAUSTED quota text."""
        z = zone or self.zone
        if z != "*" and not ZONE_RE.match(z):
            raise UsageError(f"zone {z!r} is not a zone name such as us-central2-b")
        with self._lock:
            self._quota[z] = Window(self._until(duration), {"limit": limit})

    def api_errors(
        self,
        rate: float,
        codes: Iterable[str] = ("UNAVAILABLE",),
        *,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Fail this fraction of API calls (seeded) with these codes; methods filter by substring."""
        window = self._error_window(rate, codes, "UNAVAILABLE", methods, duration)
        with self._lock:
            self._api_errors = window

    def lose_responses(
        self,
        rate: float,
        codes: Iterable[str] = ("DEADLINE_EXCEEDED",),
        *,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Serve this fraction of matching calls (seeded), then answer with an error: the call
        took effect but the client never hears so, as after a deadline or a dropped connection."""
        window = self._error_window(rate, codes, "DEADLINE_EXCEEDED", methods, duration)
        with self._lock:
            self._lost = window

    def _error_window(self, rate: float, codes: Iterable[str], default: str, methods: Iterable[str],
                      duration: float | None) -> Window:
        """The window of an error-answering fault; UsageError for a code or rate it cannot use."""
        chosen = tuple(c.upper() for c in codes) or (default,)
        bad = [c for c in chosen if c not in INJECTABLE_CODES]
        if bad:
            raise UsageError(
                f"codes: {', '.join(bad)} cannot be injected; use {', '.join(sorted(INJECTABLE_CODES))}"
            )
        if not 0.0 <= rate <= 1.0:
            raise UsageError(f"rate must be between 0 and 1, got {rate!r}")
        return Window(self._until(duration), {"rate": rate, "codes": chosen, "methods": tuple(methods)})

    def slow_calls(
        self,
        latency: float,
        *,
        jitter: float = 0.5,
        methods: Iterable[str] = (),
        duration: float | None = None,
    ) -> None:
        """Matching calls answer `latency` simulated seconds late, give or take `jitter` of it."""
        if not latency >= 0 or not 0 <= jitter <= 1:
            raise UsageError(f"latency must be >= 0 and jitter 0..1, got {latency!r}, {jitter!r}")
        with self._lock:
            self._slow = Window(
                self._until(duration),
                {"latency": float(latency), "jitter": float(jitter), "methods": tuple(methods)},
            )

    def deny(self, *, methods: Iterable[str] = (), duration: float | None = None) -> None:
        """Every matching call fails PERMISSION_DENIED (all calls when methods is empty)."""
        with self._lock:
            self._denied = Window(self._until(duration), {"methods": tuple(methods)})

    def clear_errors(self) -> None:
        """Lift injected API errors, lost responses, slow calls, denials, stockouts and quota errors."""
        with self._lock:
            self._api_errors = self._denied = self._lost = self._slow = None
            self._stockouts.clear()
            self._quota.clear()

    def stockout_text(self, zone: str) -> str:
        return (
            f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
            "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
            f"[EID: 0x{self._rng.getrandbits(64):016x}]"
        )

    def _in_stockout(self, zone: str) -> bool:
        win = self._stockouts.get(zone) or self._stockouts.get("*")
        return win is not None and win.active()

    def _create_failure_text(self, zone: str) -> str:
        win = self._stockouts.get(zone) or self._stockouts.get("*")
        if win is not None and win.data.get("reservation"):
            # Seen by users with code 8, like a stockout, though the docs show it with code 9.
            return RESERVATION_SHORTFALL
        return self.stockout_text(zone)

    def _quota_error(self, zone: str, spec: NodeSpec) -> ApiError | None:
        win = self._quota.get(zone) or self._quota.get("*")
        if win is None or not win.active():
            return None
        limit = win.data.get("limit") or (
            f"TPU{accelerator_generation(spec.accelerator_type)}"
            f"{'Preemptible' if spec.spot or spec.preemptible else ''}PerProjectPerRegionForTPUAPI"
        )
        return ApiError(
            "RESOURCE_EXHAUSTED",
            f"Quota limit '{limit}' has been exceeded. Limit: 0 in region {region_of(zone)}.",
        )


    def compute_quota_text(self, zone: str, machine_type: str, spot: bool) -> str:
        """The text of Compute Engine's 403 quotaExceeded refusing an instance insert in `zone`
        while a quota window is open there ("" when none is): "Quota 'X' exceeded. Limit: 0.0
        in region R.", Compute Engine's wording. The quota's name is the window's `limit`, else
        one shaped like Compute Engine's (PREEMPTIBLE_ for Spot, as PREEMPTIBLE_CPUS)."""
        win = self._quota.get(zone) or self._quota.get("*")
        if win is None or not win.active():
            return ""
        family = machine_type.split("-", 1)[0]
        generation = {"tpu7x": "V7X", "ct6e": "V6E", "ct5p": "V5P", "ct5lp": "V5E", "ct4p": "V4"}.get(
            family, family.upper())
        limit = win.data.get("limit") or f"{'PREEMPTIBLE_' if spot else ''}TPU_{generation}_CHIPS"
        return f"Quota '{limit}' exceeded. Limit: 0.0 in region {region_of(zone)}."


def _project_of(resource: str) -> str | None:
    m = re.match(r"^projects/([^/]+)", resource or "")
    return m.group(1) if m else None


def _method_selected(method: str, selectors: tuple[str, ...]) -> bool:
    return not selectors or any(s.lower() in method.lower() for s in selectors)


def _permission_for(method: str) -> str:
    short = method.rsplit("/", 1)[-1]
    if short == "ListLogEntries":
        return "logging.logEntries.list"
    if method.startswith("compute.v1."):  # compute.v1.InstanceGroupManagers/Get -> compute.instanceGroupManagers.get
        kind = method[len("compute.v1."):].split("/", 1)[0]
        kind = {"ZoneOperations": "zoneOperations", "RegionOperations": "regionOperations",
                "GlobalOperations": "globalOperations"}.get(kind, kind[:1].lower() + kind[1:])
        return f"compute.{kind}.{short[:1].lower() + short[1:]}"
    verb = re.sub(r"(?<!^)(?=[A-Z])", "_", short).lower().split("_")
    resource = "nodes"
    if "queued" in verb:
        resource = "queuedResources"
    elif "operation" in verb or "operations" in verb:
        resource = "operations"
    return f"tpu.{resource}.{verb[0]}"
