"""Errors raised by the nvtrain library, and the exit codes of the ``nvtrain`` command.

The library raises; only ``nvtrain.cli`` turns an error into a message and an exit code::

    NvtrainError                 base of everything nvtrain raises on purpose
    +-- ConfigError              a policy or timings file is unreadable or invalid;
    |                            carries every finding, not only the first (exit 2)
    +-- UsageError               the command line asks for something impossible (exit 2)

Exit codes are part of the interface: a Kubernetes ``podFailurePolicy`` decides from them
whether a failed pod is worth another try.

====  ====================================================  ==========
code  meaning                                               retry?
====  ====================================================  ==========
0     finished (``validate``: no errors)                    --
1     workers failed and the restart budget is spent;       policy
      ``validate --strict``: warnings found
2     bad usage or invalid policy                           never
3     peers' DNS names not resolved (``dns_timeout``) or    yes
      the rendezvous not completed (``join_timeout``)
4     the same fault repeats without progress (escalation;  never
      also NVRx 0.7+'s "do not restart" exit code 93)
128+N stopped by signal N (143 = SIGTERM)                   scheduler
====  ====================================================  ==========
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nvtrain.findings import Finding

__all__ = ["ConfigError", "ExitCode", "NvtrainError", "UsageError", "signal_exit_code"]


class ExitCode(enum.IntEnum):
    """Exit codes of the ``nvtrain`` command (see the module docstring)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    RENDEZVOUS = 3
    ESCALATED = 4


def signal_exit_code(signum: int) -> int:
    """The exit code for a process stopped by signal ``signum`` (the shell's 128+N)."""
    return 128 + signum


class NvtrainError(Exception):
    """Base of every error nvtrain raises on purpose. ``exit_code`` says how the CLI ends."""

    exit_code: ExitCode = ExitCode.FAILED


class ConfigError(NvtrainError):
    """A policy (or timings) file cannot be used. ``findings`` lists every problem found."""

    exit_code = ExitCode.USAGE

    def __init__(self, source: str, findings: Sequence[Finding]) -> None:
        self.source = source
        self.findings = list(findings)
        errors = sum(1 for f in self.findings if f.severity == "error")
        super().__init__(f"{source}: {errors} error(s)")


class UsageError(NvtrainError):
    """The command line asks for something that cannot be done; ``fix`` says what to do."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, fix: str = "") -> None:
        self.message = message
        self.fix = fix
        super().__init__(message)
