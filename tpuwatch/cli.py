"""The `tpuwatch` command line: a click group whose commands load on demand.

Expected errors (`TpuwatchError`) print one line and exit with their code (the README's
exit-code table); a traceback appears only with `--debug`.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from tpuwatch import __version__
from tpuwatch.errors import EXIT_JOB_FAILED, EXIT_USAGE, TpuwatchError

# name -> (module under tpuwatch.commands, one-line help shown by `tpuwatch --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "watch": ("watch", "Keep the job alive: reconcile tick after tick, with a live dashboard."),
    "check": ("check", "Run exactly one reconcile tick and exit (for cron or a systemd timer)."),
    "status": ("status", "Show a TPU's state, health, maintenance, workers and recent events."),
    "events": ("events", "Show the maintenance / terminate / restart timeline from the audit log."),
    "history": ("history", "Show a job's journal as a timeline."),
    "report": ("report", "Show where the job's wall time went, and its goodput (--html: a timeline)."),
    "run": ("run", "Launch the command once on all workers from the latest checkpoint and follow it."),
    "recreate": ("recreate", "Delete and create the TPU again from the saved spec."),
    "init": ("init", "Read an existing TPU and write tpuwatch.toml with its spec captured."),
    "precheck": ("precheck", "Run the environment checks on every worker now."),
    "drill": ("drill", "A maintenance fire drill on the job's TPU: simulate one, time the recovery."),
    "sim": ("sim", "The local TPU simulator: serve, inject faults."),
    "demo": ("demo", "A simulated pod slice end to end: faults injected, recovered, summarised."),
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, (mod, _) in COMMANDS.items() if _module_exists(mod)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(f"tpuwatch.commands.{entry[0]}")
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(mod: str) -> bool:
    here = os.path.join(os.path.dirname(__file__), "commands", f"{mod}.py")
    return os.path.exists(here)


EPILOG = """\b
Examples:
  tpuwatch init llm-pod --zone us-central2-b     # capture the TPU's spec in tpuwatch.toml
  tpuwatch status llm-pod                        # state, health, maintenance, workers
  tpuwatch watch -c tpuwatch.toml                # keep the job alive, live dashboard
  */5 * * * * tpuwatch check -c ~/tpuwatch.toml  # or one tick from cron
  tpuwatch demo                                  # see it work on a simulated pod slice

Exit codes: 0 ok, 1 the job failed or needs a person, 2 bad usage or config,
3 cannot reach or use the cloud API.
"""


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tpuwatch")
@click.option("--debug", is_flag=True, envvar="TPUWATCH_DEBUG", help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tpuwatch keeps long training jobs alive on Cloud TPU VMs and pod slices.

    It watches the TPU and its audit log, reruns the training command on every worker
    from the latest complete checkpoint, and recreates the TPU when it will not heal.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI and map expected errors to exit codes."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("TPUWATCH_DEBUG", "") not in ("", "0")
    try:
        rv: Any = cli.main(args=args, prog_name="tpuwatch", standalone_mode=False)
    except TpuwatchError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_JOB_FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # an unexpected bug: say so, keep the traceback for --debug
        if debug:
            raise
        click.echo(
            f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback "
            "and please report it)",
            err=True,
        )
        sys.exit(EXIT_JOB_FAILED)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
