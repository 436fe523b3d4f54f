"""The small rules of a watcher of several jobs: config files and their changes, the exit code
of the lot, the poll grid the jobs of a zone share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch.errors import UsageError
from tpuwatch.fleet import sources
from tpuwatch.fleet.runner import grid_delay, most_severe


def test_a_changed_added_or_removed_file_is_seen_by_its_bytes(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "a.toml").write_text("[tpu]\nname = 'a'\n")
    (d / "b.toml").write_text("[tpu]\nname = 'b'\n")
    (d / "notes.txt").write_text("not a config")
    first = sources.scan([], d)
    assert sorted(p.name for p in first) == ["a.toml", "b.toml"]
    (d / "a.toml").write_text("[tpu]\nname = 'a2'\n")
    (d / "b.toml").unlink()
    (d / "c.toml").write_text("[tpu]\nname = 'c'\n")
    changes = sources.diff(first, sources.scan([], d))
    assert [p.name for p in changes.added] == ["c.toml"]
    assert [p.name for p in changes.removed] == ["b.toml"]
    assert [p.name for p in changes.changed] == ["a.toml"]
    assert sources.diff(first, first) == sources.Changes((), (), ())


def test_config_dir_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--config-dir .* does not exist"):
        sources.check_dir(tmp_path / "nope")
    (tmp_path / "f.toml").write_text("")
    with pytest.raises(UsageError, match="is not a directory"):
        sources.check_dir(tmp_path / "f.toml")


def test_the_exit_code_is_the_most_severe_of_the_jobs() -> None:
    assert most_severe([]) == 0
    assert most_severe([0, 0]) == 0
    assert most_severe([0, 1]) == 1
    assert most_severe([1, 3, 0]) == 3
    assert most_severe([3, 2, 1]) == 2  # a config no watcher can run outranks the rest


def test_steady_waits_end_on_the_poll_grid() -> None:
    assert grid_delay(30.0, 1000.0) == pytest.approx(20.0)  # 1000 -> 1020
    assert grid_delay(30.0, 1018.0) == pytest.approx(32.0)  # 2 s to the grid is too soon: the next one
    # two jobs ending their ticks at different times wake together
    assert 1003.5 + grid_delay(30.0, 1003.5) == pytest.approx(1005.0 + grid_delay(30.0, 1005.0))
