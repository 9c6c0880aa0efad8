"""Checkpoint-interval tuning and the measured timings it (and ``validate --timings``) reads.

``interval`` holds the model (pure math), ``measured`` reads timings from a run's events log,
``apply`` rewrites ``[checkpoint] interval`` in a policy file, and ``advise`` joins them into
``tune_interval``, the one call behind ``nvtrain tune-interval``.
"""

from nvtrain.config.timings import Measure, Timings, read_timings
from nvtrain.tuning.advise import Request, Tuned, tune_interval
from nvtrain.tuning.apply import Applied, apply_interval
from nvtrain.tuning.interval import Inputs, Outcome, Recommendation, Report, daly, efficiency, tune, young
from nvtrain.tuning.measured import Measured, read_measured

__all__ = [
    "Applied",
    "Inputs",
    "Measure",
    "Measured",
    "Outcome",
    "Recommendation",
    "Report",
    "Request",
    "Timings",
    "Tuned",
    "apply_interval",
    "daly",
    "efficiency",
    "read_measured",
    "read_timings",
    "tune",
    "tune_interval",
    "young",
]
