"""Job priorities (policy/priority.py): a job that lost its node with no spare takes a node of its
shape from the job of lowest priority through their labels; that job stops uncharged, hands the
node over once stopped, waits, and is given the taker's own node when it is back. A job
without a priority never takes and never gives."""

from __future__ import annotations

from dataclasses import replace

from policy_support import CFG, at, ckpt, kinds, limp_part, run_mem, running, tick

from tpuwatch.model import NodeSnapshot, WorkerProbe, bound_view
from tpuwatch.policy import (
    Limp,
    Memory,
    Observation,
    Phase,
    PolicyConfig,
    Relabel,
    RemakeSpare,
    StopWorkers,
)
from tpuwatch.policy.priority import (
    LENT_BY,
    PRIORITY_LABEL,
    RETURNED_BY,
    WANTED_BY,
    WANTED_PRIORITY,
)

HI = replace(CFG, job="hi", tpu_name="hpod", slices=("hpod",), recreatable=False, priority=500, spares_remade=True)
LO = replace(CFG, job="lo", tpu_name="lpod", slices=("lpod",), recreatable=False, priority=100, spares_remade=True)


def part(name: str, owner: str, state: str = "READY", **labels: str) -> NodeSnapshot:
    """A node of 2 workers (v5p-16) labelled `owner`'s, with `labels` (underscores as hyphens)."""
    extra = {k.replace("_", "-"): v for k, v in labels.items()}
    return replace(limp_part(name, state), labels={"tpuwatch-job": owner, **extra})


def look(cfg: PolicyConfig, mem: Memory, zone: tuple[NodeSnapshot, ...], **kw: object) -> Observation:
    """What the tick sees of a job with a priority: its pool (its node, the nodes labelled its own
    in the zone) bound as `mem` binds it, and the zone's nodes as listed."""
    listed = {n.name: n for n in zone}
    extra = tuple(n.name for n in zone if n.owned_by(cfg.job) and n.name not in cfg.slices)
    read = {n: listed.get(n) for n in (*cfg.slices, *extra, *(b for _, b in mem.limp.swapped)) if n}
    view, left = bound_view(cfg.tpu_name, cfg.slices, read, mem.limp.out, dict(mem.limp.swapped))
    idle = tuple((n, read.get(n)) for n in mem.limp.idle(cfg.slices, extra))
    return Observation(node=view, left_out=left, spares=idle, zone=zone, **kw)  # type: ignore[arg-type]


def relabels(d: object) -> list[Relabel]:
    return [a for a in d.actions if isinstance(a, Relabel)]  # type: ignore[attr-defined]


DOWN = (WorkerProbe(0, "unreachable"), WorkerProbe(1, "unreachable"))
LOW = part("lpod", "lo", tpuwatch_priority="100")


def test_a_lost_node_with_no_spare_asks_the_lowest_priority_job_for_a_node_of_its_shape() -> None:
    mem = run_mem(step=100)
    zone = (part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500"), LOW,
            part("mid", "mid", tpuwatch_priority="300"), part("big", "lo", tpuwatch_priority="0"))
    zone = (*zone[:3], replace(zone[3], accelerator_type="v5p-256"))
    d = tick(look(HI, mem, zone, probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=HI)
    assert d.row == "take_wait" and d.memory.phase is Phase.WAITING_NODE
    [ask] = relabels(d)
    assert (ask.name, ask.owner, ask.put, ask.drop) == ("lpod", "lo", ((WANTED_BY, "hi"), (WANTED_PRIORITY, "500")), ())
    assert d.memory.limp.wants == "lpod" and "took lpod from job lo (priority 100" in d.summary
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged
    # the label seen, it is not written again; the job waits on
    asked = (zone[0], part("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="hi",
                           tpuwatch_wanted_priority="500"), *zone[2:])
    again = tick(look(HI, d.memory, asked, probes=DOWN), d.memory, 660, cfg=HI)
    assert again.row in ("take_wait", "spare_remake") and relabels(again) == []


def test_nothing_of_a_higher_or_equal_priority_unhealthy_or_already_asked_for_higher_is_asked_for() -> None:
    mem = run_mem(step=100)
    mine = part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500")
    for other in (part("lpod", "lo", tpuwatch_priority="500"), part("lpod", "lo", tpuwatch_priority="900"),
                  part("lpod", "lo", "REPAIRING", tpuwatch_priority="100"), part("lpod", "lo"),
                  part("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="top",
                       tpuwatch_wanted_priority="800")):
        d = tick(look(HI, mem, (mine, other), probes=DOWN), mem, 600, cfg=HI)
        assert d.row != "take_wait" and relabels(d) == [], other.labels


def test_an_instance_whose_metadata_starts_its_job_at_boot_is_never_asked_for() -> None:
    """Its metadata survives a stop and start: after a hand-over, a restart would run the
    lender's job beside the taker's. One that only sets up at boot is asked for."""
    mem = run_mem(step=100)
    mine = part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500")
    boots = replace(LOW, kind="instance", boots_job=True)
    d = tick(look(HI, mem, (mine, boots), probes=DOWN), mem, 600, cfg=HI)
    assert d.row != "take_wait" and relabels(d) == []
    quiet = tick(look(HI, mem, (mine, replace(boots, boots_job=False)), probes=DOWN), mem, 600, cfg=HI)
    assert quiet.row == "take_wait" and [r.name for r in relabels(quiet)] == ["lpod"]


def test_a_job_without_a_priority_never_asks() -> None:
    cfg = replace(HI, priority=None)
    mem = run_mem(step=100)
    d = tick(look(cfg, mem, (part("hpod", "hi", "PREEMPTED"), LOW), probes=DOWN), mem, 600, cfg=cfg)
    assert d.row != "take_wait" and relabels(d) == []


def test_the_lower_job_lends_its_node_stopped_uncharged_then_relabels_it_for_the_taker() -> None:
    mem = run_mem(step=100)
    wanted = part("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500")
    d = tick(look(LO, mem, (wanted,), probes=running(1), checkpoint=ckpt(200)), mem, 600, cfg=LO)
    assert d.row == "give" and relabels(d) == []  # no relabel before the job is stopped there
    assert d.memory.limp.giving == (("lpod", "hi"),) and d.memory.limp.swapped == ()  # still bound: probed
    [end] = d.ended
    assert end.outcome == "disruption" and not end.charged and d.memory.budgets.restarts == 0
    stops = [a for a in d.actions if isinstance(a, StopWorkers)]
    assert stops and all(s.wait for s in stops)
    # a process of the job still there (a watcher killed before its stop): stopped again, nothing launched
    again = tick(look(LO, d.memory, (wanted,), probes=running(1)), d.memory, 601, cfg=LO)
    assert again.row == "give" and kinds(again) == ["stop"] and again.memory.limp.lent == ()
    # stopped: the slot lent, bound to no node, and the node relabelled for the taker
    absent = (WorkerProbe(0, "absent"), WorkerProbe(1, "absent"))
    after = tick(look(LO, d.memory, (wanted,), probes=absent), d.memory, 602, cfg=LO)
    assert after.row == "give"
    assert after.memory.limp.lent == (("lpod", "hi"),) and after.memory.limp.swapped == (("lpod", ""),)
    [give] = relabels(after)
    assert (give.name, give.owner) == ("lpod", "lo")
    assert dict(give.put) == {"tpuwatch-job": "hi", LENT_BY: "lo"}
    assert set(give.drop) >= {WANTED_BY, WANTED_PRIORITY}
    # killed before the write: written on the next look, the job waiting for a node
    pending = tick(look(LO, after.memory, (wanted,), probes=None), after.memory, 603, cfg=LO)
    assert pending.row == "give" and [r.name for r in relabels(pending)] == ["lpod"]
    assert pending.memory.phase is Phase.WAITING_NODE
    # once the label says so, nothing more is written; it waits, never stops for a person
    given = part("lpod", "hi", tpuwatch_lent_by="lo")
    wait = tick(look(LO, after.memory, (given,), probes=None), after.memory, 700, cfg=LO)
    assert wait.row == "lent_wait" and relabels(wait) == [] and wait.memory.limp.giving == ()
    assert wait.exit_code == 0 and wait.memory.phase is Phase.WAITING_NODE


def test_a_job_without_a_priority_or_asked_by_a_lower_one_never_gives() -> None:
    mem = run_mem(step=100)
    wanted = part("lpod", "lo", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500")
    for cfg, node in ((replace(LO, priority=None), wanted),
                      (replace(LO, priority=600), wanted)):
        d = tick(look(cfg, mem, (node,), probes=running(1)), mem, 600, cfg=cfg)
        assert d.row in ("running", "priority_label") and d.memory.limp.lent == () and d.ended == (), cfg.priority
        assert not [r for r in relabels(d) if "tpuwatch-job" in dict(r.put)], cfg.priority


def test_the_taker_binds_the_node_lent_to_it_and_launches_there() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(wants="lpod"))
    zone = (part("lpod", "hi", tpuwatch_lent_by="lo"),)  # its own node is gone (being made again)
    d = tick(look(HI, mem, zone, probes=None, checkpoint=ckpt(200)), mem, 700, cfg=HI)
    assert d.row == "take" and d.memory.limp.swapped == (("hpod", "lpod"),)
    assert d.memory.limp.took == (("lpod", "lo"),) and d.memory.limp.wants == ""
    launch = tick(look(HI, d.memory, zone, probes=(WorkerProbe(0, "absent"), WorkerProbe(1, "absent")),
                       checkpoint=ckpt(200)), d.memory, 701, cfg=HI)
    assert launch.row == "launch" and kinds(launch) == ["launch"]


def test_a_node_handed_back_and_lent_again_between_two_looks_is_taken_not_swapped_nor_handed_back_again() -> None:
    # the job handed lpod back to lo, and lo lent it again before the job looked: that hand-back
    # is done. Its entry kept made lpod busy: a swap bound it with no lender to trade with, the
    # old write went out again while the job ran there, and lo waited for a hand-back for ever
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(handing=(("lpod", "lo"),), wants="lpod"))
    zone = (part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500"),
            part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_returned_by="hi"))
    d = tick(look(HI, mem, zone, probes=None, checkpoint=ckpt(200)), mem, 700, cfg=HI)
    assert d.row == "take" and d.memory.limp.swapped == (("hpod", "lpod"),)
    assert d.memory.limp.took == (("lpod", "lo"),) and d.memory.limp.handing == ()
    # its own node back: traded for the node it took, and nothing handed twice
    back = (part("hpod", "hi"), zone[1])
    trade = tick(look(HI, replace(d.memory, phase=Phase.RUNNING), back, probes=running(1), checkpoint=ckpt(300)),
                 replace(d.memory, phase=Phase.RUNNING), 900, cfg=HI)
    assert trade.row == "hand_back" and [(r.name, dict(r.put)["tpuwatch-job"]) for r in relabels(trade)] == [("hpod", "lo")]


def test_a_node_not_labelled_the_jobs_is_never_taken() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE)
    zone = (part("lpod", "lo", tpuwatch_lent_by="lo"), part("hpod", "hi", "PREEMPTED"))
    d = tick(look(HI, mem, zone, probes=None), mem, 700, cfg=HI)
    assert d.row != "take" and d.memory.limp.swapped == ()


def test_its_own_node_back_the_taker_hands_it_to_the_lender_and_stays() -> None:
    mem = run_mem(step=100, limp=Limp(swapped=(("hpod", "lpod"),), took=(("lpod", "lo"),)))
    zone = (part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500"), part("hpod", "hi"))
    d = tick(look(HI, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=HI)
    assert d.row == "hand_back" and d.ended == () and d.memory.phase is Phase.RUNNING
    [back] = relabels(d)
    assert (back.name, back.owner, dict(back.put)) == ("hpod", "hi", {"tpuwatch-job": "lo", RETURNED_BY: "hi"})
    assert LENT_BY in back.drop and PRIORITY_LABEL in back.drop
    assert d.memory.limp.took == () and d.memory.limp.handing == (("hpod", "lo"),)
    assert d.memory.limp.swapped == (("hpod", "lpod"),)  # a trade: it stays on the node it took
    # once handed, the node it took loses its lender's label
    done = (part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500"), part("hpod", "lo", tpuwatch_returned_by="hi"))
    tidy = tick(look(HI, d.memory, done, probes=running(1), checkpoint=ckpt(300)), d.memory, 901, cfg=HI)
    assert tidy.row == "priority_label" and tidy.memory.limp.handing == ()
    [drop] = relabels(tidy)
    assert (drop.name, drop.drop) == ("lpod", (LENT_BY,))


def test_the_lender_binds_its_lent_slot_to_the_node_handed_back_and_resumes_from_its_checkpoint() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE,
                  limp=Limp(swapped=(("lpod", ""),), lent=(("lpod", "hi"),)))
    zone = (part("lpod", "hi", tpuwatch_lent_by="lo"), part("hpod", "lo", tpuwatch_returned_by="hi"))
    d = tick(look(LO, mem, zone, probes=None, checkpoint=ckpt(250)), mem, 950, cfg=LO)
    assert d.row == "lent_back" and d.memory.limp.swapped == (("lpod", "hpod"),) and d.memory.limp.lent == ()
    assert d.memory.limp.took == ()  # handed back, not lent: nothing to give back later
    absent = (WorkerProbe(0, "absent"), WorkerProbe(1, "absent"))
    launch = tick(look(LO, d.memory, zone, probes=absent, checkpoint=ckpt(250)), d.memory, 951, cfg=LO)
    assert launch.row == "launch" and launch.memory.attempt.start_step == 250
    # running there, the node it was handed loses tpuwatch-returned-by (stale once bound), keeps the rest
    on = replace(launch.memory, phase=Phase.RUNNING)
    tidy = tick(look(LO, on, zone, probes=running(2), checkpoint=ckpt(250)), on, 960, cfg=LO)
    assert tidy.row == "priority_label" and [(r.name, r.drop) for r in relabels(tidy)] == [("hpod", (RETURNED_BY,))]


def test_a_job_stamps_its_priority_on_the_nodes_it_holds_once() -> None:
    mem = run_mem(step=100)
    d = tick(look(HI, mem, (part("hpod", "hi"),), probes=running(1), checkpoint=ckpt(100)), mem, 300, cfg=HI)
    assert d.row == "priority_label"
    [stamp] = relabels(d)
    assert (stamp.name, stamp.put, stamp.drop) == ("hpod", ((PRIORITY_LABEL, "500"),), ())
    d2 = tick(look(HI, mem, (part("hpod", "hi", tpuwatch_priority="500"),), probes=running(1), checkpoint=ckpt(100)),
              mem, 300, cfg=HI)
    assert d2.row == "running" and relabels(d2) == []


def test_its_own_node_deleted_to_be_made_again_and_nothing_to_take_the_job_waits_and_creates_it() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(remaking=("hpod",)))
    d = tick(look(HI, mem, (), probes=None), mem, 700, cfg=HI)
    assert d.row == "spare_remake" and d.memory.phase is Phase.WAITING_NODE and d.exit_code == 0
    [make] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (make.name, make.create) == ("hpod", True)


def test_its_own_node_journaled_to_be_made_again_but_never_deleted_is_deleted_so_it_can_be_handed_back() -> None:
    # the watcher killed between the journal line of the delete and the call (or the call
    # refused): the node is still PREEMPTED, journaled as one being made again. Left so, it was
    # never created again and the lender's slot waited for it forever.
    mem = run_mem(step=100, limp=Limp(swapped=(("hpod", "lpod"),), took=(("lpod", "lo"),), remaking=("hpod",)))
    taken = part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500")
    dead = (taken, part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500"))
    d = tick(look(HI, mem, dead, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=HI)
    assert d.row == "spare_remake" and d.ended == () and d.memory.limp.remaking == ("hpod",)
    [remake] = [a for a in d.actions if isinstance(a, RemakeSpare)]
    assert (remake.name, remake.create) == ("hpod", False) and "its delete never started" in remake.reason
    assert d.memory.limp.remake_at is not None and d.memory.limp.took == (("lpod", "lo"),)
    # the delete started: not sent again; nor before remake_at, as a delete not yet seen started
    going = (taken, part("hpod", "hi", "DELETING"))
    for seen, t in ((going, 960), (dead, 901)):
        again = tick(look(HI, d.memory, seen, probes=running(1), checkpoint=ckpt(300)), d.memory, t, cfg=HI)
        assert not [a for a in again.actions if isinstance(a, RemakeSpare)], (seen[1].state, t)


def test_a_job_that_ends_on_a_node_it_took_hands_it_back_to_its_lender_once_stopped() -> None:
    # done before its own node was made again to trade for it: its watch ends there, and the
    # lender's lent slot waited for a hand-back that never came
    from policy_support import exited

    mem = run_mem(step=100, limp=Limp(swapped=(("hpod", "lpod"),), took=(("lpod", "lo"),), remaking=("hpod",)))
    zone = (part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500"),)
    d = tick(look(HI, mem, zone, probes=exited({0: 0}), checkpoint=ckpt(300)), mem, 900, cfg=HI)
    assert d.row == "success" and d.terminal
    [give] = relabels(d)
    assert (give.name, give.owner, dict(give.put)) == ("lpod", "hi", {"tpuwatch-job": "lo", RETURNED_BY: "hi"})
    assert {LENT_BY, PRIORITY_LABEL} <= set(give.drop)
    # the job's other worker is stopped first, waited for: nothing of it is left when the lender launches
    assert kinds(d).index("stop") < kinds(d).index("relabel")
    assert all(a.wait for a in d.actions if isinstance(a, StopWorkers))
    # a watcher started on the ended job writes it again while the label says the job's; not once it is the lender's
    again = tick(look(HI, d.memory, zone, probes=None), d.memory, 960, cfg=HI)
    assert again.row == "terminal" and [r.name for r in relabels(again)] == ["lpod"]
    given = (part("lpod", "lo", tpuwatch_returned_by="hi"),)
    assert relabels(tick(look(HI, d.memory, given, probes=None), d.memory, 961, cfg=HI)) == []


def test_a_lent_slot_never_takes_back_a_node_a_higher_job_asked_for() -> None:
    # a late label write handed the node back to the lender for a moment: it gives it, never launches there
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE,
                  limp=Limp(swapped=(("lpod", ""),), lent=(("lpod", "hi"),)))
    zone = (part("lpod", "lo", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500"),)
    d = tick(look(LO, mem, zone), mem, 700, cfg=LO)
    assert d.row == "give" and d.memory.limp.swapped == (("lpod", ""),)
    assert [dict(r.put).get("tpuwatch-job") for r in relabels(d)] == ["hi"]


def test_a_want_whose_label_never_showed_is_written_again_after_three_polls() -> None:
    mem = replace(run_mem(step=100), phase=Phase.WAITING_NODE, limp=Limp(wants="lpod", wants_at=at(600)))
    zone = (part("hpod", "hi", "PREEMPTED", tpuwatch_priority="500"), LOW)
    soon = tick(look(HI, mem, zone, probes=DOWN), mem, 600 + 2 * HI.poll_interval, cfg=HI)
    assert soon.row in ("take_wait", "spare_remake") and relabels(soon) == []
    late = tick(look(HI, mem, zone, probes=DOWN), mem, 600 + 3 * HI.poll_interval, cfg=HI)
    assert late.row == "take_wait" and [r.name for r in relabels(late)] == ["lpod"]


def test_a_node_an_earlier_trade_gave_the_job_is_handed_back_once_made_again() -> None:
    # after a first trade the job ran on lpod; lpod lost, it took its own old node hpod back from lo,
    # and lpod, made again from its spec, goes to lo in turn
    mem = run_mem(step=100, limp=Limp(took=(("hpod", "lo"),)))
    zone = (part("hpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500"), part("lpod", "hi"))
    d = tick(look(HI, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=HI)
    assert d.row == "hand_back" and [(r.name, dict(r.put)["tpuwatch-job"]) for r in relabels(d)] == [("lpod", "lo")]
    # a spare of tpu.spares is never handed over
    spared = replace(HI, spares=("lpod",))
    d2 = tick(look(spared, mem, zone, probes=running(1), checkpoint=ckpt(300)), mem, 900, cfg=spared)
    assert d2.row != "hand_back" and d2.memory.limp.took == (("hpod", "lo"),)


def test_its_own_node_back_before_the_hand_over_the_job_withdraws_its_ask() -> None:
    mem = run_mem(step=100, limp=Limp(wants="lpod", wants_at=at(500)))
    zone = (part("hpod", "hi", tpuwatch_priority="500"),
            part("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500"))
    d = tick(look(HI, mem, zone, probes=running(1), checkpoint=ckpt(100)), mem, 600, cfg=HI)
    assert d.row == "priority_label" and d.memory.limp.wants == ""
    [drop] = relabels(d)
    assert (drop.name, drop.owner, drop.put, set(drop.drop)) == ("lpod", "lo", (), {WANTED_BY, WANTED_PRIORITY})


def test_a_multislice_lender_that_may_limp_limps_on_the_slices_left() -> None:
    from policy_support import LIMPS, limp_look

    cfg = replace(LIMPS, priority=100, job="job")
    mem = run_mem(step=100)
    asked = replace(limp_part("s2"), labels={"tpuwatch-job": "job", WANTED_BY: "hi", WANTED_PRIORITY: "500",
                                             PRIORITY_LABEL: "100"})
    eight = tuple(WorkerProbe(w, "running", attempt=1, pid=w) for w in range(8))
    d = tick(limp_look({}, mem, parts={"s2": asked}, probes=eight, checkpoint=ckpt(200)), mem, 600, cfg=cfg)
    assert d.row == "give" and d.memory.limp.giving == (("s2", "hi"),) and not d.ended[0].charged
    gone = tuple(WorkerProbe(w, "absent") for w in range(8))
    lent = tick(limp_look({}, d.memory, parts={"s2": asked}, probes=gone, checkpoint=ckpt(200)), d.memory, 601, cfg=cfg)
    assert lent.row == "give" and lent.memory.limp.lent == (("s2", "hi"),)
    assert lent.memory.limp.swapped == (("s2", ""),) and [r.name for r in relabels(lent)] == ["s2"]
    # the slot bound to no node: the job limps on the 3 others, never stops for a person
    seen = limp_look({}, lent.memory, parts={"s2": replace(asked, labels={"tpuwatch-job": "hi", LENT_BY: "job"})},
                     probes=gone, checkpoint=ckpt(200))
    on = tick(seen, lent.memory, 602, cfg=cfg)
    assert on.row == "limp" and on.memory.limp.out == ("s2",), on.summary
    # a node handed back: the slot left out is bound to it, and the job grows back onto it
    back = replace(limp_part("y0"), labels={"tpuwatch-job": "job", RETURNED_BY: "hi"})
    later = replace(on.memory, phase=Phase.RUNNING)
    seen = limp_look({}, later, spares=("y0",), parts={"s2": None, "y0": back}, probes=tuple(
        WorkerProbe(w, "running", attempt=2, pid=w) for w in range(6)), checkpoint=ckpt(250))
    d = tick(seen, later, 700, cfg=cfg)
    assert d.row == "lent_back" and dict(d.memory.limp.swapped) == {"s2": "y0"} and d.memory.limp.lent == ()
    assert d.memory.limp.out == ("s2",) and d.ended == ()  # the limping attempt runs on until it grows back


def test_an_idle_node_is_labelled_so_and_asked_for_before_one_its_job_trains_on() -> None:
    from tpuwatch.policy.priority import IDLE_LABEL

    spared = replace(LO, spares=("lsp",))
    mem = run_mem(step=100)
    zone = (part("lpod", "lo", tpuwatch_priority="100"), part("lsp", "lo", tpuwatch_priority="100"))
    d = tick(look(spared, mem, zone, probes=running(1), checkpoint=ckpt(100)), mem, 300, cfg=spared)
    assert d.row == "priority_label" and [(r.name, r.put) for r in relabels(d)] == [("lsp", ((IDLE_LABEL, "true"),))]
    # the taker asks for the lender's idle spare, not the node it trains on (both priority 100)
    mine = replace(run_mem(step=100), phase=Phase.WAITING_NODE)
    them = (part("hpod", "hi", "PREEMPTED"), part("alpha", "lo", tpuwatch_priority="100"),
            part("zeta", "lo", tpuwatch_priority="100", tpuwatch_idle="true"))
    ask = tick(look(HI, mine, them, probes=DOWN), mine, 600, cfg=HI)
    assert ask.row == "take_wait" and [r.name for r in relabels(ask)] == ["zeta"]


def test_a_node_whose_label_names_another_job_is_never_run_on_however_usable() -> None:
    # a late label write handed the node the job took back to its lender for a moment
    mem = replace(run_mem(step=100), phase=Phase.IDLE, limp=Limp(swapped=(("hpod", "lpod"),), took=(("lpod", "lo"),)))
    zone = (part("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500"),)
    absent = (WorkerProbe(0, "absent"), WorkerProbe(1, "absent"))
    d = tick(look(HI, mem, zone, probes=absent, checkpoint=ckpt(200)), mem, 700, cfg=HI)
    assert d.row == "take_wait" and "launch" not in kinds(d), (d.row, kinds(d))


def test_a_node_lent_to_the_job_is_never_swapped_in_for_a_slice_it_limps_without_but_handed_back() -> None:
    # a swap binds no lender to trade with: the label step would drop tpuwatch-lent-by from the
    # node it runs on, and the lender would wait for a hand-back that never comes
    from policy_support import LIMPS, limp_look

    cfg = replace(LIMPS, priority=500, spares_remade=False)
    mem = run_mem(step=200, limp=Limp(out=("s2",)))
    loan = replace(limp_part("x0"), labels={"tpuwatch-job": "job", LENT_BY: "lo", PRIORITY_LABEL: "100"})
    six = tuple(WorkerProbe(w, "running", attempt=1, pid=w) for w in range(6))
    d = tick(limp_look({"s2": "PREEMPTED"}, mem, spares=("x0",), parts={"x0": loan}, probes=six, checkpoint=ckpt(300)),
             mem, 900, cfg=cfg)
    assert d.row == "hand_back" and d.memory.limp.swapped == () and d.memory.limp.handing == (("x0", "lo"),)
    [back] = relabels(d)
    assert (back.name, dict(back.put)) == ("x0", {"tpuwatch-job": "lo", RETURNED_BY: "job"})


def test_its_own_vm_google_deletes_at_its_preemption_is_made_again_after_a_take_and_a_restart() -> None:
    # termination action DELETE: Google deletes the job's VM at its preemption. Gone with the audit
    # log's word, it is journaled to be made again that tick; the job takes a node of the shape it
    # was last seen with meanwhile (its slot then bound there), and a watcher restarted before the
    # insert (its memory read back from the journal's JSON) still inserts it, once. It was read as
    # gone for good (the rows never recreate a pool's node) and the job stopped for a person.
    import json

    from tpuwatch.model import AuditEvent

    def preempted(t: float) -> AuditEvent:
        return AuditEvent(time=at(t), kind="terminate", node="hpod", worker="0", method="compute.instances.preempted",
                          reason="", insert_id=f"hpod-{t}", resource_name="projects/p/zones/z/instances/hpod")

    mem = run_mem(step=100)
    going = replace(part("hpod", "hi", "DELETING", tpuwatch_priority="500"), google_deletes=True, stopping=True,
                    google_deleting="a Spot VM with termination action DELETE is STOPPING")
    seen = tick(look(HI, mem, (going, LOW), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=HI)
    assert relabels(seen) == []
    # gone with no word yet: a person's delete looks alike; nothing taken
    quiet = tick(look(HI, seen.memory, (LOW,), probes=None, checkpoint=ckpt(200)), seen.memory, 605, cfg=HI)
    assert quiet.row == "google_delete_wait" and relabels(quiet) == [] and quiet.memory.limp.remaking == ()
    gone = tick(look(HI, quiet.memory, (LOW,), probes=None, checkpoint=ckpt(200), events=(preempted(598),)),
                quiet.memory, 610, cfg=HI)
    assert gone.row == "take_wait" and gone.memory.limp.remaking == ("hpod",), (gone.row, gone.summary)
    assert [r.name for r in relabels(gone)] == ["lpod"]
    restarted = Memory.from_dict(json.loads(json.dumps(gone.memory.to_dict())))
    lent = part("lpod", "hi", tpuwatch_lent_by="lo")
    took = tick(look(HI, restarted, (lent,), probes=None, checkpoint=ckpt(200)), restarted, 700, cfg=HI)
    assert took.row == "take" and took.memory.limp.swapped == (("hpod", "lpod"),)
    on = replace(took.memory, phase=Phase.RUNNING)
    made = tick(look(HI, on, (lent,), probes=running(1), checkpoint=ckpt(300)), on, 800, cfg=HI)
    assert made.row == "spare_remake"
    assert [(a.name, a.create) for a in made.actions if isinstance(a, RemakeSpare)] == [("hpod", True)]
    # not inserted twice while the first insert is under way (not yet seen)
    again = tick(look(HI, made.memory, (lent,), probes=running(1), checkpoint=ckpt(300)), made.memory, 801, cfg=HI)
    assert not [a for a in again.actions if isinstance(a, RemakeSpare)]
    # back: traded for the node it took, as after a STOP
    back = (lent, part("hpod", "hi"))
    trade = tick(look(HI, again.memory, back, probes=running(1), checkpoint=ckpt(300)), again.memory, 900, cfg=HI)
    assert trade.row == "hand_back" and [r.name for r in relabels(trade)] == ["hpod"]
    assert trade.memory.limp.remaking == ()


def test_a_node_handed_back_that_google_deletes_at_its_preemption_is_made_again_for_the_slot_bound_to_it() -> None:
    # lo runs on hpod, handed back to it for the node it lent (its slot lpod bound to hpod); hpod's
    # termination action is DELETE and Google deletes it: gone with the audit log's word, it is
    # journaled to be made again under its name, and lo waits for it; not left to a person
    import json

    from tpuwatch.model import AuditEvent

    word = AuditEvent(time=at(598), kind="terminate", node="hpod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="hpod-598", resource_name="projects/p/zones/z/instances/hpod")
    mem = run_mem(step=100, limp=Limp(swapped=(("lpod", "hpod"),)))
    taken = part("lpod", "hi", tpuwatch_lent_by="lo", tpuwatch_priority="500")
    going = replace(part("hpod", "lo", "DELETING", tpuwatch_priority="100"), google_deletes=True, stopping=True,
                    google_deleting="a Spot VM with termination action DELETE is STOPPING")
    seen = tick(look(LO, mem, (taken, going), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=LO)
    assert seen.memory.limp.remaking == ()
    gone = tick(look(LO, seen.memory, (taken,), probes=None, checkpoint=ckpt(200), events=(word,)), seen.memory,
                610, cfg=LO)
    assert gone.row == "spare_remake" and gone.memory.limp.remaking == ("hpod",), (gone.row, gone.summary)
    assert "hpod to be made again" in gone.summary and gone.exit_code == 0
    assert [(a.name, a.create) for a in gone.actions if isinstance(a, RemakeSpare)] == [("hpod", True)]
    restarted = Memory.from_dict(json.loads(json.dumps(gone.memory.to_dict())))
    waits = tick(look(LO, restarted, (taken,), probes=None, checkpoint=ckpt(200)), restarted, 611, cfg=LO)
    assert waits.row == "spare_wait" and not [a for a in waits.actions if isinstance(a, RemakeSpare)]


def test_its_own_vm_read_gone_with_googles_word_at_once_ends_the_attempt_when_it_takes_a_node() -> None:
    # the watcher read the VM running, then gone with the audit log's word (it missed the stop in
    # between): asking for a node, or binding one lent already, ends the attempt as any loss does,
    # else its journal row would stay open under the next attempt
    from tpuwatch.model import AuditEvent
    from tpuwatch.policy.state import GoogleStop

    word = AuditEvent(time=at(598), kind="terminate", node="hpod", worker="0", method="compute.instances.preempted",
                      reason="", insert_id="hpod-598", resource_name="projects/p/zones/z/instances/hpod")
    mem = run_mem(step=100, google=GoogleStop(node_id="n1", owned=True, deletes=True, shape=LOW.accelerator_type))
    asks = tick(look(HI, mem, (LOW,), probes=None, checkpoint=ckpt(200), events=(word,)), mem, 600, cfg=HI)
    assert asks.row == "take_wait", (asks.row, asks.summary)
    [end] = asks.ended
    assert (end.attempt, end.outcome, end.charged) == (mem.attempt.number, "disruption", False)
    lent = part("lpod", "hi", tpuwatch_lent_by="lo")
    binds = tick(look(HI, mem, (lent,), probes=None, checkpoint=ckpt(200), events=(word,)), mem, 600, cfg=HI)
    assert binds.row == "take" and binds.memory.limp.swapped == (("hpod", "lpod"),), (binds.row, binds.summary)
    [end] = binds.ended
    assert (end.attempt, end.outcome, end.charged) == (mem.attempt.number, "disruption", False)


def vm(name: str, owner: str, state: str = "READY", **labels: str) -> NodeSnapshot:
    """A Compute Engine Spot VM (termination action STOP) of the job's, as `part` labels it."""
    return replace(part(name, owner, state, **labels), kind="instance")


def test_its_own_vm_stopping_under_its_own_delete_is_still_lost_the_ask_and_a_lent_node_are_kept() -> None:
    """Compute Engine shows a VM being deleted as STOPPING. The job's own VM, preempted and deleted
    by tpuwatch to be inserted again, is lost while it stops as before: a Spot VM stopping is only
    waited for (a person's delete looks so) when tpuwatch did not delete it. Read as nothing lost,
    the job withdrew its ask, and handed back a node just lent to it."""
    mem = run_mem(step=100)
    own = vm("hpod", "hi", "PREEMPTED", tpuwatch_priority="500")
    low = vm("lpod", "lo", tpuwatch_priority="100")
    d = tick(look(HI, mem, (own, low), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=HI)
    assert d.row == "take_wait" and d.memory.limp.wants == "lpod"
    asked = vm("lpod", "lo", tpuwatch_priority="100", tpuwatch_wanted_by="hi", tpuwatch_wanted_priority="500")
    r = tick(look(HI, d.memory, (own, asked), probes=None), d.memory, 601, cfg=HI)
    assert r.row == "spare_remake" and r.memory.limp.remaking == ("hpod",), (r.row, r.summary)
    stopping = replace(own, stopping=True)
    s = tick(look(HI, r.memory, (stopping, asked), probes=None), r.memory, 602, cfg=HI)
    assert s.memory.limp.wants == "lpod" and relabels(s) == [], (s.row, s.summary, relabels(s))
    # lent meanwhile (labelled the job's by the lender): taken, never handed back
    lent = vm("lpod", "hi", tpuwatch_priority="100", tpuwatch_lent_by="lo")
    t = tick(look(HI, s.memory, (stopping, lent), probes=None), s.memory, 603, cfg=HI)
    assert t.row == "take" and t.memory.limp.swapped == (("hpod", "lpod"),), (t.row, t.summary)
    assert relabels(t) == []
    # a Spot VM stopping that tpuwatch is not deleting is waited for, as before: nothing asked
    fresh = tick(look(HI, mem, (replace(own, stopping=True), low), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=HI)
    assert fresh.memory.limp.wants == "" and relabels(fresh) == [], (fresh.row, fresh.summary)


def test_its_own_vm_gone_to_be_inserted_again_is_still_of_its_shape_a_node_is_asked_for_then() -> None:
    """The job's own VM preempted and deleted by tpuwatch before a node could be asked for (the
    lower job's node came up later, or the ask was cut off by a kill): gone, it still has the
    shape it was last seen with, and a node of that shape is asked for."""
    mem = run_mem(step=100)
    own = vm("hpod", "hi", "PREEMPTED", tpuwatch_priority="500")
    busy = vm("lpod", "lo", "REPAIRING", tpuwatch_priority="100")  # not usable: nothing to ask for yet
    d = tick(look(HI, mem, (own, busy), probes=DOWN, checkpoint=ckpt(200)), mem, 600, cfg=HI)
    r = tick(look(HI, d.memory, (own, busy), probes=None), d.memory, 601, cfg=HI)
    assert r.memory.limp.wants == "" and r.memory.limp.remaking == ("hpod",), (r.row, r.summary)
    gone = tick(look(HI, r.memory, (busy,), probes=None), r.memory, 700, cfg=HI)
    assert gone.memory.limp.wants == ""
    up = vm("lpod", "lo", tpuwatch_priority="100")
    e = tick(look(HI, gone.memory, (up,), probes=None), gone.memory, 800, cfg=HI)
    assert e.row == "take_wait" and e.memory.limp.wants == "lpod", (e.row, e.summary)
    [ask] = relabels(e)
    assert (ask.name, ask.put) == ("lpod", ((WANTED_BY, "hi"), (WANTED_PRIORITY, "500")))
