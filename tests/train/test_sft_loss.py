"""align.train.sft_loss + TrainModule normalisation: a window of any shape has the gradient of one big batch."""

import copy

import pytest
import torch

from align.train.optim import OptimizerConfig
from align.train.sft_loss import SftLossConfig, count_loss_tokens, shift_labels, sft_loss
from align.train.sft_module import SftTrainModule
from align.train.train_module import AccumInfo, TrainModuleConfig
from train_helpers import sft_batch, split_rows, tiny_model


def _window_grads(model, micro_batches, loss_cfg=SftLossConfig(chunk_size=7)):
    model = copy.deepcopy(model)
    module = SftTrainModule(model, TrainModuleConfig(optimizer=OptimizerConfig(max_grad_norm=None)), loss_cfg,
                            total_steps=1)
    units = sum(module.loss_units(b) for b in micro_batches)
    for i, b in enumerate(micro_batches):
        module.train_batch(b, AccumInfo(i, len(micro_batches), units, 1))
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b, atol=1e-6):
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=atol, msg=name)


@pytest.mark.parametrize("parts", [2, 8])
def test_accumulation_equals_one_big_batch(parts):
    model, batch = tiny_model(), sft_batch(8, 24)
    _assert_same(_window_grads(model, [batch]), _window_grads(model, split_rows(batch, parts)))


def test_not_a_mean_of_micro_batch_means():
    # Two micro-batches with very different label counts: the per-micro mean would weight them equally.
    model, batch = tiny_model(), sft_batch(4, 24)
    batch["labels"][:2, :-2] = -100  # rows 0-1 keep a single label token each
    big = _window_grads(model, [batch])
    window = _window_grads(model, split_rows(batch, 2))
    _assert_same(big, window)
    m = copy.deepcopy(model)
    halves = split_rows(batch, 2)
    for h in halves:  # the biased estimator, for contrast
        out = sft_loss(m, h, SftLossConfig())
        (out.loss / out.sums["tokens"] / 2).backward()
    biased = {n: p.grad for n, p in m.named_parameters()}
    assert (biased["lm_head.weight"] - big["lm_head.weight"]).abs().max() > 1e-3


def test_fused_head_equals_plain_head():
    model, batch = tiny_model(), sft_batch(4, 16)
    _assert_same(_window_grads(model, [batch], SftLossConfig(z_loss_weight=1e-3)),
                 _window_grads(model, [batch], SftLossConfig(z_loss_weight=1e-3, fused=False)))


def test_loss_is_the_mean_next_token_nll():
    model, batch = tiny_model(), sft_batch(3, 12)
    out = sft_loss(model, batch, SftLossConfig())
    logits = model(batch["input_ids"], batch["attention_mask"])
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.sums["ce_sum"] / out.sums["tokens"], expected.detach())
    assert out.sums["tokens"].item() == count_loss_tokens(batch)


def test_shift_labels():
    labels = torch.tensor([[-100, 5, 6, -100], [1, 2, 3, 4]])
    assert shift_labels(labels).tolist() == [[5, 6, -100, -100], [2, 3, 4, -100]]
