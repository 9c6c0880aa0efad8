"""What ``nvtrain run`` shows on stderr while it runs: the supervisor's events, styled on a
terminal and as logfmt lines in pod logs, and the warnings the library logs meanwhile."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from nvtrain.cli.render.console import err, escape, visible
from nvtrain.cli.render.findings import print_warnings

if TYPE_CHECKING:
    from nvtrain.events import Event, Reporter

__all__ = ["LIBRARY_LOGGER", "event_reporter", "show_library_warnings"]

LIBRARY_LOGGER = "nvtrain"
"""The logger above every logger of the library (the metrics server's is ``nvtrain.live``)."""

_QUIET = {"launcher_started"}
_WORKER_FIELDS = (
    "step", "kind", "layer", "iteration", "origin", "seconds", "finished", "problem", "error",
)  # fmt: skip
"""What is shown of a worker's event (after its rank): what happened, not every detail."""


def event_reporter() -> Reporter:
    """Prints the supervisor's events: styled on a terminal, logfmt lines in pod logs. Also
    shows what the library logs at warning level or above while the run goes on (logger
    ``nvtrain``: e.g. a metrics update that failed) as ``nvtrain: warning:`` lines on the same
    stderr (``show_library_warnings``)."""
    show_library_warnings()
    if err.is_terminal:
        return _styled_event
    return _plain_event


class _WarningLines(logging.Handler):
    """A library log record as one ``nvtrain: warning:`` line on stderr (``print_warnings``:
    control characters made visible)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print_warnings([record.getMessage()])
        except Exception:  # noqa: BLE001 - the stream is gone, or the message does not format: logging's way
            self.handleError(record)


def show_library_warnings() -> None:
    """Show the library's warnings (logger ``nvtrain`` and below, level warning and up) on
    stderr, once per process however often it is called. The records also go on to the root
    logger's handlers, if any were set up."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    if not any(isinstance(h, _WarningLines) for h in logger.handlers):
        logger.addHandler(_WarningLines(logging.WARNING))


def _shown_fields(record: Event) -> dict[str, Any]:
    """The fields of ``record`` to show: a worker's rank and what happened; all of the
    launcher's but its command line (which stays in the events log)."""
    fields = record.fields()
    rank = {} if record.rank is None else {"rank": record.rank}
    if record.source != "worker":  # the launcher's (a worker_failed has the rank it found)
        return {**rank, **{k: v for k, v in fields.items() if k != "argv"}}
    return {**rank, **{k: v for k, v in fields.items() if k in _WORKER_FIELDS}}


def _plain_event(record: Event) -> None:
    if record.name in _QUIET:
        return
    parts = [f"event={record.name}"]
    for key, value in _shown_fields(record).items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        # Quoted as JSON, which escapes every control character (a worker's error, a host name
        # from outside): the value stays on its line and cannot drive the terminal.
        if isinstance(value, str) and (
            " " in text or '"' in text or not text or visible(text, lines=False) != text
        ):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    # One write for the line and its newline: the workers' output shares the stream, and a
    # ``print`` under ``PYTHONUNBUFFERED`` writes the newline apart, where a worker's line can land.
    sys.stderr.write(f"nvtrain: {time.strftime('%H:%M:%S')} " + " ".join(parts) + "\n")
    sys.stderr.flush()


_EVENT_STYLE = {
    "worker_failed": "bold red",
    "worker_ended": "dim",  # told to stop: no fault
    "launcher_exit": "bold",
    "restart_begin": "yellow",
    "relaunch": "yellow",
    "signal": "yellow",
    "dns_wait": "dim",
}


def _styled_event(record: Event) -> None:
    from nvtrain.events.records import LauncherExit

    if record.name in _QUIET:
        return
    if isinstance(record, LauncherExit):
        style = "bold green" if record.exit_code == 0 else "bold red"
        err.print(f"[{style}]nvtrain:[/] {escape(record.cause or '')}")
        return
    # A value from outside (a worker's error, a path) stays on its line and cannot drive the terminal.
    details = ", ".join(f"{k}={visible(str(v), lines=False)}" for k, v in _shown_fields(record).items())
    err.print(f"[{_EVENT_STYLE.get(record.name, 'cyan')}]nvtrain: {record.name}[/] {escape(details)}")
