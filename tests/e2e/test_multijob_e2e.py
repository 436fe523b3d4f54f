"""End to end: several jobs in one `tpuwatch watch`, on the simulator with real ssh.

Each job has its own node (one worker each, v4-8) in the same zone, its own config and journal.
The watcher reads the zone with ListNodes (no GetNode per job), and one job's trouble (a
maintenance, a broken config, a lock held by another watcher) never stops the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cli_process
import pytest
from e2e_helpers import trainer, wait_for, write_config

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow


class Jobs:
    """Nodes, configs and the environment of a few jobs on one simulator."""

    def __init__(self, sim: Simulator, tmp: Path) -> None:
        self.sim = sim
        self.tmp = tmp
        self.env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp / "state")}

    def add(self, name: str, steps: int, where: Path | None = None) -> Path:
        self.sim.create_node(name, "v4-8", labels={"tpuwatch-job": name})
        ck = self.sim.bucket / name
        return write_config((where or self.tmp) / f"{name}.toml", self.sim, trainer(ck, "", steps), ck, name=name)

    def steps(self, name: str) -> list[int]:
        ck = self.sim.bucket / name
        return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.exists() else []

    def watch(self, *args: str) -> Watcher:
        return Watcher(subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", *args], env=self.env,
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL))

    def history(self, cfg: Path) -> dict[str, Any]:
        out = cli_process.run(["history", "-c", str(cfg), "--json"], self.env)
        assert out.returncode == 0, out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result


class Watcher:
    """A watch process whose output is read as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def objects(self) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def seen(self, job: str, status: str) -> bool:
        return any(o.get("job") == job and o.get("status") == status for o in self.objects())

    def finish(self, timeout: float = 120) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("watch did not finish:\n" + "\n".join(self.lines[-40:])) from None
        self._reader.join(5)
        return rc

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.finish(60)

    def text(self) -> str:
        return "\n".join(self.lines)


def test_one_job_heals_a_maintenance_while_the_other_keeps_running_on_one_list_per_zone(
        sim: Simulator, tmp_path: Path) -> None:
    jobs = Jobs(sim, tmp_path)
    a, b = jobs.add("ja", 150), jobs.add("jb", 300)
    w = jobs.watch("-c", str(a), "-c", str(b), "--json")
    wait_for(lambda: jobs.steps("ja") and jobs.steps("jb"), 60, "both jobs training")
    sim.inject("maintenance", node="ja", heal_after=1800)  # 3 s at speed 600
    rc = w.finish(180)
    assert rc == 0, w.text()
    ha, hb = jobs.history(a)["attempts"], jobs.history(b)["attempts"]
    assert [x["outcome"] for x in ha] == ["disruption", "success"], ha
    assert [x["outcome"] for x in hb] == ["success"], hb  # never stopped nor relaunched
    assert jobs.steps("ja")[-1] == 150 and jobs.steps("jb")[-1] == 300
    # One object per job per tick, each naming its job and config.
    ticks = [o for o in w.objects() if "decision" in o or "row" in o]
    assert {o["job"] for o in ticks} == {"ja", "jb"}, w.text()[-2000:]
    assert all(o["config"] in (str(a), str(b)) for o in ticks)
    # The nodes were read by listing the zone, never by a get per job.
    assert sim.world.call_count("ListNodes") > 0
    assert sim.world.call_count("/GetNode") == 0, dict(sim.world.calls)


def test_a_broken_config_or_a_failing_api_call_is_shown_and_the_other_job_goes_on(
        sim: Simulator, tmp_path: Path) -> None:
    jobs = Jobs(sim, tmp_path)
    a = jobs.add("ja", 60)
    bad = tmp_path / "jb.toml"
    bad.write_text(a.read_text().replace('name = "ja"', 'name = "jb"')
                   .replace('poll_interval = "0.5s"', 'poll_interval = "soon"'))
    # jc's node is not in the zone's listing, so its tick asks for it with a get, which fails
    unlisted = tmp_path / "jc.toml"
    unlisted.write_text(a.read_text().replace('name = "ja"', 'name = "jc"'))
    sim.inject("permission-denied", methods=["GetNode"])
    w = jobs.watch("-c", str(a), "-c", str(bad), "-c", str(unlisted), "--json")
    rc = w.finish(120)
    assert rc == 2, w.text()  # the most severe: a bad config (then the API: 3; the finished job: 0)
    broken = [o for o in w.objects() if o.get("config") == str(bad)]
    assert broken and broken[-1]["status"] == "config_error", w.text()
    assert "recovery.poll_interval" in broken[-1]["error"], broken[-1]
    failed = [o for o in w.objects() if o.get("config") == str(unlisted)]
    assert failed and (failed[-1]["status"], failed[-1]["exit_code"]) == ("failed", 3), w.text()
    assert "tpu.nodes.get" in failed[-1]["error"], failed[-1]  # the message names the call's permission
    assert [x["outcome"] for x in jobs.history(a)["attempts"]] == ["success"]
    assert jobs.steps("ja")[-1] == 60


def test_config_dir_picks_up_a_new_file_and_drops_a_removed_one(sim: Simulator, tmp_path: Path) -> None:
    jobs = Jobs(sim, tmp_path)
    d = tmp_path / "jobs"
    d.mkdir()
    a = jobs.add("ja", 100_000)  # trains for as long as the test runs
    staged = jobs.add("jb", 100_000)
    (d / "ja.toml").write_text(a.read_text())
    w = jobs.watch("--config-dir", str(d), "--json")
    wait_for(lambda: jobs.steps("ja"), 60, "ja training")
    assert not jobs.steps("jb")
    # a new file: a new job (its [metrics] port names one process's endpoint: said to be unused)
    (d / "jb.toml").write_text(staged.read_text() + "\n[metrics]\nport = 9999\n")
    wait_for(lambda: jobs.steps("jb"), 60, "jb picked up and launched")
    # said before jb's first tick; the reader thread may be a moment behind the checkpoints
    wait_for(lambda: "jb warning: [metrics] port = 9999 in jb.toml is not used" in w.text(), 30,
             "the warning that jb.toml's [metrics] port is not used")
    (d / "ja.toml").unlink()  # removed: no longer watched, nothing deleted or stopped
    wait_for(lambda: w.seen("ja", "removed"), 60, "ja dropped")
    wait_for(lambda: w.seen("ja", "stopped"), 60, "ja's loop ended")
    after = len(w.lines)
    before = jobs.steps("ja")
    wait_for(lambda: len(jobs.steps("ja")) > len(before), 60, "ja still training on its own")
    wait_for(lambda: sum(1 for line in w.lines[after:] if '"job": "jb"' in line) >= 3, 60, "jb ticking")
    assert not any('"job": "ja"' in line for line in w.lines[after:]), w.lines[after:]
    assert sim.world.has_node("ja")
    assert w.interrupt() == 0, w.text()
    assert [x["outcome"] for x in jobs.history(d / "jb.toml")["attempts"]] == [None]  # running still


def test_a_job_watched_by_another_process_is_skipped_then_taken_over(sim: Simulator, tmp_path: Path) -> None:
    jobs = Jobs(sim, tmp_path)
    a, b = jobs.add("ja", 150), jobs.add("jb", 150)
    other = jobs.watch("-c", str(b), "--plain")
    wait_for(lambda: jobs.steps("jb"), 60, "jb watched by the other process")
    w = jobs.watch("-c", str(a), "-c", str(b), "--json")
    wait_for(lambda: w.seen("jb", "busy"), 60, "jb shown as watched elsewhere")
    wait_for(lambda: w.seen("ja", "watching"), 60, "ja watched")  # each job says so in its own time
    assert other.interrupt() == 0
    wait_for(lambda: w.seen("jb", "watching"), 60, "jb taken over once the other process went away")
    assert w.finish(120) == 0, w.text()
    assert [x["outcome"] for x in jobs.history(b)["attempts"]] == ["success"]
    assert [x["outcome"] for x in jobs.history(a)["attempts"]] == ["success"]


def test_check_ticks_every_job_once_and_exits_with_the_most_severe_code(sim: Simulator, tmp_path: Path) -> None:
    jobs = Jobs(sim, tmp_path)
    d = tmp_path / "jobs"
    d.mkdir()
    for name in ("ja", "jb"):
        (d / f"{name}.toml").write_text(jobs.add(name, 60).read_text())
    (d / "jc.toml").write_text("[tpu]\nname = 'jc'\n[job]\ncommand = 'true'\nbogus = 1\n")
    out = cli_process.run(["check", "--config-dir", str(d), "--json"], jobs.env, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    objs = {o["config"]: o for o in map(json.loads, out.stdout.splitlines())}
    assert objs[str(d / "jc.toml")]["status"] == "config_error" and "job.bogus" in objs[str(d / "jc.toml")]["error"]
    for name in ("ja", "jb"):
        o = objs[str(d / f"{name}.toml")]
        assert (o["status"], o["job"], o["exit_code"]) == ("finished", name, 0), o
        assert any(a["kind"] == "launch" for a in o["actions"]), o  # each launched its job
    assert sim.world.call_count("ListNodes") == 1 and sim.world.call_count("/GetNode") == 0
