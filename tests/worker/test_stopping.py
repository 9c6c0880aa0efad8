"""Which SIGTERM a worker got: the pod's stop (the launcher logged a ``signal`` event since the
worker started) or ft_launcher stopping the workers to restart them."""

from __future__ import annotations

from pathlib import Path

from nvtrain.events import EventLog


def pod_is_stopping(path: Path | None, since: float | None = None) -> bool:
    # imported here: the package imports torch, which must not happen while tests are collected
    from nvtrain.worker.stopping import pod_is_stopping as check

    return check(path, since)


def test_a_launcher_signal_event_since_the_start_means_the_pod_is_stopping(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    launcher = EventLog(path, source="launcher")
    worker = EventLog(path, source="worker", rank=0)
    old = launcher.emit("signal", signal="SIGTERM")  # an earlier stop of this run
    start = old["ts"] + 0.001
    worker.emit("step", step=5)
    assert not pod_is_stopping(path, since=start)
    worker.emit("signal", signal="SIGTERM")  # not the launcher's
    assert not pod_is_stopping(path, since=start)
    launcher.emit("signal", signal="SIGTERM")
    for n in range(2000):  # pushed back beyond the tail that is read: then not seen
        worker.emit("step", step=n)
    assert not pod_is_stopping(path, since=start)
    launcher.emit("signal", signal="SIGINT")
    worker.emit("step", step=6)
    with path.open("ab") as f:
        f.write(b'{"ts": 1e12, "event": "st')  # a torn last line
    assert pod_is_stopping(path, since=start)


def test_no_events_log_is_a_restart(tmp_path: Path) -> None:
    assert not pod_is_stopping(None)
    assert not pod_is_stopping(tmp_path / "missing.jsonl")
