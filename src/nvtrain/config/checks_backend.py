"""The rule for ``backend = "auto"``, which only the workers' machine resolves.

``nvtrain validate`` runs before the job has a machine, so it checks ``"auto"`` as NCCL (as
gloo with ``nproc_per_node = "cpu"``: ``checks_timeouts.validated_backend``). On a machine without a GPU the
workers pick gloo: a collective timeout the policy sets then meets the gloo rule it was never
checked against, while one it leaves unset follows the backend the workers pick (``derive.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from nvtrain.config.derive import gloo_collective_timeout
from nvtrain.config.duration import format_duration
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, toml_value

__all__ = ["auto_backend"]


def auto_backend(p: Policy) -> Iterator[Finding]:
    """Warn when ``backend = "auto"`` (written or by default) comes with a collective timeout
    the policy sets that breaks the gloo rule: not shorter than the in-process soft timeout.

    Silent when the checks see gloo already (``nproc_per_node = "cpu"``, or ``"gloo"`` written:
    their error applies), when the NCCL rule reports the key already (not above
    ``hard_timeout``), with one rank (no peer to wait for), and with in-process restart off."""
    job, ip = p.job, p.restart.in_process
    collective = job.collective_timeout
    if (
        job.backend != "auto"
        or job.nproc_per_node == "cpu"
        or not ip.enabled
        or "collective_timeout" not in job.model_fields_set
        or "job.collective_timeout" in p.derived
        or collective < ip.soft_timeout
        or collective <= ip.hard_timeout
        or p.world_size() == 1
    ):
        return
    soft = format_duration(ip.soft_timeout)
    yield Finding(
        "warning",
        "auto-backend",
        "job",
        "collective_timeout",
        'with backend = "auto", which becomes gloo on machines without a GPU, it must be shorter '
        f"than [restart.in_process] soft_timeout ({soft}): a gloo collective cannot be aborted, "
        "so on a fault the in-process layer cannot cut short (a hang in C code, for one) a "
        "surviving rank blocked in a collective with the failed rank is freed only by this timeout",
        'set backend explicitly ("gloo" for CPU workers, "nccl" for GPUs), or remove '
        "collective_timeout so that its derived default applies: it follows the backend the "
        f'workers pick ("{format_duration(gloo_collective_timeout(ip.soft_timeout))}" with gloo)',
        toml_value(format_duration(collective)),
    )
