"""Argument parsers, the record of a run's arguments, JSON output."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def parser(doc: str | None, *, part: str = "line") -> argparse.ArgumentParser:
    """A parser described by the script's docstring: its first ``line``, its first
    ``paragraph``, or ``all`` of it laid out as written."""
    text = doc or ""
    if part == "all":
        return argparse.ArgumentParser(description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=text.split("\n\n" if part == "paragraph" else "\n")[0])


def args_record(args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every argument as a string (how the results files record them)."""
    return {k: str(v) for k, v in vars(args).items() if k not in skip}


def utc_now() -> str:
    """``2026-12-05 06:00:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def write_json(
    path: Path | None, data: Any, *, indent: int = 2, newline: bool = False, **kwargs: Any
) -> None:
    """``data`` as JSON into ``path`` (nothing when ``path`` is None)."""
    if path is not None:
        path.write_text(
            json.dumps(data, indent=indent, **kwargs) + ("\n" if newline else ""), encoding="utf-8"
        )
