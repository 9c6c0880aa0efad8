"""YAML in and out of ``nvtrain manifest``: the rendered objects dumped as one multi-document
text (PyYAML quotes every string; nothing is pasted into YAML text), and the YAML files that
options name (``--init-container``, ``--affinity``) read with errors that name the option.

Reading a manifest back with the line of each value, for ``nvtrain validate --manifest``, is
``yaml_positions``'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nvtrain.errors import UsageError

__all__ = ["HEADER", "dump", "read_yaml_option"]

_YAML_LIMIT = 1024 * 1024
"""The largest YAML file an option may name (1 MiB): a container or an affinity is a few lines."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks, for a readable policy in the
    ConfigMap. PyYAML itself falls back to a quoted scalar where a block cannot hold the text
    (e.g. trailing spaces, control characters); the tests check that every string survives."""


_LINE_BREAKS = frozenset("\r\x85\u2028\u2029\ufeff")
"""Characters that YAML reads as line breaks (or, the BOM, drops). PyYAML writes some of them
raw into plain, single-quoted and block scalars, where they come back as a newline or a
space (NEL, ``\x85``, does); a double-quoted scalar escapes them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if _LINE_BREAKS.intersection(value):
        style: str | None = '"'
    elif "\n" in value:
        style = "|"
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

HEADER = (
    "# Rendered by `nvtrain manifest` from the policy in the ConfigMap below.\n"
    "# Change the policy and render again rather than editing this file.\n"
)


def dump(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text (quoting by PyYAML, keys in build order)."""
    body = yaml.dump_all(
        objects,
        Dumper=_Dumper,
        sort_keys=False,
        explicit_start=True,
        allow_unicode=True,
        width=100,
    )
    return HEADER + body


def read_yaml_option(flag: str, path: Path) -> Any:
    """The YAML document of the file ``path`` given to ``flag``; ``UsageError`` naming the file
    when it cannot be read or is not YAML."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(_YAML_LIMIT + 1)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it: {exc.strerror or exc}", "check the path") from None
    if len(raw) > _YAML_LIMIT:
        raise UsageError(f"{flag} {path} is larger than 1 MiB", "give a file of a few lines of YAML")
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(
            f"{flag} {path} is not UTF-8 YAML{where}: {str(exc).splitlines()[0]}",
            "fix the file; it holds YAML as in a pod spec",
        ) from None
