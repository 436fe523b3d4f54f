"""The docs say what the code does, and their links lead somewhere.

docs/configuration.md's reference tables match config.SCHEMA and spec.SPEC_KEYS; every relative
link in README.md, CONTRIBUTING.md and docs/ names a file that exists and, with `#anchor`, a
heading in it (anchors made as GitHub makes them).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tpuwatch.config import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DOC = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_config_reference_is_generated_from_the_schema() -> None:
    doc = CONFIG_DOC.read_text()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py")],
                         capture_output=True, text=True, check=True).stdout.strip()
    for block in out.split("\n\n"):
        assert block in doc, "docs/configuration.md's reference tables are stale: run `python scripts/config_reference.py --write`"
    for section, fields in SCHEMA.items():
        for key in fields:
            assert f"`{section}.{key}`" in doc, f"{section}.{key} is not documented in docs/configuration.md"


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a `#` or `](` is not markdown."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1... on repeats."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def test_every_relative_link_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"[a-z][a-z+.-]*:", target):
                continue  # https:, mailto:: not this repository's
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists() or ROOT not in dest.parents:
                broken.append(f"{where}: no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_anchors_as_github_makes_them() -> None:
    policy = _anchors(ROOT / "docs" / "policy.md")
    assert "hung-jobs-recoveryhang_timeout" in policy and "what-is-charged" in policy
    assert "the-simulator-tpuwatchsim" in _anchors(ROOT / "docs" / "design.md")


def test_nothing_says_the_logging_read_quota_cannot_be_raised() -> None:
    # Google's Logging quotas page: the API's quotas can be raised on request; only the entry
    # size and similar limits are fixed. The shared audit reader is still needed by default.
    wrong = ("cannot be raised", "not raisable", "can't be raised", "can not be raised")
    files = [*PAGES, *sorted((ROOT / "tpuwatch").rglob("*.py"))]
    said = [f"{f.relative_to(ROOT)}: {w!r}" for f in files for w in wrong if w in f.read_text().lower()]
    assert not said, said
    assert "an increase can be requested" in (ROOT / "docs" / "many-jobs.md").read_text()


def test_the_module_sizes_design_md_gives_are_near_the_modules_own() -> None:
    """docs/design.md's tables of modules give each one's lines (the policy's exactly when written,
    the long ones as "~N"): within 15 % of the file's, or the table is stale."""
    sizes = re.findall(r"^\| `([\w/]+\.py)` \| ~?(\d+) \|", (ROOT / "docs" / "design.md").read_text(), flags=re.M)
    assert len(sizes) > 30, sizes
    stale = []
    for name, said in sizes:
        path = next(p for base in ("tpuwatch/policy", "tpuwatch", ".") if (p := ROOT / base / name).exists())
        lines = len(path.read_text().splitlines())
        if abs(lines - int(said)) > 0.15 * int(said):
            stale.append(f"{name}: {said} said, {lines} now")
    assert stale == [], f"docs/design.md's module sizes are stale: {stale}"
