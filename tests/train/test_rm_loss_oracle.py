"""Oracle: align's Bradley-Terry reward loss equals TRL 1.16 RewardTrainer.compute_loss, to 1e-6.

TRL's loss is a method, not a function, so a real `trl.RewardTrainer` (a tiny transformers
MistralForSequenceClassification, a character tokenizer, its own collator) runs its real `compute_loss`:
1. on random rewards (a stand-in model returning given logits): the formula, with margins and centering;
2. end to end on a collated TRL batch: align's `RmTrainModule` on an align `MistralForValueHead` holding the same
   float64 weights gives the same loss (so the last-token pick agrees too) and the same parameter gradients."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from align.model import MistralConfig, MistralForValueHead
from align.train.optim import OptimizerConfig
from align.reward.rm_loss import RmLossConfig, rm_loss
from align.reward.rm_module import RmTrainModule
from align.train.train_module import TrainModuleConfig

pytest.importorskip("trl")
pytestmark = pytest.mark.oracle
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dpo"))

from trl_fixtures import char_tokenizer, preference_texts  # noqa: E402

TOL = dict(atol=1e-6, rtol=1e-6)
PAIRS = 4


def _hf_critic(seed: int = 0):
    from transformers import MistralConfig as HfConfig, MistralForSequenceClassification

    torch.manual_seed(seed)
    cfg = HfConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, tie_word_embeddings=False,
                   pad_token_id=0, bos_token_id=1, eos_token_id=2, num_labels=1, attn_implementation="eager")
    model = MistralForSequenceClassification(cfg).to(torch.float64)
    with torch.no_grad():
        model.score.weight.normal_(0, 0.5)  # a head that separates the arms, so the loss is not log 2 everywhere
    return model


def _trainer(tmp_path, center=None, margins=None):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    rows = preference_texts(PAIRS, seed=3)
    if margins is not None:
        rows["margin"] = list(margins)
    args = RewardConfig(output_dir=str(tmp_path), per_device_train_batch_size=PAIRS, report_to="none", use_cpu=True,
                        logging_strategy="no", save_strategy="no",
                        dataloader_num_workers=0, seed=0, center_rewards_coefficient=center)
    return RewardTrainer(model=_hf_critic(), args=args, train_dataset=Dataset.from_dict(rows),
                         processing_class=char_tokenizer())


class _GivenRewards(nn.Module):
    """Stands in for the critic inside TRL's compute_loss: returns fixed (2P, 1) logits."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, **_):
        return SimpleNamespace(logits=self.logits)


@pytest.mark.parametrize("center,with_margin", [(None, False), (0.05, False), (None, True), (0.05, True)])
def test_formula_equals_trl_on_random_rewards(tmp_path, center, with_margin):
    g = torch.Generator().manual_seed(7)
    n = 64
    chosen = (torch.randn(n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    rejected = (torch.randn(n, generator=g, dtype=torch.float64) * 3).requires_grad_()
    margin = torch.rand(n, generator=g, dtype=torch.float64) if with_margin else None
    trainer = _trainer(tmp_path, center=center)
    inputs = {"input_ids": torch.zeros(2 * n, 3, dtype=torch.long), "attention_mask": torch.ones(2 * n, 3)}
    if margin is not None:
        inputs["margin"] = margin
    theirs = trainer.compute_loss(_GivenRewards(torch.cat([chosen, rejected])[:, None]), inputs)
    cfg = RmLossConfig(center_rewards_coefficient=center or 0.0)
    mine = rm_loss(chosen, rejected, cfg, margin=margin)
    torch.testing.assert_close(mine.loss, theirs, **TOL)
    g_mine = torch.autograd.grad(mine.loss, (chosen, rejected))
    g_theirs = torch.autograd.grad(theirs, (chosen, rejected))
    for a, b in zip(g_mine, g_theirs):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(mine.per_pair.sum() / n, mine.loss, **TOL)  # the seam's SUM form


def test_constant_margin_is_the_per_pair_margin_of_every_pair():
    chosen, rejected = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0.0, 0.5, 2.5])
    a = rm_loss(chosen, rejected, RmLossConfig(margin=0.3))
    b = rm_loss(chosen, rejected, RmLossConfig(), margin=torch.full((3,), 0.3))
    assert torch.equal(a.loss, b.loss)


def _align_batch(trl_batch: dict) -> dict:
    """TRL's (2P, T) chosen-then-rejected layout as align's preference batch (docs/CONTRACTS.md)."""
    ids, mask = trl_batch["input_ids"], trl_batch["attention_mask"].bool()
    p = ids.shape[0] // 2
    batch = {"chosen_input_ids": ids[:p], "chosen_attention_mask": mask[:p], "chosen_labels": ids[:p],
             "rejected_input_ids": ids[p:], "rejected_attention_mask": mask[p:], "rejected_labels": ids[p:],
             "pair_index": torch.arange(p)}
    if "margin" in trl_batch:
        batch["margin"] = trl_batch["margin"].to(torch.float64)
    return batch


def _align_twin(hf) -> MistralForValueHead:
    c = hf.config
    cfg = MistralConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
                        rope_theta=c.rope_parameters["rope_theta"], rms_norm_eps=c.rms_norm_eps, pad_token_id=0,
                        tie_word_embeddings=False)
    model = MistralForValueHead(cfg, init=False).to(torch.float64)
    model.load_state_dict(hf.state_dict(), strict=True)
    return model


@pytest.mark.parametrize("center,margins", [(None, None), (0.1, [0.0, 0.5, 1.0, 0.25])])
def test_module_equals_trl_end_to_end(tmp_path, center, margins):
    trainer = _trainer(tmp_path, center=center, margins=margins)
    trl_batch = next(iter(trainer.get_train_dataloader()))
    assert trl_batch["attention_mask"].shape[0] == 2 * PAIRS and not trl_batch["attention_mask"].all()  # padded
    assert ("margin" in trl_batch) == (margins is not None)
    hf = trainer.model
    hf.train()
    theirs = trainer.compute_loss(hf, dict(trl_batch))
    theirs.backward()

    critic = _align_twin(hf)
    module = RmTrainModule(critic, TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-3)),
                           RmLossConfig(center_rewards_coefficient=center or 0.0), total_steps=1)
    out = module.net(_align_batch(trl_batch))
    mine = out.loss / PAIRS  # the seam's SUM over pairs; TRL's mean
    torch.testing.assert_close(mine, theirs.to(mine.dtype), **TOL)
    mine.backward()
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    for name, p in critic.named_parameters():
        torch.testing.assert_close(p.grad, hf_grads[name], **TOL, msg=name)
    assert out.sums["pairs"] == PAIRS and 0 <= out.sums["correct"] <= PAIRS
