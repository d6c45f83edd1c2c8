"""The OLMoE profiles' configs: `olmoe` (the real OLMoE-1B-7B recipe for a 4-GPU node, not run here) loads into
every stage's config and its preflight admits such a node and refuses a small host; `olmoe_tiny` (the CPU ladder)
is the tiny recipe with an OLMoE policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from align.config import load_config
from align.profile import CommonConfig
from align.rl.stage_config import GrpoStageConfig
from align.stages.dpo import DpoStageConfig
from align.stages.golden_eval import GoldenEvalStageConfig
from align.stages.ref_cache import RefCacheStageConfig
from align.stages.sft import SftStageConfig
from align.train.schedulers import SchedulerConfig
from align.utils.guard import HostStatus, preflight_problems

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_olmoe_recipe_loads_in_every_stage():
    sft = load_config(CONFIGS / "olmoe" / "sft.toml", SftStageConfig)
    assert sft.model.base == sft.tokenizer.path == "/models/olmoe-1b-7b-0924"
    assert sft.model.moe is None  # the family comes from the snapshot's config.json
    assert sft.moe_aux.coefficients("sft") == (0.0, 0.0) and sft.parallel.strategy == "fsdp"
    dpo = load_config(CONFIGS / "olmoe" / "dpo.toml", DpoStageConfig)
    ref = load_config(CONFIGS / "olmoe" / "ref_cache.toml", RefCacheStageConfig)
    assert dpo.data.ref_dtype == ref.scoring.dtype and ref.tokenizer.path == sft.tokenizer.path
    load_config(CONFIGS / "olmoe" / "grpo.toml", GrpoStageConfig)
    load_config(CONFIGS / "olmoe" / "golden_eval.toml", GoldenEvalStageConfig)


def test_olmoe_preflight_admits_a_node_and_refuses_a_small_host():
    pre = load_config(CONFIGS / "olmoe" / "common.toml", CommonConfig).preflight
    node = HostStatus(mem_available_gib=400.0, free_disk_gib=800.0, load_per_cpu=0.1, free_gpu_gib=(79.0,) * 4)
    assert preflight_problems(pre, node) == []
    small = HostStatus(mem_available_gib=8.0, free_disk_gib=40.0, load_per_cpu=0.5, free_gpu_gib=(10.0,))
    problems = preflight_problems(pre, small)
    assert any("MemAvailable" in p for p in problems) and any("free disk" in p for p in problems)
    assert any("GPU 0" in p for p in problems)


def test_olmoe_tiny_is_the_tiny_recipe_with_an_moe_policy():
    cfg = load_config(CONFIGS / "olmoe_tiny" / "sft.toml", SftStageConfig)
    tiny = load_config(CONFIGS / "tiny" / "sft.toml", SftStageConfig)
    assert cfg.model.moe is not None and cfg.model.moe.num_experts == 8 and cfg.model.moe.num_experts_per_tok == 2
    # as many active MLP units per token as tiny's dense MLP
    assert cfg.model.moe.num_experts_per_tok * cfg.model.init.intermediate_size == tiny.model.init.intermediate_size
    assert cfg.moe_aux.coefficients("sft") == (0.01, 0.001)  # from scratch: the router learns in the SFT
    for table in ("train", "loader", "tokenizer"):
        assert getattr(cfg, table) == getattr(tiny, table), table
    # the rate and schedule its anchors and bands record: tiny's cosine from 1e-3 before tiny moved to wsd at 2e-3
    # (50adfc0); the rest of the optimizer is tiny's
    assert cfg.optimizer == replace(tiny.optimizer, lr=1e-3)
    assert cfg.scheduler == SchedulerConfig(name="cosine", warmup_steps=30, min_lr_ratio=0.1)
    for stage, cls in (("dpo", DpoStageConfig), ("grpo", GrpoStageConfig)):  # the later rungs are tiny's
        ours, theirs = (load_config(CONFIGS / p / f"{stage}.toml", cls) for p in ("olmoe_tiny", "tiny"))
        assert ours == theirs, stage
