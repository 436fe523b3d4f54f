"""Host faults of the simulated workers: what makes each environment check fail on one worker
(the checks are tpuwatch/workers/precheck.sh).

Each fault changes what the worker-side script measures, by the same means a real host would:

- `device-missing`: the last chips' device files vanish (a dead chip) and stay gone across
  reboots; only a recreate (new hosts) or a repair of the host (`repair`) brings them back.
- `stale-lockfile`: `/tmp/libtpu_lockfile` that no process holds (a crashed TPU program); a
  reboot empties `/tmp`.
- `dns-failure`: the worker's resolver answers nothing for its peers, until the node is
  recreated. The simulated workers share this machine's resolver, so each worker resolves through
  its own hosts file, named by `TPUWATCH_SIM_HOSTS` (read by precheck.sh only when set; a real VM
  never sets it).
- `orphan-holder`: a process outside any job keeps a chip's device open (killed by the worker
  cleanup, or a reboot).
- `tpu-fault`: the TPU cannot be opened (libtpu's "TPU initialization failed ... Device or
  resource busy", written to `run/tpu-fault` under the host root for the job to meet), across
  reboots and cleanups, until the host is repaired (`repair`).
- `disk-full`: a small tmpfs mounted over the worker's root filesystem (its host root) or a path
  in its home, filled until only `free` bytes are left; `small-shm`: a tmpfs of `size` mounted
  at the worker's `/dev/shm`. Both need root (mount); they last until the node is deleted, and
  the hosts unmount them on destroy and close.

Called by tpuwatch.sim.hosts on its event loop thread, with the worker's record; this module
knows nothing of the TPU API or of when a fault happens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tpuwatch.errors import UsageError


# What the faults need of a simulated host and its node (tpuwatch.sim.hosts, which calls this
# module): protocols here, so the two modules do not import each other.
class _Peer(Protocol):
    ip: str
    index: int


class _Node(Protocol):
    key: str
    node_id: str
    vfio: bool
    chips_per_host: int

    @property
    def workers(self) -> Sequence[_Peer]: ...


class _Worker(Protocol):
    index: int
    faults: dict[str, Any]

    @property
    def home(self) -> Path: ...

    @property
    def host_root(self) -> Path: ...

    @property
    def node(self) -> _Node: ...


class Hosts(Protocol):
    enter_cgroup: str  # shell text that moves the shell into its worker's cgroup

    def worker_env(self, w: Any) -> dict[str, str]: ...

    def _make_host_root(self, w: Any) -> None: ...

KINDS = ("device-missing", "stale-lockfile", "dns-failure", "orphan-holder", "disk-full", "small-shm", "tpu-fault")
# Faults of the host's hardware: they outlive reboots, and a repair of the host (Compute Engine's
# reportHostAsFaulty) ends them.
HARDWARE = ("device-missing", "tpu-fault")
# `tpu-fault`: the host's TPU cannot be opened, whatever the cleanup does. The file holds what
# libtpu says then; a job on the simulator reads it where libtpu would fail (the e2e tests' jobs).
TPU_FAULT_FILE = "run/tpu-fault"
TPU_FAULT_TEXT = ("RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: "
                  "open(/dev/vfio/0): Device or resource busy: Device or resource busy; Couldn't open iommu group "
                  "/dev/vfio/0")
MOUNT_KINDS = ("disk-full", "small-shm")
HOSTS_FILE = "etc/hosts"  # under the worker's host root
FILL = 16 * 2**20  # bytes written into a disk-full tmpfs: it is nearly full, not empty and small


def can_mount() -> bool:
    return os.geteuid() == 0


def hostname(node_id: str, worker: int) -> str:
    """A TPU VM worker's host name: t1v-n-<node>-w-<i>."""
    return f"t1v-n-{int(node_id) % 16**8:08x}-w-{worker}" if node_id.isdigit() else f"t1v-n-{node_id}-w-{worker}"


def hosts_path(w: _Worker) -> Path:
    return w.host_root / HOSTS_FILE


def device_files(w: _Worker) -> list[Path]:
    """The worker's chip device files, in chip order."""
    dev = w.host_root / "dev"
    if w.node.vfio:
        return [dev / "vfio" / str(c) for c in range(w.node.chips_per_host)]
    return [dev / f"accel{c}" for c in range(w.node.chips_per_host)]


def reapply(hosts: Hosts, w: _Worker) -> None:
    """After the host root is (re)made at boot or reboot: the worker's hosts file, and the faults
    that outlive a reboot (dead chips, a TPU that cannot be opened, a broken resolver)."""
    missing = int(w.faults.get("device-missing", 0))
    if missing:
        for f in device_files(w)[-missing:]:
            f.unlink(missing_ok=True)
    if w.faults.get("tpu-fault"):
        marker = w.host_root / TPU_FAULT_FILE
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(TPU_FAULT_TEXT + "\n")
    write_hosts_file(w)


def repair(w: _Worker) -> None:
    """The host's hardware repaired: its hardware faults end (the next boot makes its devices again)."""
    for kind in HARDWARE:
        w.faults.pop(kind, None)
    (w.host_root / TPU_FAULT_FILE).unlink(missing_ok=True)


def write_hosts_file(w: _Worker) -> None:
    path = hosts_path(w)
    path.parent.mkdir(parents=True, exist_ok=True)
    if w.faults.get("dns-failure"):
        path.write_text("# dns-failure: this worker resolves nothing\n")
        return
    lines = [f"{peer.ip} {hostname(w.node.node_id, peer.index)}" for peer in w.node.workers]
    path.write_text("\n".join(lines) + "\n")


def apply(hosts: Hosts, w: _Worker, kind: str, params: dict[str, Any]) -> None:
    if kind == "device-missing":
        count = max(1, int(params.get("count", 1)))
        w.faults[kind] = min(w.node.chips_per_host, max(count, int(w.faults.get(kind, 0))))
        reapply(hosts, w)
    elif kind == "tpu-fault":
        w.faults[kind] = True
        reapply(hosts, w)
    elif kind == "stale-lockfile":
        lock = w.host_root / "tmp" / "libtpu_lockfile"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("")
    elif kind == "dns-failure":
        w.faults[kind] = True
        write_hosts_file(w)
    elif kind == "orphan-holder":
        dev = device_files(w)
        present = [d for d in dev if d.exists()]
        if not present:
            raise UsageError(f"worker {w.index} of {w.node.key} has no TPU device left to hold")
        # Detached (bash exits at once, init adopts the sleep), with the worker's environment
        # so that the hosts find and kill it with the worker's other processes.
        subprocess.run(["/bin/bash", "-c", hosts.enter_cgroup + 'nohup sleep 86400 3<"$1" </dev/null >/dev/null 2>&1 & disown', "_",
                        str(present[0])], env=hosts.worker_env(w), check=True, timeout=10)
    elif kind == "disk-full":
        free = int(params.get("free", 10e6))
        path = str(params.get("path") or "/")
        mountpoint = _where(w, path)
        _mount(w, kind, mountpoint, free + FILL)
        (mountpoint / ".tpuwatch-sim-fill").write_bytes(b"\0" * FILL)
        if mountpoint == w.host_root:
            # A new root filesystem: the host's devices, /tmp and /dev/shm are made again on it.
            # /dev/shm is a filesystem of its own on a TPU VM, not part of the root disk: its
            # size stays what it was (tmpfs's default of half the memory, or a small-shm fault).
            hosts._make_host_root(w)
            _mount(w, "disk-full", w.host_root / "dev" / "shm", w.faults.get("small-shm-size"))
    elif kind == "small-shm":
        size = int(params.get("size", 64e6))
        shm = w.host_root / "dev" / "shm"
        shm.mkdir(parents=True, exist_ok=True)
        w.faults["small-shm-size"] = size
        _mount(w, kind, shm, size)
    else:  # pragma: no cover - faults.py checks the name
        raise UsageError(f"unknown host fault {kind!r}")


def _where(w: _Worker, path: str) -> Path:
    if path == "~" or path.startswith("~/"):
        p = w.home / path[2:] if path != "~" else w.home
    elif path.startswith("/"):
        p = w.host_root / path.lstrip("/") if path != "/" else w.host_root
    else:
        raise UsageError(f"disk-full: path {path!r} must be / (the root disk), /PATH or ~/PATH")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _mount(w: _Worker, kind: str, where: Path, size: int | None) -> None:
    """A tmpfs at `where` of `size` bytes (None: the kernel's default, half the memory)."""
    if not can_mount():
        raise UsageError(f"{kind}: mounting a small tmpfs needs root")
    tool = shutil.which("mount") or "/bin/mount"
    options = "mode=0755" + (f",size={max(4096, int(size))}" if size is not None else "")
    r = subprocess.run([tool, "-t", "tmpfs", "-o", options, "tpuwatch-sim", str(where)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise UsageError(f"{kind}: cannot mount a tmpfs at {where}: {r.stderr.strip()}")
    w.faults.setdefault("mounts", []).append(str(where))


def unmount_all(w: _Worker) -> None:
    """Undo every mount of the worker, newest first (lazily: a process may still sit in one)."""
    mounts: list[str] = w.faults.pop("mounts", [])
    tool = shutil.which("umount") or "/bin/umount"
    for where in reversed(mounts):
        subprocess.run([tool, "-l", where], capture_output=True, timeout=30)
