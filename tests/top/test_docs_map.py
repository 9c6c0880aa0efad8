"""docs/architecture.md's module map ("Where each concern lives") names every package and every
module of src/nvtrain/, each in its place in the tree and with what it owns, and names nothing
that is gone.

The map is a code block: ``src/nvtrain/``, then one entry per line, indented two spaces per
level (``events/``, then ``records.py`` under it), its description starting at column
``DESCRIPTION``; a longer description goes on in lines that start with that many spaces. The
block ends at the first line that starts in column 0 again (``tests/``, ``benchmarks/``, ...).
``__init__.py`` and ``__main__.py`` are their package's entry, not lines of their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
HEADING = "## Where each concern lives"
ROOT = "src/nvtrain/"
DESCRIPTION = 26  # the column where descriptions start
NOT_ENTRIES = ("__init__.py", "__main__.py")


def modules_on_disk(src: Path = SRC) -> set[str]:
    """``events/``, ``events/records.py``, ``errors.py``, ...: every folder with Python files and
    every Python file but ``__init__.py`` and ``__main__.py``, relative to ``src``."""
    found: set[str] = set()
    for path in src.rglob("*.py"):
        relative = path.relative_to(src)
        if "__pycache__" in relative.parts:
            continue
        if path.name not in NOT_ENTRIES:
            found.add(relative.as_posix())
        for parent in list(relative.parents)[:-1]:  # the folders above it, not src itself
            found.add(f"{parent.as_posix()}/")
    return found


def map_block(text: str) -> list[str]:
    """The lines of the map under ``src/nvtrain/``, up to the first line that starts in column 0."""
    after = text.split(HEADING, 1)[1]
    block = after.split("```\n", 2)[1].splitlines()
    assert block and block[0] == ROOT, f"the map's first line must be {ROOT!r}, not {block[:1]}"
    lines = []
    for line in block[1:]:
        if line and not line.startswith(" "):
            break
        lines.append(line)
    return lines


def map_entries(lines: list[str]) -> list[tuple[str, str]]:
    """(path, description) of each entry; a description's continuation lines are joined to it."""
    entries: list[tuple[str, str]] = []
    folders: list[str] = []  # the folder of each level above the current line
    for number, line in enumerate(lines, start=2):
        if not line.strip():
            raise AssertionError(f"line {number} of the map is empty")
        if line[:DESCRIPTION].strip() == "":  # a description goes on
            assert entries, f"line {number} continues no entry: {line!r}"
            path, description = entries[-1]
            entries[-1] = (path, f"{description} {line.strip()}")
            continue
        indent = len(line) - len(line.lstrip(" "))
        name, _, description = line.strip().partition(" ")
        assert indent % 2 == 0 and indent // 2 <= len(folders) + 1, f"line {number}: misplaced {line!r}"
        assert line[DESCRIPTION - 1] == " " and line[DESCRIPTION] != " ", (
            f"line {number}: the description of {name} must start in column {DESCRIPTION}: {line!r}"
        )
        folders = folders[: indent // 2 - 1]
        path = "".join(folders) + name
        if name.endswith("/"):
            folders.append(name)
        entries.append((path, description.strip()))
    return entries


def test_the_map_names_every_module_and_only_those() -> None:
    entries = map_entries(map_block(ARCHITECTURE.read_text(encoding="utf-8")))
    named = [path for path, _ in entries]
    assert len(named) == len(set(named)), f"named twice: {sorted({p for p in named if named.count(p) > 1})}"
    on_disk = modules_on_disk()
    missing = sorted(on_disk - set(named))
    gone = sorted(set(named) - on_disk)
    assert (missing, gone) == ([], []), (
        f"docs/architecture.md's module map ({HEADING!r}) misses {missing} and names {gone}, which "
        f"are not in src/nvtrain/. Add a line per module under its package, its description in "
        f"column {DESCRIPTION} (what it owns: its docstring's first sentence), or remove the line."
    )


def test_every_entry_says_what_it_owns() -> None:
    entries = map_entries(map_block(ARCHITECTURE.read_text(encoding="utf-8")))
    assert [path for path, description in entries if len(description.split()) < 2] == []


MAP = """\
```
src/nvtrain/
  errors.py               the errors
  events/                 the events log
    log.py                the writer,
                          which appends
tests/                    not in the map
```
"""


def test_the_parser_reads_nesting_and_continuations() -> None:
    text = f"{HEADING}\n\n{MAP}"
    assert map_entries(map_block(text)) == [
        ("errors.py", "the errors"),
        ("events/", "the events log"),
        ("events/log.py", "the writer, which appends"),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "      log.py              two levels below the last folder",
        "  log.py  description in the wrong column",
    ],
)
def test_the_parser_refuses_a_misplaced_line(line: str) -> None:
    text = f"{HEADING}\n\n```\n{ROOT}\n  events/                 the events log\n{line}\n```\n"
    with pytest.raises(AssertionError):
        map_entries(map_block(text))


def test_modules_on_disk_names_folders_and_files_but_not_dunder_files(tmp_path: Path) -> None:
    for name in ("__init__.py", "__main__.py", "errors.py", "events/__init__.py", "events/log.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("", encoding="utf-8")
    assert modules_on_disk(tmp_path) == {"errors.py", "events/", "events/log.py"}
