"""`Simulator`: the whole local stand-in for Cloud TPU as one object.

```python
with Simulator(root=tmp_path, speed=600) as sim:
    os.environ.update(sim.env)          # TPUWATCH_EMULATOR_HOST=127.0.0.1:PORT, project, zone
    sim.create_node("pod", "v4-32")     # READY, four SSH workers
    sim.world.maintenance("pod", heal_after=1800)
```
It owns the gRPC server (TPU v2/v2alpha1, Operations, Logging, control), the world model and
its scheduler thread, the simulated hosts (SSH workers and each worker's metadata server, which
answers from the world's live values; unless `workers=False`) and the shared bucket directory. `close()` stops them all and leaves no process or thread running. This module
wires parts together; behaviour lives in world.py, grpc_api.py, hosts.py and faults.py.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tpuwatch.errors import UsageError
from tpuwatch.sim import faults
from tpuwatch.sim.records import NodeRec, NodeSpec
from tpuwatch.sim.scenario import Scenario, Step
from tpuwatch.sim.world import World

log = logging.getLogger(__name__)

DEFAULT_PROJECT = "sim-project"
DEFAULT_ZONE = "us-central2-b"


class Simulator:
    """A running simulated cloud; see the module docstring."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        speed: float | None = None,
        seed: int | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        project: str | None = None,
        zone: str | None = None,
        zones: list[str] | None = None,
        workers: bool = True,
        ssh_key: str | Path | None = None,
        delays: Mapping[str, float] | None = None,
        log_latency: float | None = None,
        log_read_quota: int | None = None,
        scenario: Scenario | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        sc = scenario or Scenario()
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="tpuwatch-sim-")) if root is None else Path(root)
        self.port = port
        self.host = host
        self.scenario = sc
        self.on_event = on_event or (lambda text: log.info("%s", text))
        self.step_errors: list[str] = []
        self._workers = workers
        self._ssh_key_src = Path(ssh_key).expanduser() if ssh_key is not None else None
        self.world = World(
            speed=speed if speed is not None else (sc.speed or 600.0),
            seed=seed if seed is not None else (sc.seed or 0),
            project=project or sc.project or DEFAULT_PROJECT,
            zone=zone or sc.zone or DEFAULT_ZONE,
            zones=zones if zones is not None else sc.zones,
            delays={**sc.delays, **(delays or {})},
            log_latency=log_latency if log_latency is not None else (sc.log_latency or 0.0),
            log_read_quota=log_read_quota,
        )
        self.hosts: Any = None
        self._server: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    # --- what clients need ------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def project(self) -> str:
        return self.world.project

    @property
    def zone(self) -> str:
        return self.world.zone

    @property
    def speed(self) -> float:
        return self.world.speed

    @property
    def env(self) -> dict[str, str]:
        """Environment for a tpuwatch process (or test) that should talk to this simulator."""
        env = {
            "TPUWATCH_EMULATOR_HOST": self.address,
            "CLOUDSDK_CORE_PROJECT": self.project,
            "CLOUDSDK_COMPUTE_ZONE": self.zone,
        }
        if self.hosts is not None and self.ssh_user is not None:
            env.update(
                {
                    "TPUWATCH_SIM_SSH_KEY": str(self.ssh_key),
                    "TPUWATCH_SIM_SSH_USER": self.ssh_user,
                    "TPUWATCH_SIM_SSH_PORT": str(self.ssh_port),
                }
            )
        env["TPUWATCH_SIM_BUCKET"] = str(self.bucket)
        return env

    @property
    def bucket(self) -> Path:
        """A directory outside every worker, shared by all: the checkpoint "bucket"."""
        return self.root / "bucket"

    @property
    def ssh_key(self) -> Path | None:
        return Path(self.hosts.client_key) if self.hosts is not None else None

    @property
    def ssh_port(self) -> int | None:
        return int(self.hosts.ssh_port) if self.hosts is not None else None

    @property
    def ssh_user(self) -> str | None:
        return str(self.hosts.ssh_user) if self.hosts is not None else None

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> Simulator:
        with self._lock:
            if self._started:
                return self
            self._started = True
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        import grpc

        from tpuwatch.sim.grpc_api import Services

        self.root.mkdir(parents=True, exist_ok=True)
        self.bucket.mkdir(parents=True, exist_ok=True)
        # Bind the port first: the cheapest thing to fail, and nothing else runs yet. A plain
        # socket probe first, so a busy port gives our one-line error, not gRPC's C-core log.
        if self.port:
            self._probe_port()
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tpuwatch-sim-grpc")
        services = Services(self.world, control=self.control)
        self._server = grpc.server(
            self._executor,
            handlers=services.handlers(),
            options=[("grpc.so_reuseport", 0)],
        )
        try:
            bound = self._server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:
            bound = 0
        if not bound:
            raise self._port_error("the port is in use or not allowed")
        self.port = bound
        if self._workers:
            self._prepare_key()
            from tpuwatch.sim.hosts import Hosts

            self.hosts = Hosts(self.root / "hosts", speed=self.world.speed,
                               metadata_source=self.world.instance_metadata)
            self.hosts.start()
            self.world.hosts = self.hosts
        self.world.start()
        self._server.start()
        for node in self.scenario.nodes:
            faults.apply(self.world, "create-node", node)
            self.on_event(f"created node {node['name']} ({node['accelerator_type']})")
        for inst in self.scenario.instances:
            faults.apply(self.world, "create-instance", inst)
            self.on_event(f"created instance {inst['name']} ({inst['machine_type']})")
        for mig in self.scenario.migs:
            faults.apply(self.world, "create-mig", mig)
            self.on_event(f"created MIG {mig['name']} ({mig['size']} x {mig['machine_type']})")
        for step in self.scenario.steps:
            self.world.after(step.at, self._step_runner(step))

    def _port_error(self, why: str) -> UsageError:
        return UsageError(
            f"--port: cannot listen on {self.host}:{self.port} ({why}); "
            "choose another port or use --port 0 for a free one"
        )

    def _probe_port(self) -> None:
        import socket

        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((self.host, self.port))
        except OSError as exc:
            raise self._port_error(exc.strerror or str(exc))
        finally:
            probe.close()

    def _prepare_key(self) -> None:
        """With `ssh_key`, the workers accept that key (e.g. ~/.ssh/google_compute_engine)."""
        if self._ssh_key_src is None:
            return
        import asyncssh

        src = self._ssh_key_src
        if not src.is_file():
            raise UsageError(
                f"--ssh-key: {str(src)!r} does not exist; give a private key file (e.g. ~/.ssh/google_compute_engine)"
            )
        try:
            key = asyncssh.read_private_key(str(src))
        except (OSError, asyncssh.KeyImportError) as exc:
            raise UsageError(
                f"--ssh-key: cannot read {str(src)!r} as an unencrypted private key: {exc}"
            )
        ssh_dir = self.root / "hosts" / "ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        dest = ssh_dir / "id_ed25519"
        for f in (dest, Path(str(dest) + ".pub")):
            if f.exists() or f.is_symlink():
                f.unlink()
        dest.symlink_to(src.resolve())
        key.write_public_key(str(dest) + ".pub")

    def _step_runner(self, step: Step) -> Callable[[], None]:
        def run() -> None:
            try:
                faults.apply(self.world, step.fault, step.params)
                self.on_event(f"step {step.index}: {step.describe()}")
            except Exception as exc:
                text = f"step {step.index} ({step.describe()}) failed: {exc}"
                self.step_errors.append(text)
                self.on_event(text)

        return run

    def close(self) -> None:
        """Stop the server, the scheduler and every worker process; remove an owned root."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        errors: list[BaseException] = []
        if self._server is not None:
            try:
                self._server.stop(grace=None).wait(10)
            except BaseException as exc:
                errors.append(exc)
        try:
            self.world.close()
        except BaseException as exc:
            errors.append(exc)
        if self.hosts is not None:
            try:
                self.hosts.close()
            except BaseException as exc:
                errors.append(exc)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- conveniences -----------------------------------------------------------------

    def create_node(
        self,
        name: str,
        accelerator_type: str = "v4-8",
        *,
        spot: bool = False,
        preemptible: bool = False,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        startup_script: str | None = None,
        runtime_version: str = "tpu-ubuntu2204-base",
        project: str | None = None,
        zone: str | None = None,
    ) -> NodeRec:
        """A READY+HEALTHY node with booted workers, made at once (no operation)."""
        meta = dict(metadata or {})
        if startup_script is not None:
            meta["startup-script"] = startup_script
        spec = NodeSpec(
            accelerator_type=accelerator_type,
            runtime_version=runtime_version,
            spot=spot,
            preemptible=preemptible,
            labels=dict(labels or {}),
            metadata=meta,
        )
        return self.world.add_node(name, spec, project=project, zone=zone)

    def inject(self, fault: str, **params: Any) -> Any:
        """Inject a fault by its `tpuwatch sim inject` name, options as keyword arguments."""
        return faults.apply(self.world, fault, faults.normalize(fault, params))

    def node_key(self, name: str, *, project: str | None = None, zone: str | None = None) -> str:
        """The hosts layer's key of a node: "project/zone/name"."""
        return f"{project or self.project}/{zone or self.zone}/{name}"

    # --- the control service (JSON over gRPC) -------------------------------------------

    def control(self, method: str, request: dict[str, Any]) -> Any:
        if method == "Inject":
            fault = request.get("fault")
            if not isinstance(fault, str):
                raise UsageError("fault: required")
            params = request.get("params") or {}
            if not isinstance(params, dict):
                raise UsageError("params: expected an object")
            result = faults.apply(self.world, fault, faults.normalize(fault, params))
            self.on_event(
                f"injected {fault} {params.get('node') or params.get('name') or ''}".rstrip()
            )
            return result
        if method == "Stats":
            w = self.world
            return {
                "calls": dict(w.calls),
                "injected": dict(w.injected),
                "list_log_entries_max_per_minute": w.max_calls_per_window("ListLogEntries", 60.0),
                "step_errors": list(self.step_errors),
            }
        if method == "Nodes":
            return [
                {
                    "name": n.full_name,
                    "id": str(n.id),
                    "state": n.state,
                    "health": n.health,
                    "health_description": n.health_description,
                    "accelerator_type": n.spec.accelerator_type,
                    "ips": n.ips,
                    "labels": n.spec.labels,
                }
                for n in self.world.nodes()
            ]
        raise UsageError(f"unknown control method {method!r}")
