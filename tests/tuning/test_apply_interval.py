"""``--apply``: only ``[checkpoint] interval`` changes; comments and layout stay."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nvtrain.errors import ConfigError, UsageError
from nvtrain.tuning.apply import apply_interval, rewrite_interval

POLICY = """\
# Training policy for the llm job.
[job]
name = "llm"     # the job
script = "train.py"
max_steps = 5000

[checkpoint]   # sharded, async
dir = "/checkpoints"
interval   =  1_000   # steps between saves
keep = 3

[[faults]]
step = 10
rank = 0
kind = "exception"
"""


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    a, b = before.split("\n"), after.split("\n")
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


def test_only_the_value_changes() -> None:
    new, line = rewrite_interval(POLICY, 150)
    assert changed_lines(POLICY, new) == [
        ("interval   =  1_000   # steps between saves", "interval   =  150   # steps between saves")
    ]
    assert line == 9


def test_a_missing_key_is_added_under_the_table() -> None:
    text = POLICY.replace("interval   =  1_000   # steps between saves\n", "")
    new, line = rewrite_interval(text, 40)
    lines = new.splitlines()
    assert lines[line - 2] == "[checkpoint]   # sharded, async" and lines[line - 1] == "interval = 40"
    assert new.replace("interval = 40\n", "") == text


def test_a_missing_table_is_appended() -> None:
    text = '[job]\nname = "x"\nscript = "t.py"'  # no newline at the end
    new, line = rewrite_interval(text, 60)
    assert new == text + "\n\n[checkpoint]\ninterval = 60\n"
    assert new.splitlines()[line - 1] == "interval = 60"
    assert rewrite_interval("", 5)[0] == "[checkpoint]\ninterval = 5\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('checkpoint = { dir = "/c", interval = 5 }\n', 'checkpoint = { dir = "/c", interval = 7 }\n'),
        ('checkpoint = { dir = "/c" }\n', 'checkpoint = { interval = 7, dir = "/c" }\n'),
        ("checkpoint = {}\n", "checkpoint = { interval = 7 }\n"),
        ('checkpoint.dir = "/c"\n', 'checkpoint.dir = "/c"\ncheckpoint.interval = 7\n'),
        ("checkpoint.interval = 0x10 # hex\n", "checkpoint.interval = 7 # hex\n"),
        ('[ "checkpoint" ]\ninterval=+3\n', '[ "checkpoint" ]\ninterval=7\n'),
        ("[checkpoint]\r\ninterval = 5\r\n", "[checkpoint]\r\ninterval = 7\r\n"),
        ('[job]\r\nname = "x"\r\n', '[job]\r\nname = "x"\r\n\r\n[checkpoint]\r\ninterval = 7\r\n'),
    ],
)
def test_other_ways_to_write_the_table(text: str, expected: str) -> None:
    assert rewrite_interval(text, 7)[0] == expected


def test_a_value_that_is_not_an_integer_is_not_touched() -> None:
    with pytest.raises(ValueError, match="plain integer"):
        rewrite_interval('[checkpoint]\ninterval = "10"\n', 7)
    with pytest.raises(ValueError):
        rewrite_interval("[checkpoint\n", 7)


# Any character TOML allows in a comment, U+2028 and U+0085 (line breaks to str.splitlines) too.
comments = st.text(
    alphabet=st.characters(min_codepoint=0x20, exclude_characters="\x7f", exclude_categories=["Cs"])
    | st.just("\t"),
    max_size=20,
)
spaces = st.text(alphabet=" \t", max_size=3)


@given(
    comments,
    spaces,
    spaces,
    st.integers(min_value=1, max_value=10**9),
    st.integers(min_value=1, max_value=10**9),
)
def test_any_comment_and_spacing_survive(comment: str, before: str, after: str, old: int, new: int) -> None:
    text = f"[job]\nname = 'x'\n[checkpoint]\ninterval{before}={after}{old} # {comment}\nkeep = 2\n"
    assume(old != new)
    rewritten, _ = rewrite_interval("# " + comment + "\n" + text, new)
    rewritten = rewritten.split("\n", 1)[1]
    assert changed_lines(text, rewritten) == [
        (f"interval{before}={after}{old} # {comment}", f"interval{before}={after}{new} # {comment}")
    ]
    assert tomllib.loads(rewritten)["checkpoint"] == {"interval": new, "keep": 2}


def write(tmp_path: Path, text: str = POLICY) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_apply_rewrites_the_file_atomically(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.chmod(0o640)
    inode = path.stat().st_ino
    applied = apply_interval(path, 150)
    assert (applied.old, applied.new, applied.line, applied.changed) == (1000, 150, 9, True)
    assert path.read_text(encoding="utf-8") == POLICY.replace("=  1_000 ", "=  150 ")
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.toml"]  # no temporary left


def test_apply_the_same_interval_leaves_the_file_alone(tmp_path: Path) -> None:
    path = write(tmp_path)
    inode = path.stat().st_ino
    applied = apply_interval(path, 1000)
    assert not applied.changed and path.stat().st_ino == inode


def test_apply_through_a_symbolic_link_keeps_the_link(tmp_path: Path) -> None:
    real = write(tmp_path)
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    apply_interval(link, 20)
    assert link.is_symlink() and "interval   =  20 " in real.read_text(encoding="utf-8")


def test_apply_revalidates_and_keeps_warnings(tmp_path: Path) -> None:
    path = write(tmp_path)
    applied = apply_interval(path, 10_000)  # longer than max_steps: a warning, not an error
    assert applied.changed


def test_apply_refuses_an_invalid_policy(tmp_path: Path) -> None:
    path = write(tmp_path, POLICY.replace("keep = 3", "keep = 0"))
    before = path.read_bytes()
    with pytest.raises(ConfigError):
        apply_interval(path, 150)
    assert path.read_bytes() == before


def test_apply_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot be read"):
        apply_interval(tmp_path / "missing.toml", 10)
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[job]\nname = "\xe9"\n')
    with pytest.raises(UsageError, match="not UTF-8"):
        apply_interval(path, 10)


def test_apply_reports_a_file_it_cannot_replace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path)

    def refuse(src: object, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UsageError, match="cannot write .*Permission denied"):
        apply_interval(path, 150)
    assert path.read_text(encoding="utf-8") == POLICY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.toml"]  # the temporary is gone
