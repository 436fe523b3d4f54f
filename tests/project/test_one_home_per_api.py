"""Each cloud API a TPU is made through lives in one package under tpuwatch/cloud/, reached
through the registry (tpuwatch/cloud/apis.py): no module outside cloud/ imports an API's own
modules or adapter classes, compares the config's `api` to a name, or tells the APIs apart by
parsing a resource name. A third API then adds a package and edits nothing outside cloud/ but
the registry's list and config's per-API key table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tpuwatch
from tpuwatch import config
from tpuwatch.cloud import apis

PACKAGE = Path(tpuwatch.__file__).parent
# cloud/ is where the APIs live; the simulator stands for Google (the lab is outside the package)
SKIPPED = ("cloud", "sim")
# Files allowed to know the APIs by name, each with why
ALLOWED = {
    # the config file's schema: [tpu] api and the keys each API takes (a table), below cloud/ in the layers
    "tpuconfig.py": "the config's schema",
}
ADAPTERS = ("TpuAdapter", "ComputeAdapter")
RESOURCE_PARTS = ("/zones/", "/locations/", "/regions/", "/instances/", "/instanceGroupManagers/", "/nodes/")


def api_packages() -> set[str]:
    """tpuwatch.cloud's per-API packages (cloud/tpu, cloud/compute, ...)."""
    return {f"tpuwatch.cloud.{d.name}" for d in (PACKAGE / "cloud").iterdir() if (d / "__init__.py").is_file()}


def _is_api_key(node: ast.expr) -> bool:
    """`x["api"]` or `x.get("api")`: the config's [tpu] api."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "api"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "api")


def _resource_text(node: ast.expr) -> bool:
    """A string, or an f-string or sum of them, holding a piece of a resource name."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and any(part in n.value for part in RESOURCE_PARTS)
               for n in ast.walk(node))


def violations(source: str, packages: set[str]) -> list[str]:
    """What in `source` knows an API by name, one line each."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            modules = [node.module, *(f"{node.module}.{n}" for n in names)]
            if any(m == p or m.startswith(p + ".") for m in modules for p in packages):
                found.append(f"line {node.lineno}: imports an API's own module ({node.module})")
            elif any(n in ADAPTERS for n in names):
                found.append(f"line {node.lineno}: imports an adapter class ({', '.join(names)})")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(alias.name == p or alias.name.startswith(p + ".") for p in packages):
                    found.append(f"line {node.lineno}: imports an API's own module ({alias.name})")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_api_key(s) for s in sides) and any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                found.append(f"line {node.lineno}: compares the config's api to a name")
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and _resource_text(node.left):
                found.append(f"line {node.lineno}: parses a resource name ({ast.unparse(node.left)})")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith", "split", "rsplit", "partition", "find", "index")
              and any(_resource_text(a) for a in node.args)):
            found.append(f"line {node.lineno}: parses a resource name (.{node.func.attr})")
    return found


def test_no_module_outside_cloud_knows_which_api_made_a_slice() -> None:
    packages = api_packages()
    assert {"tpuwatch.cloud.tpu", "tpuwatch.cloud.compute"} <= packages
    bad = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in SKIPPED or rel in ALLOWED:
            continue
        if found := violations(path.read_text(encoding="utf-8"), packages):
            bad[rel] = found
    assert bad == {}, "go through tpuwatch.cloud.apis (api_for, api_of) instead:\n" + "\n".join(
        f"  {f}: {v}" for f, vs in bad.items() for v in vs)


def test_no_api_package_imports_another() -> None:
    """What two APIs share lives in cloud/ itself (base, listing, errors, retry, clients), so a
    package can be added or removed alone."""
    packages = api_packages()
    bad = {}
    for package in sorted(packages):
        others = packages - {package}
        for path in sorted((PACKAGE / "cloud" / package.rsplit(".", 1)[1]).rglob("*.py")):
            if found := [v for v in violations(path.read_text(encoding="utf-8"), others) if "own module" in v]:
                bad[path.relative_to(PACKAGE).as_posix()] = found
    assert bad == {}, bad


def test_the_allowed_files_exist() -> None:
    """An exception for a file that is gone (or renamed) would quietly allow its successor nothing."""
    assert [f for f in ALLOWED if not (PACKAGE / f).is_file()] == []


def test_the_check_finds_each_kind_of_knowing() -> None:
    packages = {"tpuwatch.cloud.tpu", "tpuwatch.cloud.compute"}
    for source in (
        "from tpuwatch.cloud.compute.adapter import is_mig",
        "from tpuwatch.cloud.tpu import TpuAdapter",
        "from tpuwatch.cloud import compute",
        "import tpuwatch.cloud.tpu.lifecycle",
        "from somewhere import ComputeAdapter",
        'x = cfg.tpu["api"] == "compute"',
        'x = "tpu" != cfg.tpu.get("api")',
        'x = "/zones/" in node.resource',
        'x = node.resource.endswith("/instanceGroupManagers/" + name)',
    ):
        assert violations(source, packages), source
    for source in (
        "from tpuwatch.cloud.apis import api_for",
        "from tpuwatch.cloud.location import resolve",
        'x = api_for(cfg).name == other',
        'x = cfg.tpu["name"] == "pod"',
        'x = f"projects/{p}/zones/{z}"',
    ):
        assert not violations(source, packages), source


def test_the_registry_serves_every_api_the_config_takes() -> None:
    assert tuple(apis.APIS) == config.TPU_APIS
