"""End to end: [[notify]] alerts from the real CLI (`check` from cron, `watch` killed and started
again) against the simulator, real ssh and the toy trainer, delivered to a local webhook
(tests/webhook_server.py). Outcomes are read from what the webhook accepted and from the journal.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from e2e_helpers import STEPS, Job, finish
from webhook_server import Hook

from tpuwatch.journal import Journal
from tpuwatch.sim.simulator import Simulator

pytestmark = pytest.mark.slow

EVERY_KIND = '["failed", "needs_person", "recreated", "disruption", "resumed", "done", "maintenance"]'


def with_notify(job: Job, hook: Hook, on: str = EVERY_KIND) -> None:
    """A [[notify]] table whose URL comes from the environment, as docs/alerts-and-metrics.md says to write it."""
    with job.cfg.open("a") as f:
        f.write(f'[[notify]]\nurl = "${{TPUWATCH_TEST_HOOK}}"\nformat = "json"\non = {on}\n')
    job.env["TPUWATCH_TEST_HOOK"] = hook.url


def test_check_from_cron_sends_each_alert_once_through_a_failing_webhook(sim: Simulator, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    # The webhook fails the first request (500), throttles the second (429, Retry-After 1 s).
    with Hook(plan=[500, ("429", 1)]) as hook:
        job = Job(sim, tmp_path, f"--segfault-at 25 --fault-worker 0 --crash-once {marker}")
        with_notify(job, hook)
        outputs = []
        end = time.monotonic() + 120
        done = False
        while time.monotonic() < end and not done:
            r = job.cli("check", "-c", str(job.cfg))
            outputs.append(r.stdout + r.stderr)
            assert r.returncode == 0, outputs[-1]
            done = "| done |" in r.stdout
            time.sleep(0.2)
        assert done, "\n".join(outputs[-5:])
        for _ in range(3):  # cron keeps calling after the end: nothing is sent again
            r = job.cli("check", "-c", str(job.cfg))
            outputs.append(r.stdout + r.stderr)
        hist = job.history()
        resumes = [e for e in hist["events"] if e["kind"] == "launch" and e["data"]["attempt"] > 1]
        assert resumes, hist["events"]
        kinds = Counter(r["body"]["kind"] for r in hook.answered)
        assert kinds == Counter({"resumed": len(resumes), "done": 1}), (kinds, outputs[-3:])
        keys = hook.keys()
        assert len(keys) == len(set(keys)), keys  # each alert accepted once
        assert hook.requests[0]["headers"]["Idempotency-Key"] == keys[0]  # retried under the same key
        assert hook.requests[2]["time"] - hook.requests[1]["time"] >= 1.0  # Retry-After honoured
        done_text = next(r["body"]["text"] for r in hook.answered if r["body"]["kind"] == "done")
        assert done_text.startswith("tpuwatch pod (node pod, us-central2-b): job done"), done_text
        # The URL's token is nowhere but in the requests: not in any output, the journal or history.
        journal = (tmp_path / "state" / "pod.db").read_bytes()
        assert hook.token not in "".join(outputs) and hook.token.encode() not in journal
        assert hook.token not in json.dumps(hist)


def test_a_watch_killed_while_an_alert_hangs_sends_it_once_after_the_restart(sim: Simulator, tmp_path: Path) -> None:
    with Hook(plan=["hang"]) as hook:  # the first request is held and never answered
        job = Job(sim, tmp_path, steps=80, hold_at=10)
        with_notify(job, hook, on='["disruption", "done"]')
        proc = job.watch()
        job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
        sim.inject("maintenance", node="pod", heal_after=1200)
        job.release()
        assert hook.held.wait(60), "no alert was tried"
        proc.send_signal(signal.SIGKILL)  # mid-send: the webhook never answered
        proc.wait()
        with Journal.open(tmp_path / "state", "pod", None, readonly=True) as journal:
            pending = journal.deliveries(pending_only=True)
        assert [d.kind for d in pending] == ["disruption"]  # journaled before the send that hung
        hook.release.set()
        rc, out = finish(job.watch())
        assert rc == 0, out
        kinds = Counter(r["body"]["kind"] for r in hook.answered)
        assert kinds == Counter({"disruption": 1, "done": 1}), (kinds, out)
        assert hook.token not in out
        assert job.steps_done()[-1] == 80 and STEPS < 80


def test_an_unset_webhook_variable_is_exit_2_naming_the_key(sim: Simulator, tmp_path: Path) -> None:
    with Hook() as hook:
        job = Job(sim, tmp_path)
        with_notify(job, hook)
        del job.env["TPUWATCH_TEST_HOOK"]
        for command in ("check", "watch"):
            r = job.cli(command, "-c", str(job.cfg))
            assert r.returncode == 2, r
            assert "notify[0].url: the environment variable TPUWATCH_TEST_HOOK is not set" in r.stderr, r.stderr
        assert not (tmp_path / "state" / "pod.db").exists()  # refused before anything was done
        # Commands that send no alerts do not need the secret.
        assert job.cli("history", "-c", str(job.cfg)).returncode == 1  # no journal yet, not exit 2


def test_an_upcoming_maintenance_notice_is_alerted_once_however_often_cron_looks(
        sim: Simulator, tmp_path: Path) -> None:
    with Hook() as hook:
        job = Job(sim, tmp_path, steps=10_000)
        with_notify(job, hook, on='["maintenance"]')
        sim.inject("upcoming-maintenance", node="pod")  # a week's notice (the default): PENDING throughout
        for _ in range(3):
            r = job.cli("check", "-c", str(job.cfg))
            assert r.returncode == 0, r.stdout + r.stderr
        (alert,) = hook.answered
        body = alert["body"]
        assert body["kind"] == "maintenance" and body["status"] == "PENDING" and body["type"] == "SCHEDULED"
        assert body["text"].startswith("tpuwatch pod (node pod, us-central2-b): scheduled maintenance planned, "
                                       "window "), body["text"]


def test_a_preempted_spot_node_alerts_disruption_recreated_resumed_and_done_once_each(
        sim: Simulator, tmp_path: Path) -> None:
    with Hook() as hook:
        job = Job(sim, tmp_path, accelerator="v4-16", spot=True, recreatable=True, hold_at=10)
        with_notify(job, hook)
        proc = job.watch()
        job.wait(lambda: len(job.steps_done()) >= 2, what="two checkpoints")
        sim.inject("preempt", node="pod")
        job.release()
        rc, out = finish(proc, timeout=120)
        assert rc == 0, out
        hist = job.history()
        expected = Counter({
            "disruption": sum(1 for a in hist["attempts"] if a["outcome"] == "disruption"),
            "recreated": sum(1 for e in hist["events"] if e["kind"] == "wait" and e["data"].get("reason") == "node created"),
            "resumed": sum(1 for e in hist["events"] if e["kind"] == "launch" and e["data"]["attempt"] > 1),
            "done": 1})
        assert expected["disruption"] >= 1 and expected["recreated"] == 1, hist["events"]
        assert Counter(r["body"]["kind"] for r in hook.answered) == expected, out
        texts = {r["body"]["kind"]: r["body"]["text"] for r in hook.answered}
        assert "preemption: attempt 1 ended by a disruption (node state PREEMPTED" in texts["disruption"], texts
        assert "node recreated: node pod exists in us-central2-b" in texts["recreated"], texts


def test_a_node_deleted_by_hand_alerts_that_a_person_is_needed(sim: Simulator, tmp_path: Path) -> None:
    with Hook() as hook:
        job = Job(sim, tmp_path, recreatable=True, steps=400)
        with_notify(job, hook)
        proc = job.watch()
        job.wait(lambda: len(job.steps_done()) >= 1, what="a checkpoint")
        sim.inject("delete-node", node="pod")
        rc, out = finish(proc, timeout=60)
        assert rc == 1, out
        kinds = [r["body"]["kind"] for r in hook.answered]
        assert kinds.count("needs_person") == 1, kinds
        text = next(r["body"]["text"] for r in hook.answered if r["body"]["kind"] == "needs_person")
        assert text.startswith("tpuwatch pod (node pod, us-central2-b): needs a person: ") and "deleted" in text, text
