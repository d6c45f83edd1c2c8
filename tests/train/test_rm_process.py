"""Process reward model training on a tiny generated step-labelled set (align.reward.rm_process): step-end positions
on the real Mistral v0.3 tokenizer, the sequence equal to the SFT template's reply, neutral-label policies, the loss
equal to torch's BCE on the model's own per-token logits, window normalisation, and learning which steps are wrong."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from align.data.schema import Message, StepLabelled
from align.model import MistralConfig, MistralForProcessReward
from align.tokenizer import Tokenizer
from align.tokenizer.chat import encode_chat
from align.train.optim import OptimizerConfig
from align.reward.rm_process import (IGNORE, PrmLossConfig, PrmTrainModule, collate_steps, encode_steps, prm_eval,
                                    step_label)
from align.train.train_module import AccumInfo, TrainModuleConfig


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained()


def _record(i: int, rng: random.Random) -> StepLabelled:
    """Three steps of a sum; a wrong step (rated -1) says 'I guess' where a right one (1) says 'so', and the third
    step is neutral (0), as PRM800K's labelers rate a restatement."""
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    steps, ratings = [], []
    for x, y in ((a, b), (a + b, c)):
        wrong = rng.random() < 0.4
        steps.append(f"{x} + {y} is {x + y + 1}, I guess." if wrong else f"{x} + {y} is {x + y}, so.")
        ratings.append(-1 if wrong else 1)
    steps.append("Let me write it down.")
    ratings.append(0)
    return StepLabelled(id=f"r{i}", prompt=(Message("user", f"What is {a} + {b} + {c}?"),), steps=tuple(steps),
                        ratings=tuple(ratings), gold=str(a + b + c))


def _records(n: int, seed: int) -> list[StepLabelled]:
    rng = random.Random(seed)
    return [_record(i, rng) for i in range(n)]


def test_step_ends_are_each_steps_last_token_of_the_templated_reply(tok):
    rec = _records(1, 0)[0]
    enc = encode_steps(tok, rec, PrmLossConfig(neutral="ignore"))
    reply = encode_chat(tok, [{"role": "user", "content": rec.prompt[0].content},
                              {"role": "assistant", "content": "\n".join(rec.steps)}]).ids
    assert enc.ids == reply and reply[-1] == tok.eos_id  # the sequence an SFT policy writes
    assert len(enc.step_ends) == 2 and enc.labels == [step_label(r, "ignore") for r in rec.ratings[:2]]
    for k, end in enumerate(enc.step_ends):
        assert tok.decode(enc.ids[:end + 1]).endswith(rec.steps[k])
        assert not tok.decode(enc.ids[:end]).endswith(rec.steps[k])
    assert encode_steps(tok, rec, PrmLossConfig(neutral="positive")).labels[-1] == 1.0
    assert encode_steps(tok, rec, PrmLossConfig(neutral="negative")).labels[-1] == 0.0
    cut = encode_steps(tok, rec, PrmLossConfig(max_len=enc.step_ends[1]))  # the second step no longer fits
    assert len(cut.ids) == enc.step_ends[1] and cut.step_ends == enc.step_ends[:1]


def _prm(seed: int = 0, dtype=torch.float64) -> MistralForProcessReward:
    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)
    return MistralForProcessReward(cfg).to(dtype)


def _module(model, lr: float = 1e-3) -> PrmTrainModule:
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=lr, max_grad_norm=None))
    return PrmTrainModule(model, cfg, PrmLossConfig(), total_steps=100)


def test_loss_is_torch_bce_on_the_models_own_logits_and_windows_are_exact(tok):
    rows = [encode_steps(tok, r, PrmLossConfig()) for r in _records(6, 1)]
    batch = collate_steps(rows)
    model = _prm()
    logits = model(batch["input_ids"], batch["attention_mask"])[..., 0]  # (B, T): every position
    sel = batch["step_labels"] != IGNORE
    want = F.binary_cross_entropy_with_logits(logits[sel], batch["step_labels"][sel].double(), reduction="sum")
    one = _module(model)
    out = one.net(batch)
    torch.testing.assert_close(out.loss.double(), want, atol=1e-10, rtol=1e-10)
    assert one.loss_units(batch) == sum(len(r.step_ends) for r in rows) == 18

    one.train_batch(batch, AccumInfo(0, 1, 18.0, 1))
    two = _module(_prm())
    halves = [collate_steps(rows[:2]), collate_steps(rows[2:])]
    for i, h in enumerate(halves):
        two.train_batch(h, AccumInfo(i, 2, 18.0, 1))
    for a, b in zip(one.model.parameters(), two.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-10)


def test_learns_which_steps_are_wrong(tok):
    cfg = PrmLossConfig()
    train = collate_steps([encode_steps(tok, r, cfg) for r in _records(32, 2)])
    held = collate_steps([encode_steps(tok, r, cfg) for r in _records(32, 3)])
    model = _prm(seed=1, dtype=torch.float32)
    before = prm_eval(model, [held])
    module = _module(model, lr=3e-3)
    units = module.loss_units(train)
    for _ in range(40):
        module.train_batch(train, AccumInfo(0, 1, units, 1))
        module.optim_step()
        module.zero_grads()
    after = prm_eval(model, [held])
    share = float((held["step_labels"] == 1).sum() / (held["step_labels"] != IGNORE).sum())
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] > max(share, 1 - share) + 0.1  # better than a constant answer
    assert after["negative_accuracy"] >= 0.8 and after["steps"] == 96
