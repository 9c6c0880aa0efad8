"""Framework integrations: a Hugging Face ``Trainer``, a Lightning ``Trainer`` or an
``accelerate`` loop gets the worker library's layers (in-process restart, heartbeats and
sections, async sharded checkpoints with host and peer copies, fault injection, events).

    nvtrain.integrations.hf           Hugging Face Trainer: ``run(main)``, ``train(ctx, trainer)``
    nvtrain.integrations.lightning    Lightning: ``run(main)``, ``fit(ctx, trainer, module, ...)``
    nvtrain.integrations.accelerate   an accelerate loop: ``run(main)``, ``Loop(ctx, ...)``

Each is a thin adapter over ``nvtrain.worker`` (``core`` holds what they share); none of
them is imported here, and importing one imports its framework only (docs/integrations.md).
"""

__all__: list[str] = []
