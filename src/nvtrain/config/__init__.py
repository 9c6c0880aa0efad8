"""The policy: its schema, loading with positions, and cross-field checks.

Nothing in this package imports torch or NVRx.
"""

from nvtrain.config.duration import format_duration, parse_duration
from nvtrain.config.schema import Policy
from nvtrain.config.validation import (
    Setting,
    Validation,
    effective_settings,
    load_policy,
    validate_file,
    validate_source,
)
from nvtrain.findings import Finding

__all__ = [
    "Finding",
    "Policy",
    "Setting",
    "Validation",
    "effective_settings",
    "format_duration",
    "load_policy",
    "parse_duration",
    "validate_file",
    "validate_source",
]
