"""Whether the warm-start server may fork its workers: ``fork_problem``.

A fork copies one thread, the caller; any other thread's locks stay taken in the child, and
whatever it was doing is never finished there. So the server refuses to serve when its imports
left CUDA initialised or other threads running: Python's (``threading``) and native ones too
(started by a C library, invisible to ``threading``), counted as the kernel sees them, in
``/proc/self/task``.

One native pool is known and let be: the one OpenBLAS starts as it loads (``import torch``
loads numpy's, one thread per core after the first). OpenBLAS stops that pool before a fork
(its ``pthread_atfork`` handler) and starts it again when next needed, in the child too.
``os_threads`` counted after the imports every worker makes (``server.BASE``, ``PLAIN``) is the
``base`` that the script's own imports must not add to.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["fork_problem", "os_threads"]

TASKS = "/proc/self/task"
"""One entry per thread of this process (Linux)."""


def os_threads() -> int:
    """The threads of this process, native ones included."""
    return len(os.listdir(TASKS))


def fork_problem(base: int) -> str | None:
    """Why forking this interpreter would be unsafe, or None. ``base``: ``os_threads()`` once
    the imports every worker makes were done (their known pool, see the module's text)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised while importing the script's modules"
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"importing the script's modules started threads ({names})"
    native = os_threads() - base
    if native > 0:
        return (
            f"importing the script's modules started {native} native thread(s) "
            "(not Python's: a C library's, such as a thread pool)"
        )
    return None
