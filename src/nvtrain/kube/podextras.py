"""What the training pods get beside nvtrain's own: Secrets as environment, extra volumes, init
containers, and placement (affinity, topology). Declared once in ``ManifestOptions`` and applied
to the training pod template, whatever wraps it (the Job, the JobSet, the Trainer runtime):

- ``--secret-env NAME`` (repeatable): every key of the Secret ``NAME`` becomes an environment
  variable of the training container (``envFrom`` ``secretRef``): tokens for a model hub, object
  store credentials. Never written into the manifest itself;
- ``--volume KIND:NAME:PATH[:ro]`` (repeatable): a PersistentVolumeClaim (``pvc``), Secret
  (``secret``) or ConfigMap (``configmap``) mounted at ``PATH`` in the training container, as
  the volume ``extra-<i>``; ``PATH`` may not hide what nvtrain mounts (the policy, the
  checkpoint directory, ``/dev/shm``, the host copies);
- ``--init-container FILE``: containers (a YAML mapping, or a list of them) that run to the end
  before the training container starts (``initContainers``), e.g. to stage a dataset;
- ``--affinity FILE``: the training pods' ``affinity`` (YAML: ``nodeAffinity``,
  ``podAffinity``, ``podAntiAffinity``);
- ``--exclusive-topology KEY`` (JobSet and Trainer runtime): the JobSet annotation
  ``alpha.jobset.sigs.k8s.io/exclusive-topology``, one replicated Job per topology domain
  ``KEY`` (e.g. a rack or NVLink domain);
- ``--required-topology LEVEL`` or ``--preferred-topology LEVEL``: Kueue Topology Aware
  Scheduling (the pod template annotation ``kueue.x-k8s.io/podset-required-topology`` or
  ``-preferred-topology``): Kueue admits the pods only (or preferably) inside one domain of the
  node label ``LEVEL``.

``nodeSelector`` and tolerations have their own options (``--node-selector``, ``--toleration``).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.kubenames import check_dns_label, check_dns_subdomain, check_qualified_name

__all__ = [
    "AFFINITY_KINDS",
    "EXCLUSIVE_TOPOLOGY",
    "PREFERRED_TOPOLOGY",
    "REQUIRED_TOPOLOGY",
    "VOLUME_KINDS",
    "ExtraVolume",
    "check_affinity",
    "check_init_containers",
    "check_secret_env",
    "check_topology",
    "check_volumes",
    "extra_volume",
    "topology_annotations",
    "volume_entries",
]

EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
"""JobSet annotation: each replicated Job's pods in one domain of this node label, and no two
Jobs in one domain."""

REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
"""Kueue Topology Aware Scheduling: the pod template's pods in one domain of the node label
given as the value (required, or as far as possible)."""

VOLUME_KINDS = {"pvc": "persistentVolumeClaim", "secret": "secret", "configmap": "configMap"}
"""``--volume KIND``: the volume source it makes."""

AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


@dataclasses.dataclass(frozen=True)
class ExtraVolume:
    """One ``--volume KIND:NAME:PATH[:ro]``."""

    kind: str
    name: str
    path: str
    read_only: bool = False


def extra_volume(spec: str) -> ExtraVolume:
    """``spec`` (``pvc:datasets:/data:ro``) as an ``ExtraVolume``; ``UsageError`` when it is
    not ``KIND:NAME:PATH[:ro]`` with a known kind, a valid name and an absolute path."""
    parts = spec.split(":")
    example = "e.g. --volume pvc:datasets:/data:ro or --volume secret:hub-token:/etc/hub"
    read_only = len(parts) == 4 and parts[3] == "ro"
    if len(parts) not in (3, 4) or len(parts) == 4 and not read_only:
        raise UsageError(f"--volume {spec!r} is not KIND:NAME:PATH[:ro]", example)
    kind, name, path = parts[:3]
    if kind not in VOLUME_KINDS:
        raise UsageError(
            f"--volume {spec!r}: {kind!r} is not a volume kind nvtrain mounts ({', '.join(VOLUME_KINDS)})",
            example,
        )
    check_dns_subdomain("--volume", name, {"pvc": "PersistentVolumeClaim"}.get(kind, kind.capitalize()))
    if not path.startswith("/") or posixpath.normpath(path) != path or "\x00" in path:
        raise UsageError(
            f"--volume {spec!r}: the mount path {path!r} is not an absolute, normalized path",
            "give the directory inside the container, e.g. /data",
        )
    return ExtraVolume(kind, name, path, read_only)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def check_volumes(volumes: Sequence[ExtraVolume], reserved: Mapping[str, str]) -> None:
    """No two volumes at one path, and none at, above or inside a path in ``reserved`` (path:
    what nvtrain mounts there), which it would hide or be hidden by."""
    seen: dict[str, ExtraVolume] = {}
    for volume in volumes:
        for path, what in reserved.items():
            if _inside(volume.path, path) or _inside(path, volume.path):
                raise UsageError(
                    f"--volume {volume.kind}:{volume.name}:{volume.path} overlaps {path}, where "
                    f"nvtrain mounts {what}",
                    "mount it elsewhere, e.g. under /data",
                )
        if volume.path in seen:
            raise UsageError(
                f"--volume {volume.kind}:{volume.name}:{volume.path} is mounted where "
                f"--volume {seen[volume.path].kind}:{seen[volume.path].name} already is",
                "give each volume a path of its own",
            )
        seen[volume.path] = volume


def volume_entries(volumes: Sequence[ExtraVolume]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes of the pod, volume mounts of the training container) for ``volumes``."""
    pod: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, volume in enumerate(volumes):
        name = f"extra-{i}"
        source_key = VOLUME_KINDS[volume.kind]
        source: dict[str, Any] = (
            {"claimName": volume.name}
            if volume.kind == "pvc"
            else {"secretName": volume.name}
            if volume.kind == "secret"
            else {"name": volume.name}
        )
        if volume.read_only and volume.kind == "pvc":
            source["readOnly"] = True
        pod.append({"name": name, source_key: source})
        mount: dict[str, Any] = {"name": name, "mountPath": volume.path}
        if volume.read_only or volume.kind != "pvc":  # Secrets and ConfigMaps are read-only anyway
            mount["readOnly"] = True
        mounts.append(mount)
    return pod, mounts


def check_secret_env(secrets: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in secrets:
        check_dns_subdomain("--secret-env", name, "Secret")
        if name in seen:
            raise UsageError(f"--secret-env {name} is given twice", "give each Secret once")
        seen.add(name)


def check_init_containers(containers: Sequence[Any], taken: Sequence[str]) -> None:
    """Each init container is a mapping with a ``name`` (a DNS label, none of ``taken`` nor of
    the others) and an ``image``. Its other fields go to the pod as given."""
    names = set(taken)
    for i, container in enumerate(containers):
        where = f"--init-container (container {i + 1})"
        if not isinstance(container, Mapping):
            raise UsageError(
                f"{where} is not a mapping", "give a container as in a pod spec: name, image, command..."
            )
        name, image = container.get("name"), container.get("image")
        if not isinstance(name, str):
            raise UsageError(f"{where} has no name", "add name: stage-data (a DNS label)")
        check_dns_label(f"{where} name", name, "container")
        if name in names:
            raise UsageError(
                f"{where} name {name!r} is taken by another container of the pod", "give it a name of its own"
            )
        names.add(name)
        if not isinstance(image, str) or not image.strip():
            raise UsageError(f"{where} {name!r} has no image", "add image: <registry>/<image>:<tag>")


def check_affinity(affinity: Any) -> None:
    """``--affinity``: a non-empty mapping of the affinity kinds only."""
    if affinity is None:
        return
    if not isinstance(affinity, Mapping) or not affinity:
        raise UsageError(
            "--affinity is not a mapping of nodeAffinity, podAffinity or podAntiAffinity",
            "give the pod's affinity as YAML, e.g. nodeAffinity: {requiredDuringScheduling...}",
        )
    unknown = sorted(str(k) for k in affinity if k not in AFFINITY_KINDS)
    if unknown:
        raise UsageError(
            f"--affinity has {unknown[0]!r}, which is not one of {', '.join(AFFINITY_KINDS)}",
            "give the pod's affinity itself, not the pod spec around it",
        )


def check_topology(
    *, exclusive: str | None, required: str | None, preferred: str | None, jobset: bool
) -> None:
    """The topology options: node label keys, one Kueue mode, exclusive topology only where a
    JobSet is made (``--jobset`` or the Trainer runtime)."""
    for flag, key in (
        ("--exclusive-topology", exclusive),
        ("--required-topology", required),
        ("--preferred-topology", preferred),
    ):
        if key is not None:
            check_qualified_name(flag, key)
    if required is not None and preferred is not None:
        raise UsageError(
            "--required-topology and --preferred-topology are both given: a pod set has one",
            "keep one of them",
        )
    if exclusive is not None and not jobset:
        raise UsageError(
            f"--exclusive-topology {exclusive} is an annotation of the JobSet, and the plain Job is rendered",
            "add --jobset (or --trainer-runtime), or use --required-topology with Kueue",
        )


def topology_annotations(required: str | None, preferred: str | None) -> dict[str, str]:
    """The Kueue topology annotation of the training pod template, if any."""
    if required is not None:
        return {REQUIRED_TOPOLOGY: required}
    if preferred is not None:
        return {PREFERRED_TOPOLOGY: preferred}
    return {}
