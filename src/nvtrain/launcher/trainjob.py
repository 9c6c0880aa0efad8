"""The peers of a pod of a Kubeflow Trainer TrainJob (``nvtrain manifest --trainer-runtime``),
found from the TrainJob's name rather than from ``[job] name``.

Trainer makes one JobSet per TrainJob, named after it; the runtime's replicated Job is ``node``
(``kube.trainer_runtime``), and JobSet names its one Job ``<t>-node-0`` and the headless Service
``<t>``. So pod *i* of TrainJob ``<t>`` has the hostname ``<t>-node-0-<i>`` and the DNS name
``<t>-node-0-<i>.<t>.<namespace>.svc.<cluster domain>``. The runtime gives the container the
TrainJob's name as ``NVTRAIN_TRAINJOB`` (from the pod's label ``jobset.sigs.k8s.io/jobset-name``),
and with it pod 0 is ``<t>-node-0-0`` under the same domain, whatever the TrainJob is called:
``llm-train-exp1``, or ``x3f9a0c1b2d4e`` as the Kubeflow SDK names it.

Worked example, TrainJob ``x3f9a0c1b2d4e`` in namespace ``team-a`` of the policy ``[job] name =
"llm-train"``: pod 2 (hostname ``x3f9a0c1b2d4e-node-0-2``, ``JOB_COMPLETION_INDEX=2``) dials
``x3f9a0c1b2d4e-node-0-0.x3f9a0c1b2d4e.team-a.svc.cluster.local``; the domain comes from the pod's
own line in ``/etc/hosts`` when the kubelet wrote one, else from the TrainJob's name and the
policy's ``[rendezvous] namespace`` and ``cluster_domain``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kubenames import (
    REPLICATED_JOB,
    TRAINJOB_ENV,
    PodNames,
    control_hostname,
    pod_hostname,
    service_domain,
)

__all__ = ["REPLICATED_JOB", "TRAINJOB_ENV", "pod0_address", "trainjob_name", "trainjob_names"]


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def trainjob_name(env: Mapping[str, str]) -> str | None:
    """The TrainJob's name from ``NVTRAIN_TRAINJOB``; None when unset or empty. Raises when it
    is not a DNS label (a TrainJob's name is one: Trainer's webhook refuses any other)."""
    name = env.get(TRAINJOB_ENV, "").strip()
    if not name:
        return None
    if len(name) > 63 or not _LABEL.fullmatch(name):
        raise UsageError(
            f"{TRAINJOB_ENV}={name!r} is not a TrainJob name (a DNS label: lowercase letters, "
            "digits and '-', at most 63)",
            f"set {TRAINJOB_ENV} from the pod label jobset.sigs.k8s.io/jobset-name, as "
            "nvtrain manifest --trainer-runtime renders it, or leave it unset",
        )
    return name


def _job_base(trainjob: str) -> str:
    """``<t>-node-0``: the name of the JobSet's one Job of the replicated Job ``node``."""
    return f"{trainjob}-{REPLICATED_JOB}-0"


def trainjob_names(policy: Policy, trainjob: str) -> PodNames:
    """The DNS names of TrainJob ``trainjob``'s pods, in the policy's namespace and cluster
    domain (``launcher.identity`` replaces the domain with the pod's own when it has one)."""
    r = policy.rendezvous
    return PodNames(
        base=_job_base(trainjob),
        domain=service_domain(trainjob, r.namespace, r.cluster_domain),
        control_host=control_hostname(policy.job.name),
    )


def pod0_address(trainjob: str) -> str:
    """``<t>-node-0-0.<t>``: pod 0's name relative to the namespace, as the upstream torch
    runtime gives it in ``PET_MASTER_ADDR``."""
    return f"{pod_hostname(_job_base(trainjob), 0)}.{trainjob}"
