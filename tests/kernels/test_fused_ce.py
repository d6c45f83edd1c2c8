"""align.kernels.fused_ce: values and gradients equal torch's cross_entropy on full logits; memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from align.kernels.fused_ce import fused_linear_cross_entropy, reference_linear_cross_entropy


def _case(n=300, d=32, v=1000, ignore_every=3, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g) * 0.1).to(dtype).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[::ignore_every] = -100
    return h, w, y


def _grads(fn, h, w):
    h.grad = w.grad = None
    loss = fn()
    (loss * 0.37).backward()  # a non-unit upstream gradient: backward must scale the stored gradients
    return loss.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
@pytest.mark.parametrize("z", [0.0, 1e-3])
def test_fused_equals_full_logits(chunk, z):
    h, w, y = _case()
    lf, hf, wf = _grads(lambda: fused_linear_cross_entropy(h, w, y, z_loss_weight=z, chunk_size=chunk).loss, h, w)
    lr, hr, wr = _grads(lambda: reference_linear_cross_entropy(h, w, y, z_loss_weight=z), h, w)
    torch.testing.assert_close(lf, lr, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(hf, hr, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(wf, wr, rtol=1e-5, atol=1e-6)


def test_reference_is_torch_cross_entropy():
    h, w, y = _case()
    logits = h @ w.t()
    expected = torch.nn.functional.cross_entropy(logits, y, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(reference_linear_cross_entropy(h, w, y), expected)


def test_side_outputs_ce_z_entropy_tokens():
    h, w, y = _case(n=50, v=100)
    out = fused_linear_cross_entropy(h, w, y, z_loss_weight=0.5, chunk_size=16)
    keep = y != -100
    logits = (h @ w.t())[keep]
    logp = logits.log_softmax(-1)
    lse = logits.logsumexp(-1)
    torch.testing.assert_close(out.ce_sum, -logp.gather(1, y[keep][:, None]).sum(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.z_sum, (lse ** 2).sum(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.entropy_sum, -(logp.exp() * logp).sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss.detach(), out.ce_sum + 0.5 * out.z_sum)
    assert out.tokens == int(keep.sum())


def test_bf16_inputs_match_fp32_reference_within_bf16_rounding():
    h, w, y = _case(dtype=torch.bfloat16)
    lf, hf, wf = _grads(lambda: fused_linear_cross_entropy(h, w, y, chunk_size=64).loss, h, w)
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lr, hr, wr = _grads(lambda: reference_linear_cross_entropy(h32, w32, y), h32, w32)
    assert hf.dtype == torch.bfloat16 and wf.dtype == torch.bfloat16
    torch.testing.assert_close(lf.float(), lr, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(hf.float(), hr, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(wf.float(), wr, rtol=2e-2, atol=2e-3)


def test_all_labels_ignored_gives_zero_loss_and_zero_grads():
    h, w, y = _case(n=10)
    y[:] = -100
    out = fused_linear_cross_entropy(h, w, y)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.tokens == 0
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


def test_no_grad_mode_builds_no_graph():
    h, w, y = _case(n=20)
    with torch.no_grad():
        out = fused_linear_cross_entropy(h, w, y)
    assert not out.loss.requires_grad


def test_out_of_range_label_is_an_error():
    h, w, y = _case(n=10, v=50)
    y[1] = 50
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        fused_linear_cross_entropy(h, w, y)


_PEAK = textwrap.dedent("""
    import json, resource, sys, torch
    from align.kernels.fused_ce import fused_linear_cross_entropy, reference_linear_cross_entropy
    torch.set_num_threads(1)
    n, d, v = 2048, 16, 16384
    h = torch.randn(n, d, requires_grad=True); w = (torch.randn(v, d) * 0.05).requires_grad_()
    y = torch.randint(0, v, (n,))
    def hwm_kib():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
    # NOTE: ru_maxrss keeps the peak of `import torch`, which can exceed the logits; resetting the kernel's
    # high-water mark (clear_refs 5) makes the peak the one of the loss alone.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = hwm_kib()
    if sys.argv[1] == "fused":
        loss = fused_linear_cross_entropy(h, w, y, chunk_size=128).loss
    else:
        loss = reference_linear_cross_entropy(h, w, y)
    loss.backward()
    print(json.dumps({"peak_delta_mib": (hwm_kib() - base) / 1024}))
""")


def _peak_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _PEAK, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["peak_delta_mib"]


def test_peak_memory_is_bounded_by_the_chunk_not_the_token_count():
    # 2048 tokens x 16384 vocab: full logits are 128 MiB (and autograd keeps more); one fused chunk is 8 MiB.
    fused, full = _peak_mib("fused"), _peak_mib("full")
    assert full > 256, full
    assert fused < 0.25 * full, (fused, full)


def test_workspace_is_reused_across_calls_and_changes_nothing():
    from align.kernels.fused_ce import CEWorkspace

    h, w, y = _case(n=200, v=500)
    ws = CEWorkspace()
    first = _grads(lambda: fused_linear_cross_entropy(h, w, y, chunk_size=64, workspace=ws).loss, h, w)
    ptr = ws.get("logits", 64, 500, h.device).data_ptr()
    second = _grads(lambda: fused_linear_cross_entropy(h, w, y, chunk_size=64, workspace=ws).loss, h, w)
    plain = _grads(lambda: fused_linear_cross_entropy(h, w, y, chunk_size=64).loss, h, w)
    assert ws.get("logits", 64, 500, h.device).data_ptr() == ptr
    for a, b, c in zip(first, second, plain):
        assert torch.equal(a, b) and torch.equal(a, c)
