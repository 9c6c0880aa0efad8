"""Relative paths of a policy, resolved against the folder a command started in.

A torchrun user who writes ``[checkpoint] dir = "ckpt"`` means "here": the folder ``nvtrain run``
starts in. The commands that start in that folder, ``nvtrain run`` and ``nvtrain validate``,
resolve it with ``resolve_relative`` before they use or show the policy, so the workers (which
may start elsewhere) get an absolute path and validate shows the one ``run`` would use. What is
read for a Kubernetes pod is not resolved: a volume's ``mountPath`` is absolute, and the checks
(``checks_checkpoint.checkpoint``) keep refusing a relative ``[checkpoint] dir`` there (``nvtrain
manifest``, ``validate --manifest``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvtrain.config.validation import Validation
from nvtrain.findings import Finding, toml_value

__all__ = ["relative_checkpoint_dir", "resolve_path", "resolve_relative"]

_CODE = "checkpoint-dir"
"""The finding of a relative ``[checkpoint] dir``: an error from the checks, an info once resolved."""


def resolve_path(path: str, cwd: Path) -> str:
    """``path`` as written when it is absolute, else ``cwd / path`` normalised
    (``./ckpt/../ckpts`` in ``/work`` -> ``/work/ckpts``)."""
    return path if path.startswith("/") else os.path.normpath(cwd / path)


def relative_checkpoint_dir(data: Mapping[str, Any]) -> str | None:
    """The written ``[checkpoint] dir`` when it is a relative path that can be resolved (a
    string, not empty, without a NUL character); None otherwise."""
    table = data.get("checkpoint")
    folder = table.get("dir") if isinstance(table, dict) else None
    if not isinstance(folder, str) or not folder or folder.startswith("/") or "\0" in folder:
        return None
    return folder


def resolve_relative(result: Validation, cwd: Path) -> Validation:
    """``result`` as a command started in ``cwd`` reads it: a relative ``[checkpoint] dir``
    resolved against ``cwd`` in the policy and in the written keys (``data``), and the checks'
    error about it replaced by an info finding that shows the resolved path. Anything else is
    kept as it is, every other finding included."""
    folder = relative_checkpoint_dir(result.data)
    if folder is None:
        return result
    resolved = resolve_path(folder, cwd)
    refused = [f for f in result.findings if _about_relative_dir(f)]
    kept = [f for f in result.findings if not _about_relative_dir(f)]
    at = refused[0] if refused else Finding("info", _CODE, "checkpoint", "dir", "", "", file=result.source)
    note = dataclasses.replace(
        at,
        severity="info",
        value=toml_value(folder),
        rule=f"relative: resolved against the folder nvtrain started in, here {resolved}",
        fix="none needed to run from here (`nvtrain run` resolves it alike); a Kubernetes pod "
        "needs the checkpoint volume's absolute path",
    )
    data = dict(result.data)
    data["checkpoint"] = {**result.data["checkpoint"], "dir": resolved}
    policy = result.policy
    if policy is not None:
        checkpoint = policy.checkpoint.model_copy(update={"dir": resolved})
        policy = policy.model_copy(update={"checkpoint": checkpoint})
    findings = sorted([*kept, note], key=Finding.sort_key)
    return dataclasses.replace(result, policy=policy, findings=findings, data=data)


def _about_relative_dir(f: Finding) -> bool:
    return (f.code, f.table, f.key, f.severity) == (_CODE, "checkpoint", "dir", "error")
