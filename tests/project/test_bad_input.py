"""Bad input: every config key, every CLI flag and argument of every command,
and tpuwatch's environment variables, fed wrong types, out-of-range values, unknown keys, empty
strings, very long strings, non-UTF-8 bytes and shell metacharacters.

The table is generated from `tpuwatch.config.SCHEMA` and from the click parameters of every
command in `tpuwatch.cli.COMMANDS`, so a new key or flag is covered without editing this file.
A value that must be refused gets exit 2 and a message naming the key, flag or variable; a value
that may be fine for its key (a shell command, a path) may pass, but is never run by a shell.
Nothing ever shows a Python traceback. Each case runs the real CLI entry point with stdout and
stderr set up as Python sets them up for pipes (strict UTF-8 out), so an output that cannot be
encoded would show too: the config and flag cases in this process (`run_in_process`, two
thousand of them), and the environment cases, each command's unknown flag and the baseline
config in a forked child with real pipes (`run_cli`), for the real process's exit code.
"""

from __future__ import annotations

import io
import os
import selectors
import signal
import socket
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from tpuwatch import cli as climod
from tpuwatch.config import SCHEMA, TABLE_ARRAYS

MARKER_NAME = "tpuwatch-pwned"
TRIED: Counter[str] = Counter()


@dataclass(frozen=True)
class Case:
    what: str  # the key/flag/variable under test, for the failure message
    names: tuple[str, ...]  # any of these in the output counts as naming it
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    config: bytes | None = None  # the config file's bytes, when the case writes one
    must_refuse: bool = True  # False: the value may be valid for this key (never run, though)
    accepted_if: str = ""  # output that shows the value was accepted (a later step failed)


@dataclass
class Result:
    code: int
    out: str
    err: str


# ---- running the CLI -------------------------------------------------------------------------


def run_cli(argv: list[str], env: dict[str, str], timeout: float = 30, cwd: str | None = None) -> Result:
    """tpuwatch.cli.main(argv) in a forked child: real fds 1 and 2 as pipes, env replaced."""
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 98
        try:
            os.dup2(w_out, 1)
            os.dup2(w_err, 2)
            for fd in (r_out, w_out, r_err, w_err):
                os.close(fd)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a case that hangs dies, and fails
            signal.alarm(int(timeout))
            os.environ.clear()
            os.environ.update(env)
            os.chdir(cwd or env.get("HOME", "/"))  # relative paths land in the test's directory
            # As Python sets them up for a process whose output is a pipe.
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict",
                                          line_buffering=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                          errors="backslashreplace", line_buffering=True)
            try:
                climod.main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                traceback.print_exc()  # what Python would show: the test fails on "Traceback"
                code = 99
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w_out)
    os.close(w_err)
    chunks: dict[int, list[bytes]] = {r_out: [], r_err: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(chunks)
    while open_fds:
        for key, _ in sel.select(timeout):
            data = os.read(key.fd, 65536)
            if data:
                chunks[key.fd].append(data)
            else:
                sel.unregister(key.fd)
                open_fds.discard(key.fd)
    sel.close()
    os.close(r_out)
    os.close(r_err)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return Result(code, b"".join(chunks[r_out]).decode(errors="replace"),
                  b"".join(chunks[r_err]).decode(errors="replace"))


class CaseTimeout(BaseException):
    """A case ran longer than its time: the in-process run stops it (as the child's SIGALRM would)."""


def run_in_process(argv: list[str], env: dict[str, str], timeout: float = 30, cwd: str | None = None) -> Result:
    """tpuwatch.cli.main(argv) in this process, set up as `run_cli`'s child is (env replaced, cwd
    moved, stdout strict UTF-8 and stderr backslashreplace, line-buffered) but onto memory
    instead of pipes, and everything put back after: no fork of this large process (a fork cost
    the suite ~20 ms of mostly system time a case, over 2,000 cases)."""
    out, err = io.BytesIO(), io.BytesIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdout, sys.stderr

    def expire(signum: int, frame: object) -> None:
        raise CaseTimeout(f"the case ran over {timeout} s")

    saved_alarm = signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(timeout))
    code = 98
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd or env.get("HOME", "/"))
        sys.stdout = text_out = io.TextIOWrapper(out, encoding="utf-8", errors="strict", line_buffering=True)
        sys.stderr = text_err = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", line_buffering=True)
        try:
            climod.main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()  # what Python would show: the test fails on "Traceback"
            code = 99
        text_out.flush()
        text_err.flush()
        text_out.detach()  # a wrapper closes its buffer when collected: the bytes are read below
        text_err.detach()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, saved_alarm)
        sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Result(code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A state dir, a key, a closed port for the API (so a value that passes fails fast, exit 3)."""
    tmp = tmp_path_factory.mktemp("bad-input")
    # Imported once here, so that each forked child starts warm (a case takes ~10 ms, not 150).
    list(commands())
    import tpuwatch.cloud.logs  # noqa: F401
    import tpuwatch.cloud.tpu.adapter  # noqa: F401
    import tpuwatch.journal  # noqa: F401
    import tpuwatch.sim.grpc_api  # noqa: F401
    import tpuwatch.tick  # noqa: F401
    import tpuwatch.wiring  # noqa: F401
    import tpuwatch.workers.sshworkers  # noqa: F401
    key = tmp / "id"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    (tmp / "gcloud").mkdir()
    busy = socket.socket()  # a port in use: `sim serve` given it stops before serving
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "TPUWATCH_STATE_DIR": str(tmp / "state"),
        "TPUWATCH_EMULATOR_HOST": f"127.0.0.1:{port}",
        "TPUWATCH_API_BACKOFF_SCALE": "0",
        "CLOUDSDK_CONFIG": str(tmp / "gcloud"),
        "CLOUDSDK_CORE_PROJECT": "sim-project",
        "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
    }
    yield {"tmp": tmp, "key": key, "env": env, "busy": busy.getsockname()[1]}
    busy.close()
    print(f"\nbad inputs tried: {dict(TRIED)}, total {sum(TRIED.values())}")


def check(case: Case, world: dict[str, object], forked: bool = False) -> None:
    tmp = world["tmp"]
    assert isinstance(tmp, Path)
    env = dict(world["env"])  # type: ignore[call-overload]
    env.update({k: v.replace("@TMP@", str(tmp)) for k, v in case.env})
    marker = tmp / MARKER_NAME
    argv = [a.replace("@CFG@", str(tmp / "case.toml")).replace("@TMP@", str(tmp)).replace("@BUSY@", str(world["busy"]))
            for a in case.argv]
    if case.config is not None:
        (tmp / "case.toml").write_bytes(case.config)
    r = (run_cli if forked else run_in_process)(argv, env)
    shown = r.out + r.err
    where = f"{case.what}: argv={argv!r:.300} env={dict(case.env)!r:.200} -> exit {r.code}\n{shown[-1500:]}"
    assert "Traceback" not in shown and "internal error" not in shown, where
    assert not marker.exists(), f"a shell ran a value: {where}"
    if case.accepted_if and case.accepted_if in shown:
        assert not case.must_refuse, where
        return
    if case.must_refuse:
        assert r.code == 2, where
    else:
        assert r.code in (0, 1, 2, 3), where
    if r.code == 2:
        assert any(n in shown for n in case.names), f"the message does not name {case.names}: {where}"


# ---- values -----------------------------------------------------------------------------------

PAYLOADS = ("$(touch ~/" + MARKER_NAME + ")", "`touch ~/" + MARKER_NAME + "`",
            "x; touch ~/" + MARKER_NAME, "a|b&&c>d<e", "'\"\\")
LONG = "a" * 5000
NON_UTF8 = b"\xff\xfe\xfa"


def toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


BASE = {
    "tpu": {"name": '"pod"', "project": '"sim-project"', "zone": '"us-central2-b"'},
    "job": {"command": '"python3 train.py --resume={checkpoint}"', "checkpoint_dir": '"/tmp/ck"'},
    "ssh": {},
}


# The required keys of sections that are not in BASE, so a case fails on the key it tests.
REQUIRED = {"notify": {"url": '"https://hooks.example.com/x"'}}


def config_bytes(section: str, key: str, raw: bytes, key_path: Path) -> bytes:
    sections: dict[str, dict[str, bytes]] = {s: {k: v.encode() for k, v in kv.items()} for s, kv in BASE.items()}
    sections["ssh"]["identity_file"] = toml_str(str(key_path)).encode()
    sections.setdefault(section, {k: v.encode() for k, v in REQUIRED.get(section, {}).items()})[key] = raw
    out = b""
    for s, kv in sections.items():
        head = f"[[{s}]]" if s in TABLE_ARRAYS else f"[{s}]"  # [[notify]]: an array of tables
        out += f"{head}\n".encode() + b"".join(k.encode() + b" = " + v + b"\n" for k, v in kv.items())
    return out


ACCEPTS_A_LIST = {"job.workers"}  # "all" or a list of worker numbers


DURATION_OR_AUTO = {"recovery.hang_timeout"}  # a duration, or "auto" (its default)
WHOLE_OR_OFF = {"job.priority"}  # a whole number, or "off" (its default)


def bad_values(dotted: str, default: object) -> list[tuple[str, bytes, bool]]:
    """(kind, TOML value bytes, must_refuse) for a key whose default is `default`."""
    text_ok = isinstance(default, str) or default is None  # free text may take metacharacters
    out: list[tuple[str, bytes, bool]] = [
        ("long string", toml_str(LONG).encode(), True),
        ("NUL", b'"a\\u0000b"', True),
        ("non-UTF-8", b'"' + NON_UTF8 + b'"', True),
        ("empty string", b'""', not text_ok),
    ]
    out += [("metacharacters", toml_str(p).encode(), not text_ok) for p in (PAYLOADS[0], PAYLOADS[2], PAYLOADS[4])]
    if isinstance(default, bool):
        out += [("wrong type", v, True) for v in (b'"true"', b"1", b"[]")]
    elif isinstance(default, int) or dotted in WHOLE_OR_OFF:
        out += [("wrong type", v, True) for v in (b'"5"', b"1.5", b"true", b"[]")]
        # Every whole-number key is a count, a budget or a port: below zero is out of range for
        # all of them; a huge value is for most (and harmless for an unbounded minimum).
        out += [("out of range", b"-1", True), ("out of range", b"10000000000", False)]
    elif isinstance(default, float) or dotted in DURATION_OR_AUTO:  # durations and sizes
        out += [("wrong type", v, True) for v in (b"true", b"[]", b"{ a = 1 }")]
        out += [("out of range", v, True) for v in (b'"-5s"', b"-1", b'"5 parsecs"')]
    elif isinstance(default, (tuple, frozenset)):
        out += [("wrong type", v, True) for v in (b'"x"', b"5", b"{ a = 1 }")]
        out += [("out of range", b"[true]", True), ("out of range", b"[" + toml_str(LONG).encode() + b"]", True)]
    elif isinstance(default, dict):
        out += [("wrong type", v, True) for v in (b'"x"', b"5", b"[1]")]
        out += [("out of range", b'{ "1 bad" = 2 }', True)]
    else:  # text
        out += [("wrong type", v, v != b"[1]" or dotted not in ACCEPTS_A_LIST)
                for v in (b"123", b"true", b"[1]", b"{ a = 1 }")]
    return out


def config_cases(key_path: Path) -> Iterator[Case]:
    for section, fields in SCHEMA.items():
        # a key of an array of tables is named with the table's position: notify[0].url
        at = f"{section}[0]" if section in TABLE_ARRAYS else section
        for key, field in fields.items():
            dotted = f"{section}.{key}"
            for kind, raw, refuse in bad_values(dotted, field.default):
                yield Case(f"{dotted} ({kind})", (dotted, f"{at}.{key}"), ("history", "-c", "@CFG@"),
                           config=config_bytes(section, key, raw, key_path), must_refuse=refuse)
            near = key[:-1] + ("x" if key[-1] != "x" else "y")  # a typo of the key
            yield Case(f"{dotted} (unknown key {near})", (f"{section}.{near}", f"{at}.{near}"),
                       ("history", "-c", "@CFG@"), config=config_bytes(section, near, b"1", key_path))
        yield Case(f"[{section}x] (unknown section)", (f"{section}x",), ("history", "-c", "@CFG@"),
                   config=config_bytes(section + "x", "a", b"1", key_path))


@pytest.mark.slow
def test_every_config_key_refuses_bad_values_by_name(world: dict[str, object]) -> None:
    key = world["key"]
    assert isinstance(key, Path)
    ok = run_cli(["history", "-c", str(world["tmp"] / "base.toml")], dict(world["env"]))  # type: ignore
    assert ok.code == 2  # no file yet: names it
    (world["tmp"] / "good.toml").write_bytes(config_bytes("tpu", "name", b'"pod"', key))  # type: ignore
    good = run_cli(["history", "-c", str(world["tmp"] / "good.toml")], dict(world["env"]))  # type: ignore
    assert good.code == 1 and "no journal" in good.err, good  # the baseline config itself is fine
    n = 0
    for case in config_cases(key):
        check(case, world)
        n += 1
    TRIED["config values"] += n
    assert n >= 10 * sum(len(f) for f in SCHEMA.values())


# ---- flags ------------------------------------------------------------------------------------


def commands() -> Iterator[tuple[list[str], click.Command, list[str]]]:
    """(path, command, tail) for every command and group at any depth; `tail` completes the
    command line after a group's own options (a subcommand and its required arguments)."""
    ctx = click.Context(climod.cli)

    def walk(path: list[str], cmd: click.Command) -> Iterator[tuple[list[str], click.Command, list[str]]]:
        if not isinstance(cmd, click.Group):
            yield path, cmd, []
            return
        subs = [(n, cmd.get_command(ctx, n)) for n in cmd.list_commands(ctx)]
        subs = [(n, c) for n, c in subs if c is not None]
        if cmd.params and subs:
            n, c = min(subs, key=lambda nc: sum(1 for p in nc[1].params if p.required))
            tail = [n, *["pod" for p in c.params if isinstance(p, click.Argument) and p.required]]
            yield path, cmd, tail
        for n, c in subs:
            yield from walk([*path, n], c)  # type: ignore[arg-type]

    for name in climod.COMMANDS:
        cmd = climod.cli.get_command(ctx, name)
        if cmd is not None:
            yield from walk([name], cmd)


def flag_values(p: click.Parameter, short: bool = False) -> list[tuple[str, str, bool]]:
    """(kind, value, must_refuse) for one option or argument; `short`: one of each kind."""
    t = p.type
    bad_utf8 = NON_UTF8.decode("utf-8", errors="surrogateescape")  # as Python hands argv over
    if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)):
        any_int = p.name == "seed"  # a random seed is any whole number
        return [("wrong type", "abc", True), ("out of range", "-99999999999999999999", not any_int),
                ("empty", "", True), ("long", "9" * 5000, True), ("non-UTF-8", bad_utf8, True),
                ("metacharacters", PAYLOADS[0], True)]
    if isinstance(t, click.Path):
        read = p.name == "config_path"  # a file tpuwatch reads: a bad one is refused at once
        return [("missing", "@TMP@/missing/x.toml", read), ("empty", "", True), ("long", "/" + "a" * 5000, read),
                ("non-UTF-8", "@TMP@/" + bad_utf8, read), ("metacharacters", "@TMP@/" + PAYLOADS[2], read)]
    return [("empty", "", True), ("long", LONG, True), ("non-UTF-8", bad_utf8, True),
            *[("metacharacters", v, True) for v in (PAYLOADS[:1] if short else PAYLOADS)]]


def flag_cases(key_path: Path) -> Iterator[Case]:
    good = config_bytes("tpu", "name", b'"pod"', key_path)
    for path, cmd, tail in commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.is_flag or p.name in ("help",)):
                flag = max(p.opts, key=len)
                yield Case(f"{' '.join(path)} {flag} (a flag given a value)", (flag,),
                           (*_with_required(cmd, path, p, (*path, f"{flag}=yes")), *tail), config=good)
                continue
            names = (*p.opts, p.human_readable_name, (p.name or "").replace("_", "-"), (p.name or "").upper())
            if p.name == "config_path":
                names += ("config file",)
            if p.name in ("name", "names"):
                names += ("TPU name",)
            # `sim inject`'s fault options are free text (a terminate reason, symptom
            # details, method filters) checked by the simulator it talks to; here they must
            # only never crash or reach a shell.
            # `sim serve` takes any project name and paths it creates; a value it accepts is
            # seen failing on the busy port the case gives it, instead of serving for ever.
            free_text = path[:2] in (["sim", "inject"], ["sim", "serve"])
            serve = path[:2] == ["sim", "serve"]
            busy = ["--port", "@BUSY@"] if serve and p.name != "port" else []
            for kind, value, refuse in flag_values(p, short=free_text):
                refuse = refuse and not (free_text and not (serve and kind == "empty") and not isinstance(
                    p.type, (click.types.IntParamType, click.types.FloatParamType)))
                argv = (*path, value) if isinstance(p, click.Argument) else (*path, max(p.opts, key=len), value)
                if isinstance(p, click.Argument) and p.nargs == -1:
                    argv = (*path, value)
                yield Case(f"{' '.join(path)} {p.human_readable_name} ({kind})", names,
                           (*_with_required(cmd, path, p, argv), *tail, *busy), config=good, must_refuse=refuse,
                           accepted_if="cannot listen on 127.0.0.1:" if busy else "")
        yield Case(f"{' '.join(path)} (unknown flag)", ("--bogus-flag",), (*path, "--bogus-flag"))


UNKNOWN_FLAG = "(unknown flag)"  # these cases run in a forked child: one real process per command


GOOD = {"rate": "0.5", "latency": "60s"}  # values for other required options of a command


def _with_required(cmd: click.Command, path: list[str], under_test: click.Parameter,
                   argv: tuple[str, ...]) -> tuple[str, ...]:
    """argv plus good values for the other required arguments (a TPU name), after the one tested,
    and a good config file for the commands that read one."""
    extra: list[str] = []
    if under_test.name != "config_path" and any(p.name == "config_path" for p in cmd.params):
        extra += ["-c", "@CFG@"]
    for p in cmd.params:
        if p is under_test or not p.required:
            continue
        if isinstance(p, click.Argument):
            extra.append("pod")
        else:
            extra += [max(p.opts, key=len), GOOD.get(p.name or "", "1")]
    if isinstance(under_test, click.Argument):
        return argv + tuple(extra)
    return (*path, *extra, *argv[len(path):])


@pytest.mark.slow
def test_every_flag_of_every_command_refuses_bad_values_by_name(world: dict[str, object]) -> None:
    key = world["key"]
    assert isinstance(key, Path)
    n = 0
    for case in flag_cases(key):
        check(case, world, forked=case.what.endswith(UNKNOWN_FLAG))
        n += 1
    TRIED["flag values"] += n
    assert n >= 100


# ---- environment ------------------------------------------------------------------------------


ENV_CASES: dict[str, tuple[list[str], list[tuple[str, bool]]]] = {
    "TPUWATCH_EMULATOR_HOST": (["status", "pod"], [
        ("no-port", True), ("host:99999", True), ("host:abc", True), (LONG, True),
        (NON_UTF8.decode("utf-8", errors="surrogateescape"), True), *[(v, True) for v in PAYLOADS]]),
    "TPUWATCH_STATE_DIR": (["check", "-c", "@CFG@"], [
        ("", True), ("   ", True), ("/dev/null", True), ("/" + "a" * 5000, True),
        ("relative/dir/" + PAYLOADS[2], False), ("@TMP@/" + NON_UTF8.decode("utf-8", errors="surrogateescape"), False)]),
    "TPUWATCH_API_BACKOFF_SCALE": (["status", "pod"], [
        ("abc", True), ("-1", True), ("1e9", True), ("nan", True), ("inf", True), (LONG, True),
        (NON_UTF8.decode("utf-8", errors="surrogateescape"), True), *[(v, True) for v in PAYLOADS]]),
}


def test_bad_environment_variables_are_named(world: dict[str, object]) -> None:
    key = world["key"]
    assert isinstance(key, Path)
    n = 0
    for var, (argv, values) in ENV_CASES.items():
        for value, refuse in values:
            check(Case(f"{var}={value[:40]!r}", (var,), tuple(argv), ((var, value),),
                       config=config_bytes("tpu", "name", b'"pod"', key), must_refuse=refuse), world, forked=True)
            n += 1
    TRIED["environment values"] += n
