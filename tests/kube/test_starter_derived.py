"""The starter policy of ``nvtrain init`` writes no value for a key whose default is derived:
each is commented out with its default and its rule, so that it keeps following the keys it
depends on when those are edited (a written ``collective_timeout = "10m"`` with ``backend =
"auto"`` once kept the gloo rule from applying, and recovery on CPU took minutes)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from templates_helpers import set_keys
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.config import Policy, parse_duration, validate_source
from nvtrain.config.derive import DERIVED_KEYS
from nvtrain.kube.init import init_project, starter_text
from nvtrain.nvrx import NvrxVersion

runner = CliRunner()


def _written(tmp_path: Path) -> str:
    """The policy `nvtrain init` writes, through the command."""
    result = runner.invoke(app, ["init", str(tmp_path / "project")])
    assert result.exit_code == 0, result.output
    return (tmp_path / "project" / "policy.toml").read_text(encoding="utf-8")


def _at(data: dict[str, object], dotted: str) -> bool:
    """Whether the TOML data sets the key ``"table.key"``."""
    *tables, key = dotted.split(".")
    node: object = data
    for table in tables:
        node = node.get(table, {}) if isinstance(node, dict) else {}
    return isinstance(node, dict) and key in node


def _commented(text: str) -> dict[str, tuple[str, str]]:
    """``{"table.key": (value, comment above)}`` for each ``# key = value`` line of ``text``."""
    found: dict[str, tuple[str, str]] = {}
    table, comment = "", list[str]()
    for line in text.splitlines():
        header = re.match(r"^#?\s*\[\[?([\w.]+)\]\]?$", line)
        if header:
            table, comment = header.group(1), []
        elif table and (assign := re.match(r"^# (\w+) = (.+)$", line)):
            found[f"{table}.{assign.group(1)}"] = (assign.group(2), " ".join(comment))
            comment = []
        elif line.startswith("#"):
            comment.append(line.lstrip("# "))
        else:
            comment = []
    return found


def test_init_writes_no_derived_key(tmp_path: Path) -> None:
    data = tomllib.loads(_written(tmp_path))
    assert sorted(k for k in DERIVED_KEYS if _at(data, k)) == []


def _value(policy: object, dotted: str) -> object:
    *tables, key = dotted.split(".")
    node = policy
    for table in tables:
        node = getattr(node, table)
    return getattr(node, key)


def test_each_derived_key_is_commented_out_with_its_value_in_effect_and_rule(tmp_path: Path) -> None:
    """Its plain default, or (``[checkpoint] interval``, from the starter's ``max_steps``) what
    the starter's own values derive, said in its comment."""
    text = _written(tmp_path)
    commented = _commented(text)
    checked = validate_source(text, "policy.toml", nvrx=None)
    assert checked.policy is not None
    plain = Policy.model_validate({"job": {"name": "x", "script": "t.py"}})
    for dotted in DERIVED_KEYS:
        assert dotted in commented, f"{dotted} is not written commented out"
        value, comment = commented[dotted]
        shown = tomllib.loads(f"v = {value}")["v"]
        if isinstance(shown, str):  # a duration
            shown = parse_duration(shown)
        assert shown == _value(checked.policy, dotted), f"{dotted}: {value} is not its value in effect"
        assert re.search(r"Default: .*, or ", comment), f"{dotted}: the comment states no rule: {comment}"
        if shown != _value(plain, dotted):
            assert dotted in checked.policy.derived and "Here: " in comment, dotted
    assert checked.policy.derived.keys() == {"checkpoint.interval"}
    assert commented["checkpoint.interval"][0] == "200"  # a tenth of the starter's 2000 steps


@pytest.mark.parametrize("nvrx", [None, "0.4.1", "0.6.0", "0.7.0"])
def test_the_starter_validates_clean_and_derives_only_what_it_shows(tmp_path: Path, nvrx: str | None) -> None:
    text = _written(tmp_path)
    result = validate_source(text, "policy.toml", nvrx=NvrxVersion.parse(nvrx) if nvrx else None)
    assert result.ok and [f for f in result.findings if f.severity != "info"] == []
    # Only the checkpoint interval is derived (from max_steps), as its commented line shows.
    assert result.policy is not None and set(result.policy.derived) == {"checkpoint.interval"}
    assert result.policy.checkpoint.interval == 200


def test_the_cpu_edit_of_the_header_gets_the_gloo_collective_timeout(tmp_path: Path) -> None:
    text = _written(tmp_path)
    assert 'nproc_per_node = 2, backend = "gloo"' in " ".join(text.split())
    cpu = set_keys(
        text,
        {
            ("job", "nproc_per_node"): "2",
            ("job", "backend"): '"gloo"',
            ("checkpoint", "dir"): f'"{(tmp_path / "ckpt").as_posix()}"',
        },
    )
    result = validate_source(cpu, "policy.toml", nvrx=None)
    assert result.ok and [f for f in result.findings if f.severity != "info"] == []
    assert result.policy is not None and result.policy.job.collective_timeout == 45.0
    assert result.policy.derived["job.collective_timeout"] == "[restart.in_process] soft_timeout (with gloo)"


def test_uncommenting_the_old_collective_timeout_is_warned_about(tmp_path: Path) -> None:
    text = set_keys(_written(tmp_path), {("job", "collective_timeout"): '"10m"'})
    result = validate_source(text, "policy.toml", nvrx=None)
    assert [(f.code, f.where) for f in result.findings if f.severity == "warning"] == [
        ("auto-backend", "[job] collective_timeout")
    ]


def test_init_project_writes_the_shipped_text(tmp_path: Path) -> None:
    (path, *_) = init_project(tmp_path)
    assert path.read_text(encoding="utf-8") == starter_text("policy.toml")
