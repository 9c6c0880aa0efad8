"""Reading back without running code (``nvtrain.worker.plain``) and the host copy's keyed seal
(``nvtrain.worker.hostcopy``): what ``check_plain`` lets through is exactly what
``torch.load(weights_only=True)`` reads back; DCP's real metadata passes the allow-list and
anything else is refused; torch's own load planner would have run a shard's pickle, ours does
not; a header's MAC depends on every field and on the key."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    )
]


def _saved(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _plain() -> list[Any]:
    import torch

    return [
        {"a": [1, 2.5, "x", None, True], 3: (b"raw", bytearray(b"b"), 1 + 2j)},
        collections.OrderedDict(step=torch.arange(3)),
        {"set": {1, 2}, "dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2, 3])},
        [torch.nn.Parameter(torch.ones(2)), torch.strided],
        random.getstate(),
    ]


Point = collections.namedtuple("Point", "x y")
NOT_PLAIN = [
    (random.Random(0), "", "random.Random"),
    ({"pos": 1, "gen": [1, collections.deque()]}, "['gen'][1]", "collections.deque"),
    ({"when": slice(1, 2)}, "['when']", "slice"),
    ({"f": frozenset()}, "['f']", "frozenset"),
    ({"point": Point(1, 2)}, "['point']", "Point"),
    ({(1, object()): 1}, " (a key)[1]", "object"),
]


@pytest.mark.parametrize("index", range(5))
def test_plain_data_passes_and_reads_back(index: int) -> None:
    from nvtrain.worker.plain import check_plain, load_plain

    value = _plain()[index]
    check_plain("k", value)
    assert repr(load_plain(_saved(value))) == repr(value)


@pytest.mark.parametrize(("value", "path", "found"), NOT_PLAIN)
def test_anything_else_is_named_with_its_path(value: Any, path: str, found: str) -> None:
    from nvtrain.worker.plain import ExtraNotPlain, Refused, check_plain, load_plain

    with pytest.raises(ExtraNotPlain) as raised:
        check_plain("data", value)
    assert (raised.value.key, raised.value.path) == ("data", path)
    assert raised.value.found.endswith(found), raised.value.found
    with pytest.raises(Refused):  # and torch would not have read it back either
        load_plain(_saved(value))


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_that_calls_a_function_is_refused_and_not_run(tmp_path: Path) -> None:
    from nvtrain.worker.plain import Refused, load_plain, read_metadata

    marker = tmp_path / "ran"
    with pytest.raises(Refused, match=r"^extra-rank0.pt names a class that is not allowed: posix.system$"):
        load_plain(_saved({"rng": _Marker(marker)}), what="extra-rank0.pt")
    with pytest.raises(Refused, match="^the .metadata names a class that is not allowed: posix.system$"):
        read_metadata(io.BytesIO(pickle.dumps(_Marker(marker))))
    assert not marker.exists()
    refused = pickle.loads(pickle.dumps(Refused.naming("x", "os.system")))  # travels between ranks
    assert str(refused) == "x names a class that is not allowed: os.system"


def test_garbage_is_refused_not_raised(tmp_path: Path) -> None:
    from nvtrain.worker.plain import Refused, load_plain, read_metadata

    with pytest.raises(Refused, match="cannot be read"):
        read_metadata(io.BytesIO(b"\x80\x04garbage"))
    with pytest.raises(Refused, match="holds a dict"):
        read_metadata(io.BytesIO(pickle.dumps({"a": 1})))
    with pytest.raises(Refused, match="^file (cannot be read as plain data|is not plain data)"):
        load_plain(b"PK not a zip")


def _model_and_optimizer() -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def test_real_metadata_passes_the_allow_list_and_loads(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from nvtrain.worker.plain import MetadataReader, PlainLoadPlanner, read_metadata

    state = _model_and_optimizer()
    state["half"] = torch.ones(3, dtype=torch.bfloat16)
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    with (tmp_path / ".metadata").open("rb") as stream:
        metadata = read_metadata(stream)
    assert "model.0.weight" in metadata.state_dict_metadata
    target = _model_and_optimizer()
    target["half"] = torch.zeros(3, dtype=torch.bfloat16)
    for value in target["model"].values():
        value.zero_()
    target["optim"]["param_groups"][0]["lr"] = 5.0
    dcp.load(
        target,
        checkpoint_id=str(tmp_path),
        storage_reader=MetadataReader(str(tmp_path)),
        planner=PlainLoadPlanner(),
        no_dist=True,
    )
    assert target["optim"]["param_groups"][0]["lr"] == 1e-2  # a non-tensor item, read as plain data
    assert all(torch.equal(state["model"][k], v) for k, v in target["model"].items())
    assert torch.equal(target["half"], state["half"])


def test_torch_planner_would_run_a_shard_item_ours_refuses(tmp_path: Path) -> None:
    """The hole this closes: torch 2.13's ``DefaultLoadPlanner.load_bytes`` unpickles a shard's
    non-tensor item with ``weights_only=False``."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from nvtrain.worker.plain import MetadataReader, PlainLoadPlanner, refusal

    marker = tmp_path / "ran"
    dcp.save({"t": torch.ones(2), "item": _Marker(marker)}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    with pytest.raises(CheckpointException) as raised:
        dcp.load(
            {"t": torch.zeros(2), "item": None},
            checkpoint_id=str(tmp_path / "c"),
            storage_reader=MetadataReader(str(tmp_path / "c")),
            planner=PlainLoadPlanner(),
            no_dist=True,
        )
    assert not marker.exists()
    found = refusal(raised.value)
    assert found is not None and "posix.system" in str(found), raised.value
    dcp.load({"t": torch.zeros(2), "item": None}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    assert marker.exists()  # torch's own planner ran it


def test_the_mac_covers_every_field_and_needs_the_key() -> None:
    from nvtrain.worker.hostcopy import _sealed_header, verify_mac

    key = os.urandom(32)
    fields = {
        "format": 3, "run_id": "r", "rank": 1, "world": 4, "step": 20,
        "token": "ab12cd34", "layout": "f" * 32, "bytes": 8,
    }  # fmt: skip
    header = json.loads(_sealed_header(fields, memoryview(b"\0" * 8), b"extra", key))
    assert verify_mac(header, key)
    assert not verify_mac(header, os.urandom(32))
    for name in [*fields, "data_hash", "extra_hash"]:
        changed = dict(header, **{name: header[name] + 1 if isinstance(header[name], int) else "x"})
        assert not verify_mac(changed, key), name
    assert not verify_mac({k: v for k, v in header.items() if k != "mac"}, key)
    other = json.loads(_sealed_header(fields, memoryview(b"\1" + b"\0" * 7), b"extra", key))
    assert other["data_hash"] != header["data_hash"]
