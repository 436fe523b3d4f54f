"""The README's promises: its two set-up commands work, and every command's help has an example.

The two commands are parsed out of README.md (the first two ```sh blocks of "Try it"), so the
README cannot drift from what is tested:

- always: the test command is the one `.ci/run` runs, the demo command runs `tpuwatch demo`,
  and `tpuwatch --help` and every command's `--help` carry an example;
- slow (about 75 s here: pip install, then the full-pace demo): the demo command, verbatim, in
  a fresh copy of the project, as `sh -c` runs it on a fresh machine;
- opt-in (TPUWATCH_README_TEST=1; it runs the whole suite again, several minutes): the test
  command, verbatim, likewise. The inner run goes without that variable, so it does not recurse.

`pip install` uses pip's normal configuration (the machine's package index or cache) and
installs the real dependencies; the machine's python3 is used, never this test's venv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuwatch.cli import COMMANDS, cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
OPT_IN = "TPUWATCH_README_TEST"


def setup_commands() -> tuple[str, str]:
    """(demo command, test command): the first two ```sh blocks under the "Try it" heading."""
    text = README.read_text()
    m = re.search(r"^## Try it.*?(?=^## )", text, re.M | re.S)
    assert m, "README.md has no '## Try it' section"
    blocks = re.findall(r"^```sh\n(.*?)^```", m.group(0), re.M | re.S)
    assert len(blocks) >= 2, "the 'Try it' section needs two ```sh blocks: install + demo, and tests"
    commands = []
    for block in blocks[:2]:
        lines = [ln for ln in block.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert len(lines) == 1, f"a set-up command is one line, to copy and paste: {block!r}"
        commands.append(lines[0].strip())
    return commands[0], commands[1]


def test_the_readme_has_the_two_set_up_commands_and_ci_runs_the_test_command() -> None:
    demo, tests = setup_commands()
    assert re.search(r"\bpip install \.(\s|$)", demo) and "--no-deps" not in demo, demo
    assert re.search(r"\btpuwatch demo\b", demo), demo
    assert "'.[test]'" in tests and "pytest" in tests and "--no-deps" not in tests, tests
    ci = (REPO / ".ci" / "run").read_text()
    ci_test = [ln for ln in ci.splitlines() if "pytest" in ln and not ln.lstrip().startswith("#")]
    assert len(ci_test) == 1, ci_test
    # .ci/run runs the README's checks verbatim (after its own venv and PATH set-up).
    assert tests.endswith(ci_test[0].strip()), (tests, ci_test[0])


def test_every_command_help_carries_an_example() -> None:
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0 and "Examples:" in top.output
    missing = []
    for name in COMMANDS:
        module = REPO / "tpuwatch" / "commands" / f"{name}.py"
        if not module.exists():
            continue  # listed for a command still being written; `tpuwatch --help` omits it too
        out = runner.invoke(cli, [name, "--help"])
        assert out.exit_code == 0, (name, out.output)
        if "Examples:" not in out.output or f"tpuwatch {name}" not in out.output.split("Examples:", 1)[1]:
            missing.append(name)
    assert not missing, f"no example in the help of: {missing}"


def _fresh_copy(dest: Path) -> Path:
    """The project's files (tracked and new, not ignored) in a new directory, no .venv."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _run_verbatim(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (OPT_IN, "VIRTUAL_ENV", "PYTHONPATH") and not k.startswith(("TPUWATCH_", "CLOUDSDK_"))}
    # The machine's python3 first, as on a fresh machine: never this test's venv.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.executable).parent)))
    return subprocess.run(["sh", "-c", command], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


opt_in = pytest.mark.skipif(os.environ.get(OPT_IN) != "1",
                            reason=f"runs the whole suite again in a fresh venv; set {OPT_IN}=1 to run")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_demo_command_works_in_a_fresh_venv(tmp_path: Path) -> None:
    demo, _ = setup_commands()
    try:
        out = _run_verbatim(demo, _fresh_copy(tmp_path / "repo"), timeout=900)
    finally:
        shutil.rmtree(tmp_path / "repo", ignore_errors=True)  # a venv is a few hundred MB
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(r"^result: ok: 4/4 disruptions recovered", out.stdout, re.M), out.stdout[-3000:]


@pytest.mark.slow
@opt_in
@pytest.mark.timeout(1800)
def test_readme_test_command_works_in_a_fresh_venv(tmp_path: Path) -> None:
    _, tests = setup_commands()
    try:
        out = _run_verbatim(tests, _fresh_copy(tmp_path / "repo"), timeout=1700)
    finally:
        shutil.rmtree(tmp_path / "repo", ignore_errors=True)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert re.search(r"\d+ passed", out.stdout), out.stdout[-3000:]
