"""Shared fixtures: an in-process simulator with the environment pointed at it."""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.sim.simulator import Simulator

GC_THRESHOLDS = gc.get_threshold()


def pytest_configure(config: pytest.Config) -> None:
    # Collection imports the client libraries and every test module: hundreds of thousands of
    # objects, none of them garbage, that the collector's default thresholds would walk again and
    # again meanwhile (about 0.4 CPU-s a worker). The defaults are back once collected (below).
    gc.set_threshold(100_000, 50, 100)
    # Tests press Ctrl-C (SIGINT) on tpuwatch processes they start. A suite started in the
    # background by a non-interactive shell (`pytest … &`) inherits SIGINT ignored, so would every
    # process it starts, and Python installs no KeyboardInterrupt handler when it is ignored: the
    # Ctrl-C would be lost. A handler here is not inherited across exec, so children get the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # PYTHONDONTWRITEBYTECODE (set on some machines and CI images) would make each of the many
    # Python processes the suite starts (`python -m tpuwatch.cli`, each xdist worker
    # rewriting the test modules) compile tpuwatch and the tests from source again: about a
    # quarter of a CLI process's start-up CPU. The bytecode goes where Python puts it by default, __pycache__ (in
    # .gitignore), as the simulated workers' processes (whose environment is their own) already do.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    # `-n auto` (the README's command): four workers per core. Most tests wait on the simulator's
    # clock, real ssh and subprocesses rather than compute, so one worker per core leaves the cores
    # idle half the time, and on cores other work shares, more workers keep the suite's share of
    # them (on 2 cores beside a busy loop per core: 9m39s with eight, 10m02s with six; idle, the
    # same 8m05s-8m10s). PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set (xdist reads it).
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 4 * len(os.sched_getaffinity(0))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The long tests (marked slow) first, the many short ones after: with pytest-xdist's
    # worksteal (the README's command) a worker that runs out takes the back half of another's
    # queue, so the short ones fill the last minutes instead of one long test running alone at the
    # end. The order is otherwise kept, so every worker collects the same list.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (the client libraries' message classes, tpuwatch, the test modules)
    # lives to the end: frozen out of the collector's sight, a full collection no longer walks it.
    # pytest collects several times as each worker ends (unraisable exceptions): with six workers (as measured),
    # about 7 CPU-s of the suite. Nothing made after this is frozen.
    gc.set_threshold(*GC_THRESHOLDS)
    gc.collect()
    gc.freeze()


def _serve(root: Path, monkeypatch: pytest.MonkeyPatch, workers: bool) -> Iterator[Simulator]:
    from tpuwatch.sim import schema

    # the tests hold tpuwatch's requests to Google's discovery documents (the test extra has them)
    assert schema.strict(), "google-api-python-client is missing: the simulator would not check requests"
    with Simulator(root=root, speed=600, workers=workers) as sim:
        for key, value in sim.env.items():
            monkeypatch.setenv(key, value)
        yield sim
        assert sim.world.scheduler_errors == [], "a simulator step raised"
        assert sim.world.host_errors == [], "an effect on the simulated hosts failed"


@pytest.fixture
def sim_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    """The simulated APIs only (no SSH workers; node IPs are placeholders); env points at it."""
    yield from _serve(tmp_path / "sim", monkeypatch, workers=False)


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    """The full simulator: APIs and SSH workers; env points at it (see Simulator.env)."""
    yield from _serve(tmp_path / "sim", monkeypatch, workers=True)


@pytest.fixture
def lro_polling() -> object:
    """Fast polling for `operation.result(polling=...)`: the simulator's operations take 0.1-0.2 s."""
    from google.api_core.future.polling import DEFAULT_POLLING

    return DEFAULT_POLLING.with_delay(initial=0.02, maximum=0.1, multiplier=1.5).with_timeout(20)
