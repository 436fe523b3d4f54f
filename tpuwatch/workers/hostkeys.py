"""Host keys pinned from what the TPU API publishes, not trusted on first use.

Every TPU VM worker publishes its SSH host keys as guest attributes (namespace `hostkeys`).
Those are the known hosts: the first time tpuwatch meets a node id, and again whenever a worker
presents a key that does not match, it reads them and writes them, and only them, under
`HostKeyAlias=tpuwatch-<node id>-w<n>` into its own known_hosts file (lines marked
`tpuwatch-published`), and ssh checks strictly. So a key the attributes publish is accepted even
if it changed (a re-imaged worker), and a key they do not publish is refused before anything
runs on that worker. Only for a worker that publishes no keys (guest attributes turned off by
an organization policy, an old VM), or whose keys tpuwatch may not read (the read refused for
lack of a permission: `HostKeysRefused`), does ssh trust the first key it sees (accept-new), and
tpuwatch warns, once a run; with `trust_first_use` false ([ssh] trust_first_use) it refuses to
connect to such a worker instead (JobFailed: a person must grant the permission or publish the
keys).

This module knows nothing of the TPU API (the keys come from a callable) nor of jobs or policy.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tpuwatch.errors import HostKeysRefused, JobFailed
from tpuwatch.model import NodeSnapshot, WorkerEndpoint

# node -> worker index -> ("ssh-ed25519 AAAA...", ...); workers that publish none are absent
HostKeySource = Callable[[NodeSnapshot], Mapping[int, Sequence[str]]]
MARK = "tpuwatch-published"  # the comment on known_hosts lines written from the API
# A worker that published no keys is asked again this often: its guest agent may publish them
# late, and from then on its keys are checked strictly. When it was last asked is kept in the
# file (a comment line ssh ignores), so cron's separate `check` runs ask again too.
REREAD_UNPUBLISHED = 600.0
ASKED = "# tpuwatch-no-keys"  # "# tpuwatch-no-keys <alias> <unix time the API was last asked>"
_PRESENTED = re.compile(r"key sent by the remote host is\s+(SHA256:[A-Za-z0-9+/=]+)")


def alias(node: NodeSnapshot, worker: WorkerEndpoint | int) -> str:
    """The name host keys are pinned under: one per node id (a recreated node has a new id) and worker."""
    index = worker if isinstance(worker, int) else worker.index
    return f"tpuwatch-{node.id or node.name}-w{index}"


def fingerprint(key: str) -> str:
    """`ssh-ed25519 AAAA...` -> `SHA256:...`, as `ssh-keygen -l` prints it."""
    parts = key.split()
    try:
        blob = base64.b64decode(parts[1] if len(parts) > 1 else parts[0], validate=True)
    except (binascii.Error, IndexError):
        return "(not a key)"
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def presented_fingerprint(stderr: str) -> str:
    """The fingerprint of the key the worker sent, from ssh's mismatch warning ("" when absent)."""
    m = _PRESENTED.search(stderr)
    return m.group(1) if m else ""


class PinnedHostKeys:
    """The known_hosts file of one transport, kept in step with the workers' published keys."""

    def __init__(self, known_hosts: Path, source: HostKeySource,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 trust_first_use: bool = True) -> None:
        self.known_hosts = known_hosts
        self.source = source
        self.trust_first_use = trust_first_use
        self.refused: HostKeysRefused | None = None  # the last read of published keys was refused
        self._refusal_said = False
        self.clock = clock
        self.wall = wall
        self.published: dict[str, tuple[str, ...]] = {}  # alias -> keys the API published
        self.unpublished: dict[str, float] = {}  # alias -> when the API last published none for it
        self.notes: list[str] = []  # for the person watching (trust on first use), taken by the caller

    def strict(self, name: str) -> bool:
        """Whether ssh must find the key in known_hosts (it was published) or may add it (it was not)."""
        return name in self.published

    def prepare(self, node: NodeSnapshot, workers: Sequence[WorkerEndpoint]) -> None:
        """Before connecting: the published keys of any worker not known yet (one API read per
        node id; none at all while the file already holds lines for every worker)."""
        on_file, asked = self._read_file()
        todo = False
        for w in workers:
            name = alias(node, w)
            if name in self.unpublished:
                # without trust on first use nothing was connected to: ask again before refusing
                todo = todo or not self.trust_first_use or self.clock() - self.unpublished[name] >= REREAD_UNPUBLISHED
                continue
            if name in self.published:
                continue
            keys = tuple(k for k, marked in on_file.get(name, ()) if marked)
            if keys:
                self.published[name] = keys
            elif self.trust_first_use and name in asked and self.wall() - asked[name] < REREAD_UNPUBLISHED:
                # lines ssh added itself (accept-new) for a worker that published nothing when
                # another run asked lately: ssh checks them; asked again when that is old
                self.unpublished[name] = self.clock() - max(0.0, self.wall() - asked[name])
            else:
                todo = True
        if todo:
            self.refresh(node)
        self._require_keys(node, workers)

    def _require_keys(self, node: NodeSnapshot, workers: Sequence[WorkerEndpoint]) -> None:
        """With trust_first_use false: JobFailed for any worker whose keys were not read."""
        if self.trust_first_use:
            return
        missing = [w.index for w in workers if alias(node, w) not in self.published]
        if not missing:
            return
        why, fix = ((f"reading them was refused ({self.refused.message})", f"grant {self.refused.permission}")
                    if self.refused is not None else
                    ("their guest attributes publish none (hostkeys/)",
                     "turn guest attributes on (metadata enable-guest-attributes = TRUE, and no organization "
                     "policy compute.disableGuestAttributesAccess)"))
        raise JobFailed(
            f"refusing to connect to worker(s) {', '.join(map(str, missing))} of {node.name} (node id {node.id}): "
            f"their SSH host keys cannot be read from Google: {why}, and ssh.trust_first_use = false forbids "
            f"trusting the first key a worker presents; nothing was run there. Either {fix}, or set "
            "ssh.trust_first_use = true to accept that risk")

    def _published(self, part: NodeSnapshot) -> dict[int, tuple[str, ...]]:
        """The part's published keys by worker; none, said loudly once, when the read is refused."""
        try:
            published = {int(k): tuple(v) for k, v in self.source(part).items()}
        except HostKeysRefused as exc:
            self.refused = exc
            if not self._refusal_said:
                self._refusal_said = True
                then = ("trusting the first key each worker presents (trust on first use): whoever answers at "
                        "a worker's address the first time is believed, so a machine in the middle then would be "
                        "trusted for the node's life; set ssh.trust_first_use = false to refuse instead"
                        if self.trust_first_use else "refusing to connect (ssh.trust_first_use = false)")
                self.notes.append(
                    f"WARNING: cannot read the SSH host keys node {part.name} publishes: {exc.message}. Grant "
                    f"{exc.permission} (e.g. roles/compute.viewer or roles/tpu.viewer) so tpuwatch can check each "
                    f"worker's key; until then {then}")
            return {}
        self.refused = None
        return published

    def refresh(self, node: NodeSnapshot) -> None:
        """Read the node's published keys again and make them the known hosts of its workers."""
        keys: dict[int, tuple[str, ...]] = {}
        for i, part in enumerate(node.slices or (node,)):  # a multislice job: each slice's own keys
            published = self._published(part) if part.name else {}
            for w in node.workers:
                if (w.slice == i or not node.slices) and published.get(w.worker_id):
                    keys[w.index] = published[w.worker_id]
        fresh: dict[str, tuple[str, ...]] = {}
        newly_unpublished = []
        _, asked = self._read_file()  # another run said so already
        for w in node.workers:
            name = alias(node, w)
            if keys.get(w.index):
                fresh[name] = keys[w.index]
                self.unpublished.pop(name, None)
                continue
            if name not in self.unpublished:
                self.published.pop(name, None)
                if name not in asked:
                    newly_unpublished.append(w.index)
            self.unpublished[name] = self.clock()
        if newly_unpublished and self.refused is None and self.trust_first_use:
            self.notes.append(
                f"WARNING: node {node.name} (id {node.id}) publishes no SSH host keys for worker(s) "
                f"{', '.join(map(str, newly_unpublished))} (guest attributes hostkeys/): trusting the first "
                f"key each presents (trust on first use), pinned in {self.known_hosts}; set "
                "ssh.trust_first_use = false to refuse such workers instead")
        self._write(fresh, {alias(node, w) for w in node.workers if not keys.get(w.index)})
        self.published.update(fresh)
        self._require_keys(node, node.workers)

    def describe_mismatch(self, node: NodeSnapshot, worker: WorkerEndpoint, address: str, stderr: str) -> str:
        """A refused host key, named: worker, alias, what it presented, what the API publishes."""
        name = alias(node, worker)
        sent = presented_fingerprint(stderr) or "a key"
        where = f"worker {worker.index} of {node.name} (node id {node.id}, {address}, alias {name})"
        if name in self.published:
            listed = ", ".join(fingerprint(k) for k in self.published[name])
            return (f"{where} presented {sent}, which is not among the host keys its guest attributes publish "
                    f"({listed}, read again just now); nothing was run there. This is not the VM the TPU API "
                    "describes (or it was re-imaged and has not published its new keys yet): check who changed "
                    "it; tpuwatch accepts any key the API publishes")
        return (f"{where} presented {sent}, which differs from the key trusted on first use in {self.known_hosts}; "
                "the node publishes no host keys to check it against, so nothing was run there. If you trust "
                f"the new key, remove the old one with `ssh-keygen -R {name} -f {self.known_hosts}` and retry")

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    # -- the file -----------------------------------------------------------------------------

    def _read_file(self) -> tuple[dict[str, list[tuple[str, bool]]], dict[str, float]]:
        """alias -> [(\"type base64\", written from the API)] for every line of the file, and
        alias -> when the API was last asked and published none for it."""
        out: dict[str, list[tuple[str, bool]]] = {}
        asked: dict[str, float] = {}
        try:
            text = self.known_hosts.read_text()
        except FileNotFoundError:
            return out, asked
        for line in text.splitlines():
            parts = line.split()
            if line.startswith(ASKED + " ") and len(parts) == 4:
                try:
                    asked[parts[2]] = float(parts[3])
                except ValueError:
                    pass
            elif len(parts) >= 3 and not line.startswith("#"):
                for host in parts[0].split(","):
                    out.setdefault(host, []).append((f"{parts[1]} {parts[2]}", MARK in parts[3:]))
        return out, asked

    def _write(self, fresh: Mapping[str, tuple[str, ...]], unpublished: set[str]) -> None:
        """Replace the lines of the `fresh` aliases, stamp when the `unpublished` ones were asked,
        keep every other line; under a lock, atomically."""
        if not fresh and not unpublished:
            return
        path = self.known_hosts
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(str(path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                old = path.read_text().splitlines()
            except FileNotFoundError:
                old = []
            stamped = set(fresh) | unpublished
            keep = [ln for ln in old
                    if not (ln.startswith(ASKED + " ") and ln.split()[2:3] and ln.split()[2] in stamped)
                    and not (not ln.startswith("#") and ln.split() and set(ln.split()[0].split(",")) & set(fresh))]
            new = [f"{name} {key} {MARK}" for name, keys in fresh.items() for key in keys]
            new += [f"{ASKED} {name} {self.wall():.0f}" for name in sorted(unpublished)]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("\n".join(keep + new) + "\n")
            os.chmod(tmp, 0o600)
            tmp.replace(path)
