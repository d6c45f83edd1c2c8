"""`[lora]` in the SFT, DPO and GRPO stages (align.lora.stage) on real artifacts: only the adapters train, final/
is the merged ordinary HF checkpoint equal to base + B A alpha/r bitwise, final/adapter/ is peft's layout (peft loads
it onto the transformers base with equal logits: oracle), a resumed LoRA run is bitwise the uninterrupted one, and
samplers receive the adapters (GRPO's push, the in-loop Engine; merged weights with engine_sync = "merged")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from align.config import load_config
from align.model.checkpoint import checkpoint_content_hash, load_checkpoint, save_checkpoint
from align.lora.adapters import LoraConfig, apply_lora, lora_layers, merge_state_dict
from align.lora.stage import AdapterWeightsClient, MergedWeightsClient, inloop_eval
from align.rollout.native import NativeRolloutClient
from align.stages.sft import SftStageConfig, build_model
from align.utils.manifest import read_manifest
from align.utils.tracking import read_history

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "dpo"))
sys.path.insert(0, str(TESTS / "rl"))
from stage_fixtures import build_pair_shards, pair_rows, run_worker, save_tiny_checkpoint  # noqa: E402
from stage_inputs import prompt_shards, runs_tree  # noqa: E402

ROOT = TESTS.parent
LORA = "\n[lora]\nrank = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\nsave_adapter = true\n"
SCALING = 2.0
SFT_FAST = ("loader.micro_batch_size=4", "loader.grad_accum=1", "data.threads=1", "train.max_steps=4",
            "train.checkpoint_every=2", "optimizer.lr=1e-2")


def _smoke_config(tmp: Path, stage: str, extra: str = LORA) -> Path:
    """configs/smoke/<stage>.toml (+ its common.toml) with a [lora] table appended, in `tmp`."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "common.toml").write_text((ROOT / "configs/smoke/common.toml").read_text())
    path = tmp / f"{stage}.toml"
    path.write_text((ROOT / f"configs/smoke/{stage}.toml").read_text() + extra)
    return path


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from align.data.ingest_parquet import SourceConfig, ingest_source
    from align.data.shard_build import ShardBuildConfig, build_shards
    from align.tokenizer import TokenizerConfig

    tmp = tmp_path_factory.mktemp("lora_sft")
    rows = [{"prompt": f"What is {i} plus {i % 7}?", "response": f"{i} + {i % 7} = {i + i % 7}. \\boxed{{{i + i % 7}}}"}
            for i in range(24)]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "sft.parquet")
    ingest_source("sft", SourceConfig(path=str(tmp / "sft.parquet"), kind="sft", format="prompt_response"),
                  tmp / "records")
    runs = tmp / "runs"
    build_shards(tmp / "records", runs / "shards" / "sft" / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    config = _smoke_config(tmp / "configs", "sft")
    return runs, config


def _base_state(config: Path) -> dict[str, torch.Tensor]:
    """The smoke SFT's from-scratch start (seeded by [run].seed): LoRA's frozen base."""
    model = build_model(load_config(config, SftStageConfig))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _check_merged_final(final: Path, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """final/ = base + B A alpha/r on the targets, bitwise base elsewhere; returns the adapter's tensors."""
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"]
    merged = load_file(str(final / "model.safetensors"))
    assert not [k for k in merged if "lora" in k]
    adapter = load_file(str(final / "adapter" / "adapter_model.safetensors"))
    assert set(read_manifest(final)["files"]) >= {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"}
    targets = {k.removeprefix("base_model.model.").removesuffix(".lora_A.weight") for k in adapter if "lora_A" in k}
    assert targets and all(t.endswith(("q_proj", "v_proj", "down_proj")) for t in targets)
    for key, value in merged.items():
        module = key.removesuffix(".weight")
        if module in targets:
            a = adapter[f"base_model.model.{module}.lora_A.weight"]
            b = adapter[f"base_model.model.{module}.lora_B.weight"]
            assert torch.equal(value, base[key] + (b @ a) * SCALING), key
        else:
            assert torch.equal(value, base[key]), key
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # the adapters trained
    return adapter


def test_sft_with_lora_trains_only_adapters_and_publishes_the_merged_model(sft_runs, tmp_path):
    runs, config = sft_runs
    run_dir = tmp_path / "sft"
    assert run_worker("align.stages.sft", config, runs, run_dir, *SFT_FAST) == 0
    base = _base_state(config)
    _check_merged_final(run_dir / "final", base)
    assert json.loads((run_dir / "final" / "adapter" / "adapter_config.json").read_text())["r"] == 4
    # the step checkpoints hold the adapters and name the frozen base, written once per run (a from-scratch base)
    steps = sorted((run_dir / "checkpoints").glob("step_*"))
    assert steps and steps[-1].name == "step_4"  # (older ones pruned by keep_last)
    for step in steps:
        assert sorted(p.name for p in (step / "model").iterdir()) == [
            "adapters.safetensors", "config.json", "lora_base.json"]
        assert set(load_file(str(step / "model" / "adapters.safetensors"))) == {
            k for k in model_keys(run_dir) if ".lora_" in k}
        ref = json.loads((step / "model" / "lora_base.json").read_text())
        assert ref["path"] == str((run_dir / "checkpoints" / "lora_base").resolve())
    written = load_file(str(run_dir / "checkpoints" / "lora_base" / "model.safetensors"))
    assert written.keys() == {k for k in base if k != "lm_head.weight"} or written.keys() == base.keys()
    assert all(torch.equal(written[k], base[k]) for k in written)
    assert [r["step"] for r in read_history(run_dir / "history.jsonl")] == [1, 2, 3, 4]


def model_keys(run_dir: Path) -> set[str]:
    """The LoRA policy's state-dict keys: the published adapter's, under the model's own names."""
    adapter = load_file(str(run_dir / "final" / "adapter" / "adapter_model.safetensors"))
    return {k.removeprefix("base_model.model.") for k in adapter}


def test_sft_with_lora_and_inloop_eval_evaluates_the_lora_policy(sft_runs, tmp_path, monkeypatch):
    runs, config = sft_runs
    synced = []
    real = AdapterWeightsClient.update_weights
    monkeypatch.setattr(AdapterWeightsClient, "update_weights",
                        lambda self, sd, version=None: synced.append(len(sd)) or real(self, sd, version))
    if not (runs / "shards" / "eval" / "out" / "manifest.json").is_file():
        prompt_shards(tmp_path, runs / "shards" / "eval" / "out", 3)
    run_dir = tmp_path / "sft_inloop"
    inloop = ("inloop_eval.every=2", "inloop_eval.rows=2", "inloop_eval.max_new_tokens=4", 'inloop_eval.solutions=""')
    assert run_worker("align.stages.sft", config, runs, run_dir, *SFT_FAST, *inloop) == 0
    rows = read_history(run_dir / "history.jsonl")
    evaluated = [r["step"] for r in rows if isinstance(r.get("eval/accuracy"), float) and r["eval/accuracy"] >= 0]
    assert evaluated == [2, 4] and len(synced) == 2  # each evaluation first pushed the training weights


def test_lora_sft_resume_is_bitwise_equal_to_an_uninterrupted_run(sft_runs, tmp_path):
    runs, config = sft_runs
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_worker("align.stages.sft", config, runs, whole, *SFT_FAST) == 0
    # a wall budget of 0 s stops after step 1 with a checkpoint (exit 82); a smaller max_steps would be another run
    assert run_worker("align.stages.sft", config, runs, parts, *SFT_FAST, "train.max_wall_seconds=0") == 82
    assert [c.name for c in (parts / "checkpoints").glob("step_*")] == ["step_1"]
    assert run_worker("align.stages.sft", config, runs, parts, *SFT_FAST) == 0  # resumes step_1's adapters
    assert not (parts / "checkpoints.superseded").exists()  # it did resume
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(whole / "final" / name)), load_file(str(parts / "final" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.oracle
def test_peft_loads_the_published_adapter_with_the_merged_models_logits(sft_runs, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import MistralForCausalLM as HfMistral

    runs, config = sft_runs
    run_dir = tmp_path / "sft"
    assert run_worker("align.stages.sft", config, runs, run_dir, *SFT_FAST) == 0
    base_model = build_model(load_config(config, SftStageConfig))
    save_checkpoint(base_model, tmp_path / "base")
    hf_base = HfMistral.from_pretrained(tmp_path / "base").eval()
    with_adapter = peft.PeftModel.from_pretrained(hf_base, run_dir / "final" / "adapter").eval()
    hf_merged = HfMistral.from_pretrained(run_dir / "final").eval()
    ours = load_checkpoint(run_dir / "final").eval()
    ids = torch.randint(1, 32768, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b, c = with_adapter(input_ids=ids).logits, hf_merged(input_ids=ids).logits, ours(ids)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, b, atol=1e-5, rtol=1e-5)


def test_dpo_with_lora_publishes_the_merged_policy(tmp_path):
    runs = tmp_path / "runs"
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    build_pair_shards(tmp_path, runs / "shards" / "preference" / "out", pair_rows(12))
    configs = tmp_path / "configs"
    ref = _smoke_config(configs, "ref_cache", extra="")
    assert run_worker("align.stages.ref_cache", ref, runs, runs / "ref_cache") == 0
    dpo = _smoke_config(configs, "dpo")
    run_dir = runs / "dpo_lora"
    fast = ("train.max_steps=3", "train.checkpoint_every=3", "loader.micro_batch_size=4", "data.threads=1",
            "optimizer.lr=1e-2", "data.heldout_every=4")
    assert run_worker("align.stages.dpo", dpo, runs, run_dir, *fast) == 0
    base = load_file(str(runs / "sft_checkpoint" / "final" / "model.safetensors"))
    _check_merged_final(run_dir / "final", base)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_pairs"] == 3 and 0.0 <= metrics["dpo_preference_accuracy"] <= 1.0
    rows = read_history(run_dir / "history.jsonl")
    assert rows[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-5)  # B = 0: the policy starts as the reference


def test_grpo_with_lora_pushes_the_adapters_and_publishes_the_merged_policy(tmp_path, monkeypatch):
    runs, config = runs_tree(tmp_path, steps=2)
    config.write_text(config.read_text() + LORA.replace("save_adapter = true", "save_adapter = false"))
    pushed = []
    real = NativeRolloutClient.update_adapters
    monkeypatch.setattr(NativeRolloutClient, "update_adapters",
                        lambda self, sd, version=None: pushed.append(sorted(sd)) or real(self, sd, version))
    run_dir = runs / "grpo_lora"
    # a wall budget of 0 s stops after step 1 with a checkpoint (exit 82); the rerun resumes it, and a resume
    # pushes the restored weights to the sampler (GrpoTrainModule.load_state_dict)
    assert run_worker("align.stages.grpo", config, runs, run_dir, "train.max_wall_seconds=0") == 82
    assert run_worker("align.stages.grpo", config, runs, run_dir) == 0
    assert not (run_dir / "checkpoints.superseded").exists()  # it did resume
    # the step checkpoints name the start checkpoint (the frozen base) by path and hash instead of copying it
    start_dir = runs / "dpo_checkpoint" / "final"
    for step in (run_dir / "checkpoints").glob("step_*"):
        assert not (step / "model" / "model.safetensors").exists()
        assert json.loads((step / "model" / "lora_base.json").read_text()) == {
            "path": str(start_dir.resolve()), "content_hash": checkpoint_content_hash(start_dir)}
    assert not (run_dir / "checkpoints" / "lora_base").exists()
    assert pushed and all(keys and all(".lora_" in k for k in keys) for keys in pushed)  # the adapters alone ...
    final = load_file(str(run_dir / "final" / "model.safetensors"))  # ... and a plain published checkpoint
    start = load_file(str(runs / "dpo_checkpoint" / "final" / "model.safetensors"))
    assert final.keys() == start.keys() and not (run_dir / "final" / "adapter").exists()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_rows"] == 4


def _lora_policy(seed: int = 0):
    """A tiny LoRA policy with nonzero B (as after training) and a plain copy of its base."""
    from align.model import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)
    plain = MistralForCausalLM(cfg)
    policy = MistralForCausalLM(cfg, init=False)
    policy.load_state_dict(plain.state_dict())
    apply_lora(policy, LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj")))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * 0.1)
    return policy, plain


def test_merged_weights_client_gives_the_engine_the_merged_model():
    policy, plain = _lora_policy()
    lora = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
    client = MergedWeightsClient(NativeRolloutClient(plain.eval().requires_grad_(False)), lora)
    assert client.update_weights(policy.state_dict(), version=7) == 7 and client.weight_version == 7
    want = merge_state_dict(policy.state_dict(), lora.scaling)
    got = client.engine.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    q = policy.model.layers[0].self_attn.q_proj
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"], q.weight)  # merged, not the base


@pytest.mark.parametrize("engine_sync", ["adapters", "merged"])
def test_inloop_eval_with_lora_syncs_the_policy_into_its_engine(tmp_path, engine_sync):
    from align.eval.inloop_config import InLoopEvalConfig
    from align.tokenizer import Tokenizer
    from align.train.sft_loss import SftLossConfig
    from align.train.sft_module import SftTrainModule
    from align.train.train_module import TrainModuleConfig

    runs = tmp_path / "runs"
    prompt_shards(tmp_path, runs / "shards" / "eval" / "out", 3)
    policy, _ = _lora_policy(seed=2)
    lora = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"), engine_sync=engine_sync)
    module = SftTrainModule(policy, TrainModuleConfig(), SftLossConfig(), total_steps=1)
    cfg = InLoopEvalConfig(every=1, rows=2, max_new_tokens=4, solutions="")
    callback = inloop_eval(cfg, runs, Tokenizer.from_pretrained(), module, 1, lora, engine_model=policy)
    engine = callback.client.engine.model
    # "adapters": a copy of the LoRA model (the engine runs base + adapter); "merged": a plain copy
    assert any("lora" in k for k in engine.state_dict()) == (engine_sync == "adapters")
    with torch.no_grad():  # the policy moves after the callback was built
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.mul_(2.0)
    result = callback.measure()
    assert 0.0 <= result["eval/accuracy"] <= 1.0
    want = merge_state_dict(policy.state_dict(), lora.scaling) if engine_sync == "merged" else policy.state_dict()
    assert engine.state_dict().keys() == want.keys()
    assert all(torch.equal(engine.state_dict()[k], want[k].float()) for k in want)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_fsdp_lora_sft_matches_one_rank(sft_runs, tmp_path):
    """torchrun, 2 gloo ranks, FSDP2 (adapters sharded with their block): 2 rows per rank per step train like 4 on one
    rank (step 1 agrees in loss and gradient norm), the gathered publish is merged base + B A alpha/r bitwise on the
    frozen base (which no rank changed), and the adapters and losses follow the one-rank run closely."""
    import os
    import subprocess

    runs, config = sft_runs
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_worker("align.stages.sft", config, runs, one, *SFT_FAST) == 0
    env = {**os.environ, "ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(two), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.sft", "--config", str(config), *SFT_FAST, "loader.micro_batch_size=2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    h1, h2 = read_history(one / "history.jsonl"), read_history(two / "history.jsonl")
    for key in ("loss", "grad_norm"):
        assert h2[0][key] == pytest.approx(h1[0][key], rel=1e-5), key
    _check_merged_final(two / "final", _base_state(config))
    a1 = load_file(str(one / "final" / "adapter" / "adapter_model.safetensors"))
    a2 = load_file(str(two / "final" / "adapter" / "adapter_model.safetensors"))
    assert a1.keys() == a2.keys()
    # NOTE: not elementwise: Adam's early steps are ~lr * sign(g), so reduction-order noise in near-zero gradient
    # elements becomes lr-sized differences there (as in the DPO stage's two-rank test)
    diff = sum(float((a2[k] - a1[k]).norm() ** 2) for k in a1) ** 0.5
    assert diff < 0.1 * sum(float(a1[k].norm() ** 2) for k in a1) ** 0.5
    assert [r["loss"] for r in h2] == pytest.approx([r["loss"] for r in h1], rel=2e-2)


@pytest.mark.parametrize("engine_sync", ["adapters", "merged"])
def test_ppo_with_lora_resumes_bitwise_from_an_adapter_only_checkpoint(tmp_path, monkeypatch, engine_sync):
    """SIGTERM inside step 3 (the first step that trains the adapters) leaves step checkpoints that name the start
    checkpoint instead of copying it; the resumed run publishes the same merged policy and critic bitwise."""
    import os
    import signal
    import subprocess

    sys.path.insert(0, str(TESTS / "ppo"))
    from test_ppo_stage import ROOT as REPO, run_worker as ppo_worker, setup  # noqa: E402

    runs, config = setup(tmp_path)
    config.write_text(config.read_text() + '\n[lora]\nrank = 4\nalpha = 8.0\ntarget_modules = ["q_proj", "v_proj"]\n'
                      f'engine_sync = "{engine_sync}"\n')
    whole, cut = runs / "whole", runs / "cut"
    assert ppo_worker(monkeypatch, runs, config, whole) == 0
    env = {**os.environ, "ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(cut), "PYTHONPATH": str(REPO),
           "ALIGN_FAULTS": "signal:TERM@micro,step=3", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "align.stages.ppo", "--config", str(config)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    step = cut / "checkpoints" / "step_3" / "model"
    assert sorted(p.name for p in step.iterdir()) == ["adapters.safetensors", "config.json", "lora_base.json"]
    assert json.loads((step / "lora_base.json").read_text())["content_hash"] == checkpoint_content_hash(
        runs / "dpo_checkpoint" / "final")
    assert ppo_worker(monkeypatch, runs, config, cut) == 0
    assert not (cut / "checkpoints.superseded").exists()  # it did resume
    for name in ("final", "critic"):
        assert checkpoint_content_hash(cut / name) == checkpoint_content_hash(whole / name), name
