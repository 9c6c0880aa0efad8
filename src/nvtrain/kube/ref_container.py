"""The references of the training container of a manifest: its volume mounts name volumes of the
pod, it runs ``nvtrain run`` on the mounted policy, takes the run id from the workload's UID,
mounts the checkpoint volume at ``[checkpoint] dir`` and ``/dev/shm``, and asks for one GPU per
rank. Part of ``manifest_refs``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from nvtrain.findings import Finding, toml_value
from nvtrain.kube.objects import JOB_UID_LABEL, JOBSET_UID_LABEL, POLICY_FILE
from nvtrain.kube.ref_pods import Checker, Pods
from nvtrain.kube.sizing import GPU_RESOURCE, SHM_MOUNT, keeps_host_copy
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get

__all__ = ["training_container"]


def _training(pod: Pods) -> tuple[int, dict[str, Any]] | None:
    """(index, container) of the training container: named ``trainer`` (``node`` in a Trainer
    runtime), else the one that runs ``nvtrain run``, else the first."""
    containers = [(i, c) for i, c in enumerate(pod.containers()) if isinstance(c, dict)]
    for i, c in containers:
        if c.get("name") == pod.container_name:
            return i, c
    for i, c in containers:
        if _nvtrain_run(c) is not None:
            return i, c
    return containers[0] if containers else None


def _words(container: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, str):
                continue
            try:
                words += shlex.split(item) if " " in item.strip() else [item]
            except ValueError:
                words += item.split()
    return words


def _nvtrain_run(container: dict[str, Any]) -> str | None:
    """The policy file that ``container`` runs ``nvtrain run`` with (``--policy FILE``, or the
    first ``*.toml`` argument; "" when it cannot be told), or None when it does not run
    ``nvtrain run``."""
    words = _words(container)
    for i in range(len(words) - 1):
        if PurePosixPath(words[i]).name == "nvtrain" and words[i + 1] == "run":
            rest = words[i + 2 :]
            for j, word in enumerate(rest):
                if word == "--policy" and j + 1 < len(rest):
                    return rest[j + 1]
                if word.startswith("--policy="):
                    return word.partition("=")[2]
            return next((w for w in rest if w.endswith(".toml") and not w.startswith("-")), "")
    return None


def training_container(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """The training container of ``pod``: its mounts name volumes, and its command, run id,
    mounts and GPUs are what the pods depend on."""
    found = _training(pod)
    if found is None:
        return
    index, container = found
    at: YamlPath = (*pod.spec, "containers", index)
    volumes = pod.get(*pod.spec, "volumes")
    volumes = {v.get("name"): v for v in volumes if isinstance(v, dict)} if isinstance(volumes, list) else {}
    mounts = container.get("volumeMounts")
    mounts = [m for m in mounts if isinstance(m, dict)] if isinstance(mounts, list) else []
    for i, mount in enumerate(mounts):
        if mount.get("name") not in volumes:
            yield checker.finding(
                "error",
                "manifest-volume",
                pod.doc,
                (*at, "volumeMounts", i, "name"),
                mount.get("name", _MISSING),
                f"names no volume of the pod (volumes: {', '.join(map(str, volumes)) or 'none'}): "
                "Kubernetes refuses the Job",
                "rename the volume and its mounts together, or render again",
            )
    yield from _command(checker, pod, at, container, volumes, mounts)
    yield from _run_id(checker, pod, at, container)
    yield from _mounts(checker, pod, at, volumes, mounts)
    yield from _gpus(checker, pod, at, container)


def _command(
    checker: Checker,
    pod: Pods,
    at: YamlPath,
    container: dict[str, Any],
    volumes: dict[Any, Any],
    mounts: list[dict[str, Any]],
) -> Iterator[Finding]:
    """The container runs ``nvtrain run`` on the policy file of a mounted ConfigMap."""
    path = _nvtrain_run(container)
    key = "command" if "command" in container or "args" not in container else "args"
    if path is None:
        yield checker.finding(
            "warning",
            "manifest-command",
            pod.doc,
            (*at, key),
            container.get(key, _MISSING),
            "does not run `nvtrain run`: the pod failure policy, the restarts inside the pod, "
            "the rendezvous through the pods' DNS names and the run id all depend on it, and "
            "its exit codes mean nothing else",
            f'run ["nvtrain", "run", "/etc/nvtrain/{POLICY_FILE}"] (a wrapper script may set up '
            "first and then exec it), or render again",
        )
        return
    files = set()
    for mount in mounts:
        volume = volumes.get(mount.get("name"))
        mount_path = mount.get("mountPath")
        if not isinstance(volume, dict) or "configMap" not in volume or not isinstance(mount_path, str):
            continue
        sub = mount.get("subPath")
        files.add(mount_path if isinstance(sub, str) and sub else f"{mount_path.rstrip('/')}/{POLICY_FILE}")
    # No ConfigMap mounted at all (the policy mount removed) is edit_pods' error, for every
    # container that runs nvtrain on a file under /etc/nvtrain (the control pod's too).
    if files and path and path not in files:
        yield checker.finding(
            "error",
            "manifest-command",
            pod.doc,
            (*at, key),
            container.get(key),
            f"runs `nvtrain run {path}`, but the policy ConfigMap is mounted at "
            f"{', '.join(sorted(files))}: every pod exits 2 at once (no such policy file), and "
            "the Job fails",
            f"run nvtrain run {sorted(files)[0]}, or render again",
        )


def _run_id(checker: Checker, pod: Pods, at: YamlPath, container: dict[str, Any]) -> Iterator[Finding]:
    """``NVTRAIN_RUN_ID`` comes from the workload's UID: the same on every pod and every pod
    that replaces one, and a new one for a new workload. Trainer makes a JobSet of each TrainJob,
    so a runtime's pods take the UID of that JobSet."""
    jobset = pod.jobset
    label = JOBSET_UID_LABEL if jobset else JOB_UID_LABEL
    want = f"metadata.labels['{label}']"
    env = container.get("env")
    env = env if isinstance(env, list) else []
    entries = [(i, e) for i, e in enumerate(env) if isinstance(e, dict) and e.get("name") == "NVTRAIN_RUN_ID"]
    p = checker.policy
    if not entries:
        many = p is None or p.rendezvous.nodes > 1
        yield checker.finding(
            "error" if many else "warning",
            "manifest-run-id",
            pod.doc,
            (*at, "env"),
            _MISSING,
            "has no NVTRAIN_RUN_ID: "
            + (
                "a multi-node job needs one run id on every pod, so every pod exits 2 at start "
                "and the Job fails"
                if many
                else "each pod makes up a run id of its own, so a pod that replaces a lost one "
                "starts from step 0 instead of the run's checkpoints"
            ),
            f"add NVTRAIN_RUN_ID from the field {want} (the {'JobSet' if jobset else 'Job'}'s UID), "
            "or render again",
        )
        return
    i, entry = entries[-1]
    field = _get(entry, ("valueFrom", "fieldRef", "fieldPath"))
    accepted = {want} if jobset else {want, "metadata.labels['controller-uid']"}  # the label before 1.27
    if "value" in entry or field in accepted:
        return  # a fixed value is a choice: that run id, on every pod and every new Job
    yield checker.finding(
        "warning",
        "manifest-run-id",
        pod.doc,
        (*at, "env", i),
        field if isinstance(field, str) else entry,
        f"NVTRAIN_RUN_ID does not come from {want}, the {'JobSet' if jobset else 'Job'}'s UID: "
        "pods that do not share it never meet in one rendezvous, and a replaced pod that gets "
        "another one does not resume the run's checkpoints",
        f"take it from the field {want}, or render again",
    )


def _under(path: str, mount: str) -> bool:
    p, m = PurePosixPath(path), PurePosixPath(mount)
    return p == m or m in p.parents


def _mounts(
    checker: Checker, pod: Pods, at: YamlPath, volumes: dict[Any, Any], mounts: list[dict[str, Any]]
) -> Iterator[Finding]:
    """``[checkpoint] dir`` on a shared volume, and a memory-backed ``/dev/shm``."""
    p = checker.policy
    if p is None:
        return
    where = (*at, "volumeMounts")
    value = [m.get("mountPath") for m in mounts]
    directory = p.checkpoint.dir
    holding = [m for m in mounts if isinstance(m.get("mountPath"), str) and _under(directory, m["mountPath"])]
    if not holding:
        yield checker.finding(
            "error",
            "manifest-mount",
            pod.doc,
            where,
            value,
            f"mounts no volume at [checkpoint] dir = {toml_value(directory)}: the checkpoints go "
            "into the container's own filesystem, are lost with the pod, and the other pods cannot "
            "read them; a replaced pod starts from step 0",
            f"mount the checkpoint PersistentVolumeClaim at {directory}, or render again",
        )
    else:
        volume = volumes.get(max(holding, key=lambda m: len(str(m["mountPath"]))).get("name"))
        if isinstance(volume, dict) and "persistentVolumeClaim" not in volume:
            kind = next((k for k in volume if k != "name"), "?")
            yield checker.finding(
                "warning",
                "manifest-mount",
                pod.doc,
                where,
                value,
                f"[checkpoint] dir = {toml_value(directory)} is on a {kind} volume, not a "
                "PersistentVolumeClaim: unless it is storage that every pod shares, the checkpoints "
                "are lost with the pod and the other pods cannot read them",
                "mount a ReadWriteMany PersistentVolumeClaim there, or render again",
            )
    shm = [m for m in mounts if m.get("mountPath") in (SHM_MOUNT, f"{SHM_MOUNT}/")]
    memory = any(_get(volumes.get(m.get("name")), ("emptyDir", "medium")) == "Memory" for m in shm)
    if not memory:
        copies = " and the host copies of the checkpoint" if keeps_host_copy(p) else ""
        yield checker.finding(
            "warning",
            "manifest-mount",
            pod.doc,
            where,
            value,
            f"mounts no memory-backed emptyDir at {SHM_MOUNT}: the container runtime's default is "
            f"64 MiB, too small for the data-loader workers{copies}, which then fail with bus errors",
            f"mount an emptyDir with medium: Memory at {SHM_MOUNT}, or render again",
        )


def _limit(container: dict[str, Any], name: str) -> Any:
    for key in ("limits", "requests"):
        value = _get(container, ("resources", key, name))
        if value is not _MISSING:
            return value
    return _MISSING


def _gpus(checker: Checker, pod: Pods, at: YamlPath, container: dict[str, Any]) -> Iterator[Finding]:
    """One GPU per rank: ``nvidia.com/gpu`` equal to a numeric ``[job] nproc_per_node``."""
    p = checker.policy
    if p is None:
        return
    nproc = p.job.nproc_per_node
    if not isinstance(nproc, int) or p.job.backend == "gloo":
        return
    limits = _get(container, ("resources", "limits"))
    if isinstance(limits, dict) and any(str(k).startswith("nvidia.com/mig-") for k in limits):
        return  # MIG slices: a pod's devices are not counted in nvidia.com/gpu
    path: YamlPath = (*at, "resources", "limits", GPU_RESOURCE)
    raw = _limit(container, GPU_RESOURCE)
    try:
        count = int(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else None
    except ValueError:
        count = None
    if raw is _MISSING or count == 0:
        if p.job.backend == "nccl":
            yield checker.finding(
                "error",
                "manifest-gpus",
                pod.doc,
                path,
                raw,
                f'gives the pod no GPU, but [job] backend = "nccl" runs {nproc} ranks of one GPU '
                "each: every rank fails at start",
                f"set {GPU_RESOURCE} to {nproc} (requests and limits), or render again",
            )
        return
    if count is None or count == nproc:
        return
    fewer = count < nproc
    yield checker.finding(
        "error" if fewer else "warning",
        "manifest-gpus",
        pod.doc,
        path,
        raw,
        f"is not [job] nproc_per_node = {nproc}: each rank uses one GPU of its own, "
        + (
            f"so local ranks {count} to {nproc - 1} find no GPU (CUDA's invalid device ordinal) "
            "and the pod fails at start"
            if fewer
            else f"so {count - nproc} GPU{'s' if count - nproc > 1 else ''} of every pod are held "
            "and never used"
        ),
        f"set {GPU_RESOURCE} to {nproc} (requests and limits), or change nproc_per_node and render again",
    )
