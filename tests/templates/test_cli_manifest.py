"""``nvtrain manifest``: YAML on stdout or in a file, options, and errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

from templates_helpers import CONTROL, MINIMAL, by_kind, load_all, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.templates.manifest import ManifestOptions, dump, notes, render

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
