"""The journal after a crash, on a full disk, and shared by processes.

A writer SIGKILLed inside a transaction, a state dir whose filesystem is full, two `watch`
processes and two cron `check`s on one job: each ends in a clear message and an intact journal.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import cli_process
import pytest
from chaos.harness import Watched

from tpuwatch.journal import Journal
from tpuwatch.policy import Memory
from tpuwatch.sim.simulator import Simulator

ZONE = "us-central2-b"


def _hot_journal(db: Path) -> None:
    """A process that dies by SIGKILL halfway through a big transaction (dirty pages spilled)."""
    script = (
        "import os, signal, sqlite3\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size = 1')\n"  # spill pages to the file before the commit
        "c.execute('BEGIN IMMEDIATE')\n"
        "for i in range(3000):\n"
        "    c.execute(\"INSERT INTO events (time, kind, reason) VALUES ('t', 'k', ?)\", ('x' * 400,))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr


def test_a_writer_killed_mid_transaction_leaves_a_journal_every_reader_can_open(tmp_path: Path) -> None:
    mem = Memory.initial(ZONE)
    with Journal.open(tmp_path, "job", "tpu", wait=False) as j, j.transaction():
        j.save_memory(mem)
    _hot_journal(tmp_path / "job.db")
    assert (tmp_path / "job.db-journal").stat().st_size > 0, "no hot journal: the test proves nothing"
    # `tpuwatch history` / `status` open it read-only: the unfinished write is rolled back, not
    # reported as corruption.
    with Journal.open(tmp_path, "job", None, readonly=True) as r:
        assert r.events() == [] and r.load_memory() == mem
        assert r.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Journal.open(tmp_path, "job", "tpu", wait=False) as w:
        assert w.load_memory() == mem and w.events() == []


def test_a_reader_that_may_not_write_is_told_what_to_do_not_that_the_journal_is_corrupt(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may write any file: no read-only reader to play")
    with Journal.open(tmp_path, "job", "tpu", wait=False) as j, j.transaction():
        j.save_memory(Memory.initial(ZONE))
    _hot_journal(tmp_path / "job.db")
    (tmp_path / "job.db").chmod(0o400)
    with pytest.raises(Exception) as err:
        Journal.open(tmp_path, "job", None, readonly=True)
    assert "killed" in str(err.value) and "corrupt" not in str(err.value)


# ---- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root or a user namespace; skipped where neither works)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(where: Path) -> Path:
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    return filler


def test_full_disk_under_the_journal_is_a_clear_error_and_corrupts_nothing(small_fs: Path) -> None:
    state = small_fs / "state"
    mem = Memory.initial(ZONE)
    with Journal.open(state, "job", "tpu", wait=False) as j, j.transaction():
        j.save_memory(mem)
    filler = _fill(small_fs)
    failures = []
    for _ in range(3):  # the lock file's pid line, the rollback journal, the pages: all may fail
        try:
            with Journal.open(state, "job", "tpu", wait=False) as j, j.transaction():
                for _ in range(200):
                    j.add_event(datetime.now(timezone.utc), "launch", "y" * 4000)
        except Exception as exc:  # noqa: BLE001 - the kind and text are what is checked
            failures.append(exc)
    assert len(failures) == 3
    for exc in failures:
        text = str(exc)
        assert type(exc).__name__ == "JournalError", repr(exc)
        assert "disk is full" in text and str(state) in text and "Free space" in text, text
    os.unlink(filler)
    with Journal.open(state, "job", "tpu", wait=False) as j:
        assert j.load_memory() == mem and j.events() == []
        assert j.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    shutil.rmtree(state)


def _config(tmp: Path, key: Path) -> Path:
    cfg = tmp / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\nproject = "sim-project"\nzone = "us-central2-b"\n'
                   '[job]\ncommand = "true"\n'
                   f'[ssh]\nidentity_file = "{key}"\n')
    return cfg


def _key(tmp: Path) -> Path:
    key = tmp / "id"
    key.write_text("not really a key\n")
    key.chmod(0o600)
    return key


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_process.run(args, env)


def test_check_on_a_full_disk_says_so_with_exit_1_and_a_later_check_works(
        small_fs: Path, tmp_path: Path, sim_api: object) -> None:
    cfg = _config(tmp_path, _key(tmp_path))
    env = {**os.environ, "TPUWATCH_STATE_DIR": str(small_fs / "state")}
    filler = _fill(small_fs)
    fresh = _cli(env, "check", "-c", str(cfg))  # no journal yet, and no room to make one
    assert fresh.returncode == 1, fresh
    assert "disk is full" in fresh.stderr and "Traceback" not in fresh.stderr + fresh.stdout, fresh.stderr
    os.unlink(filler)
    first = _cli(env, "check", "-c", str(cfg))  # the node is missing: a person must look (exit 1)
    assert first.returncode == 1 and "missing" in first.stdout, first
    before = _cli(env, "history", "-c", str(cfg), "--json").stdout
    filler = _fill(small_fs)
    full = _cli(env, "check", "-c", str(cfg))
    assert full.returncode == 1 and "disk is full" in full.stderr and "unchanged" in full.stderr, full
    assert "Traceback" not in full.stderr
    os.unlink(filler)
    assert _cli(env, "history", "-c", str(cfg), "--json").stdout == before  # nothing half-written


# ---- two processes, one job -------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_watch_on_the_same_job_refuses_and_the_first_carries_on(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=11, steps=300)
    # held at step 100 until the second watch has been refused: a 6 s job could otherwise end, and
    # free the job's lock, while a loaded machine starts the second watch
    job.set_steps(300, hold_at=100)
    try:
        job.start()
        job.running_with_progress()
        second = job.cli("watch", "-c", str(job.cfg), timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "another tpuwatch" in second.stderr and "is working on pod" in second.stderr, second.stderr
        assert job.proc is not None and job.proc.poll() is None, "the first watch stopped"
        job.release(100)
        job.assert_invariants(job.finish(timeout=60))
    finally:
        job.close()


@pytest.mark.slow
def test_two_cron_checks_at_once_one_acts_the_other_exits_0(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=12, steps=10_000)
    try:
        first = job.cli("check", "-c", str(job.cfg))  # the job is launched
        assert first.returncode == 0, first.stdout + first.stderr
        # 5 s per call: the first check's tick lasts well past the second's start-up, even on a
        # busy machine where starting a Python process takes seconds
        sim.inject("slow-api", latency="3000s", jitter=0)
        base = sim.world.call_count("GetNode")
        a = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "check", "-c", str(job.cfg)], env=job.env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        # the first check holds the job's lock while it waits for the (slow) API
        job.wait(lambda: sim.world.call_count("GetNode") > base, timeout=30, what="the first check's tick")
        b = job.cli("check", "-c", str(job.cfg))
        out_a, err_a = a.communicate(timeout=120)
        assert a.returncode == 0 and "another tpuwatch" not in out_a, out_a + err_a
        assert "running" in out_a, out_a  # it looked and reported
        assert b.returncode == 0, b.stdout + b.stderr
        assert "another tpuwatch" in b.stdout and "is working on pod" in b.stdout, b.stdout + b.stderr
        assert sim.world.call_count("GetNode") == base + 1, "the second check must not have ticked"
    finally:
        sim.world.clear_errors()
        job.close()
