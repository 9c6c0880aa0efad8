"""Kubernetes quantities (``"500m"``, ``"16Gi"``, ``"900G"``): read exactly, summed, written back.

Sizes that ``nvtrain manifest`` adds up (``/dev/shm``, the host copies, the memory request) are
kept as exact fractions, so that ``16Gi + 2 × 20Gi × 8`` is written ``336Gi`` and never rounded
into a size that is a few bytes short.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from nvtrain.errors import UsageError

__all__ = ["format_bytes", "format_cpu", "parse_quantity"]

_QUANTITY = re.compile(r"([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_FACTOR: dict[str | None, Fraction] = {
    None: Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_BYTE_SUFFIXES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki", "E", "P", "T", "G", "M", "k")
"""Suffixes a rendered size may take, binary first (the shortest exact form wins, ties binary)."""


def parse_quantity(flag: str, value: str) -> Fraction:
    """The quantity ``value`` of the option ``flag`` as an exact number (bytes for a memory
    quantity, cores for a CPU quantity); a ``UsageError`` naming ``flag`` when it is not one."""
    match = _QUANTITY.fullmatch(value)
    if not match:
        raise UsageError(
            f"{flag} {value!r} is not a Kubernetes quantity",
            'write a number with an optional suffix, e.g. "500m", "16", "64Gi" or "900G"',
        )
    return Fraction(match.group(1)) * _FACTOR[match.group(3)]


def format_bytes(count: Fraction) -> str:
    """``count`` bytes, rounded up to whole bytes, as the shortest exact quantity (``336Gi``)."""
    whole = math.ceil(count)
    forms = [str(whole)] + [
        f"{whole // int(_FACTOR[s])}{s}" for s in _BYTE_SUFFIXES if whole and whole % int(_FACTOR[s]) == 0
    ]
    return min(reversed(forms), key=len)


def format_cpu(cores: Fraction) -> str:
    """``cores``, rounded up to whole millicores: ``"16"``, or ``"1500m"`` for a fraction."""
    milli = math.ceil(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
