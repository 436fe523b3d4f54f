"""A watcher-wide spare pool (policy/pool.py): a job that lost its node with no spare of its own
claims an idle spare of the pool by its labels, swaps onto it once labelled its own, and gives
its own node back to the pool once that is READY again; a spare another job holds, of another
shape, or not ready is never claimed."""

from __future__ import annotations

from dataclasses import replace

from policy_support import CFG, at, ckpt, limp_part, run_mem, running, tick

from tpuwatch.model import AuditEvent, NodeSnapshot, WorkerProbe, bound_view
from tpuwatch.policy import Limp, Memory, Observation, Phase, PolicyConfig, Relabel, RemakeSpare
from tpuwatch.policy.pool import POOL_LABEL
from tpuwatch.policy.state import GoogleStop, IdleWord
from tpuwatch.policy.values import Decision

A = replace(CFG, job="a", tpu_name="apod", slices=("apod",), recreatable=False, spare_pool="v5p", spares_remade=True)
DOWN = (WorkerProbe(0, "unreachable"), WorkerProbe(1, "unreachable"))


def part(name: str, owner: str | None, state: str = "READY", pool: str | None = None) -> NodeSnapshot:
    """A node of 2 workers (v5p-16), labelled `owner`'s (None: no job's) and of spare pool `pool`."""
    labels = {**({"tpuwatch-job": owner} if owner else {}), **({POOL_LABEL: pool} if pool else {})}
    return replace(limp_part(name, state), labels=labels)


def look(cfg: PolicyConfig, mem: Memory, zone: tuple[NodeSnapshot, ...], **kw: object) -> Observation:
    """What the tick reads of a job of a pool: its slots bound as `mem` binds them, the nodes
    labelled its own in the zone as its idle ones, and the zone as listed."""
    listed = {n.name: n for n in zone}
    extra = tuple(n.name for n in zone if n.owned_by(cfg.job) and n.name not in cfg.slices)
    read = {n: listed.get(n) for n in (*cfg.slices, *extra, *(b for _, b in mem.limp.swapped)) if n}
    view, left = bound_view(cfg.tpu_name, cfg.slices, read, mem.limp.out, dict(mem.limp.swapped))
    idle = tuple((n, read.get(n)) for n in mem.limp.idle(cfg.slices, extra))
    return Observation(node=view, left_out=left, spares=idle, zone=zone, **kw)  # type: ignore[arg-type]


def relabels(d: object) -> list[Relabel]:
    return [a for a in d.actions if isinstance(a, Relabel)]  # type: ignore[attr-defined]


def test_a_lost_node_with_no_spare_of_its_own_claims_an_idle_pool_spare_then_swaps_onto_it() -> None:
    mem = run_mem(step=100)
    zone = (part("apod", "a", "PREEMPTED"), part("sp-0", None, pool="v5p"))
    d = tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A)
    assert d.row == "pool_claim" and d.memory.phase is Phase.WAITING_NODE
    [claim] = relabels(d)
    assert (claim.name, claim.owner, claim.put, claim.drop, claim.pool) == ("sp-0", "", (("tpuwatch-job", "a"),), (),
                                                                            "v5p")
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged
    # labelled the job's: swapped in as its own spare, nothing deleted or created
    claimed = (zone[0], part("sp-0", "a", pool="v5p"))
    s = tick(look(A, d.memory, claimed, probes=None, checkpoint=ckpt(200)), d.memory, 610, cfg=A)
    assert s.memory.limp.swapped == (("apod", "sp-0"),)
    assert not any(a.kind in ("delete", "create") for a in s.actions)


def test_a_spare_another_job_holds_of_another_shape_not_ready_or_of_another_pool_is_never_claimed() -> None:
    mem = run_mem(step=100)
    other = replace(part("sp-3", None, pool="v5p"), accelerator_type="v5p-256")
    zone = (part("apod", "a", "PREEMPTED"), part("sp-0", "b", pool="v5p"), part("sp-1", None, "PREEMPTED", "v5p"),
            part("sp-2", None, pool="v6e"), other, part("loose", None))
    d = tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A)
    assert d.row != "pool_claim" and relabels(d) == []


def test_an_idle_instance_whose_metadata_boots_a_job_is_never_claimed_and_says_why() -> None:
    from tpuwatch.policy.pool import said

    mem = run_mem(step=100)
    boots = replace(part("sp-0", None, pool="v5p"), kind="instance", boots_job=True)
    zone = (part("apod", "a", "PREEMPTED"), boots)
    d = tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A)
    assert d.row != "pool_claim" and relabels(d) == []
    assert "starts a job at boot" in said("v5p", zone)["sp-0"][1]
    # the same instance set not to start a job at boot is claimed
    zone = (zone[0], replace(boots, boots_job=False))
    assert tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A).row == "pool_claim"


def test_a_job_of_no_pool_never_claims() -> None:
    mem = run_mem(step=100)
    cfg = replace(A, spare_pool="")
    zone = (part("apod", "a", "PREEMPTED"), part("sp-0", None, pool="v5p"))
    d = tick(look(cfg, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=cfg)
    assert d.row != "pool_claim" and relabels(d) == []


def test_its_own_node_back_goes_to_the_pool_and_the_job_stays_on_the_spare() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("apod", "sp-0"),)))
    zone = (part("sp-0", "a", pool="v5p"), part("apod", "a"))
    d = tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=A)
    assert d.row == "pool_return" and d.ended == () and d.memory.phase is Phase.RUNNING
    [back] = relabels(d)
    assert (back.name, back.owner, back.put, back.drop, back.pool) == ("apod", "a", ((POOL_LABEL, "v5p"),),
                                                                       ("tpuwatch-job",), "")
    assert d.memory.limp.swapped == (("apod", "sp-0"),)  # a trade: it stays where it runs
    # returned: the job neither claims it again nor returns anything more
    done = (part("sp-0", "a", pool="v5p"), part("apod", None, pool="v5p"))
    after = tick(look(A, d.memory, done, probes=running(1), checkpoint=ckpt(300)), d.memory, 901, cfg=A)
    assert after.row != "pool_return" and relabels(after) == []


def test_a_node_of_its_own_not_ready_or_while_it_holds_nothing_of_the_pool_is_kept() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("apod", "sp-0"),)))
    zone = (part("sp-0", "a", pool="v5p"), part("apod", "a", "CREATING"))
    d = tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=A)
    assert d.row != "pool_return"
    # on a spare of its own (tpu.spares), not the pool's: its node back stays its own
    own = replace(A, spares=("x0",))
    zone = (part("x0", "a"), part("apod", "a"))
    mem = run_mem(step=100, limp=Limp(swapped=(("apod", "x0"),)))
    d = tick(look(own, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=own)
    assert d.row != "pool_return" and relabels(d) == []


def test_the_pools_keeper_deletes_a_dead_idle_pool_spare_then_creates_it_labelled_the_pools() -> None:
    mem = run_mem(step=100)
    zone = (part("apod", "a"), part("sp-0", None, "PREEMPTED", "v5p"), part("sp-1", "b", "PREEMPTED", "v5p"))
    d = tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300), pool_keeper=True), mem, 900, cfg=A)
    assert d.row == "spare_remake" and d.ended == () and d.memory.phase is Phase.RUNNING
    [delete] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (delete.name, delete.create, delete.pool) == ("sp-0", False, "v5p")  # not sp-1: job b's
    assert d.memory.limp.pool_remaking == ("sp-0",)
    # gone: created once, the next try no sooner than backoff_base; back: done with it
    gone = (zone[0], zone[2])
    c = tick(look(A, d.memory, gone, probes=running(1), checkpoint=ckpt(300), pool_keeper=True), d.memory, 901, cfg=A)
    [create] = [a for a in c.actions if isinstance(a, RemakeSpare)]
    assert (create.name, create.create, create.pool) == ("sp-0", True, "v5p")
    again = tick(look(A, c.memory, gone, probes=running(1), checkpoint=ckpt(300), pool_keeper=True), c.memory, 901.1,
                 cfg=A)
    assert not any(isinstance(a, RemakeSpare) for a in again.actions)
    back = (zone[0], part("sp-0", None, "CREATING", "v5p"), zone[2])
    done = tick(look(A, c.memory, back, probes=running(1), checkpoint=ckpt(300), pool_keeper=True), c.memory, 902,
                cfg=A)
    assert done.memory.limp.pool_remaking == () and not any(isinstance(a, RemakeSpare) for a in done.actions)


def preempted(name: str, t: float) -> AuditEvent:
    return AuditEvent(time=at(t), kind="terminate", node=name, worker="0", method="compute.instances.preempted",
                      reason="", insert_id=f"{name}-{t}", resource_name=f"projects/p/zones/z/instances/{name}")


def spot(name: str, owner: str | None = None, state: str = "READY") -> NodeSnapshot:
    """A pool VM Google deletes itself at its preemption (termination action DELETE)."""
    return replace(part(name, owner, state, "v5p"), kind="instance", google_deletes=True)


def keeper(mem: Memory, zone: tuple[NodeSnapshot, ...], now: float, keeps: bool = True, **kw: object) -> Decision:
    return tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300), pool_keeper=keeps, **kw), mem, now, cfg=A)


def test_the_keeper_makes_again_an_idle_pool_vm_google_deleted_at_its_preemption_on_the_audit_logs_word() -> None:
    """An idle spare of the pool whose termination action is DELETE: Google deletes it at its
    preemption, with no delete of tpuwatch's to record it. The keeper watches it (journaled, as
    a cron `check` forgets between ticks) and, once it is gone and the audit log says Google
    preempted it, creates it again labelled the pool's: the pool keeps its size."""
    mem = run_mem(step=100)
    seen = keeper(mem, (part("apod", "a"), spot("sp-0"), spot("sp-1", "b")), 900)
    assert seen.memory.limp.pool_word.deletes == ("sp-0",)  # not sp-1: job b's, watched by b
    assert not any(isinstance(a, RemakeSpare) for a in seen.actions)
    # the word read while it stops, then gone: made again
    going = keeper(seen.memory, (part("apod", "a"), replace(spot("sp-0", state="DELETING"), stopping=True)), 910,
                   events=(preempted("sp-0", 905),))
    assert going.memory.limp.pool_word.said == ("sp-0",) and not any(isinstance(a, RemakeSpare) for a in going.actions)
    gone = keeper(going.memory, (part("apod", "a"),), 940)
    [create] = [a for a in gone.actions if isinstance(a, RemakeSpare)]
    assert (gone.row, create.name, create.create, create.pool) == ("spare_remake", "sp-0", True, "v5p")
    assert "by Google at its preemption): creating it from [tpu.spec] of job a" in create.reason, create.reason
    assert gone.memory.limp.pool_remaking == ("sp-0",) and gone.memory.limp.pool_word.vanished == ()
    # back (CREATING): done with it, and watched again as the pool's VM Google may delete
    back = keeper(gone.memory, (part("apod", "a"), spot("sp-0", state="CREATING")), 950)
    assert back.memory.limp.pool_remaking == () and back.memory.limp.pool_word.deletes == ("sp-0",)
    assert back.memory.limp.pool_word.said == ("sp-0",)  # until seen up: a word is about one VM
    up = keeper(back.memory, (part("apod", "a"), spot("sp-0")), 960)
    assert up.memory.limp.pool_word.said == () and not any(isinstance(a, RemakeSpare) for a in up.actions)
    # gone first, the word after (the audit log may be late): waited for, then made again
    waits = keeper(seen.memory, (part("apod", "a"),), 920)
    assert waits.memory.limp.pool_word.vanished == ("sp-0",) and not any(isinstance(a, RemakeSpare)
                                                                          for a in waits.actions)
    word = keeper(waits.memory, (part("apod", "a"),), 930, events=(preempted("sp-0", 915),))
    assert [(a.name, a.create) for a in word.actions if isinstance(a, RemakeSpare)] == [("sp-0", True)]


def test_an_idle_pool_vm_google_may_delete_gone_with_no_word_is_a_persons_deletion_never_made_again() -> None:
    """A person's instances.delete of such a VM looks as Google's (stopping, then gone) but writes
    nothing to the system-event log: after 3 min with no word it is dropped and said so, never
    made again; a job that is not the keeper watches it as well but never says so nor acts."""
    mem = run_mem(step=100)
    seen = keeper(mem, (part("apod", "a"), spot("sp-0")), 900)
    gone = (part("apod", "a"),)
    waits = keeper(seen.memory, gone, 910)
    assert waits.memory.limp.pool_word.vanished == ("sp-0",)
    still = keeper(waits.memory, gone, 910 + 170)
    assert still.memory.limp.pool_word.vanished == ("sp-0",) and still.row != "spare_gone"
    late = keeper(still.memory, gone, 910 + 181)
    assert late.row == "spare_gone" and "sp-0, of spare pool v5p, gone with no word from Google" in late.summary
    assert late.memory.limp.pool_word == IdleWord() and late.memory.limp.pool_remaking == ()
    assert not any(isinstance(a, RemakeSpare) for a in late.actions)
    # a word that comes after that changes nothing
    after = keeper(late.memory, gone, 910 + 200, events=(preempted("sp-0", 905),))
    assert not any(isinstance(a, RemakeSpare) for a in after.actions) and after.memory.limp.pool_remaking == ()
    # not the keeper: it watches as the keeper does, but the keeper alone says a person's deletion
    other = keeper(waits.memory, gone, 910 + 181, keeps=False)
    assert other.row != "spare_gone" and "no word from Google" not in other.summary, other.summary
    assert other.memory.limp.pool_word == IdleWord() and other.memory.limp.pool_remaking == ()
    assert not any(isinstance(a, RemakeSpare) for a in other.actions)
    # a job with no [tpu.spec] can never keep the pool: it watches nothing
    plain = replace(A, spares_remade=False)
    d = tick(look(plain, mem, (part("apod", "a"), spot("sp-0")), probes=running(1), checkpoint=ckpt(300)), mem, 900,
             cfg=plain)
    assert d.memory.limp.pool_word == IdleWord()


def test_a_job_that_becomes_the_keeper_makes_again_a_pool_vm_google_deleted_while_another_kept_the_pool() -> None:
    """The keeper's job ends; Google deletes an idle VM of the pool at its preemption before the
    next job takes the keeper lock over (a minute in one watcher). That job watched the VM too, so
    it has Google's word and creates it once it keeps the pool; while it does not, it never acts."""
    mem = run_mem(step=100)
    seen = keeper(mem, (part("apod", "a"), spot("sp-0")), 900, keeps=False)
    assert seen.memory.limp.pool_word.deletes == ("sp-0",)
    gone = (part("apod", "a"),)
    word = keeper(seen.memory, gone, 930, keeps=False, events=(preempted("sp-0", 915),))
    assert word.memory.limp.pool_remaking == ("sp-0",), word.memory.limp
    assert not any(isinstance(a, RemakeSpare) for a in word.actions)
    waits = keeper(word.memory, gone, 1200, keeps=False)  # long past the 3 min a word is waited for
    assert waits.memory.limp.pool_remaking == ("sp-0",) and not any(isinstance(a, RemakeSpare) for a in waits.actions)
    keeps = keeper(waits.memory, gone, 1210)
    [create] = [a for a in keeps.actions if isinstance(a, RemakeSpare)]
    assert (keeps.row, create.name, create.create, create.pool) == ("spare_remake", "sp-0", True, "v5p")
    # made by another keeper meanwhile (listed again): nothing left to make
    back = keeper(waits.memory, (part("apod", "a"), spot("sp-0", state="CREATING")), 1210)
    assert back.memory.limp.pool_remaking == () and not any(isinstance(a, RemakeSpare) for a in back.actions)


def test_a_job_that_is_not_the_pools_keeper_never_remakes_its_spares() -> None:
    mem = run_mem(step=100)
    zone = (part("apod", "a"), part("sp-0", None, "PREEMPTED", "v5p"))
    d = tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=A)
    assert not any(isinstance(a, RemakeSpare) for a in d.actions) and d.memory.limp.pool_remaking == ()


def test_a_lost_node_with_no_pool_spare_free_waits_for_its_own_node_made_again_not_for_a_person() -> None:
    mem = run_mem(step=100)
    zone = (part("apod", "a", "PREEMPTED"), part("sp-0", "b", pool="v5p"))  # the pool's one spare is b's
    d = tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A)
    assert d.row == "spare_wait" and d.memory.phase is Phase.WAITING_NODE, (d.row, d.summary)
    assert "apod to be made again" in d.summary
    later = tick(look(A, d.memory, zone, probes=None, checkpoint=ckpt(200)), d.memory, 601, cfg=A)
    assert later.row == "spare_remake" and later.memory.phase is Phase.WAITING_NODE
    [delete] = [a for a in later.actions if isinstance(a, RemakeSpare)]
    assert (delete.name, delete.create, delete.pool) == ("apod", False, "")


def test_a_multislice_job_claims_a_pool_spare_for_its_lost_slice_and_runs_it_in_that_slices_place() -> None:
    m = replace(CFG, job="m", tpu_name="ms", slices=("s0", "s1"), recreatable=False, spare_pool="v5p",
                spares_remade=True)
    mem = run_mem(step=100)
    zone = (part("s0", "m"), part("s1", "m", "PREEMPTED"), part("sp-0", None, pool="v5p"))
    down = (*running(1), WorkerProbe(2, "unreachable"), WorkerProbe(3, "unreachable"))
    d = tick(look(m, mem, zone, probes=down, checkpoint=ckpt(200)), mem, 600, cfg=m)
    assert d.row == "pool_claim" and [r.name for r in relabels(d)] == ["sp-0"]
    claimed = (zone[0], zone[1], part("sp-0", "m", pool="v5p"))
    s = tick(look(m, d.memory, claimed, probes=None, checkpoint=ckpt(200)), d.memory, 610, cfg=m)
    assert s.memory.limp.swapped == (("s1", "sp-0"),)


def test_a_node_a_person_deleted_is_never_replaced_by_a_pool_spare() -> None:
    """No word from Google or tpuwatch that the job's node went: a person deleted it, perhaps to
    stop the job. The job stops for a person as without a pool (`node_missing`); no spare is claimed."""
    mem = run_mem(step=100)
    zone = (part("sp-0", None, pool="v5p"),)  # apod gone from the listing
    d = tick(look(A, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=A)
    assert d.row == "node_missing" and d.exit_code == 1, (d.row, d.summary)
    assert relabels(d) == [] and d.memory.limp.swapped == ()
    # a slice of a job over slices made one by one, gone: the same
    m = replace(CFG, job="m", tpu_name="ms", slices=("s0", "s1"), recreatable=False, spare_pool="v5p",
                spares_remade=True)
    down = (*running(1), WorkerProbe(2, "unreachable"), WorkerProbe(3, "unreachable"))
    zone = (part("s0", "m"), part("sp-0", None, pool="v5p"))  # s1 gone from the listing
    d = tick(look(m, mem, zone, probes=down, checkpoint=ckpt(200)), mem, 600, cfg=m)
    assert d.row == "node_missing" and "slice 1 (s1)" in d.summary, (d.row, d.summary)
    assert relabels(d) == [] and d.memory.limp.swapped == ()


def test_a_new_keeper_creates_a_spare_an_earlier_keeper_deleted_and_never_one_no_keeper_deleted() -> None:
    # the job that deleted sp-0 to make it again ended (or stopped keeping the pool) before its
    # create: the state dir's record says so, and this keeper, its memory empty, creates it
    mem = run_mem(step=100)
    gone = (part("apod", "a"),)
    d = tick(look(A, mem, gone, probes=running(1), checkpoint=ckpt(300), pool_keeper=True, pool_remaking=("sp-0",)),
             mem, 900, cfg=A)
    [create] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (d.row, create.name, create.create, create.pool) == ("spare_remake", "sp-0", True, "v5p")
    assert d.memory.limp.pool_remaking == ("sp-0",)
    # a spare gone that no keeper deleted (a person's deletion) stays deleted; a non-keeper never acts on the record
    assert not any(isinstance(a, RemakeSpare) for a in tick(
        look(A, mem, gone, probes=running(1), checkpoint=ckpt(300), pool_keeper=True), mem, 900, cfg=A).actions)
    assert not any(isinstance(a, RemakeSpare) for a in tick(
        look(A, mem, gone, probes=running(1), checkpoint=ckpt(300), pool_remaking=("sp-0",)), mem, 900, cfg=A).actions)


def test_a_claimed_spare_that_failed_its_checks_goes_back_to_the_pool_marked_bad_never_claimed_and_made_again() -> None:
    from tpuwatch.model import POOL_BAD_LABEL as BAD_LABEL

    # spare_bad put sp-0 (claimed from the pool) out of use and the slot back on apod: the job
    # gives sp-0 back to the pool marked bad rather than keep it out of every job's use for good
    mem = run_mem(step=100, limp=Limp(bad=("sp-0@id-sp-0",)))
    zone = (part("apod", "a"), part("sp-0", "a", pool="v5p"))
    d = tick(look(A, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=A)
    assert d.row == "pool_return" and d.ended == () and d.memory.phase is Phase.RUNNING
    [back] = relabels(d)
    assert (back.name, back.owner, back.put, back.drop, back.pool) == ("sp-0", "a", ((BAD_LABEL, "a"),),
                                                                       ("tpuwatch-job",), "")
    # marked so: no job claims it (the next idle one is taken), and the keeper makes it again
    marked = replace(part("sp-0", None, pool="v5p"), labels={POOL_LABEL: "v5p", BAD_LABEL: "a"})
    lost = run_mem(step=100)
    c = tick(look(A, lost, (part("apod", "a", "PREEMPTED"), marked), probes=DOWN, checkpoint=ckpt(200)), lost, 600,
             cfg=A)
    assert c.row != "pool_claim" and relabels(c) == []
    c = tick(look(A, lost, (part("apod", "a", "PREEMPTED"), marked, part("sp-1", None, pool="v5p")), probes=DOWN,
                  checkpoint=ckpt(200)), lost, 600, cfg=A)
    assert c.row == "pool_claim" and [r.name for r in relabels(c)] == ["sp-1"]
    k = tick(look(A, mem, (part("apod", "a"), marked), probes=running(1), checkpoint=ckpt(300), pool_keeper=True),
             mem, 900, cfg=A)
    [delete] = [a for a in k.actions if isinstance(a, RemakeSpare)]
    assert (k.row, delete.name, delete.create, delete.pool) == ("spare_remake", "sp-0", False, "v5p")
    assert k.memory.limp.pool_remaking == ("sp-0",)


def test_a_compute_jobs_own_vm_google_deleted_is_made_again_from_the_spec_table_of_its_api() -> None:
    # a Compute Engine job of a pool, its own VM gone (deleted by Google at its preemption, its
    # termination action DELETE) with no pool spare free: the insert is said to come from
    # [tpu.compute_spec.instance], though nothing read this tick shows an instance
    ce = replace(A, spec_table="[tpu.compute_spec.instance]")
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True))
    word = AuditEvent(time=at(590), kind="terminate", node="apod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="p", resource_name="projects/p/zones/z/instances/apod")
    ends = tick(look(ce, mem, (), events=(word,), checkpoint=ckpt(200), pool_keeper=True), mem, 600, cfg=ce)
    assert ends.row == "spare_wait" and [e.outcome for e in ends.ended] == ["disruption"], (ends.row, ends.summary)
    d = tick(look(ce, ends.memory, (), checkpoint=ckpt(200), pool_keeper=True), ends.memory, 601, cfg=ce)
    [create] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (create.name, create.create) == ("apod", True), (d.row, d.summary)
    assert "creating it from [tpu.compute_spec.instance]" in create.reason, create.reason


def test_a_running_job_whose_own_vm_google_deleted_claims_a_pool_spare_and_ends_its_attempt() -> None:
    # the watcher read the VM running, then gone (it missed the stop in between): the claim ends
    # the attempt as any loss does, else its journal row would stay open under the next attempt
    ce = replace(A, spec_table="[tpu.compute_spec.instance]")
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True))
    word = AuditEvent(time=at(590), kind="terminate", node="apod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="p", resource_name="projects/p/zones/z/instances/apod")
    zone = (part("sp-0", None, pool="v5p"),)
    d = tick(look(ce, mem, zone, events=(word,), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=ce)
    assert d.row == "pool_claim", (d.row, d.summary)
    [end] = d.ended
    assert (end.attempt, end.outcome, end.charged) == (mem.attempt.number, "disruption", False)
    assert "slice apod lost (MISSING)" in end.reason, end.reason


def test_its_own_vm_gone_with_googles_word_claims_a_pool_spare_of_the_shape_it_was_last_seen_with() -> None:
    """The job's own VM, which Google deletes at its preemption, is gone: nothing of the job's is
    listed to give its shape, but the shape it was last seen with is journaled. A pool spare of
    another machine type (first by name) is never claimed for it."""
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True, shape="v5p-16"))
    other = replace(part("sp-0", None, pool="v5p"), accelerator_type="v5p-256")
    zone = (other, part("sp-1", None, pool="v5p"))
    d = tick(look(A, mem, zone, probes=None, checkpoint=ckpt(200), events=(preempted("apod", 598),)), mem, 600, cfg=A)
    assert d.row == "pool_claim", (d.row, d.summary)
    assert [r.name for r in relabels(d)] == ["sp-1"]
