"""Markdown tables of a soak result (``soak.py --json FILE``), for BENCHMARKS.md.

.venv/bin/python benchmarks/soak/render.py benchmarks/soak/results/soak-1h-seed15.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

IN_PROCESS_KINDS = {"exception", "hang", "collective_hang"}


def _s(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _dist(d: dict[str, Any] | None) -> str:
    if not d:
        return "–"
    return f"{_s(d.get('median'))} / {_s(d.get('p95', d.get('p90')))} / {_s(d.get('max'))}"


def render(result: dict[str, Any]) -> str:
    rep = result["report"]
    summary = result["report_summary"]
    soak = result["soak_run"]
    out: list[str] = []
    add = out.append

    add(
        "| fault | planned | fired | recovered by (report incidents: layer) "
        "| recovery median / p90 / max (s) |"
    )
    add("|---|---|---|---|---|")
    missing: dict[str, int] = {}
    for _step, _rank, kind in result["fault_check"]["missing"]:
        missing[kind] = missing.get(kind, 0) + 1
    events_fired = result["fault_check"]["fired"]
    layers: dict[str, dict[str, int]] = {}
    for inc in rep.get("incidents", []):
        layers.setdefault(inc["cause"], {})
        layers[inc["cause"]][inc["layer"]] = layers[inc["cause"]].get(inc["layer"], 0) + 1
    by_cause = summary.get("recovery_s_by_cause", {})
    for kind, planned in result["faults_by_kind"].items():
        cause = f"{kind} (injected)"
        lay = ", ".join(f"{n} {k}" for k, n in sorted(layers.get(cause, {}).items()))
        add(
            f"| {kind} | {planned} | {planned - missing.get(kind, 0)} | {lay} "
            f"| {_dist(by_cause.get(cause))} |"
        )
    kills = result["external_sigkills"]
    other = {c: v for c, v in layers.items() if not c.endswith("(injected)")}
    lay = "; ".join(
        f"{c}: " + ", ".join(f"{n} {k}" for k, n in sorted(v.items())) for c, v in sorted(other.items())
    )
    add(
        f"| SIGKILL from outside | {kills['attempts']} draws | {kills['count']} killed | {lay} | "
        + "; ".join(f"{c}: {_dist(by_cause.get(c))}" for c in sorted(other))
        + " |"
    )
    add(f"\n{events_fired} injected faults fired, each once.\n")

    add(
        "| layer | recoveries | total median / p95 / max (s) | detection | teardown | rendezvous | start "
        "| restore | first step (phase medians, s) |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for layer, rec in sorted((rep.get("recovery") or {}).items()):
        ph = rec.get("phases_s") or {}
        med = [
            _s((ph.get(k) or {}).get("median"), 2)
            for k in ("detection", "teardown", "rendezvous", "start", "restore", "first_step")
        ]
        add(f"| {layer} | {rec['count']} | {_dist(rec.get('total_s'))} | " + " | ".join(med) + " |")

    g, t, st = rep["goodput"], rep["time_s"], rep["steps"]
    ck, rb = rep.get("checkpoints", {}), rep.get("rollback", {})
    add("")
    add("| report figure | value |")
    add("|---|---|")
    add(f"| wall time of the soak run | {soak['wall_s']:.0f} s ({soak['wall_s'] / 60:.1f} min) |")
    add(f"| training goodput / infrastructure goodput | {g['training']:.1%} / {g['infrastructure']:.1%} |")
    add(
        f"| time: up / recovering / start-up / shut-down | {t['up']:.0f} / {t['recovering']:.0f} / "
        f"{t['startup']:.0f} / {t['shutdown']:.0f} s |"
    )
    add(
        f"| steps: final / executed / rolled back | {st['final']} / {st['executed']} / {st['rolled_back']} "
        f"({st['rolled_back_s']:.0f} s) |"
    )
    add(f"| rollback per fault, steps: median / p95 / max | {_dist(rb.get('steps'))} |")
    add(
        f"| restarts by layer | {', '.join(f'{k} {v}' for k, v in rep['restarts']['by_layer'].items())} "
        f"({rep['restarts'].get('failed_attempts')} failed attempts) |"
    )
    add(
        "| checkpoints: saves / committed / partial / corrupt / failed "
        f"| {ck.get('saves')} / {ck.get('committed')} "
        f"/ {ck.get('partial')} / {ck.get('corrupt')} / {ck.get('failed')} |"
    )
    rc = result["restore_check"]
    add(
        f"| restores (rank-level): storage / memory | {rc['by_origin'].get('storage', 0)} / "
        f"{rc['by_origin'].get('memory', 0)} in {rc['recoveries_with_restore']} recoveries |"
    )
    add("")
    add("| check | result |")
    add("|---|---|")
    for name, ok in result["checks"].items():
        add(f"| {name} | {'pass' if ok else '**FAIL**'} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
