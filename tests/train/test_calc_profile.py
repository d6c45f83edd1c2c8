"""The calc_tiny profile (configs/calc_tiny/, the tool-use rung): the pipeline lists its ladder, every task's config
loads into its worker's stage config, the from-scratch policy is a Qwen 3 with a head row per piece of its
tokenizer, GRPO runs the calculator through the chat template's tool turn, and an episode's budget fits the engine."""

from __future__ import annotations

from pathlib import Path

from align.config import load_config
from align.rl.env_chat import tool_turns_for
from align.rl.stage_config import GrpoStageConfig
from align.stages.golden_eval import GoldenEvalStageConfig
from align.stages.ingest import IngestStageConfig
from align.stages.sft import SftStageConfig, build_model
from align.stages.shards import ShardsStageConfig
from align.tokenizer import Tokenizer
from pipeline.layout import Layout, Project
from pipeline.profiles import known_profiles
from pipeline.stage import discover

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"align.stages.ingest": IngestStageConfig, "align.stages.shards": ShardsStageConfig,
           "align.stages.sft": SftStageConfig, "align.stages.grpo": GrpoStageConfig,
           "align.stages.golden_eval": GoldenEvalStageConfig}


def test_every_task_config_loads_and_the_ladder_is_ingest_shards_sft_grpo_and_sfts_evaluation():
    project = Project()
    assert "calc_tiny" in known_profiles(project)
    layout = Layout(project, "calc_tiny")
    present = []
    for spec in discover():
        for ctx in spec.contexts(layout):
            if spec.config_path(ctx).is_file():
                present.append(spec.name)
                load_config(spec.config_path(ctx), CONFIGS[spec.worker], list(spec.args(ctx)))
    assert set(present) == {"ingest", "shards", "sft_checkpoint", "grpo_checkpoint", "golden_eval"}
    assert [ctx.variant for spec in discover() if spec.name == "golden_eval" for ctx in spec.contexts(layout)] == [
        "sft"]  # single-turn: the tool-calling GRPO rung is judged by its receipt's episodes


def test_policy_tokenizer_and_environment_agree():
    sft = load_config(ROOT / "configs" / "calc_tiny" / "sft.toml", SftStageConfig)
    grpo = load_config(ROOT / "configs" / "calc_tiny" / "grpo.toml", GrpoStageConfig)
    tok = Tokenizer.from_config(sft.tokenizer)
    assert tok.content_hash == Tokenizer.from_config(grpo.tokenizer).content_hash
    model = build_model(sft)
    assert model.config.vocab_size == tok.vocab_size and model.config.eos_token_id == tok.eos_id
    assert sft.data.threads == grpo.data.threads == 1
    env = grpo.environment
    assert env is not None and env.name == "calculator" and grpo.data.start == "sft_checkpoint/final"
    turns = tool_turns_for(tok, env.observation)  # "tool_turn": refused if the template had no tool role
    assert "<tool_response>" in turns.text("<result>1</result>")
    prompt = tok.encode_prompt([{"role": "user", "content": "Mia has 9999 apples. She finds 9999 more. "
                                                            "How many apples does Mia have now?"}])
    assert len(prompt) + (env.max_tokens or grpo.shape.max_new_tokens) <= grpo.rollout.engine.max_model_len
