"""Security: secrets never printed or journaled, every value quoted on its way
to a remote shell, private files on the workers and in the state dir, and an ownership rule
that a look-alike label cannot pass.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from chaos.harness import Watched
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuwatch.model import Checkpoint
from tpuwatch.sim.simulator import Simulator
from tpuwatch.workers import protocol

KEY_MATERIAL = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDtpuwatchSECRETKEY"
REFRESH = "1//0gTPUWATCH-SECRET-REFRESH-TOKEN"
API_KEY = "wandb-SECRET-7f3a9c1e"
HF_TOKEN = "hf_SECRETtpuwatch0123456789abcdefghij"  # written in the job's command, as people do
SECRETS = (KEY_MATERIAL, REFRESH, API_KEY, HF_TOKEN, "tpuwatchSECRETKEY", "SECRET-REFRESH", "SECRET-7f3a9c1e",
           "SECRETtpuwatch0123")


def fake_credentials(tmp: Path) -> Path:
    """A service-account file as `gcloud iam service-accounts keys create` writes it (fake key)."""
    path = tmp / "sa.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "sim-project", "private_key_id": "0123abcd" * 5,
        "private_key": f"-----BEGIN PRIVATE KEY-----\n{KEY_MATERIAL}\n-----END PRIVATE KEY-----\n",
        "client_email": "tpuwatch@sim-project.iam.gserviceaccount.com", "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token", "refresh_token": REFRESH,
    }))
    path.chmod(0o600)
    return path


def leaks(text: str | bytes) -> list[str]:
    data = text.encode(errors="replace") if isinstance(text, str) else text
    return [s for s in SECRETS if s.encode() in data]


def state_files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_no_secret_is_printed_or_journaled_in_any_flow(sim: Simulator, tmp_path: Path) -> None:
    """A credentials file, a job.env API key and a token in the command itself, through a
    recreate and every reading command."""
    creds = fake_credentials(tmp_path)
    job = Watched(sim, tmp_path, "pod", seed=21, recreatable=True, steps=200, repair_timeout="0.5s",
                  env={"GOOGLE_APPLICATION_CREDENTIALS": str(creds)}, job_env={"WANDB_API_KEY": API_KEY},
                  command_prefix=f"HF_TOKEN={HF_TOKEN} ")
    outputs: dict[str, str] = {}
    try:
        job.start()
        job.running_with_progress()
        # the job did get its key: the trainer's environment on a worker holds it
        key = sim.node_key("pod")
        pid = next(iter(job.sampler.trainers().values()))[0][0]
        assert f"WANDB_API_KEY={API_KEY}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        assert f"HF_TOKEN={HF_TOKEN}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        assert API_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        sim.inject("maintenance", node="pod", stuck="REPAIRING")
        rc = job.finish(timeout=120)
        outputs["watch"] = job.output()
        assert rc == 0, outputs["watch"][-3000:]
        assert sim.world.node("pod").spec.labels.get("tpuwatch-job") == "pod"
        # the recreated node's metadata (readable by anyone with tpu.nodes.get) holds no key:
        # its startup script only set up, and the watcher started the job over SSH
        outputs["recreated node metadata"] = repr(sim.world.node("pod").spec.metadata)
        assert sim.world.node("pod").spec.metadata.get("tpuwatch-env-withheld") == "true"
        assert sim.world.node("pod").spec.metadata.get("tpuwatch-command-withheld") == "true"
        assert "looks like it holds a credential (HF_TOKEN=…" in outputs["watch"]
        for args in (["check", "-c", str(job.cfg), "--json"], ["check", "-c", str(job.cfg), "--dry-run"],
                     ["history", "-c", str(job.cfg)], ["history", "-c", str(job.cfg), "--json"],
                     ["status", "pod", "--json"], ["status", "pod", "-c", str(job.cfg)],
                     ["events", "pod", "--json"], ["recreate", "pod", "-c", str(job.cfg), "--dry-run", "--json"],
                     ["recreate", "pod", "-c", str(job.cfg), "--dry-run"],
                     ["init", "pod", "-o", str(tmp_path / "init.toml"), "--json"],
                     ["run", "-c", str(job.cfg), "--json"], ["--debug", "status", "nosuchnode"]):
            r = job.cli(*args, timeout=90)
            outputs[" ".join(args)] = r.stdout + r.stderr
            assert "Traceback" not in r.stderr or args[0] == "--debug", r.stderr
        # the worker side: the launch script travels on ssh's stdin, never in an argv
        for w in range(2):
            home = sim.hosts.worker_home(key, w)
            for log in (home / ".tpuwatch" / "pod").glob("attempt-*.log"):
                outputs[f"w{w} {log.name}"] = log.read_text(errors="replace")
        # and without the emulator, the credentials file is really read: its errors show no key
        no_emu = {k: v for k, v in job.env.items() if k != "TPUWATCH_EMULATOR_HOST"}
        r = subprocess.run([*job.cli_argv(), "status", "pod", "--project", "sim-project", "--zone",
                            "us-central2-b"], env=no_emu, text=True, capture_output=True, timeout=60)
        outputs["status with the credentials file"] = r.stdout + r.stderr
        assert r.returncode == 3, r.stdout + r.stderr
    finally:
        job.close()
    found = {name: leaks(text) for name, text in outputs.items() if leaks(text)}
    assert found == {}, found
    files = state_files(job.state_dir)
    assert any(name.endswith("pod.db") for name in files)
    found = {name: leaks(data) for name, data in files.items() if leaks(data)}
    assert found == {}, found  # the journal, the known_hosts, the lock


# ---- quoting ----------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
_name = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True)  # not "_": bash sets $_ itself


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(_name, _text, max_size=3), path=_text, step=st.integers(0, 10**9))
def test_the_launch_script_delivers_every_value_intact_and_runs_none(
        env: dict[str, str], path: str, step: int, tmp_path: Path) -> None:
    """The whole launch (remote.sh as a worker runs it, detached) with arbitrary env values and
    checkpoint path: the command sees exactly those bytes, and nothing in them is executed."""
    home = tmp_path / f"h{time.monotonic_ns()}"
    home.mkdir()
    out = home / "seen"
    names = sorted(env)
    template = ("printf '%s\\0' {checkpoint} \"$TPUWATCH_CHECKPOINT\" \"$TPUWATCH_STEP\" "
                + " ".join(f'"${n}"' for n in names) + f" > {out}")
    ck = Checkpoint(path=path, step=step, layout="orbax")
    command = protocol.render_command(template, checkpoint=path, step=step, attempt=1, worker=0)
    data = protocol.launch_script("job", attempt=1, worker=0, checkpoint=ck, command=command, env=env)
    run_env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    r = subprocess.run(["/bin/bash", "-c", protocol.REMOTE_COMMAND], input=protocol.framed(data), capture_output=True,
                       env=run_env, cwd=home, timeout=20)
    assert protocol.parse_records(r.stdout.decode()).get("result") == "launched", r
    exit_file = home / ".tpuwatch" / "job" / "exit_code"
    deadline = time.monotonic() + 10
    while not exit_file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exit_file.read_text().strip() == "0"
    got = out.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
    assert got == [path, path, str(step), *[env[n] for n in names]]
    assert sorted(p.name for p in home.iterdir()) == [".tpuwatch", "seen"], "something else ran"


# ---- private files ----------------------------------------------------------------------------


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.slow
def test_worker_files_are_private_and_the_jobs_own_files_keep_the_users_umask(
        sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=22, steps=10_000)
    try:
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
        key = sim.node_key("pod")
        for w in range(2):
            home = sim.hosts.worker_home(key, w)
            top, jobdir = home / ".tpuwatch", home / ".tpuwatch" / "pod"
            assert mode(top) == 0o700 and mode(jobdir) == 0o700, (oct(mode(top)), oct(mode(jobdir)))
            files = {p.name: mode(p) for p in jobdir.iterdir()}
            assert {"lock", "attempt", "pid", "attempt-1.log"} <= set(files), files
            assert all(m == 0o600 for m in files.values()), {k: oct(v) for k, v in files.items()}
        # The trainer's checkpoints are the user's files: written with the login's umask (the
        # simulated workers run with this process's), not tpuwatch's private 077.
        login = os.umask(0)
        os.umask(login)
        ckpt = job.ck / str(job.steps_done()[0]) / "commit_success.txt"
        assert mode(ckpt) == 0o666 & ~login, oct(mode(ckpt))
    finally:
        job.close()


@pytest.mark.slow
def test_the_state_dir_is_private_and_a_shared_one_is_refused(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=23, steps=10_000)
    try:
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        assert mode(job.state_dir) == 0o700
        for name in ("pod.db", "pod.lock"):
            assert mode(job.state_dir / name) == 0o600, (name, oct(mode(job.state_dir / name)))
        # ssh writes its known_hosts itself (0644 under umask 022): public keys, behind the 0700
        # dir; what matters is that nobody else may change them
        assert mode(job.state_dir / "known_hosts") & 0o022 == 0
        before = (job.state_dir / "pod.db").read_bytes()
        job.state_dir.chmod(0o777)  # anyone could swap the journal or the known_hosts
        r = job.cli("check", "-c", str(job.cfg))
        assert r.returncode == 2 and "writable by group or others" in r.stderr, r.stdout + r.stderr
        assert f"chmod go-w {job.state_dir}" in r.stderr and "Traceback" not in r.stderr
        assert (job.state_dir / "pod.db").read_bytes() == before
        job.state_dir.chmod(0o700)
        if os.geteuid() == 0:  # a state dir of another user is refused too
            os.chown(job.state_dir, 65534, 65534)
            r = job.cli("check", "-c", str(job.cfg))
            assert r.returncode == 2 and "belongs to another user" in r.stderr, r.stdout + r.stderr
            os.chown(job.state_dir, 0, 0)
    finally:
        job.close()


# ---- ownership --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("labels", [{"tpuwatch-job": "pod-2"}, {"tpuwatch-job": "po"}, {"tpuwatch-job-x": "pod"}])
def test_a_look_alike_ownership_label_never_lets_a_node_be_deleted(
        sim: Simulator, tmp_path: Path, labels: dict[str, str]) -> None:
    """A node that never heals, labelled for another job whose name merely starts like this one
    (or with a look-alike key), is never deleted: not by `check` from cron, not by `recreate`."""
    job = Watched(sim, tmp_path, "pod", seed=24, steps=10_000, recreatable=True, repair_timeout="0.5s",
                  labels=labels)
    try:
        assert job.cli("check", "-c", str(job.cfg)).returncode == 0
        sim.inject("maintenance", node="pod", stuck="REPAIRING")
        # cron's ticks until the repair timeout (0.5 s) has passed: then a person is needed, not owned
        deadline = time.monotonic() + 60
        while (r := job.cli("check", "-c", str(job.cfg))).returncode == 0 and time.monotonic() < deadline:
            pass
        assert r.returncode == 1, r.stdout + r.stderr
        assert "not owned" in r.stdout and "--adopt" in r.stdout, r.stdout
        rec = job.cli("recreate", "pod", "-c", str(job.cfg), "--yes")
        assert rec.returncode == 1 and "does not own it" in rec.stderr, rec.stdout + rec.stderr
        assert sim.world.call_count("DeleteNode") == 0 and sim.world.call_count("CreateNode") == 0
        assert sim.world.node("pod").state == "REPAIRING"
    finally:
        job.close()
