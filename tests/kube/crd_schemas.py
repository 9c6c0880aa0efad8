"""Schemas of the custom resources ``nvtrain manifest`` renders, from the upstream CRDs.

kubernetes-validate knows only built-in kinds, and the CRDs are not packaged for Python, so the
CRD files of pinned releases are kept in ``crds/`` (gzipped, byte for byte as upstream ships
them; ``crds/README.md`` says where each comes from, with its release, commit and SHA-256, which
``crd_file`` checks on every read). Each object is checked against the ``openAPIV3Schema`` of its
``apiVersion`` in the CRD, made strict as ``kubectl apply`` (field validation ``Strict``, the
default) is: a field the schema does not declare is an error, not silently pruned. Its
``metadata`` is checked as the API server does for every object, against the ObjectMeta of the
Kubernetes schema (kubernetes-validate, through a ConfigMap that carries it).

What the API server checks beyond the OpenAPI schema is not checked here: the CEL rules
(``x-kubernetes-validations``) and the projects' validating webhooks (the JobSet webhook's name
rules are checked by ``nvtrain validate --manifest``, ``manifest-jobset-name``).
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kv

CRDS = Path(__file__).resolve().parent / "crds"

PINNED: dict[str, tuple[str, str]] = {
    # kind: (file in crds/, SHA-256 of the uncompressed YAML as upstream ships it)
    "JobSet": (
        "jobset.x-k8s.io_jobsets.yaml.gz",
        "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe",
    ),
    "PodGroup": (
        "scheduling.volcano.sh_podgroups.yaml.gz",
        "c297c0fdcf00cea6a35daa2b6153a8590b56df0e22a96dbfa44f773814685017",
    ),
    "PodMonitor": (
        "monitoring.coreos.com_podmonitors.yaml.gz",
        "45a93443daa687d3654f7e9631909ff7edcdf3ec09c5e60251b74aa2722aee5d",
    ),
    "PrometheusRule": (
        "monitoring.coreos.com_prometheusrules.yaml.gz",
        "78be98554b9c8506ab2b4f4feb91c5f3a56e536a0a510f3a8e876a459970d56d",
    ),
    "ClusterTrainingRuntime": (
        "trainer.kubeflow.org_clustertrainingruntimes.yaml.gz",
        "ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9",
    ),
    "TrainingRuntime": (
        "trainer.kubeflow.org_trainingruntimes.yaml.gz",
        "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
    ),
}

SCHEMAS = frozenset(PINNED)
"""The kinds checked here (``templates_helpers.object_errors`` sends the others to
kubernetes-validate)."""

METADATA_VERSION = kv.major_minor(kv.latest_version())


@functools.cache
def crd_file(kind: str, directory: Path = CRDS) -> dict[str, Any]:
    """The CRD of ``kind``, after checking that the file is still the pinned upstream one."""
    name, digest = PINNED[kind]
    raw = gzip.decompress((directory / name).read_bytes())
    found = hashlib.sha256(raw).hexdigest()
    assert found == digest, (
        f"crds/{name} is not the pinned upstream file (sha256 {found}); see crds/README.md"
    )
    crd: dict[str, Any] = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind, name
    return crd


def _strict(schema: Any) -> Any:
    """The OpenAPI v3 ``schema`` of a CRD as a JSON Schema that refuses what the API server
    refuses: ``nullable`` allows null; an object that declares its ``properties`` (and neither
    ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields``) takes no other field;
    a ``set`` list has unique items."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: ({p: _strict(s) for p, s in v.items()} if k == "properties" else _strict(v))
        for k, v in schema.items()
        if k not in ("description", "default")
    }
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


@functools.cache
def crd_schema(kind: str, api_version: str) -> dict[str, Any] | None:
    """The strict JSON Schema of ``kind`` at ``api_version`` (``group/version``), or None when
    the pinned CRD serves no such version."""
    crd = crd_file(kind)
    group, _, version = api_version.partition("/")
    if group != crd["spec"]["group"]:
        return None
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served.get("served", False):
            schema: dict[str, Any] = copy.deepcopy(served["schema"]["openAPIV3Schema"])
            return dict(_strict(schema))
    return None


def _metadata_errors(obj: dict[str, Any]) -> list[str]:
    """The object's ``metadata`` against Kubernetes' ObjectMeta (strict), as the API server
    checks every object's."""
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata")}
    try:
        kv.validate(carrier, METADATA_VERSION, strict=True)
    except kv.ValidationError as exc:
        return [f"{exc.json_path}: {exc.message}"]
    return []


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Problems of a custom resource against the schema of its pinned upstream CRD."""
    kind = obj.get("kind")
    name = (obj.get("metadata") or {}).get("name")
    schema = crd_schema(str(kind), str(obj.get("apiVersion")))
    if schema is None:
        return [f"{kind} {name}: apiVersion {obj.get('apiVersion')!r} is not served by the pinned CRD"]
    errors = [
        f"{kind} {name} {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    return errors + [f"{kind} {name} {e}" for e in _metadata_errors(obj)]
