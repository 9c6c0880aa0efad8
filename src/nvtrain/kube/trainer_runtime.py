"""``--trainer-runtime``: a Kubeflow Trainer v2 runtime whose pods run ``nvtrain run``.

Kubeflow Trainer (``trainer.kubeflow.org/v1alpha1``) creates, for each ``TrainJob``, a JobSet
from the template of the runtime that the TrainJob names (``spec.runtimeRef``). nvtrain renders
that runtime: a ``ClusterTrainingRuntime`` (``--trainer-runtime cluster``, usable from every
namespace) or a ``TrainingRuntime`` (``--trainer-runtime namespaced``, in ``[rendezvous]
namespace``). Its one replicated Job, ``node``, holds the training pod template of ``nvtrain
manifest`` (the launcher, its policy from the ConfigMap, the checkpoint volume, the pod failure
policy and grace period), with what Trainer and the Kubeflow SDK expect of it:

- the label ``trainer.kubeflow.org/framework: torch`` on the runtime: the Kubeflow SDK
  (``TrainerClient``, ``kubeflow`` 0.5.0) lists only runtimes with that label and refuses to
  ``get_runtime`` one without it;
- the label ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` on the replicated Job,
  and the training container named ``node``: a TrainJob's ``spec.trainer`` (``image``,
  ``env``, ``resourcesPerNode``, ``numNodes``) applies to that container. Its ``command`` and
  ``args`` would replace ``nvtrain run``, so a TrainJob of this runtime leaves them out;
- ``mlPolicy.numNodes`` = ``[rendezvous] nodes``, and no framework policy (``torch``, ``mpi``):
  nvtrain is the launcher, not torchrun. The ``PET_*`` variables that the torch policy would
  inject are set in the container instead (``trainjob_env``), with the values the upstream
  ``torch-distributed`` runtime gives them, for scripts and tools that read them;
- no ``network.subdomain``: JobSet names the headless Service after the JobSet, that is after
  the TrainJob, so that two TrainJobs of one runtime do not share it. The container gets the
  TrainJob's name (``NVTRAIN_TRAINJOB``, from the JobSet's name label) and the pods find their
  peers from it (``launcher.trainjob``): pod *i* of TrainJob ``<t>`` is ``<t>-node-0-<i>``
  under the Service ``<t>``, whatever ``[job] name`` says, so any TrainJob name works (the
  SDK's 12 random characters too).

What Trainer does not take from a runtime is refused with the fix: the control pod
(``[rendezvous] store = "control"``), Volcano (Trainer makes the PodGroup itself from
``podGroupPolicy``), and the Kueue queue (a label of the TrainJob).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.kube.trainer_env import trainjob_env
from nvtrain.kubenames import REPLICATED_JOB

__all__ = [
    "ANCESTOR_LABEL",
    "API_VERSION",
    "FRAMEWORK",
    "FRAMEWORK_LABEL",
    "KINDS",
    "NODE",
    "check_runtime",
    "runtime",
]

API_VERSION = "trainer.kubeflow.org/v1alpha1"

KINDS = {"cluster": "ClusterTrainingRuntime", "namespaced": "TrainingRuntime"}
"""``--trainer-runtime SCOPE``: the kind it renders."""

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
"""The label by which Trainer finds the replicated Job of the trainer (value ``trainer``)."""

NODE = REPLICATED_JOB
"""The name Trainer gives the trainer's replicated Job and container (``constants.Node``)."""

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
"""The runtime label that the Kubeflow SDK filters on (``RUNTIME_FRAMEWORK_LABEL``)."""

FRAMEWORK = "torch"
"""Its value: the ML framework (any value but ``torchtune`` is a custom-trainer runtime to the SDK)."""


def check_runtime(
    scope: str, *, jobset: bool, control_store: bool, scheduler_name: str | None, queue: str | None
) -> None:
    """What ``--trainer-runtime SCOPE`` cannot be combined with."""
    if scope not in KINDS:
        raise UsageError(
            f"--trainer-runtime {scope!r} is not a runtime scope",
            "use --trainer-runtime cluster (ClusterTrainingRuntime) or namespaced (TrainingRuntime)",
        )
    if jobset:
        raise UsageError(
            "--trainer-runtime and --jobset are both given: Trainer makes the JobSet of each TrainJob "
            "from the runtime",
            "leave out --jobset",
        )
    if control_store:
        raise UsageError(
            '--trainer-runtime with [rendezvous] store = "control": the runtime holds the training '
            "pods only, and no pod of a TrainJob would run the store",
            'set store = "pod0" in [rendezvous] of the policy, or render the Job or the JobSet',
        )
    if scheduler_name == "volcano":
        raise UsageError(
            "--trainer-runtime with --scheduler-name volcano: Trainer makes the Volcano PodGroup "
            "itself, from the runtime's podGroupPolicy",
            "leave out --scheduler-name, and add podGroupPolicy: {volcano: {}} to the runtime",
        )
    if queue is not None:
        raise UsageError(
            f"--trainer-runtime with --queue {queue}: Kueue takes the queue from the TrainJob, "
            "not from its runtime",
            f"leave out --queue, and label each TrainJob kueue.x-k8s.io/queue-name: {queue}",
        )


def runtime(
    *,
    scope: str,
    metadata: Mapping[str, Any],
    nodes: int,
    job_spec: dict[str, Any],
    job_labels: Mapping[str, str],
    container: str,
    failure_policy: dict[str, Any],
    annotations: Mapping[str, str],
    ttl: int | None,
    nproc_per_node: int | str,
    port: int,
) -> dict[str, Any]:
    """The runtime of kind ``KINDS[scope]`` named by ``metadata`` (its namespace dropped for a
    ClusterTrainingRuntime), whose replicated Job ``node`` has the training Job's ``job_spec``
    (with the pod labels ``job_labels``): the training ``container`` renamed ``node``, here and
    in the pod failure policy, and the pods' ``subdomain`` left to JobSet. ``failure_policy`` is
    the JobSet's; ``annotations`` go on the JobSet (e.g. exclusive topology). The container
    gets ``trainjob_env`` (the TrainJob's name and the ``PET_*`` variables)."""
    spec = job_spec
    pod = spec["template"]["spec"]
    pod.pop("subdomain", None)
    for each in pod["containers"]:
        if each["name"] == container:
            each["name"] = NODE
            each["env"] = [*each.get("env", []), *trainjob_env(nodes, nproc_per_node, port)]
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        on_exit = rule.get("onExitCodes")
        if on_exit is not None and on_exit.get("containerName") == container:
            on_exit["containerName"] = NODE
    meta = dict(metadata)
    meta["labels"] = {**meta.get("labels", {}), FRAMEWORK_LABEL: FRAMEWORK}
    if scope == "cluster":
        meta.pop("namespace", None)
    template_meta: dict[str, Any] = {}
    if annotations:
        template_meta["annotations"] = dict(annotations)
    jobset_spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": failure_policy,
        "replicatedJobs": [
            {
                "name": NODE,
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {**job_labels, ANCESTOR_LABEL: "trainer"}},
                    "spec": spec,
                },
            }
        ],
    }
    if ttl is not None:
        jobset_spec["ttlSecondsAfterFinished"] = ttl
    template: dict[str, Any] = {**({"metadata": template_meta} if template_meta else {}), "spec": jobset_spec}
    return {
        "apiVersion": API_VERSION,
        "kind": KINDS[scope],
        "metadata": meta,
        "spec": {"mlPolicy": {"numNodes": nodes}, "template": template},
    }
