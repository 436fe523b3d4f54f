"""`tpuwatch init` for a slice made through Compute Engine: NAME as an instance, then as a MIG;
its config gets [tpu] api = "compute" and [tpu.compute_spec] with what recreating it needs (one
get, plus the MIG's template, workload policy, managed instances and the instances' disks)."""

from __future__ import annotations

from tpuwatch import spec as specmod
from tpuwatch.cloud.base import InitRequest, InitResult
from tpuwatch.cloud.clients import compute_available
from tpuwatch.cloud.compute.adapter import ComputeAdapter, flex_run
from tpuwatch.cloud.compute.spec import capture_instance, capture_mig
from tpuwatch.cloud.compute.view import mig_snapshot
from tpuwatch.errors import UsageError


def init_config(req: InitRequest) -> InitResult | None:
    """The instance's or MIG's config written, or None when neither has that name (or the
    Compute Engine client is not installed)."""
    if not compute_available():
        return None
    name, project, zone = req.name, req.project, req.zone
    inst_api = ComputeAdapter(project, zone, "instance")
    inst = inst_api.get_instance(name)
    if inst is not None:
        kind, flex = "instance", ""
        spec: dict[str, object] = {"instance": capture_instance(inst_api, inst)}
        labels = dict(inst.labels)
        workers = 1
        source = f"projects/{project}/zones/{zone}/instances/{name}"
    else:
        mig_api = ComputeAdapter(project, zone, "mig")
        parts = mig_api.mig_parts(name)
        if parts is None:
            return None
        kind = "mig"
        spec = capture_mig(mig_api, parts[0])
        flex = flex_run(mig_api, name)  # its VMs came through flex-start resize requests
        snap = mig_snapshot(*parts, project=project, zone=zone, region=mig_api.mig_region(name))
        labels, workers, source = dict(snap.labels), len(snap.workers), snap.resource
    job_name = req.job_name(req.job, name)
    have = labels.get(specmod.OWNER_LABEL, "")
    if req.adopt:
        raise UsageError(f"--adopt: tpuwatch does not label Compute Engine {kind}s; add the label "
                         f"{specmod.OWNER_LABEL}={job_name} "
                         + ("with `gcloud compute instances add-labels`" if kind == "instance" else
                            "to the MIG's instance template (its instances carry the template's labels)")
                         + ", or run `tpuwatch watch --adopt`")
    req.write(specmod.render_compute_config(kind=kind, name=name, project=project, zone=zone, spec=spec,
                                            job=job_name, flex_start=flex, source=source))
    owned = have == job_name
    summary = {"path": req.out, "job": job_name, "api": "compute", kind: name, "spec": spec, "flex_start": flex,
               "workers": workers, "adopted": False, "owned": owned}
    what = "instance" if kind == "instance" else f"managed instance group ({workers} VM{'s' if workers != 1 else ''})"
    lines = [f"wrote {req.out} for Compute Engine {what} {name} ({project}/{zone}), job {job_name}"]
    lines.append(f"  it carries {specmod.OWNER_LABEL}={job_name}" if owned else
                 f"  it has no {specmod.OWNER_LABEL}={job_name} label, so tpuwatch will not delete or recreate it; "
                 "label it (" + ("`gcloud compute instances add-labels`" if kind == "instance" else
                                 "in its instance template") + ") or watch with --adopt")
    lines.append(f"  next: edit [job] command and checkpoint_dir, then `tpuwatch watch -c {req.out}`")
    return InitResult(summary, lines)
