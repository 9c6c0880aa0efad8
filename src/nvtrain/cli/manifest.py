"""``nvtrain manifest``: the Kubernetes objects of a policy (Jobs or JobSet, Service, NetworkPolicy).

The options that shape the manifests are declared once, as the fields of
``nvtrain.kube.options.ManifestOptions`` (each with its ``Flag``: name, metavar, help, panel);
this module turns them into the command's options, in field order, and adds its own: the policy
argument, ``--output`` and ``--owner-script``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import UsageError
from nvtrain.kube.options import PLATFORM_PANEL, ManifestOptions, flag_of

P = ParamSpec("P")
R = TypeVar("R")

_CLI_TYPES: dict[str, Any] = {
    "pairs": list[str] | None,
    "counts": list[str] | None,
    "list": list[str] | None,
    "yaml": Path | None,
    "yaml-list": list[Path] | None,
}
"""The command-line type of a ``Flag`` by its ``parse`` (a ``value`` flag has its field's type)."""

_KEYWORD = inspect.Parameter.KEYWORD_ONLY

_POLICY = inspect.Parameter(
    "policy",
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    annotation=Annotated[Path, typer.Argument(help="Policy file (TOML).", show_default=False)],
)
_OUTPUT = inspect.Parameter(
    "output",
    _KEYWORD,
    default=None,
    annotation=Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.")
    ],
)
_OWNER_SCRIPT = inspect.Parameter(
    "owner_script",
    _KEYWORD,
    default=None,
    annotation=Annotated[
        Path | None,
        typer.Option(
            "--owner-script",
            metavar="FILE",
            help="Also write a shell script to run after `kubectl apply`: it makes the Job (or JobSet) "
            "own the other objects, so they are deleted with it.",
            rich_help_panel=PLATFORM_PANEL,
        ),
    ],
)
_AFTER = {"nvrx_version": _OUTPUT, "jobset": _OWNER_SCRIPT}
"""The command's own options, each listed after the field's option that it follows in ``--help``."""


def _signature() -> inspect.Signature:
    """The policy argument, then an option per field of ``ManifestOptions`` (with the command's
    own options in their places)."""
    hints = typing.get_type_hints(ManifestOptions)
    parameters = [_POLICY]
    for field in dataclasses.fields(ManifestOptions):
        flag = flag_of(field)
        kind = hints[field.name] if flag.parse == "value" else _CLI_TYPES[flag.parse]
        option = typer.Option(flag.name, metavar=flag.metavar, help=flag.help, rich_help_panel=flag.panel)
        default = field.default if flag.parse == "value" else None
        parameters.append(
            inspect.Parameter(field.name, _KEYWORD, default=default, annotation=Annotated[kind, option])
        )
        if field.name in _AFTER:
            parameters.append(_AFTER[field.name])
    return inspect.Signature(parameters, return_annotation=None)


def _with_signature(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, which takes the flags as keywords, with the signature that typer reads."""
    function.__dict__["__signature__"] = _signature()
    return function


@exit_on_error
@_with_signature
def command(
    policy: Path, *, output: Path | None = None, owner_script: Path | None = None, **flags: Any
) -> None:
    """Render the Kubernetes objects of POLICY as YAML: ConfigMap (the policy), headless Service,
    NetworkPolicy and an Indexed Job that runs `nvtrain run` on every node; with
    `[rendezvous] store = "control"` also a Job `<job>-control` that runs `nvtrain control`
    (with --jobset, a replicated Job of the JobSet); a PodMonitor and a Volcano PodGroup on request.
    With --trainer-runtime, a Kubeflow Trainer v2 runtime instead of the Job and the Service.

    Names, namespace, nodes, port, grace period and checkpoint mount come from the policy.
    Exit 2 on an invalid policy or options.
    """
    from nvtrain.kube.manifest import manifest_from_file
    from nvtrain.kube.yaml_io import read_yaml_option

    if output is not None:
        from nvtrain.cli._paths import refuse_overwrite

        refuse_overwrite("--output", output, {"the policy file": policy})
    if owner_script is not None:
        from nvtrain.cli._paths import refuse_overwrite

        taken = {"the policy file": policy, **({"--output": output} if output is not None else {})}
        refuse_overwrite("--owner-script", owner_script, taken)
    options = ManifestOptions.from_flags(flags, read_yaml_option)
    rendered = manifest_from_file(policy, options)
    if owner_script is not None:
        from nvtrain.kube.ownership import owner_script as script_of

        text = script_of(rendered.objects, str(output) if output is not None else "<manifest>")
        try:
            owner_script.write_text(text, encoding="utf-8")
            owner_script.chmod(0o755)
        except OSError as exc:
            raise UsageError(
                f"cannot write {owner_script}: {exc.strerror or exc}", "check the path"
            ) from None
    from nvtrain.cli.render.console import visible

    for note in rendered.notes:
        typer.echo(f"nvtrain: note: {visible(note)}", err=True)
    if output is None:
        typer.echo(rendered.text, nl=False)
        return
    try:
        output.write_text(rendered.text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}", "check the path") from None
    from nvtrain.cli.render.manifest import print_manifest_written

    print_manifest_written(str(output), rendered.summary())
