"""Which row counts make the engine's matmuls round a row as they would in any larger batch: measured on this host.

A BLAS library picks its kernel by shape: a product of few rows goes to a gemv or small-m micro-kernel that sums
the dot products in another order than the blocked kernel of a large batch, so the same row's result changes in its
last bits with the batch it sits in, and a greedy near-tie can flip. Which counts are affected depends on the
library, its version, the CPU and the thread count. Measured with torch 2.13 (fp32, MKL): on an AMD EPYC host
`F.linear` rounded differently for m = 1-3 (one thread); on an Intel Sapphire Rapids host for m = 1 to ~in/32
(1-10 at in = 256, 1-15 at in >= 512), while the transposed product W @ x^T differed only for m = 1; bf16 oneDNN
kernels there differed for m = 37-69 on some shapes. A table from one host broke batch invariance on the other, so
the engine measures its own kernels once per process: for every weight shape it runs, each probe count m is
compared bitwise with the first m rows of a REFERENCE_ROWS-row product, and a step's rows are then padded to the
next count that agreed. No product runs on more than REFERENCE_ROWS rows: a larger step is cut into whole
REFERENCE_ROWS-row calls and one padded remainder (`chunked`), so every call has a measured row count. (Larger
calls are not safe to assume: on the Intel host bf16 `F.linear` at 32k x 512 rounded rows 1-36 as a 2100-row call
did, and 37-69 and 128 otherwise.) A row's result is also assumed not to depend on its position within a call;
tests/inference/test_engine.py checks the whole contract end to end.

Rounding depends on shapes, dtype, strides and threads, not on values, so random weights of the model's shapes
stand in for the model's own (the probe never reads them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

REFERENCE_ROWS = 128
PROBE_ROWS = tuple(range(1, 33)) + (40, 48, 56, 64, 80, 96, 112, REFERENCE_ROWS)

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (m, in), prepared weight) -> (m, out)

_measured: dict[tuple, tuple[int, ...]] = {}


@torch.inference_mode()
def agreeing_counts(products: Sequence[tuple[str, Product, tuple[int, int]]],
                    prepare: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, device,
                    kernel: str) -> tuple[int, ...]:
    """The probe counts at which every (name, product, (out, in) weight shape) rounds each row as in a
    REFERENCE_ROWS-row batch. Cached per (kernel, names and shapes, dtype, device, torch threads)."""
    shapes = tuple(sorted({(name, shape) for name, _, shape in products}))
    cache_key = (kernel, shapes, dtype, str(device), torch.get_num_threads())
    if cache_key not in _measured:
        g = torch.Generator().manual_seed(0)
        agree = set(PROBE_ROWS)
        for _, product, (out_features, in_features) in products:
            w = prepare((torch.randn(out_features, in_features, generator=g) * 0.05).to(dtype).to(device))
            x = torch.randn(REFERENCE_ROWS, in_features, generator=g).to(dtype).to(device)
            reference = product(x, w)
            agree = {m for m in agree if torch.equal(product(x[:m], w), reference[:m])}
        _measured[cache_key] = tuple(sorted(agree))
    return _measured[cache_key]


def padder(counts: tuple[int, ...]) -> Callable[[int], int]:
    """m -> the rows to run instead: whole REFERENCE_ROWS-row calls plus the remainder padded to the smallest
    agreeing count >= it (REFERENCE_ROWS always agrees, so there is one)."""
    def pad(m: int) -> int:
        whole, rest = divmod(m, REFERENCE_ROWS)
        return whole * REFERENCE_ROWS + (next(c for c in counts if c >= rest) if rest else 0)
    return pad


def chunked(product: Callable[..., torch.Tensor], x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """product(x, *others) with x and the row-aligned `others` cut into calls of at most REFERENCE_ROWS rows."""
    if x.shape[0] <= REFERENCE_ROWS:
        return product(x, *others)
    parts = zip(x.split(REFERENCE_ROWS), *(o.split(REFERENCE_ROWS) for o in others))
    return torch.cat([product(*p) for p in parts])
