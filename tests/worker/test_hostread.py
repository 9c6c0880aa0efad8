"""A host copy's data read into the live tensors and checked while it is read
(``nvtrain.worker.hostread``): every kind of tensor comes back bitwise whatever the chunk size and
the number of reader threads; a file altered anywhere (its last chunk, the padding between two
tensors), cut short, or not private is refused, and then no destination holds any of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
blake3 = pytest.importorskip("blake3")

from nvtrain.private import make_private_dir  # noqa: E402
from nvtrain.worker.hostcopy import Layout, _leaves, _local  # noqa: E402
from nvtrain.worker.hostread import Rejected, read_checked  # noqa: E402

KEY = bytes(range(32))


def _state() -> dict[str, Any]:
    """Tensors of many kinds: dtypes, a scalar, an empty one, sizes that are not multiples of
    the 64-byte alignment (so that padding lies between them)."""
    gen = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(37, 11, generator=gen),
        "half": torch.randn(5, 7, generator=gen).to(torch.bfloat16),
        "step": torch.tensor(12.0),
        "empty": torch.empty(0, 4),
        "ids": torch.randint(0, 1 << 40, (29,), generator=gen),
        "mask": torch.rand(13, generator=gen) > 0.5,
        "big": torch.randn(3000, generator=gen, dtype=torch.float64),
        "large": torch.randn(70_000, generator=gen),  # past hostread._SMALL: copied straight in
    }


def _write(folder: Path, state: dict[str, Any]) -> tuple[Path, Layout, str]:
    """The data file of ``state`` as a save lays it out (random padding), and its keyed hash."""
    layout = Layout.of(state)
    data = bytearray(os.urandom(layout.nbytes))
    for leaf, (_, tensor) in zip(layout.leaves, _leaves(state), strict=True):
        raw = _bytes(_local(tensor)).numpy().tobytes()
        data[leaf.offset : leaf.offset + leaf.nbytes] = raw
    path = folder / "rank0.slot0.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return path, layout, blake3.blake3(bytes(data), key=KEY).hexdigest()


def _destinations(state: dict[str, Any], *, transposed: bool = False, device: str = "cpu") -> list[Any]:
    out = []
    for i, (_, tensor) in enumerate(_leaves(state)):
        where = device if i % 2 == 0 else "cpu"  # on a GPU: every other one, the rest on the CPU
        if transposed and tensor.dim() == 2:  # a destination that is not contiguous
            out.append(torch.zeros(tensor.shape[::-1], dtype=tensor.dtype, device=where).t())
        else:
            out.append(torch.zeros_like(tensor, device=where))
    return out


def _bytes(tensor: Any) -> Any:
    return tensor.cpu().contiguous().reshape(-1).view(torch.uint8)


def _read(path: Path, layout: Layout, into: list[Any], digest: str, **kw: Any) -> None:
    spans = [(leaf.offset, leaf.nbytes) for leaf in layout.leaves]
    read_checked(path, spans, layout.nbytes, into, key=KEY, digest=digest, **kw)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shm = tmp_path / "shm"
    make_private_dir(shm)
    return shm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("chunk", "readers"), [(64, 1), (100, 3), (4096, 2), (8 << 20, 1)])
def test_every_kind_of_tensor_comes_back_bitwise(folder: Path, chunk: int, readers: int, device: str) -> None:
    state = _state()
    path, layout, digest = _write(folder, state)
    into = _destinations(state, transposed=chunk == 100, device=device)
    _read(path, layout, into, digest, chunk=chunk, readers=readers, hashers=2)
    for got, (_, want) in zip(into, _leaves(state), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(_bytes(got), _bytes(want))


def _spoiled(into: list[Any]) -> bool:
    """No destination holds any of the copy: floating point all NaN, the rest all zeros."""
    return all(
        bool(t.isnan().all()) if t.is_floating_point() else not bool(t.any()) for t in into if t.numel()
    )


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x01]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [1024, 8 << 20])
@pytest.mark.parametrize("where", ["last chunk", "padding", "first byte"])
def test_a_file_altered_anywhere_is_refused_and_nothing_of_it_is_left(
    folder: Path, where: str, chunk: int, device: str
) -> None:
    state = _state()
    path, layout, digest = _write(folder, state)
    last = layout.leaves[-1]
    offset = {
        "last chunk": last.offset + last.nbytes - 1,  # the last byte that is a tensor's
        "padding": layout.leaves[0].offset + layout.leaves[0].nbytes,  # between "w" and "half"
        "first byte": 0,
    }[where]
    assert layout.leaves[0].nbytes % 64, "the first tensor ends before its slot does"
    _flip(path, offset)
    into = _destinations(state, device=device)
    with pytest.raises(Rejected, match="the data does not match its hash"):
        _read(path, layout, into, digest, chunk=chunk, readers=2)
    assert _spoiled(into)


def test_a_short_file_is_refused(folder: Path) -> None:
    state = _state()
    path, layout, digest = _write(folder, state)
    os.truncate(path, layout.nbytes - 1)
    into = _destinations(state)
    with pytest.raises(Rejected, match=f"holds {layout.nbytes - 1} bytes, its header says {layout.nbytes}"):
        _read(path, layout, into, digest)
    assert _spoiled(into)


def test_a_file_that_is_not_private_or_is_a_link_is_not_read(folder: Path, tmp_path: Path) -> None:
    state = _state()
    path, layout, digest = _write(folder, state)
    path.chmod(0o640)
    with pytest.raises(Rejected, match="has mode 0640: group or others may open it"):
        _read(path, layout, _destinations(state), digest)
    path.chmod(0o600)
    link = folder / "link.bin"
    link.symlink_to(path)
    with pytest.raises(Rejected, match="link.bin is a symbolic link"):
        _read(link, layout, _destinations(state), digest)
