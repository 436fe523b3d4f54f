"""A watcher-wide spare pool: a `[pool]` file beside the jobs' files, and a job's
`[tpu] spare_pool`; every bad value is exit 2 naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch.config import validate
from tpuwatch.errors import ConfigError
from tpuwatch.fleet import pools
from tpuwatch.wiring import load_job

ZONE = "us-central2-b"


def base(**tpu: object) -> dict[str, object]:
    return {"tpu": {"name": "apod", "zone": ZONE, **tpu}, "job": {"command": "python3 train.py"}}


def test_spare_pool_is_a_label_value_for_tpu_api_nodes_made_plainly() -> None:
    assert validate(base(spare_pool="v5p"))["tpu"]["spare_pool"] == "v5p"
    assert validate(base())["tpu"]["spare_pool"] == ""
    for tpu, fix in (({"spare_pool": "V5P!"}, "not a valid spare pool name"),
                     ({"spare_pool": "v5p", "queued_resource": "qr"}, "queued resource")):
        with pytest.raises(ConfigError, match=fix) as exc:
            validate(base(**tpu))
        assert str(exc.value).startswith("tpu.spare_pool") and exc.value.exit_code == 2, exc.value


def test_spare_pool_with_api_compute_is_for_an_instance_not_a_mig() -> None:
    compute = {"zone": ZONE, "api": "compute", "spare_pool": "v6e"}
    assert validate({"tpu": {**compute, "instance": "vm"}, "job": {"command": "t"}})["tpu"]["spare_pool"] == "v6e"
    # a Spot VM Google deletes at its preemption too: the keeper makes a pool's one again on the
    # audit log's word (policy/pool.py)
    for action in ("STOP", "DELETE"):
        spec = {"instance": {"scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": action}}}
        assert validate({"tpu": {**compute, "instance": "vm", "compute_spec": spec}, "job": {"command": "t"}})
    with pytest.raises(ConfigError, match="not with tpu.mig: .* a MIG has no labels of its own") as exc:
        validate({"tpu": {**compute, "mig": "grp"}, "job": {"command": "t"}})
    assert str(exc.value).startswith("tpu.spare_pool") and exc.value.exit_code == 2, exc.value


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


POOL = '[pool]\nname = "v5p"\nzone = "us-central2-b"\naccelerator_type = "v5p-16"\nspares = ["sp-0", "sp-1"]\n'


def test_a_pool_file_is_read_and_a_job_file_is_not_one(tmp_path: Path) -> None:
    path = write(tmp_path, "pool-v5p.toml", POOL)
    job = write(tmp_path, "a.toml", '[tpu]\nname = "apod"\nzone = "us-central2-b"\n[job]\ncommand = "t"\n')
    assert pools.is_pool(path) and not pools.is_pool(job)
    p = pools.load(path)
    assert (p.name, p.zone, p.accelerator_type, p.spares) == ("v5p", ZONE, "v5p-16", ("sp-0", "sp-1"))


@pytest.mark.parametrize(("text", "key", "fix"), [
    ('[pool]\nzone = "us-central2-b"\nspares = ["sp-0"]\n', "pool.name", "required"),
    ('[pool]\nname = "v5p"\nspares = ["sp-0"]\n', "pool.zone", "required"),
    ('[pool]\nname = "v5p"\nzone = "us-central2-b"\n', "pool.spares", "at least one"),
    ('[pool]\nname = "v5p"\nzone = "us-central2-b"\nspares = ["SP 0"]\n', "pool.spares", "not a TPU name"),
    ('[pool]\nname = "v5p"\nzone = "us-central2-b"\nspares = ["sp-0"]\nsize = 2\n', "pool.size", "unknown key"),
    ('[pool]\nname = "v5p"\nzone = "us-central2-b"\nspares = ["sp-0"]\n[tpu]\nname = "x"\n', "pool", r"only \[pool\]"),
    ('[pool]\nname = "V5P"\nzone = "us-central2-b"\nspares = ["sp-0"]\n', "pool.name", "not a valid"),
    ('[pool]\nname = "v6e"\nzone = "us-central2-b"\napi = "gke"\nspares = ["vm-0"]\n', "pool.api",
     "set api = .tpu. .* or api = .compute."),
    ('[pool]\nname = "v6e"\nzone = "us-central2-b"\napi = "compute"\naccelerator_type = "v6e-4"\nspares = ["vm-0"]\n',
     "pool.accelerator_type", "not with api = 'compute'.* with machine_type"),
    ('[pool]\nname = "v5p"\nzone = "us-central2-b"\nmachine_type = "ct6e-standard-4t"\nspares = ["sp-0"]\n',
     "pool.machine_type", "not with api = 'tpu'.* with accelerator_type"),
])
def test_a_bad_pool_file_is_exit_2_naming_the_key(tmp_path: Path, text: str, key: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix) as exc:
        pools.load(write(tmp_path, "pool.toml", text))
    assert str(exc.value).startswith(f"pool.toml: {key}") and exc.value.exit_code == 2, exc.value


def test_two_pools_of_one_name_or_with_one_node_are_refused(tmp_path: Path) -> None:
    one = write(tmp_path, "p1.toml", POOL)
    same = write(tmp_path, "p2.toml", POOL.replace('["sp-0", "sp-1"]', '["sp-9"]'))
    with pytest.raises(ConfigError, match="also the pool of p1.toml") as exc:
        pools.load_all([one, same])
    assert exc.value.exit_code == 2
    shared = write(tmp_path, "p3.toml", POOL.replace('"v5p"', '"other"').replace('["sp-0", "sp-1"]', '["sp-1"]'))
    with pytest.raises(ConfigError, match="'sp-1' is also a spare of pool v5p") as exc:
        pools.load_all([one, shared])
    assert str(exc.value).startswith("p3.toml: pool.spares") and exc.value.exit_code == 2


@pytest.mark.parametrize(("tpu", "fix"), [
    ('spare_pool = "v6e"', "no spare pool 'v6e'"),
    ('spare_pool = "v5p"\nzone = "us-east5-a"', "is in zone us-central2-b"),
    ('spare_pool = "v5p"\nname = "sp-0"', "'sp-0' is a spare of pool v5p"),
    ('spare_pool = "v5p"\nspares = ["sp-1"]', "'sp-1' is a spare of pool v5p"),
    ('spare_pool = "v5p"\n[tpu.spec]\naccelerator_type = "v5p-32"\nruntime_version = "v2-alpha-tpuv5"',
     "holds v5p-16"),
])
def test_a_job_naming_a_pool_it_cannot_use_is_exit_2(tmp_path: Path, tpu: str, fix: str) -> None:
    found = pools.load_all([write(tmp_path, "pool.toml", POOL)])
    head = "" if 'name = "sp-0"' in tpu else 'name = "apod"\n'
    zone = "" if "zone =" in tpu else 'zone = "us-central2-b"\n'
    path = write(tmp_path, "a.toml", f'[job]\ncommand = "t"\n[tpu]\nproject = "my-proj"\n{head}{zone}{tpu}\n')
    job = load_job(path)
    with pytest.raises(ConfigError, match=fix) as exc:
        pools.check_job(found, job)
    assert str(exc.value).startswith("tpu.spare_pool") and exc.value.exit_code == 2, exc.value
    ok = write(tmp_path, "b.toml", '[job]\ncommand = "t"\n[tpu]\nproject = "my-proj"\nname = "bpod"\n'
                                   'zone = "us-central2-b"\nspare_pool = "v5p"\n')
    pools.check_job(found, load_job(ok))


def test_a_pool_of_instances_takes_its_spares_by_name_or_url(tmp_path: Path) -> None:
    head = '[pool]\nname = "v6e"\nzone = "us-central2-b"\nproject = "my-proj"\napi = "compute"\n'
    given = ('spares = ["vm-sp-0", "zones/us-central2-b/instances/vm-sp-1", '
             '"https://compute.googleapis.com/compute/v1/projects/my-proj/zones/us-central2-b/instances/vm-sp-2"]\n')
    assert pools.load(write(tmp_path, "pool.toml", head + given)).spares == ("vm-sp-0", "vm-sp-1", "vm-sp-2")
    for spares, fix in (('["zones/us-east5-a/instances/vm-sp-1"]', "is in zone us-east5-a, not the pool's zone"),
                        ('["projects/other/zones/us-central2-b/instances/x"]', "in project other, not the pool's"),
                        ('["zones/us-central2-b/instanceGroupManagers/grp"]', "not an instance name .* nor its URL")):
        with pytest.raises(ConfigError, match=fix) as exc:
            pools.load(write(tmp_path, "pool.toml", head + f"spares = {spares}\n"))
        assert str(exc.value).startswith("pool.toml: pool.spares") and exc.value.exit_code == 2, exc.value


COMPUTE_POOL = ('[pool]\nname = "v6e"\nzone = "us-central2-b"\napi = "compute"\n'
                'machine_type = "zones/us-central2-b/machineTypes/ct6e-standard-4t"\nspares = ["vm-sp-0"]\n')
SPEC = '[tpu.compute_spec.instance]\nmachineType = "zones/us-central2-b/machineTypes/{}"\n'


@pytest.mark.parametrize(("pool", "tpu", "fix"), [
    (COMPUTE_POOL, 'name = "apod"', "holds Compute Engine instances .* the job runs on Cloud TPU API nodes"),
    (POOL, 'api = "compute"\ninstance = "vm"', "holds Cloud TPU API nodes .* set api = 'compute' in the pool"),
    (COMPUTE_POOL, 'api = "compute"\ninstance = "vm"\n' + SPEC.format("ct6e-standard-8t"),
     "holds ct6e-standard-4t, the job runs on ct6e-standard-8t"),
    (COMPUTE_POOL, 'api = "compute"\ninstance = "vm-sp-0"', "'vm-sp-0' is a spare of pool v6e"),
])
def test_a_compute_job_and_a_pool_of_instances_must_match(tmp_path: Path, pool: str, tpu: str, fix: str) -> None:
    found = pools.load_all([write(tmp_path, "pool.toml", pool)])
    name = "v6e" if pool == COMPUTE_POOL else "v5p"
    path = write(tmp_path, "a.toml", f'[job]\ncommand = "t"\n[tpu]\nproject = "my-proj"\nzone = "us-central2-b"\n'
                                     f'spare_pool = "{name}"\n{tpu}\n')
    with pytest.raises(ConfigError, match=fix) as exc:
        pools.check_job(found, load_job(path))
    assert str(exc.value).startswith("tpu.spare_pool") and exc.value.exit_code == 2, exc.value
    if name == "v6e":  # a job of the pool's API and machine type takes it
        ok = write(tmp_path, "b.toml", '[job]\ncommand = "t"\n[tpu]\nproject = "my-proj"\nzone = "us-central2-b"\n'
                                       'spare_pool = "v6e"\napi = "compute"\ninstance = "vm-b"\n'
                                       + SPEC.format("ct6e-standard-4t"))
        pools.check_job(found, load_job(ok))
        assert found["v6e"].api == "compute" and found["v6e"].accelerator_type == "ct6e-standard-4t"


def test_check_of_a_config_dir_refuses_a_bad_pool_file_and_shows_a_job_naming_a_missing_pool(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import run_cli

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write(jobs, "pool-v5p.toml", POOL.replace('"us-central2-b"', '"not a zone"'))
    write(jobs, "a.toml", '[job]\ncommand = "t"\n[tpu]\nproject = "my-proj"\nname = "apod"\nzone = "us-central2-b"\n'
                          'spare_pool = "v6e"\n')
    code, out, err = run_cli(["check", "--config-dir", str(jobs), "--json"], capsys)
    assert code == 2 and "pool-v5p.toml: pool.zone" in out + err, (out, err)
    write(jobs, "pool-v5p.toml", POOL)
    code, out, err = run_cli(["check", "--config-dir", str(jobs), "--json"], capsys)
    assert code == 2 and "tpu.spare_pool: no spare pool 'v6e' in this watcher (its pools: v5p)" in out + err, (out, err)
