"""A save's failures: finding the storage error behind one, and saying it once.

Owns how a rank's failed part of a save is told to the others (``Failure``: one line, the
errno's name, the kind), which rank's failure the report names, the file system that keeps the
``OSError`` behind a failed shard write (torch turns it into a ``RuntimeError`` and hands it
to the other ranks without its cause), keeping torch's extra writer threads from printing a
storage error's traceback, and the ``checkpoint_failed`` event and stderr line of a dropped save.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem

from nvtrain.events.records import CheckpointFailed
from nvtrain.worker.checkpoint.layout import os_error_text
from nvtrain.worker.plain import first_cause

__all__ = ["Failure", "WatchedFileSystem", "dropped", "failure", "quiet_writer_threads", "storage_error"]

Failure = tuple[str, str, str]
"""A rank's failed part of a save: (what went wrong, in one line; the errno's name or ""; kind:
``storage``, ``peer`` (written here, failed elsewhere) or ``other`` (raised on its rank))."""
_KINDS = ("storage", "other", "peer")
"""Which rank's failure a report names first."""


def storage_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (a full, read-only or failing volume), if there is one."""
    return first_cause(exc, OSError, unless=(ConnectionError,))


_WRITER_THREAD = "_write_files_from_queue"
"""The function torch's extra checkpoint writer threads run (``write_threads`` > 1)."""


def quiet_writer_threads() -> None:
    """A storage error in one of torch's extra writer threads is reported once, as the save's
    failure (``checkpoint_failed``, one line on stderr): keep Python from also printing the
    thread's traceback. Any other exception, or any other thread, is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "_nvtrain", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        if _WRITER_THREAD in name and args.exc_value is not None and storage_error(args.exc_value):
            return
        previous(args)

    hook._nvtrain = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class WatchedFileSystem(FileSystem):
    """torch's file system for checkpoint shards, keeping the ``OSError`` behind a failed write:
    torch's stream writer turns a full volume into a ``RuntimeError``, and torch hands a rank's
    error to the others pickled, without its cause."""

    def __init__(self, errors: list[OSError]) -> None:
        super().__init__()
        self.errors = errors

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        try:
            with super().create_stream(path, mode) as stream:
                yield stream
        except BaseException as exc:
            cause = storage_error(exc)
            if cause is not None:
                self.errors.append(cause)
            raise


def failure(exc: BaseException | None, io_errors: list[OSError], rank: int) -> Failure | None:
    """``rank``'s part of a save in one line, from its error (``exc``) and the storage errors
    torch met writing its shards; None when it was written (and committed)."""
    if exc is None:
        return None
    cause = io_errors[0] if io_errors else storage_error(exc)
    if cause is not None:
        return os_error_text(cause), errno.errorcode.get(cause.errno or 0, ""), "storage"
    if isinstance(exc, CheckpointException) and rank not in exc.failures:
        return "written here, failed on another rank", "", "peer"
    return repr(exc)[:300].replace("\n", " "), "", "other"


def dropped(
    step: int, path: str, failures: dict[int, Failure], failed_in_a_row: int, newest_committed: int | None
) -> tuple[CheckpointFailed, str]:
    """The ``checkpoint_failed`` event of a dropped save and its line for stderr: the rank whose
    failure says most (a storage error first), every rank that failed, and what happens next."""
    named = min(failures, key=lambda r: (_KINDS.index(failures[r][2]), r))
    text, code, kind = failures[named]
    ranks = sorted(r for r, f in failures.items() if f[2] != "peer") or sorted(failures)
    event = CheckpointFailed(
        step=step,
        error=text,
        errno=code,
        ranks=tuple(ranks),
        path=path,
        failed_in_a_row=failed_in_a_row,
    )
    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    newest = "none yet" if newest_committed is None else f"step {newest_committed}"
    if kind != "other":
        then = (
            f"training goes on; the next save tries again ({failed_in_a_row} failed in a row; "
            f"newest checkpoint: {newest})"
        )
    else:
        then = f"the error is raised on {where}"
    return event, f"checkpoint of step {step} not saved ({where}): {text}; {then}"
