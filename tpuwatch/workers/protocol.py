"""The worker-side protocol from tpuwatch's side: what is sent to a worker and what it answers.

Holds the command template rendering (placeholders substituted shell-quoted), the text sent to
a worker's REMOTE_COMMAND (remote.sh behind a preamble of quoted TW_* assignments, in one
`{ ... }` group, `framed` by its length so that a truncated upload runs nothing), and the
parsers of remote.sh's `@tpuwatch key=value` answers into model values.

Everything user-supplied (command, checkpoint path, env values) reaches the remote bash only as
a `shlex.quote`d word of the preamble, so the remote shell never parses it as code.
This module knows nothing of SSH, nodes or the cloud: strings in, bytes out, bytes in, values out.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from tpuwatch.config import PLACEHOLDERS
from tpuwatch.errors import ConfigError, UsageError
from tpuwatch.model import (
    NOTICES,
    Checkpoint,
    LaunchOutcome,
    LaunchResult,
    StopResult,
    WorkerProbe,
    WorkerState,
)

# What runs on the worker: bash reads a `framed` script from its stdin in one go and runs it;
# the rest of stdin stays the script's (a follow channel's requests). `bash -s` reads a pipe
# one byte at a time so as not to take what follows: ~5 ms of a worker's CPU per call for the
# 37 KB of remote.sh. LC_ALL=C: the frame counts bytes, not characters.
REMOTE_COMMAND = """bash -c 'IFS= read -r TW_LEN && LC_ALL=C IFS= read -r -N "$TW_LEN" TW_SCRIPT && eval "$TW_SCRIPT"'"""
MARK = "@tpuwatch "
LOG_MATCH_MAX = 400  # characters kept of a log line that matched a signature (remote.sh cuts it too)
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@lru_cache(maxsize=2)
def packaged(name: str) -> str:
    """The text of a worker-side script as shipped in the package, behind the shared process
    helpers (procs.sh) it uses."""
    files = resources.files("tpuwatch.workers")
    return files.joinpath("procs.sh").read_text(encoding="utf-8") + "\n" + files.joinpath(name).read_text(encoding="utf-8")


# Whole-line comments stay home: bash lexes every byte a worker is sent (about 0.06 ms of CPU a
# KB, on every call) and a third of remote.sh is comments. A comment after code stays.
_COMMENT_LINE = re.compile(r"^[ \t]*#.*\n", re.M)


def uncommented(text: str) -> str:
    """`text` without its whole-line comments (`# ...` lines; bash itself ignores them)."""
    return _COMMENT_LINE.sub("", text)


@lru_cache(maxsize=1)
def remote_script() -> str:
    """remote.sh (probe, launch, stop, follow) as it runs on a worker: without its whole-line
    comments (`uncommented`)."""
    return uncommented(packaged("remote.sh"))


# A function of the worker-side scripts: `tw_name() {` at the start of a line to the first `}`
# alone at the start of one (the scripts' style; a nested function is indented).
_FUNCTION = re.compile(r"^(tw_[a-z0-9_]+)\(\) \{[^\n]*\n.*?^\}\n", re.M | re.S)
_NAME = re.compile(r"\btw_[a-z0-9_]+\b")


@lru_cache(maxsize=8)
def trimmed_script(action: str) -> str:
    """remote.sh without the functions `tw_<action>` never reaches (tw_main stays, as the entry).

    bash parses every function a script defines before it runs any: the whole of remote.sh
    costs a worker ~1.3 ms of CPU more than what a probe needs, on every probe over SSH.
    """
    text = remote_script()
    blocks = {m.group(1): m for m in _FUNCTION.finditer(text)}
    keep, todo = {"tw_main"}, [f"tw_{action}"]
    while todo:
        name = todo.pop()
        if name in keep or name not in blocks:
            continue
        keep.add(name)
        todo.extend(_NAME.findall(blocks[name].group(0)))
    out, at = [], 0
    for name, m in blocks.items():
        if name not in keep:
            out.append(text[at:m.start()])
            at = m.end()
    return "".join(out) + text[at:]


# ---- the command template -------------------------------------------------------------------


def _fields(template: str, key: str) -> list[tuple[str, str | None]]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}; write a literal brace as {{{{ or }}}}") from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conv in parsed:
        if name is not None and (name not in PLACEHOLDERS or spec or conv):
            shown = name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
            raise ConfigError(
                f"{key}: unknown placeholder {{{shown}}}; use "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                + " (write a literal brace as {{ or }})"
            )
        out.append((literal, name))
    return out


_WORD_BREAK = " \t\n;&|()<>"


def _lex(text: str, state: str, after_word: bool = False) -> str:
    """Shell state after `text`, from `state`.

    "" plain, "'" or '"' inside quotes, "\\" a backslash waiting to escape the next character,
    "#" inside a comment, "<<" after a here-document operator (its body is not plain words).
    """
    i = 0
    while i < len(text):
        c = text[i]
        if state == "<<":
            return state
        if state == "#":
            if c == "\n":
                state = ""
        elif state == "\\":
            state = ""
        elif state == "'":
            if c == "'":
                state = ""
        elif state == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                state = ""
        elif c == "\\":
            state = "\\"
        elif c in "'\"":
            state = c
        elif c == "#" and (i == 0 and not after_word or i > 0 and text[i - 1] in _WORD_BREAK):
            state = "#"
        elif c == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
            state = "<<"
        elif c == "<" and text.startswith("<<<", i):
            i += 2
        i += 1
    return state


_WHERE = {
    "'": "inside single quotes",
    '"': "inside double quotes",
    "\\": "right after a backslash",
    "#": "inside a # comment",
    "<<": "after a here-document (<<)",
}


def check_template(template: str, key: str = "job.command") -> None:
    """ConfigError for an unknown placeholder, or one where a quoted word is not one word.

    A placeholder becomes an already-quoted shell word. Inside '...' or "..." those quotes
    would become part of the value; after a backslash, in a comment or in a here-document the
    quoting would not hold. Such templates are refused with the fix.
    """
    state = ""
    after_word = False
    for literal, name in _fields(template, key):
        state = _lex(literal, state, after_word and not literal.startswith(tuple(_WORD_BREAK)))
        if name is not None and state:
            raise ConfigError(
                f"{key}: {{{name}}} is {_WHERE[state]}; write it bare as its own word or part of "
                f"one (tpuwatch substitutes it already shell-quoted), e.g. --resume={{{name}}}"
            )
        after_word = name is not None


def render_command(
    template: str, *, checkpoint: str, step: int | None, attempt: int, worker: int,
    key: str = "job.command", slice: int = 0, slices: int = 1,
) -> str:
    """The command for one worker: each placeholder becomes one shell word holding its value."""
    check_template(template, key)
    values = {
        "checkpoint": checkpoint,
        "step": "" if step is None else str(step),
        "attempt": str(attempt),
        "worker": str(worker),
        "slice": str(slice),
        "num_slices": str(slices),
    }
    parts = []
    for literal, name in _fields(template, key):
        parts.append(literal)
        if name is not None:
            parts.append(shlex.quote(values[name]))
    return "".join(parts)


# ---- what is sent ---------------------------------------------------------------------------


def _word(name: str, value: str) -> str:
    if "\x00" in value:
        raise UsageError(f"{name}: contains a NUL character, which cannot be passed to a command")
    return shlex.quote(value)


Value = str | int | float | list[str]


def wrap(body: str, job: str, inputs: Mapping[str, tuple[str, Value]]) -> bytes:
    """`body` behind `TW_JOB` and `TW_<NAME>=<quoted>` assignments, as one `{ ... }` group, so a
    truncated upload runs nothing. `inputs` maps NAME to (the key to name in an error, value);
    a list becomes a bash array. Every value reaches bash only as a quoted word."""
    if not _JOB.match(job):
        raise UsageError(f"job.name: {job!r} cannot name a directory on the workers")
    lines = ["{", f"TW_JOB={_word('job.name', job)}"]
    for name, (key, value) in inputs.items():
        if isinstance(value, list):
            lines.append(f"TW_{name.upper()}=(" + " ".join(_word(key, v) for v in value) + ")")
        else:
            lines.append(f"TW_{name.upper()}={_word(key, str(value))}")
    lines.append(body.rstrip("\n"))
    lines.append("}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def framed(script: bytes) -> bytes:
    """`script` as REMOTE_COMMAND reads it: its length in bytes on a line of its own, then the
    script. A script cut short is never run (the read fails)."""
    return b"%d\n" % len(script) + script


def env_pairs(env: Mapping[str, str] | None) -> list[str]:
    """[job] env as NAME=value words; ConfigError naming a key that is not a variable name."""
    pairs = []
    for name, value in (env or {}).items():
        if not _ENV_NAME.match(name):
            raise ConfigError(f"job.env.{name}: not a valid environment variable name")
        pairs.append(f"{name}={value}")
    return pairs


def script(action: str, job: str, **values: Value) -> bytes:
    """remote.sh for one action, behind its `TW_*=<quoted>` inputs. A probe's carries only
    the functions a probe runs (`trimmed_script`)."""
    body = trimmed_script(action) if action == "probe" else remote_script()
    return wrap(body, job, {"action": ("action", action), **{k: (k, v) for k, v in values.items()}})


def probe_script(job: str, checkpoint_dir: str = "", patterns: Sequence[str] = ()) -> bytes:
    """The probe; with `checkpoint_dir` (a local path) it also lists that directory; `patterns`
    (extended regular expressions) are searched in the new bytes of the attempt's log."""
    return script("probe", job, **_probe_inputs(checkpoint_dir, patterns))


def _probe_inputs(checkpoint_dir: str, patterns: Sequence[str]) -> dict[str, Value]:
    out: dict[str, Value] = {"ckpt_dir": checkpoint_dir} if checkpoint_dir else {}
    if patterns:
        out["sigs"] = list(patterns)
    return out


def launch_script(
    job: str, *, attempt: int, worker: int, checkpoint: Checkpoint | None, command: str,
    env: Mapping[str, str] | None = None, clean_grace: float | None = None, notify_signal: str = "SIGTERM",
    slice: int = 0, slices: int = 1, libtpu_args: Sequence[str] = (), then_wait: float | None = None,
    checkpoint_dir: str = "", patterns: Sequence[str] = (),
) -> bytes:
    """Launch `command` (already rendered for this worker) as attempt `attempt`; `worker` is its
    id within its slice `slice` of `slices`.

    With `then_wait` (the wait's poll, seconds) the session goes on as the attempt's follow
    channel once the launch has answered: a `launch_end` line, then what `wait_script` answers,
    with `checkpoint_dir` and `patterns` as there (stdin stays open for its requests).

    With `clean_grace`, the worker first stops what an older attempt left (as `stop_script`
    does, with that grace) in the same connection: one SSH round trip instead of two.
    `notify_signal` ("" for none) is what the relay beside the job sends it on a maintenance
    or preemption notice from the metadata server. `libtpu_args` are appended on the worker to
    the LIBTPU_INIT_ARGS the job gets (from `env`, else the login's), each only when that value
    does not name its flag already.
    """
    extra: dict[str, str | int | float | list[str]] = {"notify": notify_signal.removeprefix("SIG")}
    if slices > 1:
        extra.update(slice=slice, slices=slices)
    if clean_grace is not None:
        extra["clean_ms"] = max(0, int(clean_grace * 1000))
    if libtpu_args:
        extra["libtpu_add"] = list(libtpu_args)
    if then_wait is not None:
        extra.update(then_wait="1", poll=f"{then_wait:g}", **_probe_inputs(checkpoint_dir, patterns))
    return script(
        "launch", job, attempt=attempt, worker=worker,
        checkpoint=checkpoint.path if checkpoint else "",
        step="" if checkpoint is None else str(checkpoint.step),
        command=command, env=env_pairs(env), **extra,
    )


def stop_script(job: str, grace: float, *, detach: bool = False) -> bytes:
    """TERM the attempt's processes, KILL them after `grace`; with `detach`, answer right after
    the TERM and leave the KILL to a detached process on the worker."""
    if detach:
        return script("stop", job, grace_ms=max(0, int(grace * 1000)), detach=1)
    return script("stop", job, grace_ms=max(0, int(grace * 1000)))


def follow_script(job: str, attempt: int, offset: int = 0, poll: float = 0.2) -> bytes:
    return script("follow", job, attempt=attempt, offset=max(0, offset), poll=f"{poll:g}")


def wait_script(job: str, attempt: int, poll: float = 1.0, checkpoint_dir: str = "",
                patterns: Sequence[str] = ()) -> bytes:
    """Block until `attempt` ends on the worker (remote.sh `wait`), answering as `parse_wait` reads.

    Until then it answers `probe_request` lines sent on its stdin (which stays open) with the
    probe's records framed by `probe_begin`/`probe_end` lines (`WaitReader`); a request for the
    listing lists `checkpoint_dir`.
    """
    return script("wait", job, attempt=attempt, poll=f"{poll:g}", **_probe_inputs(checkpoint_dir, patterns))


LAUNCH_END = MARK + "launch_end="  # a launch that goes on as a follow channel: its answer ends here


def split_launch(stdout: bytes) -> tuple[bytes, bytes] | None:
    """A launch-then-wait session's stdout so far: (the launch's answer, what follows its
    `launch_end` line), or None while that line has not come."""
    mark = LAUNCH_END.encode()
    if stdout.startswith(mark):
        at = 0
    elif (line := stdout.find(b"\n" + mark)) >= 0:
        at = line + 1
    else:
        return None
    end = stdout.find(b"\n", at)
    return None if end < 0 else (stdout[:at], stdout[end + 1:])


def probe_request(seq: int, listing: bool = False) -> bytes:
    """The line that asks a wait channel for a probe, answered under the number `seq`."""
    return f"probe {seq} {1 if listing else 0}\n".encode("ascii")


# ---- what comes back ------------------------------------------------------------------------


def parse_records(text: str) -> dict[str, str]:
    """The `@tpuwatch key=value` lines of an answer (last one wins); other lines are ignored."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(MARK):
            key, _, value = line[len(MARK):].partition("=")
            out[key.strip()] = value
    return out


def _int(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    return int(value.strip())


def parse_probe(worker: int, records: Mapping[str, str]) -> WorkerProbe:
    """A probe answer as a WorkerProbe; a garbled answer is "unreachable" with the reason."""
    state = records.get("state", "")
    if records.get("result") != "ok" or state not in ("running", "exited", "absent"):
        detail = records.get("detail") or "no answer from the worker-side script"
        return WorkerProbe(worker=worker, state="unreachable", detail=detail)
    typed: WorkerState = state  # type: ignore[assignment]
    return WorkerProbe(
        worker=worker,
        state=typed,
        attempt=_int(records.get("attempt")),
        exit_code=_int(records.get("exit_code")),
        pid=_int(records.get("pid")),
        detail=records.get("detail", ""),
        lingering=records.get("lingering") == "1",
        log_bytes=_int(records.get("log_bytes")),
        log_age=_int(records.get("log_age")),
        log_match=records.get("log_match", "")[:LOG_MATCH_MAX],
        checkpoint_listing=records.get("ckpt_listing") or (
            json.dumps({"error": records["ckpt_error"]}) if records.get("ckpt_error") else ""),
        notice=records.get("notice", "") if records.get("notice", "") in NOTICES else "",
        foreign_term=records.get("sigterm") == "foreign",
    )


_OUTCOMES = ("launched", "running", "ran", "busy", "newer", "error")


def parse_launch(worker: int, records: Mapping[str, str]) -> LaunchResult:
    result = records.get("result", "")
    if result not in _OUTCOMES:
        return LaunchResult(worker, "error", detail=records.get("detail") or "no answer from the worker-side script")
    outcome: LaunchOutcome = result  # type: ignore[assignment]
    cleaned = {k[len("cleanup_"):]: v for k, v in records.items() if k.startswith("cleanup_")}
    return LaunchResult(
        worker=worker,
        outcome=outcome,
        attempt=_int(records.get("attempt")),
        pid=_int(records.get("pid")),
        exit_code=_int(records.get("exit_code")),
        detail=records.get("detail", ""),
        cleanup=parse_stop(worker, cleaned) if cleaned else None,
    )


def _pids(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in (text or "").split() if p.isdigit())


def parse_stop(worker: int, records: Mapping[str, str]) -> StopResult:
    result = records.get("result", "")
    if result not in ("ok", "leftover"):
        return StopResult(worker, ok=False, detail=records.get("detail") or "no answer from the worker-side script")
    return StopResult(
        worker=worker,
        ok=result == "ok",
        stopped=_pids(records.get("stopped")),
        device_holders=_pids(records.get("device_holders")),
        libtpu_lockfile=records.get("libtpu_lockfile", "absent"),
        leftover=_pids(records.get("leftover")),
        device_scan=records.get("device_scan", ""),
        killed=_pids(records.get("killed")),
        stopping=_pids(records.get("stopping")),
        grace=int(records.get("grace_ms") or 0) / 1000 if (records.get("grace_ms") or "").isdigit() else 0.0,
    )


@dataclass(frozen=True)
class FollowEnd:
    """How a log stream ended: the attempt's exit code, or why there is none."""

    result: str  # ok, replaced, gone, error, "" (the stream broke: reconnect)
    exit_code: int | None = None
    attempt: int | None = None
    detail: str = ""


REST_MAX = 64  # lines kept of a wait channel's output outside probe answers: its own answer is the last


class WaitReader:
    """A wait channel's stdout, line by line: probe answers, and the rest (the wait's own answer).

    An answer is the lines between `@tpuwatch probe_begin=<seq>` and `probe_end=<seq>` of the
    same number; a frame that another begins before it ends is dropped, so a torn answer is
    never read as a whole one. Which request an answer belongs to is the caller's to check.
    """

    def __init__(self) -> None:
        self._partial = b""
        self._frame: tuple[str, list[str]] | None = None
        self.rest: list[str] = []
        self.ready = False  # the worker-side wait runs and reads requests (`wait_ready`)

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The answers completed by `data`: (seq as sent back, their text)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        done: list[tuple[str, str]] = []
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if line.startswith(MARK + "wait_ready=") and self._frame is None:
                self.ready = True
            elif line.startswith(MARK + "probe_begin="):
                self._frame = (line[len(MARK + "probe_begin="):], [])
            elif line.startswith(MARK + "probe_end="):
                frame, self._frame = self._frame, None
                if frame is not None and frame[0] == line[len(MARK + "probe_end="):]:
                    done.append((frame[0], "\n".join(frame[1])))
            elif self._frame is not None:
                self._frame[1].append(line)
            elif line:
                self.rest.append(line)
                del self.rest[:-REST_MAX]  # a channel held for days keeps no more than its answer needs
        return done

    def wait_answer(self) -> FollowEnd:
        """The wait's own answer (outside every probe answer)."""
        return parse_wait("\n".join(self.rest))


def parse_wait(stdout: str) -> FollowEnd:
    """A `wait` answer: result ok (exit_code), gone, replaced; "" when the channel broke first."""
    return parse_follow_end(stdout)


def parse_follow_end(stderr: str) -> FollowEnd:
    rec = parse_records(stderr)
    return FollowEnd(
        result=rec.get("result", ""),
        exit_code=_int(rec.get("exit_code")),
        attempt=_int(rec.get("attempt")),
        detail=rec.get("detail", ""),
    )
