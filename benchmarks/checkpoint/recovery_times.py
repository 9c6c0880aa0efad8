"""Recovery times from a run's events log: fault -> first completed step of the next attempt.

python benchmarks/checkpoint/recovery_times.py <run dir>/events.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def recoveries(events: list[dict]) -> list[dict]:
    out = []
    faults = [e for e in events if e["event"] == "fault_injected"]
    for fault in faults:
        after = [
            e
            for e in events
            if e["event"] == "step"
            and e["ts"] > fault["ts"]
            and (e.get("attempt"), e.get("restart_count")) != (None, None)
        ]
        first = next((e for e in after if e.get("step_s") is None), None)
        layer = None
        if first is not None:
            layer = (
                "in_job"
                if any(
                    e["event"] == "restart_begin"
                    and e.get("layer") == "in_job"
                    and fault["ts"] < e["ts"] < first["ts"]
                    for e in events
                )
                else "in_process"
            )
        out.append(
            {
                "kind": fault["kind"],
                "step": fault["step"],
                "layer": layer,
                "seconds": round(first["ts"] - fault["ts"], 3) if first else None,
                "resumed_at_step": first["step"] if first else None,
            }
        )
    return out


def main() -> None:
    events = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line]
    rows = recoveries(events)
    print("| fault | step | layer | fault -> first step after restart (s) | resumed at step |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['step']} | {r['layer']} | {r['seconds']} | {r['resumed_at_step']} |")
    for layer in ("in_process", "in_job"):
        values = [r["seconds"] for r in rows if r["layer"] == layer and r["seconds"] is not None]
        if values:
            print(f"{layer}: median {statistics.median(values):.2f} s over {len(values)}")
    restored = [e for e in events if e["event"] == "checkpoint_restored"]
    for e in restored:
        print(f"restored step {e['step']} in {e['seconds']} s from {e.get('origin', e.get('source'))}")


if __name__ == "__main__":
    main()
