"""The device-holder scan sees other users' processes, or says that it cannot.

On a TPU VM the job runs as the SSH user, not root, and a plain user cannot read another
user's /proc/<pid>/fd: an orphan left by another account holds the TPU unseen. The worker-side
stop runs here through a real local bash, as root and as an unprivileged user (setpriv), against
a holder owned by root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.workers import protocol

SETPRIV = shutil.which("setpriv")
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                                reason="needs root and setpriv to run the scan as another user")


@pytest.fixture
def host() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A host root whose /dev/accel0 a root-owned process holds open; readable by everyone."""
    root = Path(tempfile.mkdtemp(prefix="tpuwatch-scan-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        (root / "dev").mkdir(mode=0o755)
        (root / "tmp").mkdir(mode=0o1777)
        (root / "home").mkdir(mode=0o777)
        (root / "dev" / "accel0").write_text("")
        holder = subprocess.Popen(["sleep", "300"], stdin=open(root / "dev" / "accel0"))  # noqa: SIM115
        try:
            yield root, holder
        finally:
            holder.kill()
            holder.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def stop(root: Path, *, as_user: int | None) -> protocol.StopResult:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root / "home"), "TPUWATCH_HOST_ROOT": str(root)}
    argv = ["bash", "-c", protocol.REMOTE_COMMAND]
    if as_user is not None:
        argv = [str(SETPRIV), f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *argv]
    r = subprocess.run(argv, input=protocol.framed(protocol.stop_script("job", 0.5)), capture_output=True, env=env,
                       timeout=60)
    return protocol.parse_stop(0, protocol.parse_records(r.stdout.decode()))


def test_a_plain_user_without_sudo_says_other_users_holders_are_not_seen(
        host: tuple[Path, subprocess.Popen[bytes]]) -> None:
    root, holder = host
    if shutil.which("sudo"):
        pytest.skip("sudo is installed: `sudo -n` may be allowed here")
    res = stop(root, as_user=NOBODY)
    assert res.ok and res.device_scan == "own" and res.device_holders == ()
    assert "other users' TPU device holders not seen" in res.describe()
    assert holder.poll() is None  # unseen, so untouched


def test_root_sees_and_stops_another_users_holder(host: tuple[Path, subprocess.Popen[bytes]]) -> None:
    root, holder = host
    res = stop(root, as_user=None)
    assert res.device_scan == "root" and res.device_holders == (holder.pid,)
    assert "not seen" not in res.describe()
    holder.wait(timeout=10)
