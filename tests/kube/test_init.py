"""``nvtrain init`` and the starter files: the policy is generated from the schema and valid, the
script and Dockerfile fit the manifests, and existing files are never overwritten by accident."""

from __future__ import annotations

import ast
import re
import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.config import Policy, validate_source
from nvtrain.errors import UsageError
from nvtrain.kube import manifest, objects
from nvtrain.kube.init import STARTER_FILES, init_project, starter_policy, starter_text
from nvtrain.nvrx import TESTED, NvrxVersion

STARTER = Path(__file__).resolve().parents[2] / "src" / "nvtrain" / "kube" / "starter"
REGENERATE = "regenerate it with `python -m nvtrain.kube.init`"

runner = CliRunner()


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def schema_keys(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every table of the policy (dotted) with its plain keys as written in TOML."""
    tables: dict[str, list[str]] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        inner = _model_of(info.annotation)
        table = f"{prefix}.{key}" if prefix else key
        if inner is None:
            tables.setdefault(prefix, []).append(key)
        else:
            tables.update(schema_keys(inner, table))
    return tables


# -- the starter policy --------------------------------------------------------------------------


def test_starter_policy_file_is_generated_from_the_schema() -> None:
    assert (STARTER / "policy.toml").read_text(encoding="utf-8") == starter_policy(), (
        f"src/nvtrain/kube/starter/policy.toml differs from the schema's docstrings: {REGENERATE}"
    )


def test_every_schema_key_is_in_the_starter_policy_with_its_docstring() -> None:
    text = starter_text("policy.toml")
    table = ""
    found: dict[tuple[str, str], list[str]] = {}
    comment: list[str] = []
    for line in text.splitlines():
        header = re.match(r"^#?\s*\[\[?([\w.]+)\]\]?$", line)
        if header:
            table, comment = header.group(1), []
            continue
        assign = re.match(r"^#?\s*(\w+) = ", line)
        if assign and table:  # (the header comment before the first table mentions keys)
            found[(table, assign.group(1))] = comment
            comment = []
        elif line.startswith("#"):
            comment.append(line.lstrip("# "))
        else:
            comment = []
    tables = {t: keys for t, keys in schema_keys(Policy).items() if t}
    expected = {(t, k) for t, keys in tables.items() for k in keys}
    assert set(found) == expected
    for (table, key), lines in found.items():
        model = Policy
        for part in table.split("."):
            model = _model_of(model.model_fields[part].annotation)  # type: ignore[assignment]
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == key)
        words = " ".join((field.description or "").split())
        assert words and " ".join(" ".join(lines).split()).startswith(words), f"[{table}] {key}"


@pytest.mark.parametrize("nvrx", ["0.4.1", "0.6.0", "0.7.0"])
def test_starter_policy_is_valid_without_warnings(nvrx: str) -> None:
    result = validate_source(starter_text("policy.toml"), "starter", nvrx=NvrxVersion.parse(nvrx))
    assert result.ok
    assert [f for f in result.findings if f.severity != "info"] == []


def test_starter_policy_fits_the_manifests_and_the_starter_files() -> None:
    data = tomllib.loads(starter_text("policy.toml"))
    assert data["job"]["script"] == "train.py" and "train.py" in STARTER_FILES
    assert "faults" not in data  # commented out: a starter injects no faults
    objects = manifest.render(
        validate_source(starter_text("policy.toml"), "s", nvrx=None).policy,  # type: ignore[arg-type]
        starter_text("policy.toml"),
    )
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "NetworkPolicy", "Job"]


# -- the script and the Dockerfile ---------------------------------------------------------------


def test_starter_script_uses_the_worker_library_like_the_demo() -> None:
    source = starter_text("train.py")
    tree = ast.parse(source)
    imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {"torch", "torch.distributed", "nvtrain.worker"} <= imports
    for needed in ("fully_shard", "ctx.checkpointer(", "ctx.start_step + 1", "ctx.step_done(", "nw.run("):
        assert needed in source, needed


def test_dockerfile_installs_nvtrain_and_a_tested_nvrx_and_runs_the_manifests_command() -> None:
    text = starter_text("Dockerfile")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("ARG BASE_IMAGE=") and lines[1] == "FROM ${BASE_IMAGE}"
    base = lines[0].split("=", 1)[1]
    assert "pytorch" in base and ":" in base  # a CUDA PyTorch image, pinned by tag
    nvrx = re.search(r"^ARG NVRX_VERSION=(\S+)$", text, re.MULTILINE)
    assert nvrx and NvrxVersion.parse(nvrx.group(1)).line in TESTED
    assert '"nvidia-resiliency-ext==${NVRX_VERSION}"' in text and '"${NVTRAIN}"' in text
    assert "COPY train.py ./" in text
    cmd = f'CMD ["nvtrain", "run", "{objects.POLICY_MOUNT}/{objects.POLICY_FILE}"]'
    assert cmd in lines


# -- init_project and the command ----------------------------------------------------------------


def test_init_writes_the_starter_files(tmp_path: Path) -> None:
    target = tmp_path / "new" / "project"
    written = init_project(target)
    assert written == [target / name for name in STARTER_FILES]
    for path in written:
        assert path.read_text(encoding="utf-8") == starter_text(path.name)


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("mine", encoding="utf-8")
    with pytest.raises(UsageError, match="already has train.py; nothing was written") as caught:
        init_project(tmp_path)
    assert caught.value.fix.startswith("pass --force")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    assert (tmp_path / "train.py").read_text(encoding="utf-8") == "mine"


def test_init_force_overwrites_and_replaces_links_not_their_targets(tmp_path: Path) -> None:
    outside = tmp_path / "outside.toml"
    outside.write_text("keep me", encoding="utf-8")
    project = tmp_path / "p"
    project.mkdir()
    (project / "policy.toml").symlink_to(outside)
    (project / "Dockerfile").write_text("old", encoding="utf-8")
    init_project(project, force=True)
    assert outside.read_text(encoding="utf-8") == "keep me"
    assert not (project / "policy.toml").is_symlink()
    assert (project / "Dockerfile").read_text(encoding="utf-8") == starter_text("Dockerfile")


def test_init_into_a_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x", encoding="utf-8")
    with pytest.raises(UsageError, match="is not a directory"):
        init_project(path)


def test_init_command(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    for name in STARTER_FILES:
        assert f"wrote {tmp_path / 'p' / name}" in result.stdout
    assert "nvtrain validate" in result.stdout and "kubectl apply -f job.yaml" in result.stdout
    again = runner.invoke(app, ["init", str(tmp_path / "p")])
    assert again.exit_code == 2
    assert "already has policy.toml, train.py, Dockerfile" in again.stderr
    assert "--force" in again.stderr
    assert runner.invoke(app, ["init", str(tmp_path / "p"), "--force"]).exit_code == 0


def test_init_output_passes_validate(tmp_path: Path) -> None:
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    for nvrx in ("0.4.1", "0.7.0"):
        result = runner.invoke(app, ["validate", str(tmp_path / "policy.toml"), "--nvrx", nvrx, "--strict"])
        assert result.exit_code == 0, result.output
