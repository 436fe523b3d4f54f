"""The audit log's writer and reader: system-event entries about nodes and workers as
Cloud Logging keeps them (unique insert ids, a receive time `log_latency` later), and
ListLogEntries with its filter, order and page tokens. The entry itself is `audit.AuditRecord`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tpuwatch.sim import audit, logfilter
from tpuwatch.sim.calls import CallMeter
from tpuwatch.sim.metadata import worker_instance_id
from tpuwatch.sim.records import (
    ApiError,
    NodeRec,
)


class AuditLog(CallMeter):
    """Writing audit entries and serving ListLogEntries."""

    def _write_audit(
        self,
        rec: NodeRec,
        method: str,
        *,
        worker: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        severity: str = "NOTICE",
        at_ns: int | None = None,
        instance: str = "",
    ) -> audit.AuditRecord:
        ts = at_ns if at_ns is not None else time.time_ns()
        insert_id = self._new_insert_id()
        entry = audit.AuditRecord(
            seq=len(self._audit),
            time_ns=ts,
            receive_ns=ts + int(self.real(self.log_latency) * 1e9),
            project=rec.project,
            zone=rec.zone,
            node=rec.name,
            worker=None if worker is None else str(worker),
            method=method,
            insert_id=insert_id,
            severity=severity,
            metadata=dict(metadata or {}),
            instance=instance,
            instance_id=worker_instance_id(rec.id, worker or 0) if instance else "",
        )
        self._audit.append(entry)
        self._touch()
        return entry

    def _new_insert_id(self) -> str:
        """An insert id no entry has yet. Call with the lock held."""
        while True:
            insert_id = f"{self._rng.getrandbits(40):010x}"
            if insert_id not in self._insert_ids:
                self._insert_ids.add(insert_id)
                return insert_id

    def system_event(self, node: str, method: str, *, worker: int | None = None,
                     project: str | None = None, zone: str | None = None) -> None:
        """Write one system-event entry about a node and do nothing else (for tests)."""
        with self._lock:
            self._write_audit(self._fault_node(node, project, zone), method, worker=worker)

    def audit_entries(self) -> list[audit.AuditRecord]:
        """Every entry written so far, visible or not (for tests)."""
        with self._lock:
            return list(self._audit)

    def list_log_entries(
        self,
        resource_names: Iterable[str],
        filter_text: str = "",
        order_by: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[audit.AuditRecord], str]:
        projects = set()
        names = list(resource_names)
        if not names:
            raise ApiError(
                "INVALID_ARGUMENT",
                "resource_names: at least one resource name is required, e.g. projects/my-project",
            )
        for r in names:
            m = re.match(r"^projects/([^/]+)$", r)
            if not m:
                raise ApiError(
                    "INVALID_ARGUMENT",
                    f"resource_names: {r!r} is not supported by the simulator; use projects/PROJECT",
                )
            projects.add(m.group(1))
        order = (order_by or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc", "timestamp"):
            raise ApiError(
                "INVALID_ARGUMENT",
                f'order_by: {order_by!r} is not supported; use "timestamp asc" or "timestamp desc"',
            )
        desc = order == "timestamp desc"
        if page_size < 0:
            raise ApiError("INVALID_ARGUMENT", "page_size must not be negative")
        size = min(page_size or 50, 1000)
        try:
            tree = logfilter.parse(filter_text or "")
        except logfilter.FilterError as exc:
            raise ApiError("INVALID_ARGUMENT", f"Invalid filter: {exc}")
        fingerprint = f"{sorted(projects)}|{filter_text}|{desc}"
        after: tuple[int, int] | None = None
        if page_token:
            after = _decode_token(page_token, fingerprint)
        now = time.time_ns()
        with self._lock:
            rows = [e for e in self._audit if e.project in projects and e.receive_ns <= now]
        rows = [e for e in rows if tree.matches(audit.filter_fields(e))]
        rows.sort(key=lambda e: (e.time_ns, e.seq), reverse=desc)
        if after is not None:
            rows = [
                e
                for e in rows
                if ((e.time_ns, e.seq) < after if desc else (e.time_ns, e.seq) > after)
            ]
        page, rest = rows[:size], rows[size:]
        token = _encode_token((page[-1].time_ns, page[-1].seq), fingerprint) if rest else ""
        return page, token


def _encode_token(key: tuple[int, int], fingerprint: str) -> str:
    import base64
    import hashlib
    import json

    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return base64.urlsafe_b64encode(json.dumps({"k": list(key), "f": digest}).encode()).decode()


def _decode_token(token: str, fingerprint: str) -> tuple[int, int]:
    import base64
    import hashlib
    import json

    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        key = (int(data["k"][0]), int(data["k"][1]))
        digest = data["f"]
    except Exception:
        raise ApiError("INVALID_ARGUMENT", f"page_token {token!r} is not valid")
    if digest != hashlib.sha256(fingerprint.encode()).hexdigest()[:16]:
        raise ApiError(
            "INVALID_ARGUMENT",
            "page_token does not match the filter, order or resource names of this request",
        )
    return key
