"""What ``nvtrain manifest -o`` wrote, and how to apply it."""

from __future__ import annotations

from collections.abc import Sequence

from nvtrain.cli.render.console import escape, out

__all__ = ["print_manifest_written"]


def print_manifest_written(path: str, objects: Sequence[tuple[str, str]]) -> None:
    """Which objects went into the file ``nvtrain manifest -o`` wrote, and how to apply them."""
    out.print(f"wrote {escape(path)}:", soft_wrap=True)
    for kind, name in objects:
        out.print(f"  {escape(kind)} {escape(name)}")
    out.print(f"apply: kubectl apply -f {escape(path)}", soft_wrap=True)
