"""``nvtrain validate --manifest``: a rendered manifest checked against the policy and the timings
(``nvtrain.kube.manifest_checks``), through the command and real files."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import CONTROL, MINIMAL, policy_of, set_keys, starter_named, with_control_store
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.kube.manifest import render
from nvtrain.kube.manifest_checks import check_manifest
from nvtrain.kube.objects import grace_period
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump
from nvtrain.kube.yaml_positions import yaml_path

ROOT = Path(__file__).resolve().parents[2]
POLICY = set_keys(starter_named("llm-train"), {("rendezvous", "nodes"): "4", ("job", "stop_timeout"): '"2m"'})
JOBSET_POLICY = starter_named("llm-workers-0")
GRACE = "spec.template.spec.terminationGracePeriodSeconds"
JOBSET_GRACE = "spec.replicatedJobs[0].template.spec.template.spec.terminationGracePeriodSeconds"

runner = CliRunner()


def validate(*args: str) -> Result:
    result = runner.invoke(app, ["validate", "--nvrx", "0.7.0", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def files(tmp_path: Path, text: str = POLICY, jobset: bool = False) -> tuple[Path, Path]:
    """The policy and its freshly rendered manifest, as `nvtrain manifest -o` writes it."""
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    manifest = tmp_path / "job.yaml"
    result = runner.invoke(
        app, ["manifest", str(policy), "-o", str(manifest), *(["--jobset"] if jobset else [])]
    )
    assert result.exit_code == 0, result.output
    return policy, manifest


def edit(manifest: Path, change: Any) -> None:
    """Apply ``change`` to the workload (the last document) and write the file back."""
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    change(docs[-1])
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")


def as_json(*args: str) -> dict[str, Any]:
    result = validate(*args, "--json")
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def manifest_findings(data: dict[str, Any], manifest: Path) -> list[dict[str, Any]]:
    return [f for f in data["findings"] if f["file"] == str(manifest)]


def timings(tmp_path: Path, save_write: str) -> Path:
    path = tmp_path / "measured.toml"
    path.write_text(f'save_write = "{save_write}"\nstep = "1s"\n', encoding="utf-8")
    return path


def pod(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "JobSet":
        spec = spec["replicatedJobs"][0]["template"]["spec"]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


# -- a rendered manifest is clean -------------------------------------------------------------


@pytest.mark.parametrize("jobset", [False, True], ids=["job", "jobset"])
def test_a_freshly_rendered_manifest_has_no_findings(tmp_path: Path, jobset: bool) -> None:
    policy, manifest = files(tmp_path, JOBSET_POLICY if jobset else POLICY, jobset)
    # A measured write that the rendered grace period covers (2m + 30 s > 1m30s + 30 s).
    measured = timings(tmp_path, "90s" if not jobset else "30s")
    result = validate(str(policy), "--manifest", str(manifest), "--timings", str(measured), "--strict")
    assert result.exit_code == 0, result.output
    assert str(manifest) not in result.stderr


def test_library_finds_nothing_in_every_rendered_variant(tmp_path: Path) -> None:
    for text, options in (
        (MINIMAL, ManifestOptions()),
        (POLICY, ManifestOptions(efa=4, gpus_per_node=8)),
        (JOBSET_POLICY, ManifestOptions(jobset=True)),
    ):
        path = tmp_path / "m.yaml"
        path.write_text(dump(render(policy_of(text), text, options)), encoding="utf-8")
        assert check_manifest(path, policy_of(text), policy_text=text) == []


# -- the grace period against the measured checkpoint write -----------------------------------


@pytest.mark.parametrize("jobset", [False, True], ids=["job", "jobset"])
def test_a_shortened_grace_period_warns_with_file_line_path_value_and_fix(
    tmp_path: Path, jobset: bool
) -> None:
    policy, manifest = files(tmp_path, JOBSET_POLICY if jobset else POLICY, jobset)

    def shorten(doc: dict[str, Any]) -> None:
        pod(doc)["terminationGracePeriodSeconds"] = 45

    edit(manifest, shorten)
    measured = timings(tmp_path, "50s")  # 50 s + 30 s > 45 s; the policy's stop_timeout covers it
    data = as_json(str(policy), "--manifest", str(manifest), "--timings", str(measured))
    found = {f["code"]: f for f in manifest_findings(data, manifest)}
    assert set(found) == {"grace-before-write", "manifest-mismatch"}
    grace = found["grace-before-write"]
    assert grace["severity"] == "warning"
    assert grace["key"] == (JOBSET_GRACE if jobset else GRACE)
    assert grace["table"] == ("JobSet llm" if jobset else "Job llm-train")
    assert grace["value"] == "45"
    assert "50s" in grace["rule"] and "30 s" in grace["rule"]
    assert f"nvtrain manifest {policy}{' --jobset' if jobset else ''} -o {manifest}" in grace["fix"]
    line = manifest.read_text(encoding="utf-8").splitlines()[grace["line"] - 1]
    assert line.strip() == "terminationGracePeriodSeconds: 45"
    mismatch = found["manifest-mismatch"]
    rendered = grace_period(policy_of(JOBSET_POLICY if jobset else POLICY))
    assert mismatch["key"] == grace["key"] and f"renders {rendered} " in mismatch["rule"]
    # Human output: the file and line, the YAML path and the value, the rule and the fix.
    result = validate(str(policy), "--manifest", str(manifest), "--timings", str(measured), "--strict")
    assert result.exit_code == 1
    assert (
        f"  {manifest}:{grace['line']}:{grace['column']}: warning "
        f"[{grace['table']}] {grace['key']} = 45" in result.stderr.splitlines()
    )


def test_timings_from_a_run_directory_are_compared_too(tmp_path: Path) -> None:
    """``--timings`` may name a run directory; its measured write reaches the manifest check."""
    policy, manifest = files(tmp_path)
    edit(manifest, lambda doc: pod(doc).__setitem__("terminationGracePeriodSeconds", 45))
    run = tmp_path / "ckpt" / "run-1"
    run.mkdir(parents=True)
    events = [
        {"ts": 1000.0 + i, "event": "step", "step": i + 1, "step_s": 1.0, "pid": 7, "rank": 0}
        for i in range(5)
    ]
    events.append({"ts": 1060.0, "event": "checkpoint_committed", "step": 5, "write_s": 50.0, "rank": 0})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    data = as_json(str(policy), "--manifest", str(manifest), "--timings", str(run))
    [grace] = [f for f in manifest_findings(data, manifest) if f["code"] == "grace-before-write"]
    assert grace["value"] == "45" and "50s" in grace["rule"]


def test_grace_period_left_out_is_kubernetes_default_30_s(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)
    edit(manifest, lambda doc: pod(doc).pop("terminationGracePeriodSeconds"))
    data = as_json(str(policy), "--manifest", str(manifest), "--timings", str(timings(tmp_path, "10s")))
    found = {f["code"]: f for f in manifest_findings(data, manifest)}
    assert found["grace-before-write"]["value"] is None
    assert "default is 30 s" in found["grace-before-write"]["rule"]
    assert "is not set" in found["manifest-mismatch"]["rule"]


def test_a_write_longer_than_stop_timeout_says_to_raise_it_first(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)  # stop_timeout 2m: grace 150 s
    data = as_json(str(policy), "--manifest", str(manifest), "--timings", str(timings(tmp_path, "3m")))
    [grace] = [f for f in manifest_findings(data, manifest) if f["code"] == "grace-before-write"]
    assert grace["value"] == "150"
    assert 'raise [job] stop_timeout to at least "4m30s"' in grace["fix"]
    # The policy's own rule fires too, at the policy key.
    assert any(f["code"] == "stop-before-write" and f["file"] == str(policy) for f in data["findings"])


def test_without_timings_only_the_policy_is_compared(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)
    data = as_json(str(policy), "--manifest", str(manifest))
    assert manifest_findings(data, manifest) == []


# -- the manifest against the policy ----------------------------------------------------------


def test_wrong_parallelism_and_completions_warn(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)

    def shrink(doc: dict[str, Any]) -> None:
        doc["spec"]["parallelism"] = 3
        doc["spec"]["completions"] = 3

    edit(manifest, shrink)
    result = validate(str(policy), "--manifest", str(manifest), "--strict")
    assert result.exit_code == 1
    data = as_json(str(policy), "--manifest", str(manifest))
    found = manifest_findings(data, manifest)
    assert [(f["code"], f["key"], f["value"]) for f in found] == [
        ("manifest-mismatch", "spec.completions", "3"),
        ("manifest-mismatch", "spec.parallelism", "3"),
    ]
    assert all("[rendezvous] nodes" in f["rule"] and "renders 4" in f["rule"] for f in found)
    assert all("`nvtrain manifest" in f["fix"] for f in found)


def test_port_service_namespace_and_policy_text_are_compared(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    configmap, service, _, job = docs
    configmap["data"]["policy.toml"] += "# edited\n"
    service["spec"]["ports"][0]["port"] = 29501
    job["metadata"]["namespace"] = "other"
    pod(job)["subdomain"] = "elsewhere"
    pod(job)["containers"][0]["ports"][0]["containerPort"] = "29500"  # a string, not the number
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    found = {
        (f["table"], f["key"])
        for f in manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    }
    name = configmap["metadata"]["name"]
    assert found == {
        (f"ConfigMap {name}", 'data["policy.toml"]'),
        ("Service llm-train", "spec.ports[0].port"),
        ("Job llm-train", "metadata.namespace"),
        ("Job llm-train", "spec.template.spec.subdomain"),
        ("Job llm-train", "spec.template.spec.containers[0].ports[0].containerPort"),
    }


def test_jobset_replicas_and_subdomain_are_compared(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, JOBSET_POLICY, jobset=True)

    def change(doc: dict[str, Any]) -> None:
        doc["spec"]["replicatedJobs"][0]["replicas"] = 2
        doc["spec"]["network"]["subdomain"] = "other"

    edit(manifest, change)
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert {(f["key"], f["value"]) for f in found} == {
        ("spec.replicatedJobs[0].replicas", "2"),
        ("spec.network.subdomain", '"other"'),
    }


def test_an_invalid_policy_leaves_only_the_timing_check(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)
    edit(manifest, lambda doc: doc["spec"].update(parallelism=1))
    policy.write_text(POLICY + "[bogus]\n", encoding="utf-8")
    data = as_json(str(policy), "--manifest", str(manifest))
    assert data["errors"] >= 1
    assert manifest_findings(data, manifest) == []


# -- files that cannot be used: exit 2, the file named, no traceback --------------------------


@pytest.mark.parametrize(
    ("text", "rule", "line"),
    [
        ("apiVersion: v1\nkind: [Job\n", "is not valid YAML", 3),
        ("a: b\n  c: d\n", "is not valid YAML", 2),
        ("key: !!python/object/apply:os.system ['id']\n", "is not valid YAML", 1),
        ("--- just a string\n", "is not a Kubernetes object", 1),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "holds no Job or JobSet", None),
        ("", "holds no Job or JobSet (no objects)", None),
    ],
    ids=["syntax", "indent", "python-tag", "scalar", "no-job", "empty"],
)
def test_garbage_yaml_exits_2_naming_the_file(tmp_path: Path, text: str, rule: str, line: int | None) -> None:
    policy, _ = files(tmp_path)
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text(text, encoding="utf-8")
    result = validate(str(policy), "--manifest", str(garbage))
    assert result.exit_code == 2
    assert rule in result.stderr
    place = f"  {garbage}:{line}:" if line else f"  {garbage}: error"
    assert any(row.startswith(place) for row in result.stderr.splitlines()), result.stderr
    assert "fix: " in result.stderr


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_unreadable_manifest_exits_2(tmp_path: Path, kind: str) -> None:
    policy, _ = files(tmp_path)
    target = tmp_path / "job.d"
    if kind == "directory":
        target.mkdir()
    elif kind == "binary":
        target.write_bytes(b"apiVersion: v1\n\xff\xfe\n")
    result = validate(str(policy), "--manifest", str(target))
    assert result.exit_code == 2
    assert f"  {target}" in result.stderr
    expected = {"missing": "file not found", "directory": "is a directory", "binary": "is not UTF-8"}
    assert expected[kind] in result.stderr


def test_validate_manifest_loads_no_torch_or_nvrx(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path)
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from nvtrain.cli import app\n"
        f"r = CliRunner().invoke(app, ['validate', {str(policy)!r}, '--nvrx', '0.7.0', "
        f"'--manifest', {str(manifest)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'nvidia_resiliency_ext')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# -- documentation -----------------------------------------------------------------------------


def test_yaml_paths_are_written_as_in_kubectl_explain() -> None:
    assert yaml_path(("spec", "template", "spec", "x")) == "spec.template.spec.x"
    assert yaml_path(("spec", "replicatedJobs", 0, "name")) == "spec.replicatedJobs[0].name"
    assert yaml_path(("data", "policy.toml")) == 'data["policy.toml"]'


def test_every_manifest_finding_code_is_in_the_rule_tables() -> None:
    """Like tests/config/test_docs.py for config/: every code built here is in docs/policy.md."""
    kube = ROOT / "src" / "nvtrain" / "kube"
    parts = ("manifest_checks", "manifest_checker", "control_checks", "workload_checks", "yaml_positions")
    modules = [kube / f"{name}.py" for name in parts]
    codes = {
        node.args[1].value
        for module in modules
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and len(node.args) >= 2
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in ("error", "warning", "info")
        and isinstance(node.args[1], ast.Constant)
    }
    assert {"grace-before-write", "manifest-mismatch", "manifest-shape", "yaml-syntax"} <= codes
    page = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8").split("## Key reference", 1)[0]
    missing = sorted(c for c in codes if f"| `{c}` |" not in page)
    assert not missing, f"docs/policy.md does not describe the finding codes {missing}"


# -- [rendezvous] store = "control": the control Job ------------------------------------------

CONTROL_POLICY = with_control_store(POLICY)
CONTROL_JOB = "Job llm-train-control"
CONTROL_POD = "spec.template.spec"


def edit_job(manifest: Path, name: str, change: Any) -> None:
    """Apply ``change`` to the Job ``name`` and write the file back."""
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    [job] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == name]
    change(job)
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")


def test_a_fresh_control_manifest_has_no_findings(tmp_path: Path) -> None:
    """The control Job is neither the workload (1 pod, not 4) nor grace-checked (its pod
    writes no checkpoint; a grace period of 30 s would be short of a 90 s write)."""
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    edit_job(
        manifest,
        "llm-train-control",
        lambda job: job["spec"]["template"]["spec"].pop(GRACE.rsplit(".", 1)[1]),
    )
    assert [
        d["metadata"]["name"] for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "Job"
    ] == [
        "llm-train-control",
        "llm-train",
    ]
    measured = timings(tmp_path, "90s")
    result = validate(str(policy), "--manifest", str(manifest), "--timings", str(measured), "--strict")
    assert result.exit_code == 0, result.output
    assert str(manifest) not in result.stderr
    path = tmp_path / "p5.yaml"
    options = ManifestOptions(efa=4, gpus_per_node=8, node_selector={"gpu": "h200"}, labels={"team": "ml"})
    path.write_text(dump(render(policy_of(CONTROL), CONTROL, options)), encoding="utf-8")
    assert check_manifest(path, policy_of(CONTROL), policy_text=CONTROL) == []


def rename_host(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["hostname"] = "llm-train-store"


def drop_host(job: dict[str, Any]) -> None:
    del job["spec"]["template"]["spec"]["hostname"]


def drop_instance_label(job: dict[str, Any]) -> None:
    del job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"]


def run_training(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"][0]["command"][1] = "run"


def move_port(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 29600


@pytest.mark.parametrize(
    ("change", "key", "value", "rule"),
    [
        (rename_host, f"{CONTROL_POD}.hostname", '"llm-train-store"', "differs from the policy"),
        (drop_host, f"{CONTROL_POD}.hostname", None, "is not set"),
        (
            drop_instance_label,
            'spec.template.metadata.labels["app.kubernetes.io/instance"]',
            None,
            "the headless Service selects",
        ),
        (
            run_training,
            f"{CONTROL_POD}.containers[0].command",
            '["nvtrain", "run", "/etc/nvtrain/policy.toml"]',
            "is not `nvtrain control ...`",
        ),
        (move_port, f"{CONTROL_POD}.containers[0].ports[0].containerPort", "29600", "[rendezvous] port"),
    ],
    ids=["hostname", "no-hostname", "labels", "command", "port"],
)
def test_a_broken_control_job_gives_its_finding(
    tmp_path: Path, change: Any, key: str, value: str | None, rule: str
) -> None:
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    edit_job(manifest, "llm-train-control", change)
    every = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    [found] = [f for f in every if f["table"] == CONTROL_JOB]
    others = {(f["severity"], f["code"], f["table"]) for f in every if f is not found}
    if change is drop_instance_label:  # the Service and the NetworkPolicy no longer pick the pod
        assert others == {
            ("error", "manifest-selector", "Service llm-train"),
            ("error", "manifest-selector", "NetworkPolicy llm-train-peers"),
        }
    else:
        assert not others
    assert (found["severity"], found["code"], found["table"], found["key"]) == (
        "warning",
        "manifest-mismatch",
        CONTROL_JOB,
        key,
    )
    assert found["value"] == value
    assert rule in found["rule"]
    if key != f"{CONTROL_POD}.containers[0].ports[0].containerPort":
        assert "llm-train-control.llm-train.default.svc.cluster.local" in found["rule"]
    assert "nvtrain manifest" in found["fix"]
    line = manifest.read_text(encoding="utf-8").splitlines()[found["line"] - 1].strip()
    leaf = key.rsplit(".", 1)[-1].split("[")[0]
    if value is not None:  # a key that is gone is shown where its parent is
        assert line.startswith((leaf, "- " + leaf)), line


def test_a_missing_control_job_warns(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    manifest.write_text(
        yaml.safe_dump_all(
            [d for d in docs if d["metadata"]["name"] != "llm-train-control"], sort_keys=False
        ),
        encoding="utf-8",
    )
    [found] = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert (found["severity"], found["code"], found["key"], found["line"]) == (
        "warning",
        "manifest-mismatch",
        None,
        None,
    )
    assert "has no control Job llm-train-control" in found["rule"]
    assert "llm-train-control.llm-train.default.svc.cluster.local" in found["rule"]
    assert f"nvtrain manifest {policy} -o {manifest}" in found["fix"]
    assert validate(str(policy), "--manifest", str(manifest), "--strict").exit_code == 1


def test_a_control_job_with_store_pod0_warns(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    policy.write_text(POLICY, encoding="utf-8")  # back to store = "pod0"
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    by_table = {f["table"]: f for f in found}
    assert set(by_table) == {CONTROL_JOB, next(t for t in by_table if t.startswith("ConfigMap "))}
    control = by_table[CONTROL_JOB]
    assert (control["code"], control["key"], control["value"]) == (
        "manifest-mismatch",
        "metadata.name",
        '"llm-train-control"',
    )
    assert 'store = "pod0"' in control["rule"]


def test_the_training_job_is_still_the_workload_beside_a_control_job(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    edit_job(manifest, "llm-train", lambda job: job["spec"].update(parallelism=3))
    # A renamed control Job is still told apart by its command.
    edit_job(manifest, "llm-train-control", lambda job: job["metadata"].update(name="store"))
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert [(f["table"], f["key"], f["value"]) for f in found] == [("Job llm-train", "spec.parallelism", "3")]


def test_without_a_valid_policy_the_control_job_is_not_the_workload(tmp_path: Path) -> None:
    """An invalid policy leaves only the timing check, which applies to the training pods: the
    control pod (here with Kubernetes' default 30 s) writes no checkpoint."""
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    edit_job(
        manifest,
        "llm-train-control",
        lambda job: job["spec"]["template"]["spec"].pop(GRACE.rsplit(".", 1)[1]),
    )
    policy.write_text(CONTROL_POLICY + "[bogus]\n", encoding="utf-8")
    measured = str(timings(tmp_path, "20s"))  # needs 50 s: the training pods have 150 s
    data = as_json(str(policy), "--manifest", str(manifest), "--timings", measured)
    assert data["errors"] >= 1
    assert manifest_findings(data, manifest) == []
    only_control = [d for d in yaml.safe_load_all(manifest.read_text()) if "control" in d["metadata"]["name"]]
    manifest.write_text(yaml.safe_dump_all(only_control, sort_keys=False), encoding="utf-8")
    [found] = manifest_findings(
        as_json(str(policy), "--manifest", str(manifest), "--timings", measured), manifest
    )
    assert found["code"] == "manifest-no-job"
    assert "holds no Job or JobSet of training pods" in found["rule"]


# -- [rendezvous] store = "control" in a JobSet: the replicated job "control" -----------------

JOBSET_CONTROL_POLICY = with_control_store(JOBSET_POLICY)
CONTROL_RJ = "spec.replicatedJobs[1]"
CONTROL_RJ_POD = f"{CONTROL_RJ}.template.spec.template.spec"


def edit_replicated(manifest: Path, name: str, change: Any) -> None:
    """Apply ``change`` to the Job template of the JobSet's replicated job ``name`` (shaped as a
    Job: ``metadata`` and ``spec``) and write the file back."""
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    [jobset] = [d for d in docs if d["kind"] == "JobSet"]
    [replicated] = [r for r in jobset["spec"]["replicatedJobs"] if r["name"] == name]
    change(replicated["template"])
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")


def test_a_fresh_jobset_with_the_control_store_has_no_findings(tmp_path: Path) -> None:
    """The replicated job "control" has one pod (not one per node), a hostname of its own (not
    <jobset>-control-0-0) and no checkpoint to write: none of the training pods' checks apply."""
    policy, manifest = files(tmp_path, JOBSET_CONTROL_POLICY, jobset=True)
    [jobset] = [d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "JobSet"]
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == ["workers", "control"]
    # Its grace period is not compared with the write: Kubernetes' 30 s is short of 30 s + 30 s.
    edit_replicated(
        manifest, "control", lambda job: job["spec"]["template"]["spec"].pop(GRACE.rsplit(".", 1)[1])
    )
    measured = str(timings(tmp_path, "30s"))
    for args in ([str(policy)], []):  # the policy file, or the one in the manifest's ConfigMap
        result = validate(*args, "--manifest", str(manifest), "--timings", measured, "--strict")
        assert result.exit_code == 0, result.output
        data = as_json(*args, "--manifest", str(manifest), "--timings", measured)
        assert manifest_findings(data, manifest) == []
    text = JOBSET_CONTROL_POLICY
    options = ManifestOptions(
        jobset=True, efa=4, gpus_per_node=8, node_selector={"gpu": "h200"}, labels={"team": "ml"}
    )
    path = tmp_path / "p5.yaml"
    path.write_text(dump(render(policy_of(text), text, options)), encoding="utf-8")
    assert check_manifest(path, policy_of(text), policy_text=text) == []


def drop_command(job: dict[str, Any]) -> None:
    del job["spec"]["template"]["spec"]["containers"][0]["command"]


def move_subdomain(job: dict[str, Any]) -> None:
    job["spec"]["template"]["spec"]["subdomain"] = "elsewhere"


def drop_completion_mode(job: dict[str, Any]) -> None:
    del job["spec"]["completionMode"]


@pytest.mark.parametrize(
    ("change", "key", "value", "rule"),
    [
        (rename_host, f"{CONTROL_RJ_POD}.hostname", '"llm-train-store"', "differs from the policy"),
        (drop_host, f"{CONTROL_RJ_POD}.hostname", None, "is not set"),
        (move_subdomain, f"{CONTROL_RJ_POD}.subdomain", '"elsewhere"', "from [rendezvous] service"),
        (
            drop_instance_label,
            f'{CONTROL_RJ}.template.spec.template.metadata.labels["app.kubernetes.io/instance"]',
            None,
            "the NetworkPolicy covers",
        ),
        (
            run_training,
            f"{CONTROL_RJ_POD}.containers[0].command",
            '["nvtrain", "run", "/etc/nvtrain/policy.toml"]',
            "is not `nvtrain control ...`",
        ),
        (drop_command, f"{CONTROL_RJ_POD}.containers[0].command", None, "is not `nvtrain control ...`"),
        (
            move_port,
            f"{CONTROL_RJ_POD}.containers[0].ports[0].containerPort",
            "29600",
            "[rendezvous] port",
        ),
        (
            drop_completion_mode,
            f"{CONTROL_RJ}.template.spec.completionMode",
            None,
            "JobSet makes a replicated job Indexed",
        ),
    ],
    ids=["hostname", "no-hostname", "subdomain", "labels", "command", "no-command", "port", "indexed"],
)
def test_a_broken_control_replicated_job_gives_its_finding(
    tmp_path: Path, change: Any, key: str, value: str | None, rule: str
) -> None:
    policy, manifest = files(tmp_path, JOBSET_CONTROL_POLICY, jobset=True)
    edit_replicated(manifest, "control", change)
    every = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    [found] = [f for f in every if f["table"] == "JobSet llm"]
    others = {(f["severity"], f["code"], f["table"]) for f in every if f is not found}
    labels = "labels" in key  # the NetworkPolicy no longer covers the control pod
    assert others == (
        {("error", "manifest-selector", "NetworkPolicy llm-workers-0-peers")} if labels else set()
    )
    assert (found["severity"], found["code"], found["table"], found["key"]) == (
        "warning",
        "manifest-mismatch",
        "JobSet llm",
        key,
    )
    assert found["value"] == value
    assert rule in found["rule"]
    if "hostname" in key or "command" in key or "completionMode" in key:
        assert "llm-workers-0-control.llm-workers-0.default.svc.cluster.local" in found["rule"]
    assert f"nvtrain manifest {policy} --jobset -o {manifest}" in found["fix"]
    line = manifest.read_text(encoding="utf-8").splitlines()[found["line"] - 1].strip()
    leaf = key.rsplit(".", 1)[-1].split("[")[0]
    if value is not None:  # a key that is gone is shown where its parent is
        assert line.startswith((leaf, "- " + leaf)), line
    want = 2 if labels else 1
    assert validate(str(policy), "--manifest", str(manifest), "--strict").exit_code == want


def test_the_training_replicated_job_keeps_its_checks_beside_the_control_one(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, JOBSET_CONTROL_POLICY, jobset=True)
    edit_replicated(manifest, "workers", lambda job: job["spec"].update(parallelism=3))
    # A renamed control replicated job is still told apart by its command, with one replica.
    edit_replicated(manifest, "control", lambda job: job["spec"].update(completions=1))

    def rename_control(doc: dict[str, Any]) -> None:
        doc["spec"]["replicatedJobs"][1].update(name="store", replicas=2)

    edit(manifest, rename_control)
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert [(f["key"], f["value"]) for f in found] == [
        ("spec.replicatedJobs[0].template.spec.parallelism", "3"),
        (f"{CONTROL_RJ}.replicas", "2"),
    ]
    assert "llm-workers-0-control" in found[1]["rule"]


def test_a_jobset_without_its_control_replicated_job_warns(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, JOBSET_POLICY, jobset=True)
    policy.write_text(JOBSET_CONTROL_POLICY, encoding="utf-8")
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    [jobset] = [f for f in found if f["table"] == "JobSet llm"]
    assert (jobset["code"], jobset["key"], jobset["value"]) == (
        "manifest-mismatch",
        "spec.replicatedJobs",
        None,
    )
    assert "has no replicated job 'control'" in jobset["rule"]
    assert "llm-workers-0-control.llm-workers-0.default.svc.cluster.local" in jobset["rule"]
    assert f"nvtrain manifest {policy} --jobset -o {manifest}" in jobset["fix"]
    assert not [f for f in found if "has no control Job" in f["rule"]]


def test_a_control_replicated_job_with_store_pod0_warns(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, JOBSET_CONTROL_POLICY, jobset=True)
    policy.write_text(JOBSET_POLICY, encoding="utf-8")  # back to store = "pod0"
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    [control] = [f for f in found if f["table"] == "JobSet llm"]
    assert (control["code"], control["key"], control["value"]) == (
        "manifest-mismatch",
        f"{CONTROL_RJ}.name",
        '"control"',
    )
    assert "is a control replicated job" in control["rule"] and 'store = "pod0"' in control["rule"]
    assert "delete this replicated job from the JobSet" in control["fix"]


def test_a_jobset_of_only_the_control_pod_is_an_error(tmp_path: Path) -> None:
    policy, manifest = files(tmp_path, JOBSET_CONTROL_POLICY, jobset=True)
    edit(manifest, lambda doc: doc["spec"]["replicatedJobs"].pop(0))
    found = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert [(f["severity"], f["code"], f["key"]) for f in found] == [
        ("error", "manifest-shape", "spec.replicatedJobs")
    ]
    assert "no replicated job of training pods" in found[0]["rule"]


def make_indexed(job: dict[str, Any]) -> None:
    job["spec"]["completionMode"] = "Indexed"


def test_an_indexed_control_job_warns(tmp_path: Path) -> None:
    """The Job controller names an Indexed Job's pod <Job>-<index>: not the control pod's name."""
    policy, manifest = files(tmp_path, CONTROL_POLICY)
    edit_job(manifest, "llm-train-control", make_indexed)
    [found] = manifest_findings(as_json(str(policy), "--manifest", str(manifest)), manifest)
    assert (found["table"], found["key"], found["value"]) == (CONTROL_JOB, "spec.completionMode", '"Indexed"')
    assert "llm-train-control.llm-train.default.svc.cluster.local" in found["rule"]
