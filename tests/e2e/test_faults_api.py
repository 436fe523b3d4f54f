"""Cloud API faults: errors at a rate, slow and lost answers, operations that
never end or fail. `tpuwatch watch` runs a recreate scenario against the simulator while the
faults are on; the outcome must be the one without faults, and the calls it took bounded.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from chaos.harness import Watched

from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

CODES = ["UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "RESOURCE_EXHAUSTED"]  # 429 is RESOURCE_EXHAUSTED
FAST_RETRIES = {"TPUWATCH_API_BACKOFF_SCALE": "0.05"}


def recreate_scenario(sim: Simulator, job: Watched) -> int:
    """A node that never heals, recreated, the job resumed and finished; the watcher's exit code."""
    job.start()
    job.running_with_progress()
    sim.inject("maintenance", node=job.name, stuck="REPAIRING")
    return job.finish(timeout=120)


def test_errors_on_30_percent_of_all_calls_and_slow_answers_change_nothing(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=3, recreatable=True, steps=300, repair_timeout="1s",
                  env=FAST_RETRIES)
    try:
        sim.inject("api-errors", rate=0.3, codes=CODES)
        sim.inject("slow-api", latency="30s", jitter=0.5)  # 0.05 s +- 50% at speed 600
        sim.world.reset_calls()
        rc = recreate_scenario(sim, job)
        result = job.assert_invariants(rc)  # one READY node, done from the right checkpoint
        calls, failed = Counter(sim.world.calls), Counter(sim.world.injected)
        served = {m: calls[m] - failed[m] for m in calls}
        total, bad = sum(calls.values()), sum(failed.values())
        print(f"\n{total} calls, {bad} failed by injection ({bad / total:.0%}); per method: "
              + ", ".join(f"{m.rsplit('/', 1)[-1]} {calls[m]}/{failed[m]}" for m in sorted(calls)))
        assert 0.2 < bad / total < 0.4, (bad, total)  # the faults did happen, at about their rate
        # Bounded: about 1/(1 - 0.3) = 1.43 tries per answer; never a retry storm.
        assert total <= 1.8 * sum(served.values()) + 10, (calls, failed)
        for m in calls:
            assert calls[m] <= 2 * served[m] + 8, (m, calls[m], served[m])
        # The same end as without faults: one delete, creates only as quota refusals ask, no charge.
        assert sim.world.call_count("DeleteNode") - failed["google.cloud.tpu.v2.Tpu/DeleteNode"] >= 1
        assert not any(a["charged"] for a in result["attempts"]), result["attempts"]
        out = job.output()
        assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    finally:
        sim.world.clear_errors()
        job.close()


def test_lost_answers_to_delete_and_create_still_give_exactly_one_node(sim: Simulator, tmp_path: Path) -> None:
    """Every DeleteNode and CreateNode is served, but its answer is lost (DEADLINE_EXCEEDED): the
    retried create meets ALREADY_EXISTS for the node it made itself."""
    job = Watched(sim, tmp_path, "pod", seed=4, recreatable=True, steps=200, repair_timeout="1s",
                  env=FAST_RETRIES)
    try:
        sim.inject("lose-responses", rate=1.0, methods=["DeleteNode", "CreateNode"])
        rc = recreate_scenario(sim, job)
        job.assert_invariants(rc)
        assert sim.world.lost["google.cloud.tpu.v2.Tpu/CreateNode"] >= 1
        out = job.output()
        assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    finally:
        sim.world.clear_errors()
        job.close()


def test_an_operation_that_never_ends_times_out_with_a_clear_message(sim: Simulator, tmp_path: Path) -> None:
    sim.world.delays["delete"] = 10**9  # the delete operation never finishes
    job = Watched(sim, tmp_path, "pod", seed=5, recreatable=True, repair_timeout="0.5s",
                  operation_timeout="2s")
    try:
        rc = recreate_scenario(sim, job)
        out = job.output()
        assert rc == 1, out[-3000:]
        assert "recovery.operation_timeout" in out and "is not done after" in out, out[-3000:]
        assert sim.world.call_count("DeleteNode") == 1 and sim.world.call_count("CreateNode") == 0
        assert job.node() is not None and job.node().state == "DELETING"
        hist = job.cli("history", "-c", str(job.cfg), "--json")
        assert '"fail"' in hist.stdout and "operation_timeout" in hist.stdout, hist.stdout[-2000:]
    finally:
        job.close()


def test_a_create_refused_for_good_is_not_retried(sim: Simulator, tmp_path: Path) -> None:
    job = Watched(sim, tmp_path, "pod", seed=6, recreatable=True, repair_timeout="0.5s")
    try:
        sim.inject("permission-denied", methods=["CreateNode"])
        rc = recreate_scenario(sim, job)
        out = job.output()
        assert rc == 1, out[-3000:]
        assert sim.world.call_count("CreateNode") == 1, "a refused create was sent again"
        assert "PERMISSION_DENIED" in out or "tpu.nodes.create" in out, out[-3000:]
        assert "Traceback" not in out
    finally:
        sim.world.clear_errors()
        job.close()
