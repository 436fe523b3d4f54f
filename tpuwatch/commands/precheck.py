"""`tpuwatch precheck [-c tpuwatch.toml] [NAME]`: run the environment checks on every worker now.

One get of the node (TPU API, or Compute Engine for tpu.api = "compute"), then one SSH round trip per worker (in parallel). It only reads:
it fixes nothing (that is the tick's job before a launch) and writes no journal, so it is safe
to run beside `tpuwatch watch`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpuwatch.commands.common import CONFIG_OPTION, node_as_run
from tpuwatch.errors import JobFailed, NotFoundError
from tpuwatch.model import CheckItem, PrecheckReport

HELP = """Run the environment checks on every worker of the job's TPU now and print a
table: disk, shm, cache, ulimit, dns, devices, device_holders, libtpu_lock,
interpreter, and every [[precheck.custom]] check, with the measured value, the
threshold from [precheck] and the verdict.

\b
NAME: a TPU name (default: [tpu] name in the config). The checks and the SSH
settings come from the config (-c, default ./tpuwatch.toml).
Nothing is changed on the workers: orphan device holders and a stale libtpu
lockfile are reported as fixable; `tpuwatch watch`/`check` fix them before a launch.

\b
Examples:
  tpuwatch precheck -c ~/tpuwatch.toml
  tpuwatch precheck -c ~/tpuwatch.toml --json | jq '.items[] | select(.verdict == "fail")'

Exit codes: 0 every check passed (warnings allowed); 1 a check failed, a worker did
not answer, the TPU is missing or not READY; 2 bad config; 3 cloud API error.
"""

VERDICT_STYLE = {"pass": "green", "fail": "red", "warn": "yellow", "skip": "dim"}


@click.command(name="precheck", help=HELP)
@click.argument("name", required=False)
@CONFIG_OPTION
@click.option("--project", help="GCP project (default: config, env, gcloud).")
@click.option("--zone", help="Zone, e.g. us-central2-b (default: config, env, gcloud).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the node and every item.")
def command(name: str | None, config_path: Path, project: str | None, zone: str | None,
            as_json: bool) -> int:
    from tpuwatch.cloud.location import resolve
    from tpuwatch.config import load_config
    from tpuwatch.wiring import slice_reader
    from tpuwatch.workers.precheck import Prechecker, report_dict
    from tpuwatch.workers.sshworkers import SshWorkers

    overrides = {"tpu.name": name} if name is not None else None  # "" is refused, not ignored
    cfg = load_config(config_path, overrides, require_command=False)
    loc = resolve(project, zone, config_project=cfg.tpu["project"], config_zone=cfg.tpu["zone"])
    assert loc.zone is not None
    zone_api = slice_reader(cfg, loc.project)  # one per zone: instance names are read once per node id
    workers = SshWorkers.from_config(cfg, host_keys=lambda n: zone_api(n.zone).host_keys(n.name),
                                     instances=lambda n: zone_api(n.zone).instance_names(n))
    workers.transport.check()  # an unreadable key is exit 2 before any cloud call
    node = node_as_run(cfg, zone_api(loc.zone).get_node)
    if node is None:
        raise NotFoundError(f"no TPU named {cfg.tpu_name} in {loc.project}/{loc.zone}")
    if node.state != "READY" or not node.workers:
        raise JobFailed(f"TPU {cfg.tpu_name} is {node.state}: its workers cannot be checked until it is READY")
    try:
        report = Prechecker.from_config(cfg, workers).run(node, "launch")
    finally:
        workers.close()  # the shared SSH connections end with the run
    if as_json:
        click.echo(json.dumps({"node": node.name, "zone": node.zone, **report_dict(report)}, sort_keys=True))
        return 0 if report.ok else 1
    table = Table(box=None, padding=(0, 1), show_edge=False, title_justify="left",
                  title=f"{node.name} ({node.zone}, {node.accelerator_type or '?'}, {len(node.workers)} workers)")
    for col in ("check", "workers", "verdict", "value", "threshold", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("check", "verdict"))
    for row in table_rows(report, len(node.workers)):
        check, where, verdict, value, threshold, detail = row
        table.add_row(check, where, Text(verdict, style=VERDICT_STYLE[verdict.split()[0]]), value, threshold, detail)
    console = Console(highlight=False, soft_wrap=False, width=max(Console().width, 100))
    console.print(table)
    failing = len(report.failing) + len(report.unreachable)
    if failing:
        click.echo(f"{failing} check(s) failed on {node.name}")
        return 1
    click.echo(f"all checks passed on {len(node.workers)} worker(s) of {node.name}")
    return 0


def table_rows(report: PrecheckReport, n_workers: int) -> list[tuple[str, str, str, str, str, str]]:
    """(check, workers, verdict, value, threshold, detail) rows: a check that passes on every
    worker is one row (worker 0's value shown); otherwise one row per worker that did not pass."""
    rows: list[tuple[str, str, str, str, str, str]] = []
    order: dict[str, list[CheckItem]] = {}
    for i in report.items:
        order.setdefault(i.check, []).append(i)
    for check, items in order.items():
        verdicts = {i.verdict for i in items}
        first = min(items, key=lambda i: i.worker)
        if len(verdicts) == 1 and verdicts <= {"pass", "skip"}:
            where = "all" if len(items) == n_workers else ",".join(f"w{i.worker}" for i in items)
            rows.append((check, where, first.verdict, first.value, first.threshold, first.detail))
            continue
        for i in sorted(items, key=lambda i: i.worker):
            if i.verdict in ("pass", "skip"):
                continue
            verdict = i.verdict + (" (fixable)" if i.fixable else "")
            rows.append((check, f"w{i.worker}", verdict, i.value, i.threshold, i.detail))
        passed = [i for i in items if i.verdict == "pass"]
        if passed:
            rows.append((check, f"{len(passed)} other(s)", "pass", min(passed, key=lambda i: i.worker).value,
                         passed[0].threshold, ""))
    for w, why in report.unreachable:
        rows.append(("ssh", f"w{w}", "fail", "unreachable", "", why))
    return rows

