"""Property-based tests: no input crashes validation, the CLI or the duration parser."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import tomllib
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.config import Finding, Policy, format_duration, parse_duration, validate_source
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.4.1")

# --------------------------------------------------------------------------------------------
# A tiny TOML writer (tomllib only reads).

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dump_toml(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """``doc`` as TOML: scalars and arrays as ``key = value``, tables as ``[a.b]`` sections,
    arrays of tables as ``[[a]]`` sections (nested tables inside those are written inline)."""
    lines = [
        f"{toml_key(k)} = {toml_value(v)}"
        for k, v in doc.items()
        if not isinstance(v, dict) and not _is_table_array(v)
    ]
    for k, v in doc.items():
        path = (*prefix, k)
        header = ".".join(toml_key(p) for p in path)
        if isinstance(v, dict):
            lines += ["", f"[{header}]", dump_toml(v, path)]
        elif _is_table_array(v):
            for item in v:
                lines += ["", f"[[{header}]]"]
                lines += [f"{toml_key(ik)} = {toml_value(iv)}" for ik, iv in item.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Documents made of the schema's real names, random names and values of every TOML type.


def _tables(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every table of the schema (dotted name) with its keys, aliases included."""
    found: dict[str, list[str]] = {prefix: []}
    for name, info in model.model_fields.items():
        key = info.alias or name
        found[prefix].append(key)
        inner = info.annotation
        args = getattr(inner, "__args__", ())
        candidates = [inner, *args]
        for cand in candidates:
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                found.update(_tables(cand, f"{prefix}.{key}" if prefix else key))
    return found


SCHEMA_TABLES = _tables(Policy)
ALL_KEYS = sorted({k for keys in SCHEMA_TABLES.values() for k in keys})

_offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
scalars = st.one_of(
    st.text(max_size=20),
    st.integers(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([2**63, -(2**63) - 1, 10**30, 10**400, -(10**400)]),  # beyond 64 bits and floats
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.datetimes(timezones=st.none() | _offsets).map(lambda d: d.replace(microsecond=0)),
    st.dates(),
    st.times().map(lambda t: t.replace(microsecond=0)),
)
# Values a policy really uses, so that many documents get past the type checks.
plausible = st.one_of(
    st.sampled_from(["10s", "1m", "1h30m", "250ms", "2m", "20m", "0s", "5x", "gpu", "cpu"]),
    st.sampled_from(["job-1", "train.py", "mypkg.train", "/ckpt", "ckpt", "Bad_Name", "default"]),
    st.sampled_from(["any-failed", "min-healthy", "exception", "hang", "sigkill", "oom", "sigterm"]),
    st.integers(-2, 10),
    st.sampled_from([0.5, 1.0, 30.0, 1e9, 1e300, 10**400]),
)
values = st.recursive(
    st.one_of(scalars, plausible),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
keys = st.one_of(st.sampled_from(ALL_KEYS), st.text(min_size=1, max_size=12))


@st.composite
def table_for(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A table named like a schema table, with its real keys mixed with random ones."""
    real = SCHEMA_TABLES.get(name, [])
    chosen = draw(st.lists(st.sampled_from(real), unique=True)) if real else []
    table: dict[str, Any] = {k: draw(st.one_of(plausible, values)) for k in chosen}
    table.update(draw(st.dictionaries(keys, values, max_size=2)))
    for sub in [t for t in SCHEMA_TABLES if t.startswith(f"{name}.") and t.count(".") == name.count(".") + 1]:
        if draw(st.booleans()):
            table[sub.rsplit(".", 1)[1]] = draw(table_for(sub))
    return table


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.integers(0, 3)):  # mostly a plausible [job]
        doc["job"] = {"name": "job-1", "script": "train.py"}
        doc["job"].update(draw(table_for("job")))
    for name in ("rendezvous", "heartbeat", "restart", "checkpoint"):
        if draw(st.booleans()):
            doc[name] = draw(table_for(name))
    if draw(st.booleans()):
        doc["faults"] = draw(st.lists(table_for("faults"), max_size=3))
    doc.update(draw(st.dictionaries(keys, values, max_size=2)))
    return doc


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _assert_shape(result: Any, text: str | bytes) -> None:
    assert isinstance(result.findings, list)
    assert all(isinstance(f, Finding) for f in result.findings)
    assert result.policy is None or isinstance(result.policy, Policy)
    if result.policy is None:
        assert any(f.severity == "error" for f in result.findings)
    lines = (text.count(b"\n") if isinstance(text, bytes) else text.count("\n")) + 1
    for f in result.findings:
        assert f.severity in ("error", "warning", "info")
        assert f.code and f.rule and f.fix
        assert f.file == "p.toml"
        assert f.line is None or 1 <= f.line <= lines
        assert f.column is None or f.column >= 1
        f.where  # noqa: B018 - must not raise
    assert result.ok == (
        result.policy is not None and not any(f.severity == "error" for f in result.findings)
    )


# --------------------------------------------------------------------------------------------
# (a) arbitrary bytes


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    result = validate_source(raw, "p.toml", nvrx=NVRX)
    _assert_shape(result, raw)


@given(st.text(alphabet=st.sampled_from(list("[]{}=\"'#.,\n abc1-_:")), max_size=120))
def test_toml_like_text_never_raises(text: str) -> None:
    result = validate_source(text, "p.toml", nvrx=NVRX)
    _assert_shape(result, text)


# --------------------------------------------------------------------------------------------
# (b) arbitrary documents


@given(documents())
def test_toml_writer_round_trips(doc: dict[str, Any]) -> None:
    assert _same(tomllib.loads(dump_toml(doc)), doc)


# Integers beyond a float's range as durations (tomllib reads integers of any size).
HUGE_DURATION = {"job": {"name": "job-1", "script": "train.py", "collective_timeout": 10**400}}
# A key that holds U+0085 (NEL), which str.splitlines() takes for a line break.
NEL_KEY = {"rendezvous": {"\x85": 1}, "faults": [{}]}


@example(doc=HUGE_DURATION, version="0.4.1")
@example(doc=NEL_KEY, version="0.4.1")
@given(doc=documents(), version=st.sampled_from(["0.4.1", "0.7.0"]))
def test_arbitrary_documents_never_raise(doc: dict[str, Any], version: str) -> None:
    text = dump_toml(doc)
    result = validate_source(text, "p.toml", nvrx=NvrxVersion.parse(version))
    _assert_shape(result, text)
    assert result.ok is (result.policy is not None and result.errors == [])


# --------------------------------------------------------------------------------------------
# (c) the same documents through the command line


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@example(doc=HUGE_DURATION, flags=[])
@example(doc=HUGE_DURATION, flags=["--json"])
@given(doc=documents(), flags=st.sampled_from([[], ["--json"], ["--strict"], ["--strict", "--json"]]))
def test_cli_never_crashes(
    tmp_path_factory: pytest.TempPathFactory, doc: dict[str, Any], flags: list[str]
) -> None:
    path = tmp_path_factory.mktemp("cli") / "policy.toml"
    path.write_text(dump_toml(doc), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path), "--nvrx", "0.4.1", *flags])
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if "--json" in flags:
        report = json.loads(result.stdout)
        assert report["errors"] == sum(f["severity"] == "error" for f in report["findings"])
        assert report["warnings"] == sum(f["severity"] == "warning" for f in report["findings"])
        assert report["valid"] is (report["errors"] == 0 and result.exit_code != 2)
        if not report["valid"]:
            expected = 2
        elif report["warnings"] and "--strict" in flags:
            expected = 1
        else:
            expected = 0
        assert result.exit_code == expected


# --------------------------------------------------------------------------------------------
# (d) durations


@given(st.integers(min_value=1, max_value=10**9))
def test_whole_seconds_round_trip_exactly(seconds: int) -> None:
    text = format_duration(float(seconds))
    assert parse_duration(text) == seconds
    assert re.fullmatch(r"(\d+d)?(\d+h)?(\d+m)?(\d+s)?", text)


@given(st.integers(min_value=1, max_value=999))
def test_milliseconds_round_trip_exactly(ms: int) -> None:
    assert format_duration(ms / 1000) == f"{ms}ms"
    assert parse_duration(format_duration(ms / 1000)) == pytest.approx(ms / 1000, rel=1e-12)


@example(100000.5)  # 7 significant digits
@example(1234567.5)  # printed in exponent notation
@example(0.009)
@given(st.floats(min_value=1e-3, max_value=1e8, allow_nan=False, allow_infinity=False))
def test_any_positive_duration_round_trips(seconds: float) -> None:
    text = format_duration(seconds)
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@given(st.one_of(st.integers(min_value=0, max_value=10**6), st.floats(min_value=0, max_value=1e6)))
def test_parsed_numbers_are_the_same_seconds(seconds: float) -> None:
    assume(seconds > 0)
    assert parse_duration(seconds) == float(seconds)


@given(
    st.one_of(
        st.booleans(),
        st.integers(max_value=0),
        st.floats(max_value=0),
        st.sampled_from([math.nan, math.inf, -math.inf, "5x", "", "m", "s", "1h30", "-5s", "inf", "nan"]),
        st.none(),
        st.lists(st.integers()),
    )
)
def test_parse_duration_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@example(10**400)
@given(st.one_of(st.text(max_size=30), st.integers(), st.floats()))
def test_parse_duration_returns_positive_seconds_or_value_error(value: Any) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert isinstance(seconds, float)
    assert math.isfinite(seconds) and seconds > 0
