"""The NVRx modules nvtrain runs as programs or imports ahead, by their import names."""

from __future__ import annotations

from nvtrain.nvrx.messages import PACKAGE

__all__ = ["CONTROL_PLANE", "LAUNCHER", "PRELOAD"]

LAUNCHER = f"{PACKAGE}.fault_tolerance.launcher"
"""ft_launcher's module (``python -m``), which ``nvtrain.nvrx.ftmain`` runs."""
CONTROL_PLANE = f"{PACKAGE}.fault_tolerance.control_plane"
"""The module behind NVRx's ``nvrx-control`` script (0.6, 0.7)."""
PRELOAD = (f"{PACKAGE}.fault_tolerance", f"{PACKAGE}.inprocess")
"""What a worker of the worker library imports of NVRx on its way to the first step (the
warm-start server imports them before it forks)."""
