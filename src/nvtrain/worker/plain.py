"""Reading back what was saved without running code from it.

Everything the worker library reads back from host memory, a peer or shared storage is data that
a process other than this one wrote. None of it is unpickled with Python's full unpickler, which
calls whatever a file names (``os.system`` included):

- the extra state of a host copy (``rank<R>.slot<S>.extra``) and a checkpoint's
  ``extra-rank<R>.pt`` are read with ``torch.load(weights_only=True)``: containers, numbers,
  strings, tensors, dtypes, devices and sizes, nothing else; so what is saved in them must be
  plain data too (``check_plain``, at save time, with an error naming the extra's key and path);
- torch DCP's ``.metadata`` is read by an unpickler that admits only the classes DCP's
  metadata is made of (``ALLOWED``), through ``MetadataReader``, a ``FileSystemReader``;
- the non-tensor items of DCP's shards (optimizer settings) are read with
  ``torch.load(weights_only=True)`` (``PlainLoadPlanner``; torch's own planner uses
  ``weights_only=False`` there).

A file that names anything else raises ``Refused`` (an ``UnpicklingError``); the checkpoint code
treats it like a corrupt checkpoint.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import pathlib
import pickle
import re
from typing import IO, Any, TypeVar

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from nvtrain.errors import NvtrainError

__all__ = [
    "ALLOWED",
    "ExtraNotPlain",
    "MetadataReader",
    "PlainLoadPlanner",
    "Refused",
    "check_plain",
    "first_cause",
    "load_plain",
    "refusal",
]


E = TypeVar("E", bound=BaseException)


class Refused(pickle.UnpicklingError):
    """What was read back (``what``: a file's name) is not plain data: ``detail`` says why
    (``names a class that is not allowed: os.system``, or that it cannot be read at all)."""

    def __init__(self, what: str, detail: str) -> None:
        self.what, self.detail = what, detail
        super().__init__(f"{what} {detail}")

    @staticmethod
    def naming(what: str, name: str) -> Refused:
        return Refused(what, f"names a class that is not allowed: {name}")

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:  # torch sends it to the other ranks
        return (Refused, (self.what, self.detail))


class ExtraNotPlain(NvtrainError, TypeError):
    """A value of ``Checkpointer(extra=...)`` (or its ``state_dict()``) holds something that is
    not plain data: ``key`` (the extra's), ``path`` inside it, ``found`` (the type's name)."""

    def __init__(self, key: str, path: str, found: str) -> None:
        self.key, self.path, self.found = key, path, found
        where = f"extra {key!r}" + (f" at {path}" if path else "")
        super().__init__(
            f"{where} is a {found}, which a checkpoint cannot keep: checkpoints keep only plain data "
            f"({_PLAIN_TEXT}), so that restoring one runs no code from it. Convert it in the "
            f"extra's state_dict() (a tensor, a list or a dict of numbers and strings), and back "
            f"in its load_state_dict()"
        )


_PLAIN_TEXT = (
    "dict, list, tuple, set, str, bytes, int, float, bool, None, torch tensors, dtypes, devices, sizes"
)
_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None))
_TORCH_VALUES = (torch.dtype, torch.device, torch.Size, torch.layout)


def check_plain(key: str, value: Any) -> None:
    """Raise ``ExtraNotPlain`` unless ``value`` is made only of what ``torch.load`` with
    ``weights_only=True`` reads back (exact types: a namedtuple or an enum is not plain)."""
    todo: list[tuple[str, Any]] = [("", value)]
    seen: set[int] = set()
    while todo:
        path, item = todo.pop()
        kind = type(item)
        if kind in _SCALARS or kind in _TORCH_VALUES or kind in (torch.Tensor, torch.nn.Parameter):
            continue
        if kind in (dict, collections.OrderedDict):
            if id(item) in seen:
                continue
            seen.add(id(item))
            for name, inner in item.items():
                todo += [(f"{path} (a key)", name), (f"{path}[{name!r}]", inner)]
        elif kind in (list, tuple, set):
            if id(item) in seen:
                continue
            seen.add(id(item))
            todo += [(f"{path}[{index}]", inner) for index, inner in enumerate(item)]
        else:
            found = (
                kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            )
            raise ExtraNotPlain(key, path, found)


def _numpy_legacy() -> list[Any]:
    """What a checkpoint written before plain RNG states holds for numpy's (its ``get_state()``
    tuple, with an array of integers): numpy's array reconstruction, which torch's docs list as
    safe for ``weights_only``. Empty without numpy."""
    try:
        import numpy
    except ImportError:
        return []
    found: list[Any] = [numpy.ndarray, numpy.dtype, type(numpy.dtype("uint32"))]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(module)._reconstruct)
            break
    return found


def load_plain(source: pathlib.Path | bytes, *, legacy_numpy: bool = False, what: str = "file") -> Any:
    """``torch.load(weights_only=True)`` of a file or bytes, on the CPU. ``legacy_numpy`` also
    reads the numpy arrays of a checkpoint's RNG state written by an earlier nvtrain. A file
    that names anything else raises ``Refused``."""
    handle: IO[bytes] | pathlib.Path = io.BytesIO(source) if isinstance(source, bytes) else source
    extra = _numpy_legacy() if legacy_numpy else []
    try:
        with torch.serialization.safe_globals(extra):
            return torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refused(what, str(exc)) from None
    except (RuntimeError, ValueError, EOFError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise Refused(what, f"cannot be read as plain data: {type(exc).__name__}: {exc}"[:300]) from None


def _refused(what: str, text: str) -> Refused:
    """``Refused`` from the message of torch's weights-only unpickler: the global it names (its
    wording differs between torch versions), or its own reason."""
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return Refused.naming(what, found.group(1).rstrip("."))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = [line for line in lines[1:] if not line.startswith(("Check the documentation", "("))]
    return Refused(what, f"is not plain data: {(kept or lines or ['?'])[-1]}"[:300])


# -- DCP's .metadata ----------------------------------------------------------------------------
_DCP_METADATA = (
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "TensorProperties",
    "TensorStorageMetadata",
    "_MEM_FORMAT_ENCODING",
)
ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(_DCP_METADATA),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),  # and every dtype (below)
    "torch.serialization": frozenset({"_get_layout"}),  # a layout by its name (a dict lookup)
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "Path"}),
    "builtins": frozenset({"set", "frozenset", "complex", "slice"}),
}
"""The classes (module, name) that a DCP ``.metadata`` may name: found in torch 2.13's
``checkpoint/metadata.py`` and ``filesystem.py`` and by reading real checkpoints (FSDP2,
DDP, plain modules, optimizer state). ``torch.<dtype>`` is allowed too."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise Refused.naming("the .metadata", f"{module}.{name}")


def read_metadata(stream: IO[bytes]) -> Metadata:
    """A DCP ``.metadata`` read by the allow-listed unpickler (``Refused`` otherwise)."""
    try:
        metadata = _MetadataUnpickler(stream).load()
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled file: corrupt, not a crash
        raise Refused("the .metadata", f"cannot be read: {type(exc).__name__}: {exc}"[:300]) from None
    if not isinstance(metadata, Metadata):
        raise Refused("the .metadata", f"holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class MetadataReader(FileSystemReader):
    """torch's file system reader, reading ``.metadata`` through ``read_metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream)  # type: ignore[arg-type]
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class PlainLoadPlanner(DefaultLoadPlanner):
    """torch's load planner, reading the shards' non-tensor items as plain data."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = load_plain(value.getvalue(), what=f"the shards' item {read_item.dest_index.fqn!r}")
        if self.flatten_state_dict:  # as torch 2.13's DefaultLoadPlanner.load_bytes
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def first_cause(
    exc: BaseException, wanted: type[E], *, unless: tuple[type[BaseException], ...] = ()
) -> E | None:
    """The first exception of type ``wanted`` (and none of ``unless``) in ``exc``'s chain, ``exc``
    first, breadth first: its ``__cause__`` and ``__context__``, and the per-rank exceptions that
    torch's ``CheckpointException`` carries in ``failures``."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        item = todo.pop(0)
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, wanted) and not isinstance(item, unless):
            return item
        failures = getattr(item, "failures", None)
        if isinstance(failures, dict):
            todo += [
                f[0]
                for f in failures.values()
                if isinstance(f, tuple) and f and isinstance(f[0], BaseException)
            ]
        todo += [item.__cause__, item.__context__]
    return None


def refusal(exc: BaseException) -> Refused | None:
    """The ``Refused`` behind ``exc``, if there is one (``first_cause``)."""
    return first_cause(exc, Refused)
