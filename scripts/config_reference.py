#!/usr/bin/env python3
"""Print (or --write into docs/configuration.md) the configuration reference, made from the code.

docs/configuration.md holds the config table (from config.SCHEMA) between `<!-- config-reference -->` and
`<!-- /config-reference -->`, and the `[tpu.spec]` table (from spec.SPEC_KEYS) between
`<!-- spec-reference -->` and `<!-- /spec-reference -->`; tests/project/test_docs.py fails when
either drifts from the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tpuwatch.config import SCHEMA
from tpuwatch.durations import human

BLOCKS = ("config-reference", "spec-reference")


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


def spec_table() -> str:
    from tpuwatch.spec import REQUIRED, SPEC_KEYS

    rows = ["| key | type | meaning |", "|---|---|---|"]
    for key, (kind, doc) in SPEC_KEYS.items():
        need = " (required)" if key in REQUIRED and "required" not in doc else ""
        rows.append(f"| `{key}` | {kind} | {doc.replace('|', chr(92) + '|')}{need} |")
    return "\n".join(rows)


def main() -> int:
    texts = {"config-reference": table(), "spec-reference": spec_table()}
    if "--write" not in sys.argv:
        print("\n\n".join(texts.values()))
        return 0
    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = doc.read_text()
    for name in BLOCKS:
        start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        text, n = re.subn(re.escape(start) + r".*?" + re.escape(end), f"{start}\n{texts[name]}\n{end}",
                          text, flags=re.S)
        if n != 1:
            print(f"docs/configuration.md has no {start} ... {end} block", file=sys.stderr)
            return 1
    doc.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
