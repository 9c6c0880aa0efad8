"""A worker that says which collective timeout it would run with, then exits 0. It loads the
policy ``nvtrain run`` hands it (``NVTRAIN_POLICY``) as the worker library does, without
importing torch. Marker: ``WORKER COLLECTIVE rank=R backend=B seconds=S``."""

from __future__ import annotations

import os
from pathlib import Path

from nvtrain.config.schema import Policy

policy = Policy.model_validate_json(Path(os.environ["NVTRAIN_POLICY"]).read_text(encoding="utf-8"))
print(
    f"WORKER COLLECTIVE rank={os.environ.get('RANK')} backend={policy.job.backend} "
    f"seconds={policy.job.collective_timeout}",
    flush=True,
)
