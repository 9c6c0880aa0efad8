"""How often an integration saves: the policy's ``[checkpoint] interval`` when the policy gives
one, else a cadence that fits the run.

A policy that leaves ``[checkpoint] interval`` unset (and has no ``[job] max_steps`` to derive
it from) gets the plain default, 1000 steps, which a short framework run never reaches: it
would run with no checkpoint, and restart from its first step after each fault. When the
policy gives no interval, the integration takes one, in this order:

1. the framework's own cadence, when it saves within the run: the Trainer's ``save_steps``
   (``save_strategy = "steps"``), a Lightning ``ModelCheckpoint``'s ``every_n_train_steps``;
2. a tenth of the run's ``max_steps`` (at least 1, at most the default), as the policy's own
   derived default does for ``[job] max_steps``;
3. the policy's default, when the run's length is not known.

Rank 0 says in one line which it used; a cadence that commits no checkpoint before the run's
last step is a warning, whoever chose it (the policy included).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["apply_cadence", "choose_interval", "policy_sets_interval"]

_SAID: set[tuple[str, int]] = set()
"""(run id, interval) already said by this process: one line per run, not one per attempt."""


def policy_sets_interval(policy: Any) -> bool:
    """Whether the policy gives ``[checkpoint] interval``: written in the file, or derived from
    ``[job] max_steps``. The launcher hands the workers the resolved policy with the interval
    left out when neither was the case (``launcher/rundir.py``), so the key is then unset in the
    worker's model as well."""
    return "interval" in policy.checkpoint.model_fields_set


def choose_interval(
    *, policy_interval: int | None, own: int | None, own_name: str, max_steps: int | None, default: int
) -> tuple[int, str]:
    """(the interval, the one line saying where it came from). ``policy_interval``: the
    policy's, when it gives one; ``own``: the framework's cadence (None: it has none that saves
    by steps), named ``own_name``; ``max_steps``: the run's length (None: not known);
    ``default``: the policy's default interval."""
    if policy_interval is not None:
        return policy_interval, f"checkpoint every {policy_interval} steps ([checkpoint] interval)"
    if max_steps is not None and max_steps <= 0:
        max_steps = None
    if own is not None and own > 0 and (max_steps is None or own < max_steps):
        return (
            own,
            f"checkpoint every {own} steps (the framework's {own_name}; [checkpoint] interval is unset)",
        )
    if max_steps is not None:
        interval = min(default, max(1, max_steps // 10))
        why = f"a tenth of max_steps = {max_steps}" if interval < default else "the default"
        if own is not None and own > 0:
            why += f"; the framework's {own_name} = {own} does not save before the run's end"
        return interval, f"checkpoint every {interval} steps ({why}; [checkpoint] interval is unset)"
    return default, (
        f"checkpoint every {default} steps (the default: [checkpoint] interval is unset "
        "and the run's max_steps is not known)"
    )


def apply_cadence(ctx: Any, *, own: int | None, own_name: str, max_steps: int | None) -> int:
    """Set this attempt's checkpoint interval (``ctx.policy``, before the checkpointer is bound)
    as ``choose_interval`` decides, say it once on rank 0 (with a warning when no checkpoint
    would be committed before ``max_steps``); returns it."""
    from nvtrain.worker.settings import say

    policy = ctx.policy
    given = policy.checkpoint.interval if policy_sets_interval(policy) else None
    default = int(type(policy.checkpoint).model_fields["interval"].default)
    interval, line = choose_interval(
        policy_interval=given, own=own, own_name=own_name, max_steps=max_steps, default=default
    )
    if interval != policy.checkpoint.interval:
        # This attempt's copy: the worker library reads the interval from ctx.policy.checkpoint.
        checkpoint = policy.checkpoint.model_copy(update={"interval": interval})
        ctx.policy = policy.model_copy(update={"checkpoint": checkpoint})
    key = (str(getattr(ctx, "run_id", "")), interval)
    if getattr(ctx, "rank", 0) == 0 and key not in _SAID:
        _SAID.add(key)
        if max_steps is not None and 1 < max_steps <= interval:
            line += (
                f"; warning: no checkpoint before the run's last step ({max_steps}): a fault "
                f"restarts it from its start; set [checkpoint] interval below {max_steps}"
            )
        say(line, prefix=f"nvtrain: rank {os.environ.get('RANK', '0')}: ")
    return interval
