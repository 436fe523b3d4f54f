"""The config files of a watcher of several jobs: the `-c` files, and every `*.toml` in `--config-dir`.

A file is known by a hash of its bytes, so a change is seen whatever its mtime says (an editor
that keeps it, a copy with `cp -p`), and a file that cannot be read hashes to "" (its job is
then shown with the error its loading gives).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.errors import UsageError


@dataclass(frozen=True)
class Changes:
    added: tuple[Path, ...]
    removed: tuple[Path, ...]
    changed: tuple[Path, ...]


def check_dir(directory: Path) -> Path:
    """--config-dir must name a directory that exists (exit 2 otherwise)."""
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise UsageError(f"--config-dir {str(directory)!r} {what}; name a directory holding job configs (*.toml)")
    return directory


def fingerprint(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def scan(files: Sequence[Path], directory: Path | None) -> dict[Path, str]:
    """Every config file -> its fingerprint: `files` as given, then `directory`'s `*.toml` by name."""
    found = {Path(f): fingerprint(Path(f)) for f in files}
    if directory is not None:
        try:
            names = sorted(p for p in directory.glob("*.toml") if p.is_file())
        except OSError:
            names = []
        for p in names:
            found.setdefault(p, fingerprint(p))
    return found


def diff(before: Mapping[Path, str], after: Mapping[Path, str]) -> Changes:
    return Changes(
        added=tuple(p for p in after if p not in before),
        removed=tuple(p for p in before if p not in after),
        changed=tuple(p for p in after if p in before and before[p] != after[p]),
    )
