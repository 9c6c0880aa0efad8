"""A checkpoint writer SIGKILLed in the middle of an async write leaves a partial folder that is
never restored: a fresh Checkpointer (in this process, which never saw the state) restores the
previous committed step and reports the partial one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from nvtrain.events import EventLog, read_events
from support.worker_helpers import BIN, run_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
]

STATE_MB = 250


def _writer_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("killed_writer", BIN / "killed_writer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_writer_killed_mid_write_leaves_a_partial_folder_that_is_never_restored(tmp_path: Path) -> None:
    run_dir, events, out = tmp_path / "run", tmp_path / "events.jsonl", tmp_path / "writer.json"
    script = str(BIN / "killed_writer.py")
    done = run_python([script, str(run_dir), str(events), str(STATE_MB), str(out)], tmp_path, 100)
    assert done.returncode == -9, done.stdout

    # What the writer saw just before it died: the write of step 20 had started, not finished.
    seen = json.loads(out.read_text())
    assert seen["state_bytes"] > 0.9 * STATE_MB * 1e6
    assert seen["shard_bytes"] > 0, seen
    assert not {"COMMITTED", ".metadata", "manifest-rank0.json"} & set(seen["files"]), seen
    partial = run_dir / seen["partial"]
    assert partial.is_dir() and not (partial / "COMMITTED").exists()
    assert not (run_dir / "step-000020").exists()
    assert (run_dir / "step-000010" / "COMMITTED").is_file()

    from nvtrain.config.schema import Checkpoint
    from nvtrain.worker import Checkpointer

    writer = _writer_module()
    model, optimizer = writer.build(STATE_MB, seed=2)  # initialised differently from the writer's
    step10 = json.loads(out.with_suffix(".step10.json").read_text())["hash"]
    assert writer.state_hash(model, optimizer) != step10
    policy = Checkpoint.model_validate({"dir": "/unused", "interval": 10, "async": True, "keep": 3})
    log = EventLog(events, run_id="killed-writer", source="restorer")
    restorer = Checkpointer(model=model, optimizer=optimizer, run_dir=run_dir, policy=policy, events=log)
    assert restorer.restore() == 10
    assert writer.state_hash(model, optimizer) == step10

    records = [e.as_dict() for e in read_events(events)]
    partial_events = [e for e in records if e["event"] == "checkpoint_partial"]
    assert [(e["step"], e["path"]) for e in partial_events] == [(20, str(partial))]
    assert [e for e in records if e["event"] == "checkpoint_corrupt"] == []
    assert [e["step"] for e in records if e["event"] == "checkpoint_restored"] == [10]
    assert [e["step"] for e in records if e["event"] == "checkpoint_committed"] == [10]
