"""align.kernels.fused_ce: values and gradients equal torch's cross_entropy on full logits, with the per-row passes
in C (align.kernels.ce_rows, "native") and in torch ops; the C rows against float64 and invariant to the thread
count; memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from align.kernels import ce_rows
from align.kernels.fused_ce import fused_linear_cross_entropy, reference_linear_cross_entropy

needs_native = pytest.mark.skipif(not ce_rows.available(), reason="no C compiler to build csrc/ce_rows.c")
KERNELS = [pytest.param("native", marks=needs_native), "torch"]


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


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
@pytest.mark.parametrize("z", [0.0, 1e-3])
def test_fused_equals_full_logits(chunk, z, kernel):
    h, w, y = _case()
    lf, hf, wf = _grads(lambda: fused_linear_cross_entropy(h, w, y, z_loss_weight=z, chunk_size=chunk,
                                                           kernel=kernel).loss, h, w)
    lr, hr, wr = _grads(lambda: reference_linear_cross_entropy(h, w, y, z_loss_weight=z), h, w)
    torch.testing.assert_close(lf, lr, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(hf, hr, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(wf, wr, rtol=1e-5, atol=1e-6)


def test_reference_is_torch_cross_entropy():
    h, w, y = _case()
    logits = h @ w.t()
    expected = torch.nn.functional.cross_entropy(logits, y, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(reference_linear_cross_entropy(h, w, y), expected)


@pytest.mark.parametrize("kernel", KERNELS)
def test_side_outputs_ce_z_entropy_tokens(kernel):
    h, w, y = _case(n=50, v=100)
    out = fused_linear_cross_entropy(h, w, y, z_loss_weight=0.5, chunk_size=16, kernel=kernel)
    keep = y != -100
    logits = (h @ w.t())[keep]
    logp = logits.log_softmax(-1)
    lse = logits.logsumexp(-1)
    torch.testing.assert_close(out.ce_sum, -logp.gather(1, y[keep][:, None]).sum(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.z_sum, (lse ** 2).sum(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.entropy_sum, -(logp.exp() * logp).sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss.detach(), out.ce_sum + 0.5 * out.z_sum)
    assert out.tokens == int(keep.sum())


@pytest.mark.parametrize("kernel", KERNELS)
def test_bf16_inputs_match_fp32_reference_within_bf16_rounding(kernel):
    h, w, y = _case(dtype=torch.bfloat16)
    lf, hf, wf = _grads(lambda: fused_linear_cross_entropy(h, w, y, chunk_size=64, kernel=kernel).loss, h, w)
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    lr, hr, wr = _grads(lambda: reference_linear_cross_entropy(h32, w32, y), h32, w32)
    assert hf.dtype == torch.bfloat16 and wf.dtype == torch.bfloat16
    torch.testing.assert_close(lf.float(), lr, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(hf.float(), hr, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(wf.float(), wr, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("kernel", KERNELS)
def test_all_labels_ignored_gives_zero_loss_and_zero_grads(kernel):
    h, w, y = _case(n=10)
    y[:] = -100
    out = fused_linear_cross_entropy(h, w, y, kernel=kernel)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.tokens == 0
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


def test_no_grad_mode_builds_no_graph():
    h, w, y = _case(n=20)
    with torch.no_grad():
        out = fused_linear_cross_entropy(h, w, y)
    assert not out.loss.requires_grad


def _rows_case(r=37, v=1003, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, v, generator=g) * 4  # an odd V: the vector tail runs too
    x[0, 5] = 60.0  # a confident row: most of its exps are far below the maximum's
    return x, torch.randint(0, v, (r,), generator=g)


@needs_native
@pytest.mark.parametrize("z", [0.0, 1e-2])
def test_native_rows_equal_float64(z):
    x, y = _rows_case()
    buf = x.clone()
    lse, ce, ent = ce_rows.ce_rows_(buf, y, z, grad=True)
    x64 = x.double()
    lse64 = x64.logsumexp(1)
    logp = x64 - lse64[:, None]
    grad64 = logp.exp() * (1 + 2 * z * lse64)[:, None]
    grad64[torch.arange(len(y)), y] -= 1
    torch.testing.assert_close(lse.double(), lse64, rtol=1e-6, atol=0)
    torch.testing.assert_close(ce.double(), -logp.gather(1, y[:, None]).squeeze(1), rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(ent.double(), -(logp.exp() * logp).sum(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(buf.double(), grad64, rtol=1e-5, atol=1e-8)
    untouched = x.clone()
    again = ce_rows.ce_rows_(untouched, y, z, grad=False)
    assert torch.equal(untouched, x)  # no gradient wanted: the logits are left as they were
    for a, b in zip(again, (lse, ce, ent)):
        assert torch.equal(a, b)


@needs_native
def test_native_rows_do_not_depend_on_the_thread_count_or_the_other_rows():
    x, y = _rows_case(r=64)
    outs = []
    for threads, rows in ((1, slice(None)), (3, slice(None)), (2, slice(10, 20))):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            buf = x[rows].clone()
            outs.append((buf, *ce_rows.ce_rows_(buf, y[rows], 1e-3, grad=True)))
        finally:
            torch.set_num_threads(old)
    for a, b in zip(outs[0], outs[1]):
        assert torch.equal(a, b)
    for a, b in zip(outs[0], outs[2]):
        assert torch.equal(a[10:20], b)


@needs_native
def test_row_dots_equal_float64_and_do_not_depend_on_threads_or_other_rows():
    """The torch rows' entropy dot in C: each row's <a, b> within fp32 rounding of float64, its bits the same with
    any thread count and alone (a strided view, as the chunk's rows are)."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.rand(40, 1000, generator=g), torch.randn(40, 1000, generator=g) * 3  # a tail of 1000 % 16 = 8
    ref = (a.double() * b.double()).sum(-1)
    outs = []
    for threads, rows in ((1, slice(None)), (2, slice(None)), (2, slice(7, 8))):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            outs.append(ce_rows.row_dots(a[rows], b[rows]))
        finally:
            torch.set_num_threads(old)
    scale = (a.double() * b.double()).abs().sum(-1)  # fp32 rounding is relative to the terms, not their sum
    assert bool(((outs[0].double() - ref).abs() <= 1e-6 * scale).all())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0][7:8], outs[2])
    with pytest.raises(ValueError, match="row_dots"):
        ce_rows.row_dots(a, b[:, :999])


def test_auto_falls_back_to_torch_where_the_c_rows_cannot_be_built(monkeypatch):
    from align.kernels import native

    def no_build():
        raise native.NativeUnavailable("no C compiler (test)")

    h, w, y = _case()
    expected = _grads(lambda: fused_linear_cross_entropy(h, w, y, kernel="torch").loss, h, w)
    monkeypatch.setattr(ce_rows, "lib", no_build)
    monkeypatch.setattr(ce_rows, "ce_rows_", lambda *a, **k: pytest.fail("the C rows ran"))
    got = _grads(lambda: fused_linear_cross_entropy(h, w, y).loss, h, w)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    with pytest.raises(native.NativeUnavailable, match="no C compiler"):
        fused_linear_cross_entropy(h, w, y, kernel="native")


def test_kernel_names_are_checked():
    h, w, y = _case(n=10)
    with pytest.raises(ValueError, match="kernel must be one of"):
        fused_linear_cross_entropy(h, w, y, kernel="fast")


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
