"""Generation and scoring: the paged-KV continuous-batching `Engine` and fixed-shape batched scoring."""

from align.inference.config import EngineConfig, SamplingParams
from align.inference.engine import Engine, EngineStats
from align.inference.sequence import GenerationRequest, GenerationResult

__all__ = ["Engine", "EngineConfig", "EngineStats", "GenerationRequest", "GenerationResult", "SamplingParams"]
