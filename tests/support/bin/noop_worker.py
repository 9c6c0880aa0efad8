"""A worker that says it ran, with its arguments, and exits 0. Marker: ``WORKER RAN``."""

from __future__ import annotations

import os
import sys

print(f"WORKER RAN rank={os.environ.get('RANK')} args={sys.argv[1:]}", flush=True)
