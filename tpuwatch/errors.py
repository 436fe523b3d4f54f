"""Expected errors and the exit codes they map to (the README's exit-code table).

Every error a user can cause or meet carries its exit code and a message that names the
key, flag or call at fault and what to do. The CLI renders these without a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_JOB_FAILED = 1  # the job failed or needs a person
EXIT_USAGE = 2  # bad usage or bad config
EXIT_CLOUD = 3  # cannot reach or use the cloud API


class TpuwatchError(Exception):
    """An expected error: shown as one message, no traceback, with its exit code."""

    exit_code = EXIT_JOB_FAILED

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(TpuwatchError):
    """Bad usage, flag or config value (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A config key is missing, unknown or has a bad value (exit 2)."""


class CloudError(TpuwatchError):
    """The cloud API cannot be reached or used: credentials, permission, disabled API (exit 3)."""

    exit_code = EXIT_CLOUD


class NotFoundError(TpuwatchError):
    """A named resource does not exist (exit 1: a person must look)."""

    exit_code = EXIT_JOB_FAILED


class JobFailed(TpuwatchError):
    """The job failed or needs a person (exit 1)."""

    exit_code = EXIT_JOB_FAILED


class HostReportRefused(TpuwatchError):
    """The cloud refused to take a host as faulty (not offered for this VM's provisioning model,
    the VM not running, no permission, or no such call at all): not a failure, the policy decides
    again with it. `code` is the service's word."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class MaintenanceRefused(TpuwatchError):
    """The service refused to start a maintenance early (not offered for this TPU type, or none
    pending): not a failure, the policy decides again with it. `code` is the service's word."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class HostKeysRefused(TpuwatchError):
    """Reading the workers' published SSH host keys (guest attributes) was refused for lack of a
    permission: the keys may well exist, but tpuwatch cannot check a worker's key against them.
    `permission` is the one the read needs."""

    def __init__(self, message: str, *, permission: str) -> None:
        super().__init__(message)
        self.permission = permission
