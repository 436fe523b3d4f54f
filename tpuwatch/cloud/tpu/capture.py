"""`tpuwatch init` for a Cloud TPU API node: one v2alpha1 get of the node (plus one get of its
queued resource when it came from one, and of each slice of a multislice request), its spec
captured into the config; with --adopt, the ownership label on the live node (labels only)."""

from __future__ import annotations

from tpuwatch import spec as specmod
from tpuwatch.cloud.base import InitRequest, InitResult
from tpuwatch.cloud.tpu.adapter import TpuAdapter, multislice_params
from tpuwatch.errors import JobFailed, NotFoundError, UsageError


def init_config(req: InitRequest) -> InitResult | None:
    """The node's config written, or None when no node has that name."""
    name, project, zone = req.name, req.project, req.zone
    api = TpuAdapter(project, zone)
    node = api.get_node_message(name)
    if node is None:
        return None
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
    job_name = req.job_name(req.job, group)
    labelled = {name: dict(node.labels)}
    if slices:
        found = {n: api.get_node_message(n) for n in slices}
        gone = [n for n, m in found.items() if m is None]
        if gone:
            raise NotFoundError(f"multislice request {qr_short} lists {', '.join(gone)}, which does not exist "
                                f"in {project}/{zone}; run init again once every slice is there")
        labelled = {n: dict(m.labels) for n, m in found.items() if m is not None}
    owners = {labels.get(specmod.OWNER_LABEL, "") for labels in labelled.values()}
    have = owners.pop() if len(owners) == 1 else ""
    others = sorted(o for o in {*owners, have} if o and o != job_name)
    if req.adopt and others:
        raise JobFailed(
            f"TPU {name} already belongs to job {others[0]!r} ({specmod.OWNER_LABEL}={others[0]}); "
            f"use --job {others[0]}, or remove that label first if the other job is gone"
        )
    spec = specmod.capture(node, job_name)
    if qr is not None:
        spec.update(specmod.capture_queued_resource(qr))
    metadata = dict(node.metadata)
    req.write(specmod.render_config(
        name=group, names=slices, project=project, zone=zone, spec=spec, queued_resource=qr_short,
        command=metadata.get("tpuwatch-command", ""), checkpoint_dir=metadata.get("tpuwatch-checkpoint-dir", ""),
        source=f"projects/{project}/locations/{zone}/nodes/{name}", job=job_name,
    ))

    adopted = False
    for target, labels in labelled.items() if req.adopt else ():
        if labels.get(specmod.OWNER_LABEL) == job_name:
            continue
        op = api.set_labels(target, {**labels, specmod.OWNER_LABEL: job_name})
        status = req.wait(api, op, f"labelling {target}")
        if status.error_code:
            raise JobFailed(f"adding the label {specmod.OWNER_LABEL}={job_name} to {target} failed: "
                            f"{status.error_message}")
        adopted = True

    summary = {"path": req.out, "job": job_name, "spec": spec, "queued_resource": qr_short, "slices": slices,
               "adopted": adopted, "owned": adopted or have == job_name}
    lines = [f"wrote {req.out} for TPU {name} ({project}/{zone}), job {job_name}"]
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
                 f"{req.out}`")
    return InitResult(summary, lines)
