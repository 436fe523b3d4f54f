"""Which user the watcher is on the workers, kept in the job's journal across watchers.

OS Login gives the workers a POSIX name of its own (`alice_example_com`), which gcloud swaps in
for the local one. The watcher learns the name it really logs in as once per node incarnation
(gcloud.py) and journals it, so that
- a later watcher (cron's `check` is a new process every tick) does not run gcloud again for
  the same node id, and
- a recreated node's `tpuwatch-user` metadata names that user: the job its startup script starts
  at boot lives in the same home (`~/.tpuwatch/<job>`) the watcher probes, not in a second one.

The tick and `tpuwatch recreate` call these; they know the Workers port and the journal only
through the few methods below.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from tpuwatch.model import Login, NodeSnapshot
from tpuwatch.ports import Workers


class LoginJournal(Protocol):
    def login(self) -> dict[str, Any] | None: ...

    def set_login(self, data: Mapping[str, Any]) -> None: ...

    def add_event(self, time: datetime, kind: str, reason: str, data: Mapping[str, Any] | None = None) -> None: ...


def restore(workers: Workers, journal: LoginJournal) -> None:
    """Hand the journaled login to the workers (a gcloud transport then skips that node id)."""
    data = journal.login()
    login = Login.from_dict(data) if data else None
    if login is not None:
        workers.remember(login)


def record(workers: Workers, node: NodeSnapshot | None, journal: LoginJournal, now: datetime) -> None:
    """Journal the login the workers learned for `node`, with an event when it changed.

    Call inside the tick's transaction.
    """
    if node is None:
        return
    login = workers.login(node)
    if login is None:
        return
    before = journal.login() or {}
    if before == login.as_dict():
        return
    journal.set_login(login.as_dict())
    # an event when gcloud learned a user, or the user changed (OpenSSH's is the one configured)
    if before.get("user") != login.user and (login.via != "openssh" or before.get("user")):
        home = f" (home {login.home})" if login.home else ""
        journal.add_event(now, "login", f"logs in to {node.name} as {login.user}{home} via {login.via}",
                          login.as_dict())


def user_for_create(journal: LoginJournal) -> str:
    """The user a new node's startup script should run the job as: the journaled one, or ""."""
    data = journal.login()
    login = Login.from_dict(data) if data else None
    return login.user if login is not None else ""
