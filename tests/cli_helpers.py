"""Shared helpers for tests that call the CLI in-process: the real entry point, output captured.

Not a test module: `cli_env` is the environment for a simulator (never the machine's gcloud
config), `run` calls `tpuwatch.cli.main` under that environment, `run_cli` calls it under
pytest's `capsys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuwatch.cli import main
from tpuwatch.sim.simulator import Simulator


def cli_env(sim: Simulator, tmp_path: Path, **extra: str | None) -> dict[str, str | None]:
    """The simulator's environment; None unsets a variable."""
    env: dict[str, str | None] = {
        **sim.env,
        "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"),  # never the machine's gcloud config
        "GOOGLE_CLOUD_PROJECT": None,
        "TPUWATCH_API_BACKOFF_SCALE": "0.01",
        "COLUMNS": "80",
    }
    env.update(extra)
    return env


def run(args: list[str], env: Mapping[str, str | None]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the real entry point (exit-code mapping included)."""
    code = 0
    with CliRunner().isolation(env=env) as (out, err, _):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue().decode(), err.getvalue().decode()


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the real entry point, read through pytest's capsys."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err
