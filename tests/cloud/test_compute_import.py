"""`clients.compute_v1()`: google.cloud.compute_v1 without importing its ~130 services at once.

Each case runs in a fresh interpreter (this one may have imported the whole package already).
"""

from __future__ import annotations

import json
import subprocess
import sys


def fresh(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_a_compute_engine_client_loads_only_its_own_service() -> None:
    got = fresh("""
import json, sys
from tpuwatch.cloud import clients
import os
os.environ["TPUWATCH_COMPUTE_EMULATOR"] = "http://127.0.0.1:9"
client = clients.compute_client("instances")
inst = clients.compute_v1().Instance.from_json('{"name": "vm"}')
from google.cloud import compute_v1
services = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("google.cloud.compute_v1.services.")
                  and m.count(".") == 4)
print(json.dumps({"services": services, "same": compute_v1 is clients.compute_v1(), "name": inst.name,
                  "client": type(client).__name__, "version": compute_v1.__version__}))
""")
    # an instance's operations are followed through zoneOperations: its client imports that one
    assert got["services"] == ["instances", "zone_operations"], got
    assert got["same"] is True and got["name"] == "vm" and got["client"] == "InstancesClient", got
    assert isinstance(got["version"], str) and got["version"], got


NAMES = """
import ast, json
from tpuwatch.cloud import clients
LAZY
tree = ast.parse(open(pkg.__file__).read())
names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", "") == "__all__" for t in n.targets))
print(json.dumps({n: f"{getattr(pkg, n).__module__}.{getattr(pkg, n).__qualname__}" for n in names}))
"""


def test_every_name_the_package_exports_is_googles_own() -> None:
    lazy = fresh(NAMES.replace("LAZY", "pkg = clients.compute_v1()"))
    real = fresh(NAMES.replace("LAZY", "import google.cloud.compute_v1 as pkg"))
    assert len(real) > 1000 and lazy == real


def test_a_name_the_package_does_not_have_is_an_attribute_error() -> None:
    got = fresh("""
import json
from tpuwatch.cloud import clients
try:
    clients.compute_v1().NoSuchThing
    print(json.dumps({"raised": False}))
except AttributeError as exc:
    print(json.dumps({"raised": str(exc), "types": clients.compute_v1().types.__name__}))
""")
    assert got == {"raised": "module 'google.cloud.compute_v1' has no attribute 'NoSuchThing'",
                   "types": "google.cloud.compute_v1.types"}, got
