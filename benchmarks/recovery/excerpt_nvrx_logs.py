"""Excerpts whole ft_launcher logs (``record_nvrx_logs.sh``'s) into the small line files of
``tests/nvrx/recorded/<version>/``, each line as it was printed:

- ``launcher.txt``: every line a recogniser of ``nvtrain.nvrx.log_grammar`` acts on (a worker's
  exit, a restart, a hang, the agent's error, a rendezvous joined), scenario after scenario;
- ``records.txt``: the first launcher record of each logger format and level, the first row of a
  record's table with the record before it, and a worker's line (no record).

    PYTHONPATH=src python benchmarks/recovery/excerpt_nvrx_logs.py LOG_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from nvtrain.nvrx import log_grammar

SCENARIOS = (
    "success",
    "exit3_restart",
    "sigkill_restart",
    "hang_restart",
    "restarts_exhausted",
    "rendezvous_timeout",
    "sigterm",
)
ACTS = (
    log_grammar.worker_exit,
    log_grammar.restart,
    log_grammar.hang,
    log_grammar.agent_error,
    log_grammar.joined,
)


def _format(line: str) -> str:
    """Which logger's format a record line is in."""
    if line.startswith("["):
        return "RankMonServer" if "[RankMonServer" in line else "ft_launcher"
    return "nvrx" if line[:1].isdigit() else "torch"


def excerpt(lines: list[str], seen: set[object]) -> tuple[list[str], list[str]]:
    acts = [line for line in lines if any(act(line) for act in ACTS)]
    records: list[str] = []
    previous: str | None = None
    for line in lines:
        record = log_grammar.launcher_record(line)
        if record is not None:
            key = (_format(line), record.level)
            if key not in seen:
                seen.add(key)
                records.append(line)
            previous = line
        elif previous is not None and log_grammar.table_row(line) and "row" not in seen:
            seen.add("row")
            records += [line] if previous in records else [previous, line]
        elif line.startswith("WORKER ") and "worker" not in seen:
            seen.add("worker")
            records.append(line)
    return acts, records


def main() -> int:
    logs, out = Path(sys.argv[1]), Path(sys.argv[2])
    for version in sorted(path.name for path in logs.iterdir() if path.is_dir()):
        acts: list[str] = []
        records: list[str] = []
        seen: set[object] = set()
        for scenario in SCENARIOS:
            text = (logs / version / f"{scenario}.log").read_text(encoding="utf-8")
            more_acts, more_records = excerpt(text.splitlines(), seen)
            acts += more_acts
            records += more_records
        (out / version).mkdir(parents=True, exist_ok=True)
        for name, lines in (("launcher.txt", acts), ("records.txt", records)):
            (out / version / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
