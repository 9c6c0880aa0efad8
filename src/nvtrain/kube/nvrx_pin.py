"""The NVRx version a manifest is rendered for: ``nvtrain manifest --nvrx VERSION``.

What NVRx accepts depends on its version (``nvtrain.nvrx``), and the version that counts is the
one in the training image, not the one on the machine that renders or validates. ``nvtrain
manifest --nvrx`` checks the policy against it and records it in the training pods' annotation
``NVRX_ANNOTATION``; ``nvtrain validate --manifest`` reads it back and checks the policy against
the same version.
"""

from __future__ import annotations

from nvtrain.errors import UsageError
from nvtrain.nvrx import NvrxVersion

__all__ = ["NVRX_ANNOTATION", "parse_nvrx_option"]

NVRX_ANNOTATION = "nvtrain.dev/nvrx-version"
"""Pod annotation holding the NVRx version of the training image (``0.7.0``)."""


def parse_nvrx_option(text: str, flag: str = "--nvrx") -> NvrxVersion:
    """``text`` given to ``flag`` as an NVRx version; a usage error (exit 2) when it is none."""
    try:
        return NvrxVersion.parse(text)
    except ValueError:
        fix = "give a version such as 0.4.1 or 0.7.0"
        raise UsageError(f"{flag} {text!r} is not a version", fix) from None
