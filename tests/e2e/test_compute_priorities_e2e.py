"""End to end: job priorities ([job] priority) between two Compute Engine jobs on instances, in
one `tpuwatch watch --config-dir`. Against the simulator's Compute Engine REST face with the real
`google-cloud-compute` client and real ssh.

Job `hi` (priority 500, a Spot instance `hi`, termination action STOP) and job `lo` (priority
100, instance `lo`), one worker each, one machine type, each with the [tpu.compute_spec] `tpuwatch
init` captures. `hi` is preempted with no spare: `lo` is stopped uncharged (saving on its
SIGTERM), its instance relabelled `hi`'s (instances.setLabels, with the labelFingerprint of a get
next to it), and `hi` trains there; `hi`'s own instance, inserted again from its spec, is handed
to `lo`, which resumes on it from its own checkpoint. Each trainer holds at step 100 until the
test lets it go, so each stage meets running jobs however slow the machine. Outcomes come from
the simulated world (labels, metadata, processes, the calls it served), the checkpoints and the
journals.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import cli_process
import pytest
from e2e_helpers import (
    Overlap,
    checkpoint_steps,
    cli_json,
    compute_job,
    finish,
    instance_key,
    job_memory,
    trainer_on_instance,
    wait_while_watched,
)

from tpuwatch.journal import Journal
from tpuwatch.policy.state import Phase
from tpuwatch.sim.rest import RestFace
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

STEPS = 200
JOBS = ("hi", "lo")


@pytest.fixture
def rest(sim: Simulator) -> Iterator[RestFace]:
    with RestFace(sim.world) as face:
        yield face


def job(sim: Simulator, rest: RestFace, tmp: Path, name: str, priority: int | None, *,
        spot: str = "") -> tuple[Path, dict[str, str], Path]:
    """Instance `name` (Spot with termination action `spot`, if given) and its job, of `priority`."""
    scheduling = {"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": spot}} if spot else {}
    return compute_job(sim, rest.url, tmp, name, steps=STEPS, body=scheduling,
                       job_keys=f"priority = {priority}" if priority is not None else "")


def on(sim: Simulator, instance: str, who: str, attempt: int) -> dict[str, str] | None:
    return trainer_on_instance(sim, instance, who, attempt)


def labels(sim: Simulator, instance: str) -> dict[str, str]:
    return dict(sim.world.instance(instance).labels)


def relabels(tmp: Path, name: str) -> list[str]:
    with Journal.open(tmp / "state", name, name, readonly=True) as journal:
        return [e.reason for e in journal.events() if e.kind == "relabel"]


def watch(tmp: Path, env: dict[str, str]) -> cli_process.Forked:
    return cli_process.start(["watch", "--config-dir", str(tmp / "jobs")], env)


def both_done(tmp: Path, proc: cli_process.Forked) -> tuple[int, str]:
    """Wait for both jobs to be done, then end the watch (`--config-dir` watches until Ctrl-C);
    its exit code and output."""
    wait_while_watched(lambda: all((m := job_memory(tmp / "state", j)) is not None and m.phase is Phase.DONE
                                   for j in JOBS), proc, "both jobs done", timeout=150)
    proc.send_signal(signal.SIGINT)
    return finish(proc, timeout=60)


@pytest.mark.parametrize("action", ["STOP", "DELETE"])
def test_a_preempted_high_priority_instance_job_takes_the_low_ones_instance_and_hands_its_own_back(
        sim: Simulator, rest: RestFace, tmp_path: Path, action: str) -> None:
    hi, env, go_hi = job(sim, rest, tmp_path, "hi", 500, spot=action)
    lo, _, go_lo = job(sim, rest, tmp_path, "lo", 100)
    old = sim.world.instance("hi").id
    proc = watch(tmp_path, env)
    overlap = Overlap(sim, JOBS, JOBS, instance_key)
    try:
        wait_while_watched(lambda: on(sim, "hi", "hi", 1) is not None and on(sim, "lo", "lo", 1) is not None
                           and len(checkpoint_steps(sim.bucket / "lo")) >= 2
                           and labels(sim, "lo").get("tpuwatch-priority") == "100"
                           and labels(sim, "hi").get("tpuwatch-priority") == "500",
                           proc, "both jobs training, each instance labelled with its job's priority")
        sim.world.stockout()  # hi's own instance is not inserted again until the test lifts it
        sim.world.preempt_instance("hi")
        if action == "DELETE":
            # Google deletes hi's instance: journaled to be made again once gone with the audit
            # log's word; the watcher SIGKILLed then, before any insert went through, and started
            # again, still inserts it (once) and hands it to lo
            wait_while_watched(lambda: (m := job_memory(tmp_path / "state", "hi")) is not None
                               and m.limp.remaking == ("hi",), proc, "hi's deleted instance journaled to be made again")
            assert all(i.name != "hi" for i in sim.world.instances())  # gone, not yet inserted
            proc.kill()
            proc.wait()
            proc = watch(tmp_path, env)
        wait_while_watched(lambda: on(sim, "lo", "hi", 2) is not None, proc, "job hi's attempt 2 on instance lo",
                           timeout=120)
        taken = labels(sim, "lo")
        assert (taken["tpuwatch-job"], taken["tpuwatch-lent-by"]) == ("hi", "lo"), taken
        assert "tpuwatch-wanted-by" not in taken, taken
        mem = job_memory(tmp_path / "state", "lo")
        assert mem is not None and dict(mem.limp.lent) == {"lo": "hi"}, mem
        assert on(sim, "lo", "lo", 1) is None and on(sim, "lo", "lo", 2) is None  # lo waits, trains nowhere
        # said plainly: status shows instance lo held by job hi, taken from job lo, and why
        shown = json.dumps(cli_json(lo, env, "status")["nodes"])
        assert "runs on lo, taken from job lo of a lower priority" in shown, shown
        assert "slice lo lent to job hi, which asked for its node with a higher priority" in shown, shown
        sim.inject("clear-errors")
        wait_while_watched(lambda: on(sim, "hi", "lo", 2) is not None, proc,
                           "job lo's attempt 2 on instance hi, inserted again", timeout=150)
        given = labels(sim, "hi")
        assert (given["tpuwatch-job"], given["tpuwatch-returned-by"]) == ("lo", "hi"), given
        assert sim.world.instance("hi").id != old
        # inserted as a spare is: its startup script never starts a job at boot
        assert sim.world.instance("hi").metadata["tpuwatch-launch"] == "false"
        resumed = on(sim, "hi", "lo", 2)
        assert resumed is not None and on(sim, "lo", "hi", 2) is not None  # hi stays on the instance it took
        (go_hi / "100").touch()
        (go_lo / "100").touch()
        rc, out = both_done(tmp_path, proc)
    finally:
        overlap.stop()
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert overlap.seen == [] and overlap.samples > 10, overlap.seen
    assert checkpoint_steps(sim.bucket / "hi")[-1] == STEPS and checkpoint_steps(sim.bucket / "lo")[-1] == STEPS
    for cfg in (hi, lo):
        done = cli_json(cfg, env, "history")["attempts"]
        assert [(a["outcome"], a["charged"]) for a in done] == [("disruption", False), ("success", False)], done
    # lo resumed on the instance handed back from what it saved on its SIGTERM, in its own checkpoints
    lo_done = cli_json(lo, env, "history")["attempts"]
    assert int(resumed["TPUWATCH_STEP"]) == lo_done[1]["start_step"] > 0, (resumed, lo_done)
    # hi's preempted instance deleted once (by tpuwatch; with DELETE by Google) and inserted again;
    # every hand-over a setLabels
    calls = sim.world.calls
    assert calls.get("compute.v1.Instances/Delete", 0) == (action == "STOP"), calls
    assert calls.get("compute.v1.Instances/Insert", 0) >= 1, calls
    assert calls.get("compute.v1.Instances/SetLabels", 0) >= 2, calls
    # every insert the cloud served was one journaled try (a stockout refuses all but the last):
    # nothing sent twice across the kill
    with Journal.open(tmp_path / "state", "hi", "hi", readonly=True) as journal:
        tries = [e for e in journal.events() if e.kind == "spare_remade" and e.data.get("create")]
    assert len(tries) == calls.get("compute.v1.Instances/Insert", 0), (tries, calls)
    # and the journals say each hand-over, before it was done
    assert any("relabelled lo (tpuwatch-job=hi, tpuwatch-lent-by=lo" in e for e in relabels(tmp_path, "lo"))
    assert any("relabelled hi (tpuwatch-job=lo, tpuwatch-returned-by=hi" in e for e in relabels(tmp_path, "hi"))


def test_a_job_without_a_priority_never_gives_its_instance(sim: Simulator, rest: RestFace, tmp_path: Path) -> None:
    hi, env, go_hi = job(sim, rest, tmp_path, "hi", 500, spot="STOP")
    lo, _, go_lo = job(sim, rest, tmp_path, "lo", None)
    old = sim.world.instance("hi").id
    proc = watch(tmp_path, env)
    try:
        wait_while_watched(lambda: on(sim, "hi", "hi", 1) is not None and on(sim, "lo", "lo", 1) is not None, proc,
                           "both jobs training")
        sim.world.preempt_instance("hi")
        # hi inserts its own instance again and resumes there; lo's is never asked for nor given
        wait_while_watched(lambda: on(sim, "hi", "hi", 2) is not None, proc, "job hi's attempt 2 on its own instance",
                           timeout=150)
        assert sim.world.instance("hi").id != old
        assert on(sim, "lo", "lo", 1) is not None and labels(sim, "lo") == {"tpuwatch-job": "lo"}
        (go_hi / "100").touch()
        (go_lo / "100").touch()
        rc, out = both_done(tmp_path, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, out[-4000:]
    assert [a["outcome"] for a in cli_json(lo, env, "history")["attempts"]] == ["success"]
