"""The subset of the Cloud Logging query language the simulator's ListLogEntries understands.

Supported: comparisons `field = != : > >= < <= =~ !~ value` with quoted or bare values and
value groups `field=("a" OR "b")`; bare quoted strings as global text search (`"tpu.nodes.terminate"`);
conjunction by `AND` or juxtaposition; `OR`; `NOT` / leading `-`; parentheses. As in Cloud
Logging, OR binds tighter than AND (`a OR b AND c` is `(a OR b) AND c`). Timestamps compare
as RFC 3339 instants with nanosecond precision. A filter outside the subset raises
`FilterError` naming the token, which the API turns into INVALID_ARGUMENT.

This module knows nothing of gRPC or of how entries are stored: it evaluates a filter against a
flat `{field path: value}` mapping.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FieldValue = str | int

EXACT_FIELDS = frozenset(
    {
        "logName",
        "timestamp",
        "receiveTimestamp",
        "insertId",
        "severity",
        "resource.type",
        "protoPayload.@type",
        "protoPayload.methodName",
        "protoPayload.resourceName",
        "protoPayload.serviceName",
    }
)
PREFIX_FIELDS = ("resource.labels.", "protoPayload.metadata.", "labels.")
TIME_FIELDS = frozenset({"timestamp", "receiveTimestamp"})
SEVERITIES = {
    "DEFAULT": 0,
    "DEBUG": 100,
    "INFO": 200,
    "NOTICE": 300,
    "WARNING": 400,
    "ERROR": 500,
    "CRITICAL": 600,
    "ALERT": 700,
    "EMERGENCY": 800,
}
OPERATORS = (">=", "<=", "!=", "=~", "!~", "=", ":", ">", "<")

_RFC3339 = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)$"
)
_FIELD_CHARS = re.compile(r"[A-Za-z_@][A-Za-z0-9_.@/\-]*")


class FilterError(ValueError):
    """The filter is outside the supported subset; the message names the token."""


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch for an RFC 3339 time; ValueError when it is not one."""
    m = _RFC3339.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    secs = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    if tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        secs -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    nanos = int((frac or "").ljust(9, "0")) if frac else 0
    return secs * 1_000_000_000 + nanos


# --- the tree -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cmp:
    field: str
    op: str
    values: tuple[FieldValue, ...]  # several values are OR-ed: field=("a" OR "b")

    def matches(self, fields: Mapping[str, FieldValue]) -> bool:
        have = fields.get(self.field)
        if have is None:
            return self.op in ("!=", "!~")
        if self.op == "!=":
            return all(not _compare(self.field, "=", have, v) for v in self.values)
        if self.op == "!~":
            return all(not _compare(self.field, "=~", have, v) for v in self.values)
        return any(_compare(self.field, self.op, have, v) for v in self.values)


@dataclass(frozen=True)
class Text:
    text: str

    def matches(self, fields: Mapping[str, FieldValue]) -> bool:
        needle = self.text.lower()
        return any(isinstance(v, str) and needle in v.lower() for v in fields.values())


@dataclass(frozen=True)
class And:
    items: tuple[Node, ...]

    def matches(self, fields: Mapping[str, FieldValue]) -> bool:
        return all(i.matches(fields) for i in self.items)


@dataclass(frozen=True)
class Or:
    items: tuple[Node, ...]

    def matches(self, fields: Mapping[str, FieldValue]) -> bool:
        return any(i.matches(fields) for i in self.items)


@dataclass(frozen=True)
class Not:
    item: Node

    def matches(self, fields: Mapping[str, FieldValue]) -> bool:
        return not self.item.matches(fields)


Node = Cmp | Text | And | Or | Not


def _compare(field: str, op: str, have: FieldValue, want: FieldValue) -> bool:
    if field == "severity" and isinstance(have, str) and isinstance(want, str):
        a, b = SEVERITIES.get(have.upper(), -1), SEVERITIES.get(want.upper(), -1)
        return _order(op, a, b) if op not in (":", "=~") else want.upper() in have.upper()
    if isinstance(have, int) and isinstance(want, int):
        return _order(op, have, want)
    h, w = str(have), str(want)
    if op == ":":
        return w.lower() in h.lower()
    if op == "=~":
        return re.search(w, h) is not None
    return _order(op, h, w)


def _order(op: str, a: object, b: object) -> bool:
    if op == "=":
        return a == b
    if op == ":":
        return a == b
    if op == ">":
        return a > b  # type: ignore[operator]
    if op == ">=":
        return a >= b  # type: ignore[operator]
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    raise FilterError(f"operator {op!r} is not supported here")


# --- the parser ---------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def error(self, what: str) -> FilterError:
        return FilterError(f"{what} at position {self.i} of filter {self.s!r}")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def keyword(self, word: str) -> bool:
        """Consume `word` (AND/OR/NOT) when it stands alone here."""
        self.ws()
        end = self.i + len(word)
        if self.s.startswith(word, self.i) and (end >= len(self.s) or self.s[end] in ' \t\r\n()"'):
            self.i = end
            return True
        return False

    def parse(self) -> Node:
        if self.at_end():
            return And(())
        node = self.conj()
        if not self.at_end():
            raise self.error(f"unexpected {self._token()!r}")
        return node

    def _token(self) -> str:
        m = re.compile(r"\S+").match(self.s, self.i)
        return m.group(0) if m else ""

    def conj(self) -> Node:
        items = [self.disj()]
        while True:
            if self.keyword("AND"):
                items.append(self.disj())
                continue
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] == ")" or self._peek_keyword("OR"):
                break
            items.append(self.disj())  # juxtaposition is AND
        return items[0] if len(items) == 1 else And(tuple(items))

    def _peek_keyword(self, word: str) -> bool:
        save = self.i
        hit = self.keyword(word)
        self.i = save
        return hit

    def disj(self) -> Node:
        items = [self.unary()]
        while self.keyword("OR"):
            items.append(self.unary())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def unary(self) -> Node:
        if self.keyword("NOT"):
            return Not(self.unary())
        self.ws()
        if self.s.startswith("-", self.i):
            self.i += 1
            return Not(self.unary())
        return self.primary()

    def primary(self) -> Node:
        self.ws()
        if self.i >= len(self.s):
            raise self.error("filter ends where a term was expected")
        c = self.s[self.i]
        if c == "(":
            self.i += 1
            node = self.conj()
            self.ws()
            if not self.s.startswith(")", self.i):
                raise self.error("missing ')'")
            self.i += 1
            return node
        if c == '"':
            return Text(self.string())
        for word in ("AND", "OR"):
            if self._peek_keyword(word):
                raise self.error(f"{word} where a term was expected")
        m = _FIELD_CHARS.match(self.s, self.i)
        if not m:
            raise self.error(f"unexpected {self._token()!r}")
        start = self.i
        self.i = m.end()
        name = m.group(0)
        op = self.operator()
        if op is None:
            # A bare word is a global text search, like a quoted string.
            return Text(name)
        self.check_field(name, op, start)
        return Cmp(name, op, self.values(name, op))

    def operator(self) -> str | None:
        self.ws()
        for op in OPERATORS:
            if self.s.startswith(op, self.i):
                self.i += len(op)
                return op
        return None

    def check_field(self, name: str, op: str, start: int) -> None:
        if name not in EXACT_FIELDS and not name.startswith(PREFIX_FIELDS):
            self.i = start
            raise self.error(
                f"unsupported field {name!r} (the simulator knows {', '.join(sorted(EXACT_FIELDS))}, "
                f"{'*, '.join(PREFIX_FIELDS)}*)"
            )
        if name in TIME_FIELDS and op in (":", "=~", "!~"):
            raise self.error(f"operator {op!r} is not supported on {name}")

    def values(self, name: str, op: str) -> tuple[FieldValue, ...]:
        self.ws()
        raw: list[str] = []
        if self.s.startswith("(", self.i):
            self.i += 1
            raw.append(self.value())
            while self.keyword("OR"):
                raw.append(self.value())
            self.ws()
            if not self.s.startswith(")", self.i):
                raise self.error(f"expected OR or ')' in the value list of {name}")
            self.i += 1
        else:
            raw.append(self.value())
        if name in TIME_FIELDS:
            out: list[FieldValue] = []
            for v in raw:
                try:
                    out.append(parse_rfc3339_ns(v))
                except ValueError:
                    raise self.error(f"{name} needs an RFC 3339 time, got {v!r}")
            return tuple(out)
        return tuple(raw)

    def value(self) -> str:
        self.ws()
        if self.s.startswith('"', self.i):
            return self.string()
        m = re.compile(r'[^\s()"]+').match(self.s, self.i)
        if not m:
            raise self.error("expected a value")
        self.i = m.end()
        return m.group(0)

    def string(self) -> str:
        assert self.s[self.i] == '"'
        self.i += 1
        out: list[str] = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == '"':
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        raise self.error("unterminated string")


def parse(text: str) -> Node:
    """The filter's tree; an empty filter matches everything."""
    return _Parser(text).parse()


def select(node: Node, rows: Sequence[Mapping[str, FieldValue]]) -> list[int]:
    """Indexes of the rows the filter matches."""
    return [i for i, r in enumerate(rows) if node.matches(r)]
