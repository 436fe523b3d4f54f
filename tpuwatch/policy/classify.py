"""How an attempt ended: success, disruption, fail-fast, failed start or failure.

One small pure function, `classify`, over the facts of one attempt, and the table `OUTCOMES`
saying what each outcome costs. The rules, first match wins:

0. notice       a worker's metadata server gave notice of maintenance or preemption during the
                attempt (the relay beside the job passed it on, `notice_evidence`): a disruption,
                never charged and never a success, even when worker 0 exited 0 (a job that saves
                on SIGTERM and ends its loop exits 0 with its work unfinished);
0b. terminated  a worker's attempt got a SIGTERM that neither tpuwatch's stop nor the relay sent
                (`term_evidence`: the guest shutting down before its notice) and other evidence
                (rule 2's) is in the window: a disruption, even when worker 0 exited 0. That
                SIGTERM alone is no evidence: with nothing else the rules below judge the end;
1. success      the primary worker (worker 0) exited 0;
2. disruption   evidence in the attempt's window: a terminate/restart audit event, a health or
                state change, a node-id change, PREEMPTED/TERMINATED, a symptom, maintenance
                ONGOING, the node gone. Never charged: the infrastructure ended it;
3. fail_fast    some worker exited with a code in fail_fast_exit_codes: the job fails at once;
4. failed_start the attempt lived less than min_uptime: charged;
5. failure      any other non-zero exit, whatever its code: charged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from tpuwatch.durations import human
from tpuwatch.policy.state import Evidence

# Codes a worker reports after tpuwatch itself stopped it (SIGTERM, SIGKILL, as 128+n or -n).
# They name an end only when nothing else does: the worker that failed first is the story.
STOP_CODES = frozenset({143, 137, -15, -9})
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
           9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


class Outcome(str, Enum):
    SUCCESS = "success"
    DISRUPTION = "disruption"
    FAIL_FAST = "fail_fast"
    FAILED_START = "failed_start"
    FAILURE = "failure"


@dataclass(frozen=True)
class Cost:
    """What an outcome costs the job: whether it is charged to max_restarts."""

    charged: bool


OUTCOMES: dict[Outcome, Cost] = {
    Outcome.SUCCESS: Cost(charged=False),
    Outcome.DISRUPTION: Cost(charged=False),
    Outcome.FAIL_FAST: Cost(charged=False),
    Outcome.FAILED_START: Cost(charged=True),
    Outcome.FAILURE: Cost(charged=True),
}


@dataclass(frozen=True)
class AttemptFacts:
    """What is known when an attempt ends."""

    start: datetime
    end: datetime
    # worker -> exit code; None when the worker's process is gone with no code (lost, unreachable)
    exit_codes: Mapping[int, int | None]
    primary: int  # the worker whose exit 0 means success (worker 0)
    evidence: tuple[Evidence, ...]
    # when a tick first saw the end, if an earlier tick than the one classifying it (`end`):
    # the attempt's run time counts to then; evidence counts up to `end`
    seen: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    exit_code: int | None  # the code that names this end
    reason: str  # one line, for people
    evidence: tuple[str, ...]  # what the reason rests on


# How a notice reads as evidence: the relay's notice is the one kind of evidence that outranks an exit 0.
NOTICE_EVIDENCE = "notice "
NOTICE_TEXT = {"TERMINATE_ON_HOST_MAINTENANCE": "maintenance (TERMINATE_ON_HOST_MAINTENANCE)",
               "PREEMPTED": "preemption (preempted TRUE)",
               "MAINTENANCE_ONGOING": "maintenance (upcoming-maintenance ONGOING)"}


def notice_evidence(time: datetime, notice: str, worker: int) -> Evidence:
    """The evidence for a notice the relay passed to the job on `worker` (a model.NOTICES value)."""
    return Evidence(time, f"{NOTICE_EVIDENCE}of {NOTICE_TEXT.get(notice, notice)} on worker {worker}")


def stop_notice_evidence(time: datetime, what: str) -> Evidence:
    """The evidence for a Compute Engine VM the API shows PENDING_STOP (a Spot preemption's
    notice): a notice like the relay's, whoever sees it first."""
    return Evidence(time, f"{NOTICE_EVIDENCE}of a stop (shutdownDetails PENDING_STOP) on the {what}")


def is_notice(ev: Evidence) -> bool:
    return ev.what.startswith(NOTICE_EVIDENCE)


# How a SIGTERM from outside tpuwatch reads as evidence: it lets other evidence outrank an exit 0.
TERM_EVIDENCE = "SIGTERM from outside tpuwatch "


def term_evidence(time: datetime, worker: int) -> Evidence:
    """The attempt on `worker` got a SIGTERM that neither tpuwatch's stop nor the relay sent."""
    return Evidence(time, f"{TERM_EVIDENCE}on worker {worker} (not its stop, not a relayed notice)")


def is_term(ev: Evidence) -> bool:
    return ev.what.startswith(TERM_EVIDENCE)


def in_window(t: datetime, start: datetime, end: datetime, window: float) -> bool:
    """True when `t` falls in the attempt and at most `window` seconds before its end.

    The window keeps a maintenance event that the job survived at hour 1 from excusing a crash
    at hour 10.
    """
    return start <= t <= end and (end - t).total_seconds() <= window


def describe_exit(code: int | None) -> str:
    """`exit code 139 (SIGSEGV)`, `exit code 1`, `no exit code`."""
    if code is None:
        return "no exit code"
    signal = SIGNALS.get(code - 128) if code > 128 else SIGNALS.get(-code) if code < 0 else None
    return f"exit code {code} ({signal})" if signal else f"exit code {code}"


def naming_code(exit_codes: Mapping[int, int | None]) -> tuple[int | None, int | None]:
    """(worker, code) that best names a failed end: a non-zero code tpuwatch's stop did not cause."""
    failed = [(w, c) for w, c in sorted(exit_codes.items()) if c != 0]
    for w, c in failed:
        if c is not None and c not in STOP_CODES:
            return w, c
    for w, c in failed:
        if c is not None:
            return w, c
    return (failed[0][0], None) if failed else (None, None)


def classify(
    facts: AttemptFacts,
    *,
    min_uptime: float,
    fail_fast: frozenset[int],
    window: float,
) -> Verdict:
    """The outcome of one ended attempt (rules in the module docstring, first match wins)."""
    ran = max(0.0, ((facts.seen or facts.end) - facts.start).total_seconds())
    worker, code = naming_code(facts.exit_codes)
    which = f"worker {worker} {describe_exit(code)}" if worker is not None else "the attempt ended"
    notices = tuple(f"{e.what} at {e.time.isoformat()}" for e in facts.evidence
                    if is_notice(e) and facts.start <= e.time <= facts.end)
    if worker is None and facts.exit_codes.get(facts.primary) == 0:
        which, code = f"worker {facts.primary} exited 0", 0  # what a disruption that outranks it names
    if notices:
        return Verdict(Outcome.DISRUPTION, code, f"{which} after the {notices[0]}", notices)
    signs = tuple(
        f"{e.what} at {e.time.isoformat()}"
        for e in facts.evidence
        if in_window(e.time, facts.start, facts.end, window) and not is_term(e)
    )
    terms = tuple(f"{e.what} at {e.time.isoformat()}" for e in facts.evidence
                  if is_term(e) and facts.start <= e.time <= facts.end)
    if terms and signs:
        return Verdict(Outcome.DISRUPTION, code, f"{which} after a {terms[0]}, ended by a disruption ({signs[-1]})",
                       (*terms, *signs))
    if facts.exit_codes.get(facts.primary) == 0:
        return Verdict(Outcome.SUCCESS, 0, f"worker {facts.primary} exited 0", ())
    if signs:
        return Verdict(Outcome.DISRUPTION, code, f"{which}, ended by a disruption ({signs[-1]})", signs)
    fatal = sorted(c for c in facts.exit_codes.values() if c is not None and c in fail_fast)
    if fatal:
        return Verdict(
            Outcome.FAIL_FAST, fatal[0],
            f"{which}; {describe_exit(fatal[0])} is in recovery.fail_fast_exit_codes", (),
        )
    if ran < min_uptime:
        return Verdict(
            Outcome.FAILED_START, code,
            f"{which} after {human(ran)}, before recovery.min_uptime ({human(min_uptime)}): a failed start", (),
        )
    return Verdict(Outcome.FAILURE, code, f"{which} after {human(ran)} with no disruption in sight", ())
