"""Options and helpers shared by the commands that act on a job (check, watch, history, run, precheck)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tpuwatch.config import Config
from tpuwatch.errors import JobFailed, NotFoundError
from tpuwatch.journal import Busy, Journal
from tpuwatch.model import NodeSnapshot, bound_view, job_node
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


def node_as_run(cfg: Config, get_node: Callable[[str], NodeSnapshot | None]) -> NodeSnapshot | None:
    """The job's node where its watcher runs it now, for the commands that reach its workers
    outside a watch (run, precheck): a slot its journal binds to a spare is read on that spare,
    a slice left out while it limps is left out, a slice lent to a job of higher priority is an
    error (the job runs nowhere); without a journal, as configured."""
    limp = None
    if cfg.slots:
        try:
            with Journal.open(cfg.state_dir, cfg.job_name, None, readonly=True) as journal:
                mem = journal.load_memory()
        except NotFoundError:  # never watched here: its slots are on their own nodes
            mem = None
        limp = mem.limp if mem is not None else None
    if limp is None or not (limp.swapped or limp.out):
        return job_node(get_node, cfg.tpu_name, cfg.tpu["names"])
    lent = dict(limp.lent)
    for slot in limp.slots(cfg.slots):
        if limp.node_of(slot) == "":  # lent to a job of higher priority ([job] priority)
            raise JobFailed(f"job {cfg.job_name}'s slice {slot} is lent to job {lent.get(slot, '?')}, which has a higher "
                            "priority: the job runs on no node until one is handed back or a spare is free")
    on = dict(limp.swapped)
    read = {n: get_node(n) for n in dict.fromkeys(limp.kept(cfg.slots))}
    return bound_view(cfg.tpu_name, cfg.slots, read, limp.out, on)[0]
