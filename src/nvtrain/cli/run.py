"""``nvtrain run``: the pod entrypoint, and a drop-in for ``torchrun``."""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperCommand

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import signal_exit_code

if TYPE_CHECKING:
    from nvtrain.config.schema import Policy

_HEARTBEAT = "NVRx's fault-tolerance settings are the policy's [heartbeat] table (docs/policy.md)"
_NOT_HERE = {
    "--rdzv-conf": "the rendezvous' timeouts are [rendezvous] join_timeout and dns_timeout",
    "--monitor-interval": "ft_launcher looks at its workers every 0.1 s and wakes at once when one "
    "exits; the heartbeat checks run every [heartbeat] monitor_interval",
    "--ft-cfg-path": "nvtrain writes NVRx's fault-tolerance config from the policy's [heartbeat] "
    "table (docs/policy.md); give the policy with --policy FILE",
    "--ft-initial-rank-heartbeat-timeout": "set [heartbeat] initial_timeout in the policy (--policy FILE)",
    "--ft-rank-heartbeat-timeout": "set [heartbeat] timeout in the policy (--policy FILE)",
    "--ft-workload-check-interval": "set [heartbeat] monitor_interval in the policy (--policy FILE)",
    "--ft-rank-section-timeouts": "set [heartbeat.sections] in the policy (--policy FILE)",
    "--ft-rank-out-of-section-timeout": "set [heartbeat] out_of_section_timeout (--policy FILE)",
    "--ft-restart-policy": "set [restart.in_job] policy in the policy (--policy FILE)",
    "--no-python": "nvtrain runs Python scripts and modules only (-m MODULE)",
    "--run-path": "the script runs as `python SCRIPT` would (nvtrain.entry), in a process of its own",
    "--start-method": "workers are processes forked from a warm interpreter, or new ones "
    "(--no-warm-start); there is no other start method",
    "--role": "every worker has the default role",
    "--logs-specs": "use --tee, --redirects and --log-dir",
}
_NOT_HERE.update({"--" + name[2:].replace("-", "_"): why for name, why in list(_NOT_HERE.items())})
"""torchrun and ft_launcher options that nvtrain run does not take, and what to do instead."""


def split_script_args(args: list[str], takes_value: Mapping[str, bool]) -> tuple[list[str], list[str] | None]:
    """``args`` cut after the training script (or ``-m MODULE``): (nvtrain's part, the script's
    arguments), as torchrun reads its command line; (args, None) when no script is named (a
    policy, or the demo). ``takes_value``: nvtrain's option names and whether each takes a value.
    A torchrun option that nvtrain replaces (``--rdzv-endpoint``...) is a ``ValueError``."""
    from nvtrain.launcher.overrides import is_script

    policy_given = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        if arg.startswith("-") and len(arg) > 1:
            name = arg.partition("=")[0] if arg.startswith("--") else arg[:2]
            if name in _NOT_HERE:
                raise ValueError(f"{name}: {_NOT_HERE[name]}")
            if name.startswith(("--ft-", "--ft_")):
                raise ValueError(f"{name}: {_HEARTBEAT}; other ft_launcher options are not taken")
            # "--opt=value" and "-rVALUE" carry their value; "--opt value" takes the next word.
            end = i + (2 if takes_value.get(name, False) and arg == name else 1)
            if name in ("-m", "--module"):
                return args[:end], args[end:]
            policy_given = policy_given or name == "--policy"
            i = end
            continue
        if policy_given or is_script(arg):
            return args[: i + 1], args[i + 1 :]
        break  # a policy: options may follow it, and script arguments after "--", as always
    return args, None


class RunCommand(TyperCommand):
    """``nvtrain run``'s parser: everything after the training script (or ``-m MODULE``) is the
    script's, verbatim, options included (torchrun's rule); otherwise click's usual parsing."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        takes_value: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if param.param_type_name == "option":
                flag = bool(getattr(param, "is_flag", False) or getattr(param, "count", False))
                takes_value.update(dict.fromkeys([*param.opts, *param.secondary_opts], not flag))
        try:
            head, rest = split_script_args(list(args), takes_value)
        except ValueError as exc:
            ctx.fail(str(exc))
        words = list(head)  # the parser consumes the list it is given
        try:
            remaining = super().parse_args(ctx, head)
        except Exception as exc:  # typer's own click, which it does not export: known by name
            policy = next((w for w in words if w.endswith(".toml") and not w.startswith("-")), None)
            if type(exc).__name__ != "NoSuchOption" or policy is None:
                raise
            option = str(getattr(exc, "option_name", ""))
            # After a policy file the script's own options need `--` (a script's words follow
            # the script itself); click's "did you mean" would suggest one of nvtrain's.
            at = words.index(option) if option in words else len(words)
            given = " ".join(words[at:])
            ctx.fail(
                f"No such option: {option}. Arguments for the training script go after "
                f"--: nvtrain run {policy} -- {given}"
            )
        if rest is not None:
            ctx.params["script_args"] = [*(ctx.params.get("script_args") or ()), *rest]
        return remaining


@exit_on_error
def command(
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="POLICY|SCRIPT",
            help="Policy file (TOML), or a training script (*.py). Default: the built-in CPU demo job.",
            show_default=False,
        ),
    ] = None,
    script_args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ARGS",
            help="Arguments for the training script: all words after SCRIPT or -m MODULE; after "
            "a policy file, after --.",
            show_default=False,
        ),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option("--policy", metavar="FILE", help="Policy for the SCRIPT or -m MODULE named after it."),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option("-m", "--module", metavar="MODULE", help="Run a Python module (python -m MODULE)."),
    ] = None,
    nproc_per_node: Annotated[
        str | None,
        typer.Option(
            "--nproc-per-node", "--nproc_per_node", metavar="N|gpu|cpu", help="[job] nproc_per_node."
        ),
    ] = None,
    nnodes: Annotated[
        str | None,
        typer.Option("--nnodes", metavar="N|MIN:MAX", help="[rendezvous] nodes (and min_nodes)."),
    ] = None,
    max_restarts: Annotated[
        int | None,
        typer.Option("--max-restarts", "--max_restarts", metavar="N", help="[restart.in_job] max_restarts."),
    ] = None,
    standalone: Annotated[
        bool, typer.Option("--standalone", help="One node, on a free port (unless --master-port).")
    ] = False,
    master_port: Annotated[
        int | None,
        typer.Option("--master-port", "--master_port", metavar="PORT", help="[rendezvous] port."),
    ] = None,
    no_warm_start: Annotated[
        bool,
        typer.Option(
            "--no-warm-start",
            help="[job] warm_start = false: every worker is a new interpreter (no warm-start server).",
        ),
    ] = False,
    tee: Annotated[
        str | None,
        typer.Option("-t", "--tee", metavar="0-3|R:N,...", help="ft_launcher's --tee (as torchrun's)."),
    ] = None,
    redirects: Annotated[
        str | None,
        typer.Option("-r", "--redirects", metavar="0-3|R:N,...", help="ft_launcher's --redirects."),
    ] = None,
    log_dir: Annotated[
        str | None,
        typer.Option("--log-dir", "--log_dir", metavar="DIR", help="ft_launcher's --log-dir."),
    ] = None,
    local_ranks_filter: Annotated[
        str | None,
        typer.Option(
            "--local-ranks-filter",
            "--local_ranks_filter",
            metavar="R,...",
            help="ft_launcher's --local-ranks-filter: the local ranks shown on the console.",
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v",
            "--verbose",
            help="Show all of ft_launcher's own log lines, not only its warnings and errors "
            "(all go to <run dir>/launcher-node<N>.log).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ft_launcher plan as JSON and exit.")
    ] = False,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            "--rdzv-id",
            "--rdzv_id",
            metavar="ID",
            help="Run id (default: NVTRAIN_RUN_ID; under Slurm <job>-slurm-<SLURM_JOB_ID>; a new one "
            "for a one-node job).",
        ),
    ] = None,
    node_rank: Annotated[
        int | None,
        typer.Option(
            "--node-rank",
            "--node_rank",
            metavar="N",
            min=0,
            help="This node's index, 0 to nodes-1 (default: NVTRAIN_NODE_RANK, JOB_COMPLETION_INDEX, "
            "SLURM_NODEID, the pod's name).",
        ),
    ] = None,
    master_addr: Annotated[
        str | None,
        typer.Option(
            "--master-addr",
            "--master_addr",
            metavar="HOST",
            help="[rendezvous] host: node 0's address or name, where the store listens (bare metal).",
        ),
    ] = None,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(
            "--rdzv-endpoint",
            "--rdzv_endpoint",
            metavar="HOST[:PORT]",
            help="[rendezvous] host (and port): as --master-addr HOST --master-port PORT.",
        ),
    ] = None,
    rdzv_backend: Annotated[
        str | None,
        typer.Option(
            "--rdzv-backend",
            "--rdzv_backend",
            metavar="c10d|static",
            help="Taken for torchrun's sake: the rendezvous is always NVRx's c10d, hosted by node 0.",
        ),
    ] = None,
    local_addr: Annotated[
        str | None,
        typer.Option(
            "--local-addr",
            "--local_addr",
            metavar="ADDR",
            help="The address this node gives its peers (default: POD_IP, SLURMD_NODENAME, or this "
            "node's address on the route to --master-addr).",
        ),
    ] = None,
) -> None:
    """Run the training job of POLICY on this node under ft_launcher, supervised; or run a
    torchrun script.

    \b
      nvtrain run POLICY.toml [-- ARGS]          the job a policy file describes
      nvtrain run [OPTIONS] train.py [ARGS]      a torchrun script, with a default policy
      nvtrain run [OPTIONS] -m MODULE [ARGS]     the same, for a module
      nvtrain run --policy FILE train.py [ARGS]  a script with a policy's settings
      nvtrain run                                the built-in CPU demo job

    A SCRIPT is a name ending in .py (or a file whose first line is a python shebang). All
    that follows SCRIPT or -m MODULE goes to it verbatim, options included, so nvtrain's
    options come before it. Without --policy the script runs as one node, 1 worker (see
    --nproc-per-node), nvtrain's defaults otherwise (5 in-job restarts); its events log (and
    checkpoints) go to $TMPDIR/nvtrain/<run id>/.

    torchrun's flags --nproc-per-node, --nnodes, --max-restarts, --standalone,
    --master-port, --master-addr and --rdzv-endpoint override the policy (the command line
    beats the file) and are checked as the file is; --tee, --redirects, --log-dir and
    --local-ranks-filter go to ft_launcher. Each takes torchrun's underscore spelling too
    (--nproc_per_node).

    Off Kubernetes, start one nvtrain run per node: on bare metal with --nnodes N
    --node-rank I --master-addr NODE0 --rdzv-id ID (as torchrun); under Slurm with srun
    --ntasks-per-node=1 nvtrain run ..., which reads the node rank, the node count, node 0
    and the run id from Slurm's variables.

    A one-node job that sets no [rendezvous] port gets a free port, so several run side by
    side on one machine; a multi-node job uses 29500 unless the policy sets one.

    Exit 0 finished; 1 failed with the restart budget spent; 2 invalid policy or usage; 3 peers
    not found in time; 4 the same fault repeats without progress; 128+N stopped by signal N.
    """
    from nvtrain.launcher.identity import identify, on_kubernetes, slurm_step
    from nvtrain.launcher.overrides import check_gpu_workers, launcher_options, on_this_node, resolve_run
    from nvtrain.launcher.rundir import prepare
    from nvtrain.launcher.supervisor import supervise

    resolved = resolve_run(
        target=target,
        args=tuple(script_args or ()),
        policy_file=policy_file,
        module=module,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        max_restarts=max_restarts,
        standalone=standalone,
        master_port=master_port,
        no_warm_start=no_warm_start,
        master_addr=master_addr,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        slurm=slurm_step(),
        on_pod=on_kubernetes(),
    )
    options = launcher_options(
        tee=tee, redirects=redirects, log_dir=log_dir, local_ranks_filter=local_ranks_filter
    )
    identity = identify(resolved.policy, run_id=run_id, node_rank=node_rank, local_addr=local_addr)
    policy = on_this_node(resolved.policy, identity.has_gpu)
    plan, paths = prepare(policy, identity, extra_args=resolved.extra_args, launcher_options=options)
    if dry_run:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
        _show_wrapper_plan(policy, identity.has_gpu)
        return
    check_gpu_workers(policy, identity.has_gpu, "--nproc-per-node gpu" if nproc_per_node == "gpu" else None)
    if plan.is_host and not resolved.port_chosen:
        from nvtrain.launcher.ports import check_rendezvous_port

        port = resolved.policy.rendezvous.port
        given = f"--master-port {port}" if master_port is not None else None
        if rdzv_endpoint is not None and master_port is None:
            given = f"--rdzv-endpoint {rdzv_endpoint}"
        check_rendezvous_port(port, flag=given)
    from nvtrain.cli.render.events import event_reporter

    try:
        outcome = supervise(plan, policy, identity, paths, report=event_reporter(), verbose=verbose)
    except KeyboardInterrupt:
        raise typer.Exit(signal_exit_code(signal.SIGINT)) from None
    raise typer.Exit(outcome.exit_code)


def _show_wrapper_plan(policy: Policy, has_gpu: bool) -> None:
    """What the workers will pass to NVRx's in-process ``Wrapper`` (``--dry-run``), for the
    NVRx installed here (its version from package metadata: NVRx is not imported)."""
    from nvtrain.cli.render.wrapper_plan import print_wrapper_plan
    from nvtrain.config.wrapper_plan import WrapperFeatures, plan_wrapper
    from nvtrain.launcher.plan import uses_worker_library
    from nvtrain.nvrx import installed_nvrx

    if not policy.restart.in_process.enabled:
        print_wrapper_plan(None, "")
        return
    if not uses_worker_library(policy.job):
        print_wrapper_plan(None, "", "the script does not use nvtrain's worker library, nvtrain.worker.run")
        return
    version = installed_nvrx()
    features = WrapperFeatures.of_version(version)
    if version is None:
        nvrx = "no NVRx installed here (what depends on its version is marked)"
    elif features.last_call_wait is None:
        nvrx = f"NVRx {version} (not a tested version: what depends on it is marked)"
    else:
        nvrx = f"NVRx {version} (installed)"
    world = policy.world_size()
    print_wrapper_plan(plan_wrapper(policy, world=world, has_gpu=has_gpu, features=features), nvrx)
