"""The pod templates of a manifest as the reference checks (``manifest_refs``) see them: each
Job's pods (a plain Job, or one replicated Job of a JobSet or of a Trainer runtime's JobSet), and
what those checks need of the checker that runs them (``Checker``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nvtrain.findings import Finding
from nvtrain.kube.objects import CONTAINER
from nvtrain.kube.trainer_runtime import NODE
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kube.yaml_positions import jobset_root as _jobset_root

if TYPE_CHECKING:
    from nvtrain.config.schema import Policy
    from nvtrain.findings import Severity

__all__ = ["Checker", "KUSTOMIZE", "Pods", "names_of", "pods_of"]


KUSTOMIZE = 'the configuration of docs/kubernetes.md, "Kustomize" (nvtrain-names.yaml)'


class Checker(Protocol):
    """What these checks need of ``manifest_checks``' checker: the policy (if any), how to
    re-render, which Jobs are the control pod's, and how to make a finding at a YAML path."""

    @property
    def policy(self) -> Policy | None: ...

    @property
    def rerender(self) -> str: ...

    def finding(
        self, severity: Severity, code: str, doc: _Doc | None, path: YamlPath, value: Any, rule: str, fix: str
    ) -> Finding: ...

    def is_control(self, doc: _Doc) -> bool: ...

    def is_control_replicated(self, doc: _Doc, index: int) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Pods:
    """The pod template of one Job (a plain Job, or one replicated Job of a JobSet)."""

    doc: _Doc
    job: YamlPath
    """Path of the Job's spec: ``spec`` or ``spec.replicatedJobs[i].template.spec``."""
    control: bool
    """The control pod's Job (``nvtrain control``), not the training pods'."""

    @property
    def jobset(self) -> bool:
        """A replicated Job of a JobSet, or of the JobSet template of a Trainer runtime."""
        return _jobset_root(self.doc.data) is not None

    @property
    def runtime(self) -> bool:
        """The pods of a Trainer runtime, whose training container is ``node``."""
        return self.doc.data.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime")

    @property
    def container_name(self) -> str:
        """What nvtrain names the training container: ``node`` in a runtime (Trainer's), else ``trainer``."""
        return NODE if self.runtime else CONTAINER

    @property
    def template(self) -> YamlPath:
        return (*self.job, "template")

    @property
    def spec(self) -> YamlPath:
        return (*self.job, "template", "spec")

    def get(self, *path: str | int) -> Any:
        return _get(self.doc.data, path)

    def labels(self) -> dict[str, Any]:
        found = self.get(*self.template, "metadata", "labels")
        return found if isinstance(found, dict) else {}

    def containers(self) -> list[Any]:
        found = self.get(*self.spec, "containers")
        return found if isinstance(found, list) else []

    def count(self) -> int | None:
        """Pods that run at once: ``parallelism`` (default 1) × the JobSet's ``replicas``."""
        parallelism = self.get(*self.job, "parallelism")
        parallelism = 1 if parallelism is _MISSING else parallelism
        replicas: Any = 1
        if self.jobset:
            replicas = self.get(*self.job[:-2], "replicas")
            replicas = 1 if replicas is _MISSING else replicas
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (parallelism, replicas)):
            return None
        return int(parallelism) * int(replicas)

    def what(self) -> str:
        """``the pods of Job x`` / ``the control pod of JobSet y``, for messages."""
        return f"the {'control pod' if self.control else 'training pods'} of {self.doc.label}"


def pods_of(checker: Checker, docs: Sequence[_Doc]) -> Iterator[Pods]:
    """The pod templates of every Job of ``docs``, and whether each is the control pod's."""
    for doc in docs:
        kind = doc.data.get("kind")
        if kind == "Job":
            yield Pods(doc, ("spec",), checker.is_control(doc))
        elif (root := _jobset_root(doc.data)) is not None:
            replicated = _get(doc.data, (*root, "replicatedJobs"))
            for i in range(len(replicated) if isinstance(replicated, list) else 0):
                at: YamlPath = (*root, "replicatedJobs", i, "template", "spec")
                yield Pods(doc, at, checker.is_control_replicated(doc, i))


def names_of(docs: Sequence[_Doc], kind: str) -> set[str]:
    """Names of the objects of kind ``kind`` in ``docs``."""
    return {
        name
        for d in docs
        if d.data.get("kind") == kind and isinstance(name := _get(d.data, ("metadata", "name")), str)
    }
