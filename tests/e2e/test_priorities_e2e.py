"""End to end: job priorities ([job] priority) between two jobs of one `tpuwatch watch`.

Job `hi` (priority 500, a Spot node `hi`) and job `lo` (priority 100, node `lo`), one worker
each, v4-8, both with a [tpu.spec]. `hi` is preempted with no spare: `lo` is stopped uncharged
(saving on its SIGTERM), its node relabelled `hi`'s, and `hi` trains there; `hi`'s own node,
made again from its spec, is handed to `lo`, which resumes on it from its own checkpoint. Each
trainer holds at step 100 until the test lets it go, so each stage meets running jobs however
slow the machine. Outcomes come from the simulated world (labels, processes), the checkpoints
and the journals.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_helpers import (
    Overlap,
    checkpoint_steps,
    finish,
    job_memory,
    node_trainers,
    trainer,
    wait_while_watched,
    write_config,
)
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200
SPEC = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}


def job(sim: Simulator, tmp: Path, name: str, priority: int | None, spot: bool = False) -> tuple[Path, Path]:
    """Node `name` READY, labelled job `name`'s; the job's config (with `priority`), and the
    directory whose file `100` lets its trainer past step 100."""
    sim.create_node(name, "v4-8", labels={"tpuwatch-job": name}, spot=spot)
    ck = sim.bucket / name
    go = tmp / f"go-{name}"
    go.mkdir()
    cfg = write_config(tmp / f"{name}.toml", sim, trainer(ck, f"--hold-at 100 --hold-until {go} --save-on-term 1",
                                                          steps=STEPS), ck, name=name, spec=SPEC)
    if priority is not None:
        cfg.write_text(cfg.read_text().replace("[job]\n", f"[job]\npriority = {priority}\n", 1))
    return cfg, go


def trainers(sim: Simulator, node: str) -> list[dict[str, str]]:
    return node_trainers(sim, node, ("hi", "lo"))


def on(sim: Simulator, node: str, who: str, attempt: int) -> dict[str, str] | None:
    return next((e for e in trainers(sim, node) if e["TPUWATCH_JOB"] == who and e["TPUWATCH_ATTEMPT"] == str(attempt)),
                None)


def labels(sim: Simulator, node: str) -> dict[str, str]:
    got = TpuAdapter(sim.project, sim.zone).get_node(node)
    return dict(got.labels) if got is not None else {}


def history(cfg: Path, env: dict[str, str]) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "history", "-c", str(cfg), "--json"], env=env,
                         text=True, capture_output=True, timeout=60).stdout
    return list(json.loads(out)["attempts"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, job: str) -> float | None:
    return got.get((name, frozenset({"job_name": job}.items())))


def scrape(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.status, r.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return getattr(exc, "code", 0), ""


def status(cfg: Path, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "status", "-c", str(cfg), "--json"], env=env,
                         text=True, capture_output=True, timeout=60)
    return json.dumps(json.loads(out.stdout)["nodes"])


def relabels(tmp: Path, job: str) -> list[str]:
    with Journal.open(tmp / "state", job, job, readonly=True) as journal:
        return [e.reason for e in journal.events() if e.kind == "relabel"]


class Lines:
    """A watch process whose output is read as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, pred: Callable[[], bool], what: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            if pred():
                return
            time.sleep(0.1)
        self.proc.kill()
        self._thread.join(5)
        raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(self.lines[-30:])[-6000:])

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("watch did not finish:\n" + "\n".join(self.lines[-30:])[-6000:]) from None
        self._thread.join(5)
        return rc, "\n".join(self.lines)


def test_a_preempted_high_priority_job_takes_the_low_ones_node_and_hands_its_own_back_when_made_again(
        sim: Simulator, tmp_path: Path) -> None:
    hi, go_hi = job(sim, tmp_path, "hi", 500, spot=True)
    lo, go_lo = job(sim, tmp_path, "lo", 100)
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(hi), "-c", str(lo), "--json",
                             "--metrics-port", str(port)],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lines = Lines(proc)  # its JSON read as it comes: a full pipe would stall the watcher
    overlap = Overlap(sim, ("hi", "lo"), ("hi", "lo"))
    try:
        lines.wait(lambda: on(sim, "hi", "hi", 1) is not None and on(sim, "lo", "lo", 1) is not None
                   and len(checkpoint_steps(sim.bucket / "lo")) >= 2
                   and labels(sim, "lo").get("tpuwatch-priority") == "100"
                   and labels(sim, "hi").get("tpuwatch-priority") == "500",
                   "both jobs training, each node labelled with its job's priority")
        sim.world.stockout()  # hi's own node is not made again until the test lifts it: a stage to look at
        sim.inject("preempt", node="hi")
        lines.wait(lambda: on(sim, "lo", "hi", 2) is not None, "job hi's attempt 2 on node lo")
        taken = labels(sim, "lo")
        assert (taken["tpuwatch-job"], taken["tpuwatch-lent-by"]) == ("hi", "lo"), taken
        assert "tpuwatch-wanted-by" not in taken, taken
        mem = job_memory(tmp_path / "state", "lo")
        assert mem is not None and dict(mem.limp.lent) == {"lo": "hi"}, mem
        assert on(sim, "lo", "lo", 1) is None and on(sim, "lo", "lo", 2) is None  # lo waits, trains nowhere
        # said plainly: status shows node lo held by job hi, taken from job lo, and why
        shown = status(lo, env)
        assert "runs on lo, taken from job lo of a lower priority" in shown, shown
        # and the commands that reach a job's workers outside a watch say where lo is: nowhere
        pre = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "precheck", "-c", str(lo)], env=env,
                             text=True, capture_output=True, timeout=60)
        assert pre.returncode == 1 and "job lo's slice lo is lent to job hi" in pre.stderr, (pre.stdout, pre.stderr)
        # and lo's own side: its node lent to job hi, and why it waits
        assert "slice lo lent to job hi, which asked for its node with a higher priority; waiting for a node " \
               "handed back or a spare" in json.loads(shown)[0]["config_job"]["job"], shown
        # and the metrics: each job's priority, lo's slot lent, hi's node taken
        code, text = scrape(port)
        got = parse(text)
        assert code == 200 and [value(got, name, job) for name, job in (
            ("tpuwatch_job_priority", "hi"), ("tpuwatch_job_priority", "lo"), ("tpuwatch_slots_lent", "lo"),
            ("tpuwatch_slots_lent", "hi"), ("tpuwatch_nodes_taken", "hi"), ("tpuwatch_nodes_taken", "lo"))] == [
            500, 100, 1, 0, 1, 0], text
        sim.inject("clear-errors")
        lines.wait(lambda: on(sim, "hi", "lo", 2) is not None, "job lo's attempt 2 on node hi, made again", 150)
        # lo's now, and once lo runs there its label step drops the hand-back's mark (the journal keeps it)
        lines.wait(lambda: labels(sim, "hi").get("tpuwatch-job") == "lo" and "tpuwatch-returned-by" not in
                   labels(sim, "hi"), "node hi labelled lo's, tpuwatch-returned-by dropped", 60)
        resumed = on(sim, "hi", "lo", 2)
        assert resumed is not None and on(sim, "lo", "hi", 2) is not None  # hi stays on the node it took
        (go_hi / "100").touch()
        (go_lo / "100").touch()
        rc, out = lines.finish(150)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    # each tick's JSON (as `check --json` writes it) says what the job took or lent, from or to whom, and why
    ticks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    said = {j: {line for t in ticks if t.get("job") == j and t.get("priority") for line in t["priority"]["said"]}
            for j in ("hi", "lo")}
    assert "slice lo lent to job hi, which asked for its node with a higher priority; waiting for a node handed back " \
           "or a spare" in said["lo"], said
    assert any(line.startswith("runs on lo, taken from job lo of a lower priority") for line in said["hi"]), said
    assert any(t.get("job") == "lo" and t.get("row") == "give" for t in ticks)
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    assert checkpoint_steps(sim.bucket / "hi")[-1] == STEPS and checkpoint_steps(sim.bucket / "lo")[-1] == STEPS
    for cfg in (hi, lo):
        done = history(cfg, env)
        assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    # lo resumed on the node handed back from what it saved on its SIGTERM, in its own checkpoints
    lo_done = history(lo, env)
    assert int(resumed["TPUWATCH_STEP"]) == lo_done[1]["start_step"], (resumed, lo_done)
    assert lo_done[1]["start_step"] > lo_done[0]["end_step"] - 1, lo_done  # type: ignore[operator]
    assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") >= 1  # hi's own, remade
    # and the journals say each hand-over, before it was done
    assert any("relabelled lo (tpuwatch-job=hi, tpuwatch-lent-by=lo" in e for e in relabels(tmp_path, "lo"))
    assert any("relabelled hi (tpuwatch-job=lo, tpuwatch-returned-by=hi" in e for e in relabels(tmp_path, "hi"))


def test_a_job_without_a_priority_never_gives_its_node(sim: Simulator, tmp_path: Path) -> None:
    hi, go_hi = job(sim, tmp_path, "hi", 500, spot=True)
    lo, go_lo = job(sim, tmp_path, "lo", None)
    env = {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "watch", "-c", str(hi), "-c", str(lo)], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_while_watched(lambda: on(sim, "hi", "hi", 1) is not None and on(sim, "lo", "lo", 1) is not None, proc,
                           "both jobs training")
        sim.inject("preempt", node="hi")
        # hi makes its own node again and resumes there; lo's node is never asked for nor given
        wait_while_watched(lambda: on(sim, "hi", "hi", 2) is not None, proc, "job hi's attempt 2 on its own node",
                           timeout=150)
        assert on(sim, "lo", "lo", 1) is not None and labels(sim, "lo") == {"tpuwatch-job": "lo"}
        (go_hi / "100").touch()
        (go_lo / "100").touch()
        rc, out = finish(proc, timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert [a["outcome"] for a in history(lo, env)] == ["success"]
