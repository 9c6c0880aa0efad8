"""Helpers of the template tests: policies from text, schema validation, golden files."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml
from crd_schemas import SCHEMAS, crd_errors
from kubernetes_validate import utils as kv

from nvtrain.config import Policy, validate_source
from nvtrain.kube.init import starter_text

GOLDEN = Path(__file__).resolve().parent / "golden"

# kubernetes-validate reads and parses its (large, bundled) schema files on every call; read each
# once per session instead (the parsed schemas are not modified). 10x faster, same checks.
if not hasattr(kv.schema_contents, "cache_clear"):
    kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

# Read when this module is imported: the autouse fixture in conftest.py removes NVTRAIN_*
# variables before each test runs.
UPDATE = os.environ.get("NVTRAIN_UPDATE_GOLDEN") == "1"

OLDEST = "1.28"
"""The oldest Kubernetes the manifests support (podFailurePolicy and Indexed Jobs are GA or
on by default there; the controller-uid label exists since 1.27)."""

KUBERNETES_VERSIONS = (OLDEST, kv.major_minor(kv.latest_version()))
"""Schemas every rendered object is checked against: 1.28 and the newest that the installed
kubernetes-validate ships."""

MINIMAL = """\
[job]
name = "llm-train"
script = "train.py"
"""


def policy_of(text: str) -> Policy:
    """The policy of ``text``; fails the test on any error finding."""
    result = validate_source(text, "test policy", nvrx=None)
    errors = [f"{f.where}: {f.rule}" for f in result.errors]
    assert result.policy is not None and not errors, errors
    return result.policy


def set_keys(text: str, values: dict[tuple[str, str], str]) -> str:
    """``text`` with ``key = ...`` in ``[table]`` set to each TOML value (commented keys are
    uncommented); every key must be found once."""
    lines = text.splitlines()
    table = ""
    done: set[tuple[str, str]] = set()
    for i, line in enumerate(lines):
        header = re.match(r"^\[([\w.]+)\]\s*$", line)
        if header:
            table = header.group(1)
            continue
        assign = re.match(r"^(?:#\s*)?(\w+) = ", line)
        if assign and (table, assign.group(1)) in values:
            key = (table, assign.group(1))
            assert key not in done, f"{key} twice"
            lines[i] = f"{key[1]} = {values[key]}"
            done.add(key)
    assert done == set(values), f"not found: {set(values) - done}"
    return "\n".join(lines) + "\n"


def with_control_store(text: str) -> str:
    """``text`` with ``store = "control"`` in its ``[rendezvous]`` table (which it must have)."""
    if re.search(r"^(#\s*)?store = ", text, re.MULTILINE):
        return set_keys(text, {("rendezvous", "store"): '"control"'})
    assert text.count("\n[rendezvous]\n") == 1, "no [rendezvous] table"
    return text.replace("\n[rendezvous]\n", '\n[rendezvous]\nstore = "control"\n')


CONTROL = MINIMAL + 'nproc_per_node = 8\n[rendezvous]\nnodes = 4\nstore = "control"\n'
"""4 pods of 8 GPUs and the rendezvous store in a control pod of its own."""


def starter_two_nodes() -> str:
    """The starter policy on 2 pods: the multi-node job the manifest tests render (the starter
    leaves ``[rendezvous] nodes`` unset, a derived default: 1 node)."""
    return set_keys(starter_text("policy.toml"), {("rendezvous", "nodes"): "2"})


def starter_named(name: str) -> str:
    return set_keys(starter_two_nodes(), {("job", "name"): f'"{name}"'})


def schema_errors(obj: dict[str, Any], version: str) -> str | None:
    """None when ``obj`` is valid against the (strict) schema of Kubernetes ``version``."""
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as exc:
        return (
            f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}) {exc.json_path}: {exc.message}"
        )
    return None


def jobset_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Problems of a JobSet: against the schema of the pinned upstream JobSet CRD
    (``crd_schemas``), and each replicated Job's template wrapped as a ``batch/v1`` Job against
    the strict schema of Kubernetes ``version`` (which knows more of the pod than the CRD)."""
    name = obj.get("metadata", {}).get("name")
    return crd_errors(obj) + replicated_job_errors(obj, obj.get("spec"), str(name), version)


def runtime_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Problems of a Trainer runtime: against its pinned upstream CRD, and the replicated Jobs
    of its JobSet template as in ``jobset_errors`` (named as Trainer names them for a TrainJob
    named after the runtime)."""
    name = obj.get("metadata", {}).get("name")
    template = obj.get("spec", {}).get("template", {})
    jobset_spec = template.get("spec") if isinstance(template, dict) else None
    return crd_errors(obj) + replicated_job_errors(obj, jobset_spec, str(name), version)


def replicated_job_errors(obj: dict[str, Any], jobset_spec: Any, name: str, version: str) -> list[str]:
    """Each replicated Job of ``jobset_spec`` (of the JobSet, or JobSet template, ``obj``)
    as a ``batch/v1`` Job of the JobSet ``name`` against Kubernetes ``version``."""
    errors: list[str] = []
    replicated_jobs = jobset_spec.get("replicatedJobs") if isinstance(jobset_spec, dict) else None
    for replicated in replicated_jobs if isinstance(replicated_jobs, list) else []:
        if not isinstance(replicated, dict) or not {"name", "template"} <= set(replicated):
            continue  # the CRD's finding
        template = replicated["template"]
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
            continue
        job_name = f"{name}-{replicated['name']}-{replicated.get('replicas', 1) - 1}"
        # JobSet names pod i of Job j <jobset>-<replicated job>-<j>-<i>, and each must be a DNS label.
        last_pod = f"{job_name}-{template['spec'].get('completions', 1) - 1}"
        if len(last_pod) > 63:
            errors.append(f"{obj['kind']} {name}: pod name {last_pod} is longer than 63 characters")
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {**template.get("metadata", {}), "name": job_name},
            "spec": template["spec"],
        }
        if "namespace" in obj.get("metadata", {}):
            job["metadata"]["namespace"] = obj["metadata"]["namespace"]
        problem = schema_errors(job, version)
        if problem:
            errors.append(f"{obj['kind']} {name} replicated job {replicated['name']}: {problem}")
    return errors


def object_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Problems of any rendered object: the JobSet as above, the other custom resources against
    their upstream CRDs (``crd_schemas``), the built-in kinds by kubernetes-validate."""
    if obj["kind"] == "JobSet":
        return jobset_errors(obj, version)
    if obj["kind"] in ("ClusterTrainingRuntime", "TrainingRuntime"):
        return runtime_errors(obj, version)
    if obj["kind"] in SCHEMAS:
        return crd_errors(obj)
    problem = schema_errors(obj, version)
    return [problem] if problem else []


def load_all(text: str) -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(text))
    assert all(isinstance(d, dict) for d in docs), docs
    return docs


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>`` (rewrite it with NVTRAIN_UPDATE_GOLDEN=1)."""
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: run NVTRAIN_UPDATE_GOLDEN=1 pytest tests/kube"
    assert text == path.read_text(encoding="utf-8"), (
        f"the rendered manifest differs from {path.name}; if the change is intended, regenerate with "
        "NVTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/kube and read the diff"
    )
