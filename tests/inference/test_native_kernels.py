"""The engine's C kernels (EngineConfig.cpu_kernels: "auto", the default, is "native" on a CPU where they build,
else "torch"): paged attention against a float64 softmax(q k^T) v over the same paged cache, bitwise invariance of a
token's result to its batch, chunk and thread count; the sampler's row passes against float64 and the torch passes;
the native linear kernel and its RMSNorm / SwiGLU prologues against float64, RoPE + the KV write against the
model's apply_rope bitwise; the engine's contracts on both settings; the fallback and errors where the C kernels
cannot run."""

from __future__ import annotations

import random

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.inference import sampler
from align.inference.fused_layers import FusedDecoder
from align.inference.paged_attention import (NativeAttention, build_native_plan, native_cache_shapes,
                                             native_write_kv, resolve_cpu_kernels)
from align.inference.row_invariance import PROBE_ROWS
from align.kernels import linear as native_linear
from align.kernels import native
from align.model.layers import apply_rope, rope_cos_sin
from inference_helpers import (assert_batch_invariant, assert_greedy_and_logprob_contracts, naive_greedy,
                               random_prompts, small_model)


def _native_available() -> bool:
    try:
        native.load("paged_attention")
    except native.NativeUnavailable:
        return False
    return True


needs_native = pytest.mark.skipif(not _native_available(), reason="no C compiler to build the native kernel")


def _paged_case(rows_spec, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    """A cache of scattered blocks holding random K/V for rows (cached, new) and the step's queries."""
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    need = sum(-(-(s + n) // block_size) for s, n in rows_spec)
    blocks = list(range(1, need + 8))
    rnd.shuffle(blocks)
    k_shape, v_shape = native_cache_shapes(1, need + 8, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(k_shape, dtype=dtype)[0], torch.zeros(v_shape, dtype=dtype)[0]
    rows, keys, values, it = [], [], [], iter(blocks)
    for start, n in rows_spec:
        total = start + n
        table = [next(it) for _ in range(-(-total // block_size))]
        k = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype)
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(total)])
        native_write_kv(k_cache, v_cache, slots, k, v)
        rows.append((start, n, table))
        keys.append(k)
        values.append(v)
    n_tok = sum(n for _, n in rows_spec)
    q = torch.randn(n_tok, heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, rows, keys, values


def _reference(q, rows, keys, values, window):
    """float64 softmax(q k^T / sqrt(Dh)) v per token over its own keys (repeat_kv order for GQA)."""
    out, t = [], 0
    h, dh = q.shape[1], q.shape[2]
    for (start, n, _), k, v in zip(rows, keys, values):
        g = h // k.shape[1]
        kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)  # (L, H, Dh)
        for p in range(start, start + n):
            lo = max(0, p - window + 1) if window else 0
            s = torch.einsum("hd,lhd->hl", q[t].double(), kk[lo:p + 1]) / dh ** 0.5
            out.append(torch.einsum("hl,lhd->hd", s.softmax(-1), vv[lo:p + 1]))
            t += 1
    return torch.stack(out)


@needs_native
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [
    (8, 2, 32, 16), (8, 2, 64, 16), (4, 4, 16, 16), (12, 4, 128, 32), (6, 2, 80, 16), (8, 1, 48, 48)])
@pytest.mark.parametrize("window", [None, 9])
def test_native_attention_equals_a_float64_reference(heads, kv_heads, head_dim, block_size, window):
    # decode rows, a prompt from scratch, a chunk continuing cached tokens, one token past a block boundary
    spec = [(40, 1), (0, 23), (17, 20), (31, 1), (5, 3)]
    q, kc, vc, rows, keys, values = _paged_case(spec, heads, kv_heads, head_dim, block_size, torch.float32)
    plan = build_native_plan(rows, q.shape[0] + 3, block_size, window, kc.shape[0])  # + 3 padding tokens
    out = NativeAttention()(torch.cat([q, torch.randn(3, heads, head_dim)]), kc, vc, plan, window)
    torch.testing.assert_close(out[:q.shape[0]].double(), _reference(q, rows, keys, values, window),
                               atol=2e-6, rtol=0)
    assert torch.equal(out[q.shape[0]:], torch.zeros(3, heads, head_dim))  # padding tokens: zeros


def test_a_plan_whose_block_table_is_short_is_refused():
    with pytest.raises(ValueError, match="row 1: tokens up to position 32 but a block table of 2 blocks of 16"):
        build_native_plan([(0, 5, [3]), (30, 3, [4, 5])], 8, 16, None, 10)
    with pytest.raises(ValueError, match=r"row 0: block table \[3, 10\] leaves a cache of 10 blocks"):
        build_native_plan([(0, 20, [3, 10])], 20, 16, None, 10)


@needs_native
def test_native_attention_reads_bf16_caches():
    q, kc, vc, rows, keys, values = _paged_case([(40, 1), (0, 23)], 8, 2, 64, 16, torch.bfloat16)
    out = NativeAttention()(q, kc, vc, build_native_plan(rows, q.shape[0], 16, None, kc.shape[0]), None)
    assert out.dtype == torch.bfloat16
    ref = _reference(q, rows, keys, values, None)  # from the same bf16 inputs; the output's rounding is the error
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)


@needs_native
def test_a_tokens_result_does_not_depend_on_its_batch_chunking_or_threads():
    spec = [(0, 37), (12, 1), (30, 9), (63, 1)]
    q, kc, vc, rows, _, _ = _paged_case(spec, 8, 2, 32, 16, torch.float32, seed=3)
    attend = NativeAttention()
    full = attend(q, kc, vc, build_native_plan(rows, q.shape[0], 16, None, kc.shape[0]), None)
    # each row alone, and row 0's prompt split into chunks of 5 tokens (as a small token budget schedules it)
    t = 0
    for start, n, table in rows:
        alone = attend(q[t:t + n], kc, vc, build_native_plan([(start, n, table)], n, 16, None, kc.shape[0]), None)
        assert torch.equal(alone, full[t:t + n])
        for c in range(0, n, 5):
            m = min(5, n - c)
            piece = attend(q[t + c:t + c + m], kc, vc, build_native_plan([(start + c, m, table)], m, 16, None,
                                                                              kc.shape[0]), None)
            assert torch.equal(piece, full[t + c:t + c + m])
        t += n
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(attend(q, kc, vc, build_native_plan(rows, q.shape[0], 16, None, kc.shape[0]), None), full)
    finally:
        torch.set_num_threads(threads)


def _logits(rows=12, vocab=1000, seed=0):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4
    x[1, 7] = x[1, 900] = x[1].max() + 1  # a tie: the first index wins, as argmax
    x[2, ::3] = float("-inf")  # masked (top-k / top-p) logits
    return x


@needs_native
def test_native_greedy_is_argmax_with_the_log_prob_of_a_float64_softmax():
    x = _logits()
    tok, logprob = sampler.native_greedy(x)
    assert torch.equal(tok, x.argmax(-1)) and tok[1] == 7
    ref = x.double().log_softmax(-1).gather(1, tok[:, None]).squeeze(1)
    torch.testing.assert_close(logprob.double(), ref, atol=2e-6, rtol=0)
    for r in range(x.shape[0]):  # each row alone: the same bits (batch invariance)
        alone = sampler.native_greedy(x[r:r + 1].clone())
        assert alone[0].item() == tok[r].item() and alone[1].item() == logprob[r].item()


@needs_native
def test_native_normalise_agrees_with_the_torch_passes():
    x = _logits(vocab=1000)  # 1000 = 7 full 128-token chunks and a tail of 104
    weights, mass, lse = sampler.native_normalise(x)
    ref_w, ref_mass, ref_lse = sampler.normalise(x)
    torch.testing.assert_close(weights, ref_w, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(mass, ref_mass, atol=0, rtol=1e-6)
    torch.testing.assert_close(lse.double(), torch.logsumexp(x.double(), -1), atol=2e-6, rtol=0)
    assert bool((weights[2, ::3] == 0).all())  # a masked logit can never be sampled
    params = sampler.RowParams(temperature=torch.ones(12), top_k=torch.zeros(12, dtype=torch.long),
                               top_p=torch.ones(12), uniforms=torch.rand(12, dtype=torch.float64,
                                                                          generator=torch.Generator().manual_seed(1)))
    nat, torch_path = sampler.sample(x, params, native=True), sampler.sample(x, params, native=False)
    assert torch.equal(nat[0], torch_path[0])  # same tokens from the same uniforms
    torch.testing.assert_close(nat[1], torch_path[1], atol=2e-6, rtol=0)
    torch.testing.assert_close(nat[2], torch_path[2], atol=2e-6, rtol=0)


@needs_native
@pytest.mark.parametrize("vocab", [1000, 32768, 1100])
def test_native_inverse_cdf_picks_the_torch_token_bit_for_bit(vocab):
    """The C search repeats inverse_cdf's float64 operations in order: the same token for every uniform, including
    uniforms on chunk boundaries, zero-weight (masked) tokens and a vocabulary that is not a multiple of the chunk."""
    g = torch.Generator().manual_seed(vocab)
    x = _logits(rows=12, vocab=vocab, seed=vocab)
    weights, mass, _ = sampler.native_normalise(x)
    u = torch.rand(12, dtype=torch.float64, generator=g)
    cum = mass.cumsum(-1)
    u[3] = (cum[3, 0] / cum[3, -1]).item()  # exactly the end of the first chunk
    u[4], u[5] = 1.0, 1e-300  # the last token with weight, the first
    for uniforms in (u, torch.rand(12, dtype=torch.float64, generator=g)):
        native_tokens = sampler.native_inverse_cdf(weights, uniforms, mass)
        assert torch.equal(native_tokens, sampler.inverse_cdf(weights, uniforms, mass))
        assert bool((weights.gather(1, native_tokens[:, None]) > 0).all())


@needs_native
def test_native_sampler_rows_do_not_depend_on_the_thread_count():
    """The C row passes split rows across worker threads; each row's bits are the same with 1 or 2 threads."""
    x = _logits(rows=40, vocab=32768, seed=3)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(list(sampler.native_greedy(x)) + list(sampler.native_normalise(x)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@needs_native
@pytest.mark.parametrize("rows,out_f,in_f", [(1, 16, 8), (16, 100, 64), (37, 384, 256), (130, 50, 33)])
def test_native_linear_equals_a_float64_product_and_adds_the_residual(rows, out_f, in_f):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(out_f, in_f, generator=g), torch.randn(rows, in_f, generator=g)
    res = torch.randn(rows, out_f, generator=g)
    packed = native_linear.pack(w)

    def check(got, x, extra=0.0):
        ref = x.double() @ w.double().T + extra
        # fp32 summation over in_f terms: within the classical bound, and as close as torch's own fp32 product
        bound = (x.abs().double() @ w.abs().double().T) * in_f * 2.0 ** -24
        err = (got.double() - ref).abs()
        assert bool((err <= bound + 1e-6).all())
        assert err.max() <= 4 * (torch.nn.functional.linear(x, w).double() + extra - ref).abs().max() + 1e-6

    check(native_linear.linear(x, packed), x)
    check(native_linear.linear(x, packed, residual=res), x, res.double())
    out = torch.full((rows, out_f), float("nan"))
    assert native_linear.linear(x, packed, out=out) is out and not out.isnan().any()
    wide = torch.randn(rows, in_f + 7, generator=g)[:, :in_f]  # rows with a stride: read in place
    check(native_linear.linear(wide, packed), wide)


@needs_native
def test_native_linear_rounds_a_row_the_same_in_any_batch_and_thread_count():
    g = torch.Generator().manual_seed(5)
    packed = native_linear.pack(torch.randn(300, 96, generator=g))
    x = torch.randn(45, 96, generator=g)
    full = native_linear.linear(x, packed)
    for lo, hi in ((0, 1), (3, 7), (16, 33), (44, 45)):
        assert torch.equal(native_linear.linear(x[lo:hi].clone(), packed), full[lo:hi])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(native_linear.linear(x, packed), full)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="packs 2-d float32 CPU weights"):
        native_linear.pack(torch.ones(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="takes float32 rows of 96"):
        native_linear.linear(torch.ones(2, 95), packed)


@needs_native
@pytest.mark.parametrize("rows,out_f,in_f", [(1, 16, 8), (16, 100, 64), (37, 384, 256), (130, 50, 40)])
def test_native_linear_prologues_equal_rms_norm_and_swiglu_then_the_product(rows, out_f, in_f):
    g = torch.Generator().manual_seed(rows + 100)
    w = torch.randn(out_f, in_f, generator=g)
    packed, F = native_linear.pack(w), torch.nn.functional
    x, gu = torch.randn(rows, in_f, generator=g) * 3, torch.randn(rows, 2 * in_f, generator=g) * 3
    norm_w, eps, res = torch.rand(in_f, generator=g) + 0.5, 1e-5, torch.randn(rows, out_f, generator=g)

    def close(got, inputs):  # float64 product of the float64 prologue: fp32 rounding of both, relative to scale
        ref = inputs @ w.double().T
        scale = (inputs.abs() @ w.abs().double().T) + 1e-30
        assert ((got.double() - ref).abs() / scale).max() < 1e-5

    x64 = x.double()
    normed = x64 * norm_w.double() / (x64.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    close(native_linear.linear(x, packed, rms_norm=(norm_w, eps)), normed)
    g64, u64 = gu.double()[:, :in_f], gu.double()[:, in_f:]
    got = native_linear.linear(gu, packed, residual=res, swiglu=True)
    close(got - res, g64 * torch.sigmoid(g64) * u64)
    # and as the torch ops the engine ran before: within fp32 rounding of F.rms_norm / F.silu
    torch.testing.assert_close(native_linear.linear(x, packed, rms_norm=(norm_w, eps)),
                               native_linear.linear(F.rms_norm(x, (in_f,), norm_w, eps), packed), rtol=1e-5,
                               atol=1e-5)
    # a row's result does not depend on the rows beside it
    for lo, hi in ((0, 1), (rows // 2, rows)):
        assert torch.equal(native_linear.linear(gu[lo:hi].clone(), packed, swiglu=True),
                           native_linear.linear(gu, packed, swiglu=True)[lo:hi])
        assert torch.equal(native_linear.linear(x[lo:hi].clone(), packed, rms_norm=(norm_w, eps)),
                           native_linear.linear(x, packed, rms_norm=(norm_w, eps))[lo:hi])
    with pytest.raises(ValueError, match=f"takes float32 rows of {2 * in_f}"):
        native_linear.linear(x, packed, swiglu=True)
    with pytest.raises(ValueError, match="one prologue per product"):
        native_linear.linear(gu, packed, swiglu=True, rms_norm=(norm_w, eps))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_is_apply_rope_and_the_kv_write_bitwise(dtype):
    heads, kvh, dh, bs, n = 8, 2, 64, 16, 37
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(n, (heads + 2 * kvh) * dh, generator=g) * 2
    cos, sin = rope_cos_sin(torch.randint(0, 500, (n,), generator=g), dh, 10000.0, torch.float32)
    slots = torch.randperm(6 * bs, generator=g)[:n]
    k_shape, v_shape = native_cache_shapes(1, 6, bs, kvh, dh)
    want_k, want_v = torch.zeros(k_shape, dtype=dtype)[0], torch.zeros(v_shape, dtype=dtype)[0]
    got_k, got_v = torch.zeros(k_shape, dtype=dtype)[0], torch.zeros(v_shape, dtype=dtype)[0]
    qk = apply_rope(qkv[:, :(heads + kvh) * dh].view(n, heads + kvh, dh), cos, sin)
    native_write_kv(want_k, want_v, slots, qk[:, heads:], qkv[:, (heads + kvh) * dh:].view(n, kvh, dh))
    q = NativeAttention().rope_write_kv(qkv, cos, sin, got_k, got_v, slots, heads)
    assert torch.equal(q, qk[:, :heads])
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@needs_native
def test_the_row_probe_finds_every_count_agreeing_on_the_native_kernel():
    """What the runner assumes instead of probing and padding on the native kernel (pad_rows(m) == m)."""
    model = small_model()
    decoder = FusedDecoder(model, "native")
    assert decoder.row_invariant and decoder.agreeing_row_counts() == PROBE_ROWS
    runner = Engine(model, EngineConfig(num_blocks=4, linear_kernel="native")).runner
    assert [runner.pad_rows(m) for m in (1, 33, 77, 130)] == [1, 33, 77, 130]


@needs_native
def test_native_linear_kernel_keeps_the_engine_contracts():
    model = small_model()
    assert Engine(model, EngineConfig(num_blocks=4, linear_kernel="native")).linear_kernel == "native"
    assert_greedy_and_logprob_contracts(model, EngineConfig(linear_kernel="native", max_num_seqs=3,
                                                            max_num_batched_tokens=24))
    assert_batch_invariant(model, linear_kernel="native")
    engine = Engine(model, EngineConfig(linear_kernel="native"))
    assert engine.runner.pad_rows(3) == 3  # every row count agrees with a 128-row product: no padding
    with pytest.raises(ValueError, match="linear_kernel 'native' cannot run here: it takes float32 weights"):
        Engine(small_model().to(torch.bfloat16), EngineConfig(linear_kernel="native"))


@pytest.fixture(scope="module")
def model():
    return small_model()


@needs_native
def test_the_default_engine_runs_native_attention_on_cpu(model):
    assert Engine(model, EngineConfig(num_blocks=4)).cpu_kernels == "native"
    assert Engine(model, EngineConfig(num_blocks=4, cpu_kernels="torch")).cpu_kernels == "torch"
    # block_size 8: auto falls back; asked for explicitly, one clear error naming why
    assert Engine(model, EngineConfig(num_blocks=4, block_size=8)).cpu_kernels == "torch"
    with pytest.raises(ValueError, match="cpu_kernels 'native' cannot run here: .*block_size multiples of 16"):
        Engine(model, EngineConfig(num_blocks=4, block_size=8, cpu_kernels="native"))


@pytest.mark.parametrize("kernel", ["torch", pytest.param("native", marks=needs_native)])
def test_each_kernel_keeps_the_engine_contracts(model, kernel):
    assert_greedy_and_logprob_contracts(model, EngineConfig(cpu_kernels=kernel, max_num_seqs=3,
                                                            max_num_batched_tokens=24))
    assert_batch_invariant(model, cpu_kernels=kernel)


@needs_native
def test_sliding_window_engine_on_native_matches_the_naive_loop():
    model = small_model(sliding_window=6)
    prompts = random_prompts([3, 20, 11], model.config.vocab_size, seed=5)
    engine = Engine(model, EngineConfig(cpu_kernels="native", max_num_batched_tokens=16))
    for p, r in zip(prompts, engine.generate([GenerationRequest(p, SamplingParams(0.0, max_new_tokens=10))
                                              for p in prompts])):
        assert r.token_ids == naive_greedy(model, p, 10)


def test_without_a_compiler_auto_falls_back_and_native_names_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ALIGN_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_failed", {})
    cpu = torch.device("cpu")
    assert resolve_cpu_kernels("auto", cpu, torch.float32, 8, 2, 32, 16) == "torch"
    with pytest.raises(ValueError, match="no C compiler: .*no-such-cc.* is not on PATH"):
        resolve_cpu_kernels("native", cpu, torch.float32, 8, 2, 32, 16)
    with pytest.raises(ValueError, match="cpu_kernels must be one of"):
        EngineConfig(cpu_kernels="flash")


def test_without_a_compiler_the_engine_runs_the_session_4_kernels(monkeypatch, tmp_path, model):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ALIGN_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_failed", {})
    engine = Engine(model, EngineConfig(max_num_seqs=3, max_num_batched_tokens=24))
    assert engine.cpu_kernels == "torch"
    assert engine.linear_kernel == ("onednn" if torch.backends.mkldnn.is_available() else "torch")
    prompt = random_prompts([9], model.config.vocab_size, seed=2)[0]
    (r,) = engine.generate([GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=6))])
    assert r.token_ids == naive_greedy(model, prompt, 6)
    assert not (tmp_path / "cache").exists()  # nothing was built


@needs_native
def test_a_failing_build_reports_the_compiler_output_and_publishes_nothing(monkeypatch, tmp_path):
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "broken.c").write_text("int f( {\n")
    monkeypatch.setattr(native, "CSRC", src)
    monkeypatch.setenv("ALIGN_NATIVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(native.NativeUnavailable, match=r"failed to build .*broken\.c \(exit \d+\)"):
        native.load("broken")
    assert not list((tmp_path / "cache").iterdir())  # no .so, no temporary left behind
    with pytest.raises(native.NativeUnavailable):  # remembered: no second compile in this process
        native.load("broken")


@needs_native
def test_the_library_is_built_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ALIGN_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    native.load("paged_attention")
    built = list(tmp_path.glob("paged_attention-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob(".*"))
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_loaded", {})
    native.load("paged_attention")  # a new process finds it: no rebuild
    assert built[0].stat().st_mtime_ns == stamp


def _host_has(*flags: str) -> bool:
    have = native._cpu_fingerprint().split()  # /proc/cpuinfo's model and flags lines, as the build cache keys on
    return all(flag in have for flag in flags)


def _kernel_outputs() -> list[torch.Tensor]:
    """The three C kernels on fixed random inputs: linear (+ both prologues), attention (fp32, bf16), sampler."""
    g = torch.Generator().manual_seed(11)
    packed = native_linear.pack(torch.randn(200, 96, generator=g))
    x, gu, nw = torch.randn(37, 96, generator=g), torch.randn(37, 192, generator=g), torch.rand(96, generator=g)
    outs = [native_linear.linear(x, packed), native_linear.linear(x, packed, rms_norm=(nw, 1e-5)),
            native_linear.linear(gu, packed, swiglu=True)]
    for dtype, dh in ((torch.float32, 64), (torch.bfloat16, 32), (torch.float32, 48)):
        q, k_cache, v_cache, rows, _, _ = _paged_case([(0, 9), (40, 1), (70, 1)], 8, 2, dh, 16, dtype, seed=4)
        plan = build_native_plan(rows, q.shape[0], 16, None, k_cache.shape[0])
        outs.append(NativeAttention()(q, k_cache, v_cache, plan, None))
    logits = torch.randn(5, 1000, generator=g) * 4
    outs += list(sampler.native_greedy(logits)) + list(sampler.native_normalise(logits))
    return outs


@needs_native
@pytest.mark.skipif(not _host_has("avx2", "fma"), reason="needs an x86-64 host with AVX2 and FMA")
def test_a_build_for_avx2_computes_the_same_bits_as_the_native_build(monkeypatch, tmp_path):
    """simd.h's width is the ISA's (16 floats with AVX-512, 8 with AVX2); the kernels' order of operations is
    defined over 16 lanes, so with FMA hardware either build gives the same bits. (The AVX2 build also checks
    that the kernels compile and run where there is no AVX-512.)"""
    monkeypatch.delenv(native.MARCH_ENV, raising=False)  # the reference is the -march=native build
    monkeypatch.setattr(native, "_loaded", {})
    native_build = _kernel_outputs()
    monkeypatch.setenv(native.MARCH_ENV, "x86-64-v3")
    monkeypatch.setenv("ALIGN_NATIVE_CACHE", str(tmp_path))
    native._loaded.clear()
    avx2_build = _kernel_outputs()
    assert len(list(tmp_path.glob("*.so"))) == 3  # the narrower build really ran
    for a, b in zip(native_build, avx2_build):
        assert torch.equal(a, b)
