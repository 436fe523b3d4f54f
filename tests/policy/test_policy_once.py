"""policy/once.py: `tpuwatch run`'s end classifier is the policy's, pure, with its rows in the docs."""

from __future__ import annotations

from pathlib import Path

from tpuwatch.model import WorkerProbe
from tpuwatch.policy.once import RUN_ROW_BY_ID, RUN_ROWS, UNREACHABLE_POLLS, attempt_end

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def P(worker: int, state: str, code: int | None = None, attempt: int = 2, detail: str = "") -> WorkerProbe:
    return WorkerProbe(worker, state, attempt=attempt, exit_code=code, detail=detail)


def test_every_end_names_a_row_and_only_the_lead_workers_exit_0_succeeds() -> None:
    cases = [
        ([P(0, "exited", 0), P(1, "running")], None, "run_success"),
        ([P(0, "running"), P(1, "exited", 0)], None, None),  # another worker's 0 ends nothing
        ([P(0, "running"), P(1, "exited", 3)], None, "run_exit"),
        ([P(0, "running"), P(1, "running", attempt=3)], None, "run_foreign"),
        ([P(0, "running"), P(1, "absent", detail="killed")], None, "run_gone"),
        ([P(0, "running")], 7, "run_exit"),  # the log stream's code outranks the probes
    ]
    for probes, lead_exit, row in cases:
        end, _ = attempt_end(probes, 2, lead_exit, {})
        assert (end.row if end else None) == row, (probes, lead_exit)
        assert end is None or end.row in RUN_ROW_BY_ID
        assert end is None or end.ok is (row == "run_success")


def test_misses_are_counted_in_a_new_map_and_a_worker_back_resets_its_count() -> None:
    lost = [P(0, "running"), P(1, "unreachable", detail="timed out")]
    misses: dict[int, int] = {}
    for _ in range(UNREACHABLE_POLLS - 1):
        end, after = attempt_end(lost, 2, None, misses)
        assert end is None and after != misses  # pure: the caller's map is not touched
        misses = after
    _, back = attempt_end([P(0, "running"), P(1, "running")], 2, None, misses)
    assert back == {}
    end, _ = attempt_end(lost, 2, None, misses)
    assert end is not None and end.row == "run_unreachable" and end.worker == 1


def test_docs_list_every_run_row() -> None:
    doc = DOC.read_text()
    missing = [r.id for r in RUN_ROWS if f"| `{r.id}` | {r.observed} | {r.decision} |" not in doc]
    assert missing == [], "docs/policy.md: copy these rows from tpuwatch.policy.once.RUN_ROWS"


# -- `tpuwatch recreate`: the watcher's rows with asked_recreate's settings ------------------


def test_a_persons_recreate_tries_each_zone_once_at_once_and_ends_queued_in_the_last() -> None:
    from dataclasses import replace

    from policy_support import CFG, ZONES, idle, node, obs, op, tick

    from tpuwatch.policy.once import RECREATE_ROW_BY_ID, asked_recreate, recreate_end

    cfg = asked_recreate(CFG)
    d = tick(obs(node(), recreate_asked=True), idle(), 0, cfg)
    assert d.row == "recreate_asked" and [a.kind for a in d.actions] == ["delete"]
    assert d.memory.budgets.recreates == 0  # a person's recreate is not charged
    assert recreate_end(d, cfg, first=True) is None
    mem = replace(d.memory, recreate=replace(d.memory.recreate, pending_op="ops/del"))
    d = tick(obs(missing=True, operation=op("ops/del")), mem, 5, cfg)
    assert d.row == "create_after_delete" and d.actions[0].zone == ZONES[0]  # type: ignore[attr-defined]
    mem = replace(d.memory, recreate=replace(d.memory.recreate, pending_op="ops/a"))
    stockout = {"operation": op("ops/a", code=8, message="no more capacity"), "create_failure": "queueable"}
    d = tick(obs(missing=True, **stockout), mem, 10, cfg)
    assert d.row == "no_capacity" and recreate_end(d, cfg, first=False) is None  # a fallback zone is left
    # the watcher's own settings retry in this zone until queue_timeout; a person's go on at once
    assert tick(obs(missing=True), d.memory, 11, CFG).actions[0].zone == ZONES[0]  # type: ignore[attr-defined]
    d = tick(obs(missing=True), d.memory, 11, cfg)
    assert d.row == "queue_retry" and d.actions[0].zone == ZONES[1]  # type: ignore[attr-defined]
    mem = replace(d.memory, recreate=replace(d.memory.recreate, pending_op="ops/b"))
    d = tick(obs(missing=True, **{**stockout, "operation": op("ops/b", code=8, message="none here either")}),
             mem, 20, cfg)
    end = recreate_end(d, cfg, first=False)
    assert end is not None and end.row == "recreate_queued" and not end.ok and end.row in RECREATE_ROW_BY_ID
    assert d.memory.phase.value == "queued"  # journaled as the watcher's queued create, not a failed job


def test_a_persons_recreate_ends_when_the_node_is_made_and_fails_with_the_rows_reason() -> None:
    from dataclasses import replace

    from policy_support import CFG, idle, node, obs, op, tick

    from tpuwatch.policy.once import asked_recreate, recreate_end

    cfg = asked_recreate(CFG)
    d = tick(obs(node(), recreate_asked=True), idle(), 0, cfg)
    deleting = replace(d.memory, recreate=replace(d.memory.recreate, pending_op="ops/del"))
    d = tick(obs(missing=True, operation=op("ops/del")), deleting, 5, cfg)
    creating = replace(d.memory, recreate=replace(d.memory.recreate, pending_op="ops/a"))
    d = tick(obs(node(id="n2"), operation=op("ops/a")), creating, 9, cfg)
    end = recreate_end(d, cfg, first=False)
    assert d.row == "created" and end is not None and end.ok
    d = tick(obs(node(), operation=op("ops/del", code=7, message="denied")), deleting, 5, cfg)
    end = recreate_end(d, cfg, first=False)
    assert end is not None and end.row == "recreate_failed" and "denied" in end.message
    # a tick asked to recreate that decided something else did not start it
    d = tick(obs(node(owned=False), recreate_asked=True), idle(), 0, cfg)
    end = recreate_end(d, cfg, first=True)
    assert end is not None and end.row == "recreate_not_started" and "not_owned" in end.message


def test_a_persons_recreate_is_refused_beside_an_operation_under_way_and_for_an_ended_job() -> None:
    from dataclasses import replace

    from policy_support import idle

    from tpuwatch.policy import Phase
    from tpuwatch.policy.once import recreate_refused

    assert recreate_refused(None) is None and recreate_refused(idle()) is None
    assert recreate_refused(idle(phase=Phase.HALTED)) is None  # a person may fix a halted job this way
    queued = recreate_refused(idle(phase=Phase.QUEUED))
    assert queued is not None and "queued" in queued
    deleting = recreate_refused(replace(idle(phase=Phase.DELETING), recreate=replace(idle().recreate, pending_op="ops/9")))
    assert deleting is not None and "ops/9" in deleting
    ended = recreate_refused(idle(phase=Phase.FAILED, reason="restart budget spent"))
    assert ended is not None and "restart budget spent" in ended and "job.name" in ended


def test_a_create_sets_up_only_when_the_watcher_must_launch() -> None:
    from dataclasses import replace

    from policy_support import CFG, ckpt, idle

    from tpuwatch.policy.operations import startup

    mem = replace(idle(), attempt=replace(idle().attempt, number=4))
    assert startup(CFG, mem, None) == {"attempt": "5"}
    assert startup(CFG, mem, ckpt(300)) == {"attempt": "5", "checkpoint": ckpt(300).path, "step": "300"}
    on_vm = replace(CFG, checkpoints_on_vm=True)
    assert startup(on_vm, mem, None) == {"launch": "false"}  # only the new node tells where to resume
    assert startup(on_vm, mem, ckpt(300))["checkpoint"] == ckpt(300).path  # the boot checks it is there
    assert startup(replace(CFG, slices=("a", "b")), mem, ckpt(300)) == {"launch": "false"}


def test_docs_list_every_recreate_row() -> None:
    from tpuwatch.policy.once import RECREATE_ROWS

    doc = DOC.read_text()
    missing = [r.id for r in RECREATE_ROWS if f"| `{r.id}` | {r.observed} | {r.decision} |" not in doc]
    assert missing == [], "docs/policy.md: copy these rows from tpuwatch.policy.once.RECREATE_ROWS"


def test_a_run_begins_refused_following_or_launching_the_next_attempt() -> None:
    from policy_support import node

    from tpuwatch.policy.once import RUN_START_ROWS, run_start

    ids = {r.id for r in RUN_START_ROWS}
    down = run_start(node("REPAIRING", health="UNHEALTHY_MAINTENANCE"), 2, [])
    assert down.row == "run_not_usable" and "does not recover a node" in down.message
    assert run_start(node(), 0, []).row == "run_no_workers"
    lost = run_start(node(), 2, [P(0, "running"), P(1, "unreachable", detail="w1: timed out")])
    assert lost.row == "run_lost_at_start" and "w1: timed out" in lost.message
    follow = run_start(node(), 2, [P(0, "running", attempt=4), P(1, "running", attempt=4)])
    assert (follow.row, follow.attempt, follow.message) == ("run_follow", 4, "")
    # a worker that stopped, or one on another attempt: the next attempt after the highest seen
    assert run_start(node(), 2, [P(0, "running", attempt=4), P(1, "exited", 1, attempt=4)]).attempt == 5
    assert run_start(node(), 2, [P(0, "running", attempt=3), P(1, "running", attempt=4)]).attempt == 5
    fresh = run_start(node(), 2, [P(0, "absent", attempt=None), P(1, "absent", attempt=None)])
    assert (fresh.row, fresh.attempt) == ("run_launch", 1)
    assert {down.row, lost.row, follow.row, fresh.row} <= ids


def test_docs_list_every_run_start_row() -> None:
    from tpuwatch.policy.once import RUN_START_ROWS

    doc = DOC.read_text()
    missing = [r.id for r in RUN_START_ROWS if f"| `{r.id}` | {r.observed} | {r.decision} |" not in doc]
    assert missing == [], "docs/policy.md: copy these rows from tpuwatch.policy.once.RUN_START_ROWS"
