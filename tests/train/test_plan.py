"""align.plan: the memory plan checked against what scaled-down models of every family really hold on this CPU.

Weights, gradients and each optimizer's state: the plan's bytes equal the tensors' bytes after a real TrainModule
step, exactly. Activations: the plan's saved-for-backward bytes against the storages autograd still holds at the end
of the real loss forward (saved-tensor hooks; weak references drop what a discarded branch saved), on Mistral, Llama,
Qwen 2, Qwen 3 (per-head q/k norms) and OLMoE (the MoE block and the router statistics its objective keeps), with and
without activation checkpointing, within 3% (stated tolerance: under checkpointing the RoPE tables are kept alive by
the recompute closure, which the hooks do not see; without it the formula is exact). plan.toml: `model_type` names
the family, its count is transformers' (oracle), a bad table is one error naming the file and key. The CLI: a table
and exit 0 when it fits, one line and exit 83 when it does not, exit 2 for a profile without an SFT config."""

from __future__ import annotations

import gc
import json
import math
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from align.model import MistralConfig
from align.config import load_config
from align.exceptions import ConfigError
from align.model.family import FAMILIES, family_of_config, from_scratch
from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM, set_router_dtype
from align.plan import (Workload, block_activation_bytes, block_numel, param_shapes, plan, saved_activation_bytes,
                        shard_numel, workloads)
from align.stages.sft import SftStageConfig
from align.train.moe_module import MoeAuxConfig, build_train_module
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.sft_loss import SftLossConfig
from align.train.sft_module import SftTrainModule
from align.train.train_module import AccumInfo, TrainModuleConfig
from train_helpers import sft_batch

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _module(cfg: MistralConfig, dtype: str, optimizer: str, ac: bool = False) -> SftTrainModule:
    torch.manual_seed(0)
    model = family_of_config(cfg).causal_lm(cfg).to(getattr(torch, dtype))
    mcfg = TrainModuleConfig(optimizer=OptimizerConfig(name=optimizer, lr=1e-3, weight_decay=0.1),
                             parallel=ParallelConfig(activation_checkpointing=ac))
    return SftTrainModule(model, mcfg, SftLossConfig(chunk_size=32, kernel="torch"), total_steps=1)


def _full_batch(b: int, t: int, vocab: int) -> dict:
    batch = sft_batch(b, t, vocab)
    batch["attention_mask"] = torch.ones(b, t, dtype=torch.bool)  # full rows: the causal path without a mask
    batch["input_ids"] = torch.randint(3, vocab, (b, t), generator=torch.Generator().manual_seed(1))
    return batch


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit", "offload_adamw"])
def test_weights_gradients_and_optimizer_state_bytes_are_exact(dtype, optimizer):
    cfg = MistralConfig(**SMALL)  # tensors above and below adamw8bit's 4096-element threshold
    module = _module(cfg, dtype, optimizer)
    batch = _full_batch(2, 32, cfg.vocab_size)
    module.train_batch(batch, AccumInfo(0, 1, float(module.loss_units(batch)), 1))
    module.optim_step()
    params = list(module.model.parameters())
    state = [v for s in module.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    w = Workload("sft", cfg, dtype, ParallelConfig(), tokens=64, grad_accum=1, head_chunk=32)
    p = plan(w, 1, separate_host=False)  # one CPU process: no staging slots, host and device are one memory
    assert p.terms["weights"] == _nbytes(params)
    assert p.terms["gradients"] == _nbytes(x.grad for x in params)
    assert p.optimizer_device[optimizer] + p.optimizer_host[optimizer] == _nbytes(state)
    assert {"adamw": 2, "adamw8bit": 0, "offload_adamw": 0}[optimizer] * _nbytes(params) <= \
        p.optimizer_device[optimizer] + 1  # where the state lives: adamw's moments beside the weights, in their dtype


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_plan_counts_every_parameter_of_every_family(name):
    """Qwen 2's q/k/v biases, Qwen 3's q/k norms, OLMoE's router and experts: the plan's count is the real model's,
    in total and per decoder block (FSDP2's unit, which sizes the gathered-block buffers)."""
    cfg = FAMILIES[name].spec.cls(**SMALL)
    torch.manual_seed(0)
    model = FAMILIES[name].causal_lm(cfg)
    assert sum(math.prod(s) for s in param_shapes(cfg)) == sum(p.numel() for p in model.parameters())
    assert block_numel(cfg) == sum(p.numel() for p in model.model.layers[0].parameters())


def test_a_from_scratch_profile_is_planned_as_its_family():
    """configs/qwen3_tiny: [model] family = "qwen3" over [model.init]; the plan counts the model the stage builds."""
    sft = workloads("qwen3_tiny")[0]
    built = from_scratch(load_config(ROOT / "configs" / "qwen3_tiny" / "sft.toml", SftStageConfig).model.init,
                         family="qwen3")
    assert sum(math.prod(s) for s in param_shapes(sft.model)) == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("name", [n for n in sorted(FAMILIES) if FAMILIES[n].mlp == "dense" and n != "mistral"])
def test_other_dense_families_state_bytes_are_exact(name):
    """The exact-bytes check above on each other dense family's model after a real step (fp32, adamw)."""
    cfg = FAMILIES[name].spec.cls(**SMALL)
    module = _module(cfg, "float32", "adamw")
    batch = _full_batch(2, 16, cfg.vocab_size)
    module.train_batch(batch, AccumInfo(0, 1, float(module.loss_units(batch)), 1))
    module.optim_step()
    params = list(module.model.parameters())
    state = [v for s in module.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    p = plan(Workload("sft", cfg, "float32", ParallelConfig(), tokens=32, grad_accum=1, head_chunk=32), 1,
             separate_host=False)
    assert p.terms["weights"] == _nbytes(params) and p.terms["gradients"] == _nbytes(x.grad for x in params)
    assert p.optimizer_device["adamw"] + p.optimizer_host["adamw"] == _nbytes(state)


def _saved_bytes(module: SftTrainModule, batch: dict) -> int:
    """Bytes of the distinct storages autograd holds for backward at the end of the real loss forward (parameters
    excluded). A tensor saved by a graph branch that is dropped before the forward ends (the MoE objective's
    detached router entropy) is freed with it and not counted: weak references tell which saved tensors live on."""
    params = {x.untyped_storage().data_ptr() for x in module.model.parameters()}
    saved: list[weakref.ref] = []

    def pack(t):
        t = t.detach()  # the graph keeps this alias only: no cycle through a saved output's own grad_fn
        if t.untyped_storage().data_ptr() not in params:
            saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module.net(batch)
    gc.collect()
    live = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (r() for r in saved) if t is not None}
    out.loss.backward()  # the graph was usable
    return sum(live.values())


def _activations(cfg, bt: tuple[int, int], ac: bool) -> tuple[int, int]:
    """(the plan's saved-activation bytes, the bytes a real bf16 forward saves) for a full batch of shape `bt`."""
    module = _module(cfg, "bfloat16", "adamw", ac=ac)
    batch = _full_batch(*bt, cfg.vocab_size)
    measured = _saved_bytes(module, batch)
    labels = int((batch["labels"][:, 1:] != -100).sum())
    return saved_activation_bytes(cfg, bt[0] * bt[1], "bfloat16", ac, label_tokens=labels, row_len=bt[1]), measured


@pytest.mark.parametrize("shape,bt", [
    (dict(SMALL), (2, 64)),
    (dict(SMALL, hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=3), (1, 128)),
    (dict(SMALL, num_hidden_layers=2, vocab_size=1024, head_dim=32), (4, 32)),
])
@pytest.mark.parametrize("ac", [False, True])
def test_saved_activations_match_the_formula(shape, bt, ac):
    cfg = MistralConfig(**shape)
    predicted, measured = _activations(cfg, bt, ac)
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)
    assert predicted >= measured  # the plan errs on the safe side


FAMILY_SHAPES = {  # a second shape per family with head_dim != hidden / heads where the family allows it
    "llama": dict(SMALL, num_hidden_layers=2, vocab_size=1024, head_dim=32),
    "qwen2": dict(SMALL, num_hidden_layers=2, vocab_size=1024, hidden_size=128),  # head_dim is hidden / heads
    "qwen3": dict(SMALL, num_hidden_layers=2, vocab_size=1024, head_dim=32),
}


@pytest.mark.parametrize("name", sorted(FAMILY_SHAPES))
@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("ac", [False, True])
def test_saved_activations_of_each_dense_family_match_the_formula(name, second, ac):
    """The measurement above on each other dense family's real model: Qwen 3's per-head q/k norms save their fp32
    input copy, a rsqrt per head and their output (the formula's `qk_norm` term, exact without checkpointing); Qwen 2's
    q/k/v biases and Llama's scaled RoPE save nothing the Mistral formula does not count."""
    shape, bt = (FAMILY_SHAPES[name], (4, 32)) if second else (dict(SMALL), (2, 64))
    cfg = FAMILIES[name].spec.cls(**shape)
    predicted, measured = _activations(cfg, bt, ac)
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)
    assert predicted >= measured
    if not ac:
        assert predicted == measured  # without checkpointing the formula is exact, the q/k norms' term included


def test_qwen3_blocks_save_their_qk_norms_beyond_the_same_mistral_shape():
    """Per token and block: (H + K) heads x (fp32 copy 4 Dh + rsqrt 4 + output c Dh) more than Mistral's block."""
    shape = dict(SMALL, head_dim=32)
    qwen3, mistral = FAMILIES["qwen3"].spec.cls(**shape), MistralConfig(**shape)
    extra = block_activation_bytes(qwen3, 10, "bfloat16") - block_activation_bytes(mistral, 10, "bfloat16")
    assert extra == 10 * (4 + 2) * (4 * 32 + 4 + 2 * 32)


def _moe_module(cfg: OlmoeConfig, router_dtype: str, ac: bool):
    """An OLMoE SFT module as the stage builds it (build_train_module: the MoE objective and its router stats)."""
    torch.manual_seed(0)
    model = OlmoeForCausalLM(cfg).to(torch.bfloat16)
    set_router_dtype(model, router_dtype)
    mcfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-3), parallel=ParallelConfig(activation_checkpointing=ac))
    return build_train_module(SftTrainModule, model, mcfg, SftLossConfig(chunk_size=32, kernel="torch"),
                              total_steps=1, moe_aux=MoeAuxConfig(), stage="sft")


@pytest.mark.parametrize("shape", [
    dict(SMALL, num_experts=8, num_experts_per_tok=2),
    dict(SMALL, hidden_size=96, num_attention_heads=6, num_key_value_heads=3, num_experts=4, num_experts_per_tok=1),
])
@pytest.mark.parametrize("router_dtype", ["activation", "fp32"])
@pytest.mark.parametrize("ac", [False, True])
def test_saved_activations_of_an_moe_model_match_the_formula(shape, router_dtype, ac):
    """OLMoE: the q/k norms over whole projections, the MoE block (routing, dispatch, the experts' rows, the combine)
    and the router statistics the MoE objective keeps per layer: exact without checkpointing."""
    cfg = OlmoeConfig(**shape)
    module = _moe_module(cfg, router_dtype, ac)
    batch = _full_batch(2, 64, cfg.vocab_size)
    measured = _saved_bytes(module, batch)
    labels = int((batch["labels"][:, 1:] != -100).sum())
    predicted = saved_activation_bytes(cfg, 128, "bfloat16", ac, label_tokens=labels, row_len=64,
                                       router_dtype=router_dtype)
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)
    if not ac:
        assert predicted == measured


def test_moe_blocks_save_by_experts_chosen_not_experts_held():
    """Per token the expert activations grow with top-k, the routing terms with the expert count."""
    few, many = (OlmoeConfig(**dict(SMALL, num_experts=e, num_experts_per_tok=2)) for e in (4, 64))
    wider = OlmoeConfig(**dict(SMALL, num_experts=4, num_experts_per_tok=4))
    assert block_activation_bytes(many, 1, "bfloat16") - block_activation_bytes(few, 1, "bfloat16") == 4 * 60
    assert block_activation_bytes(wider, 1, "bfloat16") - block_activation_bytes(few, 1, "bfloat16") == \
        2 * (16 + 2 * (2 * 64 + 4 * 160 + 1))


def test_a_from_scratch_moe_profile_is_planned_as_olmoe():
    """configs/olmoe_tiny: [model.moe] over [model.init]; the plan counts the OLMoE the stage builds."""
    sft_cfg = load_config(ROOT / "configs" / "olmoe_tiny" / "sft.toml", SftStageConfig)
    sft = workloads("olmoe_tiny")[0]
    built = from_scratch(sft_cfg.model.init, sft_cfg.model.moe)
    assert sum(math.prod(s) for s in param_shapes(sft.model)) == sum(p.numel() for p in built.parameters())
    assert sft.router_dtype == sft_cfg.model.moe.router_dtype


def test_expert_parallelism_is_refused_not_misplanned(tmp_path):
    shutil.copytree(ROOT / "configs" / "olmoe", tmp_path / "configs" / "p")
    sft = tmp_path / "configs" / "p" / "sft.toml"
    sft.write_text(sft.read_text().replace("# expert_parallel = 4", "expert_parallel = 4"))
    with pytest.raises(ConfigError, match=r"sft.toml: \[parallel\] expert_parallel = 4; align.plan models"):
        workloads("p", root=tmp_path)


def test_shards_follow_fsdp2_dim0_split():
    assert shard_numel((32768, 4096), 8) == 4096 * 4096
    assert shard_numel((5, 3), 2) == 3 * 3  # rank 0 takes ceil(5 / 2) rows
    assert shard_numel((4096,), 1) == 4096


def test_mistral7b_profile_has_the_published_parameter_count():
    sft = workloads("mistral7b")[0]
    assert sum(int(torch.Size(s).numel()) for s in param_shapes(sft.model)) == 7_248_023_552  # Mistral-7B-v0.3
    assert sft.param_dtype == "bfloat16" and sft.parallel.activation_checkpointing and sft.tokens == 4096


BYO_PLANS = {"qwen2.5-0.5b": ("qwen2", 494_032_768), "qwen3-0.6b": ("qwen3", 596_049_920),
             "llama3.2-1b": ("llama", 1_235_814_400), "olmoe": ("olmoe", 6_919_161_856)}
# the published models' parameter counts (tied heads once; OLMoE-1B-7B: 64 experts per layer, "6.9B total")


@pytest.mark.parametrize("profile", sorted(BYO_PLANS))
def test_a_plan_toml_names_its_family(profile):
    """plan.toml's `model_type` picks the family's config.json reader: the profile is planned as that family's
    model (Qwen 3's q/k norms in parameters and activations, Qwen 2's biases), with the published count."""
    family, count = BYO_PLANS[profile]
    for w in workloads(profile):
        assert family_of_config(w.model).name == family
        assert sum(math.prod(s) for s in param_shapes(w.model)) == count
    assert workloads(profile)[0].model.qk_norm == ("head" if family == "qwen3" else None)


@pytest.mark.oracle
@pytest.mark.parametrize("profile", sorted(BYO_PLANS) + ["mistral7b"])
def test_plan_toml_describes_the_model_transformers_builds(profile):
    """The same [model] values through transformers' own config class and model (on the meta device): the same
    parameter count as the plan's, so plan.toml reads as the hub's config.json does."""
    import tomllib

    from transformers import AutoConfig, AutoModelForCausalLM

    values = tomllib.loads((ROOT / "configs" / profile / "plan.toml").read_text())["model"]
    hf = AutoConfig.for_model(values.pop("model_type", "mistral"), **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    ours = workloads(profile)[0].model
    assert sum(math.prod(s) for s in param_shapes(ours)) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("text,said", [
    ('[model]\nmodel_type = "gpt2"\nvocab_size = 64\n', "model_type is 'gpt2'; align implements"),
    ('[model]\nmodel_type = "qwen2"\nuse_sliding_window = true\n', "field 'use_sliding_window' = True"),
    ('[model]\nmodel_type = "qwen3"\nhidden_sizes = 64\n', "unsupported field(s) ['hidden_sizes']"),
    ('[model]\nmodel_type = "olmoe"\nclip_qkv = 8.0\n', "clip_qkv"),
    ('[model]\nvocab_size = 64\n[train]\nsteps = 1\n', "unknown key(s) ['train']"),
    ('vocab_size = 64\n', "unknown key(s) ['vocab_size']"),
])
def test_a_bad_plan_toml_is_bad_input_naming_file_and_key(tmp_path, text, said):
    shutil.copytree(ROOT / "configs" / "qwen3-0.6b", tmp_path / "configs" / "p")  # its base is not on this host
    (tmp_path / "configs" / "p" / "plan.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        workloads("p", root=tmp_path)
    assert said in str(err.value) and str(tmp_path / "configs" / "p" / "plan.toml") in str(err.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "align.plan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # ~30 s of CLI subprocesses; the plan's numbers are tested in-process above
def test_cli_fits_refuses_and_reports():
    ok = _cli("--profile", "mistral7b", "--gpus", "4", "--gpu-mem", "80", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    sft = report["stages"][0]
    assert sft["optimizer_device"]["offload_adamw"] == 0 and sft["optimizer_host"]["offload_adamw"] > 0
    assert sft["device_total"]["offload_adamw"] < sft["device_total"]["adamw8bit"] < sft["device_total"]["adamw"]
    refused = _cli("--profile", "mistral7b", "--gpus", "1", "--gpu-mem", "24", "--optimizer", "offload_adamw")
    assert refused.returncode == 83
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]  # one line
    assert "plan does not fit: mistral7b on 1 x 24 GiB with offload_adamw" in refused.stderr
    host = _cli("--profile", "mistral7b", "--gpus", "8", "--gpu-mem", "80", "--optimizer", "offload_adamw",
                "--host-mem", "64")
    assert host.returncode == 83 and "host memory" in host.stderr
    sweep = _cli("--profile", "mistral7b", "--sweep")
    assert sweep.returncode == 0 and [line.split(" | ")[0] for line in sweep.stdout.splitlines()[2:]] == \
        ["| 1", "| 2", "| 4", "| 8"]
    missing = _cli("--profile", "no_such_profile", "--gpus", "1", "--gpu-mem", "80")
    assert missing.returncode == 2 and "configs/no_such_profile/sft.toml: no such file" in missing.stderr
