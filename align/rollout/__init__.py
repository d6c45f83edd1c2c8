"""Policy sampling for RL: the trainer-facing protocol, the client factory, and the in-process native backend."""

from align.rollout.client import make_rollout_client
from align.rollout.protocol import (
    RolloutBatch,
    RolloutClient,
    RolloutConfig,
    RolloutMetrics,
    RolloutRequest,
    RolloutResult,
)

__all__ = ["make_rollout_client", "RolloutBatch", "RolloutClient", "RolloutConfig", "RolloutMetrics",
           "RolloutRequest", "RolloutResult"]
