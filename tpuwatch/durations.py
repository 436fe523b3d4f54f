"""Durations as users write them (`90s`, `5m`, `2h`, `1d`, `1h30m`) and as people read them."""

from __future__ import annotations

import re

from tpuwatch.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+$")


def parse_duration(text: object, *, key: str = "duration", allow_zero: bool = True) -> float:
    """Seconds in `text`; raises ConfigError naming `key` when it is not a duration."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ConfigError(f"{key}: expected a duration such as \"90s\", \"5m\" or \"2h\", got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        compact = text.strip().lower().replace(" ", "")
        if not _WHOLE.match(compact):
            raise ConfigError(
                f"{key}: {text!r} is not a duration; write a number with a unit, "
                "such as \"90s\", \"5m\", \"2h\" or \"1h30m\""
            )
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(compact))
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ConfigError(f"{key}: {text!r} must be a positive duration")
    if not allow_zero and seconds == 0:
        raise ConfigError(f"{key}: must be longer than zero")
    return seconds


def human(seconds: float | None) -> str:
    """`3m12s`, `2h05m`, `4d03h`, `850ms`; `-` when unknown."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{int(s * 1000)}ms" if s > 0 else "0s"
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{sign}{d}d{h:02d}h"
    if h:
        return f"{sign}{h}h{m:02d}m"
    if m:
        return f"{sign}{m}m{sec:02d}s"
    return f"{sign}{sec}s"
