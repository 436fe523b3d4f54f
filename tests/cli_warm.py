"""Imported by the server that `cli_process` forks commands from: what a one-shot `tpuwatch`
command imports, loaded once (the command modules, the client libraries, the Compute Engine
clients through tpuwatch's own lazy loader). Importing is all it does: no thread, no client,
no environment read, so each forked child starts as a new process would, only warm."""

from __future__ import annotations

import importlib

import tpuwatch.cli
from tpuwatch.cloud import clients

for _name in ("check", "history", "init", "status", "events", "report", "recreate", "drill", "precheck", "run"):
    importlib.import_module(f"tpuwatch.commands.{_name}")
for _module in ("tpuwatch.tick", "tpuwatch.wiring", "tpuwatch.cloud.logs", "tpuwatch.cloud.tpu.adapter",
                "tpuwatch.cloud.compute", "tpuwatch.workers.sshworkers", "tpuwatch.journal",
                "google.cloud.tpu_v2", "google.cloud.logging_v2.services.logging_service_v2"):
    importlib.import_module(_module)
for _kind in ("instances", "instanceGroupManagers", "instanceTemplates", "zoneOperations",
              "regionInstanceGroupManagers", "regionOperations", "resourcePolicies", "disks"):
    getattr(clients.compute_v1(), clients._COMPUTE_CLIENTS[_kind])

assert tpuwatch.cli.COMMANDS
