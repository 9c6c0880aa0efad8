"""What the integration tests' training scripts share: deterministic data, the fingerprint of
a rank's whole training state, one-line output."""

from __future__ import annotations

import hashlib
import random
import sys
import time
from typing import Any

import torch


def say(line: str) -> None:
    """One line on stdout in one write (the ranks share the launcher's pipe)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def linger(seconds: float) -> None:
    """After training: ``seconds`` of Python code and no step, as an evaluation or an export
    would be (longer than the tests' 5 s soft timeout: no step is coming, and that is no hang)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


def tokens(index: int, vocab: int = 96, length: int = 16) -> torch.Tensor:
    """Sample ``index``: the same tokens in every run."""
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(1000 + index))


def _update(digest: Any, name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        raw = local.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(name.encode() + raw.numpy().tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _update(digest, f"{name}.{key}", value[key])
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _update(digest, f"{name}[{i}]", item)
    else:
        digest.update(f"{name}={value!r}".encode())


def fingerprint(model: torch.nn.Module, optimizer: Any, scheduler: Any) -> str:
    """A hash of this rank's model, optimizer and scheduler state and its RNG states (bitwise)."""
    digest = hashlib.sha256()
    _update(digest, "model", model.state_dict())
    _update(digest, "optim", optimizer.state_dict())
    if scheduler is not None:
        state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
        _update(digest, "sched", state)
    _update(digest, "rng.torch", torch.get_rng_state())
    _update(digest, "rng.python", list(random.getstate()[1]))
    return digest.hexdigest()[:16]
