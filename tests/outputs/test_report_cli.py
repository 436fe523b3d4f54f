"""`tpuwatch report` end to end: a real journal written by `tpuwatch watch` on the simulator (a
maintenance event that heals, then a segfault), read back by the real CLI as text, JSON and HTML;
and its bad input (exit 2 naming the flag, no traceback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from e2e_helpers import Job, finish

from tpuwatch.report import CATEGORIES
from tpuwatch.sim.simulator import Simulator

PIP = "pip install 'tpuwatch[report]'"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuwatch.cli", *args], env={**os.environ, **(env or {})},
                          text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_report_of_a_real_journal_splits_its_wall_time_and_draws_it(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    # The job holds after its first checkpoint until the journal has it: the report measures an
    # attempt's start-up to its first checkpoint seen, which a busy machine's ticks could miss;
    # then after its second, until the maintenance has hit it.
    go = tmp_path / "go"
    go.mkdir()
    job = Job(sim, tmp_path, f"--segfault-at 45 --fault-worker 1 --crash-once {marker} --hold-at 0,10 --hold-until {go}")
    proc = job.watch()

    def journal_saw_checkpoint_0() -> bool:
        out = job.cli("history", "-c", str(job.cfg), "--json")  # fails until the journal exists
        return out.returncode == 0 and any(e["kind"] == "checkpoint" and e["data"]["step"] == 0
                                           for e in json.loads(out.stdout)["events"])

    job.wait(journal_saw_checkpoint_0, what="the journal to see checkpoint 0")
    (go / "0").touch()
    job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
    sim.inject("maintenance", node="pod", heal_after=1800)  # 3 s at the simulator's speed
    (go / "10").touch()
    rc, out = finish(proc)
    assert rc == 0, out
    hist = job.history()
    outcomes = [a["outcome"] for a in hist["attempts"]]
    assert "disruption" in outcomes and "failure" in outcomes and outcomes[-1] == "success", outcomes

    html = tmp_path / "out" / "report.html"
    html.parent.mkdir()
    res = job.cli("report", "-c", str(job.cfg), "--json", "--html", str(html))
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    secs = {c["id"]: c["seconds"] for c in rep["categories"]}
    assert list(secs) == list(CATEGORIES)
    # Every moment from the first tick to the job's end is in exactly one category.
    assert sum(secs.values()) == pytest.approx(rep["wall_seconds"], abs=0.01)
    assert rep["state"] == "done"
    done = next(e for e in hist["events"] if e["kind"] == "done")
    assert datetime.fromisoformat(rep["end"]) == datetime.fromisoformat(done["time"])
    assert rep["goodput"] == pytest.approx(secs["productive"] / rep["wall_seconds"], abs=1e-3)  # JSON keeps ms
    assert 0 < rep["goodput"] < 1
    # the maintenance: the node is waited for; the segfault: charged. Its first charged restart is
    # relaunched in the tick that saw it (no backoff), so what it costs is the work after its
    # newest checkpoint, none when that tick began before the checkpoint landed.
    assert secs["heal"] > 0 and secs["charged"] >= 0 and secs["startup"] > 0
    failed = [a["attempt"] for a in rep["attempts"] if a["outcome"] == "failure"]
    assert failed and all(s["category"] == "charged" for s in rep["timeline"]
                          if s["attempt"] in failed and s["category"] not in ("startup", "productive")), rep["timeline"]
    assert [a["attempt"] for a in rep["attempts"]] == [a["attempt"] for a in hist["attempts"]]
    causes = [c["what"] for c in rep["top_causes"]]
    assert any(c.startswith("disruption: ") for c in causes), causes
    assert "failure: exit code 139 (SIGSEGV)" in causes, causes
    # The checkpoints it shows are the trainer's own, as found in the bucket.
    shown = {int(m["text"].split()[2]) for m in rep["marks"] if m["kind"] == "checkpoint"}
    assert shown and shown <= set(job.steps_done()), (shown, job.steps_done())
    kinds = {m["kind"] for m in rep["marks"]}
    assert {"disruption", "failure", "end"} <= kinds, kinds

    page = html.read_text()
    assert page.startswith("<!doctype html>") and rep["html"] == str(html)
    assert "Plotly.newPlot" in page and "work lost since the last checkpoint" in page
    # self-contained: plotly's JavaScript is inline, nothing is fetched when the file opens
    # (plotly.js's text names a map-data URL, used only by geographic charts: none here)
    assert "<script src" not in page.lower() and "<link" not in page.lower() and "<iframe" not in page.lower()
    assert "@import" not in page and "url(http" not in page

    text = job.cli("report", "-c", str(job.cfg), "--since", "1h")
    assert text.returncode == 0, text.stderr
    assert "goodput" in text.stdout and "failure: exit code 139 (SIGSEGV)" in text.stdout
    assert all(label in text.stdout for label in CATEGORIES.values())


def test_since_that_is_not_a_duration_exits_2_naming_the_flag(tmp_path: Path) -> None:
    res = cli("report", "-c", str(tmp_path / "none.toml"), "--since", "last tuesday")
    assert res.returncode == 2 and "--since" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["report", "history"])
def test_since_a_time_without_a_time_zone_exits_2_naming_the_flag(tmp_path: Path, command: str) -> None:
    cfg = _config_with_a_journal(tmp_path)
    res = cli(command, "-c", str(cfg), "--since", "2026-11-01T00:00:00", env={"TPUWATCH_STATE_DIR": str(tmp_path / "state")})
    assert res.returncode == 2 and "--since" in res.stderr and "time zone" in res.stderr, res.stderr
    ok = cli(command, "-c", str(cfg), "--since", "2026-11-01T00:00:00Z", env={"TPUWATCH_STATE_DIR": str(tmp_path / "state")})
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("where", ["missing-dir/report.html", "a-file/report.html", "/proc/tpuwatch-report.html"])
def test_an_unwritable_html_path_exits_2_naming_the_flag(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    cfg = _config_with_a_journal(tmp_path)
    path = where if where.startswith("/") else str(tmp_path / where)
    res = cli("report", "-c", str(cfg), "--html", path, env={"TPUWATCH_STATE_DIR": str(tmp_path / "state")})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "--html" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_html_into_a_directory_exits_2_naming_the_flag(tmp_path: Path) -> None:
    res = cli("report", "-c", str(tmp_path / "none.toml"), "--html", str(tmp_path))
    assert res.returncode == 2 and "--html" in res.stderr, res.stderr


def test_without_the_extra_html_names_the_pip_command(tmp_path: Path) -> None:
    # The one boundary the simulator cannot reach is what is installed: a plotly that fails to
    # import stands in for a core install without the report extra.
    shim = tmp_path / "shim" / "plotly"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'plotly'\")\n")
    cfg = _config_with_a_journal(tmp_path)
    env = {"PYTHONPATH": str(shim.parent), "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    res = cli("report", "-c", str(cfg), "--html", str(tmp_path / "r.html"), env=env)
    assert res.returncode == 2 and PIP in res.stderr and "--html" in res.stderr, res.stderr
    assert not (tmp_path / "r.html").exists()
    plain = cli("report", "-c", str(cfg), env=env)  # the text report needs no extra
    assert plain.returncode == 0 and "goodput" in plain.stdout, plain.stderr


def _config_with_a_journal(tmp_path: Path) -> Path:
    from datetime import timedelta, timezone

    from tpuwatch.journal import Journal

    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\nzone = "us-central2-b"\n[job]\ncommand = "true"\n')
    t = datetime(2026, 11, 1, tzinfo=timezone.utc)
    with Journal.open(tmp_path / "state", "pod", "pod") as j, j.transaction():
        j.add_event(t, "phase", "start -> running", {"from": None, "to": "running", "row": "launch"})
        j.start_attempt(1, t, "n1", None)
        j.add_event(t + timedelta(minutes=5), "checkpoint", "step 10",
                    {"attempt": 1, "step": 10, "time": (t + timedelta(minutes=5)).isoformat()})
    return cfg


def test_the_demo_names_the_pip_command_without_the_extra(tmp_path: Path) -> None:
    # As above, a plotly that fails to import stands in for a core install.
    shim = tmp_path / "shim" / "plotly"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'plotly'\")\n")
    _config_with_a_journal(tmp_path)
    code = ("import sys; from pathlib import Path; from tpuwatch.journal import Journal; "
            "from tpuwatch.demo.run import _report; "
            "_report(Journal.open(Path(sys.argv[1]), 'pod', 'pod', readonly=True), 'pod', Path(sys.argv[2]), print)")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state"), str(tmp_path / "r.html")],
                         env={**os.environ, "PYTHONPATH": str(shim.parent)}, text=True, capture_output=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "where the time went" in res.stdout and PIP in res.stdout, res.stdout
    assert not (tmp_path / "r.html").exists()


def test_bench_report_finds_the_goodput_its_journal_was_built_with(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_report.py"
    res = subprocess.run([sys.executable, str(script), "--attempts", "6", "--runs", "1", "--json"],
                         text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["goodput"] == pytest.approx(out["goodput_by_construction"], abs=1e-6)
    assert out["html_bytes"] > 0 and out["events"] > 6 * 24
