"""startup-scripts/ run for real: bash, curl against a local metadata server, remote.sh's flock.

Each test runs the script as a TPU VM would at boot (as a process with its own HOME and
TPUWATCH_HOST_ROOT), with settings served by a real HTTP server that speaks the metadata
server's protocol (`Metadata-Flavor: Google` required, 404 for a missing attribute).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2e_helpers import wait_for

from tpuwatch.workers import protocol

REPO = Path(__file__).resolve().parents[2]
RESUME = REPO / "startup-scripts" / "resume-training.sh"
SETUP = REPO / "startup-scripts" / "setup-env.sh"
PREFIX = "/computeMetadata/v1/instance/attributes/"


def metadata_handler(lookup: Callable[[BaseHTTPRequestHandler], Mapping[str, str] | None]) -> type:
    """A handler answering GET <PREFIX><key> from `lookup(request)`, as the metadata server does."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor:Google header.")
                return
            attrs = lookup(self)
            if attrs is None or not self.path.startswith(PREFIX):
                self._send(404, "not found")
                return
            key = self.path[len(PREFIX):]
            if key == "":
                self._send(200, "".join(k + "\n" for k in sorted(attrs)))
            elif key in attrs:
                self._send(200, attrs[key])
            else:
                self._send(404, "not found")

        def _send(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def metadata_server(attrs: dict[str, str]) -> Iterator[str]:
    """A metadata server for one VM; yields its host:port (GCE_METADATA_HOST)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), metadata_handler(lambda _req: attrs))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Vm:
    """One simulated host: a home and a host root, and the job's processes started there."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.host = root / "host"
        self.home.mkdir(parents=True)
        (self.host / "tmp").mkdir(parents=True)

    def env(self, md_host: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": str(self.home), "TPUWATCH_HOST_ROOT": str(self.host),
                "GCE_METADATA_HOST": md_host, "LANG": "C.UTF-8"}

    def boot(self, script: Path, md_host: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/bash", str(script)], env=self.env(md_host), cwd=self.home,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    def job_file(self, job: str, name: str) -> Path:
        return self.home / ".tpuwatch" / job / name

    def remote(self, request: bytes) -> str:
        """Run a worker-protocol request exactly as tpuwatch sends it (protocol.REMOTE_COMMAND)."""
        r = subprocess.run(["bash", "-c", protocol.REMOTE_COMMAND], input=protocol.framed(request),
                           env=self.env("127.0.0.1:9"), cwd=self.home,
                           capture_output=True, timeout=60)
        return r.stdout.decode()

    def kill_job(self, job: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.job_file(job, "pid").read_text())
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[Vm]:
    v = Vm(tmp_path / "vm")
    yield v
    v.kill_job("train")


def settings(vm: Vm, **extra: str) -> dict[str, str]:
    command = ('echo "attempt={attempt} worker={worker} ckpt={checkpoint} step={step} foo=$FOO '
               'dir=$TPUWATCH_CHECKPOINT_DIR" >> "$HOME/started"; exec sleep 300')
    attrs = {
        "tpuwatch-job": "train",
        "tpuwatch-command": command,
        "tpuwatch-worker-script": protocol.remote_script(),
        "tpuwatch-user": "",
        "tpuwatch-env": "FOO=" + shlex.quote("a b") + "\n",
        "tpuwatch-checkpoint-dir": "gs://b/ckpts",
        "tpuwatch-attempt": "3",
        "tpuwatch-checkpoint": "gs://b/ckpts/500",
        "tpuwatch-step": "500",
        "tpuwatch-setup": 'echo set up in "$PWD" > "$HOME/setup-ran"',
        "agent-worker-number": "2",
    }
    attrs.update(extra)
    return {k: v for k, v in attrs.items() if v != "<absent>"}


def test_resume_training_launches_through_the_worker_protocol_once(vm: Vm) -> None:
    with metadata_server(settings(vm)) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "launched attempt 3 of train on worker 2" in r.stdout
        assert (vm.home / "setup-ran").read_text().strip() == f"set up in {vm.home}"
        wait_for(lambda: (vm.home / "started").exists(), what="the job to start")
        assert (vm.home / "started").read_text() == (
            "attempt=3 worker=2 ckpt=gs://b/ckpts/500 step=500 foo=a b dir=gs://b/ckpts\n")
        assert vm.job_file("train", "attempt").read_text().strip() == "3"
        pid = vm.job_file("train", "pid").read_text().strip()

        # The machine boots again (or the script is rerun): the running attempt is left alone.
        r2 = vm.boot(RESUME, md)
        assert r2.returncode == 0, r2.stdout + r2.stderr
        assert "not started here" in r2.stdout

    # The watcher reconnects and launches the same attempt: remote.sh says it is running.
    answer = vm.remote(protocol.launch_script("train", attempt=3, worker=2, checkpoint=None, command="sleep 1"))
    assert "result=running" in answer
    assert vm.job_file("train", "pid").read_text().strip() == pid
    assert (vm.home / "started").read_text().count("attempt=") == 1  # started exactly once


def test_reboot_without_attempt_setting_leaves_the_restart_to_the_watcher(vm: Vm) -> None:
    attrs = settings(vm, **{"tpuwatch-attempt": "<absent>", "tpuwatch-checkpoint": "<absent>",
                            "tpuwatch-step": "<absent>"})
    with metadata_server(attrs) as md:
        r = vm.boot(RESUME, md)  # a fresh worker: attempt 1, no checkpoint
        assert "launched attempt 1" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: (vm.home / "started").exists(), what="the job to start")
        assert (vm.home / "started").read_text().startswith("attempt=1 worker=2 ckpt='' step=''")
        vm.kill_job("train")  # the host reboots: processes gone, files stay
        wait_for(lambda: "result=ok" in vm.remote(protocol.probe_script("train")), what="probe")
        r2 = vm.boot(RESUME, md)
        assert r2.returncode == 0
        assert "leaving the restart to the watcher" in r2.stdout
    assert (vm.home / "started").read_text().count("attempt=") == 1


def test_setup_failure_stops_before_the_job_and_missing_settings_launch_nothing(vm: Vm) -> None:
    with metadata_server(settings(vm, **{"tpuwatch-setup": "exit 7"})) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 1
        assert "tpuwatch-setup failed" in r.stdout
    assert not vm.job_file("train", "attempt").exists()

    with metadata_server({"agent-worker-number": "0"}) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0
        assert "nothing to launch" in r.stdout
    assert not (vm.home / ".tpuwatch").exists()


def test_env_withheld_from_metadata_means_set_up_only(vm: Vm) -> None:
    with metadata_server(settings(vm, **{"tpuwatch-env": "<absent>", "tpuwatch-env-withheld": "true"})) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kept out of the node's metadata" in r.stdout and "the watcher starts the job" in r.stdout
    assert (vm.home / "setup-ran").exists()  # set up all the same
    assert not vm.job_file("train", "attempt").exists()  # and nothing started


def test_command_withheld_from_metadata_means_set_up_only(vm: Vm) -> None:
    """A command that looks like it holds a credential is not written: the boot only sets up."""
    with metadata_server(settings(vm, **{"tpuwatch-command": "<absent>", "tpuwatch-command-withheld": "true"})) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "looks like it holds a credential" in r.stdout and "the watcher starts the job" in r.stdout
    assert (vm.home / "setup-ran").exists()
    assert not vm.job_file("train", "attempt").exists()


def test_a_local_checkpoint_is_resumed_at_boot_only_where_the_new_vm_has_it(vm: Vm, tmp_path: Path) -> None:
    """A checkpoint path from the old VM exists on the new one only on a shared or kept disk; on a
    new boot disk it is gone, and the job must not be started from a path that is not there."""
    kept = tmp_path / "nfs" / "500"
    kept.mkdir(parents=True)
    with metadata_server(settings(vm, **{"tpuwatch-checkpoint-dir": str(kept.parent),
                                         "tpuwatch-checkpoint": "/gone/with/the/old/disk/500"})) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "is not on this VM" in r.stdout and "the watcher starts the job" in r.stdout
    assert (vm.home / "setup-ran").exists() and not vm.job_file("train", "attempt").exists()
    with metadata_server(settings(vm, **{"tpuwatch-checkpoint-dir": str(kept.parent),
                                         "tpuwatch-checkpoint": str(kept)})) as md:
        r = vm.boot(RESUME, md)
        assert "launched attempt 3 of train on worker 2" in r.stdout, r.stdout + r.stderr
    assert f"ckpt={kept} step=500" in (vm.home / "started").read_text()


def test_launch_false_means_set_up_only(vm: Vm) -> None:
    """What `tpuwatch recreate` writes for a local checkpoint_dir (it cannot read the TPU VM)."""
    with metadata_server(settings(vm, **{"tpuwatch-launch": "false"})) as md:
        r = vm.boot(RESUME, md)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "set up only; the watcher starts the job" in r.stdout
    assert (vm.home / "setup-ran").exists()
    assert not vm.job_file("train", "attempt").exists()


def test_unreachable_metadata_server_fails_with_a_message(vm: Vm) -> None:
    with metadata_server({}) as md:
        dead = md  # the server is gone once the block ends
    r = subprocess.run(["/bin/bash", str(RESUME)], env={**vm.env(dead), "TPUWATCH_METADATA_RETRIES": "1"},
                       cwd=vm.home, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "cannot reach the metadata server" in r.stdout


def test_setup_env_runs_setup_and_starts_nothing(vm: Vm) -> None:
    with metadata_server(settings(vm)) as md:
        r = vm.boot(SETUP, md)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (vm.home / "setup-ran").exists()
    assert not (vm.home / ".tpuwatch").exists()
    assert not (vm.home / "started").exists()
