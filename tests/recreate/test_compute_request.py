"""The insert body a recreate sends for a Compute Engine instance or MIG (recreate.compute_request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch.config import load_config
from tpuwatch.errors import UsageError
from tpuwatch.recreate import compute_request

INSTANCE = """\
[tpu]
api = "compute"
instance = "vm"
zone = "us-central1-c"
[tpu.compute_spec.instance]
machineType = "tpu7x-standard-4t"
labels = { team = "ml", tpuwatch-job = "old" }
[tpu.compute_spec.instance.metadata]
fingerprint = "abc"
items = [{ key = "owner-note", value = "kept" }, { key = "tpuwatch-command", value = "stale" }]
[job]
name = "run"
command = "python3 train.py"
"""


def test_an_instance_is_inserted_with_the_owner_label_and_the_launch_metadata(tmp_path: Path) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(INSTANCE)
    body = compute_request(load_config(path), {"attempt": "3", "user": "me"})
    assert body["labels"] == {"team": "ml", "tpuwatch-job": "run"}
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert items["owner-note"] == "kept" and items["tpuwatch-command"] == "python3 train.py"
    assert items["tpuwatch-attempt"] == "3" and items["tpuwatch-job"] == "run"
    assert "fingerprint" not in body["metadata"]  # a stale fingerprint would be refused


def test_an_instance_captured_mid_hand_over_is_inserted_without_the_hand_overs_labels(tmp_path: Path) -> None:
    """`init` run while the instance was lent (job priorities) saves those labels: an instance made
    again from them must not read as a loan, an ask, or another priority's."""
    path = tmp_path / "tpuwatch.toml"
    path.write_text(INSTANCE.replace('labels = { team = "ml", tpuwatch-job = "old" }',
                                     'labels = { team = "ml", tpuwatch-job = "hi", tpuwatch-lent-by = "run", '
                                     'tpuwatch-priority = "500", tpuwatch-wanted-by = "top", '
                                     'tpuwatch-wanted-priority = "900", tpuwatch-returned-by = "hi", '
                                     'tpuwatch-idle = "true" }'))
    assert compute_request(load_config(path))["labels"] == {"team": "ml", "tpuwatch-job": "run"}


def test_a_mig_is_inserted_as_saved_and_a_missing_spec_says_to_run_init(tmp_path: Path) -> None:
    path = tmp_path / "tpuwatch.toml"
    path.write_text('[tpu]\napi = "compute"\nmig = "slice"\n[tpu.compute_spec.mig]\nbaseInstanceName = "slice"\n'
                    'targetSize = 4\n[job]\ncommand = "x"\n')
    assert compute_request(load_config(path)) == {"baseInstanceName": "slice", "targetSize": 4}
    path.write_text('[tpu]\napi = "compute"\nmig = "slice"\n[job]\ncommand = "x"\n')
    with pytest.raises(UsageError, match=r"tpu.compute_spec.mig: missing; run `tpuwatch init slice`"):
        compute_request(load_config(path))
