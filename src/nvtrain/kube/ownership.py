"""``--owner-script FILE``: make the workload own the job's other objects, after they exist.

Kubernetes deletes an object with its owner (garbage collection) when the object's
``metadata.ownerReferences`` names the owner by kind, name **and UID**. The UID is made by the
API server when the owner is created, so a manifest rendered beforehand cannot hold it, and an
owner reference without the right UID is ignored or refused. Controllers set owner references
on what they create (JobSet on its headless Service and Jobs, the Job controller on its pods);
for objects applied from a file, the usual way is a step after ``kubectl apply``: read the
owner's UID and patch the owner reference into each dependent. That is the script this module
writes:

    kubectl apply -f job.yaml && sh owners.sh

It reads the UID of the training Job (or of the JobSet) and gives the ConfigMap, Service,
NetworkPolicy, PodMonitor, PodGroup, PrometheusRule, dashboard ConfigMap and control Job an owner
reference to it, so that ``kubectl delete job <job>``, or ``--ttl`` once the Job has finished,
removes them too. ``blockOwnerDeletion`` is left out (it needs ``delete`` rights on the owner).
Until the script has run, nothing is owned and everything works as without it; a Trainer runtime
has no owner to give (its objects serve every TrainJob), so it is refused there.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from nvtrain.errors import UsageError

__all__ = ["OWNER_KINDS", "owner_reference", "owner_script", "resource_type"]

_COMPONENT = "app.kubernetes.io/component"

OWNER_KINDS = ("JobSet", "Job")
"""Kinds that own the rest, in order of preference: the JobSet, else the training Job."""


def resource_type(obj: dict[str, Any]) -> str:
    """The ``kubectl`` type of ``obj``: ``configmap``, ``networkpolicy.networking.k8s.io``, ..."""
    group = str(obj["apiVersion"]).rpartition("/")[0]
    kind = str(obj["kind"]).lower()
    return f"{kind}.{group}" if group else kind


def owner_reference(owner: dict[str, Any], uid: str) -> dict[str, Any]:
    """The owner reference to ``owner`` (a rendered object) with the API server's ``uid``."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": uid,
    }


def _owner(objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    for kind in OWNER_KINDS:
        found = [o for o in objects if o["kind"] == kind]
        if kind == "Job":
            # The training Job, not the control Job (component label "control", manifest.control_job).
            found = [o for o in found if o["metadata"].get("labels", {}).get(_COMPONENT) != "control"]
        if found:
            return found[-1]
    raise UsageError(
        "--owner-script needs a Job or a JobSet to own the other objects, and the manifest has "
        "none (a Trainer runtime's objects serve every TrainJob)",
        "leave out --owner-script",
    )


def owner_script(objects: Sequence[dict[str, Any]], manifest: str) -> str:
    """A POSIX shell script that, after ``kubectl apply -f manifest``, gives every object of
    ``objects`` but the workload an owner reference to the workload (module docstring)."""
    owner = _owner(objects)
    owner_kind = owner["kind"]
    name = owner["metadata"]["name"]
    namespace = owner["metadata"].get("namespace", "default")
    dependents = [o for o in objects if o is not owner]
    placeholder = "@UID@"
    patch = json.dumps({"metadata": {"ownerReferences": [owner_reference(owner, placeholder)]}})
    before, after = patch.split(placeholder)
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# Written by `nvtrain manifest --owner-script`. Run it after `kubectl apply` of the manifest:",
        f"# it makes {owner_kind} {name} own the job's other objects, so that deleting it (or its",
        "# ttlSecondsAfterFinished) deletes them too. KUBECTL overrides the kubectl command.",
        "set -eu",
        'kubectl="${KUBECTL:-kubectl}"',
        f"namespace={q(namespace)}",
        f'uid=$("$kubectl" get {q(resource_type(owner))} {q(name)} -n "$namespace" '
        "-o jsonpath='{.metadata.uid}')",
        'if [ -z "$uid" ]; then',
        f"    echo {q(f'{owner_kind} {name} has no UID yet: kubectl apply -f {manifest} first')} >&2",
        "    exit 1",
        "fi",
        f'patch={q(before)}"$uid"{q(after)}',
    ]
    for obj in dependents:
        kind, dep = resource_type(obj), obj["metadata"]["name"]
        lines.append(f'"$kubectl" patch {q(kind)} {q(dep)} -n "$namespace" --type=merge -p "$patch"')
    return "\n".join(lines) + "\n"
