"""The events log never writes through a link or into a folder swapped in mid-run.

The attack of issue 51: another user who can write the folder above the run's folder renames the
run's folder away, makes their own in its place and links ``events-node0.jsonl`` in it to a file
that only root may write; nvtrain then appended its events to that file. The log now writes
relative to a descriptor of the folder it was made in, only while the path still leads there,
never through a link and only into a regular file of this user's: the attacker's file is left as
it was and the write fails with a clear error (reported once, as ``events_log_error``). The
other user is ``nobody`` through ``setpriv``, which needs root."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvtrain import private
from nvtrain.events import EventLog
from nvtrain.events.records import Event, EventsLogError, Step

NOBODY = 65534
SECRET = b"root's own file\n"


def as_nobody(script: str) -> None:
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-ec", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write (sticky, as /tmp), in a short folder of /tmp that every
    user may enter (pytest's own folders are root's at 0700), beside a file only root may read."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("acting as another user (nobody) needs root and setpriv")
    root = Path(tempfile.mkdtemp(prefix="nvt-ev-", dir="/tmp"))
    try:
        root.chmod(0o755)
        folder = root / "shared"
        folder.mkdir()
        folder.chmod(0o1777)
        secret = root / "secret"
        secret.write_bytes(SECRET)
        secret.chmod(0o600)
        yield folder
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _log(path: Path) -> tuple[EventLog, list[Event]]:
    told: list[Event] = []
    log = EventLog(path, node=0, run_id="r", source="launcher")
    log.report = told.append
    return log, told


def test_a_run_folder_swapped_for_another_users_with_a_link_gets_no_line(shared: Path) -> None:
    above = shared / "nbp"
    run = above / "ck" / "r"
    run.mkdir(parents=True, mode=0o700)
    log, told = _log(run / "events-node0.jsonl")
    log.emit(Step(step=1))
    # The folder above goes to nobody (safe when the log was made, not now), who swaps the run's
    # folder for their own and links the events file to root's secret.
    os.chown(above, NOBODY, NOBODY)
    secret = shared.parent / "secret"
    as_nobody(f"cd '{above}'; mv ck ck.old; mkdir -p ck/r; ln -s '{secret}' ck/r/events-node0.jsonl")
    for step in range(2, 6):
        log.emit(Step(step=step))
    assert secret.read_bytes() == SECRET
    errors = [e for e in told if isinstance(e, EventsLogError)]
    assert len(errors) == 1 and log.dropped == 4, told
    assert f"{run}: is not the folder this events log was opened in any more" in errors[0].error
    # Our own folder, renamed away, got no more lines either: the writes stopped.
    assert len((above / "ck.old" / "r" / "events-node0.jsonl").read_text().splitlines()) == 1
    log.report = None
    with pytest.raises(private.NotPrivate, match="not the folder this events log was opened in"):
        log.emit(Step(step=6))


@pytest.mark.parametrize("form", ["link", "nobody's file"])
def test_a_link_or_another_users_file_in_place_of_the_log_is_not_written(shared: Path, form: str) -> None:
    run = shared / "mine" / "r"
    run.mkdir(parents=True, mode=0o700)
    path = run / "events-node0.jsonl"
    log, told = _log(path)
    log.emit(Step(step=1))
    secret = shared.parent / "secret"
    path.unlink()
    if form == "link":
        path.symlink_to(secret)
        reason = "is a symbolic link: not followed, nothing written"
    else:
        path.write_bytes(b"theirs\n")
        os.chown(path, NOBODY, NOBODY)
        reason = "belongs to uid 65534 (nobody)"
    log.emit(Step(step=2))
    assert secret.read_bytes() == SECRET
    if form != "link":
        assert path.read_bytes() == b"theirs\n"
    errors = [e for e in told if isinstance(e, EventsLogError)]
    assert len(errors) == 1 and reason in errors[0].error and str(path) in errors[0].error, told
    assert "errno None" not in errors[0].error


def test_a_log_made_in_a_folder_under_another_users_writes_nothing(shared: Path) -> None:
    above = shared / "nbp"
    as_nobody(f"mkdir -m 755 '{above}'")
    run = above / "r"
    run.mkdir(mode=0o700)  # root may make it there; the log refuses the place
    log, told = _log(run / "events-node0.jsonl")
    log.emit(Step(step=1))
    assert not (run / "events-node0.jsonl").exists()
    errors = [e for e in told if isinstance(e, EventsLogError)]
    assert len(errors) == 1 and f"is in {above} (mode 0755), which belongs to uid 65534" in errors[0].error
