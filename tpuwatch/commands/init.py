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

from tpuwatch import spec as specmod
from tpuwatch.errors import JobFailed, NotFoundError, UsageError

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
    from tpuwatch.cloud.clients import compute_available
    from tpuwatch.cloud.location import resolve
    from tpuwatch.cloud.tpu.adapter import TpuAdapter, multislice_params
    from tpuwatch.config import load_config
    from tpuwatch.recreate import set_owner_label, wait_operation

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
    api = TpuAdapter(loc.project, loc.zone)

    node = api.get_node_message(name)
    if node is None and compute_available():
        _init_compute(name, loc.project, loc.zone, out, job, adopt, as_json)
        return
    if node is None:
        raise NotFoundError(
            f"no TPU named {name} in {loc.project}/{loc.zone} (check the name, --project and --zone; "
            "`tpuwatch status --all` lists the zone)"
        )
    qr_short = node.queued_resource.rsplit("/", 1)[-1] if node.queued_resource else ""
    qr = api.get_queued_resource(node.queued_resource) if node.queued_resource else None
    slices: list[str] = []
    if node.multislice_node:
        # One slice of a multislice request: the job is the whole request, kept alive as one.
        count, prefix = multislice_params(qr) if qr is not None else (0, "")
        if count < 2:
            raise UsageError(
                f"TPU {name} is one slice of a multislice request that cannot be read "
                f"({qr_short or 'no queued resource named'}); list its nodes in tpu.names by hand")
        slices = [f"{prefix or qr_short}-{i}" for i in range(count)]
    group = qr_short if slices else name
    job_name = _job_name(job, group)
    labelled = {name: dict(node.labels)}
    if slices:
        found = {n: api.get_node_message(n) for n in slices}
        gone = [n for n, m in found.items() if m is None]
        if gone:
            raise NotFoundError(f"multislice request {qr_short} lists {', '.join(gone)}, which does not exist "
                                f"in {loc.project}/{loc.zone}; run init again once every slice is there")
        labelled = {n: dict(m.labels) for n, m in found.items() if m is not None}
    owners = {labels.get(specmod.OWNER_LABEL, "") for labels in labelled.values()}
    have = owners.pop() if len(owners) == 1 else ""
    others = sorted(o for o in {*owners, have} if o and o != job_name)
    if adopt and others:
        raise JobFailed(
            f"TPU {name} already belongs to job {others[0]!r} ({specmod.OWNER_LABEL}={others[0]}); "
            f"use --job {others[0]}, or remove that label first if the other job is gone"
        )
    spec = specmod.capture(node, job_name)
    if qr is not None:
        spec.update(specmod.capture_queued_resource(qr))
    metadata = dict(node.metadata)
    text = specmod.render_config(
        name=group, names=slices, project=loc.project, zone=loc.zone, spec=spec, queued_resource=qr_short,
        command=metadata.get("tpuwatch-command", ""), checkpoint_dir=metadata.get("tpuwatch-checkpoint-dir", ""),
        source=f"projects/{loc.project}/locations/{loc.zone}/nodes/{name}", job=job_name,
    )
    try:
        _write_atomic(out, text)
    except OSError as exc:
        raise UsageError(f"-o: cannot write {out}: {exc.strerror or exc}") from None
    load_config(out)  # what we write must load; a failure here is a bug worth a loud message

    adopted = False
    for target, labels in labelled.items() if adopt else ():
        if labels.get(specmod.OWNER_LABEL) == job_name:
            continue
        op = set_owner_label(api, target, labels, job_name)
        status = wait_operation(api, op, timeout=600, what=f"labelling {target}")
        if status.error_code:
            raise JobFailed(f"adding the label {specmod.OWNER_LABEL}={job_name} to {target} failed: "
                            f"{status.error_message}")
        adopted = True

    if as_json:
        click.echo(json.dumps({"path": str(out), "job": job_name, "spec": spec, "queued_resource": qr_short,
                               "slices": slices,
                               "adopted": adopted, "owned": adopted or have == job_name}, indent=2))
        return
    lines = [f"wrote {out} for TPU {name} ({loc.project}/{loc.zone}), job {job_name}"]
    if slices:
        lines.append(f"  one job over the {len(slices)} slices of multislice request {qr_short} ({', '.join(slices)}): "
                     "kept alive as one, and recreated as a whole request")
    elif qr_short:
        lines.append(f"  came from queued resource {qr_short}; recreate will go through a queued resource too")
    if adopted:
        lines.append(f"  labelled the live TPU {specmod.OWNER_LABEL}={job_name}: tpuwatch may now recreate it")
    elif have == job_name:
        lines.append(f"  the live TPU already carries {specmod.OWNER_LABEL}={job_name}")
    else:
        lines.append(f"  the live TPU has no {specmod.OWNER_LABEL}={job_name} label, so tpuwatch will not delete "
                     f"it; run `tpuwatch init {name} --adopt --force` to allow that")
    lines.append("  next: edit [job] command and checkpoint_dir, set tpu.startup_script, then `tpuwatch watch -c "
                 f"{out}`")
    click.echo("\n".join(lines))


def _init_compute(name: str, project: str, zone: str, out: Path, job: str | None, adopt: bool, as_json: bool) -> None:
    """NAME is no TPU API node: find it as a Compute Engine instance, then as a MIG, and write
    its config with what recreating it needs (one get, plus the MIG's template, workload policy,
    managed instances and the instances' disks)."""
    from tpuwatch.cloud.compute.adapter import ComputeAdapter, flex_run
    from tpuwatch.cloud.compute.spec import capture_instance, capture_mig
    from tpuwatch.cloud.compute.view import mig_snapshot
    from tpuwatch.config import load_config

    inst_api = ComputeAdapter(project, zone, "instance")
    inst = inst_api.get_instance(name)
    if inst is not None:
        kind, flex = "instance", ""
        spec: dict[str, object] = {"instance": capture_instance(inst_api, inst)}
        labels = dict(inst.labels)
        workers = 1
    else:
        mig_api = ComputeAdapter(project, zone, "mig")
        parts = mig_api.mig_parts(name)
        if parts is None:
            raise NotFoundError(
                f"no TPU node, Compute Engine instance or managed instance group named {name} in {project}/{zone} "
                "(check the name, --project and --zone)")
        kind = "mig"
        spec = capture_mig(mig_api, parts[0])
        flex = flex_run(mig_api, name)  # its VMs came through flex-start resize requests
        snap = mig_snapshot(*parts, project=project, zone=zone, region=mig_api.mig_region(name))
        labels, workers = dict(snap.labels), len(snap.workers)
    job_name = _job_name(job, name)
    have = labels.get(specmod.OWNER_LABEL, "")
    if adopt:
        raise UsageError(f"--adopt: tpuwatch does not label Compute Engine {kind}s; add the label "
                         f"{specmod.OWNER_LABEL}={job_name} "
                         + ("with `gcloud compute instances add-labels`" if kind == "instance" else
                            "to the MIG's instance template (its instances carry the template's labels)")
                         + ", or run `tpuwatch watch --adopt`")
    text = specmod.render_compute_config(kind=kind, name=name, project=project, zone=zone, spec=spec, job=job_name,
                                         flex_start=flex,
                                         source=(f"projects/{project}/zones/{zone}/instances/{name}" if kind == "instance"
                                                 else snap.resource))
    try:
        _write_atomic(out, text)
    except OSError as exc:
        raise UsageError(f"-o: cannot write {out}: {exc.strerror or exc}") from None
    load_config(out)
    owned = have == job_name
    if as_json:
        click.echo(json.dumps({"path": str(out), "job": job_name, "api": "compute", kind: name, "spec": spec,
                               "flex_start": flex,
                               "workers": workers, "adopted": False, "owned": owned}, indent=2))
        return
    what = "instance" if kind == "instance" else f"managed instance group ({workers} VM{'s' if workers != 1 else ''})"
    lines = [f"wrote {out} for Compute Engine {what} {name} ({project}/{zone}), job {job_name}"]
    lines.append(f"  it carries {specmod.OWNER_LABEL}={job_name}" if owned else
                 f"  it has no {specmod.OWNER_LABEL}={job_name} label, so tpuwatch will not delete or recreate it; "
                 "label it (" + ("`gcloud compute instances add-labels`" if kind == "instance" else
                                 "in its instance template") + ") or watch with --adopt")
    lines.append(f"  next: edit [job] command and checkpoint_dir, then `tpuwatch watch -c {out}`")
    click.echo("\n".join(lines))
