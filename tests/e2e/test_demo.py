"""`tpuwatch demo --fast` as a person (or CI) runs it: a subprocess with no terminal.

The summary must list every disruption as recovered with the trainer's total as the final
step, and afterwards no process the demo started may be alive and its temporary directory must
be gone — after a normal end and after Ctrl-C (SIGINT) mid-run. Processes are found by what
they carry (the demo's TMPDIR in their command line, environment or working directory), so a
worker process that escaped the simulator's cleanup is caught too. With `--api compute` the
story plays on a Compute Engine MIG, and its journal (kept with `--keep`) must show what
tpuwatch did there. With `--limp` a multislice job limps on 3 of its 4 slices and grows back:
the kept journal, the simulated workers' files and Cloud Logging's entries must show it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpuwatch.demo import FAST
from tpuwatch.demo.story import API_COMPUTE, Act, story

pytestmark = pytest.mark.slow


def processes_under(path: Path, exclude: set[int]) -> dict[int, str]:
    """pid -> command line of every live process whose argv, environment or cwd mention `path`."""
    needle = str(path).encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        pid = int(entry)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            hit = needle in cmd
            if not hit:
                hit = needle in Path(f"/proc/{pid}/environ").read_bytes()
            if not hit:
                hit = os.readlink(f"/proc/{pid}/cwd").startswith(str(path))
            status = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone, or not ours to read
        if hit and ") Z " not in status:  # a zombie is dead; its parent has yet to reap it
            found[pid] = cmd.replace(b"\0", b" ").decode(errors="replace")
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return ") Z " not in stat


class Demo:
    """`tpuwatch demo --fast` in the background, its output collected, its processes watched."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.tmpdir = tmp_path / "t"
        self.tmpdir.mkdir()
        self.state_dir = tmp_path / "state"  # only the report's HTML goes there
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "TPUWATCH_STATE_DIR": str(self.state_dir)}
        for key in ("TPUWATCH_EMULATOR_HOST", "CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE"):
            env.pop(key, None)
        self.proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "demo", "--fast", *args], env=env,
                                     text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        self.seen: dict[int, str] = {}  # every process seen under the demo's TMPDIR while it ran
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def look(self) -> dict[int, str]:
        now = processes_under(self.tmpdir, exclude={os.getpid(), self.proc.pid})
        self.seen.update(now)
        return now

    def trainers(self) -> list[int]:
        return [pid for pid, cmd in self.look().items() if "tpuwatch.sim.trainer" in cmd]

    def wait(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > end:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("demo did not finish in time:\n" + self.output())
            self.look()
            time.sleep(0.1)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def output(self) -> str:
        return "\n".join(self.lines)

    def until(self, text: str, timeout: float) -> None:
        """Until a line of the demo's output holds `text` (the demo still running)."""
        end = time.monotonic() + timeout
        while not any(text in line for line in list(self.lines)):
            assert self.proc.poll() is None, f"the demo ended before saying {text!r}:\n" + self.output()
            assert time.monotonic() < end, f"the demo never said {text!r}:\n" + self.output()
            self.look()
            time.sleep(0.05)

    def assert_nothing_left(self) -> None:
        self.assert_no_process_left()
        assert list(self.tmpdir.iterdir()) == [], f"left in TMPDIR: {list(self.tmpdir.iterdir())}"

    def assert_no_process_left(self) -> None:
        assert self.seen, "no process of the demo was ever seen: the check would prove nothing"
        end = time.monotonic() + 5  # a process killed at the very end may take a moment to be reaped
        while time.monotonic() < end and any(alive(p) for p in self.seen):
            time.sleep(0.1)
        left = {p: c for p, c in self.seen.items() if alive(p)}
        assert not left, f"processes left behind: {left}"
        assert not processes_under(self.tmpdir, exclude={os.getpid()}), "a process still uses the demo's files"


def test_fast_demo_recovers_every_disruption_and_leaves_nothing_behind(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    rc = demo.wait(timeout=90)
    out = demo.output()
    assert rc == 0, out
    acts = story(FAST)
    rows = summary_rows(demo, acts)
    # disruptions are not charged to the restart budget; the crash is, once
    assert [rows[a.key][-2] for a in acts] == ["0", "0", "0", "1"], rows
    m = re.search(r"^result: ok: (\d+)/(\d+) disruptions recovered, final step (\d+)/(\d+)", out, re.M)
    assert m, out
    assert m.group(1) == m.group(2) == str(len(acts))
    assert int(m.group(3)) == int(m.group(4)) == FAST.steps
    # every plain line before the summary is one timestamped event line
    events = demo.lines[: demo.lines.index("") if "" in demo.lines else len(demo.lines)]
    assert events and all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ demo (state|audit|did|warning|note): ", ln)
                          for ln in events), events
    # it ends with `tpuwatch report` of its journal, and the HTML timeline (plotly is a test extra)
    assert "tpuwatch report: where the demo's wall time went" in out and "work lost since the last checkpoint" in out
    html = re.search(r"^the report's HTML timeline: (.+)$", out, re.M)
    assert html and Path(html.group(1)) == demo.state_dir / "demo-report.html", out
    assert Path(html.group(1)).read_text().startswith("<!doctype html>")
    demo.assert_nothing_left()


def summary_rows(demo: Demo, acts: tuple[Act, ...]) -> dict[str, list[str]]:
    """Each disruption's summary row, split into words; every one must say recovered."""
    rows = {}
    for act in acts:
        row = [line for line in demo.lines if line.startswith(act.title + " ")]
        assert len(row) == 1, f"no summary row for {act.title!r}:\n{demo.output()}"
        rows[act.key] = row[0].split()
        assert rows[act.key][-1] == "recovered" and "NOT" not in row[0], row[0]
    return rows


def test_fast_demo_on_a_compute_engine_mig_waits_out_its_autoheal_and_recreates_its_vms(tmp_path: Path) -> None:
    demo = Demo(tmp_path, "--api", API_COMPUTE, "--keep")
    rc = demo.wait(timeout=120)
    out = demo.output()
    assert rc == 0, out
    acts = story(FAST, API_COMPUTE)
    assert [a.key for a in acts] == ["autoheal", "host-error", "preemption", "crash"]
    assert "MIG 'demo-slice' of 4 Spot VMs (tpu7x-standard-4t, topology 2x2x4)" in out, out
    said = [line for line in demo.lines if " demo note: disruption " in line]
    assert [re.sub(r".* disruption (\d/\d: [^:]+):.*", r"\1", line) for line in said] == \
        [f"{i}/4: {a.title}" for i, a in enumerate(acts, 1)], said
    rows = summary_rows(demo, acts)
    assert [rows[a.key][-2] for a in acts] == ["0", "0", "0", "1"], rows
    assert re.search(rf"^result: ok: 4/4 disruptions recovered, final step {FAST.steps}/{FAST.steps}", out, re.M), out
    demo.assert_no_process_left()

    # What tpuwatch did, from the journal the demo kept.
    kept = re.search(r"^kept the demo's files in (\S+) ", out, re.M)
    assert kept, out
    home = Path(kept.group(1))
    history = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(home / "tpuwatch.toml"),
                              "--json"], env={**os.environ, "TPUWATCH_STATE_DIR": str(home / "state")},
                             text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert history.returncode == 0, history.stderr
    journal = json.loads(history.stdout)
    attempts, events = journal["attempts"], journal["events"]
    deletes = [e for e in events if e["kind"] == "delete"]
    # The autoheal: the MIG repairing (or its new VMs, when the repair was quicker than a poll)
    # ends the attempt; the job is relaunched on the new VMs and nothing is deleted.
    healed = attempts[0]
    assert healed["outcome"] == "disruption" and not healed["charged"], attempts
    assert re.search(r"node state REPAIRING|node id changed", healed["reason"]), healed
    assert all(e["time"] > attempts[1]["start"] for e in deletes), (attempts[1], deletes)
    # The host error and the preemption: the Spot VMs are recreated through the MIG, never deleted
    # one by one, and neither is charged.
    assert len(deletes) >= 2 and all(e["data"]["name"] == "demo-slice" and "PREEMPTED" in e["data"]["reason"]
                                     for e in deletes), deletes
    assert out.count("deleting MIG demo-slice's 4 instances (recreateInstances") == len(deletes), out
    # The crash is the only attempt charged; the last one finishes the job.
    assert [a["exit_code"] for a in attempts if a["charged"]] == [139], attempts
    assert attempts[-1]["outcome"] == "success" and attempts[-1]["end_step"] == FAST.steps, attempts


def test_ctrl_c_mid_demo_stops_every_process_and_removes_the_temp_dir(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    demo.until("demo did: launched attempt 1 on 4/4 workers", timeout=120)
    # Frozen between seeing its processes and the Ctrl-C, the fast demo cannot finish first; the
    # trainers run on (they are the simulated workers' children, not the demo's threads).
    demo.proc.send_signal(signal.SIGSTOP)
    try:
        end = time.monotonic() + 60
        while len(demo.trainers()) < 4:  # the job runs on all four simulated workers
            assert time.monotonic() < end, "the trainer never started:\n" + demo.output()
            time.sleep(0.1)
        demo.proc.send_signal(signal.SIGINT)
    finally:
        demo.proc.send_signal(signal.SIGCONT)
    rc = demo.wait(timeout=60)
    assert rc == 130, demo.output()
    assert "demo interrupted" in demo.output()
    assert "Traceback" not in demo.output()
    demo.assert_nothing_left()


def test_fast_limp_demo_limps_on_three_slices_and_grows_back_onto_four(tmp_path: Path) -> None:
    demo = Demo(tmp_path, "--limp", "--keep")
    rc = demo.wait(timeout=90)
    out = demo.output()
    assert rc == 0, out
    acts = story(FAST, limp=True)
    assert [a.key for a in acts] == ["lost", "back"]
    rows = summary_rows(demo, acts)
    assert [rows[a.key][-2] for a in acts] == ["0", "0"], rows  # nothing charged
    assert re.search(r"^result: ok: 2/2 disruptions recovered, final step 100/100", out, re.M), out
    said = " ".join(out.split())
    limped = re.search(r"limped (\S+) on 3 of 4 slices: the equal of (\S+) of training at full size, which waiting "
                       r"for the lost slice would have lost; growing back onto all 4 at checkpoint step (\d+) cost", said)
    assert limped, out
    assert "launched attempt 2 on 3/3 workers" in out and "launched attempt 3 on 4/4 workers" in out, out
    demo.assert_no_process_left()

    kept = re.search(r"^kept the demo's files in (\S+) ", out, re.M)
    assert kept, out
    home = Path(kept.group(1))
    history = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(home / "tpuwatch.toml"),
                              "--json"], env={**os.environ, "TPUWATCH_STATE_DIR": str(home / "state")},
                             text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert history.returncode == 0, history.stderr
    journal = json.loads(history.stdout)
    attempts, events = journal["attempts"], journal["events"]
    # Three attempts, none charged: on 4, on the 3 left (demo-1 lost), on all 4 again to the end.
    assert [(a["outcome"], a["charged"]) for a in attempts] == [
        ("disruption", False), ("disruption", False), ("success", False)], attempts
    assert [(e["data"]["in_use"], e["data"]["out"]) for e in events if e["kind"] == "slices"] == [
        (3, ["demo-1"]), (4, [])], events
    # The limp: from the journal's two `slices` events; a step on 3 of 4 slices is 3/4 of one.
    shifts = [datetime.fromisoformat(e["time"]) for e in events if e["kind"] == "slices"]
    on_three = (shifts[1] - shifts[0]).total_seconds()
    assert abs(seconds(limped.group(1)) - on_three) <= 0.051, (limped.group(0), on_three)
    assert abs(seconds(limped.group(2)) - on_three * 3 / 4) <= 0.051, (limped.group(0), on_three)
    # The job on 4 stalled without saving once demo-1 was lost: relaunched on 3 from the
    # checkpoint before the loss, the steps since lost.
    assert attempts[1]["start_step"] == FAST.at_step(0) and int(rows["lost"][-3]) > 0, (attempts, rows)
    grow = attempts[2]
    # It grows back from the newest complete checkpoint at the relaunch: the one tpuwatch stopped
    # the job at, or one the job on 3 saved while a loaded machine's stop was under way.
    assert str(grow["start_step"]) == limped.group(3) and attempts[1]["end_step"] <= grow["start_step"], attempts
    assert grow["end_step"] == 100, attempts
    # Limping only moves the job: tpuwatch deleted and created nothing.
    assert not [e for e in events if e["kind"] in ("delete", "create")], events

    # The world: each slice's worker ran the attempts the journal says, demo-1 none while it was
    # out (a node deleted and created again would have lost its attempt-1.log: the simulator
    # boots a new node on empty disks); Cloud Logging's entries tpuwatch read name no delete or
    # create.
    ran = {}
    for name in ("demo-0", "demo-1", "demo-2", "demo-3"):
        [worker] = (home / "sim" / "hosts" / "nodes").glob(f"*__{name}/worker-0")
        ran[name] = sorted(int(p.stem.split("-")[1]) for p in (worker / "home" / ".tpuwatch" / "demo").glob("attempt-*.log"))
    assert ran == {"demo-0": [1, 2, 3], "demo-1": [1, 3], "demo-2": [1, 2, 3], "demo-3": [1, 2, 3]}, ran
    with sqlite3.connect(home / "state" / "audit.sim-project.db") as db:
        logged = [m for (m,) in db.execute("SELECT method FROM entries")]
    assert not [m for m in logged if m.rsplit(".", 1)[-1] in ("delete", "create", "insert")], logged
    # The checkpoint it grew back at was saved on the 3 slices, from the bucket's own record.
    meta = json.loads((home / "sim" / "bucket" / "ckpt" / str(grow["start_step"]) / "_CHECKPOINT_METADATA").read_text())
    saved = datetime.fromtimestamp(meta["commit_timestamp_nsecs"] / 1e9, timezone.utc)
    assert saved > datetime.fromisoformat(attempts[1]["start"]), (meta, attempts)
    assert grow["start_step"] > attempts[1]["start_step"], attempts


def seconds(said: str) -> float:
    """The summary's `850ms` or `2.6s`."""
    return float(said[:-2]) / 1000 if said.endswith("ms") else float(said[:-1])


def test_limp_demo_on_compute_engine_is_refused_with_exit_2() -> None:
    res = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "demo", "--limp", "--api", API_COMPUTE],
                         text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res
    assert "--limp" in res.stderr and "drop --api compute" in res.stderr, res.stderr


def test_fast_spare_demo_swaps_the_spare_in_at_once_and_makes_the_lost_slice_again(tmp_path: Path) -> None:
    demo = Demo(tmp_path, "--spare", "--keep")
    rc = demo.wait(timeout=90)
    out = demo.output()
    assert rc == 0, out
    acts = story(FAST, spare=True)
    assert [a.key for a in acts] == ["preempt"]
    rows = summary_rows(demo, acts)
    assert rows["preempt"][-2] == "0", rows  # nothing charged
    assert re.search(r"^result: ok: 1/1 disruptions recovered, final step 100/100", out, re.M), out
    said = " ".join(out.split())
    swap = re.search(r"demo-1 was lost: (\S+) after the loss tpuwatch had swapped spare demo-4 into its place "
                     r"\(slice 1\) and the job trained again there from its newest complete checkpoint, (\S+) after "
                     r"the loss: (\d+) steps lost \(those since that checkpoint\), nothing charged to max_restarts",
                     said)
    remade = re.search(r"demo-1, a spot node preempted for good \(it does not come back by itself\), was deleted "
                       r"(\S+) after the loss and created again from \[tpu.spec\] (\S+) after it, in the background "
                       r"while the job trained; it could stand in again (\S+) after the loss, the job's spare from then "
                       r"on \(the swap spared the job (\S+) of waiting for it\)", said)
    assert swap and remade, out
    assert "The job waited for no delete or create: tpuwatch deleted and created no slice it ran on" in said, out
    # the swap, then the delete, the create and READY, in that order
    times = [seconds(t) for t in (swap.group(1), *remade.groups()[:3])]
    assert times == sorted(times), times
    demo.assert_no_process_left()

    kept = re.search(r"^kept the demo's files in (\S+) ", out, re.M)
    assert kept, out
    home = Path(kept.group(1))
    history = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(home / "tpuwatch.toml"),
                              "--json"], env={**os.environ, "TPUWATCH_STATE_DIR": str(home / "state")},
                             text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert history.returncode == 0, history.stderr
    journal = json.loads(history.stdout)
    attempts, events = journal["attempts"], journal["events"]
    # Two attempts, none charged: on the 4 slices, then on the spare in demo-1's place to the end.
    assert [(a["outcome"], a["charged"]) for a in attempts] == [("disruption", False), ("success", False)], attempts
    assert "demo-1 state PREEMPTED" in attempts[0]["reason"], attempts
    assert [e["data"]["row"] for e in events if e["kind"] == "phase" and e["data"]["from"] == "running"][0] == "swap"
    assert [(e["data"]["on"], e["data"]["spares"]) for e in events if e["kind"] == "slices"] == [
        (["demo-0", "demo-4", "demo-2", "demo-3"], ["demo-1"])], events
    # relaunched from the checkpoint before the loss: the job on 4 stalled without saving after it
    assert attempts[1]["start_step"] == FAST.at_step(0) and int(swap.group(3)) == int(rows["preempt"][-3]) > 0
    assert attempts[1]["end_step"] == 100, attempts
    # demo-1 deleted and created again (in that order) while the job ran on the spare; nothing
    # the job ran on was deleted or created
    remakes = [e for e in events if e["kind"] == "spare_remade"]
    assert [(e["data"]["node"], e["data"]["create"]) for e in remakes] == [("demo-1", False), ("demo-1", True)]
    when = datetime.fromisoformat
    assert all(when(attempts[1]["start"]) < when(e["time"]) < when(attempts[1]["end"]) for e in remakes), remakes
    assert not [e for e in events if e["kind"] in ("delete", "create")], events
    # then tpuwatch saw it could stand in again, and said what waiting for it would have cost
    [back] = [e for e in events if e["kind"] == "spare_back"]
    assert back["data"]["node"] == "demo-1" and when(back["time"]) > when(remakes[1]["time"]), back
    assert abs(seconds(remade.group(4)) - back["data"]["seconds"]) <= 0.051, (remade.group(0), back)

    # The world: the spare's worker ran the relaunch, and demo-1's worker has no attempt's log
    # left: a node deleted and created again boots on empty disks.
    ran = {}
    for name in ("demo-0", "demo-1", "demo-2", "demo-3", "demo-4"):
        [worker] = (home / "sim" / "hosts" / "nodes").glob(f"*__{name}/worker-0")
        ran[name] = sorted(int(p.stem.split("-")[1]) for p in (worker / "home" / ".tpuwatch" / "demo").glob("attempt-*.log"))
    assert ran == {"demo-0": [1, 2], "demo-1": [], "demo-2": [1, 2], "demo-3": [1, 2], "demo-4": [2]}, ran


@pytest.mark.parametrize(("args", "said"), [
    (("--spare", "--limp"), "--limp and --spare are two stories"),
    (("--spare", "--api", API_COMPUTE), "drop --api compute (or --spare)"),
])
def test_spare_demo_with_limp_or_on_compute_engine_is_refused_with_exit_2(args: tuple[str, ...], said: str) -> None:
    res = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "demo", *args],
                         text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res
    assert said in res.stderr, res.stderr
