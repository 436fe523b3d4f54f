"""[recovery.log_signatures]: the user's runtime signatures, validated (exit 2 naming the key and
the fix), merged with the built-ins (policy/signatures.py) and found in a worker's line."""

from __future__ import annotations

import re

import pytest

from tpuwatch.config import Config, default_state_dir, validate
from tpuwatch.errors import ConfigError
from tpuwatch.policy import PolicyConfig
from tpuwatch.policy.signatures import BUILTIN, BUILTIN_NAMES, find, log_signatures, worker_patterns


def config(table: object) -> dict[str, object]:
    return {"tpu": {"name": "pod", "zone": "us-central2-b"}, "job": {"command": "python3 train.py"},
            "recovery": {"log_signatures": table}}


def policy(table: object) -> PolicyConfig:
    return PolicyConfig.from_config(Config(values=validate(config(table)), path=None, state_dir=default_state_dir()))


@pytest.mark.parametrize(("table", "says"), [
    ({"x": {"pattern": "boom", "class": "hung"}}, "recovery.log_signatures.x.class: unknown class 'hung' (did you mean 'hang'?)"),
    ({"x": {"pattern": "boom("}}, "recovery.log_signatures.x.class: unknown class ''"),
    ({"x": {"pattern": "boom(", "class": "crash"}}, "recovery.log_signatures.x.pattern: not a valid regular expression"),
    ({"x": {"pattern": "step \\d+", "class": "hang"}}, "which do not share \\d: write [0-9]"),
    ({"x": {"pattern": "a[[:space:]]b", "class": "hang"}}, "POSIX classes such as [[:space:]]"),
    ({"x": {"pattern": "(?i)boom", "class": "hang"}}, "(?...) groups"),
    ({"x": {"pattern": "x*", "class": "hang"}}, "matches an empty line"),
    ({"x": {"pattern": "", "class": "hang"}}, "expected one line of 1 to 300 characters"),
    ({"x": {"class": "hang"}}, "recovery.log_signatures.x: missing pattern"),
    ({"x": {"pattern": "a", "class": "hang", "why": "?"}}, "unknown key 'why'; use pattern, class"),
    ({"Bad-Name": {"pattern": "a", "class": "hang"}}, "a signature name is lowercase letters"),
    ({"x": "boom"}, "recovery.log_signatures.x: expected { pattern"),
    (["boom"], "recovery.log_signatures: expected a table"),
])
def test_bad_signatures_are_refused_naming_the_key_and_the_fix(table: object, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        validate(config(table))


def test_off_must_name_a_built_in() -> None:
    with pytest.raises(ConfigError, match="class \"off\" turns off a built-in signature, and there is none of that "
                                          "name; built-ins are megascale_hang"):
        policy({"nccl": {"class": "off"}})


def test_the_users_table_adds_replaces_and_turns_off_built_ins() -> None:
    assert policy({}).log_signatures == BUILTIN
    sigs = policy({"nccl_watchdog": {"pattern": "Watchdog caught collective operation timeout", "class": "hang"},
                   "tpu_init_failed": {"class": "off"},
                   "tpu_busy": {"pattern": "vfio busy", "class": "crash"}}).log_signatures
    names = [s.name for s in sigs]
    assert names == ["megascale_hang", "jax_peer_died", "tpu_busy", "tpu_in_use", "nccl_watchdog"]
    assert find("x vfio busy y", sigs) is not None and find("x vfio busy y", sigs).kind == "crash"  # type: ignore[union-attr]
    assert find("TPU initialization failed", sigs) is None
    assert worker_patterns(sigs)[-1] == "Watchdog caught collective operation timeout"


@pytest.mark.parametrize(("line", "name"), [
    ("E0926 17:26:32 Megascale hang detected: Timed out waiting for 4 graphs to complete at launch_id 13650. "
     "Already completed: 100. StepGloballyInProgress: true. Timeout: 1m", "megascale_hang"),
    ("Megascale detects a hang that is likely caused by bad TPU chips on the following hosts.", "megascale_hang"),
    ("F0926 17:26:32.075587  157988 client.h:77] Terminating process because the JAX distributed service detected "
     "fatal errors. This most likely indicates that another task died", "jax_peer_died"),
    ("absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):", "jax_peer_died"),
    ("RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: open(/dev/vfio/0): "
     "Device or resource busy: Device or resource busy; Couldn't open iommu group /dev/vfio/0", "tpu_busy"),
    ("Failed to open /dev/vfio/0: Device or resource busy", "tpu_busy"),
    ("RuntimeError: InitializePjrtPlugin failed: The TPU is already in use by process 9999", "tpu_in_use"),
    ("jax.errors.JaxRuntimeError: TPU initialization failed: TPU_RET_CHECK failure", "tpu_init_failed"),
    ("step 100 loss 2.31", None),
])
def test_the_documented_lines_are_found_and_ordinary_ones_are_not(line: str, name: str | None) -> None:
    sig = find(line, BUILTIN)
    assert (sig.name if sig else None) == name
    assert set(BUILTIN_NAMES) == {s.name for s in log_signatures({})}


def test_megascale_abort_on_hang_is_on_by_default() -> None:
    assert validate(config({}))["job"]["megascale_abort_on_hang"] is True
    with pytest.raises(ConfigError, match="job.megascale_abort_on_hang"):
        validate({**config({}), "job": {"command": "x", "megascale_abort_on_hang": "yes"}})


def test_the_built_ins_pass_the_checks_a_users_signature_gets() -> None:
    table = {s.name: {"pattern": s.pattern, "class": s.kind} for s in BUILTIN}
    assert validate(config(table))["recovery"]["log_signatures"] == table
