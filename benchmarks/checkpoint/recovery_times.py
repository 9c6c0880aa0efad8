"""Recovery times from a run's events log: fault -> first completed step of the next attempt.

python benchmarks/checkpoint/recovery_times.py <run dir>

The run directory is ``<checkpoint dir>/<run id>`` (every pod's ``events-node<N>.jsonl`` in it
is read); one events log file works too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
import _lib  # noqa: E402, F401  (this tree's src first on the path)

from nvtrain.errors import UsageError  # noqa: E402
from nvtrain.events.records import CheckpointRestored, Event, FaultInjected, RestartBegin, Step  # noqa: E402
from nvtrain.runlog import read_log  # noqa: E402


def recoveries(events: list[Event]) -> list[dict[str, Any]]:
    out = []
    faults = [e for e in events if isinstance(e, FaultInjected)]
    for fault in faults:
        after = [
            e
            for e in events
            if isinstance(e, Step) and e.ts > fault.ts and (e.attempt, e.restart_count) != (None, None)
        ]
        first = next((e for e in after if e.step_s is None), None)
        layer = None
        if first is not None:
            layer = (
                "in_job"
                if any(
                    isinstance(e, RestartBegin) and e.layer == "in_job" and fault.ts < e.ts < first.ts
                    for e in events
                )
                else "in_process"
            )
        out.append(
            {
                "kind": fault.kind,
                "step": fault.step,
                "layer": layer,
                "seconds": round(first.ts - fault.ts, 3) if first else None,
                "resumed_at_step": first.step if first else None,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run", type=Path, help="the run directory (<checkpoint dir>/<run id>), or one events log file"
    )
    args = parser.parse_args()
    try:
        _, read = read_log(args.run, "run")
    except UsageError as exc:
        raise SystemExit(f"{exc.message}: {exc.fix}") from None
    events = sorted(read, key=lambda e: e.ts)  # every pod's log, merged in time order
    rows = recoveries(events)
    print("| fault | step | layer | fault -> first step after restart (s) | resumed at step |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['step']} | {r['layer']} | {r['seconds']} | {r['resumed_at_step']} |")
    for layer in ("in_process", "in_job"):
        values = [r["seconds"] for r in rows if r["layer"] == layer and r["seconds"] is not None]
        if values:
            print(f"{layer}: median {statistics.median(values):.2f} s over {len(values)}")
    restored = [e for e in events if isinstance(e, CheckpointRestored)]
    for e in restored:
        # logs before ``origin`` named it ``source`` (now the writer's common field)
        origin = e.origin if e.origin is not None else e.source
        print(f"restored step {e.step} in {e.seconds} s from {origin}")


if __name__ == "__main__":
    main()
