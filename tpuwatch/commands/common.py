"""Options and helpers shared by the commands that act on a job (check, watch, history)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tpuwatch.journal import Busy, Journal
from tpuwatch.ports import Flags
from tpuwatch.wiring import Job

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_OPTION = click.option(
    "-c", "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
    default=Path("tpuwatch.toml"), show_default=True, help="The job's config file.")


CONFIGS_OPTION = click.option(
    "-c", "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), multiple=True,
    help="A job's config file; repeat for several jobs in one watcher [default: tpuwatch.toml].")
CONFIG_DIR_OPTION = click.option(
    "--config-dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
    help="Watch every *.toml in this directory as a job; files added, removed or changed are picked up.")


def job_options(fn: F, *, many: bool = False) -> F:
    """-c, --project, --zone, --adopt, --recreate-missing, --dry-run (`many`: -c repeatable, --config-dir)."""
    for option in reversed([
        *((CONFIGS_OPTION, CONFIG_DIR_OPTION) if many else (CONFIG_OPTION,)),
        click.option("--project", help="GCP project (default: config, env, gcloud)."),
        click.option("--zone", help="Zone, e.g. us-central2-b (default: config, env, gcloud)."),
        click.option("--adopt", is_flag=True,
                     help="Treat the TPU as owned even without the tpuwatch-job label (may delete it)."),
        click.option("--recreate-missing", is_flag=True,
                     help="Recreate the TPU if it vanished without tpuwatch deleting it."),
        click.option("--dry-run", is_flag=True, help="Decide and print the actions; change nothing."),
    ]):
        fn = option(fn)
    return fn


def jobs_options(fn: F) -> F:
    """job_options for the commands that take several jobs (watch, check)."""
    return job_options(fn, many=True)


def single_config(paths: tuple[Path, ...], config_dir: Path | None) -> Path | None:
    """The one config of a single-job run (no --config-dir, at most one -c); None for several jobs."""
    if config_dir is None and len(paths) <= 1:
        return paths[0] if paths else Path("tpuwatch.toml")
    return None


def tick_flags(adopt: bool, recreate_missing: bool, dry_run: bool) -> Flags:
    return Flags(adopt=adopt, recreate_missing=recreate_missing, dry_run=dry_run)


def open_journal_or_busy(job: Job) -> Journal | None:
    """The job's journal, opened for writing; None when another tpuwatch holds it."""
    try:
        return Journal.open(job.cfg.state_dir, job.name, job.cfg.tpu_name, wait=False)
    except Busy:
        return None
