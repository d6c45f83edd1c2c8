"""The per-host probe of which row counts round a matmul's rows as a large batch does (row_invariance.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from align.inference.row_invariance import PROBE_ROWS, REFERENCE_ROWS, agreeing_counts, padder


def _few_rows_differently(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A product that, like a BLAS small-m kernel, rounds differently below 4 rows (here: it sums in float64)."""
    if x.shape[0] < 4:
        return F.linear(x.double(), w.double()).float()
    return F.linear(x, w)


def test_counts_where_rows_round_differently_are_left_out_and_padded_past():
    counts = agreeing_counts([("odd", _few_rows_differently, (64, 48))], lambda w: w, torch.float32, "cpu",
                             "test-odd")
    assert not {1, 2, 3} & set(counts) and {4, 5, REFERENCE_ROWS} <= set(counts)
    pad = padder(counts)
    assert [pad(m) for m in (1, 2, 3, 4, 7)] == [4, 4, 4, 4, 7]
    assert pad(REFERENCE_ROWS + 5) == REFERENCE_ROWS + 5  # above the reference: taken as agreeing


def test_the_measured_counts_hold_for_other_data():
    # The probe uses random weights of the model's shapes: rounding depends on shapes, not values.
    w, x = torch.randn(96, 80), torch.randn(2 * REFERENCE_ROWS, 80)
    counts = agreeing_counts([("linear", F.linear, tuple(w.shape))], lambda t: t, torch.float32, "cpu", "test-lin")
    assert REFERENCE_ROWS in counts and set(counts) <= set(PROBE_ROWS)
    big = F.linear(x, w)
    pad = padder(counts)
    for m in range(1, REFERENCE_ROWS + 1):
        n = pad(m)
        assert torch.equal(F.linear(x[:n], w)[:m], big[:m]), (m, n)
