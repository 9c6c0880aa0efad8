"""Helpers shared by the benchmark scripts (not part of nvtrain; nothing in ``src`` imports them).

- ``procs``: free ports, ``nvtrain run`` / torchrun command lines, one job run in a process
  group of its own with a timeout (the N-rank runner), stopping a group;
- ``runs``: ``nvtrain report --json`` of a run, a run's events merged across pods, the
  environment that puts another ``src`` first;
- ``policy``: TOML policies written from tables, fault tables;
- ``stats``: medians, percentiles, ratios, number formatting;
- ``cli``: argument parsers, the record of the arguments, JSON output;
- ``host``: the machine (CPU, versions, git HEAD, load), the checkpoint disk's write rate.

A script in a sub-folder finds the package with one line before its imports::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib

Importing the package puts this checkout's ``src`` first on ``sys.path``: the benchmarks
measure the tree they are in (a child process gets its own ``PYTHONPATH``, see ``runs.src_env``).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
