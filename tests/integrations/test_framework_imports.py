"""The framework packages are optional: importing nvtrain or nvtrain.integrations (or the
shared core) never imports transformers, lightning or accelerate."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate")


@pytest.mark.slow
def test_nvtrain_and_the_integrations_package_import_no_framework() -> None:
    code = f"""
        import json, sys
        frameworks = {FRAMEWORKS!r}
        loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] in frameworks)
        import nvtrain, nvtrain.integrations
        first = {{"frameworks": loaded(), "torch": "torch" in sys.modules}}
        import nvtrain.integrations.core, nvtrain.worker
        print(json.dumps({{"package": first, "core": loaded()}}))
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"package": {"frameworks": [], "torch": False}, "core": []}
