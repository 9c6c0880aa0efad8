"""YAML with positions: the documents of a manifest as ``nvtrain validate --manifest`` reads
them, each one's data with its node tree (for the line and column of a finding), and paths into
them.

``read_manifest`` reads the file (or says, as a finding, why it cannot: unreadable, not UTF-8,
not YAML, nested too deeply, a document that is not an object); ``get`` and ``position`` find a
value and its line by ``YamlPath``. Shared by the checks against the policy (``manifest_checks``
and the checker classes) and the reference checks (``manifest_refs``), so that neither imports
the other. Writing YAML is ``yaml_io``'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from nvtrain.config.load import read_source
from nvtrain.findings import Finding, toml_value

__all__ = [
    "MISSING",
    "TRAINER_RUNTIMES",
    "Doc",
    "YamlPath",
    "get",
    "jobset_root",
    "position",
    "read_documents",
    "read_manifest",
    "yaml_path",
]

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


def read_documents(text: str, source: str) -> tuple[list[Doc], Finding | None]:
    """The mapping documents of the YAML ``text`` (from ``source``), or those before the
    finding that says why the rest cannot be read."""
    loader = yaml.SafeLoader(text)
    docs: list[Doc] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document
            if not isinstance(data, dict):
                line = node.start_mark.line + 1
                return docs, Finding(
                    "error",
                    "manifest-shape",
                    "",
                    None,
                    f"document {len(docs) + 1} is not a Kubernetes object (a mapping with "
                    "apiVersion, kind and metadata)",
                    "give the YAML that `nvtrain manifest` writes",
                    toml_value(data),
                    file=source,
                    line=line,
                    column=node.start_mark.column + 1,
                )
            name = get(data, ("metadata", "name"))
            label = f"{data.get('kind', '?')} {name if isinstance(name, str) else f'#{len(docs) + 1}'}"
            docs.append(Doc(data, node, label))
    except (RecursionError, MemoryError) as exc:
        deep = isinstance(exc, RecursionError)
        return docs, Finding(
            "error",
            "too-nested" if deep else "too-large",
            "",
            None,
            "cannot be read: "
            + ("its YAML is nested too deeply" if deep else "it needs more memory than there is"),
            "give the manifest that `nvtrain manifest` writes (Kubernetes objects nest a few levels)",
            file=source,
        )
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return docs, Finding(
            "error",
            "yaml-syntax",
            "",
            None,
            f"is not valid YAML: {problem}",
            "fix the YAML at the position shown, or re-render the file with `nvtrain manifest`",
            file=source,
            line=mark.line + 1 if mark is not None else None,
            column=mark.column + 1 if mark is not None else None,
        )
    finally:
        loader.dispose()
    return docs, None


def read_manifest(path: Path) -> tuple[list[Doc], Finding | None]:
    """The documents of the manifest at ``path``, or the finding that says why it cannot be read."""
    source = str(path)
    raw, problem = read_source(path, "check the path, or write the file with `nvtrain manifest -o FILE`")
    if raw is None:
        assert problem is not None
        return [], problem
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], Finding(
            "error",
            "not-utf8",
            "",
            None,
            f"is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
            "save the file as UTF-8, or re-render it with `nvtrain manifest`",
            file=source,
            line=raw[: exc.start].count(b"\n") + 1,
        )
    return read_documents(text, source)
