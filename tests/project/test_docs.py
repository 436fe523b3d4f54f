"""The docs say what the code does: README's reference tables match config.SCHEMA and spec.SPEC_KEYS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpuwatch.config import SCHEMA

ROOT = Path(__file__).resolve().parents[2]


def test_readme_config_reference_is_generated_from_the_schema() -> None:
    readme = (ROOT / "README.md").read_text()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py")],
                         capture_output=True, text=True, check=True).stdout.strip()
    for block in out.split("\n\n"):
        assert block in readme, "README's reference tables are stale: run `python scripts/config_reference.py --write`"
    for section, fields in SCHEMA.items():
        for key in fields:
            assert f"`{section}.{key}`" in readme, f"{section}.{key} is not documented in README.md"
