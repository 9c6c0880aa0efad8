"""``nvtrain.nvrx.logs``: which NVRx records are held back on which hardware, and the real NVRx
0.4.1 code paths that printed a healthy run's noise, each run in a fresh interpreter (logging
and warnings are process-wide)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from nvtrain.launcher.plan import PYNVML_WARNING
from nvtrain.nvrx.logs import HardwareChecks, held_back, node_hardware

CPU_NODE = HardwareChecks(gpu=False, infiniband=False)
GPU_NODE = HardwareChecks(gpu=True, infiniband=False)
FULL_NODE = HardwareChecks(gpu=True, infiniband=True)


def _record(module: str, func: str, level: int = logging.WARNING) -> logging.LogRecord:
    record = logging.LogRecord("nvrx", level, f"/x/{module}.py", 1, "message", None, None, func=func)
    assert record.module == module
    return record


@pytest.mark.parametrize(
    ("func", "level", "hardware", "expected"),
    [
        # NVRx 0.6+'s NIC checks without InfiniBand: "gpu_ib_map is empty", "No network devices"
        ("set_nic_device", logging.ERROR, GPU_NODE, True),
        ("_initialize_baseline", logging.WARNING, CPU_NODE, True),
        ("set_nic_device", logging.ERROR, FULL_NODE, False),
        ("_initialize_baseline", logging.WARNING, FULL_NODE, False),
        # NVRx 0.4's GPU check without a GPU: "GPU Health checks disabled", "Health checks are disabled"
        ("_check_driver_version", logging.WARNING, CPU_NODE, True),
        ("__call__", logging.WARNING, CPU_NODE, True),
        ("_check_driver_version", logging.WARNING, GPU_NODE, False),  # a GPU: NVML missing is news
        ("__call__", logging.ERROR, CPU_NODE, False),  # a failure is never held back
        ("_perform_health_check", logging.WARNING, CPU_NODE, False),
        ("set_nic_device", logging.CRITICAL, CPU_NODE, False),
    ],
)
def test_held_back_by_origin_and_hardware(
    func: str, level: int, hardware: HardwareChecks, expected: bool
) -> None:
    assert held_back(_record("health_check", func, level), hardware) is expected


def test_other_modules_are_never_held_back() -> None:
    assert not held_back(_record("launcher", "set_nic_device"), CPU_NODE)
    assert not held_back(_record("wrap", "__call__"), CPU_NODE)


def test_node_hardware_reads_nvidia_visible_devices() -> None:
    assert node_hardware({"NVIDIA_VISIBLE_DEVICES": "0,1"}).gpu is True
    # "void" (the NVIDIA container runtime's "no GPU"): the device file decides, as identity does
    assert node_hardware({"NVIDIA_VISIBLE_DEVICES": "void"}).gpu == node_hardware({}).gpu


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with the plan's ``PYTHONWARNINGS`` (torch is imported)."""
    env = {**os.environ, "PYTHONWARNINGS": PYNVML_WARNING}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


WRAPPER_LOGGING = """
    import logging, os
    os.environ["RANK"] = "1"
    {configure}
    from nvidia_resiliency_ext.inprocess import utils
    utils.Logging.initialize()  # what the Wrapper does when it starts: looks for a root handler
    logging.getLogger("nvidia_resiliency_ext.inprocess.wrap").error("rank=1 fn_ex: ValueError('x')")
    logging.getLogger("nvidia_resiliency_ext.inprocess.wrap").info("rank=1 an info line")
    print("done")
"""


def test_the_wrappers_logging_warning_and_bare_records_before() -> None:
    """Without the configuration (what a worker did before): the warning, the bare record."""
    result = _python(WRAPPER_LOGGING.format(configure=""))
    assert result.returncode == 0, result.stderr
    assert "UserWarning: logging not initialized, logs are disabled" in result.stderr
    assert "\nrank=1 fn_ex: ValueError('x')\n" in f"\n{result.stderr}"


def test_a_configured_worker_names_nvrx_records_and_has_no_logging_warning() -> None:
    configure = "from nvtrain.nvrx import logs; logs.configure_worker()"
    result = _python(WRAPPER_LOGGING.format(configure=configure))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["nvrx inprocess.wrap: rank=1 fn_ex: ValueError('x')"], result.stderr


def test_an_application_handler_gets_nvrx_records_once() -> None:
    configure = (
        "logging.basicConfig(format='APP %(name)s %(message)s'); "
        "from nvtrain.nvrx import logs; logs.configure_worker()"
    )
    result = _python(WRAPPER_LOGGING.format(configure=configure))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "APP nvidia_resiliency_ext.inprocess.wrap rank=1 fn_ex: ValueError('x')"
    ]


GPU_CHECK = """
    import logging
    logging.basicConfig(format="[%(levelname)s] %(message)s")
    from nvtrain.nvrx import logs
    logs.configure_launcher(logs.HardwareChecks(gpu={gpu}, infiniband=False))
    from nvidia_resiliency_ext.shared_utils.health_check import GPUHealthCheck
    print("healthy" if GPUHealthCheck()() else "unhealthy")  # ft_launcher 0.4's check before each rendezvous
"""


@pytest.mark.skipif(node_hardware().gpu, reason="this machine has a GPU: NVML may be there")
def test_the_launchers_gpu_check_is_quiet_only_on_a_node_without_gpu() -> None:
    quiet = _python(GPU_CHECK.format(gpu=False))
    assert (quiet.returncode, quiet.stdout.strip()) == (0, "healthy"), quiet.stderr
    assert "Health checks" not in quiet.stderr, quiet.stderr
    # Where the node has a GPU, NVML's absence is news: the same lines come through.
    loud = _python(GPU_CHECK.format(gpu=True))
    assert "[WARNING] GPU Health checks disabled" in loud.stderr, loud.stderr
    assert "[WARNING] Health checks are disabled; skipping synchronous check." in loud.stderr
