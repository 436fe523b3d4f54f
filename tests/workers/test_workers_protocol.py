"""The worker-side protocol from tpuwatch's side: templating, quoting, the script text, parsing.

The quoting tests run the rendered text through a real local bash and compare the argv it
builds: a value must arrive as exactly the bytes given, whatever they are.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuwatch.errors import ConfigError, UsageError
from tpuwatch.model import Checkpoint
from tpuwatch.workers import protocol

BASH = "/bin/bash"


def argv_of(command: str, cwd: Path) -> list[str]:
    """The arguments bash gives `printf '%s\\0'` for `command`: what a program would receive."""
    out = subprocess.run([BASH, "-c", command], capture_output=True, cwd=cwd, timeout=10,
                         env={"PATH": os.environ["PATH"], "HOME": str(cwd)})
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


NASTY = [
    "it's $(touch pwned)",
    "a b\tc\nd",
    '"; touch pwned; echo "',
    "`touch pwned`",
    "$HOME ${HOME} $((1+1)) !! \\ \\\\ '' \"\"",
    "-n",
    "",
    "*",
    "~",
    "{checkpoint}",
    "x\n# comment\ntouch pwned",
    "ünïcødé ✓",
]


@pytest.mark.parametrize("value", NASTY)
def test_a_checkpoint_reaches_the_command_as_one_literal_argument(value: str, tmp_path: Path) -> None:
    cmd = protocol.render_command(
        "printf '%s\\0' --resume={checkpoint} {checkpoint} {step} {attempt} w{worker}",
        checkpoint=value, step=120, attempt=3, worker=7)
    assert argv_of(cmd, tmp_path) == [f"--resume={value}", value, "120", "3", "w7"]
    assert not (tmp_path / "pwned").exists()


def test_no_checkpoint_gives_empty_words_not_missing_ones(tmp_path: Path) -> None:
    cmd = protocol.render_command("printf '%s\\0' {checkpoint} {step} --resume={checkpoint}",
                                  checkpoint="", step=None, attempt=1, worker=0)
    assert argv_of(cmd, tmp_path) == ["", "", "--resume="]


def test_literal_braces_and_shell_syntax_are_kept(tmp_path: Path) -> None:
    cmd = protocol.render_command(
        "x=1; printf '%s\\0' \"{{a}}\" ${{x}} {worker} | cat  # not {{here}}",
        checkpoint="", step=None, attempt=1, worker=2)
    assert argv_of(cmd, tmp_path) == ["{a}", "1", "2"]


@pytest.mark.parametrize("template, fragment", [
    ("python train.py --ckpt={chekpoint}", "unknown placeholder {chekpoint}"),
    ("python train.py {step!r}", "unknown placeholder {step!r}"),
    ("python train.py {step:>5}", "unknown placeholder {step:>5}"),
    ("python train.py {", "write a literal brace"),
    ('python train.py --ckpt "{checkpoint}"', "{checkpoint} is inside double quotes"),
    ("python train.py --ckpt '{checkpoint}'", "{checkpoint} is inside single quotes"),
    ("python train.py --ckpt \\{checkpoint}", "right after a backslash"),
    ("python train.py # resume {checkpoint}", "inside a # comment"),
    ("cat <<EOF\n{checkpoint}\nEOF", "here-document"),
])
def test_templates_that_could_not_keep_a_value_whole_are_refused(template: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        protocol.check_template(template)
    assert "job.command" in str(err.value)
    assert fragment in str(err.value)


@pytest.mark.parametrize("template", [
    "python3 train.py --resume={checkpoint}",
    "cd ~/repo && python3 train.py {checkpoint} --step={step}#x",
    "echo a#{step} && cat <<< {step}",
    "echo \"quoted\" 'text' {attempt}\n# a comment\necho {worker}",
])
def test_ordinary_templates_are_accepted(template: str) -> None:
    protocol.check_template(template)


# Pieces a template is built from: bare words, quoted words, placeholders, separators.
_piece = st.one_of(
    st.sampled_from(["{checkpoint}", "{step}", "{attempt}", "{worker}"]),
    st.sampled_from(["a", "--flag=", "x{checkpoint}y", "'q t'", '"d q"', "\\ ", "{{", "}}", "=", "#no"]),
    st.just(" "),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_piece, max_size=8),
       value=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                     max_size=40))
def test_templating_never_lets_a_value_escape_its_argument(
        pieces: list[str], value: str, tmp_path: Path) -> None:
    """Rendering with arbitrary text gives the argv of rendering with a plain marker, with the
    marker replaced by the text: the value never splits, joins, globs, expands or runs."""
    template = "printf '%s\\0' " + "".join(pieces)
    try:
        protocol.check_template(template)
    except ConfigError:
        return
    # every placeholder position carries the random text (step/attempt/worker are quoted alike)
    for name in ("{step}", "{attempt}", "{worker}"):
        template = template.replace(name, "{checkpoint}")
    marker = "MARKERVALUE"
    plain = argv_of(protocol.render_command(template, checkpoint=marker, step=None, attempt=1,
                                            worker=0), tmp_path)
    got = argv_of(protocol.render_command(template, checkpoint=value, step=None, attempt=1,
                                          worker=0), tmp_path)
    assert got == [a.replace(marker, value) for a in plain]
    assert not (tmp_path / "pwned").exists()


def test_script_quotes_every_value_and_is_one_group() -> None:
    ck = Checkpoint(path="/b/it's $(touch pwned)/20", step=20, layout="orbax")
    data = protocol.launch_script("job", attempt=3, worker=1, checkpoint=ck,
                                  command="echo {hi}", env={"A": "x y", "B": "$(no)"}).decode()
    lines = data.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert "TW_CHECKPOINT=" + shlex.quote(ck.path) in lines
    assert "TW_ENV=(" + shlex.quote("A=x y") + " " + shlex.quote("B=$(no)") + ")" in lines
    assert "TW_STEP=20" in lines and "TW_ATTEMPT=3" in lines and "TW_WORKER=1" in lines


def test_a_probe_carries_only_the_functions_a_probe_runs() -> None:
    """bash parses every function it is sent: a probe gets neither the launch's nor the stop's,
    and every function its own call, directly or not, is there."""
    full = {m.group(1): m.group(0) for m in protocol._FUNCTION.finditer(protocol.remote_script())}
    probe = protocol.probe_script("job").decode()
    sent = {m.group(1) for m in protocol._FUNCTION.finditer(probe)}
    assert {"tw_probe", "tw_attempt_alive", "tw_scan", "tw_ckpt_listing", "tw_main"} <= sent
    assert not sent & {"tw_launch", "tw_stop", "tw_wait", "tw_follow", "tw_relay", "tw_wrapper", "tw_holders"}
    for name in sent - {"tw_main"}:  # tw_main names every action; only the probe's branch runs
        called = set(protocol._NAME.findall(full[name])) & set(full)
        assert called <= sent, (name, called - sent)
    assert len(probe) < len(protocol.remote_script()) // 2
    assert subprocess.run([BASH, "-n"], input=probe.encode(), capture_output=True, timeout=10).returncode == 0
    # the other actions still get the whole script
    assert protocol.remote_script() in protocol.stop_script("job", 1.0).decode()


@pytest.mark.parametrize("name", ["remote.sh", "precheck.sh"])
def test_a_script_is_sent_without_its_comment_lines_and_defines_the_same_functions(name: str) -> None:
    """Whole-line comments are not sent (bash lexes every byte, on every call): what bash makes
    of the script sent is what it makes of the script shipped, function for function."""
    from tpuwatch.workers import precheck

    shipped = protocol.packaged(name)
    sent = protocol.remote_script() if name == "remote.sh" else precheck.precheck_script()
    assert len(sent) < len(shipped) * 3 // 4 and "\n# " not in sent and "\n  # " not in sent

    def functions(text: str) -> str:  # every definition, the entry point's call left out
        body = "\n".join(ln for ln in text.splitlines() if ln not in ("tw_main", "twp_main"))
        return subprocess.run([BASH, "-c", 'eval "$(cat)" >/dev/null 2>&1 </dev/null; declare -f'], input=body,
                              capture_output=True, text=True, timeout=60).stdout

    assert functions(sent) == functions(shipped) and "tw_procs ()" in functions(sent)


def test_a_truncated_upload_runs_nothing(tmp_path: Path) -> None:
    """A connection dropped while the script streams in: the worker runs none of it."""
    data = protocol.framed(protocol.launch_script("job", attempt=1, worker=0, checkpoint=None,
                                                  command=f"touch {tmp_path}/ran"))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for cut in (2, len(data) // 3, len(data) - 3, len(data) - 1):
        r = subprocess.run([BASH, "-c", protocol.REMOTE_COMMAND], input=data[:cut], capture_output=True, env=env,
                           timeout=10)
        assert r.returncode != 0
        assert protocol.parse_records(r.stdout.decode()) == {}
        assert not (tmp_path / ".tpuwatch").exists()
    assert not (tmp_path / "ran").exists()


def test_the_remote_command_runs_the_framed_script_and_leaves_it_the_rest_of_stdin(tmp_path: Path) -> None:
    """The frame counts bytes in any locale (a value with multibyte characters), and what
    follows the script on stdin is the script's to read (a follow channel's requests)."""
    script = protocol.wrap('echo "@tpuwatch value=$TW_VALUE"\nIFS= read -r line\necho "@tpuwatch next=$line"',
                           "job", {"value": ("v", "naïve ☃ $(x)")})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    r = subprocess.run([BASH, "-c", protocol.REMOTE_COMMAND], input=protocol.framed(script) + "probe 1 ☃\n".encode(),
                       capture_output=True, env=env, timeout=10)
    assert r.returncode == 0, r.stderr
    assert protocol.parse_records(r.stdout.decode()) == {"value": "naïve ☃ $(x)", "next": "probe 1 ☃"}


def test_bad_job_names_and_nul_are_refused() -> None:
    with pytest.raises(UsageError):
        protocol.probe_script("../etc")
    with pytest.raises(UsageError, match="NUL"):
        protocol.launch_script("job", attempt=1, worker=0, checkpoint=None, command="a\x00b")


def test_answers_are_read_from_marked_lines_only() -> None:
    text = "motd from .bashrc\n@tpuwatch result=ok\n@tpuwatch state=exited\n@tpuwatch exit_code=7\n" \
           "@tpuwatch attempt=3\n@tpuwatch pid=\n@tpuwatch detail=a=b c\nstate=running\n"
    rec = protocol.parse_records(text)
    probe = protocol.parse_probe(2, rec)
    assert (probe.worker, probe.state, probe.exit_code, probe.attempt, probe.pid) == (2, "exited", 7, 3, None)
    assert probe.detail == "a=b c"
    assert protocol.parse_probe(1, {}).state == "unreachable"
    assert protocol.parse_launch(0, {"result": "running", "attempt": "4", "pid": "99"}).started
    assert not protocol.parse_launch(0, {"result": "busy", "attempt": "3"}).started
    assert protocol.parse_launch(0, {"result": "weird"}).outcome == "error"
    stop = protocol.parse_stop(0, {"result": "leftover", "stopped": "1 2", "leftover": "2",
                                   "libtpu_lockfile": "removed"})
    assert (stop.ok, stop.stopped, stop.leftover) == (False, (1, 2), (2,))
    assert protocol.parse_follow_end("x\n@tpuwatch result=ok\n@tpuwatch exit_code=0\n").exit_code == 0


def test_a_wait_channels_output_is_split_into_framed_answers_and_the_rest() -> None:
    r = protocol.WaitReader()
    assert r.feed(b"\n@tpuwatch probe_begin=4\n@tpuwatch result=ok\n@tpuwatch sta") == []
    assert r.feed(b"te=running\n@tpuwatch probe_end=4\n") == [("4", "@tpuwatch result=ok\n@tpuwatch state=running")]
    # a frame another begins before it ends is torn: dropped, never read as a whole answer
    assert r.feed(b"@tpuwatch probe_begin=5\n@tpuwatch result=ok\n@tpuwatch probe_begin=6\n"
                  b"@tpuwatch state=absent\n@tpuwatch probe_end=5\n@tpuwatch result=ok\n") == []
    assert r.feed(b"@tpuwatch probe_begin=7\n@tpuwatch probe_end=7\n@tpuwatch result=ok\n@tpuwatch exit_code=3\n") == [("7", "")]
    # the wait's own answer is what lies outside the frames
    assert r.rest == ["@tpuwatch result=ok", "@tpuwatch result=ok", "@tpuwatch exit_code=3"]
    assert (r.wait_answer().result, r.wait_answer().exit_code) == ("ok", 3)
    assert protocol.probe_request(12, True) == b"probe 12 1\n" and protocol.probe_request(3) == b"probe 3 0\n"


def test_a_wait_channel_keeps_nothing_of_the_probe_answers_it_carried() -> None:
    """A channel held for days answers a probe every tick: what it said must not pile up."""
    r = protocol.WaitReader()
    for seq in range(1000):
        done = r.feed(f"@tpuwatch probe_begin={seq}\n@tpuwatch state=running attempt=1\n"
                      f"@tpuwatch probe_end={seq}\n".encode())
        assert done == [(str(seq), "@tpuwatch state=running attempt=1")]
    assert r.rest == []
    for _ in range(1000):  # a chatty login shell, say
        r.feed(b"noise\n")
    r.feed(b"@tpuwatch result=ok\n@tpuwatch exit_code=3\n")
    assert len(r.rest) == protocol.REST_MAX
    assert r.wait_answer().exit_code == 3


def test_a_wait_channel_is_ready_only_once_its_shell_says_so() -> None:
    """The watcher asks a channel only once the worker-side wait reads requests: one still
    connecting (a worker that stopped answering) would hold the tick for the whole answer wait."""
    r = protocol.WaitReader()
    r.feed(b"Welcome to the VM\n@tpuwatch probe_begin=1\n@tpuwatch wait_ready=3\n")
    assert not r.ready  # inside an answer's frame it is part of that answer, not the shell's word
    r.feed(b"@tpuwatch probe_end=1\n@tpuwatch wait_ready=3\n")
    assert r.ready and r.rest == ["Welcome to the VM"]


def test_a_launch_then_wait_answer_ends_at_its_launch_end_line() -> None:
    launched = b"@tpuwatch result=launched\n@tpuwatch attempt=2\n"
    assert protocol.split_launch(launched) is None  # not over yet
    assert protocol.split_launch(launched + b"@tpuwatch launch_end=2") is None  # the line is not whole
    assert protocol.split_launch(launched + b"@tpuwatch launch_end=2\n@tpuwatch wait_ready=2\n") == (
        launched, b"@tpuwatch wait_ready=2\n")
    assert protocol.split_launch(b"@tpuwatch launch_end=2\n") == (b"", b"")
    # only a line of its own ends it, not the words inside another record
    assert protocol.split_launch(b"@tpuwatch detail=x @tpuwatch launch_end=2\n") is None
