"""The worker library's lines go through the ``nvtrain.worker`` logger: on stderr as before when
the application configures nothing, to the application's handlers when it does (docs/worker.md,
"Logging")."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

LOGGER = logging.getLogger("nvtrain.worker")


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def say() -> Callable[..., None]:
    # imported here: the package imports torch, which must not happen while tests are collected
    from nvtrain.worker.settings import say

    return say


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch, say: Callable[..., None]) -> Iterator[_Kept]:
    """A handler of the application's, not yet attached; the logger as it was afterwards."""
    monkeypatch.setenv("RANK", "5")
    handlers, level, propagate = list(LOGGER.handlers), LOGGER.level, LOGGER.propagate
    handler = _Kept()
    yield handler
    LOGGER.handlers[:] = handlers
    LOGGER.setLevel(level)
    LOGGER.propagate = propagate


def test_a_worker_process_writes_the_plain_line_to_stderr() -> None:
    code = textwrap.dedent(
        """
        import os
        os.environ["RANK"] = "3"
        from nvtrain.worker.settings import say
        say("host copy of step 7 not kept: OSError(28)")
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore:The pynvml package is deprecated:FutureWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "nvtrain worker rank 3: host copy of step 7 not kept: OSError(28)\n"
    assert result.stdout == ""


def test_a_line_is_one_write_with_its_newline(
    kept: _Kept, say: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other ranks' lines share stderr: a newline written apart (``print`` under
    # PYTHONUNBUFFERED) let another rank's line land in the middle of this one.
    calls: list[str] = []

    class Writes:
        def write(self, text: str) -> int:
            calls.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("sys.stderr", Writes())
    say("host copy of step 7 not kept")
    assert calls == ["nvtrain worker rank 5: host copy of step 7 not kept\n"]


def test_a_handler_on_the_logger_takes_the_lines_instead(
    kept: _Kept, capfd: pytest.CaptureFixture[str], say: Callable[..., None]
) -> None:
    LOGGER.addHandler(kept)
    say("checkpoint rejected: step 3")
    assert capfd.readouterr().err == ""
    (record,) = kept.records
    assert (record.name, record.levelno, record.getMessage()) == (
        "nvtrain.worker",
        logging.WARNING,
        "checkpoint rejected: step 3",
    )
    assert record.rank == "5"  # type: ignore[attr-defined]
    assert record.funcName == "test_a_handler_on_the_logger_takes_the_lines_instead"  # the caller's


def test_a_null_handler_or_a_level_silences_them(
    kept: _Kept, capfd: pytest.CaptureFixture[str], say: Callable[..., None]
) -> None:
    LOGGER.addHandler(logging.NullHandler())
    say("one")
    LOGGER.handlers[:] = [h for h in LOGGER.handlers if not isinstance(h, logging.NullHandler)]
    LOGGER.setLevel(logging.ERROR)
    say("two")
    assert capfd.readouterr().err == ""
    LOGGER.setLevel(logging.NOTSET)
    say("three")
    assert capfd.readouterr().err == "nvtrain worker rank 5: three\n"


@pytest.mark.parametrize("above", ["", "nvtrain"])
def test_handlers_above_get_them_too(
    above: str, kept: _Kept, capfd: pytest.CaptureFixture[str], say: Callable[..., None]
) -> None:
    logging.getLogger(above).addHandler(kept)
    try:
        say("the events log is written again")
    finally:
        logging.getLogger(above).removeHandler(kept)
    assert [r.getMessage() for r in kept.records] == ["the events log is written again"]
    assert capfd.readouterr().err == "nvtrain worker rank 5: the events log is written again\n"


def test_a_prefix_replaces_the_ranks(
    kept: _Kept, capfd: pytest.CaptureFixture[str], say: Callable[..., None]
) -> None:
    say("in-process restart gave up (x)", prefix="nvtrain: rank 5: ")
    assert capfd.readouterr().err == "nvtrain: rank 5: in-process restart gave up (x)\n"
