"""The recovery table as data: every row the policy can decide by, with what it means.

`decide` (policy/table.py) names the row of every Decision; a test walks every row. The rows
are shown to people in docs/policy.md, and `Row.steady` tells the loop (tpuwatch/loop.py) which
decisions mean all is well, so no caller tests row names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One row of the recovery table: what was observed, and what is decided."""

    id: str
    observed: str
    decision: str
    # Nothing is wrong: the loop may wait a whole poll_interval before looking again.
    steady: bool = False


# The recovery table (docs/policy.md shows it to people), then the rows the implementation needs
# between them.
ROWS: tuple[Row, ...] = (
    Row("launch", "READY+HEALTHY, no live attempt, backoff over",
        "clean up workers, launch attempt n+1 from the latest complete checkpoint"),
    Row("running", "all workers run the attempt", "nothing", steady=True),
    Row("success", "worker 0 exits 0", "done: stop the other workers, report (exit 0)"),
    Row("disruption", "a worker ends, with disruption evidence in the attempt",
        "not charged; stop all workers; relaunch once the node is usable"),
    Row("notice_end", "an attempt ends after a worker's metadata server gave notice of maintenance or preemption "
        "(the relay passed it to the job), whatever the exit codes, 0 included",
        "a disruption, never done and not charged; stop all workers; no launch on that node until it has gone "
        "down and come back (or 5 min)"),
    Row("notice_hold", "no live attempt; the last one ended on a notice and the node has not gone down yet "
        "(nor reports a maintenance event since the attempt began)",
        "wait: the node is about to stop"),
    Row("pending_stop_hold", "no live attempt; a Compute Engine VM of the node is gracefully shutting down (status "
        "or shutdownDetails PENDING_STOP: a Spot preemption's notice)", "wait: no launch on a VM about to stop; "
        "once it stops, the row its state calls for"),
    Row("early_wait", "every worker runs; the owned node announces maintenance that may start early "
        "(canReschedule, PENDING); maintenance.start_early. Or, with a spare free (tpu.spares), any maintenance "
        "announced for a node the job runs on",
        "keep running until the next complete checkpoint (at the latest 10 min before the window opens); in the "
        "last tenth of the interval the job has shown, look every 0.1 % of it (1 s at least), not every poll"),
    Row("early_start", "that checkpoint landed (or the window opens in 10 min)",
        "a disruption, not charged: stop every worker, start the maintenance now (journaled first, like a "
        "delete); relaunch from that checkpoint when the node is READY+HEALTHY again"),
    Row("early_refused", "the service refused to start it: any code that says the same call would fail again "
        "(UNIMPLEMENTED, FAILED_PRECONDITION, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, …)",
        "noted once for that window, never an API failure; relaunch, and let the relay pass the last-minute "
        "notice to the job"),
    Row("spare_maintenance", "nothing else to do this tick, and an idle spare of the job's own (READY, labelled its "
        "own; not through a queued resource) has an announced maintenance that may start early "
        "(maintenance.start_early); or the service refused to start it",
        "start it now, while nothing runs there, rather than at its window, when the job may run there; each "
        "maintenance asked once (a refusal is said, and the maintenance comes at its window)"),
    Row("failure", "a worker exits non-zero, node healthy, no disruption evidence",
        "charged to max_restarts; stop all workers; relaunch at once the first time since a stable run, "
        "then after a capped exponential backoff with jitter. When no worker exited with a code of its own "
        "(its process vanished, or SIGKILL/SIGTERM ended it), a node read within 1 min showing a host going "
        "away refunds the charge"),
    Row("failed_start", "a worker exits non-zero before min_uptime",
        "a failed start: charged like a failure"),
    Row("fail_fast", "a worker exits with a code in fail_fast_exit_codes", "failed at once (exit 1)"),
    Row("no_progress", "no_progress_limit charged attempts in a row add no newer checkpoint",
        "failed (exit 1): a deterministic bug is not retried forever"),
    Row("budget_spent", "a charged end with max_restarts already used", "failed (exit 1) with the reason and evidence"),
    Row("repair_wait", "REPAIRING / RESTARTING / UNHEALTHY_MAINTENANCE / TIMEOUT / UNKNOWN; or PREEMPTED / "
        "TERMINATED in a Compute Engine MIG that repairs by itself (defaultActionOnFailure REPAIR, the default)",
        "wait up to repair_timeout from first sight (UNKNOWN with no health: up to 5 min from its first sight)"),
    Row("repair_timeout", "still not healthy after repair_timeout", "delete + create (owned nodes only)"),
    Row("mig_repair_wait", "still not healthy after repair_timeout while the MIG is making its VMs again (a "
        "current action CREATING, RECREATING, ..., or short of its target size)",
        "keep waiting, never recreateInstances of VMs the MIG is recreating; once the MIG is idle and the slice "
        "still not READY: repair_timeout (a MIG not stable though every VM runs with no action, the end of its "
        "repair read across calls, is waited for up to repair_timeout from its first sight so)"),
    Row("autorepair_wait", "a slice of a multislice queued resource is missing or being created, or the others "
        "restart after it was replaced, while the request stays ACTIVE: Cloud TPU's multislice autorepair replaces "
        "it, waiting for hardware if needed",
        "wait up to the longer of repair_timeout and queue_timeout from first sight (a recreate would queue for "
        "every slice at once), then delete + create the whole request"),
    Row("failed_repair", "UNKNOWN with no health, the API's state after a failed repair, for 5 min from its first "
        "sight (or repair_timeout, if shorter)",
        "delete + create (owned nodes only), without waiting out repair_timeout: the repair it waits for is over"),
    Row("dead_node", "PREEMPTED / TERMINATED (a MIG: only with defaultActionOnFailure DO_NOTHING; a Compute Engine "
        "Spot VM: once TERMINATED, not while it stops)",
        "delete + create (owned nodes only)"),
    Row("spot_stopping", "a Compute Engine Spot VM with termination action STOP still stopping (STOPPING): Google's "
        "preemption ends TERMINATED, a person's instances.delete with the VM gone; with tpu.spares, a spare pool, a "
        "priority or job.min_slices, no swap, claim, ask nor limp away from it meanwhile (not one tpuwatch is deleting "
        "to make again: Compute Engine shows that delete as STOPPING too, and the VM is lost)",
        "wait, sending nothing to it; TERMINATED: delete + create (dead_node), or with a spare free a swap; gone "
        "with no word that Google or tpuwatch removed it: a person's deletion (node_missing), never made again"),
    Row("spot_stopping_long", "as `spot_stopping`, the VM stopping (since first seen down) 5 min or longer, or half "
        "of recovery.operation_timeout when that is shorter (Google's stop of a Spot VM ends in seconds: 30 s for a "
        "preempted VM's guest, more only with a graceful shutdown configured)",
        "wait on as `spot_stopping`, sending nothing to it; said: the status line names the VM and how long it "
        "has been stopping, and the journal's wait (once, as the row changes) is alert stopping_long"),
    Row("spot_stopping_timeout", "as `spot_stopping`, the VM stopping (since first seen down) for "
        "recovery.operation_timeout or longer", "needs a person (exit 1), naming the VM and how long; still nothing "
        "sent to it (a person's instances.delete looks the same); the next run decides afresh"),
    Row("not_owned", "delete + create needed, node lacks tpuwatch-job=<job>",
        "never delete it: needs a person (exit 1); pass --adopt"),
    Row("not_recreatable", "delete + create needed on a job over separately created slices ([tpu] names "
        "without a queued resource)", "never delete a slice: needs a person (exit 1)"),
    Row("swap", "a multislice job with tpu.spares: slices it runs on are not READY+HEALTHY (as for `limp`: not a "
        "person's stop, nor a slice RESTARTING, nor a Compute Engine Spot VM still stopping that tpuwatch is not deleting to make again: `spot_stopping`), or left out while it limps (a job on one node: its node not so, "
        "or gone with Google's word for it or deleted by tpuwatch), and a spare is READY+HEALTHY, of the job's "
        "accelerator type (a MIG's: machine type and target size), and carries the job's ownership label (not "
        "a node another job lent it: `take` binds that one and keeps its lender); never a node a person deleted "
        "(`node_missing`)",
        "journal the spare in the lost slice's place (its slice id); a disruption, not charged: stop the attempt on "
        "the slices still up (a MIG's VMs still running too: that stop is owed, journaled with the swap, until done, "
        "so a watcher killed first does it before anything else) and relaunch at once on the spare and the others from the newest complete checkpoint "
        "(MEGASCALE_* set by tpuwatch); a slice left out is grown back onto at the next checkpoint (`grow`). No "
        "delete or create; the node swapped out is a spare once READY+HEALTHY again (a VM Google deleted, owned "
        "as last seen, with the audit log's word for it, is made again: `spare_remake`)"),
    Row("pool_claim", "a job with tpu.spare_pool: a slot it runs in has no usable node (not a person's stop, nor a RESTARTING, nor a Spot VM still stopping), none of its own spares is free (`swap` first), and an idle spare of the pool (tpuwatch-pool=<pool>, no tpuwatch-job) is READY+HEALTHY and of the job's accelerator type (a Compute Engine instance: of its machine type, and not one whose metadata starts a job at boot)",
        "a disruption, not charged: stop the attempt; journal the claim, then label the spare tpuwatch-job=<job> (read again, written and waited for under the pool's lock in the state dir); the job swaps onto it as onto its own spare (`swap`) once its label says so"),
    Row("pool_return", "a job with tpu.spare_pool runs on (or waits) on a node of the pool (tpuwatch-pool=<pool>, labelled the job's) and a node of its own no slot holds (its lost node healed or made again; not one of its tpu.spares) is READY+HEALTHY; or a spare it claimed from the pool failed its launch-time checks (`spare_bad`) and no slot holds it",
        "journal, then relabel that node to the pool (tpuwatch-pool=<pool>, no tpuwatch-job): a trade, the job stays where it runs and the pool keeps its size; a spare that failed its checks goes back marked tpuwatch-pool-bad=<job>: never claimed again, the pool's keeper makes it again"),
    Row("spare_remake", "the job runs on or waits (nothing else to do this tick) and an idle spare, owned by the job "
        "and made alone, is PREEMPTED / TERMINATED (or under repair longer than repair_timeout) with [tpu.spec] "
        "there to make it from (while `spare_wait` waits, "
        "such a lost slice of the job's too; so is a slice a job that limps over slices made one by one with "
        "[tpu.spec] runs without; not one under repair while a create has come to nothing: it may still heal; "
        "not a Compute Engine VM still STOPPING: a Spot preemption ends TERMINATED, a person's instances.delete "
        "gone, never made again); "
        "or one tpuwatch deleted so is gone; or one Google deletes itself (a "
        "Compute Engine VM's termination action DELETE), owned and made alone when last seen idle (or swapped out), "
        "is gone and the audit log says Google preempted it (none yet: waited for 3 min, then `spare_gone`); or so the "
        "node of a job on one slot (a pool of one), gone with Google's word (journaled the tick it is read so, "
        "whether the job then swaps, takes another job's node or waits); or, of the keeper of a spare pool (the one job holding its keeper lock in the "
        "state dir), an idle spare of the pool (its label, no job's) PREEMPTED / TERMINATED or marked tpuwatch-pool-bad, or one a keeper "
        "deleted so gone (its record in the state dir), or an idle VM of the pool Google deletes itself (termination action "
        "DELETE), made alone when last seen, gone with the audit log's compute.instances.preempted about it (none yet: "
        "waited for 3 min, then `spare_gone`)",
        "journal it as one tpuwatch makes again, delete it (not one Google deletes); one so journaled that is still "
        "PREEMPTED / TERMINATED, not DELETING nor stopping, a backoff later (its delete never started: the watcher killed between "
        "its journal line and the call, or the call refused) is deleted again (a MIG's instances recreated again); "
        "once gone, create it again from [tpu.spec] ([tpu.compute_spec.instance]: an instances.insert under its "
        "name) (one that came to nothing tried again as a queued create is: recovery.backoff_base, doubling to "
        "recovery.backoff_max). A spare neither tpuwatch nor Google deleted so is never created. A MIG (tpu.mig) is made "
        "again in place: recreateInstances of its instances, never a delete nor an insert (one gone is dropped). "
        "A pool's spare is deleted only while it is an idle spare of the pool (read again next to the delete) and "
        "recorded in the state dir's pool.<pool>.remaking before the delete (one Google deleted, before the create), so whichever job keeps the pool when it is gone (its deleter ended or no longer the keeper) creates it from its [tpu.spec] labelled tpuwatch-pool=<pool> and no job's"),
    Row("spare_gone", "the job runs on or waits (nothing else to do this tick) and an idle node of the pool that Google "
        "may delete itself (a Compute Engine VM's termination action DELETE), owned and made alone when last seen "
        "(of the keeper of a spare pool: an idle VM of the pool so, its label and no job's), "
        "has been gone 3 min with no compute.instances.preempted about it in the audit log",
        "a person deleted it: drop it, never make it again, and say so (with that word, it is made again: "
        "`spare_remake`)"),
    Row("spare_bad", "before a launch, the launch-time checks fail on workers of a spare swapped in (after the "
        "cleanup of what tpuwatch can fix)", "not charged, nothing launched: the spare is not used again until it is "
        "made again (its node id), its slot goes back to its own node; another spare, a limp or a wait follows (a spare claimed from a spare pool goes back to the pool marked so: `pool_return`)"),
    Row("spare_wait", "a job with tpu.spares, tpu.spare_pool or job.priority (or that limps over slices made one by one with "
        "[tpu.spec]): a slice it runs on is dead or missing (or repairing past "
        "repair_timeout), no spare is free and "
        "it may not limp, but a spare is on its way (being made again by tpuwatch, or healing) or the lost slice "
        "can be made again itself ([tpu.spec], owned, made alone)", "a disruption, not charged: stop the attempt "
        "on the slices still up and wait (no stop for a person, no recreate of a queued resource); the dead nodes "
        "are made again meanwhile (`spare_remake`), and the job resumes on the first spare READY (`swap`) or on "
        "its own slice made again"),
    Row("take_wait", "a job with job.priority: a slice it runs on has no usable node (not a person's stop, nor a "
        "RESTARTING; a node labelled another job's is not usable to it), no spare is free, it may not limp, and a READY+HEALTHY node of its accelerator type is held by "
        "a job of lower tpuwatch-priority (not asked for by one of higher; not a Compute Engine instance whose metadata "
        "starts its job at boot)", "a disruption, not charged: stop the "
        "attempt; journal, then label that node (the lowest priority first) tpuwatch-wanted-by=<job>, "
        "tpuwatch-wanted-priority=<p> (an idle one, tpuwatch-idle=true, before one its job trains on); wait for it to be handed over (its own lost node is made again meanwhile, "
        "`spare_remake`)"),
    Row("give", "a job with job.priority holds a node wanted by a job of higher priority (its "
        "tpuwatch-wanted-* labels)", "journal the node as given; a disruption, not charged: stop the attempt, "
        "waited for (the slot stays bound, so its workers are probed and nothing is launched there); once no "
        "worker has a process of the job left (else stop again), journal the slot lent (bound to no node) and "
        "relabel the node tpuwatch-job=<taker>, tpuwatch-lent-by=<job> (repeated until its label says so)"),
    Row("take", "a job with job.priority has a slot with no usable node and a READY+HEALTHY node labelled its own "
        "with tpuwatch-lent-by=<lender> is free (one the job handed to that lender before is free again once so "
        "labelled: that hand-back is done)", "journal the node in the slot's place (as `swap`) and the lender; a "
        "disruption, not charged; relaunch there from the newest complete checkpoint"),
    Row("lent_back", "a slot the job lent away and a free node of its pool (one handed back, or a spare)",
        "journal the node in the slot's place; the job resumes there from its own newest complete checkpoint"),
    Row("lent_wait", "a slot the job lent away, not left out, and no node free for it", "wait for a node handed "
        "back or a spare (never a stop for a person); the attempt, if any, ended as a disruption, not charged"),
    Row("hand_back", "the job runs on or waits, and its own node of a slot that runs on a node it took is READY+HEALTHY "
        "again (or a node lent to it is idle and nothing is lost); or the job ends (done or failed) on a node it took "
        "before its own is back", "journal, then relabel that node "
        "tpuwatch-job=<lender>, tpuwatch-returned-by=<job>: a trade, the job stays on the node it took "
        "(repeated until its label says so); a job that ends hands back the node it took itself, its workers "
        "stopped first (waited for), so the lender never waits for a watch that has ended"),
    Row("priority_label", "the job runs on or waits, and a READY node it holds lacks tpuwatch-priority=<p>, or "
        "tpuwatch-idle=true while no slot runs on it (or has it while one does), or keeps tpuwatch-lent-by after its "
        "trade, or tpuwatch-returned-by while a slot runs on it; or nothing is lost any more and a node it asked for "
        "still carries "
        "its tpuwatch-wanted-* labels", "relabel it (a write only when its labels differ); an ask is withdrawn"),
    Row("early_swap", "a maintenance is announced for a node the job runs on (tpu.spares), a spare is free, and the "
        "job's next complete checkpoint landed (or the window is 10 min away)", "a disruption, not charged: stop the "
        "attempt, journal the spare in that node's place, start the node's maintenance now when it may start early "
        "(it is idle), and relaunch at once on the spare from that checkpoint; the node is a spare again once its "
        "maintenance is over"),
    Row("limp", "a multislice job with job.min_slices: slices it runs on are not READY+HEALTHY (a repair, "
        "maintenance, a preemption, Google's autorepair, a slice missing that Google or tpuwatch removed; not a "
        "person's stop, nor a slice a person deleted (node_missing), nor a slice RESTARTING, back within minutes, "
        "nor a Compute Engine Spot VM still stopping) "
        "and at least min_slices others are",
        "a disruption, not charged: stop the attempt on the slices still up, journal the lost slices as left out, "
        "relaunch at once on the slices left from the newest complete checkpoint ({num_slices}, "
        "TPUWATCH_NUM_SLICES and MEGASCALE_* say how many); never below min_slices"),
    Row("grow_wait", "a job that limps runs on every worker; a slice left out is READY+HEALTHY again, or will not "
        "come back by itself (PREEMPTED, TERMINATED) and the job's multislice queued resource can be made again",
        "keep running until the next complete checkpoint newer than the one when the slice came back, looking every "
        "sixth of a poll (1 s at least)"),
    Row("grow", "that checkpoint landed; or the slice is back while the limped attempt has saved no checkpoint and "
        "is younger than (n-k)/n of the job's checkpoint interval (a short heal: growing at once discards less than "
        "limping on would lose); or such a slice is left out while no attempt runs; or it is no longer in "
        "tpu.names", "a disruption, not charged: stop the attempt, take the slices back, relaunch on all of them "
        "from that checkpoint; a dead one taken back is recreated with the whole request (`dead_node`), never "
        "limped around again until it is made"),
    Row("recreate_budget_spent", "delete + create needed with max_recreates used", "failed (exit 1)"),
    Row("node_missing", "node missing and tpuwatch did not delete it, with no word that Google did (with tpu.spares: "
        "the node a slot runs on, a job on one node, or a slice of slices made one by one; with job.min_slices: a "
        "slice of slices made one by one that the job runs on or limps without; a slice of a multislice queued resource gone is "
        "Google's autorepair)",
        "needs a person (exit 1): never recreate a node a person deleted, nor swap a spare in for it, nor limp "
        "around it"),
    Row("recreate_asked", "a person asked for a delete + create now (`tpuwatch recreate`, `tpuwatch check --recreate`: `Flags.recreate`), no operation in flight",
        "the recreate path, not charged to max_recreates: a running attempt ends as a disruption; an owned "
        "node is deleted, then created in the zone and the fallback zones as `create_after_delete`, `no_capacity` "
        "and `queue_retry` say; a missing node is created; a node not owned, or being deleted by someone else, is "
        "refused (`not_owned`, `someone_deleting`)"),
    Row("recreate_missing", "node missing, --recreate-missing", "create it from the saved spec"),
    Row("google_deleted", "a Compute Engine VM missing that Google deletes itself (termination action DELETE: "
        "Spot, flex-start, a run duration or termination time), with Google's word for it: the audit log's "
        "compute.instances.preempted about it, or its run's end (as last read) passed; a sighting of it going is "
        "no word (a person's delete shows the same); it carried tpuwatch-job=<job> when last seen",
        "a disruption, not charged to max_restarts: create it from the saved spec (a recreate, within "
        "max_recreates), then resume"),
    Row("google_deleting", "such a VM DELETING: shutdownDetails.targetState DELETED, or a Spot VM with DELETE "
        "stopping", "wait up to 3 min from first sight for it to be gone (then google_deleted with Google's word, "
        "google_delete_wait without), never a delete of "
        "tpuwatch's beside Google's; still there then: delete + create (dead_node) with Google's word, else left "
        "alone as a person's stop (person_stopped)"),
    Row("google_delete_wait", "such a VM missing, owned when last seen, with no word yet",
        "wait up to 3 min from first sight for the audit log's word (its entry may come after the VM is gone); "
        "then it is a person's deletion (node_missing), said so"),
    Row("someone_deleting", "node DELETING and tpuwatch did not delete it", "needs a person (exit 1)"),
    Row("queued_preempted", "node DELETING or missing while its queued resource is SUSPENDING, SUSPENDED or "
        "FAILED (the service took it back, e.g. a spot preemption; for a flex-start MIG, its newest resize "
        "request whose VMs Google deleted at the end of their run duration)",
        "a disruption, not charged to max_restarts: delete the queued resource (force) and create it again "
        "with the same spec and tier, then resume (a recreate, within max_recreates); a flex-start MIG's "
        "ended resize requests are deleted and a new one asks for its VMs"),
    Row("person_stopped", "STOPPED / STOPPING / HIDDEN; or a Compute Engine Spot VM with DELETE still stopped 3 min "
        "after it was first seen going, with no compute.instances.preempted about it (a person stopped it)",
        "leave it alone; report that a person stopped it",
        steady=True),
    Row("google_stopped_start", "a Compute Engine VM STOPPED (TERMINATED) that Compute Engine stopped itself (the "
        "audit log's compute.instances.hostError or terminateOnHostMaintenance about it since it last came up), "
        "automaticRestart off, owned, not started yet in this stop",
        "a repair, not a person's stop: start it again (instances.start, journaled first), then wait up to "
        "repair_timeout from first sight; the attempt it ended is a disruption, uncharged"),
    Row("google_stopped_wait", "such a VM stopped by Compute Engine, with automaticRestart (Compute Engine restarts "
        "it), or already started by tpuwatch, or not owned",
        "wait up to repair_timeout from first sight, then delete + create (repair_timeout, owned only)"),
    Row("unknown_state", "a state this tpuwatch does not know",
        "wait up to repair_timeout, then needs a person; never delete"),
    Row("unhealthy_running", "node not healthy but every worker still runs the attempt (not when a slice of a "
        "multislice job is gone: its workers are out of the probes, and the others wait in their collectives "
        "on hosts that are no more, so the attempt ends, a disruption)",
        "keep following it; never delete a node under a live attempt"),
    Row("deleting", "tpuwatch's delete in flight; or a node of another id came meanwhile",
        "follow the operation; a new node is followed as such, any repair of it timed from now"),
    Row("delete_resume", "DELETING with no operation recorded and the node not deleting (nor a Compute Engine VM "
        "stopping, which the delete may have begun: followed as `deleting`)",
        "the earlier tick stopped before the call: decide afresh from the node (delete again if still needed)"),
    Row("delete_failed", "tpuwatch's delete failed", "failed (exit 1)"),
    Row("operation_timeout", "tpuwatch's delete or create not done after recovery.operation_timeout",
        "failed (exit 1), naming the operation; never a second delete or create beside it"),
    Row("create_after_delete", "node gone after tpuwatch's delete (and its queued resource, if it came from one)",
        "create it in the first zone"),
    Row("creating", "tpuwatch's create in flight", "follow the operation (none recorded: wait for the node still CREATING, up to operation_timeout); never a second create"),
    Row("create_resume", "CREATING with no operation recorded and no node",
        "create again (an ALREADY_EXISTS answer to it is success)"),
    Row("created", "tpuwatch's create finished (or ALREADY_EXISTS)", "resume: launch once READY+HEALTHY"),
    Row("create_failed", "create failed for a reason other than capacity", "failed (exit 1)"),
    Row("no_capacity", "create fails: no capacity / quota (in its operation, or refused at once: a Compute Engine "
        "insert's 403 quotaExceeded or ZONE_RESOURCE_POOL_EXHAUSTED)",
        "queued: retry with capped backoff and jitter; a queued resource the service gave up on is deleted at "
        "once, so its name is free by the retry"),
    Row("queued", "queued, retry time not reached", "wait"),
    Row("queue_retry", "queued, retry time reached",
        "create again; after queue_timeout in a zone, in the next fallback zone"),
    Row("queue_exhausted", "every zone queued for queue_timeout", "failed (exit 1)"),
    Row("backoff", "no live attempt, backoff not over", "wait"),
    Row("probe_failed", "node usable, workers not probed", "look again next tick"),
    Row("workers_unreachable", "node usable; no worker answers during an attempt, or any worker before a launch",
        "look again next tick; launch nothing"),
    Row("keys_not_there_yet", "before a launch, a worker refuses the login within ssh.login_grace of the node's "
        "create time, a boot or a node-id change",
        "unreachable: the keys reach a new VM after sshd listens; look again next tick, launch nothing"),
    Row("owed_stop_failed", "before a launch, the stop owed on a node the job moved off (a swap, a move ahead of "
        "a maintenance, a slice left out, a node lent) failed in this tick: a worker of it, still READY and the "
        "job's, did not answer or did not stop",
        "launch nothing: the older attempt may still run there; stop there again next tick, and launch once it is "
        "done (a node no longer READY or the job's owes nothing)"),
    Row("login_refused", "before a launch, a worker still refuses the login after ssh.login_grace",
        "needs a person (exit 1), naming the user, the key and the likely fix; the job resumes once it logs in"),
    Row("unreachable_grace", "a worker unreachable while the others run",
        "wait unreachable_grace, then stop all and classify the end"),
    Row("end_confirm", "first sight of an end no evidence explains yet, on a node that looks usable, where no "
        "worker exited with a code of its own (its process vanished, or SIGTERM/SIGKILL ended it), and charging "
        "it would end the job (restart budget spent, or the no-progress limit reached)",
        "charge nothing yet: classify it on the next tick, whose look at the node comes after this sighting "
        "(a host taken down for maintenance looks like this before the node says so)"),
    Row("term_confirm", "first sight of an end after a SIGTERM tpuwatch did not send (not its stop, not the relay's "
        "notice: the guest shutting down first), whatever the exit codes, 0 included, on a node that looks usable, "
        "with no disruption evidence yet",
        "neither done nor charged yet: wait 10 s from the first sighting, then look at the node and the audit log "
        "again; a disruption by then (PREEMPTED, STOPPING, TERMINATED, maintenance, a terminate entry) makes the "
        "end one, not charged, even with exit 0; nothing by then: judged as any end (exit 0 = done)"),
    Row("stale_workers", "workers run an older attempt", "stop them; launch on a later tick"),
    Row("adopt_running", "workers run a newer attempt than the journal knows (launch not journaled)",
        "follow it: no duplicate launch"),
    Row("survived", "after a disruption, every worker still runs the attempt", "follow it again"),
    Row("launch_unseen", "the launched attempt left no trace on any worker",
        "launch the same attempt number again (launch_tries), then charge a failed start"),
    Row("launch_partial", "the launched attempt runs on some workers and never reached the others (a launch "
        "cut short: the watcher killed between workers, a launch refused or lost on one)",
        "when every worker answers and none of those missing it still runs an older attempt, launch the same "
        "attempt again from the checkpoint it started from (launch_tries); while a worker is unreachable, wait "
        "(row `unreachable_grace`, up to unreachable_grace); when one still runs an older attempt, the newest "
        "checkpoint has moved on, a worker stayed unreachable past unreachable_grace, or after launch_tries, end "
        "it uncharged (its end stops every worker)"),
    Row("terminal", "DONE or FAILED", "report the end again; stop workers still running; a node it took still "
        "labelled its own is handed back (`hand_back`)", steady=True),
    Row("hung", "every worker runs the attempt, but no new checkpoint for recovery.hang_timeout "
        "(from the attempt's start or its newest checkpoint; 0s = off; \"auto\": 3x the checkpoint interval "
        "seen, at least 30m, and the workers' logs silent as long)",
        "stop all workers; a charged failure (\"hung: no new checkpoint for ...\"), counted in the "
        "no-progress streak when the attempt added no checkpoint; backoff, then relaunch"),
    Row("log_silent", "past the attempt's first checkpoint, every worker runs but no worker has written to its "
        "log for max(10m, 3x the longest silence the job has shown past a first checkpoint), nor has a checkpoint "
        "come (hang_timeout \"auto\", once the job has shown a whole checkpoint interval; the start of an attempt, "
        "its first compile and first save, is never judged by its logs)",
        "stop all workers; a charged failure (\"hung: no new checkpoint ... and no output ...\"); backoff, then "
        "relaunch"),
    # Known runtime signatures in the workers' logs (policy/signatures.py; [recovery] log_signatures)
    Row("log_hang", "a worker's log of the attempt shows a hang signature (Megascale hang detected, ...)",
        "stop all workers at once; a charged failure (\"hung: the runtime says so ...\"), unless disruption "
        "evidence explains it (a multislice job's slices hang when one slice goes away): then a disruption; "
        "backoff, then relaunch"),
    Row("log_crash", "a worker's log of the attempt shows a crash signature (the JAX distributed service detected "
        "fatal errors: a peer died)",
        "stop all workers at once, not waiting for each to exit; classified as any end (disruption evidence "
        "excuses it, else charged)"),
    Row("log_dirty_host", "a worker's log of the attempt shows that its TPU could not be opened (held by a "
        "leftover process or lockfile: /dev/vfio busy, TPU already in use, TPU initialization failed)",
        "stop all workers (the stop removes device holders and a stale libtpu lockfile) and relaunch; not charged, "
        "unless the attempt before ended the same way (then charged like any end)"),
    # A bad host (policy/faulty.py): the evidence points at one worker's host
    Row("faulty_host", "the same worker's attempts end with a dirty-host signature 3 times in a row on one boot of "
        "the node (each after the stop's cleanup), or the launch-time environment checks find its TPU devices "
        "missing 3 rounds in a row on one boot, within repair_timeout; recovery.report_faulty_hosts, node owned",
        "the end charged as log_dirty_host says (checks: nothing launched, not charged); report that worker's VM's "
        "host as faulty (Compute Engine's instances.reportHostAsFaulty, journaled first, once per host and boot); "
        "no launch on the node until it has gone down and come back, or 20 min; checks still failing at "
        "repair_timeout from the first: precheck_recreate"),
    Row("faulty_host_told", "the same evidence, with recovery.report_faulty_hosts off (the Cloud TPU API has no such "
        "call) or the node not owned",
        "the end charged as log_dirty_host says (checks: wait as precheck_wait says); say once per host and boot "
        "which worker's host looks faulty and what a person should do (recreate the VM, or report it); the job "
        "goes on"),
    Row("faulty_host_hold", "no live attempt; tpuwatch reported a worker's host and the node has not gone down since",
        "wait: Google stops the VM to repair its host"),
    Row("faulty_host_refused", "the cloud refused the report (not All Capacity mode / reservation-bound, not "
        "running, no permission, ...)",
        "noted once for that host and boot, never an API failure; say what a person should do; relaunch as the end "
        "says"),
    # Environment checks (tpuwatch.workers.precheck). A failing check is evidence against the
    # node, never charged to max_restarts; a job that fails with every check passing is charged
    # as before (`failure`).
    Row("precheck_fix", "environment checks fail before a launch, every failing item fixable "
        "(stale libtpu lockfile, orphan device holders)",
        "not charged: stop the holders and remove the lockfile (the worker cleanup), check again, then launch"),
    Row("precheck_wait", "environment checks fail before a launch and tpuwatch cannot fix them "
        "(disk or /dev/shm too small, device missing, DNS, interpreter, a custom check)",
        "not charged: wait up to repair_timeout from the first failing check, checking again every tick"),
    Row("precheck_recreate", "environment checks still fail after repair_timeout, node owned",
        "not charged: delete + create (isolate the bad host)"),
    Row("precheck_needs_person", "environment checks still fail after repair_timeout, node not owned",
        "needs a person (exit 1) with the failing items; the job resumes once they pass"),
)
ROW_IDS = frozenset(r.id for r in ROWS)
ROW_BY_ID = {r.id: r for r in ROWS}
