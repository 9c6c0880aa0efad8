"""Rules that the Kubernetes API server enforces and that ``nvtrain validate --manifest`` can
judge from the file: an object that breaks one is refused by ``kubectl apply`` (or, for a pod
template, the Job is made and its pods never are), whatever edit made it.

Each is an error ``manifest-api`` at the field: a container without an image, an environment
variable with both ``value`` and ``valueFrom`` (what a strategic-merge patch of an entry leaves),
two ports or two volumes of one name, a request above its limit (an extended resource such as
``nvidia.com/gpu`` must have them equal), a Job's ``restartPolicy`` other than ``Never`` and
``OnFailure`` (only ``Never`` with a ``podFailurePolicy``), exit code 0 in an ``In`` rule of
the pod failure policy, and label values that are not label values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.findings import Finding
from nvtrain.kube.quantity import parse_quantity
from nvtrain.kube.ref_pods import Checker, Pods
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get

__all__ = ["api_rules", "quantity"]

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_STANDARD = ("cpu", "memory", "ephemeral-storage", "hugepages-")
"""Resources whose request may be below the limit; every other one is extended (request = limit)."""


def quantity(value: Any) -> Fraction | None:
    """A Kubernetes quantity (``16Gi``, ``250m``, ``8``) as a number, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return parse_quantity("", str(value))
    except UsageError:
        return None


def _refused(checker: Checker, doc: _Doc, path: YamlPath, value: Any, rule: str, fix: str) -> Finding:
    return checker.finding(
        "error", "manifest-api", doc, path, value, f"{rule}: the API server refuses the object", fix
    )


def api_rules(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    """Every rule of the module's docstring that ``docs`` (with the pod templates ``pods``) break."""
    for doc in docs:
        yield from _labels(checker, doc, ("metadata", "labels"))
    for pod in pods:
        yield from _labels(checker, pod.doc, (*pod.template, "metadata", "labels"))
        yield from _pod(checker, pod)
        yield from _restart_policy(checker, pod)
        yield from _exit_codes(checker, pod)


def _labels(checker: Checker, doc: _Doc, at: YamlPath) -> Iterator[Finding]:
    labels = _get(doc.data, at)
    for key, value in labels.items() if isinstance(labels, dict) else ():
        if value is None or isinstance(value, (bool, int, float)):
            continue  # written as a string by kubectl; YAML types are the schema's matter
        text = str(value)
        if len(text) > 63 or not _LABEL_VALUE.fullmatch(text):
            yield _refused(
                checker,
                doc,
                (*at, key),
                value,
                "is not a label value (at most 63 letters, digits, '-', '_' or '.', beginning "
                "and ending with a letter or digit)",
                "write the value without spaces or other characters, e.g. ml-team",
            )


def _pod(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """Images, environment variables, names of ports and volumes, requests against limits."""
    ports: set[Any] = set()
    for c, container in enumerate(pod.containers()):
        if not isinstance(container, dict):
            continue
        at: YamlPath = (*pod.spec, "containers", c)
        image = container.get("image")
        if not isinstance(image, str) or not image.strip():
            yield _refused(
                checker,
                pod.doc,
                at,
                image if image is not None else _MISSING,
                f"container {container.get('name')!r} has no image",
                "give the container its image (a Kustomize `images:` entry changes it), or render again",
            )
        env = container.get("env")
        for i, entry in enumerate(env if isinstance(env, list) else []):
            if isinstance(entry, dict) and "value" in entry and "valueFrom" in entry:
                yield _refused(
                    checker,
                    pod.doc,
                    (*at, "env", i),
                    entry,
                    f"environment variable {entry.get('name')!r} has both value and valueFrom (a "
                    "strategic-merge patch of an entry by its name merges into it)",
                    "keep one of them: patch the entry with `valueFrom: null` (or `value: null`), "
                    "or use a JSON 6902 replace",
                )
        declared = container.get("ports")
        for i, port in enumerate(declared if isinstance(declared, list) else []):
            name = _get(port, ("name",))
            if isinstance(name, str) and name in ports:
                yield _refused(
                    checker,
                    pod.doc,
                    (*at, "ports", i, "name"),
                    name,
                    f"port name {name!r} is used twice in the pod",
                    "give each port of the pod a name of its own",
                )
            ports.add(name)
        yield from _resources(checker, pod, at, container)
    volumes = pod.get(*pod.spec, "volumes")
    seen: set[Any] = set()
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        name = _get(volume, ("name",))
        if isinstance(name, str) and name in seen:
            yield _refused(
                checker,
                pod.doc,
                (*pod.spec, "volumes", i, "name"),
                name,
                f"volume name {name!r} is used twice in the pod",
                "give the new volume a name of its own, or patch the existing one",
            )
        seen.add(name)


def _resources(checker: Checker, pod: Pods, at: YamlPath, container: dict[str, Any]) -> Iterator[Finding]:
    requests = _get(container, ("resources", "requests"))
    limits = _get(container, ("resources", "limits"))
    if not isinstance(requests, dict) or not isinstance(limits, dict):
        return
    for name, raw in requests.items():
        want, have = quantity(raw), quantity(limits.get(name))
        if want is None or have is None:
            continue
        extended = not str(name).startswith(_STANDARD)
        if want > have or extended and want != have:
            yield _refused(
                checker,
                pod.doc,
                (*at, "resources", "requests", name),
                raw,
                f"the request of {name} ({raw}) is "
                + (
                    f"not its limit ({limits[name]}), which an extended resource must be"
                    if extended and want < have
                    else f"above its limit ({limits[name]})"
                ),
                f"patch requests and limits of {name} together",
            )


def _restart_policy(checker: Checker, pod: Pods) -> Iterator[Finding]:
    path: YamlPath = (*pod.spec, "restartPolicy")
    value = pod.get(*path)
    if value is _MISSING:
        return  # the Job refuses a template without it too, but nvtrain always writes it
    failure_policy = pod.get(*pod.job, "podFailurePolicy") is not _MISSING
    if value not in ("Never", "OnFailure"):
        rule = "a Job's pods must have restartPolicy Never or OnFailure"
    elif value != "Never" and failure_policy:
        rule = (
            "a Job with a podFailurePolicy needs restartPolicy Never (OnFailure restarts the "
            "container in place, so exit codes 2 and 4 would never fail the Job)"
        )
    else:
        return
    yield _refused(checker, pod.doc, path, value, rule, "set restartPolicy: Never, or render again")


def _exit_codes(checker: Checker, pod: Pods) -> Iterator[Finding]:
    rules = pod.get(*pod.job, "podFailurePolicy", "rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        values = _get(rule, ("onExitCodes", "values"))
        if _get(rule, ("onExitCodes", "operator")) == "In" and isinstance(values, list) and 0 in values:
            yield _refused(
                checker,
                pod.doc,
                (*pod.job, "podFailurePolicy", "rules", i, "onExitCodes", "values"),
                values,
                "exit code 0 cannot be in an In rule of the pod failure policy",
                "leave 0 out (nvtrain's rule fails the Job on exit codes 2 and 4)",
            )
