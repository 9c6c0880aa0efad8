"""What ``nvtrain init`` wrote, and the steps from there to a running job."""

from __future__ import annotations

from collections.abc import Sequence

from nvtrain.cli.render.console import escape, out

__all__ = ["print_init"]


def print_init(directory: str, written: Sequence[str], nvrx: str) -> None:
    """The files ``nvtrain init`` wrote, then the steps from there to a running job; ``nvrx``
    is the NVRx version the written Dockerfile installs."""
    for path in written:
        out.print(f"wrote {escape(path)}", soft_wrap=True)
    policy = escape(written[0]) if written else "policy.toml"
    out.print("next:")
    steps = [
        f"edit {policy}: name, nodes, nproc_per_node, checkpoint dir",
        f"nvtrain validate {policy} --nvrx {escape(nvrx)}",
        f"docker build -t IMAGE {escape(directory)} && docker push IMAGE",
        f"nvtrain manifest {policy} --image IMAGE --nvrx {escape(nvrx)} -o job.yaml",
        "kubectl apply -f job.yaml",
    ]
    for number, step in enumerate(steps, 1):
        out.print(f"  {number}. {step}", soft_wrap=True)
