"""The built-in demo policy: what ``nvtrain run`` and ``validate`` use when no file is given."""

from __future__ import annotations

from importlib import resources

__all__ = ["DEMO_CHECKPOINT_DIR", "DEMO_POLICY_SOURCE", "demo_policy_text"]

DEMO_POLICY_SOURCE = "<built-in demo policy>"
DEMO_CHECKPOINT_DIR = "/tmp/nvtrain-demo/checkpoints"
"""The demo's ``[checkpoint] dir`` (demo.toml). ``nvtrain run`` keeps the demo's checkpoints in
a fresh folder of this user's instead when another user has made ``/tmp/nvtrain-demo`` first."""


def demo_policy_text() -> str:
    """The TOML of the built-in CPU demo job (used when no policy file is given)."""
    return resources.files(__package__).joinpath("demo.toml").read_text(encoding="utf-8")
