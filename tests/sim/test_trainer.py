"""The toy trainer run as `python -m tpuwatch.sim.trainer`, the way workers run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tpuwatch.sim.trainer import is_complete

FAST = ["--step-time", "0.001"]


def trainer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpuwatch.sim.trainer", *args]


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("TRAINER_") and k != "TPUWATCH_CHECKPOINT"}
    full_env.update(env or {})
    return subprocess.run(trainer_cmd(*args), capture_output=True, text=True, timeout=60,
                          env=full_env, cwd=cwd)


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def steps_in(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def stored_step(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((path / "state" / "data.json").read_text())
    return data


def test_runs_to_completion_with_complete_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "bucket" / "ckpt"
    r = run("--steps", "20", "--ckpt-every", "5", "--ckpt-dir", str(ckpt), *FAST)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "worker 0: done at step 20"
    assert sum("saved" in line for line in r.stdout.splitlines()) == 4  # a line per checkpoint
    assert sorted(p.name for p in ckpt.iterdir()) == ["0", "10", "15", "20", "5"]  # no tmp left
    for step in (0, 5, 10, 15, 20):
        d = ckpt / str(step)
        assert is_complete(d)
        assert (d / "_CHECKPOINT_METADATA").is_file()
        assert (d / "commit_success.txt").is_file()
        assert stored_step(d)["step"] == step


def test_last_step_is_saved_even_off_the_interval(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert run("--steps", "7", "--ckpt-every", "5", "--ckpt-dir", str(ckpt), *FAST).returncode == 0
    assert steps_in(ckpt) == [0, 5, 7]


def test_killed_mid_checkpoint_leaves_incomplete_tmp_and_resumes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert run("--steps", "10", "--ckpt-every", "5", "--ckpt-dir", str(ckpt), *FAST).returncode == 0

    # resume from 10 with a slow save, and kill it while it saves step 15
    with subprocess.Popen(
            trainer_cmd("--steps", "20", "--ckpt-every", "5", "--ckpt-dir", str(ckpt),
                        "--resume", str(ckpt / "10"), "--ckpt-write-time", "60", *FAST),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        tmp = ckpt / "15.orbax-checkpoint-tmp-0"
        wait_for(lambda: (tmp / "state" / "data.json").exists())
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    assert tmp.is_dir() and not is_complete(tmp)
    assert not (tmp / "commit_success.txt").exists()
    assert not (ckpt / "15").exists()
    latest = max(steps_in(ckpt))
    assert latest == 10

    r = run("--steps", "20", "--ckpt-every", "5", "--ckpt-dir", str(ckpt),
            "--resume", str(ckpt / str(latest)), *FAST)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "at step 10" in r.stdout
    assert steps_in(ckpt) == [0, 5, 10, 15, 20]
    assert stored_step(ckpt / "20")["started_from"] == 10
    assert stored_step(ckpt / "10")["started_from"] == 0  # the resume step is not rewritten
    assert (ckpt / "15.orbax-checkpoint-tmp-0").is_dir()  # the leftover was not reused


def test_sigterm_exits_143_promptly_when_hung(tmp_path: Path) -> None:
    with subprocess.Popen(trainer_cmd("--steps", "100", "--hang-at", "3", *FAST),
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines: list[str] = []
        while "hanging" not in (line := proc.stdout.readline()):
            assert line, f"trainer ended without hanging: {lines}"
            lines.append(line)
        assert proc.poll() is None  # it stays hung
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 143
        except subprocess.TimeoutExpired:
            # a trainer that outlived its SIGTERM: what its signal masks and kernel wait say,
            # then killed, so the test fails at once, not hangs
            status = Path(f"/proc/{proc.pid}/status").read_text()
            said = [line for line in status.splitlines() if line.startswith(("State", "Sig", "Shd"))]
            wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
            proc.kill()
            raise AssertionError(f"the hung trainer outlived SIGTERM: {said}, wchan {wchan}") from None


def test_hold_at_stalls_after_the_checkpoint_until_the_test_lets_it_go(tmp_path: Path) -> None:
    ckpt, go = tmp_path / "ckpt", tmp_path / "go"
    go.mkdir()
    with subprocess.Popen(trainer_cmd("--steps", "20", "--ckpt-every", "5", "--ckpt-dir", str(ckpt),
                                      "--hold-at", "0,10", "--hold-until", str(go), *FAST),
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for step, saved in ((0, [0]), (10, [0, 5, 10])):
            while f"holding at step {step} until {go / str(step)} exists" not in (line := proc.stdout.readline()):
                assert line, f"trainer ended without holding at step {step}"
            assert proc.poll() is None and steps_in(ckpt) == saved
            (go / str(step)).touch()
        assert proc.wait(timeout=20) == 0
    assert steps_in(ckpt) == [0, 5, 10, 15, 20]
    # resumed at a hold step whose file is there: no stall
    r = run("--steps", "20", "--ckpt-dir", str(ckpt), "--resume", str(ckpt / "10"),
            "--hold-at", "10", "--hold-until", str(go), *FAST)
    assert r.returncode == 0 and "holding" not in r.stdout, r.stdout + r.stderr
    bad = run("--hold-at", "3", *FAST)
    assert bad.returncode == 2 and "--hold-at and --hold-until go together" in bad.stderr


def test_save_on_term_saves_the_step_it_reached_and_exits_0(tmp_path: Path) -> None:
    # As a JAX loop with Orbax's save-on-preemption: the SIGTERM step is saved, the loop ends (exit 0).
    ckpt = tmp_path / "ckpt"
    with subprocess.Popen(trainer_cmd("--steps", "100000", "--ckpt-every", "100000", "--ckpt-dir", str(ckpt),
                                      "--save-on-term", "1", "--step-time", "0.01", "--resume", ""),
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        while "training to step" not in proc.stdout.readline():
            pass
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        assert proc.wait(timeout=20) == 0, out
    saved = [int(p.name) for p in ckpt.iterdir() if p.name.isdigit() and int(p.name) > 0]
    assert len(saved) == 1 and f"saved {ckpt / str(saved[0])} at step {saved[0]}" in out, out
    assert stored_step(ckpt / str(saved[0]))["step"] == saved[0]


def test_crash_at_exits_with_the_code_before_saving(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    r = run("--steps", "20", "--ckpt-every", "5", "--ckpt-dir", str(ckpt),
            "--crash-at", "10", "--exit-code", "42", *FAST)
    assert r.returncode == 42
    assert "crash at step 10" in r.stderr
    assert steps_in(ckpt) == [0, 5]


def test_crash_once_crashes_only_the_first_time(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = ("--steps", "6", "--ckpt-every", "3", "--ckpt-dir", str(ckpt),
            "--crash-at", "4", "--exit-code", "3", "--crash-once", "crashed", *FAST)
    first = run(*args, cwd=tmp_path)
    assert first.returncode == 3
    assert (tmp_path / "crashed").exists()
    second = run(*args, "--resume", str(ckpt / "3"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "done at step 6" in second.stdout


def test_segfault(tmp_path: Path) -> None:
    r = run("--steps", "10", "--segfault-at", "2", *FAST)
    assert r.returncode == -signal.SIGSEGV


def test_faults_from_environment_and_worker_filter(tmp_path: Path) -> None:
    env = {"TRAINER_STEPS": "8", "TRAINER_STEP_TIME": "0.001", "TRAINER_CRASH_AT": "3",
           "TRAINER_EXIT_CODE": "9", "TRAINER_FAULT_WORKER": "1"}
    assert run(env={**env, "TPUWATCH_WORKER_ID": "1"}).returncode == 9
    ok = run(env={**env, "TPUWATCH_WORKER_ID": "0"})
    assert ok.returncode == 0 and "done at step 8" in ok.stdout
    assert run("--crash-at", "2", env={**env, "TRAINER_FAULT_WORKER": ""}).returncode == 9  # flag wins


def test_only_worker_zero_writes_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    r = run("--steps", "6", "--ckpt-every", "3", "--ckpt-dir", str(ckpt), *FAST,
            env={"TPUWATCH_WORKER_ID": "2"})
    assert r.returncode == 0
    assert "worker 2: step 3" in r.stdout and "worker 2: done at step 6" in r.stdout
    assert not ckpt.exists()


def test_resume_from_tpuwatch_checkpoint_env(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert run("--steps", "4", "--ckpt-every", "2", "--ckpt-dir", str(ckpt), *FAST).returncode == 0
    r = run("--steps", "6", "--ckpt-every", "2", "--ckpt-dir", str(ckpt), *FAST,
            env={"TPUWATCH_CHECKPOINT": str(ckpt / "4")})
    assert r.returncode == 0 and "at step 4" in r.stdout
    assert stored_step(ckpt / "6")["started_from"] == 4
    fresh = run("--steps", "1", "--resume", "", *FAST, env={"TPUWATCH_CHECKPOINT": str(ckpt / "4")})
    assert "fresh start" in fresh.stdout  # an empty --resume is a fresh start


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    tmp = tmp_path / "7.orbax-checkpoint-tmp-0"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "data.json").write_text('{"step": 7}')
    for args, env, text in [
        (["--resume", str(tmp)], {}, "is not a complete checkpoint"),
        (["--resume", str(tmp_path / "missing")], {}, "is not a complete checkpoint"),
        (["--ckpt-dir", "relative/dir"], {}, "must be an absolute path"),
        ([], {"TRAINER_CRASH_AT": "soon"}, "TRAINER_CRASH_AT='soon' is not a valid int"),
    ]:
        r = run(*args, *FAST, env=env)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().startswith("trainer: error:") and text in r.stderr
        assert "Traceback" not in r.stderr


def test_imports_stay_light() -> None:
    # it starts on every worker for every attempt: no heavy imports
    code = "import sys, tpuwatch.sim.trainer; print(' '.join(sorted(sys.modules)))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())
    # urllib.request (and http.client) alone was half a trainer's start-up CPU; only the metadata
    # read of a multislice hang needs it
    heavy = {"asyncssh", "grpc", "google", "click", "rich", "asyncio", "tpuwatch.sim.hosts", "urllib.request",
             "http.client"}
    assert not heavy & mods


def test_a_multislice_hang_logs_megascales_line_and_aborts_only_when_the_flags_ask() -> None:
    hang = ("--steps", "100", "--hang-at", "3", "--megascale-hang-threshold", "0.2", *FAST)
    aborting = run(*hang, env={"MEGASCALE_NUM_SLICES": "2",
                               "LIBTPU_INIT_ARGS": "--xla_foo=1 --megascale_error_reporter_abort_on_hang=true"})
    assert aborting.returncode == -signal.SIGABRT
    assert "Megascale hang detected: Timed out waiting for 1 graphs to complete at launch_id 3." in aborting.stderr
    # without the flag it stays hung after saying so
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("TRAINER_")}, "MEGASCALE_NUM_SLICES": "2"}
    with subprocess.Popen(trainer_cmd(*hang), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                          env=full) as proc:
        assert proc.stderr is not None
        assert "Megascale hang detected" in proc.stderr.readline()
        assert proc.poll() is None
        proc.kill()
        proc.communicate()
