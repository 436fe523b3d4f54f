"""The line a launch leaves in the log: what was started where, and what was found already running.

A boot script (startup-scripts/resume-training.sh) and the watcher may both send attempt n; the
worker-side lock starts it once and answers the second "running". The line must not claim a start
that did not happen.
"""

from __future__ import annotations

from tpuwatch.model import Checkpoint, LaunchResult
from tpuwatch.policy import Launch
from tpuwatch.tick import launch_line

CK = Checkpoint("gs://b/run/ck/20", 20, "orbax")
LAUNCH = Launch(2, CK, "relaunch")


def test_a_launch_started_everywhere_says_launched() -> None:
    line = launch_line(LAUNCH, [LaunchResult(0, "launched", 2, 11), LaunchResult(1, "launched", 2, 12)])
    assert line == "launched attempt 2 on 2/2 workers from gs://b/run/ck/20 (step 20)"


def test_an_attempt_the_boot_had_started_everywhere_is_not_called_launched() -> None:
    line = launch_line(LAUNCH, [LaunchResult(0, "running", 2, 11), LaunchResult(1, "running", 2, 12)])
    assert line == "attempt 2 already running on 2/2 workers from gs://b/run/ck/20 (step 20), not started again"
    assert not line.startswith("launched")


def test_started_on_some_found_running_on_others_names_them() -> None:
    line = launch_line(Launch(1, None, "first"), [LaunchResult(0, "launched", 1, 11), LaunchResult(1, "running", 1, 12),
                                                  LaunchResult(2, "busy", 0, 13, detail="attempt 0 holds the lock")],
                       note="megascale abort flags on")
    assert line.startswith("launched attempt 1 on 2/3 workers from scratch (no complete checkpoint yet); "
                           "already running on w1, not started again; megascale abort flags on; worker 2: refused: attempt 0 still holds the job lock"), line
