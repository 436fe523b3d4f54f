"""`tpuwatch run` against the simulator: its gRPC TPU API for the node, real ssh to the workers,
the toy trainer as the job, the simulator's bucket as the checkpoint directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import cli_process
import pytest

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.commands.run import Output, Runner, Verdict, judge
from tpuwatch.config import load_config
from tpuwatch.errors import JobFailed
from tpuwatch.model import NodeSnapshot, WorkerProbe
from tpuwatch.sim import trainer
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers.protocol import FollowEnd
from tpuwatch.workers.sshworkers import SshWorkers

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs the OpenSSH client")

TRAIN = ("python3 -m tpuwatch.sim.trainer --steps {steps} --step-time 0.02 --ckpt-every 10 "
         "--ckpt-dir {ckdir} --resume={{checkpoint}}")


# ---- judge: when has the attempt ended? (pure) ------------------------------------------------


def P(w: int, state: str, code: int | None = None, attempt: int = 2) -> WorkerProbe:
    return WorkerProbe(worker=w, state=state, attempt=attempt, exit_code=code)  # type: ignore[arg-type]


@pytest.mark.parametrize("probes, lead_end, expected", [
    ([P(0, "running"), P(1, "running")], None, None),
    ([P(0, "running"), P(1, "exited", 0)], None, None),  # another worker may finish first
    ([P(0, "exited", 0), P(1, "running")], None, Verdict(0, "worker 0 exited 0: attempt 2 finished", 0, 0)),
    ([P(0, "running"), P(1, "running")], FollowEnd("ok", 0), Verdict(0, "worker 0 exited 0: attempt 2 finished", 0, 0)),
    ([P(0, "running"), P(1, "exited", 3)], None, Verdict(1, "worker 1 exited with code 3 (attempt 2)", 1, 3)),
    ([P(0, "exited", 137), P(1, "running")], None, Verdict(1, "worker 0 exited with code 137 (attempt 2)", 0, 137)),
    ([P(0, "running"), P(1, "running", attempt=3)], None, None),  # checked below: a new attempt
])
def test_judge(probes: list[WorkerProbe], lead_end: FollowEnd | None, expected: Verdict | None) -> None:
    got = judge(probes, 2, lead_end, {})
    if probes[1].attempt == 3:
        assert got is not None and got.code == 1 and "attempt 3" in got.message
    else:
        assert got == expected


def test_judge_gives_an_unreachable_worker_a_few_chances() -> None:
    misses: dict[int, int] = {}
    probes = [P(0, "running"), WorkerProbe(1, "unreachable", detail="Connection refused")]
    assert judge(probes, 2, None, misses, limit=3) is None
    assert judge(probes, 2, None, misses, limit=3) is None
    assert judge([P(0, "running"), P(1, "running")], 2, None, misses, limit=3) is None  # back: reset
    assert judge(probes, 2, None, misses, limit=3) is None
    assert judge(probes, 2, None, misses, limit=3) is None
    v = judge(probes, 2, None, misses, limit=3)
    assert v is not None and v.code == 1 and v.worker == 1 and "Connection refused" in v.message
    gone = judge([P(0, "running"), WorkerProbe(1, "absent", attempt=2, detail="killed")], 2, None, {})
    assert gone is not None and gone.code == 1 and "worker 1" in gone.message


# ---- helpers ----------------------------------------------------------------------------------


def write_config(path: Path, sim: Simulator, command: str, checkpoint_dir: Path | str,
                 env: dict[str, str] | None = None) -> Path:
    lines = [
        "[tpu]", 'name = "pod"',
        "[job]", f"command = {json.dumps(command)}", f"checkpoint_dir = {json.dumps(str(checkpoint_dir))}",
    ]
    if env:
        lines.append("[job.env]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in env.items()]
    lines += [
        "[recovery]", 'poll_interval = "0.3s"', 'stop_grace = "2s"',
        "[ssh]", f"user = {json.dumps(sim.ssh_user)}", f"identity_file = {json.dumps(str(sim.ssh_key))}",
        f"port = {sim.ssh_port}", "internal_ip = true",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def tpuwatch(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return cli_process.run(args, env, timeout=120, cwd=None if cwd is None else str(cwd))


def job_pids(sim: Simulator, job: str = "pod") -> list[int]:
    out = []
    for pid in sim.hosts.pids(sim.node_key("pod")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"\0TPUWATCH_JOB={job}\0".encode() in b"\0" + env:
            out.append(pid)
    return out


def pwned_files(*roots: Path) -> list[Path]:
    return [p for r in roots for p in r.rglob("pwned")]


@pytest.fixture
def env(sim: Simulator, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **sim.env, "TPUWATCH_STATE_DIR": str(tmp_path / "state")}


# ---- the command end to end -------------------------------------------------------------------


@pytest.mark.slow
def test_run_resumes_a_4_worker_job_from_a_hostile_checkpoint_name_and_exits_0(
        sim: Simulator, tmp_path: Path, env: dict[str, str]) -> None:
    sim.create_node("pod", "v4-32")
    ckdir = sim.bucket / "it's $(touch pwned)"
    trainer.save(ckdir, 10, 0, 0)
    trainer.save(ckdir, 20, 0, 0)
    (ckdir / f"30{trainer.TMP_MARK}0").mkdir()  # a save that never committed: not chosen
    cfg = write_config(tmp_path / "tpuwatch.toml", sim,
                       "python3 -m tpuwatch.sim.trainer --steps 40 --step-time 0.02 --ckpt-every 10 "
                       "--ckpt-dir=\"$(dirname -- \"$TPUWATCH_CHECKPOINT\")\" --resume={checkpoint}", ckdir)
    r = tpuwatch(["run", "-c", str(cfg), "--all-logs"], env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    resumed = f"resumed from {ckdir}/20 at step 20, training to step 40"
    for w in range(4):
        assert f"[w{w}] worker {w}: {resumed}" in r.stdout
    assert "[w0] worker 0: done at step 40" in r.stdout
    assert f"attempt 1 launched on 4 worker(s) from step 20 ({ckdir}/20)" in r.stderr
    assert "worker 0 exited 0: attempt 1 finished" in r.stderr
    assert (ckdir / "40" / trainer.COMMIT_FILE).exists()
    assert pwned_files(sim.root, tmp_path) == [] and not Path("pwned").exists()
    assert job_pids(sim) == []
    # a second run is attempt 2 and starts where the first ended
    r2 = tpuwatch(["run", "-c", str(cfg)], env, cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert f"attempt 2 launched on 4 worker(s) from step 40 ({ckdir}/40)" in r2.stderr
    assert f"worker 0: resumed from {ckdir}/40 at step 40" in r2.stdout
    assert "[w" not in r2.stdout and "worker 1:" not in r2.stdout  # only worker 0, unprefixed


@pytest.mark.slow
def test_a_failing_worker_fails_the_run_naming_it_and_its_code(
        sim: Simulator, tmp_path: Path, env: dict[str, str]) -> None:
    sim.create_node("pod", "v4-32")
    ckdir = sim.bucket / "ck"
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, TRAIN.format(steps=2000, ckdir=ckdir), ckdir,
                       env={"TRAINER_CRASH_AT": "3", "TRAINER_FAULT_WORKER": "2", "TRAINER_EXIT_CODE": "3"})
    r = tpuwatch(["run", "-c", str(cfg)], env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "worker 2 exited with code 3 (attempt 1)" in r.stderr
    assert "no complete checkpoint" in r.stderr and "fresh start" in r.stderr
    assert job_pids(sim) == []  # everything stopped


@pytest.mark.slow
def test_ctrl_c_detaches_and_a_second_run_follows_then_stops_with_stop_on_exit(
        sim: Simulator, tmp_path: Path, env: dict[str, str]) -> None:
    sim.create_node("pod", "v4-8")
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, "echo started; exec sleep 600", "")

    def start(*flags: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", "run", "-c", str(cfg), *flags],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)

    seen: list[str] = []

    def until(proc: subprocess.Popen[str], text: str, stdout: bool = False) -> None:
        stream = proc.stdout if stdout else proc.stderr
        assert stream is not None
        for line in stream:
            seen.append(line)
            if text in line:
                return
        raise AssertionError(f"{text!r} never said; stderr: {''.join(seen)}")

    p = start()
    until(p, "attempt 1 launched")
    until(p, "started", stdout=True)  # the log streams
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "detached: attempt 1 keeps running" in err
    pids = job_pids(sim)
    assert pids, "the job should still run after a detach"

    p2 = start("--stop-on-exit")
    until(p2, "attempt 1 already runs on all 1 workers")
    os.killpg(p2.pid, signal.SIGINT)
    out2, err2 = p2.communicate(timeout=60)
    assert p2.returncode == 130, "".join(seen) + err2
    assert "attempt 1 stopped" in err2
    assert job_pids(sim) == []


# ---- bad input ------------------------------------------------------------------------------


def test_an_unreadable_key_is_exit_2_naming_ssh_identity_file(tmp_path: Path) -> None:
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "true"\n'
                   f'[ssh]\nidentity_file = "{tmp_path}/missing-key"\n')
    r = tpuwatch(["run", "-c", str(cfg)], {**os.environ, "TPUWATCH_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2
    assert "ssh.identity_file" in r.stderr and "Traceback" not in r.stderr


def test_an_unknown_placeholder_is_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text('[tpu]\nname = "pod"\n[job]\ncommand = "python3 t.py --resume=\\"{checkpoint}\\""\n')
    r = tpuwatch(["run", "-c", str(cfg)], {**os.environ, "TPUWATCH_STATE_DIR": str(tmp_path / "s")})
    assert r.returncode == 2
    assert "job.command: {checkpoint} is inside double quotes" in r.stderr


def _runner(sim: Simulator, tmp_path: Path, command: str, ckdir: Path | None) -> tuple[Runner, list[str], list[str]]:
    cfg = load_config(write_config(tmp_path / "tpuwatch.toml", sim, command, ckdir or ""))
    out: list[str] = []
    notes: list[str] = []
    checkpoints = None
    if ckdir is not None:
        from tpuwatch.checkpoints import CheckpointDir

        checkpoints = CheckpointDir(str(ckdir))
    workers = SshWorkers.from_config(cfg, retry_wait=0.01)
    return (Runner(workers, checkpoints=checkpoints, checkpoint_label=str(ckdir), poll=0.3,
                   out=Output(write=out.append, note_write=notes.append)), out, notes)


def test_a_foreign_checkpoint_dir_is_a_fresh_start_and_says_so(sim: Simulator, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    sim.create_node("pod", "v4-8")
    foreign = sim.bucket / "foreign"
    (foreign / "notes").mkdir(parents=True)
    (foreign / "README.txt").write_text("not a checkpoint")
    (foreign / "12").mkdir()  # a step-like name, but nothing committed in it
    runner, out, notes = _runner(sim, tmp_path, "echo resume=[{checkpoint}] step=[{step}]", foreign)
    node = TpuAdapter(sim.project, sim.zone).get_node("pod")
    assert node is not None
    assert runner.run(node) == 0
    assert any(f"no complete checkpoint in {foreign}: fresh start" in n for n in notes), notes
    assert out == ["resume=[] step=[]"]


def test_an_unreachable_worker_or_unusable_node_is_exit_1(sim: Simulator, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    sim.create_node("pod", "v4-8")
    node = TpuAdapter(sim.project, sim.zone).get_node("pod")
    assert node is not None
    runner, _, _ = _runner(sim, tmp_path, "true", None)
    sim.hosts.down(sim.node_key("pod"))
    with pytest.raises(JobFailed) as err:
        runner.run(node)
    assert err.value.exit_code == 1
    assert "worker 0 of pod is unreachable" in str(err.value) and "Connection refused" in str(err.value)
    repairing = NodeSnapshot(**{**node.__dict__, "state": "REPAIRING"})
    with pytest.raises(JobFailed, match="REPAIRING.*does not recover"):
        runner.run(repairing)


@pytest.mark.slow
def test_run_checks_the_workers_before_it_launches(sim: Simulator, tmp_path: Path, env: dict[str, str]) -> None:
    """The environment checks run before every launch, `run`'s included. A stale libtpu
    lockfile is fixed by the cleanup and the launch goes ahead; a missing device is not fixable,
    and `run` (which does not recover) stops before launching, naming the worker."""
    sim.create_node("pod", "v4-32")
    cfg = write_config(tmp_path / "tpuwatch.toml", sim, "echo started-{worker}", "")
    sim.inject("stale-lockfile", node="pod", worker=2)
    r = tpuwatch(["run", "-c", str(cfg)], env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "environment checks passed" in r.stderr, r.stderr
    sim.inject("device-missing", node="pod", worker=1)
    r2 = tpuwatch(["run", "-c", str(cfg)], env, cwd=tmp_path)
    assert r2.returncode == 1, r2.stderr
    assert "environment checks failed, nothing launched" in r2.stderr and "w1" in r2.stderr, r2.stderr
    assert "attempt 2 launched" not in r2.stderr
