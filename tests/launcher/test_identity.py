"""Where this pod stands: node rank, address and run id, from an explicit environment mapping.

``identify`` is given ``env`` and ``hostname`` explicitly in every test, so nothing here depends
on the machine the tests run on (except ``has_gpu``/``has_infiniband``, which read /dev and /sys).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, UsageError
from nvtrain.launcher.dns import pod_name
from nvtrain.launcher.identity import Identity, identify, new_run_id


def policy(nodes: int = 4, name: str = "llm-train") -> Policy:
    return Policy.model_validate(
        {"job": {"name": name, "script": "train.py"}, "rendezvous": {"nodes": nodes}}
    )


def ident(env: dict[str, str], *, nodes: int = 4, hostname: str = "somewhere", **kw: Any) -> Identity:
    return identify(policy(nodes), env, hostname=hostname, **kw)


RUN = {"NVTRAIN_RUN_ID": "job-uid-1234"}


def test_nvtrain_node_rank_beats_completion_index_and_hostname() -> None:
    env = {**RUN, "NVTRAIN_NODE_RANK": "2", "JOB_COMPLETION_INDEX": "1"}
    assert ident(env, hostname="llm-train-3").node_rank == 2


def test_completion_index_beats_hostname() -> None:
    env = {**RUN, "JOB_COMPLETION_INDEX": "1"}
    assert ident(env, hostname="llm-train-3").node_rank == 1


@pytest.mark.parametrize(
    ("hostname", "rank"),
    [
        ("llm-train-3", 3),
        ("llm-train-0", 0),
        ("llm-train-2.llm-train.default.svc.cluster.local", 2),
    ],
)
def test_hostname_suffix_is_the_last_resort(hostname: str, rank: int) -> None:
    assert ident(dict(RUN), hostname=hostname).node_rank == rank


def test_blank_variables_are_skipped() -> None:
    env = {**RUN, "NVTRAIN_NODE_RANK": "  ", "JOB_COMPLETION_INDEX": " 3 "}
    assert ident(env, hostname="llm-train-1").node_rank == 3


def test_hostname_from_env_when_not_given() -> None:
    found = identify(policy(), {**RUN, "HOSTNAME": "llm-train-2"})
    assert (found.node_rank, found.hostname) == (2, "llm-train-2")


@pytest.mark.parametrize("var", ["NVTRAIN_NODE_RANK", "JOB_COMPLETION_INDEX"])
@pytest.mark.parametrize("value", ["one", "-1", "1.0", "0x1", "1 2"])
def test_non_numeric_index_is_a_usage_error(var: str, value: str) -> None:
    with pytest.raises(UsageError) as info:
        ident({**RUN, var: value})
    assert var in info.value.message
    assert "0 to 3" in info.value.fix
    assert info.value.exit_code == ExitCode.USAGE == 2


def test_superscript_digit_is_a_usage_error_not_a_crash() -> None:
    # "²".isdigit() is True but int("²") raises ValueError: identify must say what is wrong
    # (UsageError, exit 2) instead of crashing with a traceback.
    with pytest.raises(UsageError):
        ident({**RUN, "JOB_COMPLETION_INDEX": "²"})


# Any text, and text made of the characters that str.isdigit() and int() disagree about
# (Unicode categories Nd: decimal digits, No: other digits such as superscripts).
@given(st.one_of(st.text(max_size=6), st.text(st.characters(categories=("Nd", "No", "Zs")), max_size=4)))
def test_any_index_text_gives_a_rank_or_a_usage_error(text: str) -> None:
    try:
        found = ident({**RUN, "NVTRAIN_NODE_RANK": text}, hostname="elsewhere", nodes=10)
    except UsageError:
        return
    assert 0 <= found.node_rank < 10


@pytest.mark.parametrize(("index", "nodes"), [(4, 4), (9, 4), (1, 1)])
def test_index_outside_the_job_is_a_usage_error(index: int, nodes: int) -> None:
    with pytest.raises(UsageError, match=f"node index {index} is outside"):
        ident({**RUN, "JOB_COMPLETION_INDEX": str(index)}, nodes=nodes)


def test_hostname_index_outside_the_job_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="outside"):
        ident(dict(RUN), hostname="llm-train-7")


def test_multinode_without_any_index_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="node index") as info:
        ident(dict(RUN), hostname="other-job-1")
    assert "JOB_COMPLETION_INDEX" in info.value.fix
    assert "NVTRAIN_NODE_RANK" in info.value.fix


def test_multinode_without_run_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="run id") as info:
        ident({"JOB_COMPLETION_INDEX": "1"})
    assert "NVTRAIN_RUN_ID" in info.value.fix


def test_run_id_argument_beats_the_environment() -> None:
    env = {"NVTRAIN_RUN_ID": "from-env", "JOB_COMPLETION_INDEX": "0"}
    assert ident(env).run_id == "from-env"
    assert ident(env, run_id="from-flag").run_id == "from-flag"


@pytest.mark.parametrize("bad", ["has/slash", "-leading-dash", "has space", "x" * 129, "dollar$", "ünï"])
def test_bad_run_id_characters_are_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="run id"):
        ident({"JOB_COMPLETION_INDEX": "0"}, run_id=bad)


@pytest.mark.parametrize("good", ["a", "Job_1.2-3", "0" + "x" * 127])
def test_good_run_ids_are_kept(good: str) -> None:
    assert ident({"JOB_COMPLETION_INDEX": "0"}, run_id=good).run_id == good


def test_standalone_generates_a_run_id_starting_with_the_job_name() -> None:
    first = identify(policy(nodes=1), {}, hostname="laptop")
    second = identify(policy(nodes=1), {}, hostname="laptop")
    assert first.node_rank == 0 and first.standalone
    assert re.fullmatch(r"llm-train-\d{8}-\d{6}-[0-9a-f]{6}", first.run_id)
    assert first.run_id != second.run_id
    assert re.fullmatch(r"my-job-\d{8}-\d{6}-[0-9a-f]{6}", new_run_id("my-job"))


def test_standalone_keeps_a_given_run_id() -> None:
    assert identify(policy(nodes=1), {"NVTRAIN_RUN_ID": "mine"}, hostname="x").run_id == "mine"


def test_standalone_never_publishes_an_address() -> None:
    found = identify(policy(nodes=1), {"POD_IP": "10.1.2.3"}, hostname="x")
    assert found.address is None


def test_multinode_address_from_pod_ip() -> None:
    assert ident({**RUN, "JOB_COMPLETION_INDEX": "1", "POD_IP": " 10.1.2.3 "}).address == "10.1.2.3"
    found = ident({**RUN, "JOB_COMPLETION_INDEX": "1", "POD_IP": "10.1.2.3"})
    assert (found.standalone, found.hostname) == (False, "somewhere")


@pytest.mark.parametrize("pod_ip", [None, "", "  "])
def test_multinode_address_without_pod_ip_is_the_pods_own_stable_name(pod_ip: str | None) -> None:
    # Without POD_IP, NVRx would publish socket.getfqdn(), in a pod without `subdomain` a bare
    # hostname the peers cannot resolve. The pod's own headless-Service name resolves wherever
    # pod 0's name does (same naming function), so that is what the pod publishes.
    env = {**RUN, "JOB_COMPLETION_INDEX": "2"} | ({"POD_IP": pod_ip} if pod_ip is not None else {})
    found = ident(env, hostname="llm-train-2")
    assert found.address == "llm-train-2.llm-train.default.svc.cluster.local"
    assert found.address == pod_name(policy(), 2)


def test_own_name_follows_the_policys_service_namespace_and_domain() -> None:
    custom = Policy.model_validate(
        {
            "job": {"name": "llm-train", "script": "train.py"},
            "rendezvous": {"nodes": 3, "service": "svc-a", "namespace": "ml", "cluster_domain": "c.example"},
        }
    )
    found = identify(custom, {**RUN, "NVTRAIN_NODE_RANK": "0"}, hostname="elsewhere")
    assert found.address == "llm-train-0.svc-a.ml.svc.c.example"


def test_standalone_without_pod_ip_publishes_nothing() -> None:
    assert identify(policy(nodes=1), {}, hostname="laptop").address is None


@pytest.mark.parametrize(
    ("visible", "expected"),
    [("0,1", True), ("all", True), ("void", False), ("", False)],
)
def test_gpu_from_nvidia_visible_devices(visible: str, expected: bool) -> None:
    found = ident({**RUN, "JOB_COMPLETION_INDEX": "0", "NVIDIA_VISIBLE_DEVICES": visible})
    # A machine with a real GPU has one whatever the variable says.
    assert found.has_gpu is (expected or Path("/dev/nvidia0").exists())
    assert found.has_infiniband is Path("/sys/class/infiniband").is_dir()
