"""``[job] module`` is a dotted Python module name (``python -m`` runs it): a path or a piece of
code is an error of ``nvtrain validate`` naming file, line, key, value, rule and fix, and of
``nvtrain run -m MODULE`` naming the flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RULE = "must be a Python module name, as `python -m` takes: identifiers separated by dots"


def nvtrain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        env=dict(os.environ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_policy(tmp_path: Path, module: str) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[job]\nname = "llm"\nmodule = {json.dumps(module)}\n', encoding="utf-8")
    return policy


@pytest.mark.parametrize(
    "module",
    [
        "../../etc/passwd",
        "os; import os",
        "mypkg/train",
        "mypkg..train",
        "mypkg.train.",
        "my-pkg.train",
        " mypkg",
    ],
)
def test_validate_refuses_a_module_that_is_no_module_name(tmp_path: Path, module: str) -> None:
    policy = write_policy(tmp_path, module)
    done = nvtrain(tmp_path, "validate", str(policy))
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{policy}:3:1: error [job] module = {json.dumps(module)}" in said, done.stderr
    assert RULE in said and 'fix: name the module, e.g. module = "mypkg.train"' in said, done.stderr
    report = json.loads(nvtrain(tmp_path, "validate", "--json", str(policy)).stdout)
    found = [f for f in report["findings"] if f["key"] == "module"]
    assert [(f["code"], f["line"]) for f in found] == [("job-entrypoint", 3)], report


@pytest.mark.parametrize("module", ["train", "mypkg.train", "pkg._private.step2", "пакет.train"])
def test_validate_takes_a_dotted_module_name(tmp_path: Path, module: str) -> None:
    done = nvtrain(tmp_path, "validate", str(write_policy(tmp_path, module)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_run_dash_m_refuses_code_naming_the_flag(tmp_path: Path) -> None:
    done = nvtrain(tmp_path, "run", "--dry-run", "-m", "os; import os")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert '-m os; import os (command line): error [job] module = "os; import os"' in said, done.stderr
    assert RULE in said, done.stderr
    assert nvtrain(tmp_path, "run", "--dry-run", "-m", "mypkg.train").returncode == 0
