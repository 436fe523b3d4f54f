"""`loop.Pacer.wait`: between ticks, a down node is probed by TCP connects, not by API calls.

A real local socket plays worker 0's SSH port: bound but not listening (connection refused,
as from a host under maintenance) until a virtual clock reaches the moment it "heals", then
listening. The clock and sleep are the Pacer's ports, so no test waits in real time.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpuwatch.loop import PORT_PROBE_EVERY, Pacer
from tpuwatch.model import NodeSnapshot, WorkerEndpoint
from tpuwatch.policy import Decision, Memory, Phase, Wait
from tpuwatch.ports import JobPorts, NodeLifecycle, TpuApi
from tpuwatch.tick import TickReport
from tpuwatch.wiring import load_job
from tpuwatch.workers.ssh import port_open
from tpuwatch.workers.sshworkers import SshWorkers

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)
POLL = 30.0


class Port:
    """A TCP port that refuses connections until `heal()`, then accepts them."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.listening = False

    def heal(self) -> None:
        if not self.listening:
            self.sock.listen(16)
            self.listening = True


class Clock:
    """Virtual time; `sleep` advances it and heals the port once `heal_at` is reached."""

    def __init__(self, port: Port, heal_at: float | None) -> None:
        self.t = 0.0
        self.port = port
        self.heal_at = heal_at
        self.sleeps: list[float] = []
        if heal_at is not None and heal_at <= 0:
            port.heal()

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        if self.heal_at is not None and self.t >= self.heal_at:
            self.port.heal()


@pytest.fixture
def port() -> Iterator[Port]:
    p = Port()
    yield p
    p.sock.close()


def no_api(zone: str) -> TpuApi:
    raise AssertionError("waiting between ticks must not call the TPU API")


def no_lifecycle(zone: str) -> NodeLifecycle:
    raise AssertionError("waiting between ticks must not delete or create")


def reconciler(tmp_path: Path, port: int, clock: Clock, monkeypatch: pytest.MonkeyPatch,
               transport: str = "openssh") -> Pacer:
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(tmp_path / "state"))
    key = tmp_path / "id"
    key.write_text("not used: no ssh session is opened\n")
    key.chmod(0o600)
    cfg = tmp_path / "tpuwatch.toml"
    cfg.write_text("\n".join([
        "[tpu]", 'name = "pod"', "[job]", 'command = "python3 train.py"',
        "[recovery]", f'poll_interval = "{POLL:g}s"',
        "[ssh]", 'user = "me"', f'identity_file = "{key}"', f"port = {port}", "internal_ip = true",
        f'transport = "{transport}"',
    ]) + "\n")
    job = load_job(cfg, "sim-project", "us-central2-b")
    ports = JobPorts(tpu_for=no_api, lifecycle_for=no_lifecycle, workers=SshWorkers.from_config(job.cfg),
                     checkpoints=None, port_open=port_open, sleep=clock.sleep, clock=clock.clock)
    return Pacer(ports, job.pcfg.poll_interval)


def report(state: str = "REPAIRING", health: str = "UNHEALTHY_MAINTENANCE", phase: Phase = Phase.WAITING_NODE,
           until: datetime | None = None) -> TickReport:
    node = NodeSnapshot("pod", "p", "us-central2-b", "1", None, state, health, "", None,
                        workers=(WorkerEndpoint(1, "127.0.0.2", ""), WorkerEndpoint(0, "127.0.0.1", "")))
    actions = (Wait(until, "node repairing"),) if until is not None else ()
    decision = Decision(actions, Memory(phase=phase), "waiting", 0, "repair_wait")
    return TickReport(NOW, node, None, None, (), decision)


def test_a_port_that_opens_ends_the_wait_at_once_past_the_short_delay(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(port, heal_at=12.0)
    rec = reconciler(tmp_path, port.port, clock, monkeypatch)
    waited = rec.wait(report(), delay=5.0)
    # Not after the 5 s a down node used to get (that tick would have been an API call), not
    # after the poll either: within one probe interval of the port opening.
    assert 12.0 <= waited <= 12.0 + PORT_PROBE_EVERY, waited
    assert max(clock.sleeps) <= PORT_PROBE_EVERY
    assert rec.port_probes == len(clock.sleeps) + 1
    assert rec.port_probes == pytest.approx(12.0 / PORT_PROBE_EVERY, abs=2)


def test_a_port_that_stays_closed_waits_one_poll_for_the_api(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(port, heal_at=None)
    rec = reconciler(tmp_path, port.port, clock, monkeypatch)
    assert rec.wait(report(), delay=5.0) == pytest.approx(POLL)
    assert rec.port_probes == pytest.approx(POLL / PORT_PROBE_EVERY, abs=2)
    # The policy's own deadline (repair_timeout) still comes first.
    clock2 = Clock(port, heal_at=None)
    rec2 = reconciler(tmp_path / "b", port.port, clock2, monkeypatch)
    assert rec2.wait(report(until=NOW + timedelta(seconds=9)), delay=5.0) == pytest.approx(9.0)


def test_an_open_port_with_the_api_still_down_backs_off_to_the_short_delay(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(port, heal_at=0)  # answers from the start: the hosts came back before the API
    rec = reconciler(tmp_path, port.port, clock, monkeypatch)
    waits = [rec.wait(report(), delay=5.0) for _ in range(6)]
    assert waits == pytest.approx([PORT_PROBE_EVERY * 2 ** i for i in range(4)] + [5.0, 5.0])
    assert rec.port_probes == 6  # one probe per wait: no hot loop


def test_a_port_seen_closed_then_open_across_waits_wakes_once(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(port, heal_at=POLL + 0.5)  # opens just after the first wait ends
    rec = reconciler(tmp_path, port.port, clock, monkeypatch)
    assert rec.wait(report(), delay=5.0) == pytest.approx(POLL)
    port.heal()
    assert rec.wait(report(), delay=5.0) == 0.0  # opened since: tick now
    # The API still says down: asked again soon, backing off to the delay (no hot loop)
    waits = [rec.wait(report(), delay=5.0) for _ in range(6)]
    assert waits == pytest.approx([PORT_PROBE_EVERY * 2 ** i for i in range(4)] + [5.0, 5.0])  # 0.5 ... 4 s


def test_after_the_port_opens_a_node_still_down_is_looked_at_again_soon_then_at_the_poll(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch) -> None:
    """SSH answers while the API still says REPAIRING (a VM answers as it boots): the ticks that
    follow come at PORT_PROBE_EVERY, doubling, not a poll_interval later; a few API calls per heal."""
    clock = Clock(port, heal_at=12.0)
    rec = reconciler(tmp_path, port.port, clock, monkeypatch)
    assert 12.0 <= rec.wait(report(), delay=POLL) <= 12.0 + PORT_PROBE_EVERY
    waits = [rec.wait(report(), delay=POLL) for _ in range(8)]
    steps = [PORT_PROBE_EVERY * 2 ** i for i in range(6)]  # 0.5 ... 16 s: six looks in 31.5 s
    assert waits == pytest.approx([*steps, POLL, POLL])
    # a node seen up ends the spell; the next time it is down and answers starts afresh
    assert rec.wait(report("READY", "HEALTHY"), delay=POLL) == POLL
    assert rec.wait(report(), delay=POLL) == pytest.approx(PORT_PROBE_EVERY)


@pytest.mark.parametrize("case", ["usable", "running", "gcloud"])
def test_no_probes_when_the_node_is_up_the_job_runs_or_ssh_goes_through_gcloud(
        tmp_path: Path, port: Port, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    clock = Clock(port, heal_at=None)
    rec = reconciler(tmp_path, port.port, clock, monkeypatch, transport="gcloud" if case == "gcloud" else "openssh")
    r = {"usable": report("READY", "HEALTHY"), "running": report(phase=Phase.RUNNING),
         "gcloud": report()}[case]
    assert rec.wait(r, delay=5.0) == 5.0
    assert rec.port_probes == 0 and clock.sleeps == [5.0]
