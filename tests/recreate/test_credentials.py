"""A job command that holds a credential stays out of node metadata, and out of printed requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch import credentials
from tpuwatch import recreate as rc
from tpuwatch.config import load_config

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.mark.parametrize(("command", "seen"), [
    ("WANDB_API_KEY=0123456789abcdef python3 train.py", "WANDB_API_KEY=…"),
    ("export HF_TOKEN=x1y2z3; python3 train.py", "HF_TOKEN=…"),
    ("python3 train.py --hf_token " + TOKEN, "--hf_token …"),
    ("python3 train.py --api-key=abc123 --resume={checkpoint}", "--api-key …"),
    ("AWS_SECRET_ACCESS_KEY='abc/def' python3 train.py", "AWS_SECRET_ACCESS_KEY=…"),
    ("python3 train.py --wandb " + TOKEN, "a Hugging Face token"),
    ("curl -H 'Authorization: Bearer ya29.a0AfH6SMBx1234567890abcdefgh' x", "a Google OAuth access token"),
    ("python3 t.py --key AKIAIOSFODNN7EXAMPLE", "an AWS access key id"),
])
def test_what_people_paste_is_seen_and_redacted(command: str, seen: str) -> None:
    assert seen in credentials.describe(command)
    shown = credentials.redact(command)
    assert "<redacted>" in shown
    secret = {c.start: command[c.start:c.end] for c in credentials.find(command)}
    assert secret and not any(v in shown for v in secret.values())


@pytest.mark.parametrize("command", [
    "cd ~/repo && python3 train.py --resume={checkpoint}",
    "TOKENIZERS_PARALLELISM=false python3 t.py --max_tokens 100 --tokenizer_path=/data/tok",
    "HF_TOKEN=$HF_TOKEN python3 t.py --hf_token \"$HF_TOKEN\"",
    "python3 t.py --token-file ~/.hf/token --password-file /etc/pw",
    "SECRET_PATH=/var/secrets/key.json python3 t.py --num_tokens 2048",
])
def test_ordinary_commands_and_references_are_not_credentials(command: str) -> None:
    assert credentials.find(command) == []
    assert credentials.redact(command) == command


def _cfg(tmp_path: Path, command: str, *, opted_in: bool = False) -> object:
    path = tmp_path / "tpuwatch.toml"
    path.write_text(
        '[tpu]\nname = "pod"\nzone = "us-central2-b"\n'
        '[tpu.spec]\naccelerator_type = "v4-8"\nruntime_version = "tpu-ubuntu2204-base"\n'
        f'[job]\ncommand = {command!r}\ncheckpoint_dir = "gs://b/ck"\n'
        + ("command_in_metadata = true\n" if opted_in else ""))
    return load_config(path)


def test_a_command_with_a_credential_is_not_written_to_node_metadata(tmp_path: Path) -> None:
    launch = {"attempt": "4", "checkpoint": "gs://b/ck/900", "step": "900"}
    cfg = _cfg(tmp_path, f"HF_TOKEN={TOKEN} python3 train.py --resume={{checkpoint}}")
    meta = rc.launch_metadata(cfg, launch)  # type: ignore[arg-type]
    assert TOKEN not in repr(meta) and "tpuwatch-command" not in meta
    assert meta["tpuwatch-command-withheld"] == "true"
    assert not {"tpuwatch-attempt", "tpuwatch-checkpoint", "tpuwatch-step"} & set(meta)  # set up only
    assert "HF_TOKEN=…" in rc.command_withheld_note(cfg)  # type: ignore[arg-type]
    assert TOKEN not in repr(rc.create_request_json(cfg, "us-central2-b", "p", launch))  # type: ignore[arg-type]
    # opted in: written, and still hidden from what tpuwatch prints
    opted = _cfg(tmp_path, f"HF_TOKEN={TOKEN} python3 train.py --resume={{checkpoint}}", opted_in=True)
    meta = rc.launch_metadata(opted, launch)  # type: ignore[arg-type]
    assert TOKEN in meta["tpuwatch-command"] and meta["tpuwatch-attempt"] == "4"
    assert "tpuwatch-command-withheld" not in meta and rc.command_withheld_note(opted) == ""  # type: ignore[arg-type]
    printed = repr(rc.redacted(rc.create_request_json(opted, "us-central2-b", "p", launch)))  # type: ignore[arg-type]
    assert TOKEN not in printed and "HF_TOKEN=<redacted>" in printed
    # a plain command is written as always, so the new node starts the job at boot
    plain = rc.launch_metadata(_cfg(tmp_path, "python3 train.py --resume={checkpoint}"), launch)  # type: ignore[arg-type]
    assert plain["tpuwatch-command"].startswith("python3") and plain["tpuwatch-attempt"] == "4"


def test_command_in_metadata_must_be_a_boolean(tmp_path: Path) -> None:
    from tpuwatch.errors import ConfigError

    path = tmp_path / "bad.toml"
    path.write_text('[tpu]\nname = "pod"\nzone = "us-central2-b"\n[job]\ncommand = "x"\ncommand_in_metadata = "yes"\n')
    with pytest.raises(ConfigError, match="job.command_in_metadata"):
        load_config(path)
