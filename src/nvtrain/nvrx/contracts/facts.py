"""The kinds of fact a contract records about one NVRx release, and how each one reads.

A fact names a module by its import name and, where it concerns a definition, a dotted path
inside it: ``LocalElasticAgent._invoke_run_with_any_failed_policy`` is a method of a class;
``launch_agent._wait_grace`` a function defined inside another. ``uses`` says what in nvtrain
relies on it: one of the speed-ups of ``nvtrain.nvrx.ftmain`` (:data:`SPEEDUPS`), a guard of
``nvtrain.nvrx.storeguard``, or a part of the worker library or the log watcher. Pure data.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "ARGS",
    "CLEANUP",
    "GRACE",
    "GUARD_BIND",
    "GUARD_STATE",
    "LOGS",
    "MONITOR",
    "PARSERS",
    "ROUND",
    "SPEEDUPS",
    "WORKER",
    "Calls",
    "Fact",
    "Name",
    "Signature",
    "Text",
]

MONITOR = "monitor loop woken by child exits"
GRACE = "no exit grace (one node)"
CLEANUP = "worker groups cleaned up without a fixed second"
ROUND = "round counter synced before the wait for an open round"
SPEEDUPS = (MONITOR, GRACE, CLEANUP, ROUND)
"""ftmain's speed-ups, in the words of its log line; each is made only where its facts hold."""
ARGS = "script arguments kept from ft_launcher's parser"
GUARD_BIND = "store bound to the endpoint's address"
GUARD_STATE = "rendezvous state unpickled allow-listed"
WORKER = "the worker library (in-process restart, heartbeats)"
PARSERS = "nvrx.messages' parsers"
LOGS = "launcher.logwatch's log grammar"


@dataclasses.dataclass(frozen=True)
class Name:
    """``module`` binds ``path`` (a def, a class, an assignment or an import; a dotted path goes
    into classes and functions)."""

    module: str
    path: str
    uses: str

    def __str__(self) -> str:
        return f"{self.module} defines {self.path} ({self.uses})"


@dataclasses.dataclass(frozen=True)
class Signature:
    """The function ``path`` of ``module`` takes the parameters ``params`` (``self`` included
    for a method): exactly these, in this order, or (``exact=False``) at least these."""

    module: str
    path: str
    params: tuple[str, ...]
    uses: str
    exact: bool = True

    def __str__(self) -> str:
        kind = "exactly" if self.exact else "at least"
        return f"{self.module}: {self.path} takes {kind} ({', '.join(self.params)}) ({self.uses})"


@dataclasses.dataclass(frozen=True)
class Calls:
    """The function ``path`` of ``module`` calls ``call`` (a dotted name such as
    ``time.sleep``), with ``argument`` as its first argument where one is given."""

    module: str
    path: str
    call: str
    uses: str
    argument: str | None = None

    def __str__(self) -> str:
        what = f"{self.call}({self.argument or '...'})"
        return f"{self.module}: {self.path} calls {what} ({self.uses})"


@dataclasses.dataclass(frozen=True)
class Text:
    """``text`` occurs in the source of ``module`` (a message format nvtrain parses)."""

    module: str
    text: str
    uses: str

    def __str__(self) -> str:
        return f"{self.module} contains {self.text!r} ({self.uses})"


Fact = Name | Signature | Calls | Text
