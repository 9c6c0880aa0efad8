"""What an attacker who can write a host-copy folder but does not hold the run's key would plant
(tests/worker/test_forged_state.py, tests/worker/test_forged_host_copy_run.py): a pickle that runs
a command when it is unpickled with code, and a header rewritten to match it."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["Marker", "forge_copy", "pickled", "xxh3_pieces"]


class Marker:
    """Unpickled with code, it creates ``path`` (``os.system``, as an attacker's would)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def pickled(value: Any) -> bytes:
    """``value`` as ``torch.save`` writes it (a host copy's extra file, a checkpoint's extra)."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def xxh3_pieces(data: bytes) -> str:
    """The host copy's hash before run keys (format 2): xxh3 of the 64 MiB pieces' xxh3s."""
    import xxhash

    view = memoryview(data)
    pieces = [xxhash.xxh3_64_digest(view[i : i + (64 << 20)]) for i in range(0, max(len(view), 1), 64 << 20)]
    return xxhash.xxh3_64_hexdigest(b"".join(pieces))


def forge_copy(header_path: Path, extra: bytes, hashes: str = "") -> None:
    """Put ``extra`` in place of the copy's extra file and rewrite its header (``rank<R>.slot<S>.json``)
    to match, as ``hashes`` says: ``old`` (format 2's unkeyed xxh3), ``unkeyed`` (BLAKE3 without
    a key, and a MAC likewise) or ``wrong-key`` (BLAKE3 and a MAC under a key of the attacker's);
    empty: ``old`` for a format-2 header, else ``wrong-key``."""
    import blake3

    stem = header_path.name.removesuffix(".json")
    (header_path.parent / f"{stem}.extra").write_bytes(extra)
    header = json.loads(header_path.read_text(encoding="utf-8"))
    data = (header_path.parent / f"{stem}.bin").read_bytes()[: header["bytes"]]
    hashes = hashes or ("old" if header["format"] == 2 else "wrong-key")
    if hashes == "old":
        header["data_hash"], header["extra_hash"] = xxh3_pieces(data), xxh3_pieces(extra)
    else:
        key = os.urandom(32) if hashes == "wrong-key" else None

        def digest(text: bytes) -> str:
            return (blake3.blake3(text, key=key) if key else blake3.blake3(text)).hexdigest()

        header["data_hash"], header["extra_hash"] = digest(data), digest(extra)
        fields = {k: v for k, v in header.items() if k != "mac"}
        header["mac"] = digest(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    header_path.write_text(json.dumps(header, sort_keys=True), encoding="utf-8")
