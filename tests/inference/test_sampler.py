"""Sampler pieces: argmax, inverse-CDF exactness, zero-probability tokens, per-row parameters."""

from __future__ import annotations

import torch

from align.inference.sampler import RowParams, chunk_max, first_max_index, greedy_argmax, inverse_cdf, sample


def row_params(n, temperature=1.0, top_k=0, top_p=1.0, uniforms=None) -> RowParams:
    u = torch.full((n,), 0.5, dtype=torch.float64) if uniforms is None else uniforms
    return RowParams(torch.full((n,), float(temperature)), torch.full((n,), top_k, dtype=torch.int64),
                     torch.full((n,), float(top_p)), u)


def test_greedy_argmax_equals_argmax_including_ties():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 1000, generator=g)
    x[0, 17] = x[0, 900] = 50.0  # a tie: the lower index wins, as torch.argmax
    x[1] = 0.0  # all equal
    x[2, -1] = 99.0
    assert greedy_argmax(x).tolist() == x.argmax(-1).tolist()
    assert greedy_argmax(x)[:3].tolist() == [17, 0, 999]


def test_first_max_index_from_chunk_maxima_equals_argmax():
    # V = 300 is not a multiple of the 128-token chunk: maxima in the short tail chunk, ties across and within
    # chunks, constant rows and -inf entries (masked logits) all resolve as torch.argmax does.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 300, generator=g)
    x[0, 299] = 9.0  # in the tail chunk
    x[1, 5] = x[1, 250] = 9.0  # a tie across chunks
    x[2, 130] = x[2, 131] = 9.0  # a tie within a chunk
    x[3] = 1.5  # constant
    x[4, :200] = float("-inf")
    x[5] = float("-inf")
    x[5, 257] = 0.0
    cmax = chunk_max(x)
    assert torch.equal(cmax.amax(-1), x.amax(-1))
    assert first_max_index(x, cmax).tolist() == x.argmax(-1).tolist()
    assert first_max_index(x, cmax)[:6].tolist() == [299, 5, 130, 0, x[4].argmax().item(), 257]


def test_inverse_cdf_hits_every_token_in_proportion_to_its_probability():
    # A uniform grid of M quantiles lands in token j's interval p_j * M times, up to one at each edge: an exact
    # check of the two-level CDF with no sampling noise. V is not a multiple of the 128-token chunk on purpose.
    g = torch.Generator().manual_seed(1)
    V, M = 300, 20000
    p = torch.rand(V, generator=g) ** 4
    p[::7] = 0.0
    p /= p.sum()
    u = torch.arange(1, M + 1, dtype=torch.float64) / M
    tokens = inverse_cdf(p.expand(M, V).contiguous(), u)
    counts = torch.bincount(tokens, minlength=V).double()
    assert (counts - p.double() * M).abs().max() <= 1.0 + 1e-6
    assert counts[::7].sum() == 0


def test_inverse_cdf_never_picks_a_zero_probability_token_at_the_extremes():
    p = torch.zeros(2, 500)
    p[:, 130:132] = 0.5  # mass only inside the second chunk, zeros before and after
    for u in (1e-300, 1e-12, 0.5, 1.0 - 1e-16, 1.0):
        tok = inverse_cdf(p, torch.tensor([u, u], dtype=torch.float64))
        assert set(tok.tolist()) <= {130, 131}, u


def test_rows_are_independent_of_their_batch_company():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 700, generator=g) * 3
    params = RowParams(torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.5]), torch.tensor([0, 20, 0, 0, 5, 0]),
                       torch.tensor([1.0, 1.0, 0.8, 0.95, 1.0, 1.0]), torch.rand(6, generator=g, dtype=torch.float64))
    together = sample(logits, params)
    for i in range(6):
        alone = sample(logits[i:i + 1], params.rows(slice(i, i + 1)))
        for a, b in zip(together, alone):
            assert a[i].item() == b[0].item()


def test_logprobs_are_those_of_the_distribution_sampled_from():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=g) * 2
    u = torch.rand(4, generator=g, dtype=torch.float64)
    tok, lp, mlp = sample(logits, row_params(4, temperature=0.5, uniforms=u))
    ref = (logits / 0.5).log_softmax(-1).gather(1, tok[:, None]).squeeze(1)
    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(mlp, logits.log_softmax(-1).gather(1, tok[:, None]).squeeze(1))
    # top-k 1 is greedy with certainty
    tok1, lp1, _ = sample(logits, row_params(4, top_k=1, uniforms=u))
    assert tok1.tolist() == logits.argmax(-1).tolist() and lp1.abs().max() < 1e-6


def test_sampling_frequencies_follow_temperature():
    # many rows of the same 3-token distribution, independent uniforms: empirical frequencies within 4 sigma
    logits = torch.tensor([[2.0, 1.0, 0.0]]).expand(30000, 3).contiguous()
    u = torch.rand(30000, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for t in (0.5, 2.0):
        tok, _, _ = sample(logits, row_params(30000, temperature=t, uniforms=1.0 - u))
        freq = torch.bincount(tok, minlength=3).double() / 30000
        p = (logits[0] / t).softmax(-1).double()
        assert ((freq - p).abs() <= 4 * (p * (1 - p) / 30000).sqrt()).all(), (t, freq, p)
