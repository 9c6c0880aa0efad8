"""``ftmain.split_script_args``: ft_launcher's parser never sees the script's arguments."""

from __future__ import annotations

import argparse
import io
import sys

import pytest

from nvtrain.launcher.plan import ENTRY, ZYGOTE_CLIENT
from nvtrain.nvrx import ftmain

OPTIONS = ["--nnodes=1:1", "--workers-stop-timeout=5", "--tee=3"]


@pytest.mark.parametrize("entry", [ENTRY, ZYGOTE_CLIENT])
def test_the_command_line_is_cut_after_the_entrypoint_and_its_target(entry: str) -> None:
    script = ["--workers", "4", "-m", entry, "x.py", "--"]
    assert ftmain.split_script_args([*OPTIONS, "-m", entry, "train.py", *script]) == (
        [*OPTIONS, "-m", entry, "train.py"],
        script,
    )
    by_module = [*OPTIONS, "-m", entry, "-m", "pkg.train"]
    assert ftmain.split_script_args([*by_module, "--ft", "x"]) == (by_module, ["--ft", "x"])
    assert ftmain.split_script_args(by_module) == (by_module, [])


def test_a_command_line_without_nvtrains_entrypoint_is_left_whole() -> None:
    for argv in ([*OPTIONS, "-m", "mypkg.train", "--workers", "4"], [*OPTIONS, "train.py"], []):
        assert ftmain.split_script_args(argv) == (argv, [])
    assert ftmain.split_script_args(["-m", ENTRY, "-m"]) == (["-m", ENTRY, "-m"], [])


def _parser() -> argparse.ArgumentParser:
    """The shape of ft_launcher's parser (NVRx 0.4: abbreviations allowed)."""
    parser = argparse.ArgumentParser(prog="ft_launcher")
    parser.add_argument("--workers-stop-timeout", "--workers_stop_timeout", type=float)
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def test_the_parser_reads_the_head_and_the_script_gets_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    head, rest = ftmain.split_script_args(["--workers-stop-timeout=5", "-m", ENTRY, "t.py", "--workers", "4"])
    with pytest.raises(SystemExit):  # the bug: the whole line through argparse
        _parser().parse_args([*head, *rest])
    parse = ftmain._with_script_args(_parser().parse_args, rest)
    args = parse(head)
    assert args.training_script == ENTRY and args.training_script_args == ["t.py", "--workers", "4"]


def test_a_parser_error_is_exit_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    parse = ftmain._with_script_args(_parser().parse_args, ["--x"])
    with pytest.raises(SystemExit) as ended:
        parse(["--bogus=1", "-m", ENTRY, "t.py"])
    assert ended.value.code == 2
    assert err.getvalue() == (
        f"{ftmain.USAGE_ERROR} ft_launcher refused its command line: unrecognized arguments: --bogus=1\n"
    )
