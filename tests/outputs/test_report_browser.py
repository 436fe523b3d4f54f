"""`report --html` as a person sees it: the page opened in a real headless Chromium, with no network.

Chromium (Debian's `chromium`) runs in a network namespace of its own where it can (`unshare -n`,
as root), so the page can only draw with the plotly it inlines. The test reads the DOM after the
scripts ran (plotly's SVG: the bars of each lane, the legend of each category present) and takes a
screenshot. .ci/run installs chromium; elsewhere the test skips without it and says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuwatch.journal import Journal
from tpuwatch.policy import AttemptEnd
from tpuwatch.report import CATEGORIES

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _journal(state: Path) -> None:
    """Three 6-hour attempts, each ended by a preemption 10 minutes after a checkpoint; the node
    heals in 20 minutes, the second time it is recreated (40 minutes)."""
    t, step = 0.0, 0
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    with Journal.open(state, "pod", "pod") as j, j.transaction():
        j.add_event(at(0), "phase", "start -> running", {"from": None, "to": "running", "row": "launch"})
        for n in range(1, 4):
            start, s0 = t, step
            j.start_attempt(n, at(t), "node", s0 or None)
            for _ in range(12):
                t += 1800
                step += 100
                j.add_event(at(t), "checkpoint", f"attempt {n} saved checkpoint step {step}",
                            {"attempt": n, "step": step, "time": at(t).isoformat()})
            t += 600
            j.end_attempt(AttemptEnd(n, at(start), at(t), "node", s0 or None, step, "disruption", False, 143,
                                     f"attempt {n}: worker 0 exit code 143 (SIGTERM), ended by a disruption "
                                     f"(node state PREEMPTED at {at(t).isoformat()})"))
            j.add_event(at(t), "phase", "running -> ...", {"to": "deleting" if n == 2 else "waiting_node"})
            t += 2400 if n == 2 else 1200
            j.add_event(at(t), "phase", "... -> running", {"to": "running"})
        j.add_event(at(t), "phase", "running -> done", {"to": "done"})
        j.add_event(at(t), "done", "job done")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian's `chromium`); docs/report.md records the check by hand")
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", *args]
    unshare = shutil.which("unshare")
    if os.getuid() == 0 and unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        argv = [unshare, "-n", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a headless browser: about 20 s on 2 busy cores
@pytest.mark.timeout(300)
def test_the_html_timeline_draws_in_a_headless_browser_without_network(tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the `report` extra (plotly) is not installed")
    _journal(tmp_path / "state")
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\nzone = "us-central2-b"\n[job]\ncommand = "true"\n')
    html = tmp_path / "report.html"
    res = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "report", "-c", str(cfg), "--html", str(html)],
                         env={**os.environ, "TPUWATCH_STATE_DIR": str(tmp_path / "state")},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    dom = _chromium(tmp_path, "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    # plotly ran: its SVG is in the DOM, with the bars of the attempts and of where the time went.
    assert 'class="main-svg"' in page and page.count('class="trace bars"') >= 2, page[:2000]
    legend = {label for label in CATEGORIES.values() if f'data-unformatted="{label}"' in page}
    assert legend == {"productive training", "work lost since the last checkpoint", "waiting for the node to heal",
                      "recreating / queued"}, legend
    assert 'data-unformatted="disruption"' in page and "goodput" in page
    shot = tmp_path / "report.png"
    out = _chromium(tmp_path, "--window-size=1400,1000", f"--screenshot={shot}", html.as_uri())
    assert out.returncode == 0 and shot.stat().st_size > 20_000, out.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
