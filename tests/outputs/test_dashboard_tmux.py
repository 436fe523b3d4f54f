"""`tpuwatch watch` on a real terminal: tmux runs it against the simulator, capture-pane reads
the screen as a person would see it.

The screen must show the node state, the attempt number, the newest checkpoint step (one that
exists in the bucket) and the steps/s computed from the checkpoints; the dashboard must be
redrawn in place (one frame in the whole scrollback, not one per tick) within 80 columns; and
Ctrl-C must stop watching, leaving the job running.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

TMUX = shutil.which("tmux") or "/usr/bin/tmux"


class Tmux:
    """A private tmux server (its own socket) with one 80x24 window."""

    def __init__(self, sock: Path, env: dict[str, str]) -> None:
        self.sock = sock
        self.env = env

    def __call__(self, *args: str) -> str:
        out = subprocess.run([TMUX, "-S", str(self.sock), *args], env=self.env, text=True,
                             capture_output=True, timeout=10)
        assert out.returncode == 0, f"tmux {args[0]}: {out.stderr}"
        return out.stdout

    def screen(self, history: bool = False) -> str:
        return self("capture-pane", "-p", "-t", "w", *(["-S", "-"] if history else []))

    def wait_for(self, pred: Callable[[str], bool], what: str, timeout: float = 45) -> str:
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            if pred(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    assert os.path.exists(TMUX), "tmux is needed for this test (.ci/run installs it)"
    t = Tmux(tmp_path / "tmux.sock", {**os.environ, "TERM": "xterm-256color"})
    yield t
    subprocess.run([TMUX, "-S", str(t.sock), "kill-server"], capture_output=True, timeout=10)


def write_config(path: Path, sim: Simulator, ck: Path) -> Path:
    command = (f"python3 -m tpuwatch.sim.trainer --steps 100000 --step-time 0.03 --ckpt-every 10 "
               f"--ckpt-dir {ck} --resume {{checkpoint}}")
    path.write_text("\n".join([
        "[tpu]", 'name = "pod"',
        "[job]", f"command = {json.dumps(command)}", f"checkpoint_dir = {json.dumps(str(ck))}",
        "[recovery]", 'poll_interval = "0.3s"', 'min_uptime = "0.5s"',
        "[precheck]", "enabled = false",  # environment checks are other tests' subject
        "[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
        f"port = {sim.ssh_port}", "internal_ip = true",
    ]) + "\n")
    return path


def test_watch_dashboard_in_tmux_shows_node_state_attempt_and_checkpoint_step(
        sim: Simulator, tmux: Tmux, tmp_path: Path) -> None:
    ck = sim.bucket / "ck"
    sim.create_node("pod", "v4-32", labels={"tpuwatch-job": "pod"})
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, ck)
    env = {**sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    cmd = " ".join([
        "env", *(shlex.quote(f"{k}={v}") for k, v in env.items()),
        shlex.quote(sys.executable), "-m", "tpuwatch.cli", "watch", "-c", shlex.quote(str(cfg)),
        "; echo watch-exited-$?; sleep 60",
    ])
    tmux("new-session", "-d", "-s", "w", "-x", "80", "-y", "24", cmd)

    def progressing(screen: str) -> bool:
        return "steps/s" in screen and "READY" in screen

    screen = tmux.wait_for(progressing, "the dashboard with progress")
    lines = screen.rstrip("\n").split("\n")
    top = next(line for line in lines if line.startswith("╭─ tpuwatch · pod"))
    assert top.endswith("╮") and len(top) == 80, top
    assert "READY / HEALTHY" in screen, screen
    assert re.search(r"running, attempt 1, up \d+(ms|s)\b", screen), screen
    assert "0-3 running (attempt 1)" in screen, screen
    m = re.search(r"checkpoint +step (\d+), saved .* ago, ([\d.]+) steps/s", screen)
    assert m, screen
    step, rate = int(m.group(1)), float(m.group(2))
    # a rate needs two checkpoints of the attempt: 0 and 10 at the earliest
    assert step >= 10 and (ck / str(step) / "commit_success.txt").is_file(), (step, sorted(os.listdir(ck)))
    assert 5 < rate < 60, rate  # the trainer makes ~33 steps/s; startup and saves slow it a little
    # Redrawn in place: after many ticks the scrollback holds one frame, not one per tick.
    time.sleep(1.0)
    assert tmux.screen(history=True).count("╭─ tpuwatch · pod") == 1
    # Ctrl-C stops watching and says so; the job keeps running on the workers.
    tmux("send-keys", "-t", "w", "C-c")
    screen = tmux.wait_for(lambda s: "watch-exited-" in s, "watch to stop", timeout=60)
    assert "watch-exited-0" in screen and "stopped watching pod" in screen, screen
    before = max(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    end = time.monotonic() + 10
    while max(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == before:
        assert time.monotonic() < end, "the job stopped with the watcher"
        time.sleep(0.1)
