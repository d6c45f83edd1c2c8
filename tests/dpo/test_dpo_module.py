"""align.train.dpo_module: the DPO TrainModule against a cache built from the same model starts at zero reward and
log 2 loss, its gradient equals the unfused full-logits computation, accumulation matches one big batch, training
raises the reward accuracy, and a cache that disagrees with the batch is refused."""

from __future__ import annotations

import copy

import pytest
import torch

from align.exceptions import DataError
from align.kernels.fused_dpo import IGNORE_INDEX, next_token_labels, reference_sequence_logprobs
from align.model import MistralConfig, MistralForCausalLM
from align.train.dpo_loss import DpoLossConfig, dpo_loss
from align.kernels.fused_dpo import pair_logprobs, stack_arms
from align.train.dpo_module import DpoTrainModule, model_scorer, preference_eval
from align.train.ref_cache import cached_preference_accuracy
from align.train.optim import OptimizerConfig
from align.train.ref_cache import RefCacheKey, build_ref_cache
from align.train.train_module import AccumInfo, StepOutcome, TrainModuleConfig

CFG = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, pad_token_id=0)
KEY = RefCacheKey(reference="r", shards="s", tokenizer="t", dtype="float32")


def preference_batch(pairs: int, seed: int = 0, start: int = 0) -> dict:
    """Contract-format preference batch: right-padded arms of different lengths, prompt labels -100."""
    g = torch.Generator().manual_seed(seed)
    batch = {"pair_index": torch.arange(start, start + pairs)}
    for arm, length in (("chosen", 11), ("rejected", 9)):
        ids = torch.randint(3, CFG.vocab_size, (pairs, length), generator=g)
        real = torch.randint(length - 3, length + 1, (pairs,), generator=g)
        prompt = torch.full((pairs,), 4)
        pos = torch.arange(length)[None, :]
        mask = pos < real[:, None]
        ids = ids.masked_fill(~mask, 0)
        batch[f"{arm}_input_ids"] = ids
        batch[f"{arm}_attention_mask"] = mask
        batch[f"{arm}_labels"] = ids.masked_fill((pos < prompt[:, None]) | ~mask, IGNORE_INDEX)
    return batch


def _model(seed=0):
    torch.manual_seed(seed)
    return MistralForCausalLM(CFG)


def _cache(tmp_path, model, batches, rows):
    model.eval()

    def score(batch):
        with torch.no_grad():
            s = pair_logprobs(model, batch, chunk_size=5)
        return s.chosen, s.rejected, s.chosen_tokens, s.rejected_tokens

    return build_ref_cache(tmp_path / "cache", KEY, rows, batches, score)


def _module(model, cache, loss_cfg, lr=1e-3):
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=lr, max_grad_norm=None))
    return DpoTrainModule(model, cfg, loss_cfg, cache, total_steps=100)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_first_step_against_own_cache_is_log2_and_matches_unfused_gradient(tmp_path):
    model = _model()
    batch = preference_batch(4)
    cache = _cache(tmp_path, model, [batch], 4)
    loss_cfg = DpoLossConfig(beta=0.5, nll_alpha=0.3, chunk_size=3)
    module = _module(model, cache, loss_cfg)
    module.zero_grads()
    metrics = module.train_batch(batch, AccumInfo(0, 1, 4.0, 1))
    sums = {k: float(v) for k, v in metrics.sums.items()}
    logged = module.log_metrics(sums)
    assert logged["rewards/margin"] == 0.0 and logged["rewards/chosen"] == 0.0
    assert logged["pref_loss"] == pytest.approx(0.6931471805599453, abs=1e-6)
    fused = _grads(model)

    # unfused: full logits, autograd, the same formula from dpo_loss
    model.zero_grad(set_to_none=True)
    ids, mask, labels = stack_arms(batch)
    logps = reference_sequence_logprobs(model.forward_hidden(ids, mask), model.lm_head.weight,
                                        next_token_labels(labels))
    pc, pr = logps.chunk(2)
    ref = cache.lookup(batch["pair_index"])
    tokens = (next_token_labels(labels) != IGNORE_INDEX).sum(1).chunk(2)[0]
    dpo_loss(pc, pr, ref.chosen, ref.rejected, loss_cfg, chosen_tokens=tokens).loss.backward()
    for a, b in zip(fused, _grads(model), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_accumulation_equals_one_big_batch(tmp_path):
    model = _model()
    batch = preference_batch(4)
    cache = _cache(tmp_path, model, [batch], 4)
    module = _module(model, cache, DpoLossConfig(beta=0.2, chunk_size=4))
    with torch.no_grad():  # move the policy off the reference so the gradients are not symmetric zeros
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    module.zero_grads()
    module.train_batch(batch, AccumInfo(0, 1, 4.0, 1))
    whole = _grads(model)
    module.zero_grads()
    halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    for i, half in enumerate(halves):
        module.train_batch(half, AccumInfo(i, 2, 4.0, 1))
    for a, b in zip(whole, _grads(model), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_training_raises_reward_accuracy_and_eval_reports_it(tmp_path):
    model = _model()
    batches = [preference_batch(4, seed=s, start=4 * s) for s in range(2)]
    cache = _cache(tmp_path, model, batches, 8)
    before = preference_eval(model_scorer(model, 8), batches, beta=0.1, ref_cache=cache)
    assert before["reward_margin"] == pytest.approx(0.0, abs=1e-5)
    assert before["preference_accuracy"] == pytest.approx(cached_preference_accuracy(cache))
    module = _module(model, cache, DpoLossConfig(beta=0.1), lr=3e-3)
    for step in range(12):
        module.zero_grads()
        module.train_batch(batches[step % 2], AccumInfo(0, 1, 4.0, 1))
        assert module.optim_step() is StepOutcome.APPLIED
    after = preference_eval(model_scorer(model, 8), batches, beta=0.1, ref_cache=cache)
    assert after["reward_accuracy"] == 1.0 and after["reward_margin"] > 0.1
    assert preference_eval(module.score, batches, beta=0.1, ref_cache=cache) == after  # through the wrapped unit
    assert after["preference_accuracy"] >= before["preference_accuracy"]


def test_cache_that_disagrees_with_the_batch_is_refused(tmp_path):
    model = _model()
    batch = preference_batch(4)
    cache = _cache(tmp_path, model, [batch], 4)
    other = copy.deepcopy(batch)
    other["chosen_labels"][1, 4] = IGNORE_INDEX  # one completion token fewer than when the cache was built
    module = _module(model, cache, DpoLossConfig())
    with pytest.raises(DataError, match="pair_index 1: the batch has .* chosen completion tokens"):
        module.train_batch(other, AccumInfo(0, 1, 4.0, 1))
