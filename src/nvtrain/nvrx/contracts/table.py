"""The contract of each supported NVRx release: what nvtrain relies on, recorded as facts.

Gathered from the places nvtrain touches NVRx: ``nvrx/ftmain.py`` (its speed-ups and the
parser it wraps), ``nvrx/storeguard.py`` (the rendezvous store's guards), ``nvrx/inprocess.py``
and ``nvrx/rank_monitor.py`` (the worker library), ``nvrx/messages.py`` (the in-process layer's
messages), ``launcher/logwatch.py`` (ft_launcher's log lines) and ``launcher/plan.py`` (the
option spellings). CI checks each contract against that release's wheel
(``tests/nvrx/test_contracts.py``); ftmain checks the speed-ups' facts on the live modules
before it patches (``contracts.live``).
"""

from __future__ import annotations

import dataclasses

from nvtrain.nvrx.contracts.facts import (
    ARGS,
    CLEANUP,
    GRACE,
    GUARD_BIND,
    GUARD_STATE,
    LOGS,
    MONITOR,
    PARSERS,
    ROUND,
    WORKER,
    Calls,
    Fact,
    Name,
    Signature,
    Text,
)
from nvtrain.nvrx.messages import PACKAGE

__all__ = ["CONTRACTS", "OPTIONS", "Contract"]

OPTIONS = "launcher.plan's options"

_FT = f"{PACKAGE}.fault_tolerance"
LAUNCHER = f"{_FT}.launcher"
UTILS = f"{_FT}.utils"
BARRIER = f"{_FT}.ft_rendezvous_barrier"
_CLIENT = f"{_FT}.rank_monitor_client"
_SERVER = f"{_FT}.rank_monitor_server"
_RDZV = f"{_FT}._ft_rendezvous"
_COMPAT = f"{_FT}._torch_elastic_compat"
_IP = f"{PACKAGE}.inprocess"
_WRAP = f"{_IP}.wrap"
_INIT = f"{_IP}.initialize"
_ATTR = f"{_IP}.attribution"
_AGENT = "LocalElasticAgent"


@dataclasses.dataclass(frozen=True)
class Contract:
    """What nvtrain relies on in one NVRx release."""

    version: str
    facts: tuple[Fact, ...]


WRAPPER_KEYWORDS = (
    "last_call_wait",
    "store_kwargs",
    "initialize",
    "abort",
    "finalize",
    "health_check",
    "soft_timeout",
    "hard_timeout",
    "heartbeat_timeout",
    "barrier_timeout",
    "completion_timeout",
    "monitor_thread_interval",
    "monitor_process_interval",
    "heartbeat_interval",
    "progress_watchdog_interval",
)
"""The keyword arguments ``nvrx.inprocess.build_wrapper`` passes to ``Wrapper``."""


def _options(*flags: str) -> list[Fact]:
    return [Text(LAUNCHER, f'"{flag}"', OPTIONS) for flag in flags]


_COMMON: list[Fact] = [
    # ftmain: the program it runs, the parser it wraps, the monitor loop's sleep.
    Name(LAUNCHER, "main", ARGS),
    Signature(LAUNCHER, "parse_args", ("args",), ARGS),
    Text(LAUNCHER, "training_script_args", ARGS),
    Name(LAUNCHER, "time", MONITOR),
    Calls(
        LAUNCHER, f"{_AGENT}._invoke_run_with_any_failed_policy", "time.sleep", MONITOR, "monitor_interval"
    ),
    # The worker library: the rank-monitor client (nvrx.rank_monitor).
    Name(_FT, "RankMonitorClient", WORKER),
    Name(_CLIENT, "RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY", WORKER),
    Signature(_CLIENT, "RankMonitorClient.init_workload_monitoring", ("self",), WORKER, exact=False),
    Signature(_CLIENT, "RankMonitorClient.send_heartbeat", ("self",), WORKER),
    Signature(_CLIENT, "RankMonitorClient.shutdown_workload_monitoring", ("self",), WORKER),
    Signature(
        _CLIENT,
        "RankMonitorClient.calculate_and_set_hb_timeouts",
        ("self", "skip_if_not_ready"),
        WORKER,
        exact=False,
    ),
    Signature(_CLIENT, "RankMonitorClient.load_state_dict", ("self", "state"), WORKER),
    Text(_CLIENT, "self.hb_timeouts", WORKER),
    # The worker library: in-process restart (nvrx.inprocess).
    Name(_IP, "Wrapper", WORKER),
    Name(_IP, "CallWrapper", WORKER),
    Signature(_WRAP, "Wrapper.__init__", ("self", *WRAPPER_KEYWORDS), WORKER, exact=False),
    Signature(
        _INIT, "RetryController.__init__", ("self", "max_iterations", "min_world_size"), WORKER, exact=False
    ),
    Name(f"{_IP}.monitor_thread", "RankShouldRestart", WORKER),
    Name(f"{_IP}.exception", "RestartAbort", WORKER),
    Name(f"{_IP}.abort", "Abort", WORKER),
    Name(f"{_IP}.abort", "AbortTorchDistributed", WORKER),
    Name(f"{_IP}.finalize", "Finalize", WORKER),
    Name(f"{_IP}.health_check", "CudaHealthCheck", WORKER),
    # The in-process layer's messages (nvrx.messages).
    Text(_INIT, "{state.iteration=} {self.max_iterations=}", PARSERS),
    Text(_INIT, "{state.world_size=} {self.min_world_size=}", PARSERS),
    Name(_ATTR, "Interruption", PARSERS),
    # ft_launcher's log lines (launcher.logwatch), every version.
    Text(_SERVER, 'name="RankMonServer"', LOGS),
    Text(_SERVER, "Did not get initial heartbeat", LOGS),
    Text(_SERVER, "Did not get subsequent heartbeat", LOGS),
    Text(_SERVER, "Section '{section}' has been open for", LOGS),
    Text(_SERVER, "Was out of section for", LOGS),
    Text(LAUNCHER, "Agent run ended with exception, {e=}. Agent's exit code", LOGS),
    # launcher.plan's options, every version.
    *_options(
        "--ft-cfg-path",
        "--ft-workload-check-interval",
        "--ft-initial-rank-heartbeat-timeout",
        "--ft-rank-heartbeat-timeout",
        "--ft-rank-out-of-section-timeout",
        "--ft-rank-section-timeouts",
        "--monitor-interval",
        "--term-timeout",
        "--workers-stop-timeout",
        "--max-restarts",
    ),
]

_STATE_GUARD = [Name(_RDZV, name, GUARD_STATE) for name in ("pickle", "_RendezvousState", "_NodeDesc")]

_V04: list[Fact] = [
    Calls(
        LAUNCHER, f"{_AGENT}._invoke_run_with_min_healthy_policy", "time.sleep", MONITOR, "monitor_interval"
    ),
    Signature(f"{_COMPAT}.rendezvous.c10d_rendezvous_backend", "_create_tcp_store", ("params",), GUARD_BIND),
    Name(f"{_COMPAT}.rendezvous.c10d_rendezvous_backend", "TCPStore", GUARD_BIND),
    *_STATE_GUARD,
    *[
        Name(f"{_COMPAT}.rendezvous.dynamic_rendezvous", n, GUARD_STATE)
        for n in ("pickle", "_RendezvousState", "_NodeDesc")
    ],
    Text(_ATTR, "{interruption} on {ranks=}", PARSERS),
    Text(LAUNCHER, "[ft_launcher{os.getpid()}@{socket.gethostname()}]", LOGS),
    Text(LAUNCHER, '"[%s] Worker group %s. "', LOGS),
    Text(LAUNCHER, '"%s/%s attempts left;"', LOGS),
    Text(LAUNCHER, "restart attempts left; restarting", LOGS),
    Text(_RDZV, "has joined round {self._state_holder.state.round} of", LOGS),
    Text(_RDZV, "as rank {rank} in a world of size", LOGS),
    Text(f"{_COMPAT}.multiprocessing.api", '"failed (exitcode: %s)"', LOGS),
    *_options("--ft-restart-policy", "--ft-enable-nic-monitor", "--local-addr", "--rdzv-id"),
]

_V06_ON: list[Fact] = [
    Name(LAUNCHER, "terminate_mp_processes", CLEANUP),
    Signature(UTILS, "terminate_mp_processes", ("allowed_pgids",), CLEANUP),
    Name(BARRIER, "_RendezvousBarrierState._wait_for_rendezvous_open", ROUND),
    Signature(BARRIER, "_RendezvousBarrierState._sync_from_per_round_state", ("self",), ROUND),
    Calls(LAUNCHER, "launch_agent._wait_grace", "time.sleep", GRACE),
    Name(_WRAP, "CallWrapper._disable_hang_protection", WORKER),
    Name(_WRAP, "CallWrapper._enable_hang_protection", WORKER),
    Text(_WRAP, "self.restart_health_check", WORKER),
    # 0.6+: "Interruption.X affecting ranks {0-2, 5}" (ranges: nvrx.messages must read them).
    Text(_ATTR, "{interruption} affecting ranks {ranks_str}", PARSERS),
    Text(f"{_IP}.utils", '"{start}-{end}"', PARSERS),
    Text(LAUNCHER, '"[%s] Worker group {state.name}. "', LOGS),
    Text(LAUNCHER, "attempts left; ", LOGS),
    Text(BARRIER, "as rank {rank} in a world of size", LOGS),
    Text(
        f"{PACKAGE}.shared_utils.log_manager", "[workload:%(workload_rank)s(%(workload_local_rank)s) ", LOGS
    ),
    Text(f"{PACKAGE}.shared_utils.log_manager", "infra:%(infra_rank)s(%(infra_local_rank)s)] ", LOGS),
    *_options(
        "--ft-enable-nic-healthcheck", "--ft-gpu-memory-reclaim-timeout", "--ft-gpu-memory-poll-interval"
    ),
]

CONTRACTS = {
    "0.4": Contract("0.4.1", (*_COMMON, *_V04)),
    "0.6": Contract("0.6.0", (*_COMMON, *_V06_ON, *_STATE_GUARD)),
    "0.7": Contract("0.7.0", (*_COMMON, *_V06_ON)),
}
"""The contract of each tested release line (``versions.TESTED``), by line."""
