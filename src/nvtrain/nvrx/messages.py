"""What NVRx's in-process layer says, read back: why a restart happened, why the layer gave up.

NVRx tells these things only in exception text (``RestartAbort``'s message, the interruption a
``RankShouldRestart`` carries), so reading them is parsing. Each parser here is tested on
messages recorded from every supported NVRx version (``tests/nvrx/``); the message formats they
rely on are part of each version's contract (``nvtrain.nvrx.contracts``). Pure: no NVRx import.
"""

from __future__ import annotations

import re

__all__ = ["PACKAGE", "from_nvrx", "gave_up_reason", "restart_cause"]

PACKAGE = "nvidia_resiliency_ext"
"""NVRx's import name: the one place outside the contracts that spells it."""


def from_nvrx(obj: object) -> bool:
    """Whether ``obj``'s class is one of NVRx's (an exception, a thread)."""
    module = type(obj).__module__
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def restart_cause(
    fn_exception: BaseException | None, interrupted: list[str], own_rank: int
) -> tuple[str, str]:
    """Why an in-process restart happened, as ``(cause, detail)``: the cause is short and from
    a small set (a metrics label), the detail the exception or NVRx's interruption message.

    ``fn_exception`` is what this rank's training function raised (None on the healthy ranks
    and on a hang); ``interrupted`` holds NVRx's message, e.g. ``Interruption.SOFT_TIMEOUT on
    ranks={0}``; ``own_rank`` tells a fault of this rank from a peer's."""
    if fn_exception is not None:
        return f"exception ({type(fn_exception).__name__})", repr(fn_exception)[:300]
    message = interrupted[0] if interrupted else ""
    kinds = re.findall(r"Interruption\.(\w+)", message)
    if not kinds:
        return "in-process restart", message[:300]
    kind = kinds[0].lower().replace("_", " ")
    ranks = {int(r) for r in re.findall(r"\d+", message.partition("ranks")[2].partition("}")[0])}
    where = "" if not ranks or own_rank in ranks else "peer "
    return f"{where}{kind}", message[:300]


def gave_up_reason(exc: BaseException) -> str | None:
    """Why NVRx's in-process layer ended the wrapped function for good (``RestartAbort``), in
    the policy's words, or None for any other exception."""
    if type(exc).__name__ != "RestartAbort" or not from_nvrx(exc):
        return None
    text = str(exc)
    size = re.search(r"state\.world_size=(\d+) self\.min_world_size=(\d+)", text)
    if size and int(size.group(1)) < int(size.group(2)):
        return f"{size.group(1)} rank(s) left, [restart.in_process] min_world_size = {size.group(2)}"
    attempts = re.search(r"state\.iteration=(\d+) self\.max_iterations=(\d+)", text)
    if attempts and int(attempts.group(1)) >= int(attempts.group(2)):
        return f"[restart.in_process] max_attempts = {attempts.group(2)} used"
    return text[:300]
