"""``nvtrain run`` off Kubernetes, through ``--dry-run``: torchrun's multi-node flags on bare
metal (``--nnodes``, ``--node-rank``, ``--master-addr``/``--master-port``, ``--rdzv-endpoint``,
``--local-addr``) and the policy key behind them (``[rendezvous] host``); Slurm's variables as
``srun`` sets them; where a job off a pod keeps its checkpoints; paths resolved where ``nvtrain
run`` started; ``--policy FILE train.py`` with a FILE that names no script.

Real runs across network namespaces: tests/launcher/multinode/test_bare_metal.py.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.launcher.identity import route_address
from nvtrain.launcher.ports import check_rendezvous_port

runner = CliRunner()


@pytest.fixture(autouse=True)
def _off_kubernetes_and_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a pod's nor a Slurm task's variables from the machine the tests run on."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SLURMD_")) or name in (
            "KUBERNETES_SERVICE_HOST",
            "JOB_COMPLETION_INDEX",
            "POD_IP",
        ):
            monkeypatch.delenv(name)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n", encoding="utf-8")
    return path


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["run", "--dry-run", *args], env=env)


def _plan(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _run(*args, env=env)
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def _option(plan: dict[str, Any], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in plan["argv"] if a.startswith(f"{name}=")]
    assert len(values) <= 1, plan["argv"]
    return values[0] if values else None


def _fails(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output


# ---------------------------------------------------------------------------------------------
# Bare metal: torchrun's flags


def test_master_addr_port_and_node_rank(script: Path) -> None:
    args = ["--nnodes", "2", "--master-addr", "10.9.8.7", "--master-port", "29123", "--rdzv-id", "bm-1"]
    node1 = _plan(*args, "--node-rank", "1", str(script))
    assert node1["endpoint"] == "10.9.8.7:29123"
    assert (node1["is_host"], node1["wait_for"]) == (False, "10.9.8.7")
    assert _option(node1, "--nnodes") == "2:2" and _option(node1, "--rdzv-id") == "bm-1"
    assert "is_host=0" in str(_option(node1, "--rdzv-conf"))
    assert node1["env"]["NVTRAIN_NODE_RANK"] == "1" == node1["env"]["GROUP_RANK"]
    # The address it gives its peers: its own on the route to node 0 (no DNS), where there is one.
    assert _option(node1, "--local-addr") == route_address("10.9.8.7", 29123)
    node0 = _plan(*args, "--node_rank=0", str(script))
    assert node0["is_host"] is True and "is_host=1" in str(_option(node0, "--rdzv-conf"))


def test_rdzv_endpoint_is_host_and_port(script: Path) -> None:
    base = ["--nnodes", "2", "--node-rank", "0", "--rdzv-id", "bm-2", "--rdzv-backend", "c10d"]
    assert _plan(*base, "--rdzv-endpoint", "10.9.8.7:29124", str(script))["endpoint"] == "10.9.8.7:29124"
    assert _plan(*base, "--rdzv_endpoint=node0", str(script))["endpoint"] == "node0:29500"
    v6 = _plan(*base, "--rdzv-endpoint", "[fd00::7]:29125", "--local-addr", "fd00::8", str(script))
    assert v6["endpoint"] == "[fd00::7]:29125" and v6["wait_for"] == "fd00::7"
    assert _option(v6, "--local-addr") == "fd00::8"
    same = _plan(
        *base, "--rdzv-endpoint", "h:29126", "--master-addr", "h", "--master-port", "29126", str(script)
    )
    assert same["endpoint"] == "h:29126"
    static = [a if a != "c10d" else "static" for a in base]  # torchrun's default backend: the same
    assert _plan(*static, "--master-addr", "h", str(script))["endpoint"] == "h:29500"


def test_the_policy_key_behind_master_addr(tmp_path: Path, script: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(
        f'[job]\nname = "bm"\nscript = "{script}"\n[rendezvous]\nnodes = 4\nhost = "10.0.0.5"\nport = 29127\n'
        f'[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n',
        encoding="utf-8",
    )
    plan = _plan("--node-rank", "3", "--run-id", "bm-3", "--local-addr", "10.0.0.8", str(policy))
    assert plan["endpoint"] == "10.0.0.5:29127" and _option(plan, "--nnodes") == "4:4"
    assert _option(plan, "--local-addr") == "10.0.0.8"
    env = {"NVTRAIN_NODE_RANK": "2", "NVTRAIN_RUN_ID": "bm-4"}  # the environment works too
    assert _plan("--master-addr", "10.0.0.6", str(policy), env=env)["endpoint"] == "10.0.0.6:29127"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["--nnodes", "2", "--master-addr", "h", "--rdzv-id", "x"],
            ["node index of this node", "--node-rank N", "srun"],
        ),
        (["--nnodes", "2", "--master-addr", "h", "--node-rank", "1"], ["run id", "--rdzv-id ID"]),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--rdzv-id", "x"],
            ["node index 2", "--nnodes"],
        ),
        (["--master-addr", "a", "--rdzv-endpoint", "b:1"], ["two hosts"]),
        (["--master-port", "2", "--rdzv-endpoint", "b:1"], ["two ports"]),
        (["--rdzv-endpoint", "b:99999"], ["port 99999"]),
        (["--rdzv-endpoint", "a b"], ["HOST:PORT"]),
        (["--master-addr", "bad host!"], ["--master-addr bad host! (command line)", "[rendezvous] host"]),
        (["--node-rank", "-1"], ["--node-rank"]),
        (
            ["--nnodes", "2", "--node-rank", "1", "--rdzv-id", "x"],
            ["no rendezvous host", "--master-addr HOST"],
        ),
        (["--nnodes", "2", "--rdzv-id", "x"], ["node index of this node in a 2-node job", "--node-rank N"]),
        (["--rdzv-backend", "etcd-v2"], ["etcd"]),
    ],
)
def test_bad_bare_metal_flags_are_exit_2_naming_them(
    script: Path, args: list[str], needles: list[str]
) -> None:
    _fails(_run(*args, str(script)), *needles)


def test_a_busy_port_given_by_a_flag_is_named_by_that_flag() -> None:
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = int(server.getsockname()[1])
        with pytest.raises(UsageError) as raised:
            check_rendezvous_port(port, flag=f"--master-port {port}")
        assert raised.value.message.startswith(f"--master-port {port}: [rendezvous] port = {port} is in use")
        assert "pass another free port (--master-port)" in raised.value.fix
        with pytest.raises(UsageError) as raised:
            check_rendezvous_port(port)
        assert raised.value.message.startswith(f"[rendezvous] port = {port} is in use")


# ---------------------------------------------------------------------------------------------
# Slurm: the variables as srun sets them


def srun_env(node: int, **extra: str) -> dict[str, str]:
    """`srun -N2 --ntasks-per-node=1` in an allocation of 2 nodes (as a real srun sets them:
    tests/launcher/test_real_srun.py)."""
    return {
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "cn[07-08]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "cn[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": f"cn0{7 + node}",
        **extra,
    }


def test_srun_gives_rank_nodes_store_host_run_id_and_workers(script: Path) -> None:
    plan = _plan(str(script), "--lr", "1", env=srun_env(1))
    assert plan["endpoint"] == "cn07:29500" and plan["wait_for"] == "cn07" and plan["is_host"] is False
    assert _option(plan, "--nnodes") == "2:2" and _option(plan, "--nproc-per-node") == "1"
    assert _option(plan, "--rdzv-id") == "train-slurm-777" == plan["env"]["NVTRAIN_RUN_ID"]
    assert _option(plan, "--local-addr") == "cn08" and plan["env"]["NVTRAIN_NODE_RANK"] == "1"
    assert plan["argv"][-3:] == [str(script), "--lr", "1"]
    gpus = _plan(str(script), env=srun_env(0, SLURM_GPUS_ON_NODE="8"))
    assert gpus["is_host"] is True and _option(gpus, "--nproc-per-node") == "8"


def test_flags_and_written_keys_beat_slurm(tmp_path: Path, script: Path) -> None:
    # An elastic --nnodes fits the 2-node step (a size the step cannot have is exit 2:
    # tests/launcher/test_slurm_policy_mismatch.py).
    flags = _plan("--nnodes", "1:2", "--nproc-per-node", "2", str(script), env=srun_env(0))
    assert _option(flags, "--nnodes") == "1:2" and _option(flags, "--nproc-per-node") == "2"
    assert flags["endpoint"] == "cn07:29500"
    policy = tmp_path / "p.toml"
    policy.write_text(
        f'[job]\nname = "s"\nscript = "{script}"\nnproc_per_node = 3\n'
        f'[rendezvous]\nnodes = 2\nhost = "10.1.1.1"\n[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n',
        encoding="utf-8",
    )
    written = _plan(str(policy), env=srun_env(1, SLURM_STEP_NUM_NODES="2"))
    assert _option(written, "--nproc-per-node") == "3" and written["endpoint"] == "10.1.1.1:29500"
    assert _option(written, "--rdzv-id") == "s-slurm-777"


def test_a_step_with_two_tasks_on_a_node_is_refused(script: Path) -> None:
    result = _run(str(script), env=srun_env(0, SLURM_STEP_TASKS_PER_NODE="2(x2)"))
    _fails(result, "srun started 2 tasks on node 0", "srun --ntasks-per-node=1")


def test_an_indexed_job_is_not_read_as_slurm(tmp_path: Path, script: Path) -> None:
    env = {**srun_env(1), "JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "k-1"}
    plan = _plan("--nnodes", "2", str(script), env=env)
    assert plan["endpoint"].startswith("train-0.") and plan["env"]["NVTRAIN_NODE_RANK"] == "0"


# ---------------------------------------------------------------------------------------------
# Where the files go, and paths


def _run_dir(plan: dict[str, Any]) -> Path:
    return Path(plan["env"]["NVTRAIN_EVENTS"]).parent


def test_off_a_pod_a_policy_without_a_checkpoint_dir_keeps_it_under_tmpdir(tmp_path: Path) -> None:
    policy = tmp_path / "minimal.toml"
    policy.write_text('[job]\nname = "mini"\nscript = "x.py"\n', encoding="utf-8")
    off_pod = _run_dir(_plan("--run-id", "m-1", str(policy)))
    assert off_pod == Path(tempfile.gettempdir()).resolve() / "nvtrain" / "m-1"
    on_pod = _run_dir(_plan("--run-id", "m-2", str(policy), env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"}))
    assert on_pod == Path("/checkpoints/m-2")


def test_a_relative_checkpoint_dir_is_resolved_where_nvtrain_run_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "rel.toml"
    policy.write_text('[job]\nname = "rel"\nscript = "x.py"\n[checkpoint]\ndir = "./ckpt/../ckpts"\n')
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert _run_dir(_plan("--run-id", "r-1", str(policy))) == tmp_path / "work" / "ckpts" / "r-1"
    # Other errors are still reported, all at once, with the file's lines.
    policy.write_text('[job]\nname = "rel"\nscript = "x.py"\n[checkpoint]\ndir = "ckpt"\nkeep = 1\n')
    _fails(_run(str(policy)), f"{policy}:6", "[checkpoint] keep = 1")


def test_policy_file_without_a_script_runs_the_script_named_after_it(tmp_path: Path, script: Path) -> None:
    policy = tmp_path / "settings.toml"
    policy.write_text(f'[job]\nname = "settings"\nnproc_per_node = 2\n[checkpoint]\ndir = "{tmp_path}"\n')
    plan = _plan("--policy", str(policy), str(script), "--x")
    assert plan["argv"][-2:] == [str(script), "--x"] and _option(plan, "--nproc-per-node") == "2"
    _fails(_run(str(policy)), "[job] script", "give exactly one of `script` and `module`")


def test_a_bad_value_from_slurm_is_named_as_slurms(script: Path) -> None:
    result = _run(str(script), env=srun_env(0, SLURM_GPUS_ON_NODE="2000"))
    _fails(result, "Slurm's 2000 worker(s) per node (srun's environment): error [job] nproc_per_node")


def test_the_batch_script_is_one_node(script: Path) -> None:
    # `sbatch -N2` running nvtrain run itself, without srun: SLURM_NODEID is set, no SLURM_STEP_ID.
    batch = {k: v for k, v in srun_env(0).items() if not k.startswith(("SLURM_STEP", "SLURMD"))}
    plan = _plan(str(script), env=batch)
    assert _option(plan, "--nnodes") == "1:1" and plan["endpoint"].startswith("127.0.0.1:")
    assert _option(plan, "--rdzv-id") == "train-slurm-777"  # a requeued job resumes its checkpoints
    _fails(_run("--nnodes", "2", str(script), env=batch), "Slurm batch script", "srun --ntasks-per-node=1")
