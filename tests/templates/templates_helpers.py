"""Helpers of the template tests: policies from text, schema validation, golden files."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml
from kubernetes_validate import utils as kv

from nvtrain.config import Policy, validate_source
from nvtrain.templates.init import starter_text

GOLDEN = Path(__file__).resolve().parent / "golden"

# kubernetes-validate reads and parses its (large, bundled) schema files on every call; read each
# once per session instead (the parsed schemas are not modified). 10x faster, same checks.
if not hasattr(kv.schema_contents, "cache_clear"):
    kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

# Read when this module is imported: the autouse fixture in conftest.py removes NVTRAIN_*
# variables before each test runs.
UPDATE = os.environ.get("NVTRAIN_UPDATE_GOLDEN") == "1"

OLDEST = "1.28"
"""The oldest Kubernetes the manifests support (podFailurePolicy and Indexed Jobs are GA or
on by default there; the controller-uid label exists since 1.27)."""

KUBERNETES_VERSIONS = (OLDEST, kv.major_minor(kv.latest_version()))
"""Schemas every rendered object is checked against: 1.28 and the newest that the installed
kubernetes-validate ships."""

MINIMAL = """\
[job]
name = "llm-train"
script = "train.py"
"""


def policy_of(text: str) -> Policy:
    """The policy of ``text``; fails the test on any error finding."""
    result = validate_source(text, "test policy", nvrx=None)
    errors = [f"{f.where}: {f.rule}" for f in result.errors]
    assert result.policy is not None and not errors, errors
    return result.policy


def set_keys(text: str, values: dict[tuple[str, str], str]) -> str:
    """``text`` with ``key = ...`` in ``[table]`` set to each TOML value (commented keys are
    uncommented); every key must be found once."""
    lines = text.splitlines()
    table = ""
    done: set[tuple[str, str]] = set()
    for i, line in enumerate(lines):
        header = re.match(r"^\[([\w.]+)\]\s*$", line)
        if header:
            table = header.group(1)
            continue
        assign = re.match(r"^(?:#\s*)?(\w+) = ", line)
        if assign and (table, assign.group(1)) in values:
            key = (table, assign.group(1))
            assert key not in done, f"{key} twice"
            lines[i] = f"{key[1]} = {values[key]}"
            done.add(key)
    assert done == set(values), f"not found: {set(values) - done}"
    return "\n".join(lines) + "\n"


def starter_named(name: str) -> str:
    return set_keys(starter_text("policy.toml"), {("job", "name"): f'"{name}"'})


def schema_errors(obj: dict[str, Any], version: str) -> str | None:
    """None when ``obj`` is valid against the (strict) schema of Kubernetes ``version``."""
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as exc:
        return (
            f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}) {exc.json_path}: {exc.message}"
        )
    return None


def load_all(text: str) -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(text))
    assert all(isinstance(d, dict) for d in docs), docs
    return docs


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>`` (rewrite it with NVTRAIN_UPDATE_GOLDEN=1)."""
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: run NVTRAIN_UPDATE_GOLDEN=1 pytest tests/templates"
    assert text == path.read_text(encoding="utf-8"), (
        f"the rendered manifest differs from {path.name}; if the change is intended, regenerate with "
        "NVTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/templates and read the diff"
    )
