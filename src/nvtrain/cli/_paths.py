"""Command-line paths: an output must never be one of the command's inputs, nor a file of
another kind (a policy given by mistake as the place for a PNG)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from nvtrain.errors import UsageError

__all__ = ["check_output", "refuse_overwrite"]


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name the same file: one inode (hard and symbolic links too), or,
    where one does not exist yet, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return a.resolve() == b.resolve()


def refuse_overwrite(flag: str, output: Path, inputs: dict[str, Path]) -> None:
    """``UsageError`` (exit 2) when ``output`` (given with ``flag``) is one of ``inputs``
    (what each is, in words: its path)."""
    for what, path in inputs.items():
        if _same_file(output, path):
            raise UsageError(
                f"{flag} {output} is {what} ({path}): writing it would overwrite what is being read",
                f"give {flag} another file",
            )


_HEAD_BYTES = 4 * 1024 * 1024
"""At most this much of an existing output is read to tell what it is."""


def check_output(flag: str, output: Path, suffix: str, kind: str, is_kind: Callable[[bytes], bool]) -> None:
    """``UsageError`` (exit 2) unless ``output`` (given with ``flag``) may take what the command
    writes, ``kind`` (in words, e.g. "a PNG image"): its name ends in ``suffix`` (``.png``, any
    case), and it does not exist, or is an empty file, or a regular file that ``is_kind`` accepts
    (given its first bytes). A policy, a folder or a device there is never replaced."""
    if output.suffix.lower() != suffix:
        raise UsageError(
            f"{flag} {output}: the file written is {kind}, so its name must end in {suffix}",
            f"choose a {suffix} path, e.g. {flag} {output.with_suffix(suffix).name}",
        )
    try:
        mode = os.stat(output).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(
            f"{flag} {output} cannot be checked ({exc.strerror or exc})", "check the path"
        ) from None
    if not stat.S_ISREG(mode):
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UsageError(
            f"{flag} {output} is {what}, so {kind} cannot be written there", f"choose another {flag} path"
        )
    try:
        with output.open("rb") as file:
            head = file.read(_HEAD_BYTES + 1)
    except OSError as exc:
        raise UsageError(
            f"{flag} {output} cannot be read ({exc.strerror or exc})", "check the path"
        ) from None
    if head and (len(head) > _HEAD_BYTES or not is_kind(head)):
        raise UsageError(
            f"{flag} {output} exists and is not {kind}: writing would replace it",
            f"choose another {flag} path, or move {output} away first",
        )
