"""The golden corpus: every file under tests/config/policies/ and the exact findings it must produce.

Each ``<name>.toml`` has a sibling ``<name>.expected.json``. A file is validated against NVRx
0.4.1 unless its first lines say otherwise (``# nvrx: 0.7.0``), never against what is installed.

To regenerate the expectations after an intended change, run::

    NVTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/config/test_golden.py

and read the diff before committing it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config import Finding, validate_file, validate_source
from nvtrain.nvrx import NvrxVersion

POLICIES = Path(__file__).resolve().parent / "policies"
VALID = sorted((POLICIES / "valid").glob("*.toml"))
INVALID = sorted((POLICIES / "invalid").glob("*.toml"))

# Read when this module is imported: the autouse fixture in conftest.py removes NVTRAIN_*
# variables before each test runs.
UPDATE = os.environ.get("NVTRAIN_UPDATE_GOLDEN") == "1"

DEFAULT_NVRX = "0.4.1"
_NVRX_PRAGMA = re.compile(rb"^#\s*nvrx:\s*(\S+)\s*$", re.MULTILINE)

FIELDS = ("severity", "code", "where", "key", "line", "column", "value", "rule", "fix")


def nvrx_for(path: Path) -> NvrxVersion:
    head = b"\n".join(path.read_bytes().splitlines()[:5])
    match = _NVRX_PRAGMA.search(head)
    return NvrxVersion.parse(match.group(1).decode() if match else DEFAULT_NVRX)


def expected_path(path: Path) -> Path:
    return path.with_name(path.stem + ".expected.json")


def as_dict(finding: Finding) -> dict[str, Any]:
    data = finding.to_dict()
    return {name: data[name] for name in FIELDS}


def check_golden(path: Path) -> list[Finding]:
    """Validate ``path`` and compare (or, with NVTRAIN_UPDATE_GOLDEN=1, rewrite) its expectation."""
    source = path.relative_to(POLICIES).as_posix()
    result = validate_source(path.read_bytes(), source, nvrx=nvrx_for(path))
    actual = [as_dict(f) for f in result.findings]
    target = expected_path(path)
    if UPDATE:
        target.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    expected = json.loads(target.read_text(encoding="utf-8"))
    assert actual == expected
    assert {f.file for f in result.findings} <= {source}
    assert result.nvrx == nvrx_for(path)
    return result.findings


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_policy(path: Path) -> None:
    findings = check_golden(path)
    assert [f for f in findings if f.severity == "error"] == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_policy(path: Path) -> None:
    findings = check_golden(path)
    assert any(f.severity == "error" for f in findings)


def test_corpus_is_complete() -> None:
    assert len(VALID) >= 6
    assert len(INVALID) >= 15
    for folder in ("valid", "invalid"):
        tomls = {p.stem for p in (POLICIES / folder).glob("*.toml")}
        expectations = {p.name.removesuffix(".expected.json") for p in (POLICIES / folder).glob("*.json")}
        assert tomls == expectations, f"{folder}: every .toml needs a .expected.json and vice versa"
        assert {p.name for p in (POLICIES / folder).iterdir()} == {
            *(f"{s}.toml" for s in tomls),
            *(f"{s}.expected.json" for s in tomls),
        }


def test_valid_corpus_is_valid_per_validation_ok() -> None:
    for path in VALID:
        result = validate_file(path, nvrx=nvrx_for(path))
        assert result.ok, path.name
        assert result.policy is not None


def test_invalid_corpus_is_not_ok() -> None:
    for path in INVALID:
        result = validate_file(path, nvrx=nvrx_for(path))
        assert not result.ok, path.name


def test_nvrx_pragma_is_read() -> None:
    pinned = [p for p in (*VALID, *INVALID) if _NVRX_PRAGMA.search(p.read_bytes())]
    versions = {str(nvrx_for(p)) for p in pinned}
    assert versions == {"0.4.1", "0.5.0", "0.7.0"}
