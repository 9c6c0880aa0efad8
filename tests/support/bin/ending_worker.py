"""A worker whose end tells how its process ended (tests/top/test_entry.py and the warm and
ft_launcher tests that run it): ``ending_worker.py MODE [PATH | CODE]``.

Prints ``ENDING START mode=.. rank=.. name=.. path0=.. argv=..`` first and ``ENDING DONE``
when its body is over. Modes: ``abort`` (a module it imports keeps an object that aborts the
process when the interpreter frees it at exit, as torch's gloo objects can, and one that warns
when asked for its class), ``thread`` (a
non-daemon thread writes PATH once the main thread has finished), ``atexit`` (an atexit handler
writes PATH), ``open`` (writes PATH through a file that a module it imports keeps open), ``exit CODE``,
``exit-text``, ``raise``, ``interrupt``. Standard library only.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path

from kept_at_exit import AbortsWhenFreed, WarnsWhenAsked, keep

mode = sys.argv[1]
path = Path(sys.argv[2]) if len(sys.argv) > 2 else None
print(
    f"ENDING START mode={mode} rank={os.environ.get('RANK', '-')} name={__name__} "
    f"path0={sys.path[0]} argv={sys.argv[1:]}",
    flush=True,
)
if mode == "abort":
    keep(AbortsWhenFreed())
    keep(WarnsWhenAsked())  # the end looks for open files among the objects: it must not warn
elif mode == "thread":

    def late() -> None:
        threading.main_thread().join()  # the main thread is over once the interpreter ends it
        assert path is not None
        path.write_text("thread")

    threading.Thread(target=late, name="late").start()
elif mode == "atexit":
    atexit.register(lambda: path.write_text("atexit") if path else None)
elif mode == "open":
    assert path is not None
    keep(path.open("w")).write("open")  # noqa: SIM115 - left open on purpose
elif mode == "exit":
    sys.exit(int(sys.argv[2]))
elif mode == "exit-text":
    sys.exit("ending: a bad setting")
elif mode == "raise":
    raise RuntimeError("boom at the end")
elif mode == "interrupt":
    raise KeyboardInterrupt
print("ENDING DONE", flush=True)
