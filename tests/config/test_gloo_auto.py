"""``backend = "auto"`` and the gloo rule: the ``auto-backend`` warning of ``nvtrain validate``,
and the collective timeout a worker derives once it knows what "auto" resolved to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config import Policy, validate_source
from nvtrain.config.derive import DERIVED_KEYS, derive_defaults
from nvtrain.launcher.overrides import on_this_node
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.7.0")
JOB = '[job]\nname = "x"\nscript = "t.py"\nnproc_per_node = 2\n'
TEN_MINUTES = 'collective_timeout = "10m"\n'
ROOT = Path(__file__).resolve().parents[2]


def _findings(text: str) -> list[tuple[str, str, str]]:
    result = validate_source(text, "p.toml", nvrx=NVRX)
    return [(f.severity, f.code, f.where) for f in result.findings if f.severity != "info"]


AUTO_WARNING = ("warning", "auto-backend", "[job] collective_timeout")


# -- the finding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["", 'backend = "auto"\n'])
def test_auto_with_an_explicit_collective_timeout_warns_with_where_rule_and_fix(backend: str) -> None:
    text = JOB + backend + TEN_MINUTES
    result = validate_source(text, "p.toml", nvrx=NVRX)
    (finding,) = [f for f in result.findings if f.severity != "info"]
    assert (finding.severity, finding.code, finding.table, finding.key) == AUTO_WARNING[:2] + (
        "job",
        "collective_timeout",
    )
    assert (finding.file, finding.line, finding.value) == (
        "p.toml",
        text.splitlines().index(TEN_MINUTES[:-1]) + 1,
        '"10m"',
    )
    assert 'backend = "auto"' in finding.rule and "gloo on machines without a GPU" in finding.rule
    assert "soft_timeout (1m)" in finding.rule  # the rule it breaks, with the value it must stay below
    assert "a hang in C code" in finding.rule and "freed only by this timeout" in finding.rule
    assert 'set backend explicitly ("gloo" for CPU workers, "nccl" for GPUs)' in finding.fix
    assert "remove collective_timeout" in finding.fix and '"45s" with gloo' in finding.fix
    assert result.ok  # a warning: the policy is valid as NCCL


def test_the_fix_names_the_collective_timeout_that_gloo_would_derive() -> None:
    text = JOB + TEN_MINUTES + '[restart.in_process]\nsoft_timeout = "20s"\nhard_timeout = "30s"\n'
    (finding,) = [f for f in validate_source(text, "p.toml", nvrx=NVRX).findings if f.severity != "info"]
    assert finding.code == "auto-backend" and '"15s" with gloo' in finding.fix


def test_unknown_ranks_per_node_warn_too() -> None:
    assert _findings(JOB.replace("2", '"gpu"') + TEN_MINUTES) == [AUTO_WARNING]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(JOB, id="collective-timeout-unset"),
        pytest.param(JOB + 'backend = "nccl"\n' + TEN_MINUTES, id="nccl"),
        pytest.param(JOB + TEN_MINUTES + "[restart.in_process]\nenabled = false\n", id="in-process-off"),
        pytest.param(JOB.replace("2", "1") + TEN_MINUTES, id="one-rank"),
        pytest.param(JOB + '[heartbeat]\ntimeout = "30s"\n', id="derived-timeouts"),
    ],
)
def test_silent_where_the_gloo_rule_cannot_break(text: str) -> None:
    assert _findings(text) == []


IN_PROCESS = '[restart.in_process]\nsoft_timeout = "1m"\nhard_timeout = "90s"\n'
"""The in-process timeouts written (else they follow an explicit collective timeout)."""


@pytest.mark.parametrize("job", [JOB + 'backend = "gloo"\n', JOB.replace("2", '"cpu"')], ids=["gloo", "cpu"])
def test_where_validate_sees_gloo_its_errors_apply_not_the_warning(job: str) -> None:
    found = _findings(job + TEN_MINUTES + IN_PROCESS)
    assert found and all(f == ("error", "timeout-order", "[job] collective_timeout") for f in found)
    # With the in-process timeouts left out they follow the collective timeout: nothing to report.
    assert _findings(job + TEN_MINUTES) == []


@pytest.mark.parametrize("collective", ["45s", "75s"])
def test_a_collective_timeout_the_nccl_rule_rejects_gets_that_error_only(collective: str) -> None:
    # Not above the hard timeout: the NCCL error says so, and its fix names gloo for CPU jobs.
    assert _findings(JOB + f'collective_timeout = "{collective}"\n' + IN_PROCESS) == [
        ("error", "timeout-order", "[job] collective_timeout")
    ]


def test_derived_in_process_timeouts_below_the_collective_timeout_still_warn() -> None:
    # As NCCL the soft and hard timeouts follow the collective timeout down (2/3 of it): valid,
    # but as gloo the collective timeout would outlast them.
    result = validate_source(JOB + 'collective_timeout = "45s"\n', "p.toml", nvrx=NVRX)
    assert result.policy is not None and result.policy.restart.in_process.hard_timeout == 30.0
    assert [(f.severity, f.code, f.where) for f in result.findings if f.severity != "info"] == [AUTO_WARNING]


def test_validate_does_not_look_at_the_machine() -> None:
    # The same verdict whatever this machine has: the rule reads the policy only.
    auto = validate_source(JOB, "p.toml", nvrx=NVRX).policy
    assert auto is not None and auto.job.collective_timeout == 600.0


# -- the derivation with the backend "auto" resolved to ------------------------------------------


def _data(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


def test_auto_resolved_to_gloo_derives_the_gloo_collective_timeout() -> None:
    data, derived = derive_defaults(_data(JOB), backend="gloo")
    assert data["job"]["collective_timeout"] == 45.0
    assert derived == {"job.collective_timeout": "[restart.in_process] soft_timeout (with gloo)"}
    # The soft and hard timeouts are those validate showed, written out: nothing more is derived.
    assert data["restart"]["in_process"] == {"hard_timeout": 90.0, "soft_timeout": 60.0}
    assert derive_defaults(data) == (data, {})
    policy = Policy.model_validate(data)
    assert (policy.job.collective_timeout, policy.job.backend) == (45.0, "auto")


def test_gloo_follows_the_derived_soft_timeout() -> None:
    text = JOB + '[heartbeat]\ntimeout = "30s"\n'
    shown = validate_source(text, "p.toml", nvrx=NVRX).policy
    assert shown is not None
    data, _ = derive_defaults(_data(text), backend="gloo")
    policy = Policy.model_validate(data)
    ip = policy.restart.in_process
    assert (ip.soft_timeout, ip.hard_timeout) == (shown.restart.in_process.soft_timeout, 20.0)
    assert policy.job.collective_timeout == 9.999  # 3/4 of 13.333 s


def test_auto_resolved_to_nccl_derives_as_validate_does() -> None:
    text = JOB + '[restart.in_process]\nsoft_timeout = "5m"\n'
    shown = validate_source(text, "p.toml", nvrx=NVRX).policy
    assert shown is not None and shown.job.collective_timeout == 900.0
    data, _ = derive_defaults(_data(text), backend="nccl")
    assert Policy.model_validate(data) == shown


def test_nccl_resolved_on_cpu_ranks_follows_the_hard_timeout() -> None:
    data, _ = derive_defaults(_data(JOB.replace("2", '"cpu"')), backend="nccl")
    assert data["job"]["collective_timeout"] == 600.0


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(JOB + TEN_MINUTES, id="explicit-collective-timeout"),
        pytest.param(JOB + 'backend = "nccl"\n', id="nccl-written"),
        pytest.param(JOB + "[restart.in_process]\nenabled = false\n", id="in-process-off"),
        pytest.param(JOB + 'backend = "gloo"\ncollective_timeout = "2m"\n', id="gloo-written"),
    ],
)
def test_the_resolved_backend_changes_nothing_else(text: str) -> None:
    assert derive_defaults(_data(text), backend="gloo") == derive_defaults(_data(text))


def test_only_the_documented_keys_are_ever_derived() -> None:
    table = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8").split("## Derived defaults", 1)[1]
    documented = set()
    for table_name, key in re.findall(
        r"^\| `\[([\w.]+)\] (\w+)` \|", table.split("\n## ", 1)[0], re.MULTILINE
    ):
        documented.add(f"{table_name}.{key}")
    assert documented == DERIVED_KEYS


# -- what this node's workers get (nvtrain run) -------------------------------------------------


def _policy(text: str) -> Policy:
    policy = validate_source(text, "p.toml", nvrx=None).policy
    assert policy is not None
    return policy


def test_auto_on_a_node_without_a_gpu_gets_the_gloo_collective_timeout() -> None:
    policy = _policy(JOB)
    assert policy.job.collective_timeout == 600.0  # validate's view: "auto" as NCCL
    local = on_this_node(policy, has_gpu=False)
    assert local.job.collective_timeout == 45.0  # 3/4 of the soft timeout (1 minute)
    assert local.restart.in_process == policy.restart.in_process  # nothing else moves
    assert local.model_dump(exclude={"job"}) == policy.model_dump(exclude={"job"})
    assert local.derived == policy.derived


@pytest.mark.parametrize(
    ("text", "has_gpu"),
    [
        pytest.param(JOB, True, id="gpu-node"),
        pytest.param(JOB + TEN_MINUTES, False, id="explicit-collective-timeout"),
        pytest.param(JOB + 'backend = "nccl"\n', False, id="nccl-written"),
        pytest.param(JOB + 'backend = "gloo"\n', False, id="gloo-written"),
        pytest.param(JOB + "[restart.in_process]\nenabled = false\n", False, id="in-process-off"),
    ],
)
def test_every_other_policy_runs_as_resolved(text: str, has_gpu: bool) -> None:
    policy = _policy(text)
    assert on_this_node(policy, has_gpu) is policy


@pytest.mark.parametrize(
    "path", sorted((ROOT / "tests" / "config" / "policies" / "valid").glob("*.toml")), ids=lambda p: p.stem
)
def test_a_valid_policy_stays_valid_on_a_node_without_a_gpu(path: Path) -> None:
    policy = validate_source(path.read_bytes(), str(path), nvrx=None).policy
    assert policy is not None
    local = on_this_node(policy, has_gpu=False)
    assert Policy.model_validate_json(local.model_dump_json(by_alias=True)) == local
