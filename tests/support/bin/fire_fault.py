"""One step of a worker that runs the fault injector, as a process of its own.

    fire_fault.py STATE_DIR EVENTS FAULTS_JSON STEP RANK

Prints ``BEFORE``, calls ``FaultInjector.maybe_fire(STEP, RANK)`` for the faults in FAULTS_JSON
(a list of {"step", "rank", "kind"}) with markers in STATE_DIR, then prints ``AFTER`` and exits 0
(unless the fault ended the process first).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import nvtrain
from nvtrain.config.schema import Fault
from nvtrain.events import EventLog

# ``nvtrain.worker``'s __init__ imports torch (seconds on a loaded machine); the injector needs
# none of it, so the package is stood in for by an empty one and only faults.py is loaded.
_package = types.ModuleType("nvtrain.worker")
_package.__path__ = [str(Path(nvtrain.__file__).parent / "worker")]
sys.modules.setdefault("nvtrain.worker", _package)

from nvtrain.worker.faults import FaultInjector  # noqa: E402


def main() -> None:
    state_dir, events, faults, step, rank = sys.argv[1:6]
    injector = FaultInjector(
        [Fault.model_validate(f) for f in json.loads(faults)],
        Path(state_dir),
        EventLog(Path(events), run_id="faults", source="test"),
    )
    print("BEFORE", flush=True)
    injector.maybe_fire(int(step), int(rank))
    print("AFTER", flush=True)


if __name__ == "__main__":
    main()
