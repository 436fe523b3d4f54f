"""Google's own stops of a Compute Engine VM (policy/google.py): Google's deletion of a Spot or
flex-start VM is a disruption, made again from the saved spec; a deletion with no word from
Google stays a person's."""

from __future__ import annotations

from dataclasses import replace

from policy_support import CFG, JOB, NAME, at, idle, kinds, node, obs, run_mem, running, tick

from tpuwatch.model import AuditEvent
from tpuwatch.policy import Memory, Phase

SPOT = {"spot": True, "google_deletes": True}


def preempted(t: float) -> AuditEvent:
    return AuditEvent(time=at(t), kind="terminate", node=NAME, worker="0", method="compute.instances.preempted",
                      reason="", insert_id=f"p-{t}", resource_name=f"projects/p/zones/z/instances/{NAME}")


def seen_then(mem: Memory, now: float, **kw: object) -> Memory:
    """Memory after a tick that saw the VM (owned, one Google deletes) as `kw` says."""
    return tick(obs(node(**{**SPOT, **kw}), probes=running(1)), mem, now).memory  # type: ignore[arg-type]


def test_a_spot_vm_deleted_with_the_audit_logs_preemption_is_made_again_uncharged() -> None:
    mem = seen_then(run_mem(), 10)
    d = tick(obs(missing=True, events=(preempted(15),)), mem, 20)
    assert d.row == "google_deleted" and kinds(d)[-1] == "create", d.summary
    assert d.memory.phase is Phase.CREATING and d.memory.budgets.recreates == 1
    assert d.memory.budgets.restarts == 0 and d.ended and d.ended[0].charged is False


def test_the_preemption_is_remembered_for_a_later_tick_that_finds_the_vm_gone() -> None:
    # cron `check`: the tick that read the entry still saw the VM; the next finds it gone
    mem = tick(obs(node(**SPOT), events=(preempted(15),)), seen_then(idle(), 10), 20).memory
    d = tick(obs(missing=True), mem, 80)
    assert d.row == "google_deleted", d.summary


def test_a_vm_seen_going_to_deleted_is_waited_for_then_made_again_with_the_audit_logs_word() -> None:
    mem = seen_then(idle(), 10)
    going = tick(obs(node(state="DELETING", google_deleting="shutdownDetails STOPPING to DELETED", **SPOT)), mem, 20)
    assert going.row == "google_deleting" and "delete" not in kinds(going)
    assert tick(obs(missing=True, events=(preempted(15),)), going.memory, 30).row == "google_deleted"


def test_a_vm_seen_going_then_gone_with_no_word_from_google_is_a_persons_deletion() -> None:
    # a person's instances.delete of a Spot VM with DELETE looks like its preemption (stopping,
    # then gone) but writes nothing to the system-event log: never made again on the sighting
    going = node(state="DELETING", google_deleting="a Spot VM with termination action DELETE is STOPPING", **SPOT)
    seen = tick(obs(going), seen_then(run_mem(), 10), 20)
    assert seen.row == "google_deleting" and not seen.memory.google.deleted
    waiting = tick(obs(missing=True), seen.memory, 30)
    assert waiting.row == "google_delete_wait" and "create" not in kinds(waiting) and waiting.exit_code == 0
    late = tick(obs(missing=True), waiting.memory, 30 + 181)
    assert late.row == "node_missing" and late.exit_code == 1 and "create" not in kinds(late)
    assert "no compute.instances.preempted about it in the audit log" in late.summary, late.summary


def test_a_vm_whose_run_ended_with_delete_is_made_again() -> None:
    mem = seen_then(idle(), 10, spot=False, google_deletes_at=at(100))
    assert tick(obs(missing=True), mem, 50).row == "google_delete_wait"  # gone before its end: no word yet
    assert tick(obs(missing=True), mem, 101).row == "google_deleted"


def test_a_deletion_with_no_word_from_google_is_a_persons_after_the_grace() -> None:
    mem = seen_then(idle(), 10)
    waiting = tick(obs(missing=True), mem, 20)
    assert waiting.row == "google_delete_wait" and waiting.exit_code == 0
    assert tick(obs(missing=True), waiting.memory, 20 + 181).row == "node_missing"


def test_a_vm_google_never_deletes_is_a_persons_at_once_even_with_a_preemption_entry() -> None:
    mem = tick(obs(node(spot=True)), idle(), 10).memory  # Spot with STOP: Google stops it, never deletes it
    assert tick(obs(missing=True, events=(preempted(15),)), mem, 20).row == "node_missing"


def test_an_entry_older_than_the_vm_is_another_vms_and_ownership_is_the_last_sightings() -> None:
    mem = seen_then(idle(), 10)
    assert tick(obs(missing=True, events=(preempted(-5),)), mem, 20).row == "google_delete_wait"
    foreign = tick(obs(node(owned=False, **SPOT)), idle(), 10).memory  # type: ignore[arg-type]
    d = tick(obs(missing=True, events=(preempted(15),)), foreign, 20)
    assert d.row == "not_owned" and d.exit_code == 1 and "create" not in kinds(d)
    assert tick(obs(missing=True, events=(preempted(15),), adopt=True), foreign, 20).row == "google_deleted"


def test_what_was_seen_survives_the_journal() -> None:
    mem = tick(obs(node(**SPOT), events=(preempted(15),)), seen_then(idle(), 10), 20).memory
    assert mem.google.deleted.startswith("audit compute.instances.preempted") and mem.google.owned
    assert Memory.from_dict(mem.to_dict()) == mem
    assert replace(mem.google, node_id="other") != mem.google and JOB


def host_error(t: float, method: str = "compute.instances.hostError") -> AuditEvent:
    return AuditEvent(time=at(t), kind="terminate", node=NAME, worker="0", method=method, reason="",
                      insert_id=f"h-{t}", resource_name=f"projects/p/zones/z/instances/{NAME}")


def test_a_vm_compute_engine_stopped_ends_the_attempt_uncharged_and_is_started_again() -> None:
    d = tick(obs(node(state="STOPPED", auto_restart=False), events=(host_error(15),)), run_mem(), 20)
    assert d.row == "google_stopped_start" and "start_node" in kinds(d), d.summary
    assert d.ended and d.ended[0].charged is False and d.memory.budgets.restarts == 0


def test_the_word_may_come_ticks_after_the_stop_and_a_stop_with_no_word_stays_a_persons() -> None:
    first = tick(obs(node(state="STOPPED", auto_restart=False)), idle(), 10)
    assert first.row == "person_stopped" and first.memory.google.stopped_since == at(10)
    later = tick(obs(node(state="STOPPED", auto_restart=False), events=(host_error(8),)), first.memory, 30)
    assert later.row == "google_stopped_start"
    # the repair is timed from the stop's first sight, not from the word
    assert [a.until for a in later.actions if a.kind == "wait"] == [at(10 + CFG.repair_timeout)]  # type: ignore[attr-defined]
    assert tick(obs(node(state="STOPPED", auto_restart=False)), first.memory, 30).row == "person_stopped"


def test_a_stop_word_from_before_the_vm_last_came_up_is_not_this_stops() -> None:
    down_before = tick(obs(node(state="STOPPED", auto_restart=False)), idle(), 40).memory
    up = tick(obs(node()), down_before, 50).memory  # came up at 50: a word dated before is an earlier stop's
    down = tick(obs(node(state="STOPPED", auto_restart=False), events=(host_error(5),)), up, 60)
    assert down.row == "person_stopped"
    maint = tick(obs(node(state="STOPPED", auto_restart=False),
                     events=(host_error(55, "compute.instances.terminateOnHostMaintenance"),)), up, 60)
    assert maint.row == "google_stopped_start"
    assert tick(obs(node(), probes=running(1)), maint.memory, 70).memory.google.stopped == ""  # up again: cleared


def test_a_vm_going_to_deleted_that_stays_is_a_persons_stop_without_googles_word_and_made_again_with_it() -> None:
    # a Spot VM with DELETE that a person stopped stays TERMINATED, and no preemption is logged:
    # left alone as any person's stop, never deleted
    going = node(state="DELETING", google_deleting="a Spot VM with termination action DELETE is TERMINATED", **SPOT)
    first = tick(obs(going), seen_then(idle(), 10), 20)
    assert first.row == "google_deleting" and first.actions[-1].until == at(20 + 180)  # type: ignore[union-attr]
    assert tick(obs(going), first.memory, 100).row == "google_deleting"
    late = tick(obs(going), first.memory, 201)
    assert late.row == "person_stopped" and late.memory.phase is Phase.PAUSED and kinds(late) == ["wait"], kinds(late)
    assert "a person stopped it" in late.summary and late.exit_code == 0
    assert tick(obs(going), late.memory, 900).row == "person_stopped"  # and it stays so
    # Google said it preempted it, yet it is still there: deleted and made again
    said = tick(obs(going, events=(preempted(15),)), first.memory, 100)
    stuck = tick(obs(going), said.memory, 201)
    assert stuck.row == "dead_node" and kinds(stuck)[-1] == "delete", stuck.summary
