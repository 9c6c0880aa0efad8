"""Kubernetes manifests for a policy: ``render`` puts the objects together, ``manifest_from_file``
reads and validates the policy first (what ``nvtrain manifest`` calls).

``nvtrain manifest`` renders, from one validated policy and a few ``ManifestOptions`` that the
policy does not hold (image, resources, storage), these objects in one multi-document YAML:

- a ConfigMap with the policy file, mounted at ``/etc/nvtrain`` (immutable; its name carries a
  hash of the text, so a changed policy never reaches the pods of a Job already running);
- the headless Service that gives pod *i* its DNS name ``<job>-<i>.<service>.<namespace>...``;
- a NetworkPolicy: the job's pods accept traffic only from pods of the same job;
- on request, a Prometheus Operator PodMonitor (``monitoring``), the job's alerts and dashboard
  (``alerts``) and a Volcano PodGroup (``scheduling``);
- with ``[rendezvous] store = "control"`` (and 2 or more nodes), a Job ``<job>-control`` whose
  one small CPU pod runs ``nvtrain control /etc/nvtrain/policy.toml``: the rendezvous store;
- an Indexed ``batch/v1`` Job whose pods run ``nvtrain run /etc/nvtrain/policy.toml``, or, with
  ``jobset=True``, a ``jobset.x-k8s.io/v1alpha2`` JobSet around the same Job template (and the
  control Job's, as a second replicated Job), or a Kubeflow Trainer v2 runtime.

Where each part lives: the options in ``options`` (declared once, with their command-line
flags), what they may be in ``option_checks``, the pods' sizes in ``sizing``, the objects in
``objects`` and ``jobset``, the YAML text in ``yaml_io``; the pods' CPU and memory and their QoS
class come from ``qos``, their security contexts from ``podsecurity``, and tolerations,
priority, scheduler, queue and pull policy from ``scheduling``.

Every value that the policy holds (names, namespace, nodes, port, stop timeout, checkpoint
directory) is taken from it, so the manifest and the policy cannot disagree. Strings reach the
YAML only as values that PyYAML quotes; nothing is pasted into YAML text. See
``docs/kubernetes.md`` for what each object does and why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from nvtrain.config.schema import Policy
from nvtrain.errors import ConfigError
from nvtrain.kube import alerts, monitoring, scheduling
from nvtrain.kube.jobset import jobset, runtime
from nvtrain.kube.nvrx_pin import parse_nvrx_option
from nvtrain.kube.objects import (
    configmap,
    control_job,
    has_control_job,
    job,
    network_policy,
    object_meta,
    selector,
    service,
)
from nvtrain.kube.option_checks import check_options, check_policy_size
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.sizing import notes
from nvtrain.kube.yaml_io import dump

__all__ = ["Rendered", "manifest_from_file", "render"]


def render(policy: Policy, policy_text: str, options: ManifestOptions | None = None) -> list[dict[str, Any]]:
    """Every object for ``policy`` (whose file text is ``policy_text``), in apply order."""
    options = options or ManifestOptions()
    check_policy_size(policy_text, "the policy file")
    check_options(policy, options)
    control = has_control_job(policy)
    objects = [configmap(policy, policy_text, options)]
    # JobSet makes the headless Service (for the Trainer runtime, one per TrainJob).
    objects += [] if options.jobset or options.trainer_runtime else [service(policy, options)]
    objects.append(network_policy(policy, options))
    if options.pod_monitor:
        metadata = object_meta(policy.job.name, policy, options)
        objects.append(monitoring.pod_monitor(metadata=metadata, selector=selector(policy)))
    if options.monitoring_rules:
        every = options.trainer_runtime is not None  # the rules of every TrainJob of the runtime
        meta = object_meta(f"{policy.job.name}-alerts", policy, options)
        objects.append(alerts.prometheus_rule(policy, meta, runtime=every))
        meta = object_meta(f"{policy.job.name}-dashboard", policy, options)
        objects.append(alerts.dashboard_configmap(policy, meta, runtime=every))
    workloads: list[dict[str, Any]] = []
    if options.trainer_runtime is not None:
        workloads.append(runtime(policy, policy_text, options))
    elif options.jobset:
        workloads.append(jobset(policy, policy_text, options))
    else:
        if control:
            # Before the workers: their launchers wait for the control pod's name to resolve.
            workloads.append(control_job(policy, policy_text, options))
        workloads.append(job(policy, policy_text, options))
    if options.scheduler_name == scheduling.VOLCANO:
        # Before the pods that name it; every pod of the job, the control pod too, and what
        # they request together.
        members = [pods for w in workloads for pods in scheduling.pod_templates(w)]
        objects.append(
            scheduling.pod_group(
                metadata=object_meta(policy.job.name, policy, options),
                min_member=policy.rendezvous.nodes + (1 if control else 0),
                queue=options.queue,
                priority_class=options.priority_class,
                min_resources=scheduling.min_resources(members),
            )
        )
    return objects + workloads


@dataclasses.dataclass(frozen=True)
class Rendered:
    """The objects of one policy, their YAML text, and ``notes`` for the user."""

    objects: list[dict[str, Any]]
    text: str
    notes: tuple[str, ...] = ()

    def summary(self) -> list[tuple[str, str]]:
        """(kind, name) of every object, in apply order."""
        return [(str(o["kind"]), str(o["metadata"]["name"])) for o in self.objects]


def manifest_from_file(path: Path, options: ManifestOptions | None = None) -> Rendered:
    """Read and validate the policy at ``path``, then render its manifests.

    Raises ``ConfigError`` when the policy has errors (NVRx-version rules only with
    ``options.nvrx_version``; otherwise they are left to ``nvtrain validate --nvrx``) and
    ``UsageError`` when the options cannot be rendered."""
    from nvtrain.config.load import read_source
    from nvtrain.config.validation import validate_source

    raw, problem = read_source(path)
    if raw is None:
        assert problem is not None
        raise ConfigError(str(path), [problem])
    wanted = options.nvrx_version if options is not None else None
    nvrx = parse_nvrx_option(wanted) if wanted is not None else None
    result = validate_source(raw, str(path), nvrx=nvrx)
    if result.policy is None or result.errors:
        raise ConfigError(result.source, result.findings)
    text = raw.decode("utf-8")
    check_policy_size(text, f"the policy file {path}")
    objects = render(result.policy, text, options)
    return Rendered(objects, dump(objects), tuple(notes(result.policy, options or ManifestOptions())))
