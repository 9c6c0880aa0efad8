"""The ft_launcher plan per NVRx version: exact argv and environment, checked by hand.

The expected command lines below are written out in full from docs/nvrx.md sections 2-3, not
computed: NVRx 0.4 takes ``--ft-restart-policy`` and needs ``--ft-enable-nic-monitor=false``
without InfiniBand; 0.6 and 0.7 have neither, check NIC link state and reclaim GPU memory unless
told not to, and take ``store_connect_wait_seconds`` in ``--rdzv-conf``.

``plan.to_dict()`` is also compared with golden files under tests/launcher/golden/dryrun/ (what
``nvtrain run --dry-run`` prints). Regenerate them after an intended change with::

    NVTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/launcher/test_plan.py

and read the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.launcher.control import ControlPlan, build_control_plan
from nvtrain.launcher.dns import pod_name
from nvtrain.launcher.identity import Identity, identify
from nvtrain.launcher.plan import (
    LAUNCHER_MODULE,
    LaunchPlan,
    build_plan,
    ft_config,
    ft_config_text,
    uses_worker_library,
)
from nvtrain.nvrx import NvrxVersion

GOLDEN = Path(__file__).resolve().parent / "golden" / "dryrun"
# Read at import: the autouse fixture in tests/conftest.py removes NVTRAIN_* before each test.
UPDATE = os.environ.get("NVTRAIN_UPDATE_GOLDEN") == "1"

V041, V060, V070 = (NvrxVersion.parse(v) for v in ("0.4.1", "0.6.0", "0.7.0"))
RUN_ID = "llm-train-20260101-000000-abc123"
POLICY_PATH = "/tmp/nvtrain-llm-train-20260101-000000-abc123-node0/policy.json"
EVENTS_PATH = "/checkpoints/llm-train/llm-train-20260101-000000-abc123/events.jsonl"
FT_CONFIG_PATH = "/tmp/nvtrain-llm-train-20260101-000000-abc123-node0/ft_config.yaml"
RUN_KEY_PATH = "/tmp/nvtrain-llm-train-20260101-000000-abc123-node0/run.key"
LAUNCHER_TMP = "/tmp/nvtrain-llm-train-20260101-000000-abc123-node0/tmp"
# What every plan's environment holds for the run's private files: the secret's path, and
# ft_launcher's private TMPDIR with the user's own (unset here) for the script.
PRIVATE_ENV = {"NVTRAIN_RUN_KEY_FILE": RUN_KEY_PATH, "TMPDIR": LAUNCHER_TMP, "NVTRAIN_USER_TMPDIR": ""}


def standalone_policy(**job: Any) -> Policy:
    return Policy.model_validate(
        {
            "job": {
                "name": "llm-train",
                "script": "train.py",
                "nproc_per_node": 2,
                "args": ["--lr", "0.1"],
                "stop_timeout": "90s",
                **job,
            },
            "rendezvous": {"port": 29511, "join_timeout": "2m30s"},
            "heartbeat": {"initial_timeout": "20m", "timeout": "5m", "monitor_interval": "5s"},
            "restart": {"in_job": {"max_restarts": 4}},
            "checkpoint": {"dir": "/checkpoints/llm-train"},
        }
    )


def multinode_policy(**rendezvous: Any) -> Policy:
    return Policy.model_validate(
        {
            "job": {
                "name": "llm-train",
                "module": "mypkg.train",
                "nproc_per_node": 8,
                "stop_timeout": 10,
                "args": ["--config", "big.yaml"],
            },
            "rendezvous": {
                "nodes": 4,
                "min_nodes": 3,
                "service": "llm-svc",
                "namespace": "research",
                "cluster_domain": "cluster.example",
                "port": 29600,
                "join_timeout": 90.5,
                **rendezvous,
            },
            "heartbeat": {"initial_timeout": "10m", "timeout": "2m", "monitor_interval": "500ms"},
            "restart": {"in_job": {"max_restarts": 2}},
            "checkpoint": {"dir": "/checkpoints/llm-train"},
        }
    )


def standalone_identity(**changes: Any) -> Identity:
    fields: dict[str, Any] = {
        "node_rank": 0,
        "standalone": True,
        "address": None,
        "hostname": "workstation",
        "run_id": RUN_ID,
        "has_gpu": False,
        "has_infiniband": False,
    }
    return Identity(**{**fields, **changes})


def node_identity(rank: int, **changes: Any) -> Identity:
    fields: dict[str, Any] = {
        "node_rank": rank,
        "standalone": False,
        "address": f"10.0.0.{10 + rank}",
        "hostname": f"llm-train-{rank}",
        "run_id": RUN_ID,
        "has_gpu": True,
        "has_infiniband": True,
    }
    return Identity(**{**fields, **changes})


def plan_for(
    policy: Policy, identity: Identity, nvrx: NvrxVersion, extra_args: tuple[str, ...] = ()
) -> LaunchPlan:
    return build_plan(
        policy,
        identity,
        nvrx,
        python="python3",
        policy_path=POLICY_PATH,
        events_path=EVENTS_PATH,
        extra_args=extra_args,
        ft_config_path=FT_CONFIG_PATH,
        run_key_path=RUN_KEY_PATH,
        launcher_tmp=LAUNCHER_TMP,
    )


# Shared by every standalone plan: 1 node, localhost, this run id, the policy's timings.
STANDALONE_HEAD = [
    "python3",
    "-m",
    "nvtrain.nvrx.ftmain",  # ft_launcher, its fixed waits shortened (nvtrain.nvrx.ftmain)
    "nvidia_resiliency_ext.fault_tolerance.launcher",
    "--nnodes=1:1",
    "--nproc-per-node=2",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=127.0.0.1:29511",
    f"--rdzv-id={RUN_ID}",
]
STANDALONE_TIMINGS = [
    "--max-restarts=4",
    "--monitor-interval=0.1",  # torchrun's; a worker's exit wakes it at once (ftmain)
    "--term-timeout=90",
    "--workers-stop-timeout=15",  # capped at 15 s
    f"--ft-cfg-path={FT_CONFIG_PATH}",  # [heartbeat] as NVRx's config file; the CLI repeats what is set
    "--ft-workload-check-interval=5",
    "--ft-initial-rank-heartbeat-timeout=1200",
    "--ft-rank-heartbeat-timeout=300",
]


def test_launcher_module_is_nvrx_ft_launcher() -> None:
    assert LAUNCHER_MODULE == "nvidia_resiliency_ext.fault_tolerance.launcher"


def test_standalone_nvrx_0_4() -> None:
    plan = plan_for(standalone_policy(), standalone_identity(), V041)
    assert plan.argv == [
        *STANDALONE_HEAD,
        "--rdzv-conf=is_host=1,join_timeout=150",
        *STANDALONE_TIMINGS,
        "--ft-restart-policy=any-failed",
        "--ft-enable-nic-monitor=false",
        "-m",
        "nvtrain.entry",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert plan.env == {
        "NVTRAIN_POLICY": POLICY_PATH,
        "NVTRAIN_RUN_ID": RUN_ID,
        "NVTRAIN_EVENTS": EVENTS_PATH,
        "NVTRAIN_NODE_RANK": "0",
        "GROUP_RANK": "0",
        **PRIVATE_ENV,
    }
    assert plan.endpoint == "127.0.0.1:29511"
    assert plan.is_host is True
    assert plan.wait_for is None
    assert plan.stop_timeout == 90.0


@pytest.mark.parametrize("nvrx", [V060, V070], ids=str)
def test_standalone_nvrx_0_6_and_later(nvrx: NvrxVersion) -> None:
    plan = plan_for(standalone_policy(), standalone_identity(), nvrx)
    assert plan.argv == [
        *STANDALONE_HEAD,
        "--rdzv-conf=is_host=1,join_timeout=150,store_connect_wait_seconds=150",
        *STANDALONE_TIMINGS,
        "--ft-enable-nic-healthcheck=false",
        "--ft-gpu-memory-reclaim-timeout=0",
        "--ft-max-no-progress-cycles=0",  # nvtrain keeps no iteration file for the tracker
        "-m",
        "nvtrain.entry",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert not any(a.startswith(("--ft-restart-policy", "--ft-enable-nic-monitor")) for a in plan.argv)


@pytest.mark.parametrize("nvrx", [V041, V060, V070], ids=str)
def test_standalone_never_publishes_an_address(nvrx: NvrxVersion) -> None:
    plan = plan_for(standalone_policy(), standalone_identity(), nvrx)
    assert not any(a.startswith("--local-addr") for a in plan.argv)


def test_multinode_node0_nvrx_0_4_hosts_the_store() -> None:
    plan = plan_for(multinode_policy(), node_identity(0), V041)
    pod0 = "llm-train-0.llm-svc.research.svc.cluster.example"
    assert plan.argv == [
        "python3",
        "-m",
        "nvtrain.nvrx.ftmain",
        "nvidia_resiliency_ext.fault_tolerance.launcher",
        "--nnodes=3:4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={pod0}:29600",
        f"--rdzv-id={RUN_ID}",
        "--rdzv-conf=is_host=1,join_timeout=91",  # 90.5 s rounded up
        "--max-restarts=2",
        "--monitor-interval=0.1",
        "--term-timeout=10",
        "--workers-stop-timeout=10",
        "--local-addr=10.0.0.10",
        f"--ft-cfg-path={FT_CONFIG_PATH}",
        "--ft-workload-check-interval=0.5",
        "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=120",
        "--ft-restart-policy=any-failed",
        # InfiniBand present: the NIC monitor stays on (no --ft-enable-nic-monitor=false)
        "-m",
        "nvtrain.entry",
        "-m",
        "mypkg.train",
        "--config",
        "big.yaml",
    ]
    assert plan.env["NVTRAIN_NODE_RANK"] == plan.env["GROUP_RANK"] == "0"
    assert plan.is_host is True
    assert plan.endpoint == f"{pod0}:29600"
    assert plan.wait_for == pod0


@pytest.mark.parametrize("nvrx", [V060, V070], ids=str)
def test_multinode_node2_nvrx_0_6_and_later(nvrx: NvrxVersion) -> None:
    plan = plan_for(multinode_policy(), node_identity(2), nvrx)
    pod0 = "llm-train-0.llm-svc.research.svc.cluster.example"
    assert plan.argv == [
        "python3",
        "-m",
        "nvtrain.nvrx.ftmain",
        "nvidia_resiliency_ext.fault_tolerance.launcher",
        "--nnodes=3:4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={pod0}:29600",
        f"--rdzv-id={RUN_ID}",
        "--rdzv-conf=is_host=0,join_timeout=91,store_connect_wait_seconds=91",
        "--max-restarts=2",
        "--monitor-interval=0.1",
        "--term-timeout=10",
        "--workers-stop-timeout=10",
        "--local-addr=10.0.0.12",
        f"--ft-cfg-path={FT_CONFIG_PATH}",
        "--ft-workload-check-interval=0.5",
        "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=120",
        # InfiniBand and a GPU: NIC health check and GPU memory reclaim stay on, the reclaim
        # looked at every 50 ms instead of NVRx's 2 s
        "--ft-gpu-memory-poll-interval=0.05",
        "--ft-max-no-progress-cycles=0",
        "-m",
        "nvtrain.entry",
        "-m",
        "mypkg.train",
        "--config",
        "big.yaml",
    ]
    assert plan.env == {
        "NVTRAIN_POLICY": POLICY_PATH,
        "NVTRAIN_RUN_ID": RUN_ID,
        "NVTRAIN_EVENTS": EVENTS_PATH,
        "NVTRAIN_NODE_RANK": "2",
        "GROUP_RANK": "2",
        **PRIVATE_ENV,
    }
    assert plan.is_host is False
    assert plan.wait_for == pod0  # every node, pod 0 included, waits for pod 0's name


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_is_host_only_on_node_0(rank: int) -> None:
    for nvrx in (V041, V060, V070):
        plan = plan_for(multinode_policy(), node_identity(rank), nvrx)
        conf = next(a for a in plan.argv if a.startswith("--rdzv-conf="))
        assert conf.split("=", 1)[1].split(",")[0] == f"is_host={int(rank == 0)}"
        assert plan.is_host is (rank == 0)


def test_nnodes_is_min_colon_max() -> None:
    fixed = plan_for(multinode_policy(min_nodes=None), node_identity(1), V070)
    assert "--nnodes=4:4" in fixed.argv
    elastic = plan_for(multinode_policy(min_nodes=1), node_identity(1), V041)
    assert "--nnodes=1:4" in elastic.argv


def test_local_addr_only_when_the_address_is_known() -> None:
    plan = plan_for(multinode_policy(), node_identity(1, address=None), V041)
    assert not any(a.startswith("--local-addr") for a in plan.argv)
    plan = plan_for(multinode_policy(), node_identity(1, address="fd00::7"), V041)
    assert "--local-addr=fd00::7" in plan.argv


@pytest.mark.parametrize("nvrx", [V041, V060, V070])
def test_a_pod_without_pod_ip_publishes_its_own_stable_name(nvrx: NvrxVersion) -> None:
    # What a pod without the downward API's POD_IP gets from identify(): its own headless-
    # Service name, resolvable by the peers like pod 0's name (the rendezvous endpoint).
    policy = multinode_policy()
    env = {"JOB_COMPLETION_INDEX": "2", "NVTRAIN_RUN_ID": RUN_ID}
    plan = plan_for(policy, identify(policy, env, hostname="llm-train-2"), nvrx)
    own, pod0 = pod_name(policy, 2), pod_name(policy, 0)
    assert f"--local-addr={own}" in plan.argv
    assert plan.endpoint == f"{pod0}:{policy.rendezvous.port}"
    assert own.split(".", 1)[1] == pod0.split(".", 1)[1]  # same Service, namespace and domain


OFF = "--ft-max-no-progress-cycles=0"
"""NVRx 0.6+'s progress tracker, off on every node: it needs an iteration file nvtrain does not
keep, and without one it only warns at each restart that it is inactive."""


@pytest.mark.parametrize(
    ("nvrx", "has_ib", "has_gpu", "expected"),
    [
        (V041, False, False, ["--ft-restart-policy=any-failed", "--ft-enable-nic-monitor=false"]),
        (V041, False, True, ["--ft-restart-policy=any-failed", "--ft-enable-nic-monitor=false"]),
        (V041, True, False, ["--ft-restart-policy=any-failed"]),
        (V041, True, True, ["--ft-restart-policy=any-failed"]),
        (V060, False, False, ["--ft-enable-nic-healthcheck=false", "--ft-gpu-memory-reclaim-timeout=0", OFF]),
        (V060, True, False, ["--ft-gpu-memory-reclaim-timeout=0", OFF]),
        (V060, False, True, ["--ft-enable-nic-healthcheck=false", "--ft-gpu-memory-poll-interval=0.05", OFF]),
        (V070, True, True, ["--ft-gpu-memory-poll-interval=0.05", OFF]),
    ],
)
def test_hardware_dependent_flags(
    nvrx: NvrxVersion, has_ib: bool, has_gpu: bool, expected: list[str]
) -> None:
    plan = plan_for(multinode_policy(), node_identity(1, has_infiniband=has_ib, has_gpu=has_gpu), nvrx)
    start = plan.argv.index("--ft-rank-heartbeat-timeout=120") + 1
    assert plan.argv[start : plan.argv.index("-m", start)] == expected


def test_min_healthy_is_passed_to_nvrx_0_4() -> None:
    data = standalone_policy().model_dump(by_alias=True)
    data["restart"]["in_job"]["policy"] = "min-healthy"
    policy = Policy.model_validate(data)
    assert "--ft-restart-policy=min-healthy" in plan_for(policy, standalone_identity(), V041).argv


def test_module_vs_script_and_extra_args_last() -> None:
    by_script = plan_for(standalone_policy(), standalone_identity(), V041, extra_args=("--seed", "7"))
    # ft_launcher runs the script through nvtrain.entry (python SCRIPT, without the
    # interpreter's finalization at the end)
    assert by_script.argv[-7:] == ["-m", "nvtrain.entry", "train.py", "--lr", "0.1", "--seed", "7"]
    assert by_script.argv[3:].count("-m") == 1
    by_module = plan_for(
        standalone_policy(script=None, module="mypkg.train", args=[]),
        standalone_identity(),
        V060,
        extra_args=("--seed", "7"),
    )
    assert by_module.argv[-6:] == ["-m", "nvtrain.entry", "-m", "mypkg.train", "--seed", "7"]
    # after the launcher module: ft_launcher's own "-m" (its --module), then the training module's
    assert by_module.argv[3:].count("-m") == 2


def test_fractional_and_long_durations() -> None:
    policy = standalone_policy(stop_timeout="2.5s")
    plan = plan_for(policy, standalone_identity(), V041)
    assert "--term-timeout=2.5" in plan.argv
    assert "--workers-stop-timeout=2.5" in plan.argv
    assert plan.stop_timeout == 2.5


def test_shell_line_quotes_and_puts_env_first() -> None:
    plan = plan_for(standalone_policy(args=["--name", "two words"]), standalone_identity(), V041)
    line = plan.shell()
    assert line.startswith(f"GROUP_RANK=0 NCCL_NVLS_ENABLE=0 NVTRAIN_EVENTS={EVENTS_PATH} ")
    assert line.endswith("train.py --name 'two words'")
    assert f"python3 -m nvtrain.nvrx.ftmain {LAUNCHER_MODULE} --nnodes=1:1" in line


# -- [rendezvous] store = "control": the store in a pod of its own ------------------------------

CONTROL = "llm-train-control.llm-svc.research.svc.cluster.example"


@pytest.mark.parametrize("rank", [0, 1, 3])
@pytest.mark.parametrize("nvrx", [V060, V070], ids=str)
def test_with_a_control_pod_no_training_pod_hosts_the_store(rank: int, nvrx: NvrxVersion) -> None:
    plan = plan_for(multinode_policy(store="control"), node_identity(rank), nvrx)
    assert plan.is_host is False
    assert plan.endpoint == f"{CONTROL}:29600"
    assert plan.wait_for == CONTROL  # pod 0's name is not needed by anyone
    assert f"--rdzv-endpoint={CONTROL}:29600" in plan.argv
    # The rendezvous is named after the job: the control pod cannot know the Job's uid. The
    # run id (events log, checkpoints) stays the Job's.
    assert "--rdzv-id=llm-train" in plan.argv
    assert "--rdzv-conf=is_host=0,join_timeout=91,store_connect_wait_seconds=91" in plan.argv
    assert plan.env["NVTRAIN_RUN_ID"] == RUN_ID


def test_store_control_is_ignored_by_a_standalone_job() -> None:
    policy = standalone_policy()
    policy = policy.model_copy(
        update={"rendezvous": policy.rendezvous.model_copy(update={"store": "control"})}
    )
    assert plan_for(policy, standalone_identity(), V070) == plan_for(
        standalone_policy(), standalone_identity(), V070
    )


def control_plan(policy: Policy, nvrx: NvrxVersion = V070, address: str | None = "10.0.0.99") -> ControlPlan:
    return build_control_plan(policy, nvrx, python="python3", address=address)


@pytest.mark.parametrize("nvrx", [V060, V070], ids=str)
def test_control_plan_runs_nvrx_control_on_the_policy(nvrx: NvrxVersion) -> None:
    plan = control_plan(multinode_policy(store="control"), nvrx)
    assert plan.argv == [
        "python3",
        "-m",
        "nvidia_resiliency_ext.fault_tolerance.control_plane",  # the module of `nvrx-control`
        "--nnodes=3:4",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={CONTROL}:29600",
        "--rdzv-id=llm-train",
        "--rdzv-conf=join_timeout=91",
        "--ft-enable-log-server=false",
        "--local-addr=10.0.0.99",
    ]
    assert (plan.endpoint, plan.wait_for, plan.rendezvous_id, plan.stop_timeout) == (
        f"{CONTROL}:29600",
        CONTROL,
        "llm-train",
        10.0,
    )
    # The launchers dial what the control pod serves, under the same rendezvous id.
    launcher = plan_for(multinode_policy(store="control"), node_identity(1), nvrx)
    assert launcher.endpoint == plan.endpoint
    assert f"--rdzv-id={plan.rendezvous_id}" in launcher.argv
    assert not any(
        a.startswith("--local-addr") for a in control_plan(multinode_policy(store="control"), nvrx, None).argv
    )


@pytest.mark.parametrize(
    ("policy", "nvrx", "message", "fix"),
    [
        (multinode_policy(), V070, 'store = "pod0"', 'store = "control"'),
        (multinode_policy(store="control"), V041, "NVRx 0.4.1 has no control-plane", "0.6 or later"),
        (
            multinode_policy(store="control", nodes=1, min_nodes=None),
            V070,
            "nodes = 1",
            "two or more nodes",
        ),
    ],
    ids=["store-in-pod0", "nvrx-0.4", "one-node"],
)
def test_control_plan_refuses_what_has_no_control_pod(
    policy: Policy, nvrx: NvrxVersion, message: str, fix: str
) -> None:
    with pytest.raises(UsageError) as caught:
        control_plan(policy, nvrx)
    assert message in caught.value.message
    assert fix in caught.value.fix


# Golden files: what `nvtrain run --dry-run` prints, for each version and node layout.
GOLDEN_CASES = {
    "standalone_nvrx_0_4_1": (standalone_policy, lambda: standalone_identity(), V041),
    "standalone_nvrx_0_6_0": (standalone_policy, lambda: standalone_identity(), V060),
    "standalone_nvrx_0_7_0": (standalone_policy, lambda: standalone_identity(), V070),
    "multinode_node0_nvrx_0_4_1": (multinode_policy, lambda: node_identity(0), V041),
    "multinode_node1_nvrx_0_6_0": (
        multinode_policy,
        lambda: node_identity(1, has_gpu=False, has_infiniband=False),
        V060,
    ),
    "multinode_node3_nvrx_0_7_0": (multinode_policy, lambda: node_identity(3, address=None), V070),
    "control_store_node0_nvrx_0_7_0": (
        lambda: multinode_policy(store="control"),
        lambda: node_identity(0),
        V070,
    ),
    "heartbeat_unset_sections_nvrx_0_4_1": (lambda: sections_policy(), lambda: standalone_identity(), V041),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_dry_run_golden(name: str) -> None:
    make_policy, make_identity, nvrx = GOLDEN_CASES[name]
    plan = plan_for(make_policy(), make_identity(), nvrx)
    actual = json.loads(json.dumps(plan.to_dict()))
    target = GOLDEN / f"{name}.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(actual, indent=2) + "\n", encoding="utf-8")
    assert target.is_file(), f"{target} is missing: run with NVTRAIN_UPDATE_GOLDEN=1 to create it"
    assert actual == json.loads(target.read_text(encoding="utf-8"))


def test_golden_files_have_no_strays() -> None:
    on_disk = {p.stem for p in GOLDEN.glob("*.json")}
    assert on_disk == set(GOLDEN_CASES), "delete golden files whose case is gone"


def test_nvrx_version_properties() -> None:
    assert NvrxVersion.parse("0.4.1") == NvrxVersion(0, 4, 1)
    assert NvrxVersion.parse("v0.7") == NvrxVersion(0, 7, 0)
    assert NvrxVersion.parse("0.6.0rc1") == NvrxVersion(0, 6, 0)
    assert (V041.supports_min_healthy, V060.supports_min_healthy, V070.supports_min_healthy) == (
        True,
        False,
        False,
    )
    assert (V041.barrier_rendezvous, V060.barrier_rendezvous) == (False, True)
    assert (V041.has_control_plane, V060.has_control_plane, V070.has_control_plane) == (False, True, True)
    with pytest.raises(ValueError, match="not an NVRx version"):
        NvrxVersion.parse("latest")


def test_each_launcher_has_its_own_state_folder(tmp_path: Path) -> None:
    """Two launchers of the same run and node on one machine (e.g. two test runs) keep the
    resolved policy in different folders, so one ending (it removes its folder) cannot take
    the other's policy away."""
    import multiprocessing

    from nvtrain.launcher.supervisor import prepare

    policy = Policy.model_validate(
        {"job": {"name": "llm-train", "script": "train.py"}, "checkpoint": {"dir": str(tmp_path)}}
    )
    _, mine = prepare(policy, standalone_identity(), nvrx=V041)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        theirs = pool.apply(_state_dir_in_another_process, (str(tmp_path),))
    assert mine.policy.parent == mine.state_dir
    assert mine.state_dir.name.startswith(f"nvtrain-{RUN_ID}-node0-")
    assert Path(theirs).name.startswith(f"nvtrain-{RUN_ID}-node0-")
    assert Path(theirs) != mine.state_dir
    assert mine.run_dir == tmp_path / RUN_ID  # the checkpoints stay shared


def _state_dir_in_another_process(checkpoint_dir: str) -> str:
    from nvtrain.launcher.supervisor import prepare

    policy = Policy.model_validate(
        {"job": {"name": "llm-train", "script": "train.py"}, "checkpoint": {"dir": checkpoint_dir}}
    )
    return str(prepare(policy, standalone_identity(), nvrx=V041)[1].state_dir)


def test_warm_start_runs_the_client_and_plans_the_server() -> None:
    policy = standalone_policy()
    policy = policy.model_copy(update={"job": policy.job.model_copy(update={"warm_start": True})})
    plan = build_plan(
        policy,
        standalone_identity(),
        V070,
        python="python3",
        policy_path=POLICY_PATH,
        events_path=EVENTS_PATH,
        extra_args=("--lr", "0.1"),
        zygote_path="/tmp/state/zygote.sock",
    )
    tail = plan.argv[plan.argv.index("nvtrain.zygote.client") - 1 :]
    assert tail == ["-m", "nvtrain.zygote.client", "train.py", *policy.job.args, "--lr", "0.1"]
    assert plan.env["NVTRAIN_ZYGOTE"] == "/tmp/state/zygote.sock"
    server = ["python3", "-m", "nvtrain.zygote.server", "--socket", "/tmp/state/zygote.sock"]
    assert plan.zygote == [*server, "--script", "train.py"]
    # Off (the default), or without a socket path: the script is ft_launcher's entrypoint.
    cold = plan_for(standalone_policy(), standalone_identity(), V070)
    assert (
        cold.zygote is None and "NVTRAIN_ZYGOTE" not in cold.env and "nvtrain.zygote.client" not in cold.argv
    )


# -- [heartbeat]: NVRx's fault-tolerance config, as a file and on the command line --------------


def sections_policy(**heartbeat: Any) -> Policy:
    """No heartbeat timeouts (NVRx's own behaviour), sections as an NVRx sections client uses."""
    data = standalone_policy().model_dump(by_alias=True, exclude_unset=True)
    data["heartbeat"] = {
        "monitor_interval": "1s",
        "sections": {"init": "5m", "step": "30s", "checkpoint": "auto"},
        "out_of_section_timeout": "1m",
        **heartbeat,
    }
    return Policy.model_validate(data)


def unset_policy() -> Policy:
    data = standalone_policy().model_dump(by_alias=True, exclude_unset=True)
    data["heartbeat"] = {"monitor_interval": "5s"}
    return Policy.model_validate(data)


@pytest.mark.parametrize("nvrx", [V041, V060, V070], ids=str)
def test_unset_heartbeat_timeouts_reach_nvrx_as_null(nvrx: NvrxVersion) -> None:
    policy = unset_policy()
    plan = plan_for(policy, standalone_identity(), nvrx)
    assert f"--ft-cfg-path={FT_CONFIG_PATH}" in plan.argv
    assert not any("heartbeat-timeout" in a or "section" in a for a in plan.argv)
    assert "--ft-workload-check-interval=5" in plan.argv
    assert ft_config(policy.heartbeat) == {
        "workload_check_interval": 5.0,
        "initial_rank_heartbeat_timeout": None,
        "rank_heartbeat_timeout": None,
        "rank_section_timeouts": {},
        "rank_out_of_section_timeout": None,
    }


@pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning")
def test_the_ft_config_file_is_what_nvrx_0_4_reads(tmp_path: Path) -> None:
    """NVRx's own loader reads the file (JSON, which is YAML): null is None, where 0.4's
    defaults would be 3600 s and 2700 s; the command line then wins over the file."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    assert V041.default_heartbeat_timeouts == (3600.0, 2700.0)
    assert V070.default_heartbeat_timeouts == (None, None)
    policy = sections_policy()
    path = tmp_path / "ft_config.yaml"
    path.write_text(ft_config_text(policy.heartbeat), encoding="utf-8")
    plan = build_plan(
        policy,
        standalone_identity(),
        V041,
        python="python3",
        policy_path=POLICY_PATH,
        events_path=EVENTS_PATH,
        ft_config_path=str(path),
    )
    options = [a for a in plan.argv if a.startswith("--ft-")]
    cfg = FaultToleranceConfig.from_args(get_args_parser().parse_args([*options, "train.py"]))
    assert cfg.initial_rank_heartbeat_timeout is None
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.rank_section_timeouts == {"init": 300.0, "step": 30.0, "checkpoint": None}
    assert cfg.rank_out_of_section_timeout == 60.0
    assert cfg.workload_check_interval == 1.0
    # Set timeouts are on the command line too, and it wins over the file.
    set_policy = standalone_policy()
    path.write_text(ft_config_text(sections_policy().heartbeat), encoding="utf-8")
    options = [a for a in plan_for(set_policy, standalone_identity(), V041).argv if a.startswith("--ft-")]
    options = [f"--ft-cfg-path={path}" if a.startswith("--ft-cfg-path") else a for a in options]
    cfg = FaultToleranceConfig.from_args(get_args_parser().parse_args([*options, "train.py"]))
    assert (cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout) == (1200.0, 300.0)


def test_sections_on_the_command_line_when_one_is_fixed() -> None:
    plan = plan_for(sections_policy(), standalone_identity(), V041)
    assert "--ft-rank-section-timeouts=init:300,step:30,checkpoint:none" in plan.argv
    assert "--ft-rank-out-of-section-timeout=60" in plan.argv
    auto = sections_policy(sections={"step": "auto"}, out_of_section_timeout="auto")
    plan = plan_for(auto, standalone_identity(), V070)
    assert not any("section" in a for a in plan.argv)  # all in the file, as null
    assert ft_config(auto.heartbeat)["rank_section_timeouts"] == {"step": None}
    assert ft_config(auto.heartbeat)["rank_out_of_section_timeout"] is None


def test_launcher_options_go_after_nvtraines_own_before_the_entrypoint() -> None:
    plan = build_plan(
        standalone_policy(),
        standalone_identity(),
        V041,
        python="python3",
        policy_path=POLICY_PATH,
        events_path=EVENTS_PATH,
        launcher_options=("--tee=3", "--log-dir=/tmp/logs"),
        extra_args=("--seed", "7"),
    )
    at = plan.argv.index("--tee=3")
    assert plan.argv[at - 1] == "--ft-enable-nic-monitor=false"
    assert plan.argv[at:] == [
        "--tee=3",
        "--log-dir=/tmp/logs",
        "-m",
        "nvtrain.entry",
        "train.py",
        "--lr",
        "0.1",
        "--seed",
        "7",
    ]


def _env_defaults(policy: Policy, tmp_path: Path) -> dict[str, str]:
    from nvtrain.launcher.rundir import prepare

    return prepare(policy, standalone_identity(), nvrx=V041, python="python3")[0].env_defaults


QUIET = {
    # torch's pynvml FutureWarning, ignored by message, category and module in every process
    "PYTHONWARNINGS": "ignore:The pynvml package is deprecated:FutureWarning:torch.cuda",
    "OMP_NUM_THREADS": "1",  # torchrun's value for 2 workers a node, without ft_launcher's banner
}
"""In every plan of 2 workers a node, whatever the script and layers."""
NCCL_AND_LOG = {
    **QUIET,
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0",
    "NCCL_NVLS_ENABLE": "0",
}


@pytest.mark.parametrize(
    ("source", "uses"),
    [
        ("import torch\nimport torch.distributed as dist\n", False),
        ("import nvtrain.worker as nw\n", True),
        ("from nvtrain import worker\n", True),
        ("def main():\n    from nvtrain.worker import run\n", True),
        ("import nvtrainer\n", False),
        ("this is not python(\n", True),  # unreadable counts as yes
    ],
)
def test_env_defaults_only_for_the_worker_library_with_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, uses: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(source, encoding="utf-8")
    policy = standalone_policy().model_copy(
        update={"checkpoint": standalone_policy().checkpoint.model_copy(update={"dir": str(tmp_path)})}
    )
    assert uses_worker_library(policy.job) is uses
    assert _env_defaults(policy, tmp_path) == (NCCL_AND_LOG if uses else QUIET)
    # In-process restart off: nothing, whatever the script.
    off = policy.model_copy(
        update={
            "restart": policy.restart.model_copy(
                update={"in_process": policy.restart.in_process.model_copy(update={"enabled": False})}
            )
        }
    )
    assert _env_defaults(off, tmp_path) == QUIET


def test_a_missing_script_counts_as_using_the_worker_library(tmp_path: Path) -> None:
    assert uses_worker_library(standalone_policy(script=str(tmp_path / "absent.py")).job) is True


def test_modules_are_read_without_being_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "mypkg_nvt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n", encoding="utf-8")
    (pkg / "plain.py").write_text("import torch\n", encoding="utf-8")
    (pkg / "lib.py").write_text("from nvtrain.worker import run\n", encoding="utf-8")
    (pkg / "__main__.py").write_text("import nvtrain.worker\n", encoding="utf-8")

    def job(module: str) -> Any:
        return standalone_policy(script=None, module=module).job

    assert uses_worker_library(job("mypkg_nvt.plain")) is False
    assert uses_worker_library(job("mypkg_nvt.lib")) is True
    assert uses_worker_library(job("mypkg_nvt")) is True  # runs mypkg_nvt/__main__.py
    assert uses_worker_library(job("mypkg_nvt.absent")) is True  # not found: yes
    assert uses_worker_library(job("json.tool")) is False  # the standard library, sources read


def test_prepare_hands_the_workers_the_run_key_and_ft_launcher_a_private_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan names the run's secret (``NVTRAIN_RUN_KEY_FILE``, in the state folder), gives
    ft_launcher a TMPDIR of the run's own and keeps the user's for the script; a state folder
    too long for NVRx's socket paths gets a short private folder beside it instead."""
    import tempfile

    from nvtrain.launcher.rundir import MAX_SOCKET_DIR, launcher_tmpdir, prepare

    user_tmp = tmp_path / "t"
    user_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(user_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # found again from TMPDIR
    policy = Policy.model_validate(
        {"job": {"name": "llm-train", "script": "train.py"}, "checkpoint": {"dir": str(tmp_path)}}
    )
    plan, paths = prepare(policy, standalone_identity(), nvrx=V041)
    assert paths.state_dir.parent == user_tmp
    assert paths.run_key == paths.state_dir / "run.key"
    assert paths.launcher_tmp is not None and len(str(paths.launcher_tmp)) <= MAX_SOCKET_DIR
    assert plan.env["NVTRAIN_RUN_KEY_FILE"] == str(paths.run_key)
    assert plan.env["TMPDIR"] == str(paths.launcher_tmp)
    assert plan.env["NVTRAIN_USER_TMPDIR"] == str(user_tmp)

    short = Path("/tmp/nvtrain-r-node0-1")
    assert launcher_tmpdir(short) == short / "tmp"
    long_state = Path("/tmp") / ("nvtrain-" + "x" * 60 + "-node0-1")
    beside = launcher_tmpdir(long_state)
    assert beside.parent == Path("/tmp") and beside.name.startswith(f"nvtrain-{os.getpid()}-")
    assert launcher_tmpdir(long_state) != beside  # a random name: nothing to pre-create
    deep = Path("/" + "d" * 70) / "nvtrain-r-node0-1"
    assert launcher_tmpdir(deep).parent == Path("/tmp")


@pytest.mark.parametrize(("nproc", "omp"), [(1, None), (2, "1"), (8, "1"), ("gpu", None), ("cpu", None)])
def test_omp_threads_default_as_torchrun_for_several_workers(nproc: int | str, omp: str | None) -> None:
    """torchrun's ``OMP_NUM_THREADS=1`` for several workers a node, given by the plan so that
    ft_launcher prints no banner; a count known only at launch (``gpu``, ``cpu``) is left to it."""
    plan = plan_for(standalone_policy(nproc_per_node=nproc), standalone_identity(), V070)
    assert plan.env_defaults.get("OMP_NUM_THREADS") == omp
    assert plan.env_defaults["PYTHONWARNINGS"] == QUIET["PYTHONWARNINGS"]  # every plan
    assert "OMP_NUM_THREADS" not in plan.env and "PYTHONWARNINGS" not in plan.env  # the pod's own wins


@pytest.mark.parametrize("nvrx", [V041, V060, V070], ids=str)
def test_progress_tracker_off_where_nvrx_has_one(nvrx: NvrxVersion) -> None:
    argv = plan_for(standalone_policy(), standalone_identity(), nvrx).argv
    assert (OFF in argv) is nvrx.barrier_rendezvous  # 0.6+ only: 0.4 has no such option
