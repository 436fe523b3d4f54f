"""The policy package keeps the rules it opens with: no I/O, no clock, no randomness of its own,
and docs/policy.md lists every row of its table."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tpuwatch.policy
from tpuwatch.policy import ROWS, TRANSITIONS, Phase
from tpuwatch.policy.alerts import WARNING_ROWS

PACKAGE = Path(tpuwatch.policy.__file__).parent
FORBIDDEN = ("google", "grpc", "asyncssh", "subprocess", "time", "socket", "os", "random", "sqlite3",
             "tpuwatch.cloud", "tpuwatch.workers", "tpuwatch.sim", "tpuwatch.recreate", "tpuwatch.journal")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module:
            names.add(n.module)
    return names


def test_no_io_clock_or_randomness_imported() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        bad = {m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)}
        assert not bad, f"{path.name} imports {sorted(bad)}"
        text = path.read_text()
        for call in (".now(", ".utcnow(", ".today(", "open("):
            assert call not in text, f"{path.name} calls {call}"


def test_importing_the_policy_loads_no_cloud_or_ssh_code() -> None:
    code = ("import sys, tpuwatch.policy; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('google', 'grpc', 'asyncssh', 'subprocess', 'socket', 'sqlite3'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""


def test_terminal_phases_have_no_way_out_and_every_phase_is_reachable() -> None:
    assert TRANSITIONS[Phase.DONE] == frozenset() and TRANSITIONS[Phase.FAILED] == frozenset()
    reachable = {Phase.IDLE}
    frontier = [Phase.IDLE]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(Phase)


def test_docs_list_every_row() -> None:
    doc = (PACKAGE.parent.parent / "docs" / "policy.md").read_text()
    missing = [r.id for r in (*ROWS, *WARNING_ROWS) if f"| `{r.id}` | {r.observed} | {r.decision} |" not in doc]
    assert missing == [], "docs/policy.md: copy these rows from tpuwatch.policy.ROWS (and alerts.WARNING_ROWS)"
    for phase in Phase:
        assert f"`{phase.name}`" in doc
