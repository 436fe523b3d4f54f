"""What in a command looks like a credential.

A recreated node's metadata is readable by anyone with `tpu.nodes.get`, and people do write
`WANDB_API_KEY=... python train.py`. tpuwatch keeps such a command out of the metadata unless
the user opts in (`job.command_in_metadata`), and hides the values wherever it prints one.
The patterns aim at what people actually paste; a false positive only costs the boot-time start
(the watcher starts the job over SSH), never the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# NAME=value where the name says what it holds (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY).
_NAMED = re.compile(
    r"\b(?P<name>[A-Za-z0-9_]*(?:API_?KEY|ACCESS_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Za-z0-9_]*)"
    r"=(?P<value>[^\s;&|]+)",
    re.IGNORECASE,
)
# --api-key=value, --token value, --hf_token=value, --password value
_FLAG = re.compile(
    r"(?P<name>--[A-Za-z0-9_-]*(?:api[-_]?key|access[-_]?key|token|secret|password|passwd))(?:=|\s+)"
    r"(?P<value>[^\s;&|]+)",
    re.IGNORECASE,
)
# Formats that are credentials wherever they appear.
_FORMATS = (
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("an OpenAI-style secret key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("an AWS access key id", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[A-Za-z0-9_.-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")),
)
# Values that name a secret rather than hold one: a variable, a file, a flag's ordinary value.
_NOT_A_SECRET = re.compile(
    r"""^["']?(?:\$|/|~|\.{1,2}/|gs://|\d+$|true$|false$|none$|null$|yes$|no$|auto$|\{)""", re.IGNORECASE)


@dataclass(frozen=True)
class Credential:
    """One thing that looks like a credential: what it is (never the value) and where."""

    what: str
    start: int
    end: int


def find(text: str) -> list[Credential]:
    """Every credential-looking value in `text`, in order, spans not overlapping."""
    found: list[Credential] = []
    for pattern, joint in ((_NAMED, "="), (_FLAG, " ")):
        for m in pattern.finditer(text):
            if not _NOT_A_SECRET.match(m["value"]):
                found.append(Credential(f"{m['name']}{joint}…", m.start("value"), m.end("value")))
    for what, pattern in _FORMATS:
        found.extend(Credential(what, m.start(), m.end()) for m in pattern.finditer(text))
    kept: list[Credential] = []
    for c in sorted(found, key=lambda c: (c.start, -c.end)):
        if not kept or c.start >= kept[-1].end:
            kept.append(c)
    return kept


def describe(text: str) -> str:
    """"WANDB_API_KEY=…, a Hugging Face token" for what `find` sees in `text`; "" for nothing."""
    return ", ".join(dict.fromkeys(c.what for c in find(text)))


def redact(text: str) -> str:
    """`text` with every credential-looking value replaced by <redacted>."""
    out, at = [], 0
    for c in find(text):
        out += [text[at:c.start], "<redacted>"]
        at = c.end
    return "".join(out) + text[at:]
