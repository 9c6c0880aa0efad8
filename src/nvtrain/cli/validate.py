"""``nvtrain validate``: check a policy before a GPU is allocated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import ExitCode


@exit_on_error
def command(
    policy: Annotated[
        Path | None,
        typer.Argument(help="Policy file (TOML). Default: the built-in demo policy.", show_default=False),
    ] = None,
    timings: Annotated[
        Path | None,
        typer.Option(
            "--timings",
            metavar="FILE",
            help="Measured timings to check the timeouts against: a TOML/JSON timings file, or a run "
            "directory (or one events log) to measure them from.",
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            metavar="FILE",
            help="Rendered manifest (YAML) to check against the policy and the timings. Without "
            "POLICY, the policy in its ConfigMap is checked, for the NVRx version it records.",
        ),
    ] = None,
    nvrx: Annotated[
        str | None,
        typer.Option(
            "--nvrx",
            metavar="VERSION",
            help="NVRx version to check for (default: the one the --manifest records, else the "
            "installed one).",
        ),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when there are warnings.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print findings as JSON.")] = False,
) -> None:
    """Check a policy: every problem at once, with line, key, value, rule and fix.

    Exit 0 when valid, 2 on errors, 1 on warnings with --strict.
    """
    from nvtrain.config.validation import effective_settings, validate_file
    from nvtrain.kube.nvrx_pin import parse_nvrx_option
    from nvtrain.tuning.sources import read_timings_or_log

    version = parse_nvrx_option(nvrx) if nvrx is not None else None
    measured, problems = (None, []) if timings is None else read_timings_or_log(timings)
    if manifest is not None:
        from nvtrain.kube.manifest_checks import validate_manifest

        result = validate_manifest(
            policy, manifest, nvrx=version, timings=measured, timings_findings=problems
        )
    else:
        from nvtrain.config.paths import resolve_relative

        result = validate_file(
            policy, nvrx=version or "installed", timings=measured, timings_findings=problems
        )
        result = resolve_relative(result, Path.cwd())  # a relative [checkpoint] dir, as `run` reads it
    code = ExitCode.OK
    if result.errors or result.policy is None:
        code = ExitCode.USAGE
    elif strict and result.warnings:
        code = ExitCode.FAILED
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "source": result.source,
                    "valid": result.ok,
                    "nvrx": str(result.nvrx) if result.nvrx else None,
                    "errors": len(result.errors),
                    "warnings": len(result.warnings),
                    "findings": [f.to_dict() for f in result.findings],
                },
                indent=2,
            )
        )
        raise typer.Exit(int(code))

    from nvtrain.cli.render.findings import print_findings
    from nvtrain.cli.render.settings import print_settings

    if result.findings:
        checked = result.source if timings is None else f"{result.source} with timings {timings}"
        print_findings(checked, result.findings)
    if result.policy is not None and not result.errors:
        nvrx_text = f"NVRx {result.nvrx}" if result.nvrx else "NVRx not checked"
        print_settings(
            f"{result.source} is valid ({nvrx_text}); effective policy:",
            effective_settings(result.policy, result.data),
        )
    raise typer.Exit(int(code))
