"""Which SIGTERM a worker got: the pod's stop (the launcher logged a ``signal`` event since the
worker started) or ft_launcher stopping the workers to restart them."""

from __future__ import annotations

from pathlib import Path

from nvtrain.events import EventLog
from nvtrain.events.records import SignalReceived, Step


def pod_is_stopping(path: Path | None, since: float | None = None) -> bool:
    # imported here: the package imports torch, which must not happen while tests are collected
    from nvtrain.worker.stopping import pod_is_stopping as check

    return check(path, since)


def test_a_launcher_signal_event_since_the_start_means_the_pod_is_stopping(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    launcher = EventLog(path, source="launcher")
    worker = EventLog(path, source="worker", rank=0)
    old = launcher.emit(SignalReceived(signal="SIGTERM"))  # an earlier stop of this run
    start = old["ts"] + 0.001
    worker.emit(Step(step=5))
    assert not pod_is_stopping(path, since=start)
    worker.emit(SignalReceived(signal="SIGTERM"))  # not the launcher's
    assert not pod_is_stopping(path, since=start)
    launcher.emit(SignalReceived(signal="SIGTERM"))
    for n in range(2000):  # pushed back beyond the tail that is read: then not seen
        worker.emit(Step(step=n))
    assert not pod_is_stopping(path, since=start)
    launcher.emit(SignalReceived(signal="SIGINT"))
    worker.emit(Step(step=6))
    with path.open("ab") as f:
        f.write(b'{"ts": 1e12, "event": "st')  # a torn last line
    assert pod_is_stopping(path, since=start)


def test_no_events_log_is_a_restart(tmp_path: Path) -> None:
    assert not pod_is_stopping(None)
    assert not pod_is_stopping(tmp_path / "missing.jsonl")


_STUCK_WORKER = """
import json, sys, time
from nvtrain.worker import stopping

out = sys.argv[1]
calls = []

def on_stop(signum):
    calls.append(signum)

def on_exit(signum, forced, waited):
    with open(out, "w") as f:
        json.dump({"signal": signum, "forced": forced, "waited": waited, "settled": calls}, f)

stopping.install(on_stop=on_stop, on_exit=on_exit)
try:
    print("READY", flush=True)  # inside the try: the stop may come at once
    time.sleep(600)
except stopping.Stopped:
    # What NVRx's wrapper did with the stop: hold the rank at its exit barrier, here for good.
    while True:
        time.sleep(1)
"""


def test_a_stopped_worker_whose_main_thread_never_returns_is_ended_by_the_stop_watch(tmp_path: Path) -> None:
    """The main thread catches the stop and blocks again (as NVRx's exit barrier did when a peer
    was dead): the stop watch settles, then ends the process with 128 + 15 and records it."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "stopped.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_WORKER, str(out)], stdout=subprocess.PIPE, text=True
    )
    with proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)  # the script alone would never exit
        finally:
            proc.kill()
    assert code == 128 + signal.SIGTERM
    import json

    record = json.loads(out.read_text())
    assert record["signal"] == signal.SIGTERM and record["forced"] is True, record
    assert record["settled"] == [signal.SIGTERM], record  # the save in flight was settled first
