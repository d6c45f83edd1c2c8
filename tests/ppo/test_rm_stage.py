"""The rm stage worker (`rm_checkpoint`) on real artifacts, with the smoke profile's configs/smoke/rm.toml: a tiny SFT
checkpoint (real Mistral v0.3 vocabulary) and preference shards built by the data pipeline. The critic starts from
the SFT trunk, held-out pair accuracy is computed before and after, the published checkpoint is an HF
MistralForSequenceClassification that transformers loads with equal scores (oracle), and a resumed run is bitwise
the uninterrupted one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from align.data.collate import collate
from align.data.store import ShardSet
from align.model import MistralForValueHead
from align.model.checkpoint import load_checkpoint
from align.reward.rm_module import model_scorer, pair_rewards
from align.utils.tracking import read_history

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dpo"))
from stage_fixtures import build_pair_shards, pair_rows, run_worker, save_tiny_checkpoint  # noqa: E402

SMOKE_RM = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "rm.toml"
FAST = ("data.threads=1", "data.heldout_every=5", "data.eval_batch_pairs=8", "loader.micro_batch_size=4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm_stage")
    runs = tmp / "runs"
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    build_pair_shards(tmp, runs / "shards" / "preference" / "out", pair_rows(20))
    return runs


def _rm(runs, run_dir, *overrides):
    return run_worker("align.stages.rm", SMOKE_RM, runs, run_dir, *FAST, *overrides)


def test_smoke_config_trains_from_the_sft_trunk_and_records_heldout_accuracy(runs):
    run_dir = runs / "rm_a"
    assert _rm(runs, run_dir) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_pairs"] == 4 and metrics["train_pairs"] == 16 and metrics["steps"] == 8
    for key in ("heldout_accuracy_before", "heldout_accuracy"):
        assert metrics[key] in (0.0, 0.25, 0.5, 0.75, 1.0)  # 4 pairs
    assert metrics["heldout_margin"] != metrics["heldout_margin_before"]  # training moved the critic
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9)) and all(r["pairs"] == 4 for r in rows)

    final = run_dir / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["MistralForSequenceClassification"] and len(config["id2label"]) == 1
    critic = load_checkpoint(final, cls=MistralForValueHead)
    sft = load_file(str(runs / "sft_checkpoint" / "final" / "model.safetensors"))
    rm = load_file(str(final / "model.safetensors"))
    assert "lm_head.weight" not in rm and rm["score.weight"].shape == (1, critic.config.hidden_size)
    assert set(rm) - {"score.weight"} == set(sft) - {"lm_head.weight"}
    assert not torch.equal(rm["model.embed_tokens.weight"], sft["model.embed_tokens.weight"])  # trunk trained too

    # the receipt's "after" accuracy is the published critic's
    shards = ShardSet.open(runs / "shards" / "preference" / "out", kind="pairs")
    scored = model_scorer(critic)(collate(shards, [0, 5, 10, 15]))
    acc = float((scored.chosen > scored.rejected).float().mean())
    assert acc == pytest.approx(metrics["heldout_accuracy"])


def test_compare_pairs_scores_another_shard_sets_heldout_split(runs, tmp_path):
    """`data.compare_pairs`: the held-out rows (same split) of a second pair set, scored before and after training,
    are the published critic's accuracy there; its rows are never trained on (train_pairs is the main set's)."""
    build_pair_shards(tmp_path, runs / "shards" / "other" / "out", pair_rows(10, offset=40))
    run_dir = runs / "rm_compare"
    assert _rm(runs, run_dir, "train.max_steps=2", "data.compare_pairs=shards/other/out") == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train_pairs"] == 16 and metrics["compare_heldout_pairs"] == 2  # rows 0 and 5 of 10
    assert {"compare_heldout_accuracy_before", "compare_heldout_margin"} <= set(metrics)
    critic = load_checkpoint(run_dir / "final", cls=MistralForValueHead)
    scored = model_scorer(critic)(collate(ShardSet.open(runs / "shards" / "other" / "out", kind="pairs"), [0, 5]))
    assert float((scored.chosen - scored.rejected).mean()) == pytest.approx(metrics["compare_heldout_margin"],
                                                                            abs=1e-5)
    assert metrics["compare_heldout_margin"] != metrics["heldout_margin"]  # another set, not the main one again


@pytest.mark.oracle
def test_transformers_loads_the_published_critic_with_equal_scores(runs):
    pytest.importorskip("transformers")
    from transformers import MistralForSequenceClassification

    final = runs / "rm_a" / "final"
    if not (final / "manifest.json").is_file():
        assert _rm(runs, runs / "rm_a") == 0
    hf = MistralForSequenceClassification.from_pretrained(final).eval()
    critic = load_checkpoint(final, cls=MistralForValueHead).eval()
    shards = ShardSet.open(runs / "shards" / "preference" / "out", kind="pairs")
    batch = collate(shards, list(range(8)))  # right-padded with 0, the checkpoint's pad_token_id
    assert hf.config.pad_token_id == 0 and not batch["chosen_attention_mask"].all()
    with torch.no_grad():
        mine = pair_rewards(critic, batch)
        for arm, got in (("chosen", mine.chosen), ("rejected", mine.rejected)):
            theirs = hf(input_ids=batch[f"{arm}_input_ids"],
                        attention_mask=batch[f"{arm}_attention_mask"].long()).logits.squeeze(-1)
            torch.testing.assert_close(got, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", [(), ("head.lr_scale=10",)], ids=["one_lr", "head_group"])
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(runs, head):
    """Also with the score head in its own param group ([head] lr_scale): the resumed optimizer state lines up."""
    tag = "_".join(head).replace(".", "_").replace("=", "_")
    whole, parts = runs / f"rm_whole{tag}", runs / f"rm_parts{tag}"
    steps = ("train.max_steps=4", "train.checkpoint_every=2", *head)
    assert _rm(runs, whole, *steps) == 0
    # NOTE: a wall budget stops the run (not a smaller max_steps, which is part of the run identity: the rerun would
    # train afresh and the test would not test resume): 0 s stops after step 1 with a checkpoint, exit 82
    assert _rm(runs, parts, *steps, "train.max_wall_seconds=0") == 82
    assert [c.name for c in (parts / "checkpoints").glob("step_*")] == ["step_1"]
    assert _rm(runs, parts, *steps) == 0  # resumes from step_1
    assert not (parts / "checkpoints.superseded").exists()  # it did resume
    a, b = load_file(str(whole / "final" / "model.safetensors")), load_file(str(parts / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (whole, parts))
    assert ma["heldout_accuracy_before"] == mb["heldout_accuracy_before"]  # the fresh head, seeded
    assert ma["heldout_margin"] == mb["heldout_margin"]


def test_critic_head_is_seeded_and_a_family_without_a_critic_is_refused(tmp_path):
    from align.exceptions import CheckpointError
    from align.model.checkpoint import save_checkpoint
    from align.model.olmoe import OlmoeForCausalLM
    from align.reward.rm_module import critic_from_policy
    from moe_helpers import tiny_olmoe

    ckpt = save_tiny_checkpoint(tmp_path / "sft", seed=0)
    critic, again, other = (critic_from_policy(ckpt, seed=s) for s in (3, 3, 4))
    assert torch.equal(critic.score.weight, again.score.weight) and not torch.equal(critic.score.weight,
                                                                                    other.score.weight)
    assert 0 < critic.score.weight.abs().max() <= 3 * critic.config.initializer_range
    prm = critic_from_policy(ckpt, seed=3, head="ForTokenClassification")
    assert type(prm).__name__ == "MistralForProcessReward" and prm.num_labels == 1
    assert torch.equal(prm.score.weight, critic.score.weight) and not prm.score.bias.any()
    olmoe = save_checkpoint(OlmoeForCausalLM(tiny_olmoe()), tmp_path / "olmoe")
    with pytest.raises(CheckpointError, match="no \\*ForSequenceClassification critic"):
        critic_from_policy(olmoe)


@pytest.mark.parametrize("profile", ["tiny", "smoke"])
def test_profile_configs_load_and_split_like_dpo(profile):
    from align.config import load_config
    from align.stages.dpo import DpoStageConfig
    from align.stages.rm import RmStageConfig

    configs = SMOKE_RM.parents[1] / profile
    rm = load_config(configs / "rm.toml", RmStageConfig)
    dpo = load_config(configs / "dpo.toml", DpoStageConfig)
    # tiny trains on its own pairs (rm_shards/out) and scores DPO's held-out pairs beside them; smoke on DPO's
    assert (rm.data.compare_pairs or rm.data.pairs) == dpo.data.pairs
    assert rm.data.heldout_every == dpo.data.heldout_every and rm.data.init == dpo.data.reference


def test_tiny_rm_chain_is_extra_and_leaves_the_default_ladder_alone():
    """rm_checkpoint (tiny) reads rm_shards/out <- rm_pairs/out <- rm_prompts/out + the SFT checkpoint, each a
    target of the rung before; all four are extra (plain `doit` builds none of them) and none reads or writes an
    artifact of the DPO rung's chain (shards/preference is only read, for the comparison)."""
    from pipeline.layout import Layout, Project
    from pipeline.stage import discover

    root = SMOKE_RM.parents[2]
    layout = Layout(Project(root), "tiny")
    specs = {s.name: s for s in discover()}
    chain = ("rm_prompts", "rm_pairs", "rm_shards", "rm_checkpoint")
    ctx = {name: specs[name].contexts(layout)[0] for name in chain}
    targets = {name: set(specs[name].targets(ctx[name])) for name in chain}
    deps = {name: set(specs[name].file_dep(ctx[name])) for name in chain}
    runs = layout.runs
    assert deps["rm_prompts"] == {root / "data" / "raw" / "math_rm_pairs.parquet"}
    assert deps["rm_pairs"] == {runs / "sft_checkpoint/final/manifest.json"} | targets["rm_prompts"]
    assert targets["rm_pairs"] <= deps["rm_shards"] and targets["rm_shards"] <= deps["rm_checkpoint"]
    assert runs / "shards/preference/out/manifest.json" in deps["rm_checkpoint"]
    assert all(specs[name].extra and specs[name].optional for name in chain)
    others = [s for s in specs.values() if s.name not in chain]
    produced = {t for s in others for c in s.contexts(layout) for t in s.targets(c)}
    assert not produced & set().union(*targets.values())
    assert targets["rm_pairs"] == {runs / "rm_pairs/out/manifest.json"}
