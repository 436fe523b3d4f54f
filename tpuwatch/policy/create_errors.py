"""What a failed create means, as data: queued like a stockout, a zone to fall back from, or fatal.

Google answers a create it cannot serve with a google.rpc code and its own text; the code
alone does not say enough ("Insufficient reserved capacity" comes with code 9 and with code
8), so each rule matches a code and, where needed, a phrase of the text. The first rule that
matches decides; no rule matching is fatal, shown as the API said it. tpuwatch.recreate reads
the code from the error or operation (it knows the API's error types; this module does not)
and asks `classify`; the rows `no_capacity`, `queue_retry` and `create_failed` act on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["queueable", "exists", "fatal"]


@dataclass(frozen=True)
class CreateRule:
    """One class of create error."""

    reason: str  # no_capacity, quota, reservation, unavailable, already_exists, other
    codes: frozenset[str]  # google.rpc code names it applies to
    kind: Kind  # queueable: retried later and elsewhere; exists: ours already; fatal: stop
    phrase: str = ""  # a phrase the API's text must hold (lower case; "" = any text)
    # whether the next of tpu.fallback_zones is tried once this zone has had its turn
    # (recovery.queue_timeout for `watch`, one try for `tpuwatch recreate`)
    falls_back: bool = False
    # a create tpuwatch itself started meeting this: its own earlier create made the node
    ours: Kind | None = None
    what: str = ""  # how people are told, in a zone ("{zone}")
    shortfall: str = ""  # what a queued create is waiting out (row `no_capacity`)


def _codes(*names: str) -> frozenset[str]:
    return frozenset(names)


# In order: the first match decides.
CREATE_RULES: tuple[CreateRule, ...] = (
    CreateRule("reservation", _codes("RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"), "queueable",
               "reserved capacity", falls_back=True, what="not enough reserved capacity in {zone}",
               shortfall="reservation shortfall (not enough reserved capacity)"),
    CreateRule("quota", _codes("RESOURCE_EXHAUSTED"), "queueable", "quota", falls_back=True,
               what="out of quota in {zone}", shortfall="out of quota"),
    # "There is no more capacity in the zone ..."; any other exhaustion of a create is also a
    # shortage that may end, and queue_timeout bounds how long it is waited for.
    CreateRule("no_capacity", _codes("RESOURCE_EXHAUSTED"), "queueable", falls_back=True,
               what="no capacity in {zone}", shortfall="no capacity"),
    CreateRule("unavailable", _codes("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED"), "queueable", falls_back=True,
               what="the create in {zone} failed for a transient reason",
               shortfall="create failed for a transient reason"),
    CreateRule("unavailable", _codes("INTERNAL"), "queueable", "try again", falls_back=True,
               what="the create in {zone} failed for a transient reason",
               shortfall="create failed for a transient reason"),
    CreateRule("already_exists", _codes("ALREADY_EXISTS"), "fatal", ours="exists",
               what="a node of that name already exists and tpuwatch did not create it"),
)
OTHER = CreateRule("other", frozenset(), "fatal", what="the create in {zone} failed")

# What a queued create failure is called, by its reason (row `no_capacity`).
SHORTFALLS = {r.reason: r.shortfall for r in CREATE_RULES if r.shortfall}

# How HTTP statuses and REST names read as google.rpc code names.
CODE_ALIASES = {"429": "RESOURCE_EXHAUSTED", "TOO_MANY_REQUESTS": "RESOURCE_EXHAUSTED", "409": "ALREADY_EXISTS",
                "CONFLICT": "ALREADY_EXISTS"}


def rule_for(code: str, message: str) -> CreateRule:
    """The rule a failed create's google.rpc code name and text fall under (OTHER when none)."""
    name = CODE_ALIASES.get(code.upper(), code.upper())
    low = (message or "").lower()
    return next((r for r in CREATE_RULES if name in r.codes and r.phrase in low), OTHER)


def kind_of(rule: CreateRule, *, started_by_us: bool) -> Kind:
    """What to do about it: `ours` when tpuwatch started the create, else `kind`."""
    return rule.ours if started_by_us and rule.ours is not None else rule.kind
