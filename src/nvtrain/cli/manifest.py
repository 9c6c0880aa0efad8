"""``nvtrain manifest``: the Kubernetes objects of a policy (Jobs or JobSet, Service, NetworkPolicy)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import UsageError

_POD = "Pod"
_PLATFORM = "Scheduling and security"


def _pairs(flag: str, items: list[str] | None) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r} is not KEY=VALUE", f"write e.g. {flag} name=value")
        pairs[key] = value
    return pairs


def _counts(flag: str, items: list[str] | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in _pairs(flag, items).items():
        if not value.isdigit():
            raise UsageError(
                f"{flag} {key}={value!r}: the count is not a whole number", f"e.g. {flag} {key}=1"
            )
        counts[key] = int(value)
    return counts


def _init_containers(files: list[Path] | None, read: Callable[[str, Path], Any]) -> tuple[Any, ...]:
    """The containers of the ``--init-container`` files (each one container, or a list)."""
    found: list[Any] = []
    for path in files or []:
        data = read("--init-container", path)
        found += data if isinstance(data, list) else [data]
    return tuple(found)


@exit_on_error
def command(
    policy: Annotated[Path, typer.Argument(help="Policy file (TOML).", show_default=False)],
    image: Annotated[
        str | None,
        typer.Option("--image", metavar="IMAGE", help="Training image (default: <job name>:latest)."),
    ] = None,
    nvrx: Annotated[
        str | None,
        typer.Option(
            "--nvrx",
            metavar="VERSION",
            help="NVRx version in the image (its Dockerfile's NVRX_VERSION): the policy is checked "
            "against it, and the pods record it for `nvtrain validate --manifest`.",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.")
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            metavar="N",
            help="GPUs per pod (default: nproc_per_node of the policy; 0 with gloo).",
            rich_help_panel=_POD,
        ),
    ] = None,
    efa: Annotated[
        int, typer.Option("--efa", metavar="N", help="AWS EFA devices per pod.", rich_help_panel=_POD)
    ] = 0,
    resource: Annotated[
        list[str] | None,
        typer.Option(
            "--resource",
            metavar="NAME=COUNT",
            help="Another extended resource per pod, e.g. nvidia.com/mig-3g.40gb=1 (repeatable); "
            "names holding rdma or hca (rdma/hca_shared_devices_a=1) are RDMA devices (IPC_LOCK).",
            rich_help_panel=_POD,
        ),
    ] = None,
    rdma_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--rdma-resource",
            metavar="NAME=COUNT",
            help="An extended resource per pod that is an RDMA device whatever its name: the "
            "training container gets IPC_LOCK (repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    cpu: Annotated[
        str | None,
        typer.Option(
            "--cpu", metavar="QUANTITY", help="CPU request (default: 2 per rank).", rich_help_panel=_POD
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            metavar="QUANTITY",
            help="Memory request and limit (default: 16Gi per rank + /dev/shm + host copies).",
            rich_help_panel=_POD,
        ),
    ] = None,
    qos: Annotated[
        str,
        typer.Option(
            "--qos",
            metavar="CLASS",
            help="burstable (no CPU limit) or guaranteed (every limit equal to its request).",
            rich_help_panel=_POD,
        ),
    ] = "burstable",
    shm_size: Annotated[
        str,
        typer.Option(
            "--shm-size", metavar="QUANTITY", help="Size of /dev/shm (memory).", rich_help_panel=_POD
        ),
    ] = "16Gi",
    state_per_rank: Annotated[
        str | None,
        typer.Option(
            "--state-per-rank",
            metavar="QUANTITY",
            help="Checkpoint state (model + optimizer) of one rank: adds memory for the host "
            "copies per rank that [checkpoint] memory_dir keeps (2, or 3 with peer_copy and 2+ pods).",
            rich_help_panel=_POD,
        ),
    ] = None,
    checkpoint_pvc: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-pvc",
            metavar="NAME",
            help="ReadWriteMany claim mounted at the checkpoint dir (default: <job name>-checkpoints).",
            rich_help_panel=_POD,
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            metavar="NAME=VALUE",
            help="Extra environment variable (repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--node-selector",
            metavar="KEY=VALUE",
            help="Node label the pods need (repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", metavar="KEY=VALUE", help="Extra label on every object (repeatable)."),
    ] = None,
    annotation: Annotated[
        list[str] | None,
        typer.Option(
            "--annotation",
            metavar="KEY=VALUE",
            help="Extra annotation on every pod (repeatable).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(
            "--toleration",
            metavar="KEY[=VALUE]:EFFECT",
            help="Toleration of every pod, e.g. dedicated=ml:NoSchedule (repeatable).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    priority_class: Annotated[
        str | None,
        typer.Option(
            "--priority-class", metavar="NAME", help="PriorityClass of the pods.", rich_help_panel=_PLATFORM
        ),
    ] = None,
    scheduler_name: Annotated[
        str | None,
        typer.Option(
            "--scheduler-name",
            metavar="NAME",
            help="Scheduler of the pods; volcano also renders a PodGroup of every pod.",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            metavar="NAME",
            help="Kueue LocalQueue (or, with --scheduler-name volcano, Volcano queue).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    service_account: Annotated[
        str | None,
        typer.Option(
            "--service-account",
            metavar="NAME",
            help="ServiceAccount of the pods (its API token stays unmounted).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    pod_security: Annotated[
        str | None,
        typer.Option(
            "--pod-security",
            metavar="LEVEL",
            help="Pod Security Standards level the pods pass: baseline or restricted.",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    run_as_user: Annotated[
        int | None,
        typer.Option(
            "--run-as-user",
            metavar="UID",
            help="User and group of the pods (default with --pod-security restricted: 1000).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    ttl: Annotated[
        int | None,
        typer.Option(
            "--ttl",
            metavar="SECONDS",
            help="Delete the finished Jobs (or JobSet) after SECONDS (ttlSecondsAfterFinished).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    pod_monitor: Annotated[
        bool,
        typer.Option(
            "--pod-monitor",
            help="Also render a Prometheus Operator PodMonitor (needs [metrics] enabled).",
            rich_help_panel=_PLATFORM,
        ),
    ] = False,
    metrics_from: Annotated[
        str | None,
        typer.Option(
            "--metrics-from",
            metavar="NAMESPACE",
            help="Namespace of the Prometheus that scrapes the metrics port: the NetworkPolicy admits "
            "that port only from its pods (default: from every source).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    backoff_limit: Annotated[
        int,
        typer.Option(
            "--backoff-limit",
            metavar="N",
            help="Failures retried per pod (never exit 2 or 4); the Job's backoffLimit is N x pods.",
        ),
    ] = 6,
    kubernetes: Annotated[
        str,
        typer.Option(
            "--kubernetes",
            metavar="VERSION",
            help="Oldest Kubernetes version of the target clusters (MAJOR.MINOR); from 1.33 the "
            "Job also gets backoffLimitPerIndex.",
        ),
    ] = "1.28",
    jobset: Annotated[
        bool, typer.Option("--jobset", help="Render a JobSet (jobset.x-k8s.io/v1alpha2) instead of the Job.")
    ] = False,
    owner_script: Annotated[
        Path | None,
        typer.Option(
            "--owner-script",
            metavar="FILE",
            help="Also write a shell script to run after `kubectl apply`: it makes the Job (or JobSet) "
            "own the other objects, so they are deleted with it.",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    monitoring_rules: Annotated[
        bool,
        typer.Option(
            "--monitoring-rules",
            help="Also render Prometheus alerts (a PrometheusRule) and a Grafana dashboard (a ConfigMap "
            "labelled grafana_dashboard) for the job's metrics; needs [metrics] enabled = true.",
            rich_help_panel=_PLATFORM,
        ),
    ] = False,
    trainer_runtime: Annotated[
        str | None,
        typer.Option(
            "--trainer-runtime",
            metavar="SCOPE",
            help="Render a Kubeflow Trainer v2 runtime instead of the Job: cluster "
            "(ClusterTrainingRuntime) or namespaced (TrainingRuntime); TrainJobs name it in runtimeRef.",
        ),
    ] = None,
    secret_env: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-env",
            metavar="SECRET",
            help="Every key of this Secret as an environment variable of the training container "
            "(repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume",
            metavar="KIND:NAME:PATH[:ro]",
            help="Mount a pvc, secret or configmap at PATH in the training container (repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    init_container: Annotated[
        list[Path] | None,
        typer.Option(
            "--init-container",
            metavar="FILE",
            help="YAML file with an init container of the training pods, or a list of them (repeatable).",
            rich_help_panel=_POD,
        ),
    ] = None,
    affinity: Annotated[
        Path | None,
        typer.Option(
            "--affinity",
            metavar="FILE",
            help="YAML file with the training pods' affinity (nodeAffinity, podAffinity, podAntiAffinity).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    exclusive_topology: Annotated[
        str | None,
        typer.Option(
            "--exclusive-topology",
            metavar="NODE_LABEL",
            help="JobSet exclusive placement: the job's pods alone in one domain of NODE_LABEL "
            "(--jobset or --trainer-runtime).",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    required_topology: Annotated[
        str | None,
        typer.Option(
            "--required-topology",
            metavar="NODE_LABEL",
            help="Kueue Topology Aware Scheduling: the training pods only in one domain of NODE_LABEL.",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
    preferred_topology: Annotated[
        str | None,
        typer.Option(
            "--preferred-topology",
            metavar="NODE_LABEL",
            help="Kueue Topology Aware Scheduling: the training pods in one domain of "
            "NODE_LABEL, if they fit.",
            rich_help_panel=_PLATFORM,
        ),
    ] = None,
) -> None:
    """Render the Kubernetes objects of POLICY as YAML: ConfigMap (the policy), headless Service,
    NetworkPolicy and an Indexed Job that runs `nvtrain run` on every node; with
    `[rendezvous] store = "control"` also a Job `<job>-control` that runs `nvtrain control`
    (with --jobset, a replicated Job of the JobSet); a PodMonitor and a Volcano PodGroup on request.
    With --trainer-runtime, a Kubeflow Trainer v2 runtime instead of the Job and the Service.

    Names, namespace, nodes, port, grace period and checkpoint mount come from the policy.
    Exit 2 on an invalid policy or options.
    """
    from nvtrain.templates.manifest import ManifestOptions, manifest_from_file
    from nvtrain.templates.podextras import read_yaml_option

    if output is not None:
        from nvtrain.cli._paths import refuse_overwrite

        refuse_overwrite("--output", output, {"the policy file": policy})
    if owner_script is not None:
        from nvtrain.cli._paths import refuse_overwrite

        taken = {"the policy file": policy, **({"--output": output} if output is not None else {})}
        refuse_overwrite("--owner-script", owner_script, taken)
    options = ManifestOptions(
        image=image,
        nvrx_version=nvrx,
        gpus_per_node=gpus,
        efa=efa,
        resources=_counts("--resource", resource),
        rdma_resources=_counts("--rdma-resource", rdma_resource),
        cpu=cpu,
        memory=memory,
        checkpoint_pvc=checkpoint_pvc,
        shm_size=shm_size,
        state_per_rank=state_per_rank,
        backoff_limit=backoff_limit,
        kubernetes=kubernetes,
        jobset=jobset,
        labels=_pairs("--label", label),
        env=_pairs("--env", env),
        node_selector=_pairs("--node-selector", node_selector),
        qos=qos,
        pod_security=pod_security,
        run_as_user=run_as_user,
        tolerations=tuple(toleration or ()),
        priority_class=priority_class,
        scheduler_name=scheduler_name,
        service_account=service_account,
        annotations=_pairs("--annotation", annotation),
        ttl=ttl,
        queue=queue,
        pod_monitor=pod_monitor,
        metrics_from=metrics_from,
        secret_env=tuple(secret_env or ()),
        volumes=tuple(volume or ()),
        init_containers=_init_containers(init_container, read_yaml_option),
        affinity=read_yaml_option("--affinity", affinity) if affinity is not None else None,
        exclusive_topology=exclusive_topology,
        required_topology=required_topology,
        preferred_topology=preferred_topology,
        trainer_runtime=trainer_runtime,
        monitoring_rules=monitoring_rules,
    )
    rendered = manifest_from_file(policy, options)
    if owner_script is not None:
        from nvtrain.templates.ownership import owner_script as script_of

        text = script_of(rendered.objects, str(output) if output is not None else "<manifest>")
        try:
            owner_script.write_text(text, encoding="utf-8")
            owner_script.chmod(0o755)
        except OSError as exc:
            raise UsageError(
                f"cannot write {owner_script}: {exc.strerror or exc}", "check the path"
            ) from None
    from nvtrain.cli._console import visible

    for note in rendered.notes:
        typer.echo(f"nvtrain: note: {visible(note)}", err=True)
    if output is None:
        typer.echo(rendered.text, nl=False)
        return
    try:
        output.write_text(rendered.text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}", "check the path") from None
    from nvtrain.cli import _console

    _console.print_manifest_written(str(output), rendered.summary())
