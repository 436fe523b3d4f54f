"""Webhook URLs ([[notify]] url): checked when the config is read, kept hidden, and their
${VAR} references read from the environment only when alerts are sent (watch, check), so the
commands that send none do not need the secret. No message ever shows the value."""

from __future__ import annotations

import os
import re

from tpuwatch.errors import ConfigError

_ENV_REF = re.compile(r"\$\{([^}]*)\}")


class Secret:
    """A value that must never be shown (a webhook URL carries its token): str() and repr() hide it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value itself, for the one place that uses it (the HTTP request)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def webhook_template(key: str, text: str) -> Secret:
    """A webhook URL, or a template with ${VAR} references (read later by `resolve_webhook`)."""
    for name in _ENV_REF.findall(text):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ConfigError(f"{key}: ${{{name[:40]}}} is not an environment variable reference; write ${{NAME}} "
                              "with letters, digits and _")
    if "$" in _ENV_REF.sub("", text):
        raise ConfigError(f"{key}: write an environment variable as ${{NAME}} (with braces)")
    if not _ENV_REF.search(text):
        _check_url(key, text, expanded=False)
    return Secret(text)


def _check_url(key: str, url: str, *, expanded: bool) -> None:
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    if scheme.lower() not in ("http", "https") or not host or any(c.isspace() for c in url):
        where = "after reading the environment, " if expanded else ""
        raise ConfigError(f"{key}: {where}the value is not an http:// or https:// URL with a host; set it to the "
                          "webhook URL your chat or alerting tool gave you (the value itself is not shown)")


def resolve_webhook(key: str, template: Secret) -> Secret:
    """The URL with its ${VAR} references read from the environment (ConfigError, exit 2, naming
    the key and the variable when one is unset)."""

    def expand(m: re.Match[str]) -> str:
        name = m.group(1)
        got = os.environ.get(name)
        if not got:
            raise ConfigError(f"{key}: the environment variable {name} is not set (or empty); export {name}=<the "
                              "webhook URL> where tpuwatch runs (cron and systemd start it with an almost empty "
                              "environment)")
        return got

    text = template.reveal()
    url = _ENV_REF.sub(expand, text)
    _check_url(key, url, expanded=url != text)
    return Secret(url)
