"""Checkpoint-interval tuning and the measured timings it (and ``validate --timings``) reads."""

from nvtrain.tuning.timings import Measure, Timings, read_timings

__all__ = ["Measure", "Timings", "read_timings"]
