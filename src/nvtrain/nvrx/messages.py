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


# A ``RankShouldRestart``'s message names the interruptions and the ranks they concern: NVRx 0.4
# "Interruption.EXCEPTION on ranks={1, 2}"; 0.6/0.7 "Interruption.EXCEPTION affecting ranks {1, 2}",
# with ranges ("{1-3, 5}") under NVRX_LOG_RANK_FORMAT_VERBOSE, and past 8 ranks only the first and
# last four ("{0, 1, 2, 3...12, 13, 14, 15 (total: 16)}"). Several kinds are joined by ", ".
_INTERRUPTION = re.compile(r"Interruption\.(\w+)(?: on ranks=| affecting ranks )?(\{[^}]*\})?")
_RANK_ITEM = re.compile(r"\s*(\d+)(?:-(\d+))?\s*")
_TOTAL = re.compile(r"\s*\(total: \d+\)\s*$")


def _concerns(rank_set: str, rank: int) -> bool | None:
    """Whether NVRx's rank set (``{1, 2}``, ``{1-3, 5}``, ``{0, 1, 2, 3...12, 13, 14, 15 (total:
    16)}``) holds ``rank``; None where it cannot tell (the rank falls in the part left out, or
    the set is in a form not known)."""
    body = _TOTAL.sub("", rank_set[1:-1])
    parts = body.split("...")
    if len(parts) > 2:
        return None
    listed: list[list[tuple[int, int]]] = []
    for part in parts:
        spans = []
        for item in part.split(","):
            if not item.strip() and not part.strip():
                continue  # the empty set "{}"
            match = _RANK_ITEM.fullmatch(item)
            if match is None:
                return None
            low = int(match.group(1))
            spans.append((low, int(match.group(2) or low)))
        listed.append(spans)
    if any(low <= rank <= high for spans in listed for low, high in spans):
        return True
    if len(listed) == 2 and listed[0] and listed[1]:
        if max(high for _, high in listed[0]) < rank < min(low for low, _ in listed[1]):
            return None  # among the ranks NVRx left out
    return False


def restart_cause(
    fn_exception: BaseException | None, interrupted: list[str], own_rank: int
) -> tuple[str, str]:
    """Why an in-process restart happened, as ``(cause, detail)``: the cause is short and from
    a small set (a metrics label), the detail the exception or NVRx's interruption message.

    ``fn_exception`` is what this rank's training function raised (None on the healthy ranks
    and on a hang); ``interrupted`` holds NVRx's message, e.g. ``Interruption.SOFT_TIMEOUT on
    ranks={0}`` (0.4) or ``Interruption.SOFT_TIMEOUT affecting ranks {0}`` (0.6/0.7);
    ``own_rank`` tells a fault of this rank from a peer's (``peer`` before the cause) where the
    message tells which ranks the first interruption concerns."""
    if fn_exception is not None:
        return f"exception ({type(fn_exception).__name__})", repr(fn_exception)[:300]
    message = interrupted[0] if interrupted else ""
    match = _INTERRUPTION.search(message)
    if match is None:
        return "in-process restart", message[:300]
    kind = match.group(1).lower().replace("_", " ")
    concerns = _concerns(match.group(2), own_rank) if match.group(2) else None
    where = "peer " if concerns is False else ""
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
