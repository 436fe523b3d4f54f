"""The worker-side scripts' CPU per action, on a fake host (no simulator, no SSH).

    python scripts/bench_worker_scripts.py                  # 20 runs of each, on the second core
    python scripts/bench_worker_scripts.py --ref HEAD~3     # the same, with the scripts of another commit
    python scripts/bench_worker_scripts.py --trace          # and the processes each one starts (strace)

Each action runs as a worker runs it: protocol.REMOTE_COMMAND in a bash reading the framed
script, HOME and TPUWATCH_HOST_ROOT in a temporary directory (4 /dev/vfio chips), a metadata
server that never answers (the relay's long poll), and, as in the simulator, a cgroup of its own
(where one can be made: root) so that its scans of /proc see this host's processes only. The CPU is user + system time of every process
the action started, the detached job's wrapper and relay too: this script makes itself their
subreaper, so they are reaped, and counted, here. Figures are the mean of the faster half of the
runs (the box is shared; slower runs are other load).

- heal probe: a probe over SSH after a reboot (the attempt's processes gone, a new boot id)
- heal launch: the launch that follows (cleanup first, then the session goes on as the follow
  channel: its stdin closes at once here); job + relay: the wrapper, the relay and its first curl,
  and the job (`exec sleep`), until killed
- probe: a probe over SSH of a running attempt; + listing: with a local checkpoint_dir; log grew:
  its log has new bytes to search for the runtime signatures
- channel probe: one probe request answered on a follow channel (the steady probe of a watch)
- precheck: every built-in check, 3 peers, an interpreter
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpuwatch.sim import cgroups  # noqa: E402
from tpuwatch.sim.hosts import ENTER_CGROUP  # noqa: E402
from tpuwatch.workers import precheck, protocol  # noqa: E402

PATTERNS = ["Traceback \\(most recent", "TPU initialization failed"]
PR_SET_CHILD_SUBREAPER = 36


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def silent_metadata_server() -> int:
    """A port that takes connections and never answers them: the relay's long poll waits."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held: list[socket.socket] = []

    def loop() -> None:
        while True:
            held.append(s.accept()[0])

    threading.Thread(target=loop, daemon=True).start()
    return int(s.getsockname()[1])


class Host:
    def __init__(self, tmp: Path, port: int) -> None:
        self.root, self.home = tmp / "root", tmp / "home"
        for d in ("proc/sys/kernel/random", "dev/vfio", "dev/shm", "tmp", "ck/checkpoints/step_100"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            (self.root / "dev" / "vfio" / str(i)).touch()
        (self.root / "ck/checkpoints/step_100/metadata.json").write_text("{}")
        self.home.mkdir()
        (tmp / "hosts").write_text("10.0.0.2 w-1\n10.0.0.3 w-2\n10.0.0.4 w-3\n")
        self.env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                    "HOME": str(self.home), "USER": "tpu", "LANG": "C.UTF-8", "SHELL": "/bin/bash",
                    "TPUWATCH_HOST_ROOT": str(self.root), "GCE_METADATA_HOST": f"127.0.0.1:{port}",
                    "TPUWATCH_SIM_HOSTS": str(tmp / "hosts")}
        self.cgroups = cgroups.root(f"bench-{os.getpid()}")
        self.cgroup: Path | None = None
        if self.cgroups is not None:
            self.cgroup = self.cgroups / "worker"
            self.cgroup.mkdir()
            self.env["TPUWATCH_SIM_PROCS"] = str(self.cgroup / "cgroup.procs")
        self.reboot()

    def close(self) -> None:
        self.reboot()
        cgroups.remove(self.cgroup)
        cgroups.remove(self.cgroups)

    def reboot(self) -> None:
        """The attempt's processes killed and a new boot id, as after a maintenance."""
        pid = self.home / ".tpuwatch/job/pid"
        try:
            os.killpg(int(pid.read_text()), signal.SIGKILL)
            pid.unlink()  # never again: its number may go to another process group
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
        reap()
        (self.root / "proc/sys/kernel/random/boot_id").write_text(f"{uuid.uuid4()}\n")

    def run(self, script: bytes, extra: bytes = b"", trace: str | None = None, detaches: bool = False) -> bytes:
        argv = ["/bin/bash", "-c", ENTER_CGROUP + protocol.REMOTE_COMMAND]
        if trace is None or not detaches:
            if trace is not None:
                argv = ["strace", "-f", "-qq", "-e", "trace=execve,clone,clone3,fork,vfork", "-e", "signal=none", "-o",
                        trace, *argv]
            return subprocess.run(argv, input=protocol.framed(script) + extra, env=self.env, capture_output=True).stdout
        argv = ["strace", "-f", "-qq", "-e", "trace=execve,clone,clone3,fork,vfork", "-e", "signal=none", "-o", trace,
                *argv]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env)
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(protocol.framed(script) + extra)
        p.stdin.close()
        time.sleep(1.0)
        self.reboot()  # strace waits for every process it traces: the detached job's too
        out = p.stdout.read()
        p.wait()
        return out


def launch(attempt: int) -> bytes:
    return protocol.launch_script("job", attempt=attempt, worker=0, checkpoint=None, command="exec sleep 100000000",
                                  clean_grace=30.0, patterns=PATTERNS, then_wait=1.0)


def counts(trace: str) -> str:
    execs: dict[str, int] = {}
    forks = 0
    for line in Path(trace).read_text().splitlines():
        if re.search(r"\b(clone3?|v?fork)\(", line) and "= -1" not in line:
            forks += 1
        if "execve(" in line and ") = 0" in line:
            name = line.split('execve("', 1)[1].split('"', 1)[0].rsplit("/", 1)[-1]
            execs[name] = execs.get(name, 0) + 1
    return f"{forks} forks, {sum(execs.values())} execs: " + " ".join(f"{k} {v}" for k, v in sorted(execs.items()))


def use_ref(ref: str) -> None:
    """The worker-side scripts of commit `ref` instead of this tree's."""
    top = Path(__file__).resolve().parent.parent

    def show(name: str) -> str:
        return subprocess.run(["git", "-C", str(top), "show", f"{ref}:tpuwatch/workers/{name}"], capture_output=True,
                              text=True, check=True).stdout

    procs, remote, pre = show("procs.sh"), show("remote.sh"), show("precheck.sh")
    protocol.remote_script = lambda: procs + "\n" + remote  # type: ignore[assignment]
    if hasattr(protocol, "trimmed_script"):  # what that commit sent a probe: the whole script unless it trimmed
        trims = "trimmed_script" in show("protocol.py")
        protocol.trimmed_script = (  # type: ignore[assignment]
            protocol.trimmed_script.__wrapped__ if trims else lambda action: protocol.remote_script())
    precheck.precheck_script = lambda: procs + "\n" + pre  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--ref", help="measure the worker-side scripts of this git commit")
    p.add_argument("--cpu", type=int, default=1 if len(os.sched_getaffinity(0)) > 1 else None,
                   help="the core to run on (default: the second)")
    p.add_argument("--trace", action="store_true", help="also count the processes of each (needs strace)")
    a = p.parse_args(argv)
    if a.ref:
        use_ref(a.ref)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    res: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        res.setdefault(name, []).append(seconds)

    traces: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as t:
        h = Host(Path(t), silent_metadata_server())
        probe = protocol.probe_script("job", patterns=PATTERNS)
        listing = protocol.probe_script("job", "/ck", PATTERNS)
        pre = precheck.script(precheck.Settings(cache_path="~/cache"), job="job",
                              peers=["10.0.0.2", "10.0.0.3", "10.0.0.4"], interpreter="python3")
        h.run(launch(1))
        for i in range(a.runs):
            h.reboot()
            c0 = cpu()
            h.run(probe)
            c1 = cpu()
            h.run(launch(i + 2))
            time.sleep(0.2)  # the wrapper, the relay and its curl started
            reap()
            c2 = cpu()
            h.reboot()  # the job and relay end: their CPU is reaped here
            add("heal: probe", c1 - c0)
            add("heal: launch", c2 - c1)
            add("heal: job + relay", cpu() - c2)
        last = a.runs + 2
        h.run(launch(last))
        time.sleep(0.2)
        reap()
        wait = protocol.wait_script("job", last, 1.0, "", PATTERNS)
        for _ in range(a.runs):
            for name, script in (("probe", probe), ("probe + listing", listing), ("precheck", pre)):
                c0 = cpu()
                h.run(script)
                add(name, cpu() - c0)
            with open(h.home / f".tpuwatch/job/attempt-{last}.log", "a") as log:
                log.write("step 100, loss 1.25\n")  # its new bytes are searched for the signatures
            c0 = cpu()
            h.run(probe)
            add("probe, log grew", cpu() - c0)
            c0 = cpu()
            h.run(wait)
            c1 = cpu()
            h.run(wait, b"".join(protocol.probe_request(k) for k in range(50)))
            add("channel probe", (cpu() - c1 - (c1 - c0)) / 50)
        if a.trace:
            for name, script in (("probe", probe), ("probe + listing", listing), ("precheck", pre)):
                h.run(script, trace=f"{t}/trace")
                traces[name] = counts(f"{t}/trace")
            h.reboot()
            h.run(probe, trace=f"{t}/trace")
            traces["heal: probe"] = counts(f"{t}/trace")
            h.run(launch(last + 1), trace=f"{t}/trace", detaches=True)
            traces["heal: launch"] = counts(f"{t}/trace") + " (and the job's)"
        h.close()
    where = "in a cgroup" if h.cgroup is not None else "no cgroup: the scans see every process of the machine"
    print(f"worker-side CPU per action, ms (mean of the faster half of {a.runs} runs{', ' + a.ref if a.ref else ''}; "
          f"{where})")
    for name, v in res.items():
        v.sort()
        half = v[:max(1, len(v) // 2)]
        print(f"  {name:18s} {1000 * max(0.0, sum(half) / len(half)):6.1f}  {traces.get(name, '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
