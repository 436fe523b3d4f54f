"""`tpuwatch report`: where the job's wall time went, from its journal (tpuwatch.report)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tpuwatch.commands.common import CONFIG_OPTION
from tpuwatch.errors import UsageError

if TYPE_CHECKING:
    pass

EPILOG = """\b
Examples:
  tpuwatch report -c tpuwatch.toml
  tpuwatch report -c tpuwatch.toml --since 7d --html report.html
  tpuwatch report -c tpuwatch.toml --json

--html needs the plotting extra: pip install 'tpuwatch[report]'
"""


@click.command(epilog=EPILOG)
@CONFIG_OPTION
@click.option("--since", help="Only wall time after this: a duration back from now (24h, 7d) or an RFC 3339 time.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: categories, goodput, causes, timeline.")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write one self-contained HTML file with a timeline to this path.")
def command(config_path: Path, since: str | None, as_json: bool, html_path: Path | None) -> int:
    """Show where the job's wall time went: productive training, work lost since the last
    checkpoint, waiting for the node to heal, recreating or queued, start-up and restore, hung,
    charged failures, and stopped by a person; the job's goodput and its costliest incidents."""
    from tpuwatch.commands.history import since_time
    from tpuwatch.config import load_config
    from tpuwatch.journal import Journal
    from tpuwatch.report import chips, compute, text
    from tpuwatch.ui import report_html

    start = since_time(since)
    if html_path is not None:
        _check_html(html_path)
    cfg = load_config(config_path, require_command=False)
    with Journal.open(cfg.state_dir, cfg.job_name, cfg.tpu_name, readonly=True) as journal:
        events, attempts = journal.events(), journal.attempts()
    spares = tuple(cfg.tpu["spares"])
    report = compute(cfg.job_name, events, attempts, datetime.now(timezone.utc), since=start, spares=len(spares),
                     spare_chips=chips(str((cfg.tpu["spec"] or {}).get("accelerator_type", ""))) if spares else 0)
    if html_path is not None:
        report_html.write(report, html_path)
    if as_json:
        out = report.as_dict()
        if html_path is not None:
            out["html"] = str(html_path)
        click.echo(json.dumps(out, sort_keys=True))
        return 0
    click.echo(text(report))
    if html_path is not None:
        click.echo(f"\nwrote {html_path}")
    return 0


def _check_html(path: Path) -> None:
    """Before any work: the plotting extra is installed and the path can be written."""
    from tpuwatch.ui.report_html import PIP_EXTRA, available

    if not available():
        raise UsageError(f"--html: the HTML report needs the plotting extra; install it with: {PIP_EXTRA}")
    shown = repr(str(path)[:200])
    try:
        if not path.name or path.is_dir():
            raise UsageError(f"--html: {shown} is not a file name; give one, e.g. --html report.html")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise UsageError(f"--html: {shown} is not in an existing directory; give a file in one")
        if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"--html: cannot write {shown} (permission denied); give a path you can write")
    except OSError as exc:  # a name too long, a loop of links, ...
        raise UsageError(f"--html: cannot use {shown}: {exc.strerror or exc}; give a path you can write") from None
