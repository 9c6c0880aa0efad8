"""The worker's NVRx ``Wrapper`` arguments as a plan worked out from the policy alone
(``config/wrapper_plan.py``): the values ``worker/restart.py`` passes, pinned here."""

from __future__ import annotations

import datetime
import sys

import pytest

from nvtrain.config import Policy
from nvtrain.config.wrapper_plan import WrapperFeatures, plan_wrapper
from nvtrain.nvrx import NvrxVersion

S = datetime.timedelta
ALL = WrapperFeatures(last_call_wait=True, restart_health_check=True)


def _policy(**in_process: object) -> Policy:
    return Policy.model_validate(
        {
            "job": {"name": "x", "script": "t.py"},
            "restart": {"in_process": in_process},
            "heartbeat": {"timeout": "1h"},
            "checkpoint": {"dir": "/c"},
        }
    )


def test_the_defaults() -> None:
    plan = plan_wrapper(_policy(), world=16, has_gpu=True, features=ALL)
    assert plan.soft_timeout == S(seconds=60) and plan.hard_timeout == S(seconds=90)
    assert plan.barrier_timeout == S(seconds=150)  # hard + max(30 s, soft)
    assert plan.heartbeat_timeout == S(seconds=60)  # soft, at most half the barrier
    assert plan.heartbeat_interval == S(seconds=1)  # soft / 10, at most 1 s
    assert plan.monitor_process_interval == S(milliseconds=250)  # a quarter of the tick
    assert plan.monitor_thread_interval == S(milliseconds=100)  # 0.1 s up to 100 ranks
    assert plan.last_call_wait == S(milliseconds=10) and plan.last_call_wait_passed
    assert (plan.max_iterations, plan.min_world_size) == (10, 16)
    assert plan.cuda_health_check is True and plan.cpu_restart_health_check is False
    assert not plan.replaces_restart_health_check(True)


def test_short_timeouts_shorten_the_ticks_and_the_heartbeat_wait() -> None:
    plan = plan_wrapper(
        _policy(
            soft_timeout="2s", hard_timeout="3s", failure_window="100ms", max_attempts=3, min_world_size=2
        ),
        world=4,
        has_gpu=False,
        features=ALL,
    )
    assert plan.barrier_timeout == S(seconds=33)  # 3 + 30
    assert plan.heartbeat_timeout == S(seconds=2)
    assert plan.heartbeat_interval == S(milliseconds=200)
    assert plan.monitor_process_interval == S(milliseconds=50)
    assert plan.monitor_thread_interval == S(milliseconds=100)
    assert plan.last_call_wait == S(milliseconds=100)
    assert (plan.max_iterations, plan.min_world_size) == (3, 2)
    assert plan.cuda_health_check is False and plan.cpu_restart_health_check is True
    assert plan.replaces_restart_health_check(True) and not plan.replaces_restart_health_check(False)


@pytest.mark.parametrize(("world", "wait"), [(1, 0.1), (100, 0.1), (400, 0.4), (1000, 1.0), (5000, 1.0)])
def test_the_monitor_thread_wait_grows_with_the_world_up_to_the_tick(world: int, wait: float) -> None:
    plan = plan_wrapper(_policy(), world=world, has_gpu=True, features=ALL)
    assert plan.monitor_thread_interval == S(seconds=wait)


def test_a_tick_below_the_thread_wait_bounds_it() -> None:
    plan = plan_wrapper(
        _policy(soft_timeout="500ms", hard_timeout="1s"), world=2000, has_gpu=True, features=ALL
    )
    assert plan.heartbeat_interval == plan.monitor_thread_interval == S(milliseconds=50)


def test_a_nvrx_without_last_call_wait_does_not_get_it() -> None:
    plan = plan_wrapper(_policy(), world=2, has_gpu=True, features=WrapperFeatures(False, False))
    assert plan.last_call_wait_passed is False
    assert dict(plan.rows())["last_call_wait"] == "10ms (not passed: this NVRx has no last_call_wait)"


def test_what_a_dry_run_does_not_know_is_marked() -> None:
    plan = plan_wrapper(_policy(), world=None, has_gpu=None, features=WrapperFeatures.of_version(None))
    assert plan.min_world_size is None and plan.monitor_thread_interval is None
    assert plan.cuda_health_check is None and plan.cpu_restart_health_check is None
    rows = dict(plan.rows())
    assert rows["RetryController min_world_size"] == "every rank (set on the node)"
    assert rows["monitor_thread_interval"] == "set on the node (world size)"
    assert rows["last_call_wait"] == "10ms (passed where NVRx takes it: 0.4 to 0.7)"
    # a min_world_size the policy sets needs no world size
    assert plan_wrapper(_policy(min_world_size=3), world=None, has_gpu=None, features=ALL).min_world_size == 3


@pytest.mark.parametrize(
    ("version", "features"),
    [
        ("0.4.1", WrapperFeatures(True, False)),
        ("0.6.0", WrapperFeatures(True, True)),
        ("0.7.2", WrapperFeatures(True, True)),
        ("0.9.0", WrapperFeatures(None, None)),
    ],
)
def test_features_known_of_a_version(version: str, features: WrapperFeatures) -> None:
    assert WrapperFeatures.of_version(NvrxVersion.parse(version)) == features


def test_features_the_workers_see() -> None:
    assert WrapperFeatures.of(["soft_timeout", "last_call_wait"], None) == WrapperFeatures(True, None)
    assert WrapperFeatures.of(["soft_timeout"], True) == WrapperFeatures(False, True)


def test_the_plan_module_imports_neither_torch_nor_nvrx() -> None:
    import subprocess

    code = (
        "import sys, nvtrain.config.wrapper_plan, nvtrain.config.timeouts;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'nvidia_resiliency_ext')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
