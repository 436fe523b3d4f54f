"""Environment checks: precheck.sh run by a local bash exactly as a worker runs it,
the verdicts tpuwatch.workers.precheck draws from its answers, and the [precheck] config.

HOME and TPUWATCH_HOST_ROOT point into tmp_path, so the fake /dev/accel*, /dev/shm and
/tmp/libtpu_lockfile are private to each test. The SSH path is in test_precheck_sim.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.config import validate
from tpuwatch.errors import ConfigError
from tpuwatch.model import CheckItem
from tpuwatch.workers import protocol
from tpuwatch.workers.precheck import (
    CustomCheck,
    Settings,
    chips_per_host,
    evaluate,
    interpreter_of,
    parse,
    report_dict,
    report_from_dict,
    script,
)

JOB = "job"
LOOSE = Settings(min_disk=1e6, min_shm=1e6, min_cache=1e6)


class Host:
    """A worker's host root and home under tmp_path; `check` runs precheck.sh there."""

    def __init__(self, tmp: Path, devices: int = 4, vfio: bool = False) -> None:
        self.home = tmp / "home"
        self.root = tmp / "root"
        self.home.mkdir()
        (self.root / "dev" / "shm").mkdir(parents=True)
        (self.root / "tmp").mkdir()
        if vfio:
            (self.root / "dev" / "vfio").mkdir()
            (self.root / "dev" / "vfio" / "vfio").touch()  # the container device: not a chip
            for i in range(devices):
                (self.root / "dev" / "vfio" / str(i)).touch()
        else:
            for i in range(devices):
                (self.root / "dev" / f"accel{i}").touch()
        self.hosts = tmp / "hosts"
        self.hosts.write_text("127.0.0.2 peer-a\n127.0.0.3 peer-b\n")

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": str(self.home), "TPUWATCH_HOST_ROOT": str(self.root),
                "TPUWATCH_SIM_HOSTS": str(self.hosts), **extra}

    def answer(self, settings: Settings = LOOSE, peers: tuple[str, ...] = ("127.0.0.2", "127.0.0.3"),
               interpreter: str = "", env: dict[str, str] | None = None,
               shell_env: dict[str, str] | None = None) -> tuple[dict[str, dict[str, str]], bool]:
        data = script(settings, job=JOB, peers=peers, interpreter=interpreter, env=env)
        r = subprocess.run(["/bin/bash", "-c", protocol.REMOTE_COMMAND], input=protocol.framed(data),
                           capture_output=True, timeout=60,
                           env=self.env(**(shell_env or {})))
        assert r.returncode == 0, r.stderr
        return parse(r.stdout.decode())

    def check(self, settings: Settings = LOOSE, context: str = "launch", chips: int | None = 4,
              **kw: Any) -> dict[str, CheckItem]:
        answer, ended = self.answer(settings, **kw)
        assert ended
        items = evaluate(0, answer, settings, context=context, chips=chips)  # type: ignore[arg-type]
        return {i.check: i for i in items}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_a_healthy_host_passes_every_check(host: Host) -> None:
    items = host.check(interpreter=os.path.basename(sys.executable))
    assert {c: i.verdict for c, i in items.items()} == {
        "disk": "pass", "shm": "pass", "cache": "skip", "ulimit": "pass", "dns": "pass", "devices": "pass",
        "device_holders": "pass", "libtpu_lock": "pass", "interpreter": "pass"}
    assert items["disk"].value.endswith("free at /") and items["shm"].value.endswith("total at /dev/shm")
    assert items["devices"].value == "4 TPU device(s)"
    assert items["dns"].value == "2/2 peers resolved"
    assert "Python 3." in items["interpreter"].value


def test_thresholds_from_config_decide_disk_shm_and_cache(host: Host) -> None:
    huge = Settings(min_disk=1e18, min_shm=1e18, cache_path="~/data/cache", min_cache=1e18)
    items = host.check(huge)
    for check, key in (("disk", "precheck.min_disk"), ("shm", "precheck.min_shm"), ("cache", "precheck.min_cache")):
        assert items[check].verdict == "fail" and not items[check].fixable
        assert items[check].threshold == f"> 1000000 TB ({key})", items[check]
    # a cache path that does not exist yet is measured on its nearest existing parent
    assert "does not exist yet" in items["cache"].detail and str(host.home) in items["cache"].detail
    (host.home / "data").mkdir()
    assert host.check(Settings(min_disk=0, min_shm=0, cache_path="~/data", min_cache=1))["cache"].verdict == "pass"


def test_a_missing_device_fails_and_vfio_hosts_count_their_groups(host: Host, tmp_path: Path) -> None:
    (host.root / "dev" / "accel3").unlink()
    item = host.check()["devices"]
    assert (item.verdict, item.fixable) == ("fail", False)
    assert item.value == "3 TPU device(s): /dev/accel0 /dev/accel1 /dev/accel2" and item.detail == "1 missing"
    (tmp_path / "v5").mkdir()
    v5 = Host(tmp_path / "v5", devices=4, vfio=True)
    assert v5.check(chips=4)["devices"].verdict == "pass"  # /dev/vfio/vfio is not a chip
    assert v5.check(chips=8)["devices"].detail == "4 missing"
    for f in (v5.root / "dev" / "vfio").iterdir():
        f.unlink()
    assert "no TPU device found" in v5.check(chips=None)["devices"].detail


def test_orphan_device_holders_and_a_stale_lockfile_fail_fixably_before_a_launch(host: Host) -> None:
    lock = host.root / "tmp" / "libtpu_lockfile"
    lock.touch()
    item = host.check()["libtpu_lock"]
    assert (item.verdict, item.fixable, item.value) == ("fail", True, "stale /tmp/libtpu_lockfile")
    # while the job runs, a stale lockfile is only a warning (the next launch's cleanup removes it)
    assert host.check(context="running")["libtpu_lock"].verdict == "warn"
    with open(host.root / "dev" / "accel1") as dev:
        holder = subprocess.Popen(["sleep", "30"], stdin=dev, env={"PATH": os.environ["PATH"]})
    try:
        items = host.check()
        assert items["device_holders"].verdict == "fail" and items["device_holders"].fixable
        assert f"{holder.pid}:sleep" in items["device_holders"].value
        # while running, a process outside the job holding the TPU is a (non-fixable) failure...
        running = host.check(context="running")["device_holders"]
        assert running.verdict == "fail" and not running.fixable
    finally:
        holder.kill()
        holder.wait()
    with open(host.root / "dev" / "accel1") as dev:
        ours = subprocess.Popen(["sleep", "30"], stdin=dev, env={"PATH": os.environ["PATH"], "TPUWATCH_JOB": JOB})
    try:
        # ... but the job's own process is not
        item = host.check(context="running")["device_holders"]
        assert item.verdict == "pass" and str(ours.pid) in item.value
    finally:
        ours.kill()
        ours.wait()


def test_device_holders_say_how_far_the_scan_saw(host: Host) -> None:
    """root, sudo, or own (then other users' holders are unseen, a warning): the mode reaches the answer."""
    answer, _ = host.answer()
    scan = answer["device_holders"]["scan"]
    assert scan == "root" if os.geteuid() == 0 else scan in {"sudo", "own"}
    items = {i.check: i for i in evaluate(0, answer, LOOSE, context="running", chips=4)}
    assert items["device_holders"].verdict == ("warn" if scan == "own" else "pass")


def test_dns_names_the_peers_that_do_not_resolve(host: Host) -> None:
    item = host.check(peers=("127.0.0.2", "127.0.0.9"))["dns"]
    assert item.verdict == "fail" and item.value == "1/2 peers resolved"
    assert "127.0.0.9" in item.detail and "127.0.0.2" not in item.detail
    # a name that resolves back to nothing fails too
    host.hosts.write_text("127.0.0.2 peer-a\n")
    assert host.check(peers=("127.0.0.2",))["dns"].verdict == "pass"
    host.hosts.write_text("")
    assert host.check(peers=("127.0.0.2",))["dns"].verdict == "fail"
    assert host.check(peers=())["dns"].verdict == "skip"  # one host: no peers


def test_ulimits_are_reported_and_fail_only_below_configured_minimums(host: Host) -> None:
    item = host.check()["ulimit"]
    assert item.verdict == "pass" and "open files" in item.value and "stack" in item.value
    strict = Settings(min_disk=0, min_shm=0, min_open_files=10**6, min_stack=float("inf"))
    item = host.check(strict)["ulimit"]
    assert item.verdict == "fail"
    assert "precheck.min_open_files" in item.detail
    answer, _ = host.answer(strict)
    if answer["ulimit"]["stack_kb"] != "unlimited":
        assert "precheck.min_stack" in item.detail


def test_the_interpreter_must_be_installed(host: Host) -> None:
    assert host.check(interpreter="python9.9")["interpreter"].verdict == "fail"
    assert host.check(interpreter="~/venv/bin/python")["interpreter"].detail.endswith(
        "is not installed here (not on PATH or not executable)")
    venv = host.home / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    assert host.check(interpreter="~/venv/bin/python")["interpreter"].verdict == "pass"
    # the job's own PATH (job.env) is the one that counts
    assert host.check(interpreter="python", env={"PATH": f"{venv}:/usr/bin:/bin"})["interpreter"].verdict == "pass"
    assert host.check(interpreter="")["interpreter"].verdict == "skip"


def test_custom_checks_pass_on_exit_0_and_a_hanging_one_is_killed_at_its_timeout(host: Host) -> None:
    marker = host.home / "spawned"
    s = Settings(min_disk=0, min_shm=0, custom=(
        CustomCheck("ok", "test -d /", 5),
        CustomCheck("bad", "echo 'gcs unreachable' >&2; exit 3", 5),
        CustomCheck("hang", f"(sleep 60; touch {marker}) & sleep 60", 0.5),
        CustomCheck("env", 'test "$FOO" = bar', 5),
    ))
    start = time.monotonic()
    items = host.check(s, env={"FOO": "bar"})
    assert time.monotonic() - start < 10
    assert items["custom:ok"].verdict == "pass"
    assert (items["custom:bad"].verdict, items["custom:bad"].value, items["custom:bad"].detail) == (
        "fail", "exit 3", "gcs unreachable")
    hang = items["custom:hang"]
    assert hang.verdict == "fail" and hang.value == "killed after 500ms" and "timeout" in hang.detail
    assert items["custom:env"].verdict == "pass"  # job.env reaches custom checks
    # the timeout killed the whole process group: nothing it started lives on
    out = subprocess.run(["pgrep", "-f", f"touch {marker}"], capture_output=True)
    assert out.returncode == 1, out.stdout


def test_skip_turns_checks_off(host: Host) -> None:
    s = Settings(min_disk=0, min_shm=0, skip=frozenset({"dns", "devices", "mine"}),
                 custom=(CustomCheck("mine", "exit 1", 5),))
    items = host.check(s)
    assert "dns" not in items and "devices" not in items and "custom:mine" not in items
    assert "disk" in items


def test_a_check_that_did_not_answer_fails_with_the_reason() -> None:
    items = evaluate(2, {"disk": {"path": "/", "size": "10", "free": "5"}}, Settings(min_disk=1, min_shm=0),
                     context="launch", chips=4, ended=False, failure="exit code 137")
    by = {i.check: i for i in items}
    assert by["disk"].verdict == "pass"
    assert by["shm"].verdict == "fail" and "exit code 137" in by["shm"].detail


def test_report_round_trips_through_json() -> None:
    from tpuwatch.model import PrecheckReport

    t = datetime(2025, 1, 1, tzinfo=timezone.utc)
    r = PrecheckReport(t, "running", "n1", (CheckItem("disk", 1, "fail", "1 GB free", "> 32 GB", "x", False),),
                       ((3, "refused"),))
    assert report_from_dict(report_dict(r)) == r
    with pytest.raises(ValueError):
        report_from_dict({"items": [{"check": "disk", "worker": 1, "verdict": "maybe"}], "time": t.isoformat()})


@pytest.mark.parametrize("command,word", [
    ("python3 train.py", "python3"),
    ("cd ~/repo && python3 -m train --resume={checkpoint}", "python3"),
    ("cd ~/repo && ~/venv/bin/python train.py", "~/venv/bin/python"),
    ("env XLA_FLAGS=--x /opt/conda/bin/python3.10 t.py", "/opt/conda/bin/python3.10"),
    ("FOO=1 python train.py; echo done", "python"),
    ("cd repo && .venv/bin/python train.py", ""),  # relative to where `cd` went: not checked
    ("bash run.sh", ""),
    ("echo python3", ""),  # an argument, not the command
    ("$HOME/venv/bin/python t.py", ""),
    ("python3 'unbalanced", ""),
])
def test_interpreter_of(command: str, word: str) -> None:
    assert interpreter_of(command) == word


@pytest.mark.parametrize("accel,chips", [
    ("v2-8", 4), ("v3-32", 4), ("v4-8", 4), ("v4-32", 4), ("v5p-16", 4), ("v5litepod-1", 1),
    ("v5litepod-8", 8), ("v5litepod-16", 4), ("v6e-4", 4), ("v6e-256", 4), ("", None), ("v9-8", None),
    ("tpu7x-standard-4t", 4), ("ct6e-standard-1t", 1), ("ct6e-standard-8t", 8), ("ct5p-hightpu-4t", 4),
    ("n2-standard-4", None),
])
def test_chips_per_host(accel: str, chips: int | None) -> None:
    assert chips_per_host(accel) == chips


# ---- bad input: the [precheck] config ---------------------------------------------------------


def _cfg(**precheck: Any) -> dict[str, Any]:
    return validate({"tpu": {"name": "pod"}, "job": {"command": "python3 t.py"}, "precheck": precheck})["precheck"]


def test_config_sizes_and_defaults() -> None:
    p = _cfg()
    assert (p["min_disk"], p["min_shm"], p["interval"], p["min_open_files"]) == (32e9, 1e9, 600.0, 0)
    p = _cfg(min_disk="500GiB", min_shm="2GB", min_locked_memory="unlimited", min_open_files=65536,
             min_stack="8MiB", min_cache=0)
    assert p["min_disk"] == 500 * 2**30 and p["min_shm"] == 2e9 and p["min_locked_memory"] == float("inf")
    assert (p["min_open_files"], p["min_stack"], p["min_cache"]) == (65536, 8 * 2**20, 0.0)


@pytest.mark.parametrize("key,value,message", [
    ("min_disk", -1, "precheck.min_disk: -1 is negative"),
    ("min_disk", "-5GB", "precheck.min_disk: '-5GB' is negative"),
    ("min_disk", 32, "precheck.min_disk: 32 has no unit"),
    ("min_shm", "1 parsec", "precheck.min_shm: '1 parsec' is not a size"),
    ("min_shm", "1GBs", "precheck.min_shm: '1GBs' is not a size"),
    ("min_cache", "32", "precheck.min_cache: '32' is not a size"),
    ("min_open_files", -5, "precheck.min_open_files: -5 is negative"),
    ("min_open_files", "many", "precheck.min_open_files: expected a whole number"),
    ("interval", "-1m", "precheck.interval"),
    ("interval", "10 minutes", "precheck.interval: '10 minutes' is not a duration"),
    ("skip", ["dsn"], "precheck.skip: unknown check 'dsn' (did you mean 'dns'?)"),
    ("custom", [{"name": "gcs"}], "precheck.custom[0]: missing command"),
    ("custom", [{"name": "gcs", "command": "  "}], "precheck.custom[0].command: must not be empty"),
    ("custom", [{"command": "true", "timeout": "-5s"}], "precheck.custom[0].timeout"),
    ("custom", [{"command": "true", "timeout": "0s"}], "precheck.custom[0].timeout: must be at least 0.1s"),
    ("custom", [{"name": "disk", "command": "true"}], "precheck.custom[0].name: 'disk' is a built-in check"),
    ("custom", [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}], "is used by another"),
    ("custom", [{"command": "true", "tmeout": "5s"}], "precheck.custom[0]: unknown key 'tmeout'"),
])
def test_bad_precheck_config_is_refused_naming_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _cfg(**{key: value})
    assert message in e.value.message, e.value.message


def test_skip_may_name_a_custom_check() -> None:
    p = _cfg(skip=["gcs", "dns"], custom=[{"name": "gcs", "command": "gsutil ls gs://b"}])
    assert Settings(skip=frozenset(p["skip"]), custom=(CustomCheck("gcs", "x", 1),)).custom_checks == ()


