"""A job on a Compute Engine VM that Google deletes at its preemption (termination action DELETE):
whether the watcher saw it stop, read it running and then gone with Google's word already in the
audit log (a poll that missed the stop), or gone first and the word later, and whichever way the
job goes on (its own spare free, its own spare down, a spare pool, a job of lower priority), the
attempt it ran ends exactly once, uncharged, before anything else is launched; never taken for a
person's deletion."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_support import CFG, at, ckpt, limp_part, run_mem, running, tick

from tpuwatch.model import AuditEvent, NodeSnapshot, WorkerProbe, bound_view
from tpuwatch.policy import Launch, Memory, Observation, PolicyConfig
from tpuwatch.policy.pool import POOL_LABEL
from tpuwatch.policy.priority import PRIORITY_LABEL

JOB = replace(CFG, job="a", tpu_name="apod", slices=("apod",), recreatable=False, spares_remade=True)
WAYS: dict[str, tuple[PolicyConfig, tuple[NodeSnapshot, ...]]] = {
    "its own spare free": (replace(JOB, spares=("sp",)), (replace(limp_part("sp"), labels={"tpuwatch-job": "a"}),)),
    "its own spare down": (replace(JOB, spares=("sp",)),
                           (replace(limp_part("sp", "REPAIRING"), labels={"tpuwatch-job": "a"}),)),
    "a spare pool": (replace(JOB, spare_pool="v5p"), (replace(limp_part("sp"), labels={POOL_LABEL: "v5p"}),)),
    "a job of lower priority": (replace(JOB, priority=500),
                                (replace(limp_part("lpod"), labels={"tpuwatch-job": "lo", PRIORITY_LABEL: "100"}),)),
}
WORD = AuditEvent(time=at(595), kind="terminate", node="apod", worker="0", method="compute.instances.preempted",
                  reason="", insert_id="p", resource_name="projects/p/zones/z/instances/apod")
VM = replace(limp_part("apod"), labels={"tpuwatch-job": "a"}, kind="instance", spot=True, google_deletes=True)
GOING = replace(VM, state="DELETING", stopping=True, google_deleting="a Spot VM with termination action DELETE is STOPPING")
DOWN = (WorkerProbe(0, "unreachable"), WorkerProbe(1, "unreachable"))
# what each tick from 600 s on reads of the job's VM, and whether the audit log has Google's word
SEEN: dict[str, tuple[tuple[NodeSnapshot | None, bool], ...]] = {
    "the stop seen": ((GOING, True), (None, True), (None, True), (None, True)),
    "the stop missed": ((None, True), (None, True), (None, True)),
    "the word late": ((None, False), (None, True), (None, True), (None, True)),
}


def look(cfg: PolicyConfig, mem: Memory, vm: NodeSnapshot | None, zone: tuple[NodeSnapshot, ...],
         word: bool) -> Observation:
    """What the tick reads: the job's slot bound as `mem` binds it, the nodes labelled its own as
    its idle ones, the zone as listed."""
    listed = {n.name: n for n in (*zone, *((vm,) if vm is not None else ()))}
    extra = tuple(n.name for n in zone if n.owned_by(cfg.job) and n.name not in cfg.slices)
    read = {n: listed.get(n) for n in (*cfg.slices, *extra, *(b for _, b in mem.limp.swapped)) if n}
    view, left = bound_view(cfg.tpu_name, cfg.slices, read, mem.limp.out, dict(mem.limp.swapped))
    idle = tuple((n, read.get(n)) for n in mem.limp.idle(cfg.slices, extra))
    return Observation(node=view, left_out=left, spares=idle, zone=tuple(listed.values()), probes=DOWN,
                       checkpoint=ckpt(200), events=(WORD,) if word else (), pool_keeper=True)


@pytest.mark.parametrize("seen", list(SEEN))
@pytest.mark.parametrize("way", list(WAYS))
def test_the_attempt_on_a_vm_google_deleted_ends_once_uncharged_before_any_launch(way: str, seen: str) -> None:
    cfg, zone = WAYS[way]
    mem = run_mem(step=100)
    mem = tick(replace(look(cfg, mem, VM, zone, False), probes=running(1)), mem, 590, cfg=cfg).memory
    assert mem.google.deletes and mem.google.owned, mem.google
    ended, rows = [], []
    for i, (vm, word) in enumerate(SEEN[seen]):
        d = tick(look(cfg, mem, vm, zone, word), mem, 600 + 10 * i, cfg=cfg)  # policy_support checks each move
        rows.append(d.row)
        assert not any(isinstance(a, Launch) for a in d.actions) or ended, (way, seen, rows)
        ended += [(e.attempt, e.outcome, e.charged) for e in d.ended]
        mem = d.memory
    assert ended == [(1, "disruption", False)], (way, seen, rows, ended)
    assert "node_missing" not in rows and mem.phase.value != "halted", (way, seen, rows)
