"""Schemas of the custom resources ``nvtrain manifest`` renders besides the JobSet: the
Prometheus Operator's PodMonitor (``--pod-monitor``) and Volcano's PodGroup (``--scheduler-name
volcano``).

kubernetes-validate knows only built-in kinds (it raises ``SchemaNotFoundError`` for these), and
the CRDs are not packaged for Python, so, as for the JobSet (``templates_helpers.JOBSET_SCHEMA``),
the fields that nvtrain renders are written out here with the types, patterns and required
fields of the CRDs' ``openAPIV3Schema`` (monitoring.coreos.com/v1 PodMonitor of
prometheus-operator 0.91; scheduling.volcano.sh/v1beta1 PodGroup of Volcano 1.x). Fields that
nvtrain does not render are refused, so that a new one gets a check.
"""

from __future__ import annotations

from typing import Any

import jsonschema

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_QUALIFIED = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
_LABEL_VALUE = rf"^({_NAME})?$"
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63},
        "namespace": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63},
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": _QUALIFIED},
            "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE},
        },
    },
}

PODMONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "minProperties": 1,
                            "propertyNames": {"pattern": _QUALIFIED},
                            "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE},
                        }
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            # The name of a container port (an IANA_SVC_NAME: at most 15 characters).
                            "port": {"type": "string", "minLength": 1, "maxLength": 15},
                            "path": {"type": "string", "pattern": "^/"},
                        },
                    },
                },
            },
        },
    },
}

PODGROUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "scheduling.volcano.sh/v1beta1"},
        "kind": {"const": "PodGroup"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["minMember"],
            "additionalProperties": False,
            "properties": {
                "minMember": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                "queue": {"type": "string", "minLength": 1},
                "priorityClassName": {"type": "string", "minLength": 1},
            },
        },
    },
}

SCHEMAS = {"PodMonitor": PODMONITOR_SCHEMA, "PodGroup": PODGROUP_SCHEMA}


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Problems of a PodMonitor or PodGroup against its schema above."""
    schema = SCHEMAS[obj["kind"]]
    name = obj.get("metadata", {}).get("name")
    return [
        f"{obj['kind']} {name} {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)
    ]
