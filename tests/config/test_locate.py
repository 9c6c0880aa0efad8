"""Positions of keys in TOML text (tomllib keeps none), and where findings say they are."""

from __future__ import annotations

import tomllib

import pytest

from nvtrain.config import Finding, validate_source
from nvtrain.config.locate import key_positions, lookup
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.4.1")


def positions(text: str) -> dict[tuple[str | int, ...], tuple[int, int]]:
    tomllib.loads(text)  # every case here is valid TOML
    return key_positions(text)


def test_tables_keys_and_columns() -> None:
    text = '[job]\nname = "x"\n  script = "t.py"\n\n[restart.in_job]\nmax_restarts = 2\n'
    assert positions(text) == {
        ("job",): (1, 2),
        ("job", "name"): (2, 1),
        ("job", "script"): (3, 3),
        ("restart", "in_job"): (5, 2),
        ("restart", "in_job", "max_restarts"): (6, 1),
    }


def test_multi_line_array_with_equals_signs_and_brackets_in_strings() -> None:
    text = (
        "[job]\n"
        "args = [\n"
        '  "--lr=0.1",\n'
        '  "[not.a.table]",\n'
        "  'x = ]',\n"
        '  "{a = 1}",  # comment with ] and [\n'
        "]\n"
        'name = "x"\n'
        "[rendezvous]\n"
        "port = 1\n"
    )
    assert positions(text) == {
        ("job",): (1, 2),
        ("job", "args"): (2, 1),
        ("job", "name"): (8, 1),
        ("rendezvous",): (9, 2),
        ("rendezvous", "port"): (10, 1),
    }


def test_nested_multi_line_arrays() -> None:
    text = "[job]\nargs = [\n  [\n    1,\n  ],\n  [2],\n]\nname = 1\n"
    assert positions(text)[("job", "name")] == (8, 1)


@pytest.mark.parametrize("quote", ['"""', "'''"])
def test_multi_line_strings_hide_what_looks_like_keys(quote: str) -> None:
    text = (
        "[job]\n"
        f"doc = {quote}\n"
        'name = "not a key"\n'
        "[not_a_table]\n"
        f"{quote}\n"
        'name = "x"\n'
        f"other = {quote}one line{quote}\n"
        "script = 1\n"
    )
    assert positions(text) == {
        ("job",): (1, 2),
        ("job", "doc"): (2, 1),
        ("job", "name"): (6, 1),
        ("job", "other"): (7, 1),
        ("job", "script"): (8, 1),
    }


def test_dotted_and_quoted_keys() -> None:
    text = (
        "restart.in_job.max_restarts = 1\n"
        'checkpoint . "async" = true\n'
        '"job" = { name = "x" }\n'
        "[rendezvous]\n"
        '"port" = 1\n'
        "'service' = \"s\"\n"
        '"a.b" = 2\n'
    )
    assert positions(text) == {
        ("restart", "in_job", "max_restarts"): (1, 1),
        ("checkpoint", "async"): (2, 1),
        ("job",): (3, 1),
        ("job", "name"): (3, 11),
        ("rendezvous",): (4, 2),
        ("rendezvous", "port"): (5, 1),
        ("rendezvous", "service"): (6, 1),
        ("rendezvous", "a.b"): (7, 1),
    }


def test_quoted_table_headers() -> None:
    text = '[ "restart" . in_job ]\nmax_restarts = 1\n[["faults"]]\nstep = 1\n'
    assert positions(text) == {
        ("restart", "in_job"): (1, 3),
        ("restart", "in_job", "max_restarts"): (2, 1),
        ("faults", 0): (3, 3),
        ("faults", 0, "step"): (4, 1),
    }


def test_inline_tables() -> None:
    text = '[restart]\nin_process = { enabled = false, soft_timeout = "1s", "hard_timeout"="2s" }\n'
    assert positions(text) == {
        ("restart",): (1, 2),
        ("restart", "in_process"): (2, 1),
        ("restart", "in_process", "enabled"): (2, 16),
        ("restart", "in_process", "soft_timeout"): (2, 33),
        ("restart", "in_process", "hard_timeout"): (2, 54),
    }


def test_arrays_of_tables_are_numbered() -> None:
    text = "[[faults]]\nstep = 1\n\n[[faults]]\nstep = 2\nrank = 0\n[job]\n[[faults]]\n"
    assert positions(text) == {
        ("faults", 0): (1, 3),
        ("faults", 0, "step"): (2, 1),
        ("faults", 1): (4, 3),
        ("faults", 1, "step"): (5, 1),
        ("faults", 1, "rank"): (6, 1),
        ("job",): (7, 2),
        ("faults", 2): (8, 3),
    }


def test_crlf_line_endings() -> None:
    text = '[job]\r\nname = "x"\r\n\r\nscript = 1\r\n'
    assert positions(text) == {("job",): (1, 2), ("job", "name"): (2, 1), ("job", "script"): (4, 1)}


def test_first_occurrence_wins_and_comments_are_ignored() -> None:
    text = '# name = "commented"\n[job]  # [rendezvous]\nname = "x"  # port = 1\n'
    assert positions(text) == {("job",): (2, 2), ("job", "name"): (3, 1)}


def test_lookup_falls_back_to_the_enclosing_table() -> None:
    table = {("restart",): (3, 2), ("restart", "in_job"): (5, 2), ("faults", 1): (9, 3)}
    assert lookup(table, ["restart", "in_job", "max_restarts"]) == (5, 2)
    assert lookup(table, ["restart", "in_process", "enabled"]) == (3, 2)
    assert lookup(table, ["faults", 1, "rank"]) == (9, 3)
    assert lookup(table, ["faults", 0, "rank"]) is None
    assert lookup(table, ["job", "name"]) is None
    assert lookup(table, []) is None


# Line separators that str.splitlines() honours but TOML does not: U+0085 (NEL), U+2028 and
# U+2029 may appear in comments and strings, and every line after them was reported one too low.
@pytest.mark.parametrize(
    "first_line",
    ["# note\u2028more\n", "# note\u2029more\n", 'title = "a\x85b"\n'],
    ids=["U+2028-in-comment", "U+2029-in-comment", "U+0085-in-string"],
)
def test_unicode_line_separators_do_not_shift_lines(first_line: str) -> None:
    text = first_line + "[rendezvous]\nport = 0\n"
    assert positions(text)[("rendezvous", "port")] == (3, 1)
    result = validate_source(f'[job]\nname = "x"\nscript = "t.py"\n{text}', "p.toml", nvrx=NVRX)
    assert [(f.line, f.where) for f in result.findings if f.code != "extra_forbidden"] == [
        (6, "[rendezvous] port")
    ]


@pytest.mark.parametrize(
    "args",
    [
        "args = ['''\n]\nname = 1\n''']",  # a bracket inside a multi-line string inside an array
        'args = ["""\n[x\n"""]',  # an unbalanced bracket inside one
        'args = ["""\nname = 1\n""", "x"]',
    ],
)
def test_multi_line_strings_inside_arrays(args: str) -> None:
    text = f"[job]\n{args}\nname = 1\n"
    found = positions(text)
    assert found[("job", "name")] == (text.count("\n"), 1)


def test_escaped_quotes_do_not_end_a_multi_line_string() -> None:
    text = '[job]\ndoc = """a\\"""\nname = 1\n"""\nname = 2\n'
    assert tomllib.loads(text)["job"]["name"] == 2
    assert positions(text)[("job", "name")] == (5, 1)


def test_inline_table_strings_that_look_like_keys() -> None:
    text = 'job = { name = "a, script = b", script = 7 }\n'
    assert positions(text)[("job", "script")] == (1, 33)
    result = validate_source(text, "p.toml", nvrx=NVRX)
    script = [(f.line, f.column, f.where) for f in result.findings if f.key == "script"]
    assert script == [(1, 33, "[job] script")]


# ---------------------------------------------------------------------------------------------
# Finding.where


@pytest.mark.parametrize(
    ("table", "key", "where"),
    [
        ("", None, "(top level)"),
        ("", "job", "(top level) job"),
        ("job", None, "[job]"),
        ("job", "name", "[job] name"),
        ("restart.in_job", "max_restarts", "[restart.in_job] max_restarts"),
        ("faults.0", None, "[[faults]] #1"),
        ("faults.0", "rank", "[[faults]] #1 rank"),
        ("faults.11", "kind", "[[faults]] #12 kind"),
    ],
)
def test_where(table: str, key: str | None, where: str) -> None:
    assert Finding("error", "x", table, key, "rule", "fix").where == where


def test_to_dict_and_sort_key() -> None:
    f = Finding("warning", "c", "faults.1", "rank", "r", "x", "3", file="p.toml", line=7, column=1)
    assert f.to_dict() == {
        "severity": "warning",
        "code": "c",
        "table": "faults.1",
        "key": "rank",
        "rule": "r",
        "fix": "x",
        "value": "3",
        "file": "p.toml",
        "line": 7,
        "column": 1,
        "where": "[[faults]] #2 rank",
    }
    unplaced = Finding("error", "c", "", None, "r", "x")
    info = Finding("info", "c", "job", None, "r", "x", line=7)
    error = Finding("error", "c", "job", None, "r", "x", line=7)
    early = Finding("info", "c", "job", None, "r", "x", line=2)
    assert sorted([unplaced, info, error, early], key=Finding.sort_key) == [early, error, info, unplaced]


def test_an_array_element_is_not_shown_as_an_array_of_tables() -> None:
    result = validate_source('[job]\nname = "x"\nscript = "t.py"\nargs = ["--lr", 1]\n', "p.toml", nvrx=NVRX)
    (finding,) = result.findings
    assert (finding.line, finding.rule, finding.value) == (4, "element 2 must be a string", "1")
    # Today: table "job.args.1", key None, shown as "[[job.args]] #2" as if [[job.args]] were
    # written. args is an array of strings in [job].
    assert (finding.table, finding.key) == ("job", "args")
    assert finding.where.startswith("[job] args")


def test_missing_key_in_an_array_of_tables_names_the_table_as_written() -> None:
    text = '[job]\nname = "x"\nscript = "t.py"\n\n[[faults]]\nstep = 1\nrank = 0\n'
    (finding,) = validate_source(text, "p.toml", nvrx=NVRX).findings
    assert (finding.code, finding.where, finding.line) == ("missing", "[[faults]] #1 kind", 5)
    # Today the fix reads 'add `kind = "exception"` to [faults.0]': not a table one can write.
    assert "[faults.0]" not in finding.fix
    assert finding.fix == 'add `kind = "exception"` to [[faults]] #1'
