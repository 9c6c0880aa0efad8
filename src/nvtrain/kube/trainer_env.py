"""The variables that nvtrain's Trainer runtime (``kube.trainer_runtime``) gives its training
container: the TrainJob's name, from which ``nvtrain run`` finds its peers
(``launcher.trainjob``), and the ``PET_*`` variables of torchrun, as the upstream
``torch-distributed`` runtime (its ``torch`` policy) sets them, for scripts and tools that read
them.

The TrainJob's name is not known when the runtime is rendered: it is read from the pod's label
``jobset.sigs.k8s.io/jobset-name`` (Trainer names the JobSet after the TrainJob), and
``PET_MASTER_ADDR`` is made from it by the kubelet's ``$(VAR)`` expansion of an earlier
variable. ``ft_launcher`` reads ``PET_*`` as the defaults of flags that nvtrain always passes
(or that its c10d rendezvous ignores), so they change nothing in the launch.
"""

from __future__ import annotations

from typing import Any

from nvtrain.kubenames import REPLICATED_JOB, TRAINJOB_ENV

__all__ = ["JOBSET_NAME_LABEL", "PET_VARIABLES", "trainjob_env"]

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""The pod label JobSet sets to the JobSet's name: the TrainJob's."""

_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

PET_VARIABLES = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
"""The torchrun variables the upstream torch policy injects (Trainer v2.3.0 ``plugins/torch``)."""


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def trainjob_env(nodes: int, nproc_per_node: int | str, port: int) -> list[dict[str, Any]]:
    """``NVTRAIN_TRAINJOB`` and the ``PET_*`` variables, in that order (``PET_MASTER_ADDR``
    expands the first). ``PET_MASTER_PORT`` is ``[rendezvous] port``, where pod 0 serves the
    rendezvous store (the upstream runtime's 29500 by default)."""
    job = f"$({TRAINJOB_ENV})"
    return [
        _field(TRAINJOB_ENV, f"metadata.labels['{JOBSET_NAME_LABEL}']"),
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(nproc_per_node)},
        _field("PET_NODE_RANK", _INDEX),
        {"name": "PET_MASTER_ADDR", "value": f"{job}-{REPLICATED_JOB}-0-0.{job}"},
        {"name": "PET_MASTER_PORT", "value": str(port)},
    ]
