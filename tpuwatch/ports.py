"""The small protocols the tick talks to; one real adapter each, plus fakes in tests.

The policy never sees these: the tick calls them to observe and to act, and hands the
policy plain values from `tpuwatch.model`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from tpuwatch.model import AuditEvent, Checkpoint, NodeSnapshot, OperationStatus, WorkerProbe


class Clock(Protocol):
    def now(self) -> datetime: ...


class TpuApi(Protocol):
    def get_node(self, name: str) -> NodeSnapshot | None:
        """The node, or None when it does not exist."""

    def list_nodes(self) -> list[NodeSnapshot]: ...

    def delete_node(self, name: str) -> str:
        """Start a delete; returns the operation name."""

    def create_node(self, name: str, node: Mapping[str, Any], zone: str | None = None) -> str:
        """Start a create from a spec; returns the operation name."""

    def get_operation(self, name: str) -> OperationStatus: ...


class AuditLog(Protocol):
    def read(self, nodes: Iterable[str], cursor: str | None,
             instances: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[AuditEvent], str | None]:
        """Events about `nodes` (and their worker VMs, `instances`: instance name -> (node, worker id), as TpuAdapter.worker_instances gives it)
        after `cursor`, oldest first, and the new cursor (one query)."""


class Workers(Protocol):
    def probe(self, node: NodeSnapshot) -> list[WorkerProbe]: ...

    def launch(self, node: NodeSnapshot, attempt: int, checkpoint: Checkpoint | None,
               clean: bool = False) -> Sequence[Any]: ...

    def stop(self, node: NodeSnapshot) -> Sequence[Any]: ...


class CheckpointStore(Protocol):
    def latest(self) -> Checkpoint | None: ...
