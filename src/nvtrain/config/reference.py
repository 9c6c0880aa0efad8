"""Generated reference material: the JSON Schema and the key reference in ``docs/policy.md``.

``python -m nvtrain.config.reference`` rewrites ``docs/policy.schema.json`` and the generated
parts of ``docs/policy.md`` (the key reference, and the timeout order drawn from
``timeouts.ORDER``); a test fails when either is out of date.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nvtrain.config.duration import format_duration, is_duration_field
from nvtrain.config.schema import Policy, table_model
from nvtrain.config.timeouts import diagram
from nvtrain.findings import toml_value

__all__ = [
    "BEGIN",
    "END",
    "ORDER_BEGIN",
    "ORDER_END",
    "key_reference",
    "schema_json",
    "timeout_order",
    "update_docs",
]

BEGIN = "<!-- BEGIN GENERATED KEY REFERENCE: python -m nvtrain.config.reference -->"
END = "<!-- END GENERATED KEY REFERENCE -->"
ORDER_BEGIN = "<!-- BEGIN GENERATED TIMEOUT ORDER: python -m nvtrain.config.reference -->"
ORDER_END = "<!-- END GENERATED TIMEOUT ORDER -->"


def schema_json() -> str:
    schema = Policy.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "nvtrain policy"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _type_name(info: FieldInfo) -> str:
    if is_duration_field(info.metadata):
        return "duration"
    return _annotation_name(info.annotation)


def _annotation_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated and is_duration_field(list(annotation.__metadata__)):
        return "duration"
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_annotation_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"array of {_annotation_name(args[0])}"
    if origin is dict:
        return f"table of {_annotation_name(args[1])}"
    simple = {int: "integer", float: "number", str: "string", bool: "boolean"}
    return simple.get(annotation) or str(getattr(annotation, "__name__", annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "`[]`" if value == [] else "none" if value == {} else "(table)"
    if info.default is None:
        return "not set"
    if is_duration_field(info.metadata):
        return f"`{toml_value(format_duration(info.default))}`"
    return f"`{toml_value(info.default)}`"


def _tables(model: type[BaseModel], name: str, out: list[tuple[str, type[BaseModel]]]) -> None:
    out.append((name, model))
    for field_name, info in model.model_fields.items():
        key = info.alias or field_name
        inner = table_model(info.annotation)
        if inner is not None:
            child = f"{name}.{key}" if name else key
            _tables(inner, child, out)


def key_reference() -> str:
    """Markdown: one section per table, one row per key (type, default, meaning)."""
    tables: list[tuple[str, type[BaseModel]]] = []
    _tables(Policy, "", tables)
    lines: list[str] = []
    for name, model in tables[1:]:
        header = f"[[{name}]]" if name == "faults" else f"[{name}]"
        lines += [f"### `{header}`", "", (model.__doc__ or "").strip(), ""]
        rows = [
            (info.alias or key, info)
            for key, info in model.model_fields.items()
            if table_model(info.annotation) is None
        ]
        if not rows:
            continue
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, info in rows:
            doc = " ".join((info.description or "").split()).replace("|", "\\|")
            lines.append(f"| `{key}` | {_type_name(info)} | {_default(info)} | {doc} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def timeout_order() -> str:
    """Markdown: the rules of the timeout order (``timeouts.ORDER``), one a line."""
    return f"```\n{diagram()}```\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what lies between the lines ``begin`` and ``end`` replaced by ``body``
    (unchanged when the markers are not there)."""
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        return text
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n\n{body}\n{end}{tail}"


def update_docs(docs: Path) -> list[Path]:
    """Rewrite the generated files under ``docs``; returns the files that changed."""
    changed = []
    schema_path = docs / "policy.schema.json"
    if not schema_path.exists() or schema_path.read_text(encoding="utf-8") != schema_json():
        schema_path.write_text(schema_json(), encoding="utf-8")
        changed.append(schema_path)
    page = docs / "policy.md"
    text = page.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n\n{key_reference()}\n{END}{tail}"
    new = _replace(new, ORDER_BEGIN, ORDER_END, timeout_order())
    if new != text:
        page.write_text(new, encoding="utf-8")
        changed.append(page)
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs")
    for path in update_docs(root):
        print(f"updated {path}")
