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


def test_nothing_says_the_logging_read_quota_cannot_be_raised() -> None:
    # Google's Logging quotas page: the API's quotas can be raised on request; only the entry
    # size and similar limits are fixed. The shared audit reader is still needed by default.
    wrong = ("cannot be raised", "not raisable", "can't be raised", "can not be raised")
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "tpuwatch").rglob("*.py"))]
    said = [f"{f.relative_to(ROOT)}: {w!r}" for f in files for w in wrong if w in f.read_text().lower()]
    assert not said, said
    assert "an increase can be requested" in (ROOT / "README.md").read_text()
