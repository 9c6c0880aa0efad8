"""What each NVIDIA Resiliency Extension (NVRx) version accepts and how it behaves.

This is the one place that knows the differences between NVRx 0.4 and 0.6/0.7 (see
``docs/run.md`` and ``docs/worker.md``). It never imports NVRx: the installed version is read
from package metadata, so ``nvtrain validate`` stays fast and works where NVRx is not installed.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import metadata

__all__ = ["DISTRIBUTION", "NO_RESTART_EXIT_CODE", "TESTED", "NvrxVersion", "installed_nvrx"]

DISTRIBUTION = "nvidia-resiliency-ext"

TESTED = ("0.4", "0.6", "0.7")
"""Release lines nvtrain is tested against (0.4.1 in CI; 0.6/0.7 on GPU images)."""

NO_RESTART_EXIT_CODE = 93
"""ft_launcher's exit code (NVRx 0.7+) when NVRx itself decided that restarting is pointless."""


@dataclasses.dataclass(frozen=True, order=True)
class NvrxVersion:
    """A parsed NVRx version with the behaviour nvtrain depends on."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> NvrxVersion:
        """``"0.4.1"``, ``"0.7"`` or ``"0.6.0rc1"`` -> NvrxVersion; ValueError otherwise."""
        match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not match:
            raise ValueError(f"{text!r} is not an NVRx version such as 0.4.1 or 0.7.0")
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def line(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def tested(self) -> bool:
        return self.line in TESTED

    @property
    def barrier_rendezvous(self) -> bool:
        """0.6+: barrier rendezvous; ``--nnodes=MIN:MAX`` is a fixed world of MIN nodes plus
        MAX-MIN hot spares. 0.4: legacy rendezvous; the world shrinks to the nodes left."""
        return (self.major, self.minor) >= (0, 6)

    @property
    def has_control_plane(self) -> bool:
        """0.6+ ships ``nvrx-control``: the rendezvous store in a process of its own."""
        return self.barrier_rendezvous

    @property
    def supports_min_healthy(self) -> bool:
        """``--ft-restart-policy=min-healthy`` exists only before 0.6."""
        return not self.barrier_rendezvous

    @property
    def inprocess_deprecated(self) -> bool:
        """In-process restart is deprecated from 0.6 on (still shipped and working)."""
        return self.barrier_rendezvous

    @property
    def default_heartbeat_timeouts(self) -> tuple[float | None, float | None]:
        """NVRx's own (initial, steady-state) heartbeat timeouts when its config sets none:
        3600 s and 2700 s on 0.4, None (no hang detection) from 0.6 on. 0.4's
        ``--ft-*-timeout`` options take numbers only, so nvtrain passes an unset timeout as
        ``null`` in the ``--ft-cfg-path`` file, on every version (``launcher.plan.ft_config``)."""
        return (3600.0, 2700.0) if not self.barrier_rendezvous else (None, None)

    @property
    def rejects_unknown_sections(self) -> bool:
        """0.4: a section the workers open that ``rank_section_timeouts`` does not name raises
        ``RankMonitorClientError`` in the worker; 0.6+ ignores it."""
        return not self.barrier_rendezvous

    @property
    def has_no_restart_exit_code(self) -> bool:
        """0.7 exits 93 when it decides a restart is pointless."""
        return (self.major, self.minor) >= (0, 7)

    def is_no_restart_exit(self, launcher_exit_code: int) -> bool:
        """Whether ft_launcher's exit code says "do not restart": 93 on 0.7+ (its progress
        tracker saw no progress over several restarts). Before 0.7, 93 means nothing special."""
        return self.has_no_restart_exit_code and launcher_exit_code == NO_RESTART_EXIT_CODE


def installed_nvrx() -> NvrxVersion | None:
    """The NVRx version installed in this environment, or None."""
    try:
        return NvrxVersion.parse(metadata.version(DISTRIBUTION))
    except (metadata.PackageNotFoundError, ValueError):
        return None
