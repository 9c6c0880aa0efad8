"""The JobSet (``--jobset``) and the Kubeflow Trainer v2 runtime (``--trainer-runtime``) around the
training Job's spec of ``objects``, and the names JobSet gives (and its webhook accepts).

JobSet names its pods ``<jobset>-<replicated job>-<job index>-<pod index>`` and nvtrain dials
``<[job] name>-0``, so ``[job] name`` must be ``<jobset>-<replicated job>-0``; with
``[rendezvous] store = "control"`` the control Job is a second replicated Job, ``control``.
"""

from __future__ import annotations

from typing import Any

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kube import podextras, trainer_runtime
from nvtrain.kube.objects import (
    CONTAINER,
    JOBSET_UID_LABEL,
    control_job_spec,
    finish_workload,
    has_control_job,
    job_spec,
    object_labels,
    object_meta,
)
from nvtrain.kube.options import ManifestOptions
from nvtrain.kubenames import CONTROL_SUFFIX, DNS_1035_LABEL, DNS_LABEL

__all__ = [
    "JOBSET_POD_SUFFIX",
    "jobset",
    "jobset_failure_policy",
    "jobset_names",
    "jobset_webhook_problems",
    "runtime",
]


def jobset_names(policy: Policy) -> tuple[str, str]:
    """(JobSet name, replicated job name) whose pods are named ``<job name>-<index>``.

    JobSet names pods ``<jobset>-<replicated job>-<job index>-<pod index>`` and nvtrain dials
    ``<[job] name>-0``, so the job name must be ``<jobset>-<replicated job>-0``."""
    name = policy.job.name
    jobset_name, _, replicated = name.removesuffix("-0").rpartition("-")
    label = DNS_LABEL  # no length limit here: jobset_webhook_problems counts the lengths
    if not name.endswith("-0") or not label.fullmatch(jobset_name) or not label.fullmatch(replicated):
        raise UsageError(
            f'--jobset needs [job] name of the form "<jobset>-<replicated job>-0", not "{name}": '
            "JobSet names its pods <jobset>-<replicated job>-<job index>-<pod index>, and pod 0 "
            "must be <name>-0",
            f'set name = "{name}-workers-0" (a JobSet "{name}" with replicated job "workers"), '
            "or render the plain Job",
        )
    for problem in jobset_webhook_problems(jobset_name, policy.service, name, policy.rendezvous.nodes):
        raise UsageError(
            f"--jobset: {problem}",
            "start [job] name (the JobSet's name) and [rendezvous] service with a letter, and "
            "keep them short enough, or render the plain Job",
        )
    return jobset_name, replicated


JOBSET_POD_SUFFIX = 6
"""``-abcde``: the random suffix of a pod's name that the JobSet webhook counts in (it refuses a
JobSet whose longest pod name with it is not a DNS-1035 label of at most 63 characters)."""


def jobset_webhook_problems(jobset_name: str, subdomain: str, job_name: str, pods: int) -> list[str]:
    """What the JobSet validating webhook refuses in a JobSet named ``jobset_name`` whose
    training replicated Job (one replica) is ``job_name`` (``<jobset>-<replicated job>-0``) with
    ``pods`` pods and whose ``network.subdomain`` is ``subdomain``: the Service and Job names it
    makes must be DNS-1035 labels (a letter first, at most 63 characters), and so must the
    longest pod name with its random suffix. Empty when it accepts them."""
    problems = []
    if not DNS_1035_LABEL.fullmatch(jobset_name):
        problems.append(
            f'the JobSet name "{jobset_name}" does not start with a letter: the JobSet webhook '
            "refuses Job names that are not DNS-1035 labels"
        )
    if not DNS_1035_LABEL.fullmatch(subdomain) or len(subdomain) > 63:
        problems.append(
            f'network.subdomain "{subdomain}" ([rendezvous] service) is not a DNS-1035 label (a '
            "letter first, at most 63 characters): the JobSet webhook refuses it, since it names a Service"
        )
    longest = f"{job_name}-{max(pods - 1, 0)}"
    if len(longest) + JOBSET_POD_SUFFIX > 63:
        problems.append(
            f"the last pod's name {longest} with the {JOBSET_POD_SUFFIX}-character random suffix "
            f"is {len(longest) + JOBSET_POD_SUFFIX} characters, more than the 63 that the JobSet "
            "webhook allows"
        )
    return problems


def _control_replicated_job(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The control Job as a replicated Job ``control`` of the JobSet, so that the JobSet (and
    Kueue, which admits a JobSet as one workload) holds every pod of the job. ``NonIndexed``:
    the Job controller names an Indexed Job's pods itself, and the control pod keeps the hostname
    ``<job>-control`` (JobSet sets only the subdomain, the one of its headless Service, which
    selects every pod of the JobSet)."""
    jobset_name, replicated = jobset_names(policy)
    name = f"{jobset_name}-{CONTROL_SUFFIX}-0"  # JobSet names it <jobset>-<replicated job>-<index>
    if replicated == CONTROL_SUFFIX or len(name) > 63:
        raise UsageError(
            f'--jobset with [rendezvous] store = "control" adds the replicated job "{CONTROL_SUFFIX}" '
            f'(Job {name}), which clashes with the training pods\' replicated job "{replicated}" or '
            "is longer than 63 characters",
            f"name the training pods' replicated job otherwise, e.g. [job] name = "
            f'"{jobset_name}-workers-0", or shorten the JobSet name',
        )
    return {
        "name": CONTROL_SUFFIX,
        "replicas": 1,
        "template": {
            "metadata": {"labels": object_labels(policy, options, component="control")},
            "spec": {"completionMode": "NonIndexed", **control_job_spec(policy, policy_text, options)},
        },
    }


def jobset(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """A JobSet with one replicated Job (one replica), and with ``[rendezvous] store =
    "control"`` a second one, ``control``; JobSet creates the headless Service named
    ``network.subdomain`` itself. Exit codes 2 and 4 fail the JobSet too."""
    jobset_name, replicated = jobset_names(policy)
    replicated_jobs: list[dict[str, Any]] = [
        {
            "name": replicated,
            "replicas": 1,
            "template": {
                "metadata": {"labels": object_labels(policy, options)},
                "spec": job_spec(policy, policy_text, options, uid_label=JOBSET_UID_LABEL),
            },
        }
    ]
    if has_control_job(policy):
        replicated_jobs.append(_control_replicated_job(policy, policy_text, options))
    metadata = object_meta(jobset_name, policy, options)
    if options.exclusive_topology is not None:
        metadata["annotations"] = {podextras.EXCLUSIVE_TOPOLOGY: options.exclusive_topology}
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "network": {
                "enableDNSHostnames": True,
                "subdomain": policy.service,
                "publishNotReadyAddresses": True,
            },
            "failurePolicy": jobset_failure_policy(),
            "replicatedJobs": replicated_jobs,
        },
    }
    return finish_workload(obj, options)


def jobset_failure_policy() -> dict[str, Any]:
    """No restart of the whole JobSet, and a Job failed by its pod failure policy (exit 2 or 4)
    fails the JobSet."""
    return {
        "maxRestarts": 0,
        "rules": [
            {
                "name": "nvtrainNeverRetry",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }


def runtime(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The Kubeflow Trainer v2 runtime (``--trainer-runtime``) around the training Job's spec:
    see ``nvtrain.kube.trainer_runtime``."""
    assert options.trainer_runtime is not None
    exclusive = options.exclusive_topology
    return trainer_runtime.runtime(
        scope=options.trainer_runtime,
        metadata=object_meta(policy.job.name, policy, options),
        nodes=policy.rendezvous.nodes,
        job_spec=job_spec(policy, policy_text, options, uid_label=JOBSET_UID_LABEL),
        job_labels=object_labels(policy, options),
        container=CONTAINER,
        failure_policy=jobset_failure_policy(),
        annotations={podextras.EXCLUSIVE_TOPOLOGY: exclusive} if exclusive is not None else {},
        ttl=options.ttl,
        nproc_per_node=policy.job.nproc_per_node,
        port=policy.rendezvous.port,
    )
