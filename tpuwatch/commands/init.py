"""`tpuwatch init NAME`: read a live TPU and write tpuwatch.toml with its spec captured.

Reads: one v2alpha1 get of the node (plus one get of its queued resource when it came from
one); for a NAME that is no node, the Compute Engine instance or MIG of that name. Writes: the config file only, never the node - except with `--adopt`, which adds the
ownership label `tpuwatch-job=<job>` to the live node (one update_node, labels only).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import click

from tpuwatch.errors import NotFoundError, UsageError

HELP = """Read an existing TPU and write tpuwatch.toml with everything needed to create
it again ([tpu.spec]: accelerator, runtime version, network, service account, scheduling,
labels, metadata, tags, data disks, shielded VM, boot disk) and its queued resource when it
came from one. The spec gets the ownership label tpuwatch-job=<job>; the live node does not,
unless --adopt is given. A NAME that is no TPU API node is looked up as a Compute Engine
instance, then a managed instance group (TPU7x and later, or v5p/v6e made that way): the config
gets [tpu] api = "compute" and [tpu.compute_spec] (the instance, or the MIG with its template
and workload policy).

\b
Examples:
  tpuwatch init llm-pod --zone us-central2-b
  tpuwatch init llm-pod -o ~/jobs/llm.toml --job llm-run-3 --adopt

Exit codes: 0 written, 1 no such TPU (or it belongs to another job), 2 bad usage or the file
exists (use --force), 3 cloud API error.
"""


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _job_name(job: str | None, name: str) -> str:
    from tpuwatch.config import _LABEL_VALUE

    if job is not None and not job.strip():
        raise UsageError("--job: empty; give a job name, or leave the flag out to use the TPU name")
    value = job or name
    if not _LABEL_VALUE.match(value):
        raise UsageError(
            f"--job: {value!r} is not a valid job name (lowercase letters, digits, - and _, up to 63); "
            "it becomes the tpuwatch-job label value"
        )
    return value


@click.command(name="init", help=HELP)
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("tpuwatch.toml"),
              show_default=True, help="Config file to write.")
@click.option("--job", help="Job name (default: the TPU name): names the journal and the ownership label.")
@click.option("--adopt", is_flag=True, help="Also put the label tpuwatch-job=<job> on the live TPU, so "
              "tpuwatch may delete and recreate it.")
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
@click.option("--project", help="GCP project (default: env, gcloud).")
@click.option("--zone", help="Zone, e.g. us-central2-b (default: env, gcloud).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def command(name: str, output: Path, job: str | None, adopt: bool, force: bool, project: str | None,
            zone: str | None, as_json: bool) -> None:
    from tpuwatch.cloud.apis import APIS
    from tpuwatch.cloud.base import InitRequest
    from tpuwatch.cloud.location import resolve
    from tpuwatch.config import load_config
    from tpuwatch.recreate import wait_operation

    out = Path(os.path.expanduser(str(output)))
    try:
        exists, is_dir = out.exists(), out.is_dir()
    except OSError as exc:  # a name too long, a file where a directory should be
        raise UsageError(f"-o: {str(out)[:200]!r} cannot be used: {exc.strerror}") from None
    if exists and not force:
        raise UsageError(f"{out} already exists; pass --force to overwrite it, or -o another file")
    if is_dir:
        raise UsageError(f"-o: {out} is a directory; give a file name such as {out / 'tpuwatch.toml'}")
    _job_name(job, name)  # a bad --job is refused before any cloud call
    loc = resolve(project, zone)
    assert loc.zone is not None

    def write(text: str) -> None:
        try:
            _write_atomic(out, text)
        except OSError as exc:
            raise UsageError(f"-o: cannot write {out}: {exc.strerror or exc}") from None
        load_config(out)  # what we write must load; a failure here is a bug worth a loud message

    request = InitRequest(name=name, project=loc.project, zone=loc.zone, job=job, adopt=adopt, out=str(out),
                          job_name=_job_name, write=write,
                          wait=lambda api, op, what: wait_operation(api, op, timeout=600, what=what))
    # each API in turn (the TPU API's nodes first, then Compute Engine's instances and MIGs)
    result = next((r for api in APIS.values() if (r := api.init_config(request)) is not None), None)
    if result is None:
        raise NotFoundError(
            f"no TPU named {name} in {loc.project}/{loc.zone} (no TPU node, Compute Engine instance or managed "
            "instance group of that name; check the name, --project and --zone)"
        )
    if as_json:
        click.echo(json.dumps(result.summary, indent=2))
    else:
        click.echo("\n".join(result.lines))
