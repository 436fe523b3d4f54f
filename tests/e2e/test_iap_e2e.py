"""ssh.iap end to end: every worker reached through an IAP tunnel named by its VM, none directly.

No Identity-Aware Proxy exists here, so `gcloud` on PATH is a shim that does what
`gcloud compute start-iap-tunnel INSTANCE PORT --listen-on-stdin` does for ssh's ProxyCommand:
it relays stdin/stdout to the VM it names. It knows the VMs from a map the test writes (instance
name -> the simulated worker's SSH address), and logs each call. ssh.port is a port nothing
listens on, so a connection that skipped the tunnel would fail.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish

from tpuwatch.cloud.tpu.adapter import TpuAdapter
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

SHIM = textwrap.dedent('''\
    #!/usr/bin/env python3
    import json, os, socket, sys, threading
    args = sys.argv[1:]
    with open(os.environ["IAP_TEST_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    if args[:2] != ["compute", "start-iap-tunnel"] or "--listen-on-stdin" not in args:
        sys.exit("this test's gcloud only tunnels")
    host, port = json.load(open(os.environ["IAP_TEST_MAP"]))[args[2]]
    conn = socket.create_connection((host, port))
    def up():
        while True:
            data = os.read(0, 65536)
            if not data:
                conn.shutdown(socket.SHUT_WR)
                return
            conn.sendall(data)
    threading.Thread(target=up, daemon=True).start()
    while True:
        data = conn.recv(65536)
        if not data:
            break
        os.write(1, data)
    ''')


def test_every_worker_is_reached_through_its_iap_tunnel(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path)
    text = job.cfg.read_text().replace(f"port = {sim.ssh_port}", "port = 2").replace("internal_ip = true",
                                                                                     "internal_ip = false\niap = true")
    job.cfg.write_text(text)
    node = TpuAdapter(sim.project, sim.zone).require_node("pod")
    names = TpuAdapter(sim.project, sim.zone).instance_names(node)
    assert len(names) == len(node.workers) and all(names)
    mapping = tmp_path / "iap-map.json"
    mapping.write_text(json.dumps({n: [w.internal_ip, sim.ssh_port] for n, w in zip(names, node.workers, strict=True)}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(SHIM)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "iap.log"
    job.env.update(PATH=f"{bin_dir}{os.pathsep}{job.env['PATH']}", IAP_TEST_MAP=str(mapping), IAP_TEST_LOG=str(log))
    rc, out = finish(job.watch(), timeout=120)
    assert rc == 0, out
    assert job.steps_done()[-1] == STEPS
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c[2] for c in calls} == set(names), calls  # every worker, by its VM name
    assert all(c[3] == "2" and f"--project={sim.project}" in c and f"--zone={sim.zone}" in c for c in calls), calls
    assert "unreachable" not in out, out


def test_a_proxy_in_ssh_options_and_iap_are_refused_together(sim: Simulator, tmp_path: Path) -> None:
    job = Job(sim, tmp_path)
    job.cfg.write_text(job.cfg.read_text().replace("internal_ip = true",
                                                   'internal_ip = true\niap = true\noptions = ["ProxyJump=bastion"]'))
    r = job.cli("check", "-c", str(job.cfg))
    assert r.returncode == 2 and "ssh.iap" in r.stderr and "ProxyJump=bastion" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
