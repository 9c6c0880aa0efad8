"""The YAML documents of a manifest as ``nvtrain validate --manifest`` reads them: each one's
data with its node tree (for the line and column of a finding), and paths into them.

Shared by ``manifest_checks`` (the checks against the policy) and ``manifest_refs`` (the
references between the objects), so that neither imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

__all__ = ["MISSING", "TRAINER_RUNTIMES", "Doc", "YamlPath", "get", "jobset_root", "position", "yaml_path"]

YamlPath = tuple[str | int, ...]

TRAINER_RUNTIMES = ("ClusterTrainingRuntime", "TrainingRuntime")
"""Kinds of ``nvtrain manifest --trainer-runtime``: a JobSet template that Kubeflow Trainer
turns into one JobSet per TrainJob."""


@dataclasses.dataclass(frozen=True)
class Doc:
    """One YAML document that is a mapping: its data and its node tree (for line numbers)."""

    data: dict[str, Any]
    node: yaml.Node
    label: str
    """``<kind> <name>``, the finding's table (``Job llm-train``)."""


class _Missing:
    pass


MISSING = _Missing()
"""What ``get`` returns for a path that is not in the document (``None`` is a YAML value)."""


def yaml_path(path: YamlPath) -> str:
    """``spec.replicatedJobs[0].template``; keys with a dot are quoted (``data["policy.toml"]``)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif "." in part or not part:
            text += f'["{part}"]'
        else:
            text += f".{part}" if text else part
    return text


def get(data: Any, path: YamlPath) -> Any:
    """The value at ``path`` in ``data``, or ``MISSING``."""
    for part in path:
        if isinstance(part, int):
            if not isinstance(data, list) or part >= len(data):
                return MISSING
        elif not isinstance(data, dict) or part not in data:
            return MISSING
        data = data[part]
    return data


def jobset_root(data: dict[str, Any]) -> YamlPath | None:
    """Path of the JobSet spec of a document: a JobSet's ``spec``, a Trainer runtime's
    ``spec.template.spec`` (the JobSet that Trainer makes of it); None for other kinds."""
    kind = data.get("kind")
    if kind == "JobSet":
        return ("spec",)
    if kind in TRAINER_RUNTIMES:
        return ("spec", "template", "spec")
    return None


def position(node: yaml.Node, path: YamlPath) -> tuple[int, int]:
    """1-based line and column of ``path`` (of its key), or of the deepest part that exists."""
    mark = node.start_mark
    for part in path:
        if isinstance(part, int) and isinstance(node, yaml.SequenceNode) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
            continue
        if isinstance(part, str) and isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if found:
                key, node = found[-1]
                mark = key.start_mark
                continue
        break
    return mark.line + 1, mark.column + 1
