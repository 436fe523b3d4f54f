"""OpenSSH connection multiplexing: one master connection per worker, shared by every call.

A probe, launch, stop or follow is then a channel on an open connection (ControlMaster=auto:
the first call to a worker becomes its master, ControlPersist keeps it in the background), not
a new TCP and SSH handshake. This module holds where the control sockets live and how they go:

- A socket's path is `<dir>/<16 hex digits>`, a hash of user, address, port and the host-key
  alias (which names the node id), so a recreated node never shares the old node's connection.
  A Unix socket path must fit in 104 bytes (macOS; 108 on Linux), and ssh first binds a
  temporary name 17 bytes longer: a directory too long for that is replaced by a short private
  one under /tmp, named after it.
- A dead master is replaced: ssh itself removes a socket nobody answers on; a master whose
  connection hangs (a worker gone without a reset) is told to exit by `drop` after a call to
  that worker timed out or failed to reach it, so the next call connects afresh.
- `close` tells every master this process used to exit and removes its socket (on exit);
  ControlPersist ends the ones a killed watcher left, once idle that long.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpuwatch.errors import ConfigError

SUN_PATH = 104  # bytes in sockaddr_un.sun_path on macOS (108 on Linux), the NUL included
TEMP_SUFFIX = 17  # ssh binds "<path>.<16 random characters>" first, then renames it
NAME_LEN = 16  # hex digits of a socket's name
MAX_DIR = SUN_PATH - 1 - TEMP_SUFFIX - 1 - NAME_LEN  # longest directory that keeps paths legal
PERSIST = 600  # seconds an idle master lives on (only a killed watcher leaves one idle)
EXIT_TIMEOUT = 5.0  # seconds for `ssh -O exit` to answer


def short_dir(wanted: Path) -> Path:
    """`wanted`, or a short private directory under /tmp named after it when `wanted` is too
    long for a socket path."""
    if len(os.fsencode(str(wanted))) <= MAX_DIR:
        return wanted
    digest = hashlib.sha256(os.fsencode(str(wanted))).hexdigest()[:12]
    return Path("/tmp") / f"tpuwatch-{os.getuid()}-{digest}"


class Masters:
    """The master connections of one transport, by control socket."""

    def __init__(self, directory: Path, binary: str = "ssh", persist: int = PERSIST) -> None:
        self.wanted = Path(os.path.expanduser(str(directory)))
        self.dir = short_dir(self.wanted)
        self.binary = binary
        self.persist = persist
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def path(self, key: str) -> str:
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:NAME_LEN]
        return str(self.dir / name)

    def options(self, key: str) -> list[str]:
        """The ssh -o options that put a call on `key`'s master (started by this call if none)."""
        path = self.path(key)
        with self._lock:
            self._used.add(path)
        return ["ControlMaster=auto", f"ControlPath={path}", f"ControlPersist={self.persist}"]

    def check(self) -> None:
        """Make the socket directory: ours alone (0700), or a ConfigError saying what to do."""
        d = self.dir
        hint = ("set TPUWATCH_STATE_DIR to a shorter writable path, or ssh.multiplex = false"
                if d != self.wanted else "set TPUWATCH_STATE_DIR to a writable place, or ssh.multiplex = false")
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(d)
        except OSError as exc:
            raise ConfigError(f"ssh.multiplex: cannot create the control socket directory {str(d)!r} "
                              f"({exc.strerror}); {hint}") from None
        # Anyone who can write there could put a socket of their own in the way of ours.
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigError(f"ssh.multiplex: the control socket directory {str(d)!r} is not a directory "
                              f"that only you can use (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}); "
                              f"remove it, or {hint}")

    def drop(self, key: str) -> None:
        """End `key`'s master: the next call connects afresh."""
        self._exit(self.path(key))

    def close(self) -> None:
        """End every master this process used."""
        with self._lock:
            paths = sorted(self._used)
            self._used.clear()
        if not paths:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(paths)), thread_name_prefix="tpuwatch-mux") as pool:
            list(pool.map(self._exit, paths))
        if self.dir != self.wanted:  # the short directory under /tmp goes too, once empty
            with contextlib.suppress(OSError):
                self.dir.rmdir()

    def _exit(self, path: str) -> None:
        if not os.path.exists(path):
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([self.binary, "-o", f"ControlPath={path}", "-O", "exit", "tpuwatch-master"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=EXIT_TIMEOUT, start_new_session=True)
        # A master that did not answer keeps its connection until ServerAlive ends it; without
        # its socket no new call can wait on it.
        with contextlib.suppress(OSError):
            os.unlink(path)
