"""`tpuwatch sim`: run the local TPU simulator and inject faults into a running one.

`sim serve` starts a Simulator, prints the environment to use (KEY=VALUE lines on stdout) and
runs until SIGINT/SIGTERM; `sim inject FAULT …`, `sim stats` and `sim nodes` talk to a running
simulator through its control service. Fault names and options come from tpuwatch/sim/faults.py,
so they match scenario files exactly. This module only parses flags and prints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import click

from tpuwatch.errors import CloudError, UsageError

EMULATOR_ENV = "TPUWATCH_EMULATOR_HOST"


@click.group("sim")
def command() -> None:
    """The local TPU simulator: `serve` it, then point tpuwatch at it.

    \b
    Examples:
    tpuwatch sim serve --scenario demo.toml      # prints TPUWATCH_EMULATOR_HOST=… and SSH settings
    tpuwatch sim inject maintenance llm-pod --heal-after 30m
    tpuwatch sim inject create-node llm-pod --type v4-32
    tpuwatch sim stats                           # API calls counted so far
    """


@command.command("serve")
@click.option(
    "--scenario",
    "scenario_path",
    type=click.Path(dir_okay=False),
    help="Scenario TOML: nodes and timed faults.",
)
@click.option(
    "--port",
    type=int,
    default=8470,
    show_default=True,
    help="gRPC port on 127.0.0.1 (0 = any free port).",
)
@click.option(
    "--speed",
    type=float,
    default=None,
    help="Simulated seconds per real second [scenario, else 600].",
)
@click.option(
    "--seed", type=int, default=None, help="Seed for ids and injected errors [scenario, else 0]."
)
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for worker homes and the bucket [a temporary one, removed on exit].",
)
@click.option("--project", default=None, help="Default project [scenario, else sim-project].")
@click.option("--zone", default=None, help="Default zone [scenario, else us-central2-b].")
@click.option(
    "--ssh-key",
    type=click.Path(dir_okay=False),
    default=None,
    help="Private key the workers accept [a generated one].",
)
@click.option("--no-workers", is_flag=True, help="API only: no SSH workers.")
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the KEY=VALUE lines to this file.",
)
@click.option(
    "--rest-port",
    type=int,
    default=0,
    show_default=True,
    help="HTTP/JSON port for gcloud on 127.0.0.1 (0 = any free port).",
)
@click.option(
    "--gcloud-config",
    type=click.Path(file_okay=False),
    default=None,
    help="gcloud configuration directory to write, printed as CLOUDSDK_CONFIG [ROOT/gcloud].",
)
@click.option(
    "--gcloud-home",
    type=click.Path(file_okay=False),
    default=None,
    help="HOME for gcloud, given the workers' key as ~/.ssh/google_compute_engine [ROOT/gcloud-home].",
)
def serve(
    scenario_path: str | None,
    port: int,
    speed: float | None,
    seed: int | None,
    root: str | None,
    project: str | None,
    zone: str | None,
    ssh_key: str | None,
    no_workers: bool,
    env_file: str | None,
    rest_port: int,
    gcloud_config: str | None,
    gcloud_home: str | None,
) -> None:
    """Serve the simulated TPU and Logging APIs and SSH workers until interrupted."""
    from tpuwatch.sim import scenario as scenario_mod
    from tpuwatch.sim.simulator import Simulator

    for flag, value in (("--scenario", scenario_path), ("--root", root), ("--project", project), ("--zone", zone),
                        ("--ssh-key", ssh_key), ("--env-file", env_file), ("--gcloud-config", gcloud_config),
                        ("--gcloud-home", gcloud_home)):
        if value is not None and not value.strip():  # `--root "$DIR"` with DIR unset
            raise UsageError(f"{flag}: empty; give a value, or leave the flag out for the default")
    for flag, where in (("--root", root), ("--gcloud-config", gcloud_config), ("--gcloud-home", gcloud_home)):
        if where is not None:
            try:
                Path(where).expanduser().mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"{flag}: cannot create {where[:200]!r}: {exc.strerror or exc}") from None
    if not 0 <= port < 65536:
        raise UsageError(f"--port: {port} is not a TCP port (0-65535)")
    if not 0 <= rest_port < 65536:
        raise UsageError(f"--rest-port: {rest_port} is not a TCP port (0-65535)")
    if speed is not None and not 0 < speed < float("inf"):
        raise UsageError(f"--speed: must be a finite number above zero, got {speed}")
    sc = scenario_mod.load(scenario_path) if scenario_path else None

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    sim = Simulator(
        root=root,
        speed=speed,
        seed=seed,
        port=port,
        project=project,
        zone=zone,
        workers=not no_workers,
        ssh_key=ssh_key,
        scenario=sc,
        on_event=lambda text: click.echo(f"sim: {text}", err=True),
    )
    rest = None
    try:
        sim.start()
        from tpuwatch.sim import gcloudcfg
        from tpuwatch.sim.rest import RestFace

        rest = RestFace(sim.world, host=sim.host, port=rest_port).start()
        gcfg = gcloudcfg.write_config(
            Path(gcloud_config) if gcloud_config else sim.root / "gcloud",
            url=rest.url,
            project=sim.project,
            zone=sim.zone,
            home=(Path(gcloud_home) if gcloud_home else sim.root / "gcloud-home")
            if sim.hosts is not None
            else None,
            ssh_key=sim.ssh_key,
        )
        lines = [f"{k}={v}" for k, v in sim.env.items()] + [f"CLOUDSDK_CONFIG={gcfg.directory}"]
        text = "\n".join(lines) + "\n"
        if env_file:
            Path(env_file).write_text(text)
        click.echo(text, nl=False)
        if sim.hosts is not None:
            click.echo(
                f'sim: ssh settings for tpuwatch.toml: [ssh] user = "{sim.ssh_user}", '
                f'identity_file = "{sim.ssh_key}", port = {sim.ssh_port}',
                err=True,
            )
            click.echo(
                f"sim: each worker's metadata server is <worker ip>:{sim.hosts.metadata_port} "
                "(its processes get GCE_METADATA_HOST)",
                err=True,
            )
        if gcfg.home is not None:
            click.echo(
                f"sim: gcloud: CLOUDSDK_CONFIG={gcfg.directory} HOME={gcfg.home} gcloud compute tpus "
                f"tpu-vm ssh NAME --worker=all --ssh-flag='-p {sim.ssh_port}' --command '...'",
                err=True,
            )
        click.echo(
            f"sim: serving on {sim.address} (gRPC) and {rest.url} (REST, for gcloud) at speed "
            f"{sim.speed:g}; Ctrl-C to stop",
            err=True,
        )
        # Short waits: a signal landing just before a wait's system call is handled only when
        # the wait ends (CPython runs handlers between bytecodes), so a long wait could sit on it.
        while not stop.wait(0.5):
            pass
    finally:
        if rest is not None:
            rest.close()
        sim.close()
        for s, h in old.items():
            signal.signal(s, h)
    click.echo("sim: stopped", err=True)


def _host(host: str | None) -> str:
    if host is not None and not host.strip():
        raise UsageError("--host: empty; give the address `tpuwatch sim serve` printed, e.g. 127.0.0.1:8470")
    value = host or os.environ.get(EMULATOR_ENV, "")
    if not value:
        raise UsageError(
            f"--host: not given and {EMULATOR_ENV} is not set; use the address `tpuwatch sim serve` printed"
        )
    source = "--host" if host else EMULATOR_ENV
    value = value.strip().split("://", 1)[-1].rstrip("/")
    port = value.rsplit(":", 1)[-1]
    if not re.match(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$", value) or not 0 < int(port) < 65536:
        raise UsageError(f"{source}: {value[:200]!r} is not host:port; use the address `tpuwatch sim serve` "
                         "printed, e.g. 127.0.0.1:8470")
    return value


def _call(host: str, method: str, payload: dict[str, Any]) -> Any:
    import grpc

    from tpuwatch.sim.grpc_api import control_call

    try:
        return control_call(host, method, payload)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise UsageError(details or "invalid request")
        raise CloudError(
            f"simulator at {host}: {getattr(code, 'name', code)}: {details}; is `tpuwatch sim serve` running there?"
        )


@command.group("inject")
@click.option("--host", default=None, help=f"Simulator address [${EMULATOR_ENV}].")
@click.pass_context
def inject(ctx: click.Context, host: str | None) -> None:
    """Inject a fault into a running simulator (durations are simulated time)."""
    ctx.ensure_object(dict)
    ctx.obj["sim_host"] = host


def _make_fault_command(name: str) -> click.Command:
    from tpuwatch.sim.faults import FAULTS

    fault = FAULTS[name]
    params: list[click.Parameter] = []
    for p in fault.params:
        if p.name == fault.target:
            params.append(click.Argument([p.name], required=p.required))
            continue
        flag = p.cli or "--" + p.name.replace("_", "-")
        dest = p.name
        if p.kind == "bool":
            neg = "--no-" + flag[2:]
            params.append(click.Option([f"{flag}/{neg}", dest], default=None, help=p.help))
        elif p.kind in ("map",):
            params.append(
                click.Option([flag, dest], multiple=True, metavar="KEY=VALUE", help=p.help)
            )
        elif p.kind == "list":
            params.append(click.Option([flag, dest], multiple=True, metavar="A[,B]", help=p.help))
        elif p.kind == "choice":
            params.append(
                click.Option(
                    [flag, dest], type=click.Choice(p.choices, case_sensitive=False), help=p.help
                )
            )
        else:
            metavar = {"duration": "DURATION", "int": "N", "float": "X"}.get(p.kind, "TEXT")
            params.append(
                click.Option([flag, dest], metavar=metavar, required=p.required, help=p.help)
            )

    @click.pass_context
    def run(ctx: click.Context, **kwargs: Any) -> None:
        from tpuwatch.sim.faults import normalize

        raw: dict[str, Any] = {}
        for p in fault.params:
            v = kwargs.get(p.name)
            if v is None or v == ():
                continue
            if p.kind == "map":
                items = {}
                for item in v:
                    if "=" not in item:
                        raise UsageError(f"--{p.name}: expected KEY=VALUE, got {item!r}")
                    k, _, val = item.partition("=")
                    items[k] = val
                v = items
            elif p.kind == "list":
                v = [x.strip() for chunk in v for x in chunk.split(",") if x.strip()]
            raw[p.name] = v
        # Check here (names the flag, reads a startup script file) and send plain JSON values.
        payload = normalize(name, raw, base_dir=Path.cwd())
        host = _host(ctx.obj.get("sim_host") if ctx.obj else None)
        result = _call(host, "Inject", {"fault": name, "params": payload})
        if name in ("create-node", "create-queued-resource"):
            click.echo(json.dumps(result))
        else:
            target = raw.get(fault.target or "", "")
            click.echo(f"injected {name}{' into ' + str(target) if target else ''}")

    return click.Command(name, callback=run, params=params, help=fault.help)


def _register_faults() -> None:
    from tpuwatch.sim.faults import FAULTS

    for name in FAULTS:
        inject.add_command(_make_fault_command(name))


_register_faults()


@command.command("stats")
@click.option("--host", default=None, help=f"Simulator address [${EMULATOR_ENV}].")
def stats(host: str | None) -> None:
    """Print the API calls a running simulator has counted (JSON)."""
    click.echo(json.dumps(_call(_host(host), "Stats", {}), indent=2, sort_keys=True))


@command.command("nodes")
@click.option("--host", default=None, help=f"Simulator address [${EMULATOR_ENV}].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def nodes(host: str | None, as_json: bool) -> None:
    """List a running simulator's nodes with state, health and worker IPs."""
    rows = _call(_host(host), "Nodes", {})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(
            f"{r['name']}  {r['accelerator_type']}  {r['state']}/{r['health']}  {','.join(r['ips'])}"
        )
