#!/usr/bin/env python3
"""Print (or --write into README.md) the configuration reference table, made from config.SCHEMA.

README.md holds the table between the markers `<!-- config-reference -->` and
`<!-- /config-reference -->`; tests/test_docs.py fails when it drifts from the schema.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tpuwatch.config import SCHEMA
from tpuwatch.durations import human

START, END = "<!-- config-reference -->", "<!-- /config-reference -->"


def _default(key: str, value: object) -> str:
    if value is None:
        return "required"
    if isinstance(value, frozenset):
        return str(sorted(value))
    if isinstance(value, tuple):
        return str(list(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and key.endswith(("min_disk", "min_shm", "min_cache")):
        return f"{value / 1e9:g}GB"
    if isinstance(value, float):
        return human(value)
    if value == "":
        return '""'
    return str(value)


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for section, fields in SCHEMA.items():
        for key, spec in fields.items():
            meaning = spec.doc.replace("|", "\\|")
            rows.append(f"| `{section}.{key}` | `{_default(key, spec.default)}` | {meaning} |")
    return "\n".join(rows)


def main() -> int:
    text = table()
    if "--write" not in sys.argv:
        print(text)
        return 0
    readme = Path(__file__).resolve().parent.parent / "README.md"
    old = readme.read_text()
    new, n = re.subn(re.escape(START) + r".*?" + re.escape(END), f"{START}\n{text}\n{END}", old, flags=re.S)
    if n != 1:
        print(f"README.md has no {START} ... {END} block", file=sys.stderr)
        return 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
