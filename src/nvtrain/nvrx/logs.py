"""What NVRx writes to the terminal: its loggers and warnings set up so that a healthy run prints
nothing of NVRx's that needs no action (docs/run.md, "What a healthy run prints").

Configuration, not text filtering: each record or warning that is held back is named by where it
comes from (NVRx's module, function and level, or the warning's module and category), and only
on a node where it can only say that there is nothing to check.

- **The in-process layer's loggers** (every version). The Wrapper looks for a plain
  ``StreamHandler`` on the root logger; finding none (nvtrain never configures the root logger of
  a training script) it warns ``logging not initialized, logs are disabled`` once per worker per
  attempt, and its records (``fn_ex``, ``term_ex``: the exception a rank's training function
  raised, the restart NVRx decided) reach Python's last-resort handler, bare. The warning is
  ignored by module and category, and the records of ``WARNING`` and above get a handler that
  names them (``nvrx inprocess.wrap: rank=1 fn_ex: ...``), used only where the application gave
  them none of its own; ``INFO`` and ``DEBUG`` stay off the terminal.
- **Health checks of hardware the node lacks.** On a node without InfiniBand, NVRx 0.6+'s
  NIC checks (the Wrapper's restart health check, the NIC link-state check) log that they have no
  NIC to watch; on a node without a GPU, NVRx 0.4's GPU check before each rendezvous logs that
  it is disabled (no NVML). Those records are held back; their failures (``ERROR`` records of
  other functions) are not.

Imports only the standard library; NVRx is never imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "NVRX_LOGGERS",
    "HardwareChecks",
    "configure_launcher",
    "configure_worker",
    "held_back",
    "node_hardware",
]

NVRX_LOGGERS = ("nvidia_resiliency_ext", "nvrx")
"""NVRx's logger trees: per module (every version) and 0.6+'s shared ``nvrx`` logger."""
PREFIX = "nvidia_resiliency_ext."
HEALTH_CHECK_LOGGERS = ("nvidia_resiliency_ext.shared_utils.health_check", "nvrx")
"""Where the health checks log: their module's logger (0.4), the shared one (0.6+). A logger's
filters see only the records logged on it, so the filter goes on each."""

HEALTH_CHECK_MODULE = "health_check"
"""``nvidia_resiliency_ext.shared_utils.health_check``, as a record's ``module`` names it."""

NIC_ABSENT = frozenset({"set_nic_device", "_initialize_baseline"})
"""The NIC checks' functions whose records, on a node without InfiniBand, say only that there is
no NIC to watch (``gpu_ib_map is empty``, ``No network devices found for baseline ...``)."""

GPU_ABSENT = frozenset({"_check_driver_version", "__call__"})
"""NVRx 0.4's GPU check: its records, on a node without a GPU, say only that NVML is missing and
the check is therefore off (``GPU Health checks disabled``, ``Health checks are disabled``)."""

LOGGING_WARNING = "logging not initialized"
"""The start of the Wrapper's warning when the root logger has no stream handler."""
LOGGING_WARNING_MODULE = r"nvidia_resiliency_ext\.inprocess\.utils\Z"


@dataclasses.dataclass(frozen=True)
class HardwareChecks:
    """Which hardware this node has, as the health checks would look for it."""

    gpu: bool
    infiniband: bool


def node_hardware(env: Mapping[str, str] | None = None) -> HardwareChecks:
    """This node's GPUs and InfiniBand, judged as ``nvtrain.launcher.identity`` judges them: a
    GPU device file or ``NVIDIA_VISIBLE_DEVICES`` naming one; ``/sys/class/infiniband``."""
    env = os.environ if env is None else env
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "").replace("void", "").strip()
    return HardwareChecks(
        gpu=Path("/dev/nvidia0").exists() or bool(visible),
        infiniband=Path("/sys/class/infiniband").is_dir(),
    )


def held_back(record: logging.LogRecord, hardware: HardwareChecks) -> bool:
    """Whether an NVRx record only says that a check has no hardware to check on this node."""
    if record.module != HEALTH_CHECK_MODULE or record.levelno > logging.ERROR:
        return False
    if not hardware.infiniband and record.funcName in NIC_ABSENT:
        return True
    return not hardware.gpu and record.funcName in GPU_ABSENT and record.levelno == logging.WARNING


class _AbsentHardware(logging.Filter):
    """Drops the records :func:`held_back` names; on NVRx's loggers (a logger's filters stay when
    NVRx replaces its handlers)."""

    def __init__(self, hardware: HardwareChecks) -> None:
        super().__init__()
        self.hardware = hardware

    def filter(self, record: logging.LogRecord) -> bool:
        return not held_back(record, hardware=self.hardware)


class _NvrxLines(logging.Handler):
    """Writes an NVRx record of ``WARNING`` and above as ``nvrx <module>: <message>`` to
    stderr, where Python's last-resort handler would have written it bare: only when no other
    handler is on the record's way up (an application's ``logging.basicConfig()`` gets them
    instead, once)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if _other_handlers(record.name, self):
            return
        with contextlib.suppress(OSError, ValueError):  # (one write: the ranks share the stream)
            sys.stderr.write(f"nvrx {record.name.removeprefix(PREFIX)}: {record.getMessage()}\n")
            sys.stderr.flush()


def _other_handlers(name: str, mine: logging.Handler) -> bool:
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(
            handler is not mine and not isinstance(handler, logging.NullHandler)
            for handler in logger.handlers
        ):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def _add_filter(hardware: HardwareChecks) -> None:
    for name in HEALTH_CHECK_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _AbsentHardware)]:
            logger.removeFilter(old)
        logger.addFilter(_AbsentHardware(hardware))


def configure_worker(hardware: HardwareChecks | None = None) -> None:
    """In a worker, before the in-process layer's Wrapper is built: its logging warning ignored,
    its records named on stderr, the checks of absent hardware quiet. Idempotent."""
    warnings.filterwarnings(
        "ignore", message=LOGGING_WARNING, category=UserWarning, module=LOGGING_WARNING_MODULE
    )
    logger = logging.getLogger(NVRX_LOGGERS[0])
    if not any(isinstance(handler, _NvrxLines) for handler in logger.handlers):
        logger.addHandler(_NvrxLines())
    _add_filter(node_hardware() if hardware is None else hardware)


def configure_launcher(hardware: HardwareChecks | None = None) -> None:
    """In ft_launcher's process, before NVRx is imported: the checks of absent hardware quiet
    (ft_launcher formats and writes its own records). Idempotent."""
    _add_filter(node_hardware() if hardware is None else hardware)
