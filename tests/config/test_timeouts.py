"""The timeout order as one table (``config/timeouts.py``): the checks report each of its rules
with the table's code and texts, derivation takes its bounds from it, and the docs show it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvtrain.config import validate_source
from nvtrain.config.reference import ORDER_BEGIN, ORDER_END, timeout_order
from nvtrain.config.timeouts import (
    COLLECTIVE,
    HARD,
    HEARTBEAT,
    ORDER,
    SOFT,
    WINDOW,
    Order,
    barrier,
    lower_bounds,
    settle_time,
    upper_bounds,
)
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.7.0")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "policy.md"

FIXED = '[restart.in_process]\nsoft_timeout = "1m"\nhard_timeout = "90s"\n'
"""The in-process timeouts written out: derived ones would move out of a collective timeout's way."""

# A policy that breaks each rule of the table, and that rule alone.
BREAKS = {
    "initial_timeout >= timeout": '[heartbeat]\ntimeout = "10m"\ninitial_timeout = "5m"\n',
    "soft_timeout < hard_timeout": '[restart.in_process]\nsoft_timeout = "2m"\nhard_timeout = "1m"\n',
    "hard_timeout < [heartbeat] timeout": (
        '[heartbeat]\ntimeout = "1m"\n[restart.in_process]\nhard_timeout = "2m"\n'
    ),
    "failure_window < soft_timeout": '[restart.in_process]\nfailure_window = "1m"\nsoft_timeout = "30s"\n',
    "failure_window <= 5s": '[restart.in_process]\nfailure_window = "6s"\n',
    "collective_timeout < soft_timeout (gloo)": (
        '[job]\nbackend = "gloo"\nnproc_per_node = 2\ncollective_timeout = "70s"\n' + FIXED
    ),
    "collective_timeout < hard_timeout (gloo)": '[job]\nbackend = "gloo"\ncollective_timeout = "2m"\n'
    + FIXED,
    "hard_timeout < collective_timeout (NCCL)": '[job]\nbackend = "nccl"\ncollective_timeout = "1m"\n'
    + FIXED,
}


def _findings(extra: str) -> list[tuple[str, str, str, str, str | None]]:
    text = '[job]\nname = "x"\nscript = "t.py"\n' + extra
    text = text.replace('script = "t.py"\n[job]\n', 'script = "t.py"\n')  # one [job] table
    result = validate_source(text, "p.toml", nvrx=NVRX)
    return [(f.code, f.where, f.rule, f.fix, f.value) for f in result.findings if f.severity != "info"]


def test_every_rule_has_a_breaking_policy() -> None:
    assert set(BREAKS) == {o.name for o in ORDER}


@pytest.mark.parametrize("rule", ORDER, ids=[o.name for o in ORDER])
def test_a_broken_rule_is_the_tables_finding(rule: Order) -> None:
    found = _findings(BREAKS[rule.name])
    key = rule.lower if rule.subject == "lower" else str(rule.upper)
    table, _, name = key.rpartition(".")
    assert [(code, where) for code, where, *_ in found] == [(rule.code, f"[{table}] {name}")], found
    # the texts are the table's, its placeholders filled in
    assert "{" not in found[0][2] + found[0][3]
    assert found[0][2].startswith(rule.rule.split("{")[0])


def test_the_gloo_soft_rule_gives_way_to_the_hard_one() -> None:
    # 2m is above both: only "shorter than hard_timeout" is reported, with gloo's example
    found = _findings('[job]\nbackend = "gloo"\nnproc_per_node = 2\ncollective_timeout = "2m"\n' + FIXED)
    assert len(found) == 1 and "hard_timeout (1m30s)" in found[0][2] and '"1m"' in found[0][3]


def test_one_rank_lifts_the_gloo_soft_rule() -> None:
    assert (
        _findings('[job]\nbackend = "gloo"\nnproc_per_node = 1\ncollective_timeout = "70s"\n' + FIXED) == []
    )


def test_in_process_off_lifts_its_rules_but_not_the_heartbeats() -> None:
    off = "[restart.in_process]\nenabled = false\n"
    assert (
        _findings(BREAKS["hard_timeout < collective_timeout (NCCL)"].replace("[restart.in_process]\n", off))
        == []
    )
    assert [f[0] for f in _findings(BREAKS["initial_timeout >= timeout"] + off)] == ["heartbeat-order"]


def test_derivation_reads_its_bounds_from_the_table() -> None:
    assert lower_bounds(SOFT, "nccl") == [WINDOW]
    assert lower_bounds(SOFT, "gloo") == [WINDOW, COLLECTIVE]
    assert upper_bounds(HARD, "nccl") == [HEARTBEAT, COLLECTIVE]
    assert upper_bounds(HARD, "gloo") == [HEARTBEAT]


def test_the_workers_waits_follow_the_order() -> None:
    assert barrier(60.0, 90.0) == 150.0 and barrier(2.0, 3.0) == 33.0
    assert settle_time(60.0, 90.0) == 15.0 and settle_time(90.0, 60.0) == 0.0


def test_the_docs_show_the_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    shown = text.split(ORDER_BEGIN, 1)[1].split(ORDER_END, 1)[0].strip()
    assert shown == timeout_order().strip()
    assert len(shown.splitlines()) == len(ORDER) + 2  # a line per rule, in a code block


def test_a_name_with_a_trailing_newline_is_no_dns_label() -> None:
    """The names are matched whole (``kubenames``): ``"abc\\n"`` was taken for a DNS label by
    ``^...$`` with ``re.match``, while ``nvtrain run`` and ``nvtrain manifest`` refused it."""
    text = '[job]\nname = "abc\\n"\nscript = "t.py"\n[rendezvous]\nservice = "svc\\n"\nnamespace = "ns\\n"\n'
    result = validate_source(text, "p.toml", nvrx=NVRX)
    assert [(f.code, f.where) for f in result.findings if f.severity == "error"] == [
        ("dns-name", "[job] name"),
        ("dns-name", "[rendezvous] service"),
        ("dns-name", "[rendezvous] namespace"),
    ]
    assert any('e.g. name = "abc"' in f.fix for f in result.findings)


def test_every_code_of_the_table_is_documented() -> None:
    """``test_docs`` finds the codes built by calls in ``checks*.py``; the table's are data."""
    hand_written = DOCS.read_text(encoding="utf-8").split("<!-- BEGIN GENERATED KEY REFERENCE", 1)[0]
    assert {o.code for o in ORDER} == {"heartbeat-order", "timeout-order", "slow-recovery"}
    assert all(f"`{o.code}`" in hand_written for o in ORDER)
