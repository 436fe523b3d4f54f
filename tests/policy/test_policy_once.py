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
