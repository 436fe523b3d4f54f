"""The times decisions read are memory: a cron `check` (one tick per process, a fresh journal
connection each time) keeps the audit log's cadence, the environment checks' cadence, the age
of the operation in flight and the checkpoint warning's stretch, through the real journal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from policy_support import CFG, JOB, NAME, at, ckpt, node, obs, pre, run_mem, running, tick

from tpuwatch.commands.status import journal_facts
from tpuwatch.journal import Journal
from tpuwatch.model import OperationStatus
from tpuwatch.policy import Memory, Observation, Phase, Recreate
from tpuwatch.policy.observe import AUDIT_INTERVAL, audit_due, precheck_due

INTERVAL = 600.0  # precheck.interval


def _check(state: Path, now: float, audit_read: bool, checked: bool) -> Memory:
    """One cron `check`: open the journal, decide with what this tick read, journal it, close."""
    with Journal.open(state, JOB, NAME) as j:
        mem = j.load_memory() or run_mem(1, start=0.0, step=100)
        report = replace(pre(context="running", t=now), time=at(now)) if checked else None
        d = tick(obs(node(), probes=running(1), checkpoint=ckpt(100), audit_read=audit_read, precheck=report),
                 mem, now)
        j.record(at(now), d)
        return d.memory


def _due(state: Path, now: float) -> tuple[bool, bool]:
    """What the next process's tick would read: (the audit log, the environment checks)."""
    with Journal.open(state, JOB, NAME) as j:
        mem = j.load_memory()
    assert mem is not None
    return (audit_due(mem, node(), running(1), at(now)),
            precheck_due(mem, node(), running(1), at(now), INTERVAL))


def test_cron_check_keeps_the_audit_and_precheck_cadence_across_processes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert _check(state, 10.0, audit_read=True, checked=True).phase is Phase.RUNNING
    # every minute, a new process: the log was read at 10 s, the checks ran at 10 s
    assert _due(state, 40.0) == (False, False)
    assert _due(state, 10.0 + AUDIT_INTERVAL) == (True, False)
    _check(state, 10.0 + AUDIT_INTERVAL, audit_read=True, checked=False)
    assert _due(state, 10.0 + AUDIT_INTERVAL + 30.0) == (False, False)
    assert _due(state, 10.0 + INTERVAL) == (True, True)
    mem = _check(state, 10.0 + INTERVAL, audit_read=True, checked=True)
    assert mem.marks.audit_read_at == at(10.0 + INTERVAL) and mem.marks.precheck_at == at(10.0 + INTERVAL)
    assert _due(state, 20.0 + INTERVAL) == (False, False)
    # a tick that read nothing leaves both times as they were
    _check(state, 30.0 + INTERVAL, audit_read=False, checked=False)
    with Journal.open(state, JOB, NAME) as j:
        assert (j.load_memory() or Memory()).marks == mem.marks


def test_the_operation_in_flight_is_timed_from_its_start_in_memory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    deleting = replace(run_mem(1), phase=Phase.DELETING, recreate=Recreate(deleting_node_id="n1"))
    with Journal.open(state, JOB, NAME) as j:
        mem = j.record_operation(at(100.0), deleting, "op-del-1", "delete", "us-central2-b")
    assert mem.recreate.op_started == at(100.0)
    with Journal.open(state, JOB, NAME) as j:  # the next process
        mem = j.load_memory() or Memory()
    assert mem.recreate.op_started == at(100.0)
    op = OperationStatus(name="op-del-1", done=False, started=mem.recreate.op_started)
    d = tick(obs(node(state="DELETING"), operation=op), mem, 100.0 + CFG.operation_timeout)
    assert d.row == "operation_timeout" and d.memory.phase is Phase.FAILED


def test_the_checkpoint_warning_is_journaled_once_per_stretch_and_shown_by_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("TPUWATCH_STATE_DIR", str(state))
    cfg = replace(CFG, checkpoint_warn_age=600.0)
    stale = obs(node(), probes=running(1), checkpoint=ckpt(100))

    def check(o: Observation, now: float) -> None:  # one cron `check`
        with Journal.open(state, JOB, NAME) as j:
            d = tick(o, j.load_memory() or run_mem(1, start=0.0, step=100), now, cfg)
            j.record(at(now), d)

    for now in (500.0, 700.0, 760.0, 820.0):  # warns from 700 s on
        check(stale, now)
    saved = replace(stale, checkpoint=ckpt(200))
    check(saved, 880.0)  # a new checkpoint ends the stretch
    check(saved, 940.0)  # newer than the attempt's start (no time known): nothing to say
    with Journal.open(state, JOB, NAME) as j:
        warned = [e for e in j.events() if e.kind == "checkpoint_stale"]
        assert [(e.time, e.data) for e in warned] == [(at(700.0), {"attempt": 1})]
        assert warned[0].reason.startswith("attempt 1 has run 11m40s without a new complete checkpoint")
        assert (j.load_memory() or Memory()).marks.checkpoint_warned is None
    assert (journal_facts(node()) or {})["checkpoint_warning"] is None  # over: status says nothing
    check(stale, 1060.0)  # the newest is step 100 again (step 200 was removed): a new stretch
    facts = journal_facts(node()) or {}
    assert facts["checkpoint_warning"].startswith("attempt 1 has run 17m40s without a new complete checkpoint")
    assert facts["checkpoint_warning"].endswith(f"(as of {at(1060.0).isoformat()})")


def test_an_ended_job_reads_no_audit_log_and_its_memory_stays_as_it_ended(tmp_path: Path) -> None:
    """A cron `check` of a job that ended: nothing in the log can change a terminal phase, so the
    log is not read (every minute, for ever), and the tick changes nothing in its memory."""
    state = tmp_path / "state"
    _check(state, 10.0, audit_read=True, checked=True)
    with Journal.open(state, JOB, NAME) as j:
        ended = replace(j.load_memory() or Memory(), phase=Phase.DONE, reason="job done")
        with j.transaction():
            j.save_memory(ended)
    assert _due(state, 10.0 + 10 * AUDIT_INTERVAL) == (False, False)
    assert _check(state, 10.0 + 10 * AUDIT_INTERVAL, audit_read=False, checked=False) == ended
