"""Measured timings: the one format shared by ``nvtrain validate --timings`` and ``tune-interval``.

A timings file is TOML (or JSON with the same keys). Each measure is either one duration or a
table with ``median`` and optionally ``p95`` and ``max``::

    step = "1.2s"                 # time per training step
    [save_block]                  # time training is blocked per checkpoint save
    median = "0.8s"
    max = "1.5s"
    [save_write]                  # background write after the blocking part
    median = "40s"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nvtrain.config.duration import Duration
from nvtrain.config.load import Parsed, parse_model, read_source, too_complex, validate_data
from nvtrain.findings import Finding

__all__ = ["Measure", "Timings", "read_timings"]

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)


class Measure(BaseModel):
    """One measured duration: its median and, when known, its 95th percentile and maximum."""

    model_config = _CONFIG

    median: Duration
    """Median of the measured durations."""

    p95: Duration | None = None
    """95th percentile, if measured."""

    max: Duration | None = None
    """Longest measured duration, if measured."""

    @model_validator(mode="before")
    @classmethod
    def _one_duration(cls, value: Any) -> Any:
        return value if isinstance(value, dict | Measure) else {"median": value}

    @property
    def worst(self) -> float:
        """The longest duration known: max, else p95, else the median."""
        return self.max or self.p95 or self.median


class Timings(BaseModel):
    """Measured timings of one training job. Every measure is optional."""

    model_config = _CONFIG

    step: Measure | None = None
    """Time per training step (between two heartbeats)."""

    save_block: Measure | None = None
    """Time the training loop is blocked per checkpoint save (staging, when async)."""

    save_write: Measure | None = None
    """Background write time per save, after the blocking part (async only)."""

    restore: Measure | None = None
    """Time to load the newest checkpoint at start-up or after a restart."""

    eval: Measure | None = None
    """Time of one evaluation pass, if the loop runs one between steps."""

    restart_in_process: Measure | None = Field(default=None)
    """Fault to the next completed step, in-process restart."""

    restart_in_job: Measure | None = Field(default=None)
    """Fault to the next completed step, in-job (ft_launcher) restart."""


def read_timings(path: Path) -> Parsed[Timings]:
    """Read a timings file (TOML, or JSON when the name ends in ``.json``); never raises."""
    raw, problem = read_source(
        path,
        "check the path; write a timings file by hand, or take `.measured.timings` from "
        "`nvtrain tune-interval --from-run RUN --json`",
    )
    if raw is None:
        assert problem is not None
        return Parsed(str(path), None, [problem], {}, {})
    if path.suffix == ".json":
        return _parse_json(raw, str(path))
    return parse_model(raw, str(path), Timings)


def _parse_json(raw: bytes, source: str) -> Parsed[Timings]:
    try:
        data = json.loads(raw)
    except (RecursionError, MemoryError) as exc:
        return Parsed(source, None, [too_complex(exc, source)], {}, {})
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        finding = Finding(
            "error",
            "json-syntax",
            "",
            None,
            f"is not valid JSON ({exc})",
            'write a JSON object whose keys are the measures, e.g. {"step": "1.2s"}',
            file=source,
            line=line,
        )
        return Parsed(source, None, [finding], {}, {})
    if not isinstance(data, dict):
        finding = Finding(
            "error",
            "json-syntax",
            "",
            None,
            "must be a JSON object",
            'write e.g. {"step": "1.2s"}',
            file=source,
        )
        return Parsed(source, None, [finding], {}, {})
    try:
        return validate_data(data, source, Timings, {})
    except (RecursionError, MemoryError) as exc:
        return Parsed(source, None, [too_complex(exc, source)], {}, {})
