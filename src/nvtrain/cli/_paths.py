"""Command-line paths: an output must never be one of the command's inputs."""

from __future__ import annotations

import os
from pathlib import Path

from nvtrain.errors import UsageError

__all__ = ["refuse_overwrite"]


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
