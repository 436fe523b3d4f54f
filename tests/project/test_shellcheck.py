"""Every shell script the product runs is shellcheck-clean (Debian's `shellcheck`; .ci/run installs it).

The worker-side scripts are checked as a worker runs them: procs.sh in front of remote.sh or
precheck.sh (`protocol.packaged`), so a helper defined in one and used in the other is known.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tpuwatch.workers.protocol import packaged

ROOT = Path(__file__).resolve().parents[2]
STARTUP = sorted((ROOT / "startup-scripts").glob("*.sh"))


def _shellcheck(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("shellcheck")
    if tool is None:
        pytest.skip("shellcheck is not installed (Debian's `shellcheck`; .ci/run installs it)")
    return subprocess.run([tool, "-f", "gcc", *args], input=stdin, text=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("script", ["remote.sh", "precheck.sh"])
def test_a_worker_script_as_it_runs_is_shellcheck_clean(script: str) -> None:
    out = _shellcheck(["-s", "bash", "-"], packaged(script))
    assert out.returncode == 0, f"{script} (procs.sh in front, so line numbers count from there):\n{out.stdout}"


def test_the_startup_scripts_are_shellcheck_clean() -> None:
    assert STARTUP, "no startup scripts found"
    out = _shellcheck([str(p) for p in STARTUP])
    assert out.returncode == 0, out.stdout
