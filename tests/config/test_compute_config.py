"""[tpu] api = "compute" with `instance` or `mig`: what loads, and the exit-2 errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch import tpuconfig
from tpuwatch.config import Config, load_config
from tpuwatch.errors import ConfigError

JOB = '[job]\ncommand = "python3 train.py"\n'


def load(tmp_path: Path, tpu: str) -> Config:
    path = tmp_path / "tpuwatch.toml"
    path.write_text("[tpu]\n" + tpu + JOB)
    return load_config(path)


def test_the_tpu_api_stays_the_default(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'name = "pod"\n')
    assert cfg.tpu["api"] == "tpu" and cfg.tpu["instance"] == "" and cfg.tpu["mig"] == ""


@pytest.mark.parametrize("key", ["instance", "mig"])
def test_a_compute_slice_names_the_job_and_its_node(tmp_path: Path, key: str) -> None:
    cfg = load(tmp_path, f'api = "compute"\n{key} = "ironwood"\nzone = "us-central1-c"\n')
    assert cfg.tpu[key] == "ironwood" and cfg.tpu_name == "ironwood" and cfg.job_name == "ironwood"


def test_a_saved_compute_spec_loads_as_written(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'api = "compute"\nmig = "slice"\n[tpu.compute_spec.mig]\nbaseInstanceName = "slice"\n'
                         'targetSize = 4\n[tpu.compute_spec.workload_policy]\ntype = "HIGH_THROUGHPUT"\n')
    assert cfg.tpu["compute_spec"]["mig"] == {"baseInstanceName": "slice", "targetSize": 4}


@pytest.mark.parametrize(("tpu", "message"), [
    ('api = "gce"\nname = "x"\n', "tpu.api: 'gce' is not one of tpu, compute"),
    ('api = "compute"\n', "tpu.instance, tpu.mig: with api = \"compute\", set one"),
    ('api = "compute"\ninstance = "a"\nmig = "b"\n', "set exactly one"),
    ('name = "x"\nmig = "b"\n', 'tpu.mig: names a Compute Engine MIG, but tpu.api is "tpu"; add api = "compute"'),
    ('name = "x"\ninstance = "b"\n', "tpu.instance: names a Compute Engine instance"),
    ('api = "compute"\nmig = "Bad_Name"\n', "tpu.mig: 'Bad_Name' is not a valid managed instance group name"),
    ('api = "compute"\nmig = "m"\nname = "other"\n', "tpu.name: 'other' is not tpu.mig 'm'"),
    ('api = "compute"\nmig = "m"\nqueued_resource = "q"\n', "tpu.queued_resource: not with api = \"compute\""),
    ('api = "compute"\nmig = "m-0"\nnames = ["m-0", "m-1"]\n', "tpu.names: not with api = \"compute\""),
    ('api = "compute"\nmig = "m"\nfallback_zones = ["us-east5-a"]\n', "tpu.fallback_zones: not with api"),
    ('api = "compute"\nmig = "m"\n[tpu.spec]\naccelerator_type = "v4-8"\nruntime_version = "r"\n',
     "tpu.spec: not with api = \"compute\""),
    ('api = "compute"\nmig = "m"\n[tpu.compute_spec.instance]\nname = "m"\n',
     "tpu.compute_spec.instance: the job names a mig"),
    ('api = "compute"\nmig = "m"\n[tpu.compute_spec.node]\nname = "m"\n',
     "tpu.compute_spec.node: unknown key"),
    ('name = "x"\n[tpu.compute_spec.mig]\nname = "m"\n', "tpu.compute_spec: only for api = \"compute\""),
    ('api = "compute"\nmig = "m"\nspares = ["zones/us-east5-a/instanceGroupManagers/m"]\n',
     "tpu.spares: 'm' is the job's own MIG (tpu.mig)"),
    ('api = "compute"\nmig = "m"\nflex_start = "24h"\nspares = ["m-spare"]\n[tpu.compute_spec.mig]\ntargetSize = 4\n',
     "tpu.spares: not with tpu.flex_start"),
    ('api = "compute"\ninstance = "vm"\nspares = ["zones/us-east5-a/instances/vm"]\n',
     "tpu.spares: 'vm' is the job's own instance (tpu.instance)"),
])
def test_a_compute_config_that_does_not_fit_is_refused_naming_the_key(tmp_path: Path, tpu: str,
                                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        load(tmp_path, tpu)
    assert message in str(err.value), str(err.value)


def test_a_flex_start_mig_loads_its_run_duration(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'api = "compute"\nmig = "slice"\nflex_start = "24h"\n[tpu.compute_spec.mig]\ntargetSize = 4\n')
    assert cfg.tpu["flex_start"] == 24 * 3600.0


@pytest.mark.parametrize(("tpu", "message"), [
    ('api = "compute"\nmig = "slice"\nflex_start = "5m"\n[tpu.compute_spec.mig]\ntargetSize = 4\n',
     "tpu.flex_start: '5m' is not a flex-start run duration; Compute Engine takes 10m to 7d"),
    ('api = "compute"\nmig = "slice"\nflex_start = "8d"\n[tpu.compute_spec.mig]\ntargetSize = 4\n',
     "tpu.flex_start: '8d' is not a flex-start run duration"),
    ('api = "compute"\ninstance = "vm"\nflex_start = "1h"\n', "tpu.flex_start: flex-start resize requests are a MIG's"),
    ('api = "compute"\nmig = "slice"\nflex_start = "1h"\n', "tpu.compute_spec.mig.targetSize: tpu.flex_start needs"),
    ('name = "pod"\nflex_start = "1h"\n', "tpu.flex_start: a Compute Engine MIG's resize requests"),
])
def test_a_flex_start_key_that_does_not_fit_is_refused_naming_it(tmp_path: Path, tpu: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, tpu)
    assert message in str(err.value)


def test_report_faulty_hosts_is_off_by_default_and_for_compute_engine_only(tmp_path: Path) -> None:
    assert load(tmp_path, 'api = "compute"\ninstance = "vm"\n').recovery["report_faulty_hosts"] is False
    on = load(tmp_path, 'api = "compute"\ninstance = "vm"\n[recovery]\nreport_faulty_hosts = true\n')
    assert on.recovery["report_faulty_hosts"] is True
    with pytest.raises(ConfigError, match=r"recovery.report_faulty_hosts: the Cloud TPU API has no call .* remove it"):
        load(tmp_path, 'name = "pod"\n[recovery]\nreport_faulty_hosts = true\n')
    with pytest.raises(ConfigError, match="recovery.report_faulty_hosts: expected true or false"):
        load(tmp_path, 'api = "compute"\ninstance = "vm"\n[recovery]\nreport_faulty_hosts = "yes"\n')


def test_the_gcloud_transport_is_taken_for_a_compute_engine_slice(tmp_path: Path) -> None:
    # `gcloud compute ssh` prepares a Compute Engine slice as `gcloud compute tpus tpu-vm ssh` does a node
    for kind in ('instance = "vm"', 'mig = "slice"'):
        assert load(tmp_path, f'api = "compute"\n{kind}\n[ssh]\ntransport = "gcloud"\n').ssh["transport"] == "gcloud"
    assert load(tmp_path, 'name = "pod"\n[ssh]\ntransport = "gcloud"\n').ssh["transport"] == "gcloud"


def test_an_older_inits_bare_machine_and_disk_types_become_partial_urls_in_the_slices_zone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # said once per process: as in a fresh one, whatever this pytest worker loaded before
    monkeypatch.setattr(tpuconfig, "_repaired_said", set())
    # Compute Engine refuses a bare name in an instance insert ("The URL is malformed.")
    spec = ('api = "compute"\ninstance = "vm"\nzone = "us-central1-c"\n[tpu.compute_spec.instance]\n'
            'machineType = "tpu7x-standard-4t"\n[[tpu.compute_spec.instance.disks]]\nboot = true\n'
            '[tpu.compute_spec.instance.disks.initializeParams]\ndiskType = "hyperdisk-balanced"\n')
    with caplog.at_level("WARNING"):
        first, again = load(tmp_path, spec), load(tmp_path, spec)
    for cfg in (first, again):
        instance = cfg.tpu["compute_spec"]["instance"]
        assert instance["machineType"] == "zones/us-central1-c/machineTypes/tpu7x-standard-4t"
        assert instance["disks"][0]["initializeParams"]["diskType"] == "zones/us-central1-c/diskTypes/hyperdisk-balanced"
    said = [r.getMessage() for r in caplog.records if "older `tpuwatch init`" in r.getMessage()]
    assert len(said) == 1 and "tpu.compute_spec.instance.machineType" in said[0], said  # once
    # a URL already there is kept as written
    cfg = load(tmp_path, spec.replace('"tpu7x-standard-4t"', '"projects/p/zones/us-central1-c/machineTypes/tpu7x-standard-4t"'))
    assert cfg.tpu["compute_spec"]["instance"]["machineType"] == "projects/p/zones/us-central1-c/machineTypes/tpu7x-standard-4t"
