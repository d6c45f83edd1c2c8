"""The bring-your-own-model recipes (configs/qwen2.5-0.5b, configs/qwen3-0.6b, configs/llama3.2-1b; real recipes
for one GPU, not run here): the pipeline lists each as a profile with the whole ladder, every task's config loads
into its worker's stage config (with the task's own overrides), the snapshot is named once for the weights and
once for the tokenizer, the preflight admits a one-GPU host and refuses a small one, and plan.toml's shape built as
the family's model has the published parameter count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from align.config import load_config
from align.profile import CommonConfig
from align.rl.stage_config import GrpoStageConfig
from align.model.family import FAMILIES
from align.plan import plan_architecture
from align.stages.dpo import DpoStageConfig
from align.stages.golden_eval import GoldenEvalStageConfig
from align.stages.ingest import IngestStageConfig
from align.stages.ref_cache import RefCacheStageConfig
from align.stages.sft import SftStageConfig
from align.stages.shards import ShardsStageConfig
from align.utils.guard import HostStatus, preflight_problems
from pipeline.layout import Layout, Project
from pipeline.profiles import known_profiles
from pipeline.stage import discover

ROOT = Path(__file__).resolve().parents[2]
WORKER_CONFIGS = {
    "align.stages.ingest": IngestStageConfig, "align.stages.shards": ShardsStageConfig,
    "align.stages.sft": SftStageConfig, "align.stages.ref_cache": RefCacheStageConfig,
    "align.stages.dpo": DpoStageConfig, "align.stages.grpo": GrpoStageConfig,
    "align.stages.golden_eval": GoldenEvalStageConfig,
}
# profile -> (family of the snapshot, published parameter count of the checkpoint: tied embeddings counted once)
PROFILES = {"qwen2.5-0.5b": ("qwen2", 494_032_768), "qwen3-0.6b": ("qwen3", 596_049_920),
            "llama3.2-1b": ("llama", 1_235_814_400)}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_task_config_loads_into_its_stage(profile):
    project = Project()
    assert profile in known_profiles(project)
    layout = Layout(project, profile)
    tasks = []
    for spec in discover():
        for ctx in spec.contexts(layout):
            if spec.optional and not spec.config_path(ctx).is_file():
                continue
            assert spec.worker in WORKER_CONFIGS, f"{profile}: no validation for {spec.worker} ({spec.name})"
            load_config(spec.config_path(ctx), WORKER_CONFIGS[spec.worker], list(spec.args(ctx)))
            tasks.append(spec.name if ctx.variant is None else f"{spec.name}:{ctx.variant}")
    assert {"ingest:sft", "ingest:rl", "shards:sft", "shards:preference", "shards:prompts", "shards:eval",
            "sft_checkpoint", "ref_cache", "dpo_checkpoint", "grpo_checkpoint", "golden_eval:grpo"} <= set(tasks)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_snapshot_is_the_weights_and_the_tokenizer(profile):
    d = ROOT / "configs" / profile
    sft = load_config(d / "sft.toml", SftStageConfig)
    shards = load_config(d / "shards.toml", ShardsStageConfig, ["split=sft"])
    ref = load_config(d / "ref_cache.toml", RefCacheStageConfig)
    assert sft.model.base == sft.tokenizer.path == shards.tokenizer.path == ref.tokenizer.path
    assert Path(sft.model.base).is_absolute() and sft.model.dtype == "bfloat16"
    assert sft.run.world_size == 1 and sft.parallel.strategy == "single"
    sources = load_config(d / "ingest.toml", IngestStageConfig, ["source=sft"]).sources
    assert sources["sft"].format == "messages" and sources["rl"].format == "prompt_answer"
    assert load_config(d / "dpo.toml", DpoStageConfig).data.ref_dtype == ref.scoring.dtype


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_preflight_admits_one_gpu_and_refuses_a_small_host(profile):
    pre = load_config(ROOT / "configs" / profile / "common.toml", CommonConfig).preflight
    gpu_host = HostStatus(mem_available_gib=64.0, free_disk_gib=200.0, load_per_cpu=0.1, free_gpu_gib=(79.0,))
    assert preflight_problems(pre, gpu_host) == []
    small = HostStatus(mem_available_gib=8.0, free_disk_gib=10.0, load_per_cpu=0.5, free_gpu_gib=(8.0,))
    problems = preflight_problems(pre, small)
    assert any("MemAvailable" in p for p in problems) and any("free disk" in p for p in problems)
    assert any("GPU 0" in p for p in problems)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_plan_shape_is_the_published_model(profile):
    family, params = PROFILES[profile]
    cfg = plan_architecture(ROOT / "configs" / profile / "plan.toml")  # `model_type` picks the family's reader
    assert type(cfg) is FAMILIES[family].spec.cls
    with torch.device("meta"):
        model = FAMILIES[family].causal_lm(cfg, init=False)
    assert sum(p.numel() for p in model.parameters()) == params


def test_qwen3_tiny_is_a_qwen3_over_its_own_tokenizer():
    """The CPU ladder on a second family: every task's config loads, the from-scratch policy is a Qwen 3 whose head
    has a row per piece of the trimmed Qwen 3 tokenizer, and its pad / eos ids are that tokenizer's."""
    from align.stages.onpolicy_pairs import OnPolicyStageConfig
    from align.stages.sft import build_model
    from align.tokenizer import Tokenizer

    layout = Layout(Project(), "qwen3_tiny")
    configs = {**WORKER_CONFIGS, "align.stages.onpolicy_pairs": OnPolicyStageConfig}
    for spec in discover():
        for ctx in spec.contexts(layout):
            if spec.config_path(ctx).is_file():
                load_config(spec.config_path(ctx), configs[spec.worker], list(spec.args(ctx)))
    sft = load_config(ROOT / "configs" / "qwen3_tiny" / "sft.toml", SftStageConfig)
    tok = Tokenizer.from_config(sft.tokenizer)
    model = build_model(sft)
    assert type(model) is FAMILIES["qwen3"].causal_lm and model.config.qk_norm == "head"
    assert model.config.vocab_size == tok.vocab_size == 565
    assert model.config.pad_token_id == tok.token_to_id("<|endoftext|>")
    assert model.config.eos_token_id == tok.eos_id == tok.token_to_id("<|im_end|>")
    enc = tok.encode_chat([{"role": "user", "content": "What is 2 + 3?"},
                           {"role": "assistant", "content": "2 + 3 = 5. The answer is \\boxed{5}."}])
    assert tok.decode([i for i, m in zip(enc.ids, enc.loss_mask) if m]).startswith("<think>\n\n</think>\n\n2 + 3")


def test_from_scratch_family_and_moe_contradict():
    from align.exceptions import CheckpointError
    from align.model.family import from_scratch
    from align.model.olmoe import ExpertLayout

    init = load_config(ROOT / "configs" / "qwen3_tiny" / "sft.toml", SftStageConfig).model.init
    with pytest.raises(CheckpointError, match="family"):
        from_scratch(init, ExpertLayout(), "qwen3")
    with pytest.raises(CheckpointError, match="model_type is 'gemma'"):
        from_scratch(init, None, "gemma")
