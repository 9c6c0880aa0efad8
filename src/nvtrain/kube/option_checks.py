"""What ``ManifestOptions`` may be for a policy, checked before any object is built: each bad
value is a ``UsageError`` that names the option (or the policy key), the value and the fix, so
that ``nvtrain manifest`` refuses what the API server or the pods would refuse later.

Image and claim names, the checkpoint and host-copy mounts, counts, quantities and the memory
they add up to, extended resources, the Kubernetes version, labels, environment names, and the
checks of the pod extras (``podextras``), the platform options (``qos``, ``podsecurity``,
``scheduling``, ``monitoring``) and the Trainer runtime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kube import monitoring, podextras, podsecurity, qos, scheduling, trainer_runtime
from nvtrain.kube.nvrx_pin import NVRX_ANNOTATION
from nvtrain.kube.objects import (
    COMPONENT_LABEL,
    CONTAINER,
    CONTROL_CONTAINER,
    INDEX_ANNOTATION,
    JOB_UID_LABEL,
    POLICY_MOUNT,
    has_control_job,
    image_of,
    pvc_of,
    selector,
    training_env,
)
from nvtrain.kube.options import INT32_MAX, ManifestOptions, kubernetes_version, rdma_flags
from nvtrain.kube.quantity import format_bytes as _quantity
from nvtrain.kube.quantity import parse_quantity as _check_quantity
from nvtrain.kube.sizing import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    SHM_MOUNT,
    host_copies_made_of,
    host_copies_per_rank,
    host_copy_bytes,
    in_shm,
    keeps_host_copy,
    ranks_per_pod,
)
from nvtrain.kubenames import CONTROL_CHARS as _CONTROL
from nvtrain.kubenames import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from nvtrain.kubenames import LABEL_VALUE as _LABEL_VALUE
from nvtrain.kubenames import QUALIFIED_NAME as _QUALIFIED

__all__ = ["CONFIGMAP_LIMIT", "check_options", "check_policy_size"]


CONFIGMAP_LIMIT = 1024 * 1024
"""Kubernetes' limit on the data of one ConfigMap (1 MiB); the policy's text is all of it."""

_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def check_policy_size(policy_text: str, source: str) -> None:
    """The policy text (``source``, for the message) fits in one ConfigMap (``CONFIGMAP_LIMIT``)."""
    size = len(policy_text.encode("utf-8"))
    if size > CONFIGMAP_LIMIT:
        raise UsageError(
            f"{source} is {size:,} bytes, more than a ConfigMap holds (Kubernetes' limit is 1 MiB, "
            f"{CONFIGMAP_LIMIT:,} bytes)",
            "remove what the policy does not need (long comments, huge args); a policy is a few KiB",
        )


def check_options(policy: Policy, options: ManifestOptions) -> None:
    """Every option against the policy (see the module docstring); ``UsageError`` for the first
    that cannot be rendered."""
    _check_image_and_claim(policy, options)
    _check_checkpoint_dir(policy.checkpoint.dir)
    for flag, count in (("--backoff-limit", options.backoff_limit), ("--efa", options.efa)):
        if count < 0:
            raise UsageError(f"{flag} {count} is negative", f"give {flag} 0 or more")
        if count > INT32_MAX:
            raise UsageError(
                f"{flag} {count} is too large (Kubernetes holds at most {INT32_MAX:,})",
                f"give {flag} a count such as 6",
            )
    _check_memory(policy, options)
    _check_resources(options)
    kubernetes_version(options)
    _check_extras(policy, options)
    _check_pairs("label", options.labels, _QUALIFIED, _LABEL_VALUE)
    _check_platform(policy, options)
    _check_pairs("node selector", options.node_selector, _QUALIFIED, _LABEL_VALUE)
    _check_own_names(policy, options)


def _check_image_and_claim(policy: Policy, options: ManifestOptions) -> None:
    """The image is a reference and the checkpoint claim a PersistentVolumeClaim name."""
    image = image_of(policy, options)
    if not image or any(c.isspace() for c in image) or _CONTROL.search(image):
        raise UsageError(
            f"--image {image!r} is not an image reference",
            "give e.g. registry.example.com/team/train:1.0 (no spaces)",
        )
    pvc = pvc_of(policy, options)
    if not re.fullmatch(_DNS_SUBDOMAIN, pvc) or len(pvc) > 253:
        raise UsageError(
            f"--checkpoint-pvc {pvc!r} is not a PersistentVolumeClaim name",
            "use lowercase letters, digits, '-' and '.'",
        )


def _check_checkpoint_dir(directory: str) -> None:
    """``[checkpoint] dir`` can be the checkpoint volume's ``mountPath``."""
    if _CONTROL.search(directory):
        raise UsageError(
            f"[checkpoint] dir {directory!r} contains control characters (e.g. a newline)",
            'use a plain absolute path such as "/checkpoints"',
        )
    if ":" in directory:
        raise UsageError(
            f"[checkpoint] dir {directory!r} contains ':', which Kubernetes does not allow in a "
            "volume's mountPath",
            'use a path without a colon, such as "/checkpoints"',
        )
    clean = PurePosixPath(directory)
    policy_mount = PurePosixPath(POLICY_MOUNT)
    system = [PurePosixPath(p) for p in ("/dev", "/proc", "/sys")]
    if (
        ".." in clean.parts
        or clean == PurePosixPath("/")
        or any(clean == s or s in clean.parents for s in system)
        or clean == policy_mount
        or policy_mount in clean.parents
        or clean in policy_mount.parents
    ):
        raise UsageError(
            f"[checkpoint] dir {directory!r} cannot be mounted as the checkpoint volume: it is "
            f"/, contains '..', lies in /dev, /proc or /sys, or overlaps {POLICY_MOUNT}",
            'use a directory of its own, such as "/checkpoints"',
        )


def _check_memory(policy: Policy, options: ManifestOptions) -> None:
    """``--shm-size``, ``--cpu`` and ``--memory`` are quantities, the host copies' folder can be
    mounted, and the memory-backed volumes (``/dev/shm``, the host copies) fit below
    ``--memory``."""
    shm = _check_quantity("--shm-size", options.shm_size)
    _check_memory_dir(policy)
    host = host_copy_bytes(policy, options)
    if options.cpu is not None:
        _check_quantity("--cpu", options.cpu)
    if options.memory is None:
        return
    memory = _check_quantity("--memory", options.memory)
    if host is None and shm >= memory:
        raise UsageError(
            f"--shm-size {options.shm_size} is not below --memory {options.memory}: "
            "/dev/shm is memory-backed and counts against the pod's memory limit",
            "lower --shm-size or raise --memory",
        )
    if host is not None and shm + host >= memory:
        raise UsageError(
            f"--shm-size {options.shm_size} plus the host copies "
            f"({host_copies_per_rank(policy)} × --state-per-rank {options.state_per_rank} × "
            f"{ranks_per_pod(policy, options)} ranks = {_quantity(host)}; per rank "
            f"{host_copies_made_of(policy)}) is {_quantity(shm + host)} of memory-backed volumes, "
            f"not below --memory {options.memory}: they count against the pod's memory limit",
            "raise --memory, or lower --shm-size",
        )


def _check_own_names(policy: Policy, options: ManifestOptions) -> None:
    """No label or environment variable of the user's is one that the manifest sets itself;
    environment names are valid."""
    reserved_labels = set(selector(policy)) | {"app.kubernetes.io/managed-by"}
    if has_control_job(policy):
        reserved_labels.add(COMPONENT_LABEL)
    clash = sorted(reserved_labels & set(options.labels))
    if clash:
        raise UsageError(f"label {clash[0]} is set by nvtrain", "choose another label name")
    own = {e["name"] for e in training_env(policy, options, uid_label=JOB_UID_LABEL, extra=False)}
    for name in options.env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {name!r} is not an environment variable name", "e.g. NCCL_DEBUG")
        if name in own:
            raise UsageError(f"--env {name} is set by the manifest itself", "leave it out")


def _check_memory_dir(policy: Policy) -> None:
    """A ``memory_dir`` outside ``/dev/shm`` must be a mount point of its own, as the checkpoint
    dir must (``check_options``); one in ``/dev/shm`` needs no mount but must stay in it."""
    directory = policy.checkpoint.memory_dir
    if not keeps_host_copy(policy):
        return
    clean = PurePosixPath(directory)
    key = f"[checkpoint] memory_dir {directory!r}"
    if ".." in clean.parts:
        raise UsageError(f"{key} contains '..'", 'use a plain absolute path such as "/dev/shm" (the default)')
    if in_shm(directory):
        return
    if _CONTROL.search(directory) or ":" in directory:
        raise UsageError(
            f"{key} contains a control character or ':', which Kubernetes does not allow in a "
            "volume's mountPath",
            'use a plain absolute path such as "/dev/shm" (the default)',
        )
    others = {
        POLICY_MOUNT: PurePosixPath(POLICY_MOUNT),
        "[checkpoint] dir": PurePosixPath(policy.checkpoint.dir),
    }
    overlaps = [name for name, o in others.items() if clean == o or o in clean.parents or clean in o.parents]
    system = [PurePosixPath(p) for p in ("/dev", "/proc", "/sys")]
    if clean == PurePosixPath("/") or any(clean == s or s in clean.parents for s in system) or overlaps:
        raise UsageError(
            f"{key} cannot be mounted as the memory-backed volume of the host copies: it is /, "
            f"lies in /dev (outside /dev/shm), /proc or /sys, or overlaps {POLICY_MOUNT} or "
            "[checkpoint] dir",
            'use "/dev/shm" (the default) or a directory of its own, such as "/hostcopy"',
        )


def _check_pairs(kind: str, pairs: Mapping[str, str], key: re.Pattern[str], value: re.Pattern[str]) -> None:
    for k, v in pairs.items():
        if not key.fullmatch(k) or len(k) > 253:
            raise UsageError(
                f"{kind} name {k!r} is not valid",
                "use a Kubernetes qualified name, e.g. example.com/team or team",
            )
        if not value.fullmatch(v):
            raise UsageError(
                f"{kind} {k}={v!r}: the value is not valid",
                "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            )


def _reserved_mounts(policy: Policy) -> dict[str, str]:
    """Paths of the training container that nvtrain mounts (path: what it mounts there)."""
    reserved = {
        POLICY_MOUNT: "the policy",
        policy.checkpoint.dir: "the checkpoint volume ([checkpoint] dir)",
        SHM_MOUNT: "the memory-backed /dev/shm",
    }
    if keeps_host_copy(policy) and not in_shm(policy.checkpoint.memory_dir):
        reserved[policy.checkpoint.memory_dir] = "the host copies ([checkpoint] memory_dir)"
    return reserved


def _check_extras(policy: Policy, options: ManifestOptions) -> None:
    """Secrets, volumes, init containers and placement (``podextras``), and the Trainer runtime."""
    podextras.check_secret_env(options.secret_env)
    volumes = [podextras.extra_volume(v) for v in options.volumes]
    podextras.check_volumes(volumes, _reserved_mounts(policy))
    podextras.check_init_containers(options.init_containers, (CONTAINER, CONTROL_CONTAINER))
    podextras.check_affinity(options.affinity)
    podextras.check_topology(
        exclusive=options.exclusive_topology,
        required=options.required_topology,
        preferred=options.preferred_topology,
        jobset=options.jobset or options.trainer_runtime is not None,
    )
    if options.trainer_runtime is not None:
        trainer_runtime.check_runtime(
            options.trainer_runtime,
            jobset=options.jobset,
            control_store=has_control_job(policy),
            scheduler_name=options.scheduler_name,
            queue=options.queue,
        )


def _check_resources(options: ManifestOptions) -> None:
    """``--resource`` and ``--rdma-resource``: extended resource names, counts of 1 or more, and
    not the resources that ``--gpus`` and ``--efa`` set (one would silently replace the other)."""
    own = {GPU_RESOURCE: "--gpus", EFA_RESOURCE: "--efa"}
    flags = {"--resource": options.resources, "--rdma-resource": options.rdma_resources}
    for flag, resources in flags.items():
        for name, count in resources.items():
            if not _QUALIFIED.fullmatch(name) or "/" not in name:
                raise UsageError(
                    f"{flag} {name!r} is not an extended resource name",
                    "use a domain-prefixed name such as rdma/hca_shared_devices_a",
                )
            if count < 1:
                raise UsageError(f"{flag} {name}={count}: the count must be at least 1")
            if name in own:
                raise UsageError(
                    f"{flag} {name}={count} would replace what {own[name]} sets: the pods' "
                    f"{name} comes from {own[name]}",
                    f"use {own[name]} {count} instead",
                )
    both = sorted(set(options.resources) & set(options.rdma_resources))
    if both:
        raise UsageError(
            f"{both[0]} is given with both --resource and --rdma-resource",
            "give it once: --rdma-resource for an RDMA device, --resource otherwise",
        )


def _check_platform(policy: Policy, options: ManifestOptions) -> None:
    """The platform options (QoS, Pod Security, scheduling, PodMonitor); see ``objects._platform_pod``."""
    qos.check_qos(options.qos)
    podsecurity.check_pod_security(options.pod_security, options.run_as_user, rdma_flags(options))
    scheduling.check_scheduling(
        tolerations=options.tolerations,
        priority_class=options.priority_class,
        scheduler_name=options.scheduler_name,
        service_account=options.service_account,
        queue=options.queue,
        ttl=options.ttl,
    )
    reserved = {
        INDEX_ANNOTATION,
        scheduling.GROUP_ANNOTATION,
        NVRX_ANNOTATION,
        podextras.REQUIRED_TOPOLOGY,
        podextras.PREFERRED_TOPOLOGY,
    }
    if policy.metrics.enabled:
        reserved |= {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"}
    scheduling.check_annotations(options.annotations, reserved)
    monitoring.check_pod_monitor(options.pod_monitor, policy.metrics.enabled)
    monitoring.check_monitoring_rules(options.monitoring_rules, policy.metrics.enabled)
    monitoring.check_metrics_from(options.metrics_from, policy.metrics.enabled)
    scheduling.check_queue(
        options.queue,
        scheduler_name=options.scheduler_name,
        labels=options.labels,
        two_jobs=has_control_job(policy) and not options.jobset,
    )
