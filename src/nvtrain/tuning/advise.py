"""``nvtrain tune-interval`` as one library call: gather the inputs, run the model, apply.

Inputs come from an events log (``--from-run``), from values given by hand (which win), and
from a policy (the current interval, async or sync, the job's size). Every problem is a
``UsageError`` (exit 2) naming the option and the fix, or a ``ConfigError`` for a bad policy.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from nvtrain.config.duration import DURATION_HINT, parse_duration
from nvtrain.config.schema import Policy
from nvtrain.config.timings import Measure
from nvtrain.errors import UsageError
from nvtrain.tuning.apply import Applied, apply_interval
from nvtrain.tuning.interval import (
    DEFAULT_WRITE_MARGIN,
    Inputs,
    Mode,
    Outcome,
    Recommendation,
    Report,
    short_duration,
    tune,
)
from nvtrain.tuning.measured import Layer, Measured, read_measured

__all__ = ["Request", "Tuned", "tune_interval"]

_RATE_FIX = (
    "give --mtbf (the whole job's), or --gpus N --gpu-mtbf T, or --nodes N --node-mtbf T; e.g. "
    "--gpus 1024 --gpu-mtbf 8000h (Meta's clusters: one job failure every 7.9 h at 1,024 GPUs)"
)


MIN_DURATION = 1e-6
"""Shortest duration ``tune-interval`` takes (a microsecond): shorter ones overflow the model."""
MAX_DURATION = 1e6 * 3600.0
"""Longest duration it takes: a million hours (vendors' per-device MTBF figures reach it)."""
MAX_COUNT = 10_000_000
"""Most GPUs or nodes in a job."""
MAX_WRITE_MARGIN = 100.0
"""Largest ``--write-margin``."""

_OPTIONS = {
    "step": "--step-time",
    "save_block": "--save-block",
    "save_write": "--save-write",
    "restore": "--restore",
    "restart": "--restart",
}
_LABELS = {
    "step": "step time",
    "save_block": "time blocked per save",
    "save_write": "background write time",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """The options of ``nvtrain tune-interval``; durations as the user wrote them."""

    from_run: Path | None = None
    policy: Path | None = None
    step_time: str | None = None
    save_block: str | None = None
    save_write: str | None = None
    restore: str | None = None
    restart: str | None = None
    mtbf: str | None = None
    gpus: int | None = None
    gpu_mtbf: str | None = None
    nodes: int | None = None
    node_mtbf: str | None = None
    write_margin: float = DEFAULT_WRITE_MARGIN
    apply: Path | None = None


@dataclasses.dataclass(frozen=True)
class Tuned:
    """Everything ``tune-interval`` prints: the report, where each input came from, notes."""

    report: Report
    origins: dict[str, str]
    """Input name (``step``, ``save_block``, ...) to where its value came from."""
    events: str | None
    policy: str | None
    measured: Measured | None
    applied: Applied | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready data (seconds, fractions, step counts)."""
        r = self.report
        i = r.inputs
        return {
            "mode": r.mode,
            "inputs": {
                "step_s": i.step_s,
                "save_block_s": i.save_block_s,
                "save_write_s": i.save_write_s,
                "save_write_p95_s": i.write_p95_s() if i.save_write_s is not None else None,
                "restart_s": i.restart_s,
                "restore_s": i.restore_s,
                "mtbf_s": i.mtbf_s,
                "write_margin": i.write_margin,
                "from": self.origins,
            },
            "recommended": {m: _recommendation(rec) for m, rec in r.recommended.items()},
            "current": (
                {"interval_steps": r.current_steps, **{m: _outcome(o) for m, o in r.current.items()}}
                if r.current_steps is not None
                else None
            ),
            "interval_steps": r.best.outcome.interval_steps,
            "binds": r.best.binds,
            "advice": r.advice,
            "notes": list(self.notes),
            "events": self.events,
            "policy": self.policy,
            "measured": (
                {
                    "counts": self.measured.counts,
                    "timings": self.measured.timings.model_dump(exclude_none=True),
                    "restore_from": self.measured.restore_from,
                    "restore_by_origin": {
                        origin: {"loads": v.loads, "median_s": v.median, "recoveries": v.recoveries}
                        for origin, v in self.measured.by_origin.items()
                    },
                    "saves_waited": len(self.measured.waits),
                    "warnings": list(self.measured.warnings),
                }
                if self.measured is not None
                else None
            ),
            "applied": dataclasses.asdict(self.applied) if self.applied is not None else None,
        }


def tune_interval(request: Request) -> Tuned:
    """Recommend a checkpoint interval for ``request`` (and apply it when asked)."""
    margin = request.write_margin
    if not (math.isfinite(margin) and 1.0 <= margin <= MAX_WRITE_MARGIN):
        rule = "is below 1" if margin < 1.0 else f"must be a number from 1 to {MAX_WRITE_MARGIN:g}"
        raise UsageError(f"--write-margin {margin:g} {rule}", "use e.g. --write-margin 1.5")
    given = {
        name: _duration(option, text, zero=name in ("restore", "restart"))
        for name, option, text in (
            ("step", "--step-time", request.step_time),
            ("save_block", "--save-block", request.save_block),
            ("save_write", "--save-write", request.save_write),
            ("restore", "--restore", request.restore),
            ("restart", "--restart", request.restart),
        )
        if text is not None
    }
    policy_path = request.policy or request.apply
    policy: Policy | None = None
    if policy_path is not None:
        from nvtrain.config.validation import load_policy

        policy = load_policy(policy_path)
    mode: Mode = "sync" if policy is not None and not policy.checkpoint.async_ else "async"
    origins: dict[str, str] = {}
    mtbf = _mtbf(request, policy, origins)
    measured = read_measured(request.from_run) if request.from_run is not None else None
    notes: list[str] = []

    def pick(name: str) -> float | None:
        if name in given:
            origins[name] = f"given ({_OPTIONS[name]})"
            return given[name]
        found: Measure | None = getattr(measured.timings, name) if measured is not None else None
        if found is None or measured is None:
            return None
        count = measured.counts[name]
        spread = f", p95 {short_duration(found.p95)}" if found.p95 is not None and count > 1 else ""
        origins[name] = f"measured: median of {count}{spread}"
        return found.median

    step, block, write = pick("step"), pick("save_block"), pick("save_write")
    values = {"step": step, "save_block": block, "save_write": write}
    needed = ["step", "save_block"] + (["save_write"] if mode == "async" else [])
    lacking = [n for n in needed if values[n] is None]
    if lacking or mtbf is None:
        raise _missing(lacking, mtbf is None, measured)
    assert step is not None and block is not None and mtbf is not None
    write_p95 = None
    if "save_write" not in given and measured is not None and measured.timings.save_write is not None:
        write_p95 = measured.timings.save_write.p95 if measured.counts["save_write"] > 1 else None
    if write is not None and write_p95 is None:
        notes.append(
            f"the write time's spread is unknown: its p95 is taken as {request.write_margin:g}x the median"
        )
    restore = _restore(given.get("restore"), measured, origins, notes)
    restart = _restart(given.get("restart"), measured, origins, notes)
    if measured is not None and measured.waits:
        total = measured.counts["save_block"]
        notes.append(
            f"{len(measured.waits)} of {total} saves in the run waited for the previous write "
            f"(longest {short_duration(max(measured.waits))}): that run's interval was write-bound"
        )
    inputs = Inputs(
        step_s=step,
        save_block_s=block,
        save_write_s=write,
        mtbf_s=mtbf,
        restart_s=restart,
        restore_s=restore,
        save_write_p95_s=write_p95,
        write_margin=request.write_margin,
    )
    try:
        report = tune(
            inputs,
            mode=mode,
            current_steps=policy.checkpoint.interval if policy is not None else None,
            max_steps=policy.job.max_steps if policy is not None else None,
        )
    except (ArithmeticError, ValueError) as exc:  # inf or nan from extreme (measured) inputs
        shown = ", ".join(f"{name} {short_duration(value)}" for name, value in _shown(inputs))
        raise UsageError(
            f"tune-interval cannot compute an interval from these timings ({shown}): {exc}",
            "check the timings and the failure rate; give them with units, e.g. --step-time 1.2s --mtbf 8h",
        ) from None
    applied = apply_interval(request.apply, report.best.outcome.interval_steps) if request.apply else None
    return Tuned(
        report=report,
        origins=origins,
        events=measured.source if measured is not None else None,
        policy=str(policy_path) if policy_path is not None else None,
        measured=measured,
        applied=applied,
        notes=(*report.notes, *notes),
    )


def _shown(inputs: Inputs) -> list[tuple[str, float]]:
    values = [
        ("step", inputs.step_s),
        ("save block", inputs.save_block_s),
        ("save write", inputs.save_write_s),
        ("MTBF", inputs.mtbf_s),
    ]
    return [(name, value) for name, value in values if value is not None]


def _missing(lacking: list[str], no_rate: bool, measured: Measured | None) -> UsageError:
    """One error for every input that is missing, with the options that give each."""
    fixes: list[str] = []
    if measured is not None and lacking:
        found = measured.missing(lacking)
        message = f"{measured.source} has no " + _and([w.split(" has no ", 1)[1] for w, _ in found])
        message += "; the failure rate is unknown" if no_rate else ""
        fixes += [f for _, f in found]
    else:
        items = [f"the {_LABELS[n]}" for n in lacking] + (["the failure rate"] if no_rate else [])
        message = "tune-interval needs " + _and(items)
        if lacking:
            options = ", ".join(_OPTIONS[n] for n in lacking)
            fixes.append(f"give {options}, or --from-run RUN (a run of this job)")
    if no_rate:
        fixes.append(_RATE_FIX)
    return UsageError(message, "; ".join(fixes))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _duration(option: str, text: str, *, zero: bool = False) -> float:
    """``text`` in seconds: a number, or a duration with units as in the policy."""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise UsageError(f"{option} {text} is negative", f"give a positive duration; {DURATION_HINT}")
    value: str | float = stripped
    try:
        value = float(stripped)
    except ValueError:
        pass
    if zero and value in (0.0, "0s", "0ms", "0m", "0h"):
        return 0.0
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        rule = str(exc).split(";")[0]
        raise UsageError(f"{option} {text} {rule}", DURATION_HINT) from None
    if not MIN_DURATION <= seconds <= MAX_DURATION:
        rule = (
            f"is shorter than {MIN_DURATION:g}s (a microsecond)"
            if seconds < MIN_DURATION
            else f"is longer than {MAX_DURATION / 3600:.0f}h (about 114 years)"
        )
        raise UsageError(
            f"{option} {text} {rule}, beyond any timing or failure rate of a training job",
            f"give it with its unit, e.g. {option} 1.2s (or 40s, 15m, 8000h)",
        )
    return seconds


def _restore(
    given: float | None, measured: Measured | None, origins: dict[str, str], notes: list[str]
) -> float:
    """The load time per recovery: given, else measured (``_measured_restore``), else 0."""
    if given is not None:
        origins["restore"] = "given (--restore)"
        return given
    found = _measured_restore(measured, origins) if measured is not None else None
    if measured is None or found is None:
        origins["restore"] = "unknown: taken as 0"
        notes.append("the checkpoint load time is unknown and taken as 0; give --restore")
        return 0.0
    notes.extend(_restore_notes(measured))
    return found


def _measured_restore(measured: Measured, origins: dict[str, str]) -> float | None:
    """Each origin's median load weighted by the share of the recoveries that loaded from it;
    without such recoveries, the median of the loads from storage (else from a peer, else from
    the pod's own host memory)."""
    weighed = measured.weighed
    per_recovery = measured.restore_per_recovery()
    if per_recovery is not None:
        total = sum(v.recoveries for v in weighed.values())
        parts = [
            f"{v.recoveries} from {o} (median {short_duration(v.median or 0.0)})" for o, v in weighed.items()
        ]
        origins["restore"] = f"measured: {total} {_plural(total, 'recovery', 'recoveries')}, {_and(parts)}"
        return per_recovery
    found = measured.timings.restore
    if found is None:
        return None
    origins["restore"] = (
        f"measured: median of {measured.counts['restore']} loads from {measured.restore_from}"
    )
    return found.median


_FROM = {"memory": "host memory", "peer": "a peer"}
"""The origins other than storage, as the notes name them."""


def _restore_notes(measured: Measured) -> list[str]:
    """What the measured load time leaves out: the slower loads of a lost node or pod (from a
    peer's host copy, or from storage when no copy in memory is left)."""
    by_origin = measured.by_origin
    memory, peer, storage = by_origin.get("memory"), by_origin.get("peer"), by_origin.get("storage")
    if memory is None or storage is None:
        return []
    peer_loads = peer.loads if peer is not None else 0
    if not storage.loads:
        if peer_loads:
            seen = "host memory and a peer" if memory.loads else "a peer"
            return [
                f"only loads from {seen} were measured; a recovery that finds no copy in memory "
                "(several pods lost at once, or a damaged copy) loads from storage and is slower: "
                "give --restore when that is common"
            ]
        if memory.loads:
            return [
                "only loads from host memory were measured; a lost node or pod loads from storage "
                "(or a peer) and is slower: give --restore"
            ]
        return []
    weighed = measured.weighed
    if not weighed or "storage" in weighed or storage.median is None:
        return []
    from_storage = f"storage (median {short_duration(storage.median)} in this run)"
    if "peer" in weighed:
        loaded = " or ".join(_FROM[o] for o in weighed)
        return [
            f"every recovery loaded from {loaded}; a recovery that finds no copy in memory (several "
            f"pods lost at once, or a damaged copy) loads from {from_storage}: give --restore when "
            "that is common"
        ]
    if peer is not None and peer.median is not None:
        lost = f"a peer (median {short_duration(peer.median)}) or {from_storage}"
    else:
        lost = f"{from_storage} or a peer"
    return [
        f"every recovery loaded from host memory; a lost node or pod loads from {lost}: give "
        "--restore when those are common"
    ]


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def _restart(
    given: float | None, measured: Measured | None, origins: dict[str, str], notes: list[str]
) -> float:
    if given is not None:
        origins["restart"] = "given (--restart)"
        return given
    layers: tuple[tuple[Layer, str], ...] = (("in_job", "in-job"), ("in_process", "in-process"))
    for layer, label in layers:
        found = measured.restart(layer) if measured is not None else None
        if found is not None:
            seconds, count = found
            origins["restart"] = f"measured: {label}, median of {count}, less the load"
            if layer == "in_process":
                notes.append(
                    "only in-process restarts were measured; a lost GPU or node needs an in-job "
                    "restart, which takes longer: give --restart"
                )
            return seconds
    origins["restart"] = "unknown: taken as 0"
    notes.append("the restart time is unknown and taken as 0 (the run had no fault); give --restart")
    return 0.0


def _mtbf(request: Request, policy: Policy | None, origins: dict[str, str]) -> float | None:
    """The job's MTBF from --mtbf or the per-GPU/per-node rates; None when none is given."""
    per_gpu = request.gpu_mtbf is not None or request.gpus is not None
    per_node = request.node_mtbf is not None or request.nodes is not None
    if request.mtbf is not None:
        if per_gpu or per_node:
            raise UsageError(
                "--mtbf is the whole job's MTBF; it cannot be combined with per-GPU or per-node rates",
                "give either --mtbf, or the per-GPU or per-node rates",
            )
        origins["mtbf"] = "given (--mtbf)"
        return _duration("--mtbf", request.mtbf)
    if not (per_gpu or per_node):
        return None
    rate = 0.0
    parts = []
    if per_gpu:
        gpus = _count("--gpus", request.gpus, policy.world_size() if policy is not None else None, "GPUs")
        each = _rate_mtbf("--gpu-mtbf", request.gpu_mtbf, "--gpus", "GPU")
        rate += gpus / each
        parts.append(f"{gpus:,} GPUs x {short_duration(each)} each")
    if per_node:
        nodes = _count(
            "--nodes", request.nodes, policy.rendezvous.nodes if policy is not None else None, "nodes"
        )
        each = _rate_mtbf("--node-mtbf", request.node_mtbf, "--nodes", "node")
        rate += nodes / each
        parts.append(f"{nodes:,} nodes x {short_duration(each)} each")
    origins["mtbf"] = "from " + " and ".join(parts)
    return 1.0 / rate


def _count(option: str, given: int | None, from_policy: int | None, what: str) -> int:
    value = given if given is not None else from_policy
    if value is None:
        raise UsageError(
            f"--{what.lower()[:-1]}-mtbf needs {option}, the number of {what} in the job",
            f"give {option} N (the policy does not say how many)",
        )
    if value < 1:
        raise UsageError(f"{option} {value} is below 1", f"give the number of {what} in the job")
    if value > MAX_COUNT:
        raise UsageError(
            f"{option} {value} is more {what} than any job has (at most {MAX_COUNT:,})",
            f"give the number of {what} in the job",
        )
    return value


def _rate_mtbf(option: str, given: str | None, count_option: str, unit: str) -> float:
    if given is None:
        raise UsageError(
            f"{count_option} needs {option}, the mean time between failures of one {unit}", _RATE_FIX
        )
    return _duration(option, given)


def _recommendation(rec: Recommendation) -> dict[str, Any]:
    return {
        "delta_s": rec.delta_s,
        "young_s": rec.young_s,
        "daly_s": rec.daly_s,
        "floor_steps": rec.floor_steps,
        "binds": rec.binds,
        **_outcome(rec.outcome),
    }


def _outcome(o: Outcome) -> dict[str, Any]:
    data = dataclasses.asdict(o)
    data.pop("mode")
    return data
