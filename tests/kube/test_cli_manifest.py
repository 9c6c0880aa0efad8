"""``nvtrain manifest``: YAML on stdout or in a file, options, and errors with exit code 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from templates_helpers import CONTROL, MINIMAL, by_kind, load_all, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.sizing import notes
from nvtrain.kube.yaml_io import dump

runner = CliRunner()


def write(tmp_path: Path, text: str = MINIMAL) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_prints_the_same_yaml_as_the_library(tmp_path: Path) -> None:
    from templates_helpers import policy_of

    result = runner.invoke(app, ["manifest", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.stdout == dump(render(policy_of(MINIMAL), MINIMAL, ManifestOptions()))
    # Only the note that the host copies in /dev/shm are not sized (MINIMAL keeps them).
    assert result.stderr == "".join(
        f"nvtrain: note: {n}\n" for n in notes(policy_of(MINIMAL), ManifestOptions())
    )
    assert result.stderr.count("\n") == 1
    no_copy = MINIMAL + "[checkpoint]\nin_memory = false\n"
    quiet = runner.invoke(app, ["manifest", str(write(tmp_path, no_copy))])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""


def test_writes_a_file_and_lists_its_objects(tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    result = runner.invoke(
        app, ["manifest", str(write(tmp_path)), "--image", "reg.example.com/t:1", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    objects = load_all(out.read_text(encoding="utf-8"))
    assert (
        by_kind(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example.com/t:1"
    )
    for line in (
        "Service llm-train",
        "NetworkPolicy llm-train-peers",
        "Job llm-train",
        f"kubectl apply -f {out}",
    ):
        assert line in result.stdout


def test_every_option_reaches_the_objects(tmp_path: Path) -> None:
    args = [
        "manifest",
        str(write(tmp_path, starter_two_nodes())),
        "--gpus=8",
        "--efa=32",
        "--resource=rdma/hca_shared_devices_a=1",
        "--cpu=90",
        "--memory=900Gi",
        "--shm-size=64Gi",
        "--checkpoint-pvc=fsx",
        "--env=NCCL_DEBUG=INFO",
        "--env=EXTRA=a=b",
        "--node-selector=node.kubernetes.io/instance-type=p5.48xlarge",
        "--label=team=ml",
        "--backoff-limit=3",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    job = by_kind(load_all(result.stdout), "Job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": 8,
        "vpc.amazonaws.com/efa": 32,
        "rdma/hca_shared_devices_a": 1,
        "memory": "900Gi",
    }
    assert container["resources"]["requests"]["cpu"] == "90"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["EXTRA"] == "a=b"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert job["metadata"]["labels"]["team"] == "ml"
    assert job["spec"]["backoffLimit"] == 3 * job["spec"]["completions"] == 6  # per pod, 2 pods
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "fsx"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "64Gi"


def test_jobset_flag(tmp_path: Path) -> None:
    text = starter_two_nodes().replace('name = "my-training"', 'name = "my-training-workers-0"')
    result = runner.invoke(app, ["manifest", str(write(tmp_path, text)), "--jobset"])
    assert result.exit_code == 0, result.output
    assert [o["kind"] for o in load_all(result.stdout)] == ["ConfigMap", "NetworkPolicy", "JobSet"]
    refused = runner.invoke(app, ["manifest", str(write(tmp_path)), "--jobset"])
    assert refused.exit_code == 2
    assert "--jobset needs [job] name" in refused.stderr


def test_control_store_lists_the_control_job_and_puts_it_into_the_jobset(tmp_path: Path) -> None:
    policy = str(write(tmp_path, CONTROL))
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["manifest", policy, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Job llm-train-control" in result.stdout
    names = [o["metadata"]["name"] for o in load_all(out.read_text(encoding="utf-8")) if o["kind"] == "Job"]
    assert names == ["llm-train-control", "llm-train"]
    text = with_control_store(starter_two_nodes().replace('"my-training"', '"my-training-workers-0"'))
    jobset = runner.invoke(app, ["manifest", str(write(tmp_path, text)), "--jobset"])
    assert jobset.exit_code == 0, jobset.output
    [only] = [o for o in load_all(jobset.stdout) if o["kind"] == "JobSet"]
    assert [r["name"] for r in only["spec"]["replicatedJobs"]] == ["workers", "control"]


def test_invalid_policy_shows_every_finding_and_exits_2(tmp_path: Path) -> None:
    bad = write(tmp_path, '[job]\nname = "Bad_Name"\nscript = "t.py"\n[rendezvous]\nport = 0\n')
    result = runner.invoke(app, ["manifest", str(bad)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "[job] name" in result.stderr and "[rendezvous] port" in result.stderr


def test_missing_policy_exits_2_and_suggests_init(tmp_path: Path) -> None:
    result = runner.invoke(app, ["manifest", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "file not found" in result.stderr and "nvtrain init" in result.stderr


def test_bad_options_exit_2_with_a_fix(tmp_path: Path) -> None:
    policy = str(write(tmp_path))
    for args, message in (
        (["--env", "NOVALUE"], "is not KEY=VALUE"),
        (["--resource", "rdma/x=two"], "not a whole number"),
        (["--shm-size", "big"], "not a Kubernetes quantity"),
        (["--state-per-rank", "20GB"], "--state-per-rank '20GB' is not a Kubernetes quantity"),
        (["--state-per-rank", "0"], "--state-per-rank '0' is not a size"),
        (["--state-per-rank", "20Gi", "--memory", "36Gi"], "memory-backed volumes, not below --memory"),
        (["--image", "has space"], "not an image reference"),
    ):
        result = runner.invoke(app, ["manifest", policy, *args])
        assert result.exit_code == 2, args
        assert message in result.stderr, (args, result.stderr)
        assert "fix:" in result.stderr
        assert result.stdout == ""


def test_state_per_rank_sizes_the_host_copies_and_notes_when_it_is_missing(tmp_path: Path) -> None:
    eight = str(write(tmp_path, MINIMAL + "nproc_per_node = 8\n"))
    sized = runner.invoke(app, ["manifest", eight, "--state-per-rank", "20Gi", "--memory", "900Gi"])
    assert sized.exit_code == 0, sized.output
    assert sized.stderr == ""
    volumes = {
        v["name"]: v for v in by_kind(load_all(sized.stdout), "Job")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "336Gi"}  # 16Gi + 2 x 20Gi x 8
    unsized = runner.invoke(app, ["manifest", eight])
    assert unsized.exit_code == 0, unsized.output
    [note] = unsized.stderr.splitlines()
    assert note.startswith("nvtrain: note: [checkpoint] memory_dir '/dev/shm' holds the host copies")
    assert "2 × state per rank × 8 ranks per pod" in note and "--state-per-rank" in note
    out = tmp_path / "job.yaml"
    written = runner.invoke(app, ["manifest", eight, "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert written.stderr == unsized.stderr and "kubectl apply" in written.stdout
    no_copy = str(write(tmp_path, MINIMAL + "[checkpoint]\nasync = false\nkeep = 1\n"))
    ignored = runner.invoke(app, ["manifest", no_copy, "--state-per-rank", "20Gi"])
    assert ignored.exit_code == 0, ignored.output
    assert ignored.stderr == (
        "nvtrain: note: --state-per-rank changes nothing: the policy keeps no host copy of the "
        "checkpoint ([checkpoint] async = false)\n"
    )


# -- the options, declared once in ManifestOptions ----------------------------------------------

SURFACE = (
    "--image --nvrx -o/--output --gpus --efa --resource --rdma-resource --cpu --memory --qos "
    "--shm-size --state-per-rank --checkpoint-pvc --env --node-selector --label --annotation "
    "--toleration --priority-class --scheduler-name --queue --service-account --pod-security "
    "--run-as-user --ttl --pod-monitor --metrics-from --backoff-limit --kubernetes --jobset "
    "--owner-script --monitoring-rules --trainer-runtime --secret-env --volume --init-container "
    "--affinity --exclusive-topology --required-topology --preferred-topology"
).split()
"""The options of `nvtrain manifest`, in the order --help lists them: a frozen surface."""


def test_the_command_surface_is_the_fields_of_manifest_options() -> None:
    import typer

    from nvtrain.cli import manifest as cli_manifest
    from nvtrain.kube.options import flag_of

    command = typer.main.get_command(app).commands["manifest"]  # type: ignore[attr-defined]
    options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    assert ["/".join(sorted(p.opts, key=len)) for p in options] == SURFACE
    own = {"output", "owner_script"}
    fields = dataclasses.fields(ManifestOptions)
    assert [p.name for p in options if p.name not in own] == [f.name for f in fields]
    for param, field in zip((p for p in options if p.name not in own), fields, strict=True):
        flag = flag_of(field)
        assert (param.opts, param.help) == ([flag.name], flag.help)
        assert param.multiple is (flag.parse in ("pairs", "counts", "list", "yaml-list"))
    assert cli_manifest.command.__doc__ is not None


def test_from_flags_turns_each_kind_of_value(tmp_path: Path) -> None:
    init = tmp_path / "init.yaml"
    init.write_text("- {name: a, image: x}\n- {name: b, image: y}\n", encoding="utf-8")
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text("nodeAffinity: {}\n", encoding="utf-8")
    from nvtrain.kube.yaml_io import read_yaml_option

    options = ManifestOptions.from_flags(
        {
            "image": "train:1",
            "efa": 2,
            "resources": ["rdma/ib=1"],
            "labels": ["team=ml", "tier="],
            "tolerations": ["k=v:NoSchedule"],
            "volumes": None,
            "init_containers": [init],
            "affinity": affinity,
        },
        read_yaml_option,
    )
    assert options == ManifestOptions(
        image="train:1",
        efa=2,
        resources={"rdma/ib": 1},
        labels={"team": "ml", "tier": ""},
        tolerations=("k=v:NoSchedule",),
        init_containers=({"name": "a", "image": "x"}, {"name": "b", "image": "y"}),
        affinity={"nodeAffinity": {}},
    )
    assert ManifestOptions.from_flags({}, read_yaml_option) == ManifestOptions()


def test_a_flag_value_that_cannot_be_turned_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(MINIMAL, encoding="utf-8")
    for args, message in (
        (["--resource", "rdma/ib=one"], "--resource rdma/ib='one': the count is not a whole number"),
        (["--node-selector", "zone"], "--node-selector 'zone' is not KEY=VALUE"),
        (["--affinity", str(tmp_path / "missing.yaml")], "--affinity"),
    ):
        result = runner.invoke(app, ["manifest", str(path), *args])
        assert result.exit_code == 2, result.output
        assert message in result.stderr
        assert "Traceback" not in result.output


def test_every_flag_reaches_its_field(tmp_path: Path) -> None:
    """Each option of the command sets the field it is declared on: the command with every flag
    (in two runs: some exclude others) prints what the library renders from the same options
    given by field."""
    from templates_helpers import policy_of

    text = 'name = "llm-workers-0"\n'.join(MINIMAL.split('name = "llm-train"\n'))
    text += 'nproc_per_node = 2\nbackend = "nccl"\n[metrics]\nenabled = true\n'
    policy = write(tmp_path, text)
    init = tmp_path / "init.yaml"
    init.write_text("name: stage\nimage: busybox\n", encoding="utf-8")
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text("podAntiAffinity: {}\n", encoding="utf-8")
    runs = [
        (
            [
                *("--image", "train:2", "--gpus", "2", "--efa", "1", "--resource", "example.com/fpga=1"),
                *("--rdma-resource", "example.com/ib=1", "--cpu", "8", "--memory", "64Gi"),
                *("--qos", "guaranteed", "--shm-size", "8Gi", "--state-per-rank", "1Gi"),
                *("--checkpoint-pvc", "ckpt", "--env", "A=1", "--node-selector", "pool=gpu"),
                *("--label", "team=ml", "--annotation", "note=x", "--toleration", "dedicated=ml:NoSchedule"),
                *("--priority-class", "high", "--queue", "q", "--scheduler-name", "custom"),
                *("--service-account", "trainer", "--run-as-user", "1001", "--ttl", "600"),
                *("--pod-monitor", "--metrics-from", "monitoring", "--backoff-limit", "3"),
                *("--kubernetes", "1.33", "--jobset", "--monitoring-rules", "--secret-env", "hub"),
                *(
                    "--volume",
                    "pvc:data:/data:ro",
                    "--init-container",
                    str(init),
                    "--affinity",
                    str(affinity),
                ),
                *("--exclusive-topology", "rack", "--required-topology", "block", "--nvrx", "0.4.1"),
            ],
            ManifestOptions(
                image="train:2",
                nvrx_version="0.4.1",
                gpus_per_node=2,
                efa=1,
                resources={"example.com/fpga": 1},
                rdma_resources={"example.com/ib": 1},
                cpu="8",
                memory="64Gi",
                qos="guaranteed",
                shm_size="8Gi",
                state_per_rank="1Gi",
                checkpoint_pvc="ckpt",
                env={"A": "1"},
                node_selector={"pool": "gpu"},
                labels={"team": "ml"},
                annotations={"note": "x"},
                tolerations=("dedicated=ml:NoSchedule",),
                priority_class="high",
                scheduler_name="custom",
                queue="q",
                service_account="trainer",
                run_as_user=1001,
                ttl=600,
                pod_monitor=True,
                metrics_from="monitoring",
                backoff_limit=3,
                kubernetes="1.33",
                jobset=True,
                monitoring_rules=True,
                secret_env=("hub",),
                volumes=("pvc:data:/data:ro",),
                init_containers=({"name": "stage", "image": "busybox"},),
                affinity={"podAntiAffinity": {}},
                exclusive_topology="rack",
                required_topology="block",
            ),
        ),
        (
            ["--pod-security", "restricted", "--trainer-runtime", "cluster", "--preferred-topology", "rack"],
            ManifestOptions(pod_security="restricted", trainer_runtime="cluster", preferred_topology="rack"),
        ),
    ]
    given: set[str] = set()
    for args, options in runs:
        result = runner.invoke(app, ["manifest", str(policy), *args])
        assert result.exit_code == 0, result.output
        assert result.stdout == dump(render(policy_of(text), text, options))
        default = ManifestOptions()
        given |= {
            f.name
            for f in dataclasses.fields(options)
            if getattr(options, f.name) != getattr(default, f.name)
        }
    assert given == {f.name for f in dataclasses.fields(ManifestOptions)}
