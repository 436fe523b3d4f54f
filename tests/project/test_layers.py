"""The package's import graph: no two modules import each other, directly or through others.

The layers themselves are import-linter contracts in pyproject.toml (`lint-imports`, run by the
README's test command); a cycle inside one layer is what those contracts cannot see.
"""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Every pair (a, b) where a imports b and b reaches a again."""
    found = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                found.add(tuple(sorted((module, imported))))
    return sorted(found)  # type: ignore[arg-type]


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph("tpuwatch")  # lazy imports and TYPE_CHECKING imports count too
    assert cycles(graph) == []


def test_the_check_finds_a_cycle_when_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    assert cycles(graph) == []
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert ("pkg.a", "pkg.b") in cycles(graph) and ("pkg.a", "pkg.c") in cycles(graph)


def test_the_wheel_holds_the_product_and_not_the_lab() -> None:
    """The goodput benchmark's world (lab/) runs from a clone; the packages setuptools puts in the
    wheel, found with pyproject.toml's own rule, hold none of it."""
    from pathlib import Path

    from setuptools import find_namespace_packages, find_packages

    from tpuwatch.config import tomllib

    root = Path(__file__).resolve().parents[2]
    rule = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(root), include=rule["include"])) | set(
        find_namespace_packages(str(root), include=rule["include"]))
    assert "tpuwatch" in shipped and "tpuwatch.sim" in shipped
    assert not {p for p in shipped if p.split(".")[0] == "lab" or p.startswith("tpuwatch.bench")}, sorted(shipped)


def test_no_shipped_module_is_over_900_lines() -> None:
    """A module past 900 lines holds two things: split it where they part (docs/design.md,
    "Long modules")."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "tpuwatch"
    long = {str(p.relative_to(package)): n for p in package.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 900}
    assert long == {}, long
