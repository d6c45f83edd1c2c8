"""`make_rollout_client(config, model)`: the sampler a trainer talks to, chosen by `config.backend`."""

from __future__ import annotations

import torch

from align.rollout.protocol import RolloutClient, RolloutConfig


def make_rollout_client(config: RolloutConfig, model: torch.nn.Module | None = None,
                        vocab_limit: int | None = None) -> RolloutClient:
    """Build the configured backend. "native" runs the align Engine in this process on `model` (the policy
    module itself or a copy; weight updates go through `client.update_weights`). `vocab_limit`: the tokenizer's
    vocabulary size, so a head padded past it never samples an id with no piece (Engine)."""
    if config.backend == "native":
        if model is None:
            raise ValueError("make_rollout_client: backend 'native' needs the model to sample from")
        from align.rollout.native import NativeRolloutClient

        return NativeRolloutClient(model, config.engine, seed=config.seed, vocab_limit=vocab_limit)
    raise ValueError(f"make_rollout_client: unknown rollout.backend {config.backend!r}; expected 'native'")
