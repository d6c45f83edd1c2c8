"""align.kernels.fused_dpo: chunked per-sequence log-probs equal the unfused full-logits computation (values and
gradients, any chunk size, fp64 and bf16), refuse bad labels, and keep no graph under no_grad."""

from __future__ import annotations

import pytest
import torch

from align.kernels.fused_dpo import (
    IGNORE_INDEX,
    next_token_labels,
    reference_sequence_logprobs,
    sequence_logprobs,
)


def _inputs(b=3, t=7, d=16, v=50, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, d, generator=g, dtype=dtype, requires_grad=True)
    weight = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[0, :3] = IGNORE_INDEX  # a prompt
    labels[1, 5:] = IGNORE_INDEX  # right padding
    labels[-1, :] = IGNORE_INDEX  # a sequence with nothing to score
    return hidden, weight, labels


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_fused_equals_unfused_values_and_gradients(chunk):
    hidden, weight, labels = _inputs()
    fused = sequence_logprobs(hidden, weight, labels, chunk_size=chunk)
    ref = reference_sequence_logprobs(hidden, weight, labels)
    torch.testing.assert_close(fused.logps, ref, atol=1e-12, rtol=1e-12)
    assert fused.tokens.tolist() == [4, 5, 0]
    assert float(fused.logps[2].detach()) == 0.0

    upstream = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64)  # distinct per-sequence weights, as in DPO
    gh_f, gw_f = torch.autograd.grad((fused.logps * upstream).sum(), [hidden, weight])
    gh_r, gw_r = torch.autograd.grad((ref * upstream).sum(), [hidden, weight])
    torch.testing.assert_close(gh_f, gh_r, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gw_f, gw_r, atol=1e-12, rtol=1e-12)
    assert float(gh_f[2].abs().sum()) == 0.0 and float(gh_f[0, :3].abs().sum()) == 0.0


def test_gradcheck_float64():
    hidden, weight, labels = _inputs(b=2, t=4, d=5, v=9)
    labels[1, 1:] = torch.tensor([3, 8, 0])

    def f(h, w):
        return sequence_logprobs(h, w, labels, chunk_size=3).logps

    assert torch.autograd.gradcheck(f, (hidden, weight))


def test_bf16_close_to_fp32_and_weight_grad_dtype():
    hidden, weight, labels = _inputs(dtype=torch.float32)
    ref = sequence_logprobs(hidden, weight, labels, chunk_size=2)
    assert ref.logps.dtype == torch.float32
    hb = hidden.detach().bfloat16().requires_grad_()
    wb = weight.detach().bfloat16().requires_grad_()
    low = sequence_logprobs(hb, wb, labels, chunk_size=2)
    assert low.logps.dtype == torch.float32
    torch.testing.assert_close(low.logps, ref.logps.detach(), atol=0.3, rtol=0.02)
    low.logps.sum().backward()
    assert wb.grad.dtype == torch.bfloat16 and hb.grad.dtype == torch.bfloat16


def test_no_grad_keeps_no_graph_and_bad_labels_refused():
    hidden, weight, labels = _inputs()
    with torch.no_grad():
        out = sequence_logprobs(hidden, weight, labels, chunk_size=2)
    assert not out.logps.requires_grad and out.logps.grad_fn is None
    bad = labels.clone()
    bad[0, 5] = 50
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        sequence_logprobs(hidden, weight, bad)
    with pytest.raises(ValueError, match="disagree"):
        sequence_logprobs(hidden, weight, labels[:, :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        sequence_logprobs(hidden, weight, labels, chunk_size=0)


def test_next_token_labels_shifts_left():
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 5, 6, IGNORE_INDEX]])
    assert next_token_labels(labels).tolist() == [[IGNORE_INDEX, 5, 6, IGNORE_INDEX, IGNORE_INDEX]]
