"""Optimizer state that is this rank's shard (`adamw8bit`'s blocks, `offload_adamw`'s host copies): saved with the
world size and refused under another one, since its tensors follow the old ranks' sharding."""

from __future__ import annotations


class RankShardState:
    """Mixin before `torch.optim.Optimizer`: `state_dict` records `world_size`; `checked_state` refuses another."""

    world: int
    state_name: str  # the optimizer's registered name, for the refusal

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["world_size"] = self.world
        return sd

    def checked_state(self, state_dict: dict) -> dict:
        """The saved state without its world size, after refusing one saved under another world size."""
        saved_world = state_dict.get("world_size", 1)
        if saved_world != self.world:
            raise ValueError(f"{self.state_name} state was saved with world size {saved_world}; this run has "
                             f"{self.world}: its tensors are the old ranks' shards, so it cannot be loaded")
        return {k: v for k, v in state_dict.items() if k != "world_size"}
